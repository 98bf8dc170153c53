-- reclaim.lua: recovers running jobs whose lease expired (CONTRACT R1-R6).
--
-- KEYS[1] lease index (zset)   KEYS[2] ready index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished log (list)
-- KEYS[5] sequence counter (string)
-- KEYS[6] running counters (hash)
-- KEYS[7] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[8] concurrency keys (hash: id -> hex key)
-- KEYS[9] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- KEYS[9+i] the hash of the job of lease entry i (ARGV[4+i])
-- ARGV[1] now (ms)             ARGV[2] now as 16 hex digits
-- ARGV[3] the last_error text of an expired lease
-- ARGV[4] wake-up channel
-- ARGV[4+i] lease index member i ("queue id"), read by Rust with
--           ZRANGEBYSCORE leases -inf (now LIMIT 0 limit
-- then a graph tail (graph.lua): each job that ends dead or cancelled settles the jobs
-- waiting for it (G3). A {'need', {id, ...}} answer wrote nothing. A job that records
-- its events records `failed` (queued again, the attempt counted), `dead` (its last
-- attempt, or a record buried) or `cancelled` in the tail's event stream (CONTRACT V1).
--
-- Returns {examined, {{id, new state}, ...}}: examined is the number of lease entries
-- this call looked at, which is never more than the entries it was given, so its work
-- follows the number of expired leases, not of running jobs (R6).
--
-- Each entry is checked again here: it must still be in the lease index with an expiry
-- strictly before now (R1, R2), so concurrent reclaimers take each job once (R4). An entry
-- whose hash is gone is removed, with its `ckeys` entry, and never requeued or recreated
-- (R5). A record that cannot be read (unreadable meta or attempts, unknown state) is
-- moved to `dead` with last_error 'corrupt record: ...' (CONTRACT §5, corrupt records)
-- and reported as dead.
--
-- The attempt of each job taken back ends expired with the eviction text (CONTRACT H2):
-- its record goes into the job's hash in the HSET that stores that text. A record whose
-- token, worker or start cannot be read is buried like any unreadable record.
--
-- Atomicity: each job moves from the lease index to the ready or finished index in the
-- same step that changes its state. Check before write: a first pass reads and decides
-- every entry, then the running counters are checked, then one INCRBY draws the sequence
-- numbers of the requeued jobs (the first write), then the second pass writes.

local leases, ready, list, finished, seq, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local kready, ckeys, kleases = KEYS[7], KEYS[8], KEYS[9]
local now, now_hex, message, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local g = graph_tail()
local now_n = tonumber(now)
local examined = 0
local plan = {}     -- per entry taken: {kind, job, member, queue, id, parent, prio, reason, v}
local queues, seen_queue, seen_member = {}, {}, {}
local requeued = 0
-- Pass 1: read and decide, no writes.
for i = 1, g.own_keys - 9 do
  local member = ARGV[4 + i]
  local job = KEYS[9 + i]
  examined = examined + 1
  local score = redis.call('ZSCORE', leases, member)
  if score and tonumber(score) < now_n and not seen_member[member] then
    seen_member[member] = true
    local id = string.sub(member, -36)
    local queue = string.sub(member, 1, #member - 37)
    if not seen_queue[queue] then
      seen_queue[queue] = true
      queues[#queues + 1] = queue
    end
    local v = redis.call('HMGET', job, 'state', 'att', 'meta', 'cancel', 'token', 'worker', 'started',
      'ckey', 'awt', 'ev')
    local state = v[1]
    local _, parent, prio, max_att = meta_head(v[3])
    local kind, reason
    if not state then
      -- The hash vanished (R5): drop its entries, write nothing to it.
      kind = 'vanished'
    elseif state == 'running' then
      local lease_bad = lease_unreadable(v[6], v[7])
      if not prio or not is_int(prio) or not is_int(max_att) then
        kind, reason = 'corrupt', 'field meta unreadable'
      elseif not is_int(v[2]) then
        kind, reason = 'corrupt', 'field att not a number'
      elseif not is_int(v[5]) then
        kind, reason = 'corrupt', 'field token not a number'
      elseif lease_bad then
        kind, reason = 'corrupt', lease_bad
      elseif v[4] == '1' then
        -- Mirrors durq_core::transition::after_lease_expired (CONTRACT R1/R3): cancel
        -- requested -> cancelled; last attempt used -> dead; else queued, ready now.
        kind = 'cancelled'
      elseif tonumber(v[2]) >= tonumber(max_att) then
        kind = 'dead'
      else
        kind = 'queued'
        requeued = requeued + 1
      end
    elseif not STATE_CODE[state] then
      kind, reason = 'corrupt', 'unknown state'
    else
      -- Any other state means the entry was stale: it is only removed.
      kind = 'stale'
    end
    plan[#plan + 1] = { kind, job, member, queue, id, parent, prio, reason, v }
  end
end
check_counters(running, queues)
local endings = {}
for _, p in ipairs(plan) do
  local kind = p[1]
  if kind == 'dead' or kind == 'cancelled' or kind == 'corrupt' then
    endings[#endings + 1] = { p[5], kind == 'cancelled' and 'cancelled' or 'dead' }
  end
end
local settled, need = settle_plan(g, endings)
if not settled then
  return { 'need', need }
end

-- Pass 2: writes.
local seq_next = 0
if requeued > 0 then
  seq_next = redis.call('INCRBY', seq, requeued) - requeued
end
local out = {}
local woken = {}
for _, p in ipairs(plan) do
  local kind, job, member, queue, id, parent, prio, reason = p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]
  local v = p[9]
  redis.call('ZREM', leases, member)
  redis.call('HINCRBY', running, queue, -1)
  -- A vanished job's key is only in `ckeys`.
  local ckey = v[8] or (kind == 'vanished' and redis.call('HGET', ckeys, id))
  if ckey then
    redis.call('ZREM', kleases, queue .. ' ' .. ckey .. ' ' .. id)
  end
  if kind == 'vanished' then
    redis.call('ZREM', list, list_member(queue, 'running', id))
    redis.call('HDEL', ckeys, id)
  elseif kind == 'corrupt' then
    bury(job, list, finished, queue, id, parent, now, reason)
    if v[10] then
      record_change(g.events, id, queue, v[1], 'dead', v[2], v[2], now)
    end
    if v[9] then
      announce_ending(channel, id)
    end
    out[#out + 1] = { id, 'dead' }
  elseif kind ~= 'stale' then
    redis.call('HSET', job, 'error', message, attempt_field(v[5]),
      attempt_record(v[5], v[7], now, 'e', v[6], message))
    if kind == 'queued' then
      seq_next = seq_next + 1
      requeue(job, ready, nil, list, seq_next, queue, id, prio, now, now_hex, true, 'running',
        v[8], kready)
      if v[10] then
        record_change(g.events, id, queue, 'running', 'queued', v[2], v[2], now)
      end
      if not woken[queue] then
        woken[queue] = true
        redis.call('PUBLISH', channel, queue)
      end
    else
      finish(job, list, finished, queue, id, parent, 'running', kind, now)
      if v[10] then
        record_change(g.events, id, queue, 'running', kind, v[2], v[2], now)
      end
      if v[9] then
        announce_ending(channel, id)
      end
    end
    out[#out + 1] = { id, kind }
  end
end
settle_write(g, settled)
return { examined, out }
