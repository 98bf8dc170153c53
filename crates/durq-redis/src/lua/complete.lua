-- complete.lua: marks running jobs succeeded and stores their results (CONTRACT L2-L5),
-- N completions in one call (concurrent completes are batched by the store).
--
-- KEYS[1] lease index (zset)   KEYS[2] list index (zset)
-- KEYS[3] finished log (list)
-- KEYS[4] running counters (hash: queue -> lease entries)
-- KEYS[5] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- KEYS[6] event stream (CONTRACT V1; core.lua, record_change)
-- KEYS[6+j] the hash of job j, j = 1..N
-- ARGV[1] the default now (ms)
-- for job j, 4 values from ARGV[4(j-1) + 2]:
--   id, token, now (ms) or '' for the default, and where its result is: '' for none,
--   else the index in ARGV of the result bytes (after the jobs' values)
--
-- Returns one status per job, in order: 'ok' | 'notfound' | 'lost' | 'corrupt' (unreadable meta).
-- Or, with nothing written: {'graph'} when a job to complete has jobs waiting for it
-- (`hasd`, CONTRACT G1) or a wait for its ending (`awt`, O2) and this is the plain
-- script, so Rust sends the batch again as complete_graph, which is this file after
-- graph.lua and a graph tail (GRAPH below is then that tail, see graph.lua), and which
-- may answer {'need', {id, ...}}. The tail brings the wake channel an awaited job's
-- ending is announced on, so the plain script carries none.
--
-- Atomicity: each job's state, result, lease, list and finished entries change in the
-- same call (and, for a job that records its events, its `succeeded` event), and the
-- whole batch is one script. Jobs are handled in order, so a second
-- completion of one job in the same batch finds it no longer running (L5), exactly as a
-- second call would.
--
-- Check before write: a first pass reads and decides every entry (a job completed by an
-- earlier entry counts as no longer running), then the running counters of the queues
-- concerned are checked, then a second pass writes.
--
-- Cost: per job one HMGET (its `ev` field read with the others) and one HSET (and one
-- HDEL of the last error for a job past its first attempt, L4); the index entries of
-- the whole batch are written
-- with one ZREM/ZADD per index (and one ZREM per queue of the lease index, to keep the
-- running counters exact) and one RPUSH of the finished log. The per-job Lua is kept to
-- the four index members and log entries the layout needs and one pattern match of
-- `meta`.

local leases, list, finished, running, kleases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local events = KEYS[6]
local njobs = GRAPH and GRAPH.own_keys - 6 or #KEYS - 6
-- {id, 'succeeded'} per completed job that has jobs waiting for it; only built by
-- complete_graph (the plain script answers `graph` at the first such job).
local endings = nil
local call, match = redis.call, string.match
local default_now = ARGV[1]
local out = {}
local lease_old, list_old, list_new, entries, klease_old = {}, {}, {}, {}, {}
local nl, nn = 0, 0
local finishing = {}  -- per entry to complete: its number j
local stale_error = {}  -- per entry to complete: whether an earlier attempt's error may be set
local completed = {}  -- job keys completed by an earlier entry of this call
local announced = {}  -- ids of completed jobs someone waits for (complete_graph only)
local queues = {}
-- Per entry to complete whose job records its events (CONTRACT V1): its queue and
-- attempts, for its `succeeded` event; made by the first such entry.
local marked = nil
-- Pass 1: read and decide, no writes.
for j = 1, njobs do
  local a = 4 * j - 2
  local job = KEYS[6 + j]
  local v = call('HMGET', job, 'state', 'token', 'meta', 'att', 'ckey', 'hasd', 'awt', 'ev')
  if not v[1] then
    out[j] = 'notfound'
  elseif v[1] ~= 'running' or v[2] ~= ARGV[a + 1] or completed[job] then
    out[j] = 'lost'
  else
    local queue, parent = match(v[3] or '', '^(%S+) (%S+) %S+ %S+ %S+ ')
    if not queue then
      out[j] = 'corrupt'
    else
      completed[job] = true
      finishing[#finishing + 1] = j
      if v[6] or v[7] then
        if not GRAPH then
          return { 'graph' }
        end
        if v[6] then
          endings = endings or {}
          endings[#endings + 1] = { ARGV[a], 'succeeded' }
        end
        if v[7] then
          announced[#announced + 1] = ARGV[a]
        end
      end
      -- Only a job past its first attempt can carry an earlier attempt's error: fail
      -- and reclaim, which write it, count the attempt they end, and release, which
      -- takes one back, only follows a claim. So a first attempt has no error to clear.
      stale_error[j] = v[4] ~= '1'
      local id = ARGV[a]
      local now = ARGV[a + 2]
      if now == '' then
        now = default_now
      end
      local of_queue = lease_old[queue]
      if not of_queue then
        of_queue = {}
        lease_old[queue] = of_queue
        queues[#queues + 1] = queue
      end
      local tail = ' ' .. id
      of_queue[#of_queue + 1] = queue .. tail
      if v[5] then
        klease_old[#klease_old + 1] = queue .. ' ' .. v[5] .. tail
      end
      nl = nl + 1
      list_old[nl] = queue .. ' a' .. tail
      local succeeded = queue .. ' s' .. tail
      nn = nn + 2
      list_new[nn - 1] = '0'
      list_new[nn] = succeeded
      -- A parent is stored as '-' when there is none; the entry then ends with a space
      -- (finished_entry in core.lua, inlined).
      entries[nl] = now .. ' ' .. succeeded .. (parent == '-' and ' ' or ' ' .. parent)
      if v[8] then
        marked = marked or {}
        marked[j] = { queue, v[4] }
      end
      out[j] = 'ok'
    end
  end
end
check_counters(running, queues)
local plan = nil
if endings then
  local need
  plan, need = settle_plan(GRAPH, endings)
  if not plan then
    return { 'need', need }
  end
end
-- Pass 2: writes.
for _, j in ipairs(finishing) do
  local a = 4 * j - 2
  local now = ARGV[a + 2]
  if now == '' then
    now = default_now
  end
  local result = ARGV[a + 3]
  if result == '' then
    call('HSET', KEYS[6 + j], 'state', 'succeeded', 'finished', now)
  else
    call('HSET', KEYS[6 + j], 'state', 'succeeded', 'finished', now, 'result',
      ARGV[tonumber(result)])
  end
  -- L4: a succeeded job shows no error of an earlier attempt (it is in the history).
  if stale_error[j] then
    call('HDEL', KEYS[6 + j], 'error')
  end
  local m = marked and marked[j]
  if m then
    record_change(events, ARGV[a], m[1], 'running', 'succeeded', m[2], m[2], now)
  end
end
-- Per queue, so each running counter drops by exactly the entries removed.
for queue, members in pairs(lease_old) do
  local removed = 0
  local n = #members
  local i = 1
  while i <= n do
    local last = math.min(i + CHUNK - 1, n)
    removed = removed + call('ZREM', leases, unpack(members, i, last))
    i = last + 1
  end
  if removed > 0 then
    call('HINCRBY', running, queue, string.format('%d', -removed))
  end
end
zrem_members(kleases, klease_old)
zrem_members(list, list_old)
zadd_pairs(list, list_new)
local n = #entries
local i = 1
while i <= n do
  local last = math.min(i + CHUNK - 1, n)
  call('RPUSH', finished, unpack(entries, i, last))
  i = last + 1
end
if plan then
  settle_write(GRAPH, plan)
end
if GRAPH then
  for _, id in ipairs(announced) do
    announce_ending(GRAPH.channel, id)
  end
end
return out
