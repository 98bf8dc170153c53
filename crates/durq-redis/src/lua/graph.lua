-- graph.lua: jobs that wait for jobs (CONTRACT G1-G5), prepended after core.lua and
-- lib.lua to every script that can end a job other than complete.lua's hot path.
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing; it only defines
-- local functions that the script after it uses.
--
-- A waiting job is in state `waiting` (list code 'w'), in no ready or scheduled index,
-- with `wfor` (how many of its dependencies have not ended yet) in its hash. Its
-- dependencies and its policy are in its `meta` (codec.rs, `DEPS`), which never changes.
-- Each unmet edge is a member `DEPENDENCY DEPENDENT` of the `dependents` index (a zset,
-- score 0), so the jobs waiting for one job are one ZRANGEBYLEX; a dependency with
-- such members carries `hasd` = '1', which complete.lua reads to leave the settling to
-- complete_graph (its plain path then pays one absent field per job).
--
-- The graph tail. Settling writes the hashes of the jobs that wait, which only the
-- dependents index names, and a script must declare every key it touches (cluster
-- safety), so a script that can end jobs takes, after its own KEYS and ARGV:
--   KEYS: dependents index, ready, sched, list, finished, seq, kready, event stream,
--         then the hashes of the D dependents its caller knows of
--   ARGV: now (ms), now as 16 hex digits, the wake-up channel, the D ids, then D
-- and, when settling meets a dependent whose hash it was not given, answers
-- {'need', {id, ...}} before its first write; Rust then calls again with them
-- (store/graph.rs), as enqueue.lua does for dedup keys.
--
-- The event stream (CONTRACT V1) is in the tail because every script that takes one
-- changes a job's state: the script records its own changes there (`g.events`), and
-- settling records those of the jobs it releases (`ready`), cancels and buries (`dead`)
-- that carry the mark, read with the fields settling reads anyway.

-- The graph tail of this call, and where the script's own KEYS and ARGV end.
local function graph_tail()
  local d = tonumber(ARGV[#ARGV])
  local nk = #KEYS - 8 - d
  local na = #ARGV - 4 - d
  local g = {
    edges = KEYS[nk + 1], ready = KEYS[nk + 2], sched = KEYS[nk + 3], list = KEYS[nk + 4],
    finished = KEYS[nk + 5], seq = KEYS[nk + 6], kready = KEYS[nk + 7], events = KEYS[nk + 8],
    now = ARGV[na + 1], now_hex = ARGV[na + 2], channel = ARGV[na + 3],
    known = {}, own_keys = nk, own_args = na,
  }
  for i = 1, d do
    g.known[ARGV[na + 3 + i]] = KEYS[nk + 8 + i]
  end
  return g
end

-- The policy in a `meta` field's DEPS part (codec.rs), as DependencyFailure::as_str
-- names it: 'run' when the job runs despite a failed dependency, 'cancel' (the
-- default) otherwise.
local function dependency_policy(meta)
  return string.match(meta, ' ~(%a+):[%x%-,]+$') or 'cancel'
end

-- Whether a dependency ending in `state` cancels a job with `policy`. Mirrors
-- durq_core::graph::settle: success is always met, a failure is met only with `run`.
local function cancels(state, policy)
  return state ~= 'succeeded' and policy ~= 'run'
end

-- The last_error of a job cancelled because `dependency` ended in `state`, byte for byte
-- durq_core::graph::failed_dependency.
local function failed_dependency(dependency, state)
  return 'cancelled: dependency ' .. dependency .. ' ended ' .. state
end

-- Pass 1 of settling, reads only: what the endings of `endings` ({id, state} each, the
-- state each ended in) do to the jobs waiting for them, and, in turn, what the jobs
-- those endings cancel do to theirs. Returns the plan for settle_write, or nil and the
-- ids of dependents whose hashes the call was not given.
local function settle_plan(g, endings)
  local plan = { drained = {}, released = {}, cancelled = {}, buried = {}, counted = {} }
  local seen, need, asked = {}, {}, {}
  local work = {}
  for i, e in ipairs(endings) do
    work[i] = e
  end
  local i = 1
  while i <= #work do
    local id, state = work[i][1], work[i][2]
    i = i + 1
    local members = redis.call('ZRANGEBYLEX', g.edges, '[' .. id .. ' ', '(' .. id .. '!')
    if #members > 0 then
      plan.drained[#plan.drained + 1] = id
    end
    for _, member in ipairs(members) do
      local d = string.sub(member, #id + 2)
      local key = g.known[d]
      if not key then
        if not asked[d] then
          asked[d] = true
          need[#need + 1] = d
        end
      else
        local r = seen[d]
        if not r then
          local v = redis.call('HMGET', key, 'state', 'wfor', 'meta', 'run_at', 'order', 'ckey',
            'awt', 'ev', 'att')
          r = { key = key, id = d, state = v[1], wfor = tonumber(v[2]), v = v }
          seen[d] = r
          if r.state == 'waiting' then
            local queue, parent, prio = meta_head(v[3])
            r.queue, r.parent, r.prio = queue, parent, prio
            if not queue or not is_int(prio) then
              r.reason = 'field meta unreadable'
            elseif not is_int(v[2]) or r.wfor < 1 then
              r.reason = 'field wfor not a positive number'
            elseif not is_int(v[4]) then
              r.reason = 'field run_at not a number'
            elseif not v[5] or #v[5] ~= 36 or string.find(v[5], '^%x+$') == nil then
              r.reason = 'field order unreadable'
            end
            if r.reason then
              -- Buried like any record a script cannot read (CONTRACT §5), which ends it
              -- dead for the jobs waiting for it in turn.
              r.state = 'dead'
              plan.buried[#plan.buried + 1] = r
              work[#work + 1] = { d, 'dead' }
            end
          end
        end
        if r.state == 'waiting' then
          if cancels(state, dependency_policy(r.v[3])) then
            r.state = 'cancelled'
            r.error = failed_dependency(id, state)
            plan.cancelled[#plan.cancelled + 1] = r
            work[#work + 1] = { d, 'cancelled' }
          else
            r.wfor = r.wfor - 1
            if r.wfor == 0 then
              r.state = 'queued'
              plan.released[#plan.released + 1] = r
            elseif not r.counted then
              r.counted = true
              plan.counted[#plan.counted + 1] = r
            end
          end
        end
      end
    end
  end
  if #need > 0 then
    return nil, need
  end
  return plan
end

-- Pass 2 of settling: the writes settle_plan decided. Each ended job's edges go; a
-- released job is queued as a job is sent back to the queue (fresh sequence number,
-- behind the jobs already ready, C3), ready now or at its own later run_at (G1); a
-- cancelled one is finished as an operator's cancel finishes it (A1), with its reason.
local function settle_write(g, plan)
  for _, id in ipairs(plan.drained) do
    redis.call('ZREMRANGEBYLEX', g.edges, '[' .. id .. ' ', '(' .. id .. '!')
  end
  local woken = {}
  for _, r in ipairs(plan.released) do
    local seq = redis.call('INCR', g.seq)
    local due = tonumber(r.v[4]) <= tonumber(g.now)
    local run_at, ready_hex = r.v[4], string.sub(r.v[5], 5, 20)
    if due then
      run_at, ready_hex = g.now, g.now_hex
    end
    requeue(r.key, g.ready, g.sched, g.list, seq, r.queue, r.id, r.prio, run_at, ready_hex, due,
      'waiting', r.v[6], g.kready)
    redis.call('HDEL', r.key, 'wfor')
    if r.v[8] then
      record_change(g.events, r.id, r.queue, 'waiting', 'queued', r.v[9], r.v[9], g.now)
    end
    if due and not woken[r.queue] then
      woken[r.queue] = true
      redis.call('PUBLISH', g.channel, r.queue)
    end
  end
  for _, r in ipairs(plan.counted) do
    if r.state == 'waiting' then
      redis.call('HSET', r.key, 'wfor', string.format('%d', r.wfor))
    end
  end
  for _, r in ipairs(plan.cancelled) do
    redis.call('HSET', r.key, 'error', r.error)
    redis.call('HDEL', r.key, 'wfor')
    finish(r.key, g.list, g.finished, r.queue, r.id, r.parent, 'waiting', 'cancelled', g.now)
    if r.v[8] then
      record_change(g.events, r.id, r.queue, 'waiting', 'cancelled', r.v[9], r.v[9], g.now)
    end
    if r.v[7] then
      announce_ending(g.channel, r.id)
    end
  end
  for _, r in ipairs(plan.buried) do
    if r.queue then
      bury(r.key, g.list, g.finished, r.queue, r.id, r.parent, g.now, r.reason, 'w')
    else
      -- No queue to find its index entries by: the record alone says dead.
      redis.call('HSET', r.key, 'state', 'dead', 'finished', g.now, 'error',
        CORRUPT_PREFIX .. r.reason)
    end
    if r.v[8] then
      -- A record whose `meta` cannot be read names no queue: its event names none ('').
      record_change(g.events, r.id, r.queue or '', 'waiting', 'dead', r.v[9], r.v[9], g.now)
    end
    if r.v[7] then
      announce_ending(g.channel, r.id)
    end
  end
end
