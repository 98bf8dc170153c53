-- reclaim.lua: recovers running jobs whose lease expired (CONTRACT R1-R6).
--
-- KEYS[1] lease index (zset)   KEYS[2] ready index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished index (zset)
-- KEYS[5] sequence counter (string)
-- KEYS[6] running counters (hash)
-- KEYS[6+i] the hash of the job of lease entry i (ARGV[4+i])
-- ARGV[1] now (ms)             ARGV[2] now as 16 hex digits
-- ARGV[3] the last_error text of an expired lease
-- ARGV[4] wake-up channel
-- ARGV[4+i] lease index member i ("queue id"), read by Rust with
--           ZRANGEBYSCORE leases -inf (now LIMIT 0 limit
--
-- Returns {examined, {{id, new state}, ...}}: examined is the number of lease entries
-- this call looked at, which is never more than the entries it was given, so its work
-- follows the number of expired leases, not of running jobs (R6).
--
-- Each entry is checked again here: it must still be in the lease index with an expiry
-- strictly before now (R1, R2), so concurrent reclaimers take each job once (R4). An entry
-- whose hash is gone is removed and never requeued or recreated (R5).
--
-- Atomicity: each job moves from the lease index to the ready or finished index in the
-- same step that changes its state.

local leases, ready, list, done, seq, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, now_hex, message, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now_n = tonumber(now)
local examined = 0
local out = {}
local woken = {}
for i = 1, #KEYS - 6 do
  local member = ARGV[4 + i]
  local job = KEYS[6 + i]
  examined = examined + 1
  local score = redis.call('ZSCORE', leases, member)
  if score and tonumber(score) < now_n then
    local id = string.sub(member, -36)
    local queue = string.sub(member, 1, #member - 37)
    local v = redis.call('HMGET', job, 'state', 'att', 'meta', 'cancel')
    local _, parent, prio, max_att = meta_head(v[3])
    redis.call('ZREM', leases, member)
    redis.call('HINCRBY', running, queue, -1)
    if not v[1] then
      -- The hash vanished (R5): drop its entries, write nothing.
      redis.call('ZREM', list, list_member(queue, 'running', id))
    elseif v[1] == 'running' and prio then
      redis.call('HSET', job, 'error', message)
      local state
      if v[4] == '1' then
        state = 'cancelled'
        finish(job, list, done, queue, id, parent, 'running', state, now)
      elseif tonumber(v[2]) >= tonumber(max_att) then
        state = 'dead'
        finish(job, list, done, queue, id, parent, 'running', state, now)
      else
        state = 'queued'
        requeue(job, ready, nil, list, seq, queue, id, prio, now, now_hex, true, 'running')
        if not woken[queue] then
          woken[queue] = true
          redis.call('PUBLISH', channel, queue)
        end
      end
      out[#out + 1] = { id, state }
    end
    -- Any other state means the entry was stale, and an unreadable meta field cannot be
    -- requeued: either way the entry is only removed (`get` reports the corrupt record).
  end
end
return { examined, out }
