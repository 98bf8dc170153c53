-- steps.lua: reads a job's generation and its durable steps in one step (CONTRACT D2),
-- so a reopen (reopen.lua) between the two reads cannot pair one generation with
-- another's steps.
--
-- KEYS[1] the job's hash       KEYS[2] the job's steps (hash; see save_step.lua)
-- ARGV: none
--
-- Returns {'notfound'} (no job: no hash, or a staged payload without a state) |
-- {'ok', generation ('0' when the job has no `gen` field: never reopened), the steps
-- hash as HGETALL answers it (field, value, field, value, ...)}. Rust decodes the
-- steps and puts them in save order.

local state_gen = redis.call('HMGET', KEYS[1], 'state', 'gen')
if not state_gen[1] then
  return { 'notfound' }
end
return { 'ok', state_gen[2] or '0', redis.call('HGETALL', KEYS[2]) }
