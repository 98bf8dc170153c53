-- fail.lua: records a failure of a running job and requeues it or ends it
-- (CONTRACT L2, L3, L6, L7; A1: cancel while running).
--
-- KEYS[1] the job's hash       KEYS[2] lease index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished log (list)
-- KEYS[5] ready index (zset)   KEYS[6] scheduled index (zset)
-- KEYS[7] sequence counter (string)
-- KEYS[8] running counters (hash)
-- KEYS[9] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[10] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- ARGV[1] job id               ARGV[2] token
-- ARGV[3] now (ms)             ARGV[4] error text (already cut to 64 KiB)
-- ARGV[5] retry time (ms), or '' for "never"
-- ARGV[6] retry time as 16 hex digits    ARGV[7] '1' if the retry time is <= now
-- ARGV[8] wake-up channel
-- ARGV[9] how many bytes of the error the attempt's record keeps (CONTRACT H2: 4 KiB,
--         cut on a character boundary by the caller; string.sub counts bytes)
-- then a graph tail (graph.lua): a job that ends dead or cancelled settles the jobs
-- waiting for it (G3); its event stream is where a job that records its events
-- records `failed`, `dead` or `cancelled` (CONTRACT V1).
--
-- Returns {'ok', new state} | {'notfound'} | {'lost'} | {'corrupt', reason} |
-- {'need', {id, ...}} (graph.lua; nothing written)
--
-- The attempt ends failed with the error (CONTRACT H2): its record goes into the job's
-- hash (attempt_record in lib.lua) in the HSET that stores the error, whatever the new
-- state.
--
-- Atomicity: the job leaves the lease index and enters the ready, scheduled or finished
-- index in the same step that changes its state. Check before write: every field the
-- decision needs and the queue's running counter are read and checked first; a corrupt
-- record is refused with nothing written (it stays running until its lease runs out and
-- reclaim buries it).

local job, leases, list, finished, ready, sched, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local running, kready, kleases = KEYS[8], KEYS[9], KEYS[10]
local id, now = ARGV[1], ARGV[3]
local g = graph_tail()
local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'att', 'cancel', 'worker', 'started',
  'ckey', 'awt', 'ev')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue, parent, prio, max_att = meta_head(v[3])
if not queue or not is_int(prio) or not is_int(max_att) then
  return { 'corrupt', 'field meta unreadable' }
end
if not is_int(v[4]) then
  return { 'corrupt', 'field att not a number' }
end
local unreadable = lease_unreadable(v[6], v[7])
if unreadable then
  return { 'corrupt', unreadable }
end
check_counters(running, { queue })
local attempt = attempt_record(v[2], v[7], now, 'f', v[6], string.sub(ARGV[4], 1, tonumber(ARGV[9])))

-- Mirrors durq_core::transition::after_failure (CONTRACT L6/L7, A1): cancel requested
-- -> cancelled; a retry time and attempts left -> queued at that time; else dead.
local state
if v[5] == '1' then
  state = 'cancelled'
elseif ARGV[5] ~= '' and tonumber(v[4]) < tonumber(max_att) then
  state = 'queued'
else
  state = 'dead'
end

if state == 'queued' then
  -- The first write: INCR fails on a corrupt counter before anything else changed.
  local next_seq = redis.call('INCR', seq)
  local due = ARGV[7] == '1'
  requeue(job, ready, sched, list, next_seq, queue, id, prio, ARGV[5], ARGV[6], due, 'running',
    v[8], kready)
  redis.call('HSET', job, 'error', ARGV[4], attempt_field(v[2]), attempt)
  drop_lease(leases, running, queue, id, kleases, v[8])
  if v[10] then
    record_change(g.events, id, queue, 'running', 'queued', v[4], v[4], now)
  end
  if due then
    redis.call('PUBLISH', ARGV[8], queue)
  end
else
  local plan, need = settle_plan(g, { { id, state } })
  if not plan then
    return { 'need', need }
  end
  redis.call('HSET', job, 'error', ARGV[4], attempt_field(v[2]), attempt)
  drop_lease(leases, running, queue, id, kleases, v[8])
  finish(job, list, finished, queue, id, parent, 'running', state, now)
  if v[10] then
    record_change(g.events, id, queue, 'running', state, v[4], v[4], now)
  end
  settle_write(g, plan)
  if v[9] then
    announce_ending(ARGV[8], id)
  end
end
return { 'ok', state }
