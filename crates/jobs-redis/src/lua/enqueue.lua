-- enqueue.lua: adds a run of N jobs in order, each exactly as one enqueue would
-- (CONTRACT E1-E6, E9), deciding idempotency inside the script.
--
-- KEYS[1]  ready index (zset)        KEYS[2] scheduled index (zset)
-- KEYS[3]  list index (zset)         KEYS[4] sequence counter (string, INCRBY N once)
-- KEYS[5]  children index (zset)
-- for job j = 1..N, three keys:
--   KEYS[3j+3] the new job's hash (its id minted by Rust)
--   KEYS[3j+4] its dedup key, or the namespace's placeholder key when it has none
--   KEYS[3j+5] its parent's hash, or the placeholder key when it has none
-- then KEYS[3N+5+e], e = 1..E: hashes of jobs that dedup keys are known to point at,
--   whose ids are the last E ARGV entries in the same order.
--
-- ARGV[1] dedup key TTL in ms ('0': the window is empty, write no dedup key)
-- ARGV[2] N                     ARGV[3] wake-up channel
-- for job j, 11 values from ARGV[3 + 11(j-1) + 1]:
--   id, queue, meta (the packed immutable fields, see lib.lua, created_at included),
--   has key ('1'/'0'), payload, priority, run_at, run_at as 16 hex digits,
--   due ('1' when run_at <= the job's now), parent id or '',
--   dedup cutoff (the job's now - dedup_window: a key deduplicates while its job's
--   created_at > cutoff)
-- Each job carries its own clock reading (created_at, due, cutoff): concurrent enqueues
-- of one store are sent together, each as it was called.
-- then E ids (see the extra KEYS).
--
-- Returns one of:
--   {'ok', {{id, created (1/0)}, ...}}          every job handled
--   {'parent', j}                              job j's parent does not exist; nothing written
--   {'need', j, id, {{id, created}, ...}}      job j's dedup key points at `id`, whose hash
--                                              is not among KEYS: jobs before j are written,
--                                              j and after are not; Rust retries from j with
--                                              that hash added
--
-- Atomicity: all parents are checked before the first write, and each job's dedup read,
-- record, indexes and dedup key are written in the same script, so no crash leaves a job
-- without its index entries or a dedup key pointing at a half-written job.

local dedup_ttl = ARGV[1]
local n = tonumber(ARGV[2])
local channel = ARGV[3]
local PER_JOB = 11
local extra_keys = #KEYS - 5 - 3 * n

for j = 1, n do
  local a = 3 + PER_JOB * (j - 1)
  if ARGV[a + 10] ~= '' and redis.call('EXISTS', KEYS[3 * j + 5]) == 0 then
    return { 'parent', j }
  end
end

-- Hashes whose keys this script holds, by job id.
local known = {}
for j = 1, n do
  known[ARGV[3 + PER_JOB * (j - 1) + 1]] = KEYS[3 * j + 3]
end
for e = 1, extra_keys do
  known[ARGV[3 + PER_JOB * n + e]] = KEYS[3 * n + 5 + e]
end

-- Sequence numbers for the whole run in one step; a job that turns out to be a duplicate
-- leaves a gap, which the order does not mind.
local seq_base = redis.call('INCRBY', KEYS[4], n) - n

local results = {}
local woken = {}
local ready_pairs, sched_pairs, list_pairs, child_pairs = {}, {}, {}, {}
-- Index entries are written together at the end (fewer calls); nothing in between reads them.
local function flush()
  zadd_pairs(KEYS[1], ready_pairs)
  zadd_pairs(KEYS[2], sched_pairs)
  zadd_pairs(KEYS[3], list_pairs)
  zadd_pairs(KEYS[5], child_pairs)
end

for j = 1, n do
  local a = 3 + PER_JOB * (j - 1)
  local id, queue, meta = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local has_key = ARGV[a + 4] == '1'
  local prio, run_at, run_hex = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  local due = ARGV[a + 9] == '1'
  local parent = ARGV[a + 10]
  local job, dedup = KEYS[3 * j + 3], KEYS[3 * j + 4]

  local existing = nil
  if has_key then
    local current = redis.call('GET', dedup)
    if current then
      local current_job = known[current]
      if not current_job then
        flush()
        return { 'need', j, current, results }
      end
      -- A key deduplicates while its job exists and is inside the window (E2, E5, E6).
      local _, _, _, _, created = meta_head(redis.call('HGET', current_job, 'meta'))
      if created and tonumber(created) > tonumber(ARGV[a + 11]) then
        existing = current
      end
    end
  end

  if existing then
    results[#results + 1] = { existing, 0 }
  else
    local order = order_key(prio, run_hex, seq_base + j)
    redis.call('HSET', job, 'meta', meta, 'run_at', run_at, 'state', 'queued', 'att', '0',
      'token', '0', 'order', order, 'payload', ARGV[a + 5])
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
    if has_key and dedup_ttl ~= '0' then
      redis.call('SET', dedup, id, 'PX', dedup_ttl)
    end
    results[#results + 1] = { id, 1 }
  end
end
flush()
for queue in pairs(woken) do
  redis.call('PUBLISH', channel, queue)
end
return { 'ok', results }
