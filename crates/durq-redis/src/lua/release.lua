-- release.lua: gives a running job back, ready now (release) or later (snooze), without
-- counting the attempt or touching its last error (CONTRACT L8, L10; A1: cancel while
-- running).
--
-- KEYS[1] the job's hash       KEYS[2] lease index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished log (list)
-- KEYS[5] ready index (zset)   KEYS[6] scheduled index (zset)
-- KEYS[7] sequence counter (string)
-- KEYS[8] running counters (hash)
-- KEYS[9] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[10] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- ARGV[1] job id               ARGV[2] token
-- ARGV[3] now (ms)             ARGV[4] ready time as 16 hex digits
-- ARGV[5] wake-up channel      ARGV[6] ready time (ms)
-- ARGV[7] '1' if the ready time is <= now
-- then a graph tail (graph.lua): a cancel-requested job the release ends cancelled
-- settles the jobs waiting for it (G3), as fail.lua does; its event stream is where a
-- job that records its events records `released` or `cancelled` (CONTRACT V1).
--
-- Returns {'ok', new state} | {'notfound'} | {'lost'} | {'corrupt', reason} |
-- {'need', {id, ...}} (graph.lua; nothing written)
--
-- The attempt ends released (CONTRACT H2): its record goes into the job's hash in the
-- same call, on either branch.
--
-- Atomicity and check before write: as fail.lua.

local job, leases, list, finished, ready, sched, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local running, kready, kleases = KEYS[8], KEYS[9], KEYS[10]
local id, now = ARGV[1], ARGV[3]
local g = graph_tail()
local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'cancel', 'att', 'worker', 'started',
  'ckey', 'awt', 'ev')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue, parent, prio = meta_head(v[3])
if not queue or not is_int(prio) then
  return { 'corrupt', 'field meta unreadable' }
end
if not is_int(v[5]) then
  return { 'corrupt', 'field att not a number' }
end
local unreadable = lease_unreadable(v[6], v[7])
if unreadable then
  return { 'corrupt', unreadable }
end
check_counters(running, { queue })
local attempt = attempt_record(v[2], v[7], now, 'r', v[6], nil)

-- Mirrors durq_core::transition::after_release (CONTRACT L8, A1): a cancel-requested job
-- ends cancelled, its attempt counted; any other goes back to queued, ready at the given
-- time, with the attempt taken back.
if v[4] == '1' then
  local plan, need = settle_plan(g, { { id, 'cancelled' } })
  if not plan then
    return { 'need', need }
  end
  drop_lease(leases, running, queue, id, kleases, v[8])
  finish(job, list, finished, queue, id, parent, 'running', 'cancelled', now)
  redis.call('HSET', job, attempt_field(v[2]), attempt)
  if v[10] then
    record_change(g.events, id, queue, 'running', 'cancelled', v[5], v[5], now)
  end
  settle_write(g, plan)
  if v[9] then
    announce_ending(ARGV[5], id)
  end
  return { 'ok', 'cancelled' }
end
-- The first write: INCR fails on a corrupt counter before anything else changed.
local next_seq = redis.call('INCR', seq)
local due = ARGV[7] == '1'
requeue(job, ready, sched, list, next_seq, queue, id, prio, ARGV[6], ARGV[4], due, 'running',
  v[8], kready)
local attempts = string.format('%d', tonumber(v[5]) - 1)
redis.call('HSET', job, 'att', attempts, attempt_field(v[2]), attempt)
drop_lease(leases, running, queue, id, kleases, v[8])
if v[10] then
  record_change(g.events, id, queue, 'running', 'queued', v[5], attempts, now)
end
if due then
  redis.call('PUBLISH', ARGV[5], queue)
end
return { 'ok', 'queued' }
