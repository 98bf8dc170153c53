-- enqueue.lua: adds a run of N jobs in order, each exactly as one enqueue would
-- (CONTRACT E1-E6, E9), deciding idempotency inside the script. All or nothing: every
-- check comes before the first write, so a refused run writes nothing.
--
-- KEYS[1]  ready index (zset)        KEYS[2] scheduled index (zset)
-- KEYS[3]  list index (zset)         KEYS[4] sequence counter (string, INCRBY N once)
-- KEYS[5]  children index (zset)      KEYS[6] placement index (hash: id -> placement)
-- for job j = 1..N, three keys:
--   KEYS[3j+4] the new job's hash (its id minted by Rust)
--   KEYS[3j+5] its dedup key, or the namespace's placeholder key when it has none
--   KEYS[3j+6] its parent's hash, or the placeholder key when it has none
-- then KEYS[3N+6+e], e = 1..E: hashes of jobs that dedup keys are known to point at,
--   whose ids are the last E ARGV entries in the same order.
--
-- ARGV[1] dedup key TTL in ms ('0': the window is empty, write no dedup key)
-- ARGV[2] N                     ARGV[3] wake-up channel
-- for job j, 14 values from ARGV[3 + 14(j-1) + 1]:
--   id, queue, meta (the packed immutable fields, see lib.lua, created_at included),
--   flags ('0' plain, '1' has an idempotency key, '2' payload staged, '3' both),
--   payload ('' when staged), priority, run_at, run_at as 16 hex digits,
--   due ('1' when run_at <= the job's now), parent id or '',
--   dedup cutoff (the job's now - dedup_window: a key deduplicates while its job's
--   created_at > cutoff), timeout in ms or '' (none),
--   uniqueness ('' the window, 'a' while the job is active: CONTRACT E10),
--   placement (`Job::placement()`: needs and locality as JSON, CONTRACT F1) or '' (none)
-- Each job carries its own clock reading (created_at, due, cutoff): concurrent enqueues
-- of one store are sent together, each as it was called.
-- then E ids (see the extra KEYS).
--
-- A staged payload was written by Rust before this call into the job's own hash (field
-- `payload` only, with a server TTL; no `state`, so the hash is no job yet and nothing
-- finds it): this call turns it into the job (PERSIST) or deletes it (a duplicate).
--
-- Returns one of:
--   {'ok', {{id, created (1/0)}, ...}}   every job handled
--   {'parent', j}                        job j's parent does not exist; nothing written
--   {'need', {id, ...}}                  dedup keys point at these ids, whose hashes are
--                                        not among KEYS; nothing written: Rust calls again
--                                        with them added
--   {'staged', j}                        job j's staged payload is gone (expired, deleted);
--                                        nothing written
--
-- Atomicity: phase 1 reads and checks (parents, staged payloads, dedup keys); phase 2
-- writes. Every value phase 2 reads is either one phase 1 read (unchanged: the script runs
-- alone) or one this script wrote, so phase 2 cannot stop half-way on a check.

local dedup_ttl = ARGV[1]
local n = tonumber(ARGV[2])
local channel = ARGV[3]
local PER_JOB = 14
local extra_keys = #KEYS - 6 - 3 * n

-- Hashes whose keys this script holds, by job id.
local known = {}
for j = 1, n do
  known[ARGV[3 + PER_JOB * (j - 1) + 1]] = KEYS[3 * j + 4]
end
for e = 1, extra_keys do
  known[ARGV[3 + PER_JOB * n + e]] = KEYS[3 * n + 6 + e]
end

-- Phase 1: checks, no writes.
local needed = {}
local asked = {}
for j = 1, n do
  local a = 3 + PER_JOB * (j - 1)
  if ARGV[a + 10] ~= '' and redis.call('EXISTS', KEYS[3 * j + 6]) == 0 then
    return { 'parent', j }
  end
  local flags = ARGV[a + 4]
  if flags == '2' or flags == '3' then
    local job = KEYS[3 * j + 4]
    if redis.call('HEXISTS', job, 'payload') == 0 or redis.call('HEXISTS', job, 'state') == 1 then
      return { 'staged', j }
    end
  end
  if flags == '1' or flags == '3' then
    local current = redis.call('GET', KEYS[3 * j + 5])
    if current and not known[current] and not asked[current] then
      asked[current] = true
      needed[#needed + 1] = current
    end
  end
end
if #needed > 0 then
  return { 'need', needed }
end

-- Phase 2: writes. Sequence numbers for the whole run in one step (the first write; a
-- corrupt counter fails it before anything else is written); a job that turns out to be
-- a duplicate leaves a gap, which the order does not mind.
local seq_base = redis.call('INCRBY', KEYS[4], n) - n

local results = {}
local woken = {}
local ready_pairs, sched_pairs, list_pairs, child_pairs = {}, {}, {}, {}
local placement_pairs = {}

for j = 1, n do
  local a = 3 + PER_JOB * (j - 1)
  local id, queue, meta = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local flags = ARGV[a + 4]
  local has_key = flags == '1' or flags == '3'
  local staged = flags == '2' or flags == '3'
  local prio, run_at, run_hex = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  local due = ARGV[a + 9] == '1'
  local parent = ARGV[a + 10]
  local timeout = ARGV[a + 12]
  local job, dedup = KEYS[3 * j + 4], KEYS[3 * j + 5]
  local while_active = ARGV[a + 13] == 'a'
  local placement = ARGV[a + 14]

  local existing = nil
  if has_key then
    local current = redis.call('GET', dedup)
    -- Phase 1 made sure every id a dedup key holds is known; keys written since point at
    -- jobs of this run.
    local current_job = current and known[current]
    if current_job and while_active then
      -- Unique while active (E10): the key holds while its job is queued or running.
      local state = redis.call('HGET', current_job, 'state')
      if state == 'queued' or state == 'running' then
        existing = current
      end
    elseif current_job then
      -- A key deduplicates while its job exists and is inside the window (E2, E5, E6).
      local _, _, _, _, created = meta_head(redis.call('HGET', current_job, 'meta'))
      local created_n = created and tonumber(created)
      if created_n and created_n > tonumber(ARGV[a + 11]) then
        existing = current
      end
    end
  end

  if existing then
    results[#results + 1] = { existing, 0 }
    if staged then
      redis.call('DEL', job)
    end
  else
    local order = order_key(prio, run_hex, seq_base + j)
    -- One HSET with its arguments inline, the common case: building a table per job
    -- and unpacking it cost the server more than the write. A staged payload is in the
    -- hash already, and an absent timeout is no field.
    if staged then
      if timeout == '' then
        redis.call('HSET', job, 'meta', meta, 'run_at', run_at, 'state', 'queued', 'att', '0',
          'token', '0', 'order', order)
      else
        redis.call('HSET', job, 'meta', meta, 'run_at', run_at, 'state', 'queued', 'att', '0',
          'token', '0', 'order', order, 'timeout', timeout)
      end
      redis.call('PERSIST', job)
    elseif timeout == '' then
      redis.call('HSET', job, 'meta', meta, 'run_at', run_at, 'state', 'queued', 'att', '0',
        'token', '0', 'order', order, 'payload', ARGV[a + 5])
    else
      redis.call('HSET', job, 'meta', meta, 'run_at', run_at, 'state', 'queued', 'att', '0',
        'token', '0', 'order', order, 'payload', ARGV[a + 5], 'timeout', timeout)
    end
    if placement ~= '' then
      -- Only jobs that declare a placement pay for it: a field of their own (what every
      -- read decodes) and an entry in the index fitted claims read (written below).
      redis.call('HSET', job, 'placement', placement)
      placement_pairs[#placement_pairs + 1] = id
      placement_pairs[#placement_pairs + 1] = placement
    end
    local member = queue_member(queue, order, id)
    if due then
      ready_pairs[#ready_pairs + 1] = '0'
      ready_pairs[#ready_pairs + 1] = member
      woken[queue] = true
    else
      sched_pairs[#sched_pairs + 1] = run_at
      sched_pairs[#sched_pairs + 1] = member
    end
    list_pairs[#list_pairs + 1] = '0'
    list_pairs[#list_pairs + 1] = list_member(queue, 'queued', id)
    if parent ~= '' then
      child_pairs[#child_pairs + 1] = '0'
      child_pairs[#child_pairs + 1] = child_member(parent, id)
    end
    if has_key and while_active then
      -- No TTL: the key holds as long as the job is active. Purge deletes it with the
      -- job, by the name kept in `dkey` (see purge.lua).
      redis.call('SET', dedup, id)
      redis.call('HSET', job, 'dkey', dedup)
    elseif has_key and dedup_ttl ~= '0' then
      redis.call('SET', dedup, id, 'PX', dedup_ttl)
    end
    results[#results + 1] = { id, 1 }
  end
end
-- Index entries are written together at the end (fewer calls); nothing in between reads them.
zadd_pairs(KEYS[1], ready_pairs)
zadd_pairs(KEYS[2], sched_pairs)
zadd_pairs(KEYS[3], list_pairs)
zadd_pairs(KEYS[5], child_pairs)
hset_pairs(KEYS[6], placement_pairs)
for queue in pairs(woken) do
  redis.call('PUBLISH', channel, queue)
end
return { 'ok', results }
