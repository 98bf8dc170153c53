-- enqueue.lua: adds a run of N jobs in order, each exactly as one enqueue would
-- (CONTRACT E1-E6, E9), deciding idempotency inside the script. All or nothing: every
-- check comes before the first write, so a refused run writes nothing.
--
-- KEYS[1]  ready index (zset)        KEYS[2] scheduled index (zset)
-- KEYS[3]  list index (zset)         KEYS[4] sequence counter (string, INCRBY N once)
-- KEYS[5]  children index (zset)      KEYS[6] placement index (hash: id -> placement)
-- KEYS[7]  concurrency keys (hash: id -> hex key)
-- KEYS[8]  kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[9]  dependents index (zset: `DEPENDENCY DEPENDENT`, see graph.lua)
-- KEYS[10] finished log (list): jobs cancelled at enqueue by a failed dependency (G3)
-- KEYS[11] event stream (CONTRACT V1; core.lua, record_change): written only with ARGV[5]
-- then for job j = 1..N, in order: the new job's hash (its id minted by Rust), its dedup
--   key if it has an idempotency key ('k' below), its parent's hash if it has a parent
--   in this slot ('p' below), the hashes of the stored jobs it waits for ('w' below)
-- then the hashes of jobs that dedup keys are known to point at, whose ids are the last
--   ARGV entries in the same order.
--
-- ARGV[1] dedup key TTL in ms ('0': the window is empty, write no dedup key)
-- ARGV[2] N                     ARGV[3] wake-up channel: per queue with a job made ready,
--                               one message 'QUEUE ID ID...' naming its first 32 such jobs
-- ARGV[4] '1' when some job of the run has an idempotency key, else '0'
-- ARGV[5] '1' when the store records events (StoreSettings::record_events): each job
--         created gets the mark `ev` and its `enqueued` event, dated by its created_at
--         in `meta` (CONTRACT V1); '0' otherwise, and nothing more is written
-- then for job j an entry of 7 values, then one value per option that takes one:
--   id, queue, meta (the packed immutable fields, see lib.lua, created_at included),
--   payload ('' when staged), run_at (ms),
--   order prefix (20 hex digits: inverted priority and ready time, as
--     durq_core::ReadyOrder::sort_key() begins; the sequence follows),
--   options: '' for a job due now with none of the below (the common case), else one
--     letter each, in this order, those marked + taking the next value:
--     's' scheduled (run_at after the job's now), 'g' payload staged,
--     'k'+ idempotency key: the dedup cutoff (the job's now - dedup_window: a key
--       deduplicates while its job's created_at > cutoff),
--     'a' unique while active (CONTRACT E10; only with 'k'),
--     'p'+ parent id, or 'q'+ parent id for a parent in another partition of a
--       partitioned namespace (no key: Rust checked it exists before the call),
--     't'+ timeout in ms,
--     'l'+ placement (`Job::placement()`: needs and locality as JSON, CONTRACT F1),
--     'c'+ concurrency key, hex-encoded (keys.rs, `hex_key`; CONTRACT K1-K5): stored in
--       the job's `ckey` field and in `ckeys`, and in `kready` when the job is ready now,
--     'w'+ dependencies (CONTRACT G1-G3): `POLICY NOW REF...`, POLICY 'cancel' or
--       'run' (DependencyFailure::as_str), NOW the job's clock reading (ms), each REF
--       a stored job's id (its hash among the job's KEYS, in order) or `#i`, job i of
--       this run (G2). The job's
--       `meta` gets ` ~POLICY:ID,...` appended, the ids resolved here (codec.rs, DEPS),
--       and it starts queued, waiting (`wfor`, edges) or cancelled (graph.lua).
-- Each job carries its own clock reading (created_at, due, cutoff): concurrent enqueues
-- of one store are sent together, each as it was called.
-- then the ids of the extra KEYS.
--
-- A staged payload was written by Rust before this call into the job's own hash (field
-- `payload` only, with a server TTL; no `state`, so the hash is no job yet and nothing
-- finds it): this call turns it into the job (PERSIST) or deletes it (a duplicate).
--
-- Returns one of:
--   {'ok', {r1, ..., rN}}   every job handled: rj is 1 when job j was created under its
--                           own id, else the id of the job its key points at
--   {'parent', j}           job j's parent does not exist; nothing written
--   {'depends_on', j, id}   job j waits for job id, which does not exist; nothing written
--   {'need', {id, ...}}     dedup keys point at these ids, whose hashes are not among
--                           KEYS; nothing written: Rust calls again with them added
--   {'staged', j}           job j's staged payload is gone (expired, deleted); nothing
--                           written
--
-- Atomicity: phase 1 reads and checks (parents, staged payloads, dedup keys); phase 2
-- writes. Every value phase 2 reads is either one phase 1 read (unchanged: the script runs
-- alone) or one this script wrote, so phase 2 cannot stop half-way on a check.
--
-- Cost: the hot path of every producer. It includes core.lua alone (every helper
-- file's definitions cost every call; it uses kready_member, finished_entry and
-- STATE_CODE), reads each job's plain entry without decoding options, and per created
-- job writes one HSET and adds its members to one ZADD per index. A store that records
-- events adds the field `ev` to that HSET and one XADD per created job; one that does
-- not pays the test of ARGV[5] per job.

local call, find, format = redis.call, string.find, string.format
local dedup_ttl = ARGV[1]
local n = tonumber(ARGV[2])
local channel = ARGV[3]
local has_keys = ARGV[4] == '1'
local mark = ARGV[5] == '1'
local events = KEYS[11]

-- One job's options, decoded only for a job that has any: the flags and the values they
-- take, and where its entry, its extra values and its keys end.
local function options(opts, a, k)
  local o = {}
  local v = a + 7
  o.sched = find(opts, 's', 1, true) ~= nil
  o.staged = find(opts, 'g', 1, true) ~= nil
  if find(opts, 'k', 1, true) then
    v = v + 1
    k = k + 1
    o.cutoff = ARGV[v]
    o.dedup = KEYS[k]
    o.while_active = find(opts, 'a', 1, true) ~= nil
  end
  if find(opts, 'p', 1, true) then
    v = v + 1
    k = k + 1
    o.parent = ARGV[v]
    o.parent_key = KEYS[k]
  elseif find(opts, 'q', 1, true) then
    -- The parent lives in another partition: Rust checked it; only the link is written.
    v = v + 1
    o.parent = ARGV[v]
  end
  if find(opts, 't', 1, true) then
    v = v + 1
    o.timeout = ARGV[v]
  end
  if find(opts, 'l', 1, true) then
    v = v + 1
    o.placement = ARGV[v]
  end
  if find(opts, 'c', 1, true) then
    v = v + 1
    o.ckey = ARGV[v]
  end
  if find(opts, 'w', 1, true) then
    v = v + 1
    o.deps = {}
    local first = true
    for word in string.gmatch(ARGV[v], '%S+') do
      if first then
        o.policy = word
        first = false
      elseif not o.now then
        o.now = word
      elseif string.sub(word, 1, 1) == '#' then
        o.deps[#o.deps + 1] = { index = tonumber(string.sub(word, 2)) }
      else
        k = k + 1
        o.deps[#o.deps + 1] = { id = word, key = KEYS[k] }
      end
    end
  end
  return o, v, k
end

-- Phase 1: checks, no writes; the entries' positions and options for phase 2.
local at, job_keys, opts_of = {}, {}, {}
local a, k = 5, 11
local with_keys = {}
for j = 1, n do
  at[j] = a
  k = k + 1
  job_keys[j] = KEYS[k]
  local opts = ARGV[a + 7]
  if opts == '' then
    a = a + 7
  else
    local o
    o, a, k = options(opts, a, k)
    opts_of[j] = o
    if o.parent_key and call('EXISTS', o.parent_key) == 0 then
      return { 'parent', j }
    end
    if o.staged then
      local job = job_keys[j]
      if call('HEXISTS', job, 'payload') == 0 or call('HEXISTS', job, 'state') == 1 then
        return { 'staged', j }
      end
    end
    if o.deps then
      for _, dep in ipairs(o.deps) do
        -- A staged payload is no job: only a hash with a state is one (G1).
        if dep.key and call('HEXISTS', dep.key, 'state') == 0 then
          return { 'depends_on', j, dep.id }
        end
      end
    end
    if o.dedup then
      with_keys[#with_keys + 1] = j
    end
  end
end

-- Hashes whose keys this script holds, by job id: the run's jobs with keys (a key written
-- by an earlier job of the run points at it) and the extra ones.
local known = {}
if has_keys then
  for _, j in ipairs(with_keys) do
    known[ARGV[at[j] + 1]] = job_keys[j]
  end
  for e = 1, #KEYS - k do
    known[ARGV[a + e]] = KEYS[k + e]
  end
  local needed, asked = {}, {}
  for _, j in ipairs(with_keys) do
    local current = call('GET', opts_of[j].dedup)
    if current and not known[current] and not asked[current] then
      asked[current] = true
      needed[#needed + 1] = current
    end
  end
  if #needed > 0 then
    return { 'need', needed }
  end
end

-- Phase 2: writes. Sequence numbers for the whole run in one step (the first write; a
-- corrupt counter fails it before anything else is written); a job that turns out to be
-- a duplicate leaves a gap, which the order does not mind.
local seq_base = call('INCRBY', KEYS[4], n) - n

local results = {}
-- Per queue with a job ready now, the first WAKE_IDS ids made ready: the wake-up names
-- them, so a waiting claimer holds their hashes in its first call and leases them in one
-- round trip when its queue was empty (see wake.rs and store/heads.rs).
local WAKE_IDS = 32
local woken, nwoken = {}, {}
local function wake(queue, id)
  local ids = woken[queue]
  if not ids then
    woken[queue] = { id }
    nwoken[queue] = 1
  elseif nwoken[queue] < WAKE_IDS then
    local k = nwoken[queue] + 1
    ids[k] = id
    nwoken[queue] = k
  end
end
local ready_pairs, sched_pairs, list_pairs, child_pairs, placement_pairs = {}, {}, {}, {}, {}
local ckey_pairs, kready_pairs = {}, {}
-- Jobs that wait: `edges` (`DEPENDENCY DEPENDENT`), the `finished` entries of jobs
-- cancelled at once because a job they wait for already failed (G3), and the hashes
-- `flagged` with `hasd` by this call. Made by the first job with dependencies, so a
-- call without any builds nothing for them.
local waits = nil

-- How job `id` (entry options `o`, packed `meta`) with dependencies starts (CONTRACT
-- G1-G3). Mirrors durq_core::graph::at_enqueue: returns 'queued' with nil, 'waiting' with
-- the number of dependencies not ended yet, or 'cancelled' with its last_error; and its
-- meta with the resolved dependencies appended. A `#i` reference is job i of this run,
-- or the job its key answered with (G2); each job is waited for once, in the order
-- first named. Edges and `hasd` flags are written for the dependencies it waits for.
local function dependency_start(o, meta, id)
  if not waits then
    waits = { edges = {}, finished = {}, flagged = {} }
  end
  local ids, keys, named = {}, {}, {}
  for _, dep in ipairs(o.deps) do
    local did, dkey = dep.id, dep.key
    if dep.index then
      local r = results[dep.index]
      if r == 1 then
        did, dkey = ARGV[at[dep.index] + 1], job_keys[dep.index]
      else
        did, dkey = r, known[r]
      end
    end
    if not named[did] then
      named[did] = true
      ids[#ids + 1] = did
      keys[#keys + 1] = dkey
    end
  end
  meta = meta .. ' ~' .. o.policy .. ':' .. table.concat(ids, ',')
  local open, failed = {}, nil
  for i, did in ipairs(ids) do
    local state = call('HGET', keys[i], 'state')
    if state == 'dead' or state == 'cancelled' then
      if o.policy ~= 'run' and not failed then
        -- Byte for byte durq_core::graph::failed_dependency (graph.lua's, which this
        -- script does not include).
        failed = 'cancelled: dependency ' .. did .. ' ended ' .. state
      end
    elseif state ~= 'succeeded' then
      open[#open + 1] = i
    end
  end
  if failed then
    return 'cancelled', failed, meta
  end
  if #open == 0 then
    return 'queued', nil, meta
  end
  for _, i in ipairs(open) do
    local edges = waits.edges
    edges[#edges + 1] = '0'
    edges[#edges + 1] = ids[i] .. ' ' .. id
    -- Flagged once per call: a graph's root is waited for by its whole fan-out.
    if not waits.flagged[keys[i]] then
      waits.flagged[keys[i]] = true
      call('HSET', keys[i], 'hasd', '1')
    end
  end
  return 'waiting', #open, meta
end
local nr, nl = 0, 0
-- A job's `enqueued` event (CONTRACT V1), whatever its first state, is dated by the
-- created_at its `meta` carries (the job's own clock reading).
local CREATED = '^%S+ %S+ %S+ %S+ (%S+) '

for j = 1, n do
  local a = at[j]
  local id, queue, meta, payload, run_at = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local job = job_keys[j]
  local order = ARGV[a + 6] .. format('%016x', seq_base + j)
  local o = opts_of[j]
  if not o then
    -- The common case: due now, nothing else. One HSET with its arguments inline
    -- (building a table per job and unpacking it costs the server more than the write);
    -- `state` first, then the fields claims and completions read, so their lookups in
    -- the hash stop early.
    if mark then
      call('HSET', job, 'state', 'queued', 'meta', meta, 'run_at', run_at, 'att', '0',
        'token', '0', 'order', order, 'payload', payload, 'ev', '1')
      record_change(events, id, queue, nil, 'queued', '0', '0', string.match(meta, CREATED))
    else
      call('HSET', job, 'state', 'queued', 'meta', meta, 'run_at', run_at, 'att', '0',
        'token', '0', 'order', order, 'payload', payload)
    end
    nr = nr + 2
    ready_pairs[nr - 1] = '0'
    ready_pairs[nr] = queue .. ' ' .. order .. id
    wake(queue, id)
    nl = nl + 2
    list_pairs[nl - 1] = '0'
    list_pairs[nl] = queue .. ' a ' .. id
    results[j] = 1
  else
    local existing = nil
    if o.dedup then
      local current = call('GET', o.dedup)
      -- Phase 1 made sure every id a dedup key holds is known; keys written since point at
      -- jobs of this run.
      local current_job = current and known[current]
      if current_job and o.while_active then
        -- Unique while active (E10): the key holds while its job has not ended.
        local state = call('HGET', current_job, 'state')
        if state == 'queued' or state == 'running' or state == 'waiting' then
          existing = current
        end
      elseif current_job then
        -- A key deduplicates while its job exists and is inside the window (E2, E5, E6).
        local meta_of = call('HGET', current_job, 'meta')
        local created = meta_of and string.match(meta_of, '^%S+ %S+ %S+ %S+ (%S+) ')
        local created_n = created and tonumber(created)
        if created_n and created_n > tonumber(o.cutoff) then
          existing = current
        end
      end
    end
    if existing then
      results[j] = existing
      if o.staged then
        call('DEL', job)
      end
    else
      -- How it starts, and what goes with that: how many it waits for, or why it
      -- was cancelled (dependency_start).
      local start, detail = 'queued', nil
      if o.deps then
        start, detail, meta = dependency_start(o, meta, id)
      end
      -- A staged payload is in the hash already, and an absent timeout is no field.
      if o.staged then
        call('HSET', job, 'state', start, 'meta', meta, 'run_at', run_at, 'att', '0',
          'token', '0', 'order', order)
        call('PERSIST', job)
      else
        call('HSET', job, 'state', start, 'meta', meta, 'run_at', run_at, 'att', '0',
          'token', '0', 'order', order, 'payload', payload)
      end
      if mark then
        call('HSET', job, 'ev', '1')
        record_change(events, id, queue, nil, start, '0', '0', string.match(meta, CREATED))
      end
      if start == 'waiting' then
        call('HSET', job, 'wfor', string.format('%d', detail))
      elseif start == 'cancelled' then
        call('HSET', job, 'finished', o.now, 'error', detail)
      end
      if o.timeout then
        call('HSET', job, 'timeout', o.timeout)
      end
      if o.placement then
        -- Only jobs that declare a placement pay for it: a field of their own (what every
        -- read decodes) and an entry in the index fitted claims read (written below).
        call('HSET', job, 'placement', o.placement)
        placement_pairs[#placement_pairs + 1] = id
        placement_pairs[#placement_pairs + 1] = o.placement
      end
      if o.ckey then
        -- Likewise a concurrency key: its field, its `ckeys` entry and, while the job is
        -- ready, its `kready` member (a scheduled one gets it when promoted).
        call('HSET', job, 'ckey', o.ckey)
        ckey_pairs[#ckey_pairs + 1] = id
        ckey_pairs[#ckey_pairs + 1] = o.ckey
      end
      local member = queue .. ' ' .. order .. id
      if start ~= 'queued' then
        -- Neither ready nor scheduled: a waiting job is queued when released
        -- (graph.lua), a cancelled one never.
        if start == 'cancelled' then
          waits.finished[#waits.finished + 1] =
            finished_entry(o.now, queue, 'cancelled', id, o.parent)
        end
      elseif o.sched then
        sched_pairs[#sched_pairs + 1] = run_at
        sched_pairs[#sched_pairs + 1] = member
      else
        nr = nr + 2
        ready_pairs[nr - 1] = '0'
        ready_pairs[nr] = member
        wake(queue, id)
        if o.ckey then
          kready_pairs[#kready_pairs + 1] = '0'
          kready_pairs[#kready_pairs + 1] = kready_member(queue, member, o.ckey)
        end
      end
      nl = nl + 2
      list_pairs[nl - 1] = '0'
      list_pairs[nl] = queue .. ' ' .. STATE_CODE[start] .. ' ' .. id
      if o.parent then
        child_pairs[#child_pairs + 1] = '0'
        child_pairs[#child_pairs + 1] = o.parent .. ' ' .. id
      end
      if o.dedup and o.while_active then
        -- No TTL: the key holds as long as the job is active. Purge deletes it with the
        -- job, by the name kept in `dkey` (see purge.lua).
        call('SET', o.dedup, id)
        call('HSET', job, 'dkey', o.dedup)
      elseif o.dedup and dedup_ttl ~= '0' then
        call('SET', o.dedup, id, 'PX', dedup_ttl)
      end
      results[j] = 1
    end
  end
end

-- Index entries are written together at the end (fewer calls; at most 1,000 members or
-- field pairs a call, as Lua's unpack is limited); nothing in between reads them.
local function add_all(key, command, flat)
  local total = #flat
  local i = 1
  while i <= total do
    local last = math.min(i + 1999, total)
    call(command, key, unpack(flat, i, last))
    i = last + 1
  end
end
add_all(KEYS[1], 'ZADD', ready_pairs)
add_all(KEYS[2], 'ZADD', sched_pairs)
add_all(KEYS[3], 'ZADD', list_pairs)
add_all(KEYS[5], 'ZADD', child_pairs)
add_all(KEYS[6], 'HSET', placement_pairs)
add_all(KEYS[7], 'HSET', ckey_pairs)
add_all(KEYS[8], 'ZADD', kready_pairs)
if waits then
  add_all(KEYS[9], 'ZADD', waits.edges)
  add_all(KEYS[10], 'RPUSH', waits.finished)
end
for queue, ids in pairs(woken) do
  call('PUBLISH', channel, queue .. ' ' .. table.concat(ids, ' '))
end
return { 'ok', results }
