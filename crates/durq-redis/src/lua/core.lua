-- core.lua: the helpers prepended to every script of this crate but enqueue.lua (see
-- scripts.rs); lib.lua adds the rest for the scripts off the hot path. Each definition
-- here is a closure the server creates on every call of every script that includes it
-- (a few hundred instructions each), so only what claim.lua and complete.lua use lives
-- here.
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing; it only defines
-- local functions and tables that the script after it uses.
--
-- Numbers: every timestamp arrives from Rust as an integer string and is stored exactly
-- as given. Lua only compares them (tonumber; exact below 2^53) and formats small
-- integers (priority, sequence, counters) with string.format, never with tostring,
-- which may print 1.7e+12. Only claim_fit.lua uses cjson, to read placements and budgets,
-- whose amounts are at most 2^53 - 1 (CONTRACT F1), so a double holds them exactly; it
-- compares them and writes none back.
--
-- Strings: Lua's `<` on strings follows the server's locale (strcoll), so order keys
-- are compared by their numeric 12-digit chunks instead (order_less).

-- The one-letter state codes used inside list index members. Queued and running share
-- 'a' (active), so a claim does not touch the list index; the lease index and the
-- per-queue running counter tell the two apart. Waiting jobs (CONTRACT G1) are 'w'.
local STATE_CODE = { waiting = 'w', queued = 'a', running = 'a', succeeded = 's', dead = 'd',
  cancelled = 'c' }

-- The queue and parent (nil if none) of a `meta` field, or nil when it is missing or
-- malformed: the same check as meta_head with two captures instead of five, for the hot
-- scripts that need no more (each capture is a new Lua string).
local function meta_queue_parent(meta)
  if not meta then
    return nil
  end
  local queue, parent = string.match(meta, '^(%S+) (%S+) %S+ %S+ %S+ ')
  if parent == '-' then
    parent = nil
  end
  return queue, parent
end

-- Whether a `meta` field is readable (meta_head would parse it), without building strings.
local function meta_ok(meta)
  return meta ~= nil and string.find(meta, '^%S+ %S+ %S+ %S+ %S+ ') ~= nil
end

-- Scores of lexical indexes are passed as the string '0', never the number: a Lua number
-- argument is formatted with sprintf on every call.

-- Most members one ZADD/ZREM call takes: Lua's unpack is limited to a few thousand values.
local CHUNK = 1000

-- Entry of the finished log (a list, oldest first): `FINISHED QUEUE C ID PARENT`
-- (`PARENT` empty when none), everything purge needs to delete a job and its index
-- entries, even when its hash is already gone. A finished job costs one push onto the
-- log's tail, where layout 1 inserted into a sorted set of every retained job, a third
-- of the server time (docs/redis.md, "Layout versions").
local function finished_entry(now, queue, state, id, parent)
  return now .. ' ' .. queue .. ' ' .. STATE_CODE[state] .. ' ' .. id .. ' ' .. (parent or '')
end

-- ZADD of score/member pairs (flat list), CHUNK pairs per call.
local function zadd_pairs(key, flat)
  local n = #flat
  local i = 1
  while i <= n do
    local last = math.min(i + 2 * CHUNK - 1, n)
    redis.call('ZADD', key, unpack(flat, i, last))
    i = last + 1
  end
end

-- ZREM of members, CHUNK per call.
local function zrem_members(key, members)
  local n = #members
  local i = 1
  while i <= n do
    local last = math.min(i + CHUNK - 1, n)
    redis.call('ZREM', key, unpack(members, i, last))
    i = last + 1
  end
end

-- Concurrency keys (CONTRACT K1-K5). A job with a key has its hex text (keys.rs,
-- `hex_key`) in its hash's `ckey` field and in the `ckeys` hash (id -> hex key); while it
-- is in the ready index it also has exactly one member in `kready`, which every script
-- that adds to or removes from the ready index keeps in step:
-- `QUEUE PRIO HEXKEY ORDERKEY ID` (PRIO the first 4 digits of the order key), so the
-- ready member it stands for is `QUEUE ` .. its last 72 characters. Each lease of such a
-- job adds `QUEUE HEXKEY ID` to `kleases` (dropped by whoever reads it once the lease
-- index no longer holds `QUEUE ID`). Jobs without a key pay nothing but their claim's
-- read of a missing `ckey` field.

-- The kready member of ready index member `member` of `queue`, whose job has key `ckey`.
local function kready_member(queue, member, ckey)
  return queue .. ' ' .. string.sub(member, -72, -69) .. ' ' .. ckey .. ' ' .. string.sub(member, -72)
end

-- Moves at most `bound` scheduled entries that are due at `now` into the ready index,
-- and those of jobs with a concurrency key (found in `ckeys`, read only when it exists)
-- into `kready`. Returns true when no due entry is left, so the ready index is the whole
-- ready set.
local function promote(ready, sched, now, bound, ckeys, kready)
  local due = redis.call('ZRANGEBYSCORE', sched, '-inf', now, 'LIMIT', 0, bound)
  if #due == 0 then
    return true
  end
  local flat = {}
  for i, member in ipairs(due) do
    flat[2 * i - 1] = '0'
    flat[2 * i] = member
  end
  zadd_pairs(ready, flat)
  if redis.call('EXISTS', ckeys) == 1 then
    local ids, found = {}, {}
    for i, member in ipairs(due) do
      ids[i] = string.sub(member, -36)
    end
    for i = 1, #ids, CHUNK do
      local got = redis.call('HMGET', ckeys, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
      for j = 1, #got do
        found[i + j - 1] = got[j]
      end
    end
    local kflat = {}
    for i, member in ipairs(due) do
      local ckey = found[i]
      if ckey then
        kflat[#kflat + 1] = '0'
        kflat[#kflat + 1] = kready_member(string.sub(member, 1, #member - 73), member, ckey)
      end
    end
    zadd_pairs(kready, kflat)
  end
  zrem_members(sched, due)
  if #due < bound then
    return true
  end
  return #redis.call('ZRANGEBYSCORE', sched, '-inf', now, 'LIMIT', 0, 1) == 0
end

-- Whether order key `a` sorts before `b` (36 hex digits each), exactly and bytewise.
local function order_less(a, b)
  for i = 1, 36, 12 do
    local x = tonumber(string.sub(a, i, i + 11), 16)
    local y = tonumber(string.sub(b, i, i + 11), 16)
    if x ~= y then
      return x < y
    end
  end
  return false
end

-- Check before write. Redis does not roll a script back when it fails half-way, so every
-- script reads and checks every value it depends on before its first write, and stops
-- with no write when one is unreadable: a job is never left `running` without its lease
-- entry, or in one index but not the other.

-- Aborts the script as a whole with an error reply whose code Rust maps to
-- `Error::Corrupt`. Only called before a script's first write.
local function abort_corrupt(what)
  error({ err = 'JOBSCORRUPT ' .. what })
end

-- Whether `s` is a decimal integer as this crate writes them (optional minus, digits).
local function is_int(s)
  return s ~= nil and s ~= false and string.find(s, '^%-?%d+$') ~= nil
end

-- The next value of a stored counter (attempts, token), or nil when the stored text is
-- not an integer; an absent counter (nil or false) counts as 0. The values a claim meets
-- almost always are compared, not converted: `tonumber` and `string.format` each cost the
-- server about as much as a hash field read.
local function succ(s)
  if not s or s == '0' then
    return '1'
  elseif s == '1' then
    return '2'
  elseif s == '2' then
    return '3'
  elseif is_int(s) then
    return string.format('%d', tonumber(s) + 1)
  end
  return nil
end

-- The running counter of `queue` must be an integer (or absent) before a script changes
-- it with HINCRBY, which fails on anything else after the script's earlier writes.
local function check_counters(running, queues)
  if #queues == 0 then
    return
  end
  local values = redis.call('HMGET', running, unpack(queues))
  for i, value in ipairs(values) do
    if value and not is_int(value) then
      abort_corrupt('running counter of queue ' .. queues[i] .. ': not an integer')
    end
  end
end

-- The prefix of `last_error` on a job whose record could not be read where a claim or
-- reclaim met it (CONTRACT §5, corrupt records).
local CORRUPT_PREFIX = 'corrupt record: '

-- Moves a job whose record cannot be read to `dead`, so it neither blocks its queue nor
-- vanishes from the indexes: state, finished_at and last_error written (the other fields
-- are left as found), its list entry moved from `code` ('a' when nil: a queued or
-- running job; graph.lua buries waiting ones, 'w') to 'd', a finished entry appended
-- (purge then deletes it like any dead job). `queue` comes from the index entry that
-- led here; `parent` from `meta` when that is readable.
local function bury(job, list, finished, queue, id, parent, now, reason, code)
  redis.call('HSET', job, 'state', 'dead', 'finished', now, 'error', CORRUPT_PREFIX .. reason)
  redis.call('ZREM', list, queue .. ' ' .. (code or 'a') .. ' ' .. id)
  redis.call('ZADD', list, '0', queue .. ' d ' .. id)
  redis.call('RPUSH', finished, finished_entry(now, queue, 'dead', id, parent))
end

-- The event stream (CONTRACT V1-V4; docs/redis.md, "Event stream"). A job enqueued
-- through a store that records events carries `ev` = '1', written by enqueue.lua with
-- the job and never changed. Every script that changes a job's state reads `ev` in the
-- HMGET it makes anyway and, when it is set, appends the change to the namespace's
-- stream (`jobs:{NS}:events`, in the script's KEYS) with one XADD in the same script:
-- fields `j ID q QUEUE k KIND a ATTEMPTS t AT` (plus `n NAME d DATA` for `emitted`,
-- emit.lua). The ids are the server's own (`*`): scripts run one at a time, so the
-- order of the ids is the order of the changes. A job without the mark pays one
-- absent field in that read, and nothing else.

-- Records the change of job `id` of `queue` from state `was` (nil for its enqueue) to
-- `to`, its attempts going from `before` to `after` (integer strings as stored), at
-- `at` (ms, the caller's clock reading). The kind is decided here and only here, and
-- mirrors durq_core::events::EventKind::of_change kind for kind: a change that leaves
-- the state as it was, or one into `waiting` (none but an enqueue), records nothing.
-- The attempts are written as Rust reads them (a u32): a counter that cannot be read
-- (a record buried for it) is written 0, so one bad record never makes the stream
-- unreadable.
local function record_change(events, id, queue, was, to, before, after, at)
  local kind
  if not was then
    kind = 'enqueued'
  elseif was == to or to == 'waiting' then
    return
  elseif to == 'running' then
    kind = 'started'
  elseif to == 'queued' then
    if was == 'running' then
      kind = tonumber(after) < tonumber(before) and 'released' or 'failed'
    elseif was == 'waiting' then
      kind = 'ready'
    else
      kind = 'retried'
    end
  else
    -- succeeded, dead, cancelled: the kind is named as the state.
    kind = to
  end
  if not after or not string.find(after, '^%d+$') or tonumber(after) > 4294967295 then
    after = '0'
  end
  redis.call('XADD', events, '*', 'j', id, 'q', queue, 'k', kind, 'a', after, 't', at)
end
