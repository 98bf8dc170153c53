-- heartbeat.lua: extends the lease of a running job whose token is current (CONTRACT L1-L3).
--
-- KEYS[1] the job's hash       KEYS[2] lease index (zset)
-- KEYS[3] running counters (hash)
-- ARGV[1] job id               ARGV[2] token
-- ARGV[3] now (ms)             ARGV[4] new lease expiry (ms)
--
-- Returns {'ok', cancel requested ('1'/'0')} | {'notfound'} | {'lost'} | {'corrupt'}
--
-- Atomicity: the hash and the lease index move together; a missing hash is never written.

local job, leases = KEYS[1], KEYS[2]
local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'cancel')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue = meta_head(v[3])
if not queue then
  return { 'corrupt' }
end
redis.call('HSET', job, 'lease_exp', ARGV[4], 'hb', ARGV[3])
if redis.call('ZADD', leases, ARGV[4], lease_member(queue, ARGV[1])) == 1 then
  -- The entry was missing (it never is unless the index was tampered with): count it.
  redis.call('HINCRBY', KEYS[3], queue, 1)
end
return { 'ok', v[4] or '0' }
