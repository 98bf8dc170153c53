-- purge.lua: deletes terminal jobs whose retention has passed, with every index entry
-- (CONTRACT A5).
--
-- KEYS[1] finished index (zset)   KEYS[2] list index (zset)
-- KEYS[3] children index (zset)   KEYS[4] placement index (hash)
-- KEYS[5] sequence counter (string) KEYS[6] running counters (hash)
-- KEYS[6+i] the hash of the job of finished entry i (ARGV[1+i])
-- ARGV[1] cutoff (ms): entries finished at or before it are due
-- ARGV[1+i] finished index member i ("queue state id parent"), read by Rust with
--           ZRANGEBYSCORE finished -inf cutoff LIMIT 0 limit
--
-- Returns {deleted, keys}: the number of jobs deleted, and for each deleted job that was
-- unique while active (CONTRACT E10) its dedup key and id, flat ({key, id, key, id, …}).
-- Such a key has no TTL; Rust deletes it with `unkey.lua` when it still names the job
-- (this script may only touch the keys it was given).
--
-- Each entry is checked again: it must still be in the finished index at or before the
-- cutoff, so a job retried meanwhile (which leaves that index) is kept. The entry names
-- the queue, state, id and parent, so the list, children and placement entries are
-- removed even when the hash already expired by its server TTL.
--
-- A namespace left with no job at all (its list index empty) also loses its sequence
-- counter and running counters, which only order and count jobs: an emptied namespace
-- leaves no key of its jobs behind. An enqueue after it starts them again from nothing,
-- which orders its jobs as well, since there is no older job to order them against.
--
-- Atomicity: the record and all its entries go in one step. Check before write: the only
-- values read are the entries' scores and the members themselves, which cannot make a
-- command fail; a member that does not parse is only removed from the finished index.

local done, list, children, placements = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local seq, running = KEYS[5], KEYS[6]
local FIRST_JOB = 6
local cutoff = tonumber(ARGV[1])
local deleted = 0
local keys = {}
-- Every purged id leaves the placement index, whether or not it declared a placement:
-- one HDEL of a missing field costs less than reading the hash to find out, and a hash
-- already gone could not tell.
local placed = {}
for i = 1, #KEYS - FIRST_JOB do
  local member = ARGV[1 + i]
  local score = redis.call('ZSCORE', done, member)
  if score and tonumber(score) <= cutoff then
    -- member = queue .. ' ' .. code .. ' ' .. id .. ' ' .. parent (parent may be empty)
    local queue, code, id, parent = string.match(member, '^(%S+) (%a) (%S+) (%S*)$')
    if queue then
      local dkey = redis.call('HGET', KEYS[FIRST_JOB + i], 'dkey')
      if dkey then
        keys[#keys + 1] = dkey
        keys[#keys + 1] = id
      end
      redis.call('DEL', KEYS[FIRST_JOB + i])
      placed[#placed + 1] = id
      redis.call('ZREM', list, queue .. ' ' .. code .. ' ' .. id)
      if parent ~= '' then
        redis.call('ZREM', children, child_member(parent, id))
      end
    end
    redis.call('ZREM', done, member)
    deleted = deleted + 1
  end
end
hdel_fields(placements, placed)
if deleted > 0 and redis.call('ZCARD', list) == 0 then
  redis.call('DEL', seq, running)
end
return { deleted, keys }
