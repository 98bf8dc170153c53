-- retry.lua: queues a dead or cancelled job again, ready now, attempts reset
-- (CONTRACT A2).
--
-- KEYS[1] the job's hash       KEYS[2] ready index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished index of layout 1 (zset; see
--                              requeue_ended.lua)
-- KEYS[5] sequence counter (string)
-- KEYS[6] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[7] event stream (CONTRACT V1: `retried`, for a job that records its events)
-- ARGV[1] job id               ARGV[2] now (ms)
-- ARGV[3] now as 16 hex digits ARGV[4] wake-up channel
--
-- Returns {'ok'} | {'notfound'} | {'state', current state} (not dead or cancelled) |
-- {'corrupt', reason} (unreadable meta)
--
-- Atomicity: the check and the move are one step, so of concurrent retries exactly one
-- finds the job dead or cancelled. Every value used is checked before the first write
-- (requeue_ended.lua, whose moves reopen.lua makes too). The job's steps (CONTRACT D2)
-- are kept: the next run reads them.

local job = KEYS[1]
local v = redis.call('HMGET', job, 'state', 'meta', 'ckey', 'ev')
if not v[1] then
  return { 'notfound' }
end
local state = v[1]
if state ~= 'dead' and state ~= 'cancelled' then
  return { 'state', state }
end
return requeue_ended(job, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[1],
  ARGV[2], ARGV[3], ARGV[4], state, v[2], v[3], v[4]) or { 'ok' }
