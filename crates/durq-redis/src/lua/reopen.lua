-- reopen.lua: reopens an ended job from one of its steps (CONTRACT D3, D4): the step
-- and every step saved after it are deleted, the generation moves up by one, and the
-- job is queued as retry.lua queues it (A2).
--
-- KEYS[1] the job's hash       KEYS[2] ready index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished index of layout 1 (zset)
-- KEYS[5] sequence counter (string)
-- KEYS[6] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[7] event stream (CONTRACT V1: `retried`, for a job that records its events)
-- KEYS[8] the job's steps (hash; see save_step.lua)
-- ARGV[1] job id               ARGV[2] now (ms)
-- ARGV[3] now as 16 hex digits ARGV[4] wake-up channel
-- ARGV[5] the step to reopen from
-- ARGV[6] the generation the caller read (decimal)
--
-- Returns, checked in this order, {'notfound'} | {'state', current state} (not
-- succeeded, dead or cancelled) | {'stale', current generation} | {'unsaved'} (no such
-- step in the generation) | {'corrupt', reason} | {'ok'}.
--
-- The generation is the job's `gen` field (absent: 0), moved only here, by HINCRBY.
-- It is the compare-and-set of D4: of concurrent reopens that read one generation,
-- the first to run moves it and queues the job, and every later one finds the job
-- queued or running (`state`), or, once it ended again, another generation (`stale`).
--
-- Atomicity and check before write: every value is read and checked first (the
-- generation, the step's place and the places of every step, the lease of a succeeded
-- job's last attempt, `meta` in requeue_ended.lua, whose first write is the INCR of the
-- sequence counter); the attempt record, the steps and the generation are written last,
-- after the moves that could fail, so any answer but `ok` wrote nothing.

local job, steps = KEYS[1], KEYS[8]
local step, generation = ARGV[5], ARGV[6]
local v = redis.call('HMGET', job, 'state', 'meta', 'ckey', 'gen', 'token', 'worker', 'started',
  'finished', 'ev')
if not v[1] then
  return { 'notfound' }
end
local state = v[1]
if state ~= 'succeeded' and state ~= 'dead' and state ~= 'cancelled' then
  return { 'state', state }
end
-- A generation as HINCRBY writes it: 0, or digits without a leading zero, so the
-- comparison of texts is the comparison of numbers. At most 18 digits, so the
-- HINCRBY below cannot overflow after the script's first write.
local gen = v[4] or '0'
if gen ~= '0' and not (#gen <= 18 and string.find(gen, '^[1-9]%d*$')) then
  return { 'corrupt', 'field gen not a generation' }
end
if gen ~= generation then
  return { 'stale', gen }
end
local at = redis.call('HGET', steps, 't:' .. step)
if not at then
  return { 'unsaved' }
end
local cut = string.match(at, '^(%d+) ')
if not cut then
  return { 'corrupt', 'step ' .. step .. ' unreadable' }
end
cut = tonumber(cut)
-- The steps saved at or after it, by their places: the `t:` fields only, so no output
-- is read (a job holds at most MAX_STEPS steps, so this is bounded).
local timed = {}
for _, field in ipairs(redis.call('HKEYS', steps)) do
  if string.sub(field, 1, 2) == 't:' then
    timed[#timed + 1] = field
  end
end
local cut_fields = {}
for i = 1, #timed, CHUNK do
  local last = math.min(i + CHUNK - 1, #timed)
  local places = redis.call('HMGET', steps, unpack(timed, i, last))
  for j = 1, last - i + 1 do
    local field = timed[i + j - 1]
    local place = places[j] and string.match(places[j], '^(%d+) ')
    if not place then
      return { 'corrupt', 'step ' .. string.sub(field, 3) .. ' unreadable' }
    end
    if tonumber(place) >= cut then
      cut_fields[#cut_fields + 1] = field
      cut_fields[#cut_fields + 1] = 'o:' .. string.sub(field, 3)
    end
  end
end
-- D3 keeps the attempt history, the attempt that succeeded included. A succeeded job's
-- last attempt is no record but its lease fields (`token`, `worker`, `started`) and
-- `finished` (see "Attempts" in lib.lua), which the return to queued clears: it becomes
-- a record in its slot, as durq_core::attempts::history read it from those fields. A
-- record without one of them (a job finished before the store kept them) showed no
-- succeeded attempt, and none is made up.
local succeeded = nil
local token, worker, started, finished = v[5], v[6], v[7], v[8]
if state == 'succeeded' and token and token ~= '0' and worker and started and finished then
  if not string.find(token, '^%d+$') or not is_int(started) or not is_int(finished) then
    return { 'corrupt', 'the lease of the attempt that succeeded unreadable' }
  end
  succeeded = { attempt_field(token), attempt_record(token, started, finished, 's', worker, nil) }
end
local refused = requeue_ended(job, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], state, v[2], v[3], v[9])
if refused then
  return refused
end
if succeeded then
  redis.call('HSET', job, succeeded[1], succeeded[2])
end
-- The counter `n` stays: places keep growing across generations, so they never repeat.
hdel_fields(steps, cut_fields)
redis.call('HINCRBY', job, 'gen', 1)
return { 'ok' }
