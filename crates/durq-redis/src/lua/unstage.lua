-- unstage.lua: removes the staged payloads of an enqueue batch that was not written
-- (see enqueue.rs): deletes each given hash that is still no job (no `state` field), so a
-- batch whose commit did run (its reply lost) keeps every job.
--
-- KEYS[i] the hash of job i of the batch.  ARGV: none.
-- Returns the number of hashes deleted.

local deleted = 0
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], 'state') == 0 then
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
