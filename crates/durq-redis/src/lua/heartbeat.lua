-- heartbeat.lua: extends the leases of running jobs whose tokens are current
-- (CONTRACT L1-L3), N heartbeats in one call (`heartbeat` sends one, `heartbeat_batch`
-- a worker's whole set), all with the same clock reading and expiry.
--
-- KEYS[1] lease index (zset)   KEYS[2] running counters (hash)
-- KEYS[2+j] the hash of job j, j = 1..N
-- ARGV[1] now (ms)             ARGV[2] new lease expiry (ms)
-- for job j, 2 values from ARGV[2 + 2(j-1) + 1]: id, token
--
-- Returns one status per job, in order: '0' (extended) | '1' (extended, cancellation
-- requested) | 'notfound' | 'lost' | 'corrupt' (unreadable meta).
--
-- Atomicity: each hash and its lease entry move together. Check before write: a first
-- pass reads and decides every entry (and checks the running counter of a queue whose
-- lease entry went missing, the only case that counts one), a second pass writes. A
-- missing hash is never written.

local leases, running = KEYS[1], KEYS[2]
local now, expiry = ARGV[1], ARGV[2]
local out = {}
local extend = {}  -- flat: job key, lease member, queue
local recount = {}
-- Pass 1: read and decide, no writes.
for j = 1, #KEYS - 2 do
  local job = KEYS[2 + j]
  local id, token = ARGV[2 + 2 * j - 1], ARGV[2 + 2 * j]
  local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'cancel')
  if not v[1] then
    out[j] = 'notfound'
  elseif v[1] ~= 'running' or v[2] ~= token then
    out[j] = 'lost'
  else
    local queue = meta_queue_parent(v[3])
    if not queue then
      out[j] = 'corrupt'
    else
      local member = lease_member(queue, id)
      if not redis.call('ZSCORE', leases, member) then
        recount[#recount + 1] = queue
      end
      extend[#extend + 1] = job
      extend[#extend + 1] = member
      extend[#extend + 1] = queue
      out[j] = v[4] == '1' and '1' or '0'
    end
  end
end
check_counters(running, recount)
-- Pass 2: writes.
for i = 1, #extend, 3 do
  redis.call('HSET', extend[i], 'lease_exp', expiry, 'hb', now)
  if redis.call('ZADD', leases, expiry, extend[i + 1]) == 1 then
    -- The entry was missing (it never is unless the index was tampered with): count it.
    redis.call('HINCRBY', running, extend[i + 2], 1)
  end
end
return out
