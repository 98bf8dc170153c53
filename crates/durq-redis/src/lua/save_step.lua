-- save_step.lua: saves one durable step of a running job, fenced by its lease token
-- (CONTRACT D1).
--
-- KEYS[1] the job's hash       KEYS[2] the job's steps (hash, in the job's slot)
-- ARGV[1] lease token          ARGV[2] step name ([A-Za-z0-9._:-]{1,128}, checked by the
--                              handle)
-- ARGV[3] now (ms)             ARGV[4] the output bytes
-- ARGV[5] the most steps a job saves in one generation (durq_core::steps::MAX_STEPS)
--
-- Returns {'ok'} (saved now, or saved before under this name and kept) | {'notfound'} |
-- {'lost'} (the job is not running, or `token` is not its lease's) | {'full'} (a new
-- step past the bound)
--
-- The steps hash: `t:NAME` -> `SEQ SAVED_AT` (decimal; SEQ the save's place in the
-- order), `o:NAME` -> the output as given, and `n` -> the last SEQ handed out. So one
-- step is two fields, and the steps saved are (HLEN - 1) / 2. The hash holds the steps
-- of the job's current generation only: a reopen (reopen.lua) deletes the ones it cuts
-- and moves the generation, the job's `gen` field.
--
-- Atomicity: the lease check and the write are one step, so a run whose lease was lost
-- (reclaimed, released, ended, the job reopened and claimed again with a larger token)
-- saves nothing, as complete.lua answers such a run. Check before write: the only value
-- used is the counter `n`, checked before the first write (HINCRBY fails on anything but
-- an integer).

local job, steps = KEYS[1], KEYS[2]
local token, name = ARGV[1], ARGV[2]
local v = redis.call('HMGET', job, 'state', 'token')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= token then
  return { 'lost' }
end
local time_field = 't:' .. name
-- The first save of a name in a generation stands (D1): a run that saved it and was cut
-- short before it went on saves it again, and the output already read stays the truth.
if redis.call('HEXISTS', steps, time_field) == 1 then
  return { 'ok' }
end
local n = redis.call('HGET', steps, 'n')
if n and not is_int(n) then
  abort_corrupt('steps: field n not a number')
end
local fields = redis.call('HLEN', steps)
if n then
  fields = fields - 1
end
if math.floor(fields / 2) >= tonumber(ARGV[5]) then
  return { 'full' }
end
local seq = redis.call('HINCRBY', steps, 'n', 1)
redis.call('HSET', steps, time_field, string.format('%d', seq) .. ' ' .. ARGV[3],
  'o:' .. name, ARGV[4])
return { 'ok' }
