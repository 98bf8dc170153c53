-- await.lua: marks a job that has not ended as awaited and reads it (CONTRACT O1, O2).
--
-- KEYS[1] the job's hash
-- ARGV    the fields to read, as reads.rs's JOB_FIELDS
--
-- Returns the fields' values, in order (all nil when the job does not exist).
--
-- The mark (`awt`) makes the script that ends the job announce it on the wake channel
-- (lib.lua's announce_ending). Marking and reading in one script orders them against
-- every ending: an ending before the call is read here; one after it sees the mark.
-- HSETNX: a job already marked is not written again.

local state = redis.call('HGET', KEYS[1], 'state')
if state == 'waiting' or state == 'queued' or state == 'running' then
  redis.call('HSETNX', KEYS[1], 'awt', '1')
end
return redis.call('HMGET', KEYS[1], unpack(ARGV))
