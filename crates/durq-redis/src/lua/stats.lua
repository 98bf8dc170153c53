-- stats.lua: counts one queue's jobs per state from index sizes (CONTRACT A3).
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] list index (zset)   KEYS[4] running counters (hash)
-- KEYS[5] concurrency keys (hash)   KEYS[6] kready (zset): kept by the promotion (core.lua)
-- ARGV[1] now (ms)             ARGV[2] promotion bound
-- ARGV[3] queue
--
-- Returns {'promote'} when more scheduled jobs are due than the bound (some were moved;
-- call again), else {'ok', ready, active, running, succeeded, dead, cancelled, waiting}.
-- Active counts queued and running jobs (one list code); queued = active - running, and
-- scheduled = queued - ready, once every due job is in the ready index.
--
-- Cost: O(log n) per count (ZLEXCOUNT), whatever the backlog.

local ready, sched, list, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue = ARGV[3]
if not promote(ready, sched, ARGV[1], tonumber(ARGV[2]), KEYS[5], KEYS[6]) then
  return { 'promote' }
end
local counts = queue_counts(ready, list, running, queue)
return { 'ok', counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], counts[7] }
