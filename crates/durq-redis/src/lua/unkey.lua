-- unkey.lua: deletes the dedup keys of purged jobs that were unique while active
-- (CONTRACT E10), each only if it still names the purged job: a key taken over by a
-- newer job stays.
--
-- KEYS[i] a dedup key          ARGV[i] the id of the purged job it named
--
-- Returns the number of keys deleted.

local deleted = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  end
end
return deleted
