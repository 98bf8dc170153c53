-- retry.lua: queues a dead or cancelled job again, ready now, attempts reset
-- (CONTRACT A2).
--
-- KEYS[1] the job's hash       KEYS[2] ready index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished index of layout 1 (zset; see below)
-- KEYS[5] sequence counter (string)
-- KEYS[6] kready (zset: ready jobs with a concurrency key, see core.lua)
-- ARGV[1] job id               ARGV[2] now (ms)
-- ARGV[3] now as 16 hex digits ARGV[4] wake-up channel
--
-- Returns {'ok'} | {'notfound'} | {'state', current state} (not dead or cancelled) |
-- {'corrupt', reason} (unreadable meta)
--
-- Atomicity: the check and the move are one step, so of concurrent retries exactly one
-- finds the job dead or cancelled. Every value used is checked before the first write.

local job, ready, list, done_v1, seq, kready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, now = ARGV[1], ARGV[2]
local v = redis.call('HMGET', job, 'state', 'meta', 'ckey')
if not v[1] then
  return { 'notfound' }
end
local state = v[1]
if state ~= 'dead' and state ~= 'cancelled' then
  return { 'state', state }
end
local queue, parent, prio = meta_head(v[2])
if not queue or not is_int(prio) then
  return { 'corrupt', 'field meta unreadable' }
end
-- The first write: INCR fails on a corrupt counter before anything else changed.
local next_seq = redis.call('INCR', seq)
-- A job that finished under layout 1 has an entry in that layout's finished index, which
-- purge still reads: it leaves with the job's return to queued. One that finished under
-- this layout has an entry in the finished log, which stays: purge finds the job alive
-- (or finished later) and drops the entry then.
redis.call('ZREM', done_v1, queue .. ' ' .. STATE_CODE[state] .. ' ' .. id .. ' ' .. (parent or ''))
redis.call('HSET', job, 'att', '0', 'cancel', '0')
-- The job starts over (A2): no error, start or heartbeat of a past run stays on it;
-- they are in its attempt history.
redis.call('HDEL', job, 'finished', 'result', 'error', 'started', 'hb')
requeue(job, ready, nil, list, next_seq, queue, id, prio, now, ARGV[3], true, state, v[3], kready)
redis.call('PUBLISH', ARGV[4], queue)
return { 'ok' }
