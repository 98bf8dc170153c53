-- lib.lua: helpers prepended to every script of this crate (see scripts.rs).
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
-- per-queue running counter tell the two apart.
local STATE_CODE = { queued = 'a', running = 'a', succeeded = 's', dead = 'd', cancelled = 'c' }

-- The fields a job never changes are packed by Rust into one `meta` field, so scripts read
-- and write few values per job: "QUEUE PARENT PRIO MAX_ATTEMPTS CREATED TLEN KLEN TENANTKEY"
-- (PARENT and KLEN are '-' when absent; tenant and key come last, by length, so they may
-- hold any byte). Returns queue, parent (nil if none), priority, max attempts, created_at
-- as strings, or nil when the field is missing or malformed.
local function meta_head(meta)
  if not meta then
    return nil
  end
  local queue, parent, prio, max_att, created = string.match(meta, '^(%S+) (%S+) (%S+) (%S+) (%S+) ')
  if parent == '-' then
    parent = nil
  end
  return queue, parent, prio, max_att, created
end

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

-- The claim-order key of CONTRACT C3, byte for byte jobs_core::ReadyOrder::sort_key():
-- 4 hex digits of inverted priority, 16 of the ready time (formatted by Rust and passed
-- in, because i64 times do not all fit a double), 16 of the sequence number.
local function order_key(prio, ready_hex, seq)
  return string.format('%04x', 32767 - tonumber(prio)) .. ready_hex .. string.format('%016x', seq)
end

-- Member of the ready and scheduled indexes: queue, space, order key, id.
local function queue_member(queue, order, id)
  return queue .. ' ' .. order .. id
end

-- Member of the list index: queue, space, state code, space, id.
local function list_member(queue, state, id)
  return queue .. ' ' .. STATE_CODE[state] .. ' ' .. id
end

-- Member of the lease index: queue, space, id.
local function lease_member(queue, id)
  return queue .. ' ' .. id
end

-- Member of the finished index: everything purge needs to remove a job's index entries
-- even when its hash is already gone (server TTL).
local function done_member(queue, state, id, parent)
  return queue .. ' ' .. STATE_CODE[state] .. ' ' .. id .. ' ' .. (parent or '')
end

-- Member of the children index: parent id, space, child id.
local function child_member(parent, id)
  return parent .. ' ' .. id
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

-- HSET of field/value pairs (flat list), CHUNK pairs per call.
local function hset_pairs(key, flat)
  local n = #flat
  local i = 1
  while i <= n do
    local last = math.min(i + 2 * CHUNK - 1, n)
    redis.call('HSET', key, unpack(flat, i, last))
    i = last + 1
  end
end

-- HDEL of fields, CHUNK per call.
local function hdel_fields(key, fields)
  local n = #fields
  local i = 1
  while i <= n do
    local last = math.min(i + CHUNK - 1, n)
    redis.call('HDEL', key, unpack(fields, i, last))
    i = last + 1
  end
end

-- Moves a job's list entry from one state to another (nothing to do between queued
-- and running, which share a code).
local function move_list(list, queue, id, from, to)
  if STATE_CODE[from] == STATE_CODE[to] then
    return
  end
  redis.call('ZREM', list, list_member(queue, from, id))
  redis.call('ZADD', list, '0', list_member(queue, to, id))
end

-- Moves at most `bound` scheduled entries that are due at `now` into the ready index.
-- Returns true when no due entry is left, so the ready index is the whole ready set.
local function promote(ready, sched, now, bound)
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
  zrem_members(sched, due)
  if #due < bound then
    return true
  end
  return #redis.call('ZRANGEBYSCORE', sched, '-inf', now, 'LIMIT', 0, 1) == 0
end

-- The counts of one queue's jobs per state (CONTRACT A3), from index sizes: ready (the
-- queue's range of the ready index), active (queued and running, list code 'a'),
-- running (the queue's running counter), succeeded, dead, cancelled (list codes 's', 'd',
-- 'c'), in that order. O(log n) per count (ZLEXCOUNT), whatever the backlog. A running
-- counter that is not a number gives nil, which ends the reply array there (Rust then
-- reports the short reply as corrupt). Used by stats.lua and queues.lua.
local function queue_counts(ready, list, running, queue)
  local function count_state(code)
    local prefix = queue .. ' ' .. code
    return redis.call('ZLEXCOUNT', list, '[' .. prefix .. ' ', '(' .. prefix .. '!')
  end
  return {
    redis.call('ZLEXCOUNT', ready, '[' .. queue .. ' ', '(' .. queue .. '!'),
    count_state('a'), tonumber(redis.call('HGET', running, queue) or '0'),
    count_state('s'), count_state('d'), count_state('c') }
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

-- Removes a job's lease entry, keeping the per-queue running counter equal to the number
-- of lease entries of the queue.
local function drop_lease(leases, running, queue, id)
  if redis.call('ZREM', leases, lease_member(queue, id)) == 1 then
    redis.call('HINCRBY', running, queue, -1)
  end
end

-- A terminal transition: state, finished_at, indexes moved. The record carries no server
-- TTL: purge deletes it once retention has passed (a PEXPIRE per job cost about a tenth
-- of a completion's server time). `worker` and `lease_exp` stay as a record of the last
-- lease; they are a lease only while running.
local function finish(job, list, done, queue, id, parent, from, to, now)
  redis.call('HSET', job, 'state', to, 'finished', now)
  move_list(list, queue, id, from, to)
  redis.call('ZADD', done, now, done_member(queue, to, id, parent))
end

-- A return to `queued`: a fresh sequence number `seq` (drawn by the caller with INCR as
-- its first write, so a corrupt counter fails the script before anything changed; the job
-- goes behind the jobs already ready), run_at and order key stored, indexes moved. `due`
-- says whether run_at has come (decided by Rust from the same clock reading).
local function requeue(job, ready, sched, list, seq, queue, id, prio, run_at, ready_hex, due, from)
  local order = order_key(prio, ready_hex, seq)
  redis.call('HSET', job, 'state', 'queued', 'run_at', run_at, 'order', order)
  local member = queue_member(queue, order, id)
  if due then
    redis.call('ZADD', ready, '0', member)
  else
    redis.call('ZADD', sched, run_at, member)
  end
  move_list(list, queue, id, from, 'queued')
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
-- are left as found), its list entry moved to code 'd', a finished entry added (purge then
-- deletes it like any dead job). `queue` comes from the index entry that led here;
-- `parent` from `meta` when that is readable.
local function bury(job, list, done, queue, id, parent, now, reason)
  redis.call('HSET', job, 'state', 'dead', 'finished', now, 'error', CORRUPT_PREFIX .. reason)
  redis.call('ZREM', list, queue .. ' a ' .. id)
  redis.call('ZADD', list, '0', queue .. ' d ' .. id)
  redis.call('ZADD', done, now, done_member(queue, 'dead', id, parent))
end

-- What one claim call (claim.lua, claim_fit.lua) decided in its first pass, for
-- write_claim: `lease` ({job key, reply values, queue, id, attempts, token}), `bury`
-- ({job key, queue, id, parent, reason}), `taken` (ready members to remove) and
-- `list_old` (list members of vanished jobs).
local function claim_decisions()
  return { lease = {}, bury = {}, taken = {}, list_old = {} }
end

-- The fields of a job's record a claim reads, in the order of its reply row (claim.lua's
-- header; v[1], the state, is overwritten there by the id), the placement last.
local function read_for_claim(job)
  return redis.call('HMGET', job, 'state', 'meta', 'run_at', 'att', 'token', 'error',
    'cancel', 'payload', 'timeout', 'placement')
end

-- Decides that the claim takes the job of ready entry `member` off the ready index and
-- buries it, for `reason`; `meta` is its record's meta field (for its parent).
local function decide_bury(d, job, meta, member, queue, id, reason)
  d.taken[#d.taken + 1] = member
  local _, parent = meta_queue_parent(meta)
  d.bury[#d.bury + 1] = { job, queue, id, parent, reason }
end

-- Decides what the claim does with the job of ready entry `member`, whose record `v`
-- (read_for_claim) it read: a queued job is leased, or buried when its record cannot be
-- read (absent counters read as 0, present ones must be integers); a job whose hash
-- vanished under its entries (C7) has them dropped and nothing written; one in an
-- unknown state is buried; any other state means the entry is stale, and it is only
-- dropped. Returns 'leased', 'buried', 'vanished' or 'stale'.
local function decide_claim(d, job, v, member, queue, id)
  local state = v[1]
  local reason = nil
  if state == 'queued' then
    if not meta_ok(v[2]) then
      reason = 'field meta unreadable'
    elseif v[4] and not is_int(v[4]) then
      reason = 'field att not a number'
    elseif v[5] and not is_int(v[5]) then
      reason = 'field token not a number'
    else
      d.taken[#d.taken + 1] = member
      d.lease[#d.lease + 1] = { job, v, queue, id, tonumber(v[4] or '0'), tonumber(v[5] or '0') }
      return 'leased'
    end
  elseif state and not STATE_CODE[state] then
    reason = 'unknown state'
  end
  if reason then
    decide_bury(d, job, v[2], member, queue, id, reason)
    return 'buried'
  end
  d.taken[#d.taken + 1] = member
  if not state then
    d.list_old[#d.list_old + 1] = list_member(queue, 'queued', id)
    return 'vanished'
  end
  return 'stale'
end

-- The writes of a claim, once every value they depend on was read and checked
-- (claim_decisions): each job to lease becomes running under this lease, leaving `ready`
-- and entering `leases` and its queue's running counter in this step; each job to bury
-- goes to dead; the taken ready members and the list members of vanished jobs are
-- removed. Returns the reply rows of the leased jobs and the buried ids.
local function write_claim(ready, leases, list, running, done, d, worker, expires, now)
  local claimed, corrupt, lease_pairs = {}, {}, {}
  for _, l in ipairs(d.lease) do
    local job, v, queue, id = l[1], l[2], l[3], l[4]
    -- Counters are small integers: incremented and formatted exactly, in one write.
    local attempts = string.format('%d', l[5] + 1)
    local token = string.format('%d', l[6] + 1)
    redis.call('HSET', job, 'state', 'running', 'att', attempts, 'token', token,
      'worker', worker, 'lease_exp', expires, 'started', now, 'hb', now)
    v[1] = id
    v[4] = attempts
    v[5] = token
    claimed[#claimed + 1] = v
    local pairs_of_queue = lease_pairs[queue]
    if not pairs_of_queue then
      pairs_of_queue = {}
      lease_pairs[queue] = pairs_of_queue
    end
    pairs_of_queue[#pairs_of_queue + 1] = expires
    pairs_of_queue[#pairs_of_queue + 1] = lease_member(queue, id)
    -- The list entry stays: queued and running share the code 'a'.
  end
  for _, b in ipairs(d.bury) do
    bury(b[1], list, done, b[2], b[3], b[4], now, b[5])
    corrupt[#corrupt + 1] = b[3]
  end
  zrem_members(ready, d.taken)
  for queue, flat in pairs(lease_pairs) do
    zadd_pairs(leases, flat)
    redis.call('HINCRBY', running, queue, string.format('%d', #flat / 2))
  end
  zrem_members(list, d.list_old)
  return claimed, corrupt
end

-- Attempts (CONTRACT H1-H4). Only an attempt that ends other than by success is written
-- (fail.lua, release.lua, reclaim.lua, in the same call that ends its lease): the running
-- attempt is the job's lease, and the succeeded one its last lease (`worker`, `token`,
-- `started`, which complete.lua leaves in place) and `finished`. Each record goes into the
-- job's own hash, field 'a' .. (token mod ATTEMPTS_KEPT) (jobs_core::attempts::slot), so it
-- is deleted with the job, a newer attempt overwrites the one 32 claims older, and no
-- key or trim pass is added.
local ATTEMPTS_KEPT = 32

-- The hash field of the attempt of `token` (an integer string, checked by the caller).
local function attempt_field(token)
  return 'a' .. string.format('%d', tonumber(token) % ATTEMPTS_KEPT)
end

-- An ended attempt, read by codec::decode_attempt:
-- "TOKEN STARTED ENDED OUTCOME WORKER_LEN WORKERERROR", outcome 'f' (failed), 'r'
-- (released: no error) or 'e' (expired); the worker is cut by its byte length, so it may
-- hold spaces, and the error is the rest. Every part is a string as stored or given.
local function attempt_record(token, started, ended, outcome, worker, err)
  return token .. ' ' .. started .. ' ' .. ended .. ' ' .. outcome .. ' '
    .. string.format('%d', #worker) .. ' ' .. worker .. (err or '')
end

-- Why the lease of a running job cannot become an attempt record (its worker or start
-- unreadable), or nil when it can. Checked before a script's first write.
local function lease_unreadable(worker, started)
  if not worker then
    return 'field worker missing'
  end
  if not is_int(started) then
    return 'field started not a number'
  end
  return nil
end
