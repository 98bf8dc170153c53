-- complete.lua: marks a running job succeeded and stores its result (CONTRACT L2-L5).
--
-- KEYS[1] the job's hash       KEYS[2] lease index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished index (zset)
-- ARGV[1] job id               ARGV[2] token
-- ARGV[3] now (ms)             ARGV[4] garbage-collection TTL of the record (ms)
-- ARGV[5] '1' if a result is given, else '0'
-- ARGV[6] the result bytes (ignored when ARGV[5] is '0')
--
-- Returns {'ok'} | {'notfound'} | {'lost'}
--
-- Atomicity: state, result, lease index, list index and finished index change in one step;
-- a second complete with the same token finds the job no longer running (L5).

local job, leases, list, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, now = ARGV[1], ARGV[3]
local v = redis.call('HMGET', job, 'state', 'token', 'queue', 'parent')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue = v[3]
if ARGV[5] == '1' then
  redis.call('HSET', job, 'result', ARGV[6])
end
redis.call('ZREM', leases, lease_member(queue, id))
finish(job, list, done, queue, id, v[4] or nil, 'running', 'succeeded', now, ARGV[4])
return { 'ok' }
