-- purge.lua: deletes terminal jobs whose retention has passed, with every index entry
-- (CONTRACT A5), reading one of the two places finished jobs are recorded.
--
-- KEYS[1] finished log (list, oldest first)
-- KEYS[2] finished index of layout 1 (zset, score finished_at)
-- KEYS[3] list index (zset)       KEYS[4] children index (zset)
-- KEYS[5] placement index (hash)  KEYS[6] sequence counter (string)
-- KEYS[7] running counters (hash)
-- KEYS[8] concurrency keys (hash: id -> hex key)
-- KEYS[9] kready (zset)           KEYS[10] kleases (zset) (see core.lua)
-- KEYS[10+2i-1] the hash of the job of entry i (ARGV[2+i])
-- KEYS[10+2i]   that job's steps (hash; see save_step.lua)
-- ARGV[1] cutoff (ms): entries finished at or before it are due
-- ARGV[2] where the entries come from: 'log' (the head of the finished log, read by Rust
--         with LRANGE and cut where the first entry not due is: the log is in finish
--         order, so the script only checks they are still its head) or 'v1' (members of
--         layout 1's finished index, read with ZRANGEBYSCORE -inf cutoff)
-- ARGV[2+i] entry i: 'FINISHED QUEUE C ID PARENT' from the log,
--           'QUEUE C ID PARENT' from the index (PARENT empty when none)
--
-- Returns {deleted, consumed, keys}: the number of jobs deleted; how many of the given
-- entries left their log or index (the rest were not due, or another purge took them
-- first); and for each deleted job that was unique while active (CONTRACT E10) its
-- dedup key and id, flat ({key, id, key, id, …}). Such a key has no TTL; Rust deletes it
-- with `unkey.lua` when it still names the job (this script may only touch the keys it
-- was given).
--
-- The finished log is appended to whenever a job enters a terminal state, and never
-- edited in the middle, so an entry can outlive what it says: the job was retried
-- (it is alive again) or finished again later (a newer entry names it). An entry
-- deletes its job only while the record is terminal with exactly the entry's finished
-- time; otherwise it is dropped and the job kept. Layout 1's index was kept exact by
-- `retry` (it removes the entry), so its entries are checked only against the index
-- itself: still there, at or before the cutoff.
--
-- Both kinds of entry name the queue, state, id and parent, so the list, children,
-- placement and concurrency key (`ckeys`) entries go, and the job's steps with them
-- (CONTRACT D1-D4: a job's steps live and go with its record), even when the hash is
-- already gone (deleted by hand, or expired by the TTL an earlier version set). A
-- terminal job has no ready or lease entry, so it has none in `kready`; its `kleases`
-- entries are dropped by the limited claim that reads them. A job is counted once: by
-- the entry that deleted its record or, when that was already gone, by the one that
-- removed its list entry.
--
-- A namespace left with no job at all (its list index empty) also loses its sequence
-- counter, running counters, finished log and concurrency key indexes (`ckeys`,
-- `kready`, `kleases`), which only order, count, remember or index jobs: an emptied namespace leaves no key of its jobs behind. An enqueue after it
-- starts them again from nothing, which orders its jobs as well, since there is no
-- older job to order them against.
--
-- Atomicity: the record and all its entries go in one step; the log's head is compared
-- with the given entries first, so of two purges given the same head one consumes it.
-- Check before write: what is read are the entries, the records' state, finished time
-- and dedup key, none of which can make a command fail; an entry that does not parse is
-- only dropped.

local finished, done_v1, list, children, placements = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seq, running = KEYS[6], KEYS[7]
local ckeys, kready, kleases = KEYS[8], KEYS[9], KEYS[10]
local FIRST_JOB = 10
local cutoff = tonumber(ARGV[1])
local from_log = ARGV[2] == 'log'
local n = math.floor((#KEYS - FIRST_JOB) / 2)
local deleted, consumed = 0, 0
local keys = {}
-- Every purged id leaves the placement index, whether or not it declared a placement:
-- one HDEL of a missing field costs less than reading the hash to find out, and a hash
-- already gone could not tell. Likewise `ckeys`, while it exists.
local placed = {}

-- Deletes the record (when `record` holds its state), the steps (`steps`, its key) and
-- the entries of job `id`. `code` is the list code the job is indexed under.
local function delete(job, steps, record, queue, code, id, parent)
  local counted
  redis.call('DEL', steps)
  if record then
    if record[3] then
      keys[#keys + 1] = record[3]
      keys[#keys + 1] = id
    end
    redis.call('DEL', job)
    redis.call('ZREM', list, queue .. ' ' .. code .. ' ' .. id)
    counted = true
  else
    counted = redis.call('ZREM', list, queue .. ' ' .. code .. ' ' .. id) == 1
  end
  placed[#placed + 1] = id
  if parent ~= '' then
    redis.call('ZREM', children, child_member(parent, id))
  end
  if counted then
    deleted = deleted + 1
  end
end

if from_log then
  -- Only the entries still at the head, in order.
  local head = redis.call('LRANGE', finished, 0, n - 1)
  for i = 1, n do
    local entry = ARGV[2 + i]
    if head[i] ~= entry then
      break
    end
    local at, queue, code, id, parent = string.match(entry, '^(%d+) (%S+) (%a) (%S+) (%S*)$')
    consumed = i
    if at then
      local job, steps = KEYS[FIRST_JOB + 2 * i - 1], KEYS[FIRST_JOB + 2 * i]
      local record = redis.call('HMGET', job, 'state', 'finished', 'dkey')
      local state = record[1]
      if not state then
        delete(job, steps, nil, queue, code, id, parent)
      elseif state ~= 'queued' and state ~= 'running' and
          (record[2] == at or not is_int(record[2])) then
        -- Terminal, and this entry is its last finish (a record whose finished time is
        -- unreadable is taken at its word: its entry is the only one there is). Indexed
        -- under its state now, which a same-millisecond retry may have changed.
        delete(job, steps, record, queue, STATE_CODE[state] or code, id, parent)
      end
    end
  end
  if consumed > 0 then
    redis.call('LTRIM', finished, consumed, -1)
  end
else
  for i = 1, n do
    local member = ARGV[2 + i]
    local score = redis.call('ZSCORE', done_v1, member)
    if score and tonumber(score) <= cutoff then
      local queue, code, id, parent = string.match(member, '^(%S+) (%a) (%S+) (%S*)$')
      if queue then
        local job, steps = KEYS[FIRST_JOB + 2 * i - 1], KEYS[FIRST_JOB + 2 * i]
        local record = redis.call('HMGET', job, 'state', 'finished', 'dkey')
        delete(job, steps, record[1] and record or nil, queue, code, id, parent)
      end
      redis.call('ZREM', done_v1, member)
      consumed = consumed + 1
    end
  end
end
hdel_fields(placements, placed)
if #placed > 0 and redis.call('EXISTS', ckeys) == 1 then
  hdel_fields(ckeys, placed)
end
if consumed > 0 and redis.call('ZCARD', list) == 0 then
  redis.call('DEL', seq, running, finished, ckeys, kready, kleases)
end
return { deleted, consumed, keys }
