-- lib.lua: the helpers of the scripts off the hot path, prepended after core.lua (see
-- scripts.rs), whose definitions they use.
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing; it only defines
-- local functions and tables that the script after it uses.

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

-- The claim-order key of CONTRACT C3, byte for byte durq_core::ReadyOrder::sort_key():
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

-- Member of the children index: parent id, space, child id.
local function child_member(parent, id)
  return parent .. ' ' .. id
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

-- The counts of one queue's jobs per state (CONTRACT A3), from index sizes: ready (the
-- queue's range of the ready index), active (queued and running, list code 'a'),
-- running (the queue's running counter), succeeded, dead, cancelled, waiting (list codes
-- 's', 'd', 'c', 'w'), in that order. O(log n) per count (ZLEXCOUNT), whatever the backlog. A running
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
    count_state('s'), count_state('d'), count_state('c'), count_state('w') }
end

-- Removes a job's lease entry, keeping the per-queue running counter equal to the number
-- of lease entries of the queue, and its kleases entry when it has a concurrency key
-- (`ckey`, its record's field; false or nil for none).
local function drop_lease(leases, running, queue, id, kleases, ckey)
  if redis.call('ZREM', leases, lease_member(queue, id)) == 1 then
    redis.call('HINCRBY', running, queue, -1)
  end
  if ckey then
    redis.call('ZREM', kleases, queue .. ' ' .. ckey .. ' ' .. id)
  end
end

-- A terminal transition: state, finished_at, indexes moved. The record carries no server
-- TTL: purge deletes it once retention has passed (a PEXPIRE per job cost about a tenth
-- of a completion's server time). `worker` and `lease_exp` stay as a record of the last
-- lease; they are a lease only while running.
local function finish(job, list, finished, queue, id, parent, from, to, now)
  redis.call('HSET', job, 'state', to, 'finished', now)
  move_list(list, queue, id, from, to)
  redis.call('RPUSH', finished, finished_entry(now, queue, to, id, parent))
end

-- A return to `queued`: a fresh sequence number `seq` (drawn by the caller with INCR as
-- its first write, so a corrupt counter fails the script before anything changed; the job
-- goes behind the jobs already ready), run_at and order key stored, indexes moved. `due`
-- says whether run_at has come (decided by Rust from the same clock reading). `ckey` is
-- the job's `ckey` field as the caller read it (false or nil when it has no concurrency
-- key): a job with one made ready now also enters `kready` (core.lua), which the caller
-- then passes.
local function requeue(job, ready, sched, list, seq, queue, id, prio, run_at, ready_hex, due, from,
    ckey, kready)
  local order = order_key(prio, ready_hex, seq)
  redis.call('HSET', job, 'state', 'queued', 'run_at', run_at, 'order', order)
  local member = queue_member(queue, order, id)
  if due then
    redis.call('ZADD', ready, '0', member)
    if ckey then
      redis.call('ZADD', kready, '0', kready_member(queue, member, ckey))
    end
  else
    redis.call('ZADD', sched, run_at, member)
  end
  move_list(list, queue, id, from, 'queued')
end

-- What one claim call (claim.lua, claim_fit.lua) decided in its first pass, for
-- write_claim: `lease` ({job key, reply values, queue, id, attempts, token as the claim
-- writes them}), `bury` ({job key, queue, id, parent, reason, the record as read}),
-- `taken` (ready members to remove), `ktaken` (their kready members, for the jobs with a
-- concurrency key), `list_old` (list members of vanished jobs) and `gone` ({queue, ready
-- member, id} of vanished jobs, whose key write_claim looks up in `ckeys`).
local function claim_decisions()
  return { lease = {}, bury = {}, taken = {}, ktaken = {}, list_old = {}, gone = {} }
end

-- The fields of a job's record a claim reads, in the order of its reply row (claim.lua's
-- header; v[1], the state, is overwritten there by the id): the placement, then the
-- concurrency key (hex, or false for none); then, past the row, the event mark `ev`
-- (CONTRACT V1; core.lua, record_change).
local function read_for_claim(job)
  return redis.call('HMGET', job, 'state', 'meta', 'run_at', 'att', 'token', 'error',
    'cancel', 'payload', 'timeout', 'placement', 'ckey', 'ev')
end

-- Takes ready entry `member` off the ready index, and off `kready` when its job has a
-- concurrency key (`ckey`, its record's `ckey` field, false or nil for none).
local function decide_take(d, member, queue, ckey)
  d.taken[#d.taken + 1] = member
  if ckey then
    d.ktaken[#d.ktaken + 1] = kready_member(queue, member, ckey)
  end
end

-- Decides that the claim takes the job of ready entry `member` off the ready index and
-- buries it, for `reason`; `v` is its record as read_for_claim read it (its parent from
-- `meta`, its `ckey`, and for its `dead` event its state, attempts and mark).
local function decide_bury(d, job, v, member, queue, id, reason)
  decide_take(d, member, queue, v[11])
  local _, parent = meta_queue_parent(v[2])
  d.bury[#d.bury + 1] = { job, queue, id, parent, reason, v }
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
    local attempts, token = succ(v[4]), succ(v[5])
    if not meta_ok(v[2]) then
      reason = 'field meta unreadable'
    elseif not attempts then
      reason = 'field att not a number'
    elseif not token then
      reason = 'field token not a number'
    else
      decide_take(d, member, queue, v[11])
      d.lease[#d.lease + 1] = { job, v, queue, id, attempts, token }
      return 'leased'
    end
  elseif state and not STATE_CODE[state] then
    reason = 'unknown state'
  end
  if reason then
    decide_bury(d, job, v, member, queue, id, reason)
    return 'buried'
  end
  decide_take(d, member, queue, v[11])
  if not state then
    d.list_old[#d.list_old + 1] = list_member(queue, 'queued', id)
    d.gone[#d.gone + 1] = { queue, member, id }
    return 'vanished'
  end
  return 'stale'
end

-- The writes of a claim, once every value they depend on was read and checked
-- (claim_decisions): each job to lease becomes running under this lease, leaving `ready`
-- and entering `leases` and its queue's running counter in this step; each job to bury
-- goes to dead; the taken ready members and the list members of vanished jobs are
-- removed. A leased job with a concurrency key enters `kleases`; the taken entries of jobs
-- with one leave `kready`, and a vanished job's key (looked up in `ckeys`) leaves both
-- `kready` and `ckeys`. A leased or buried job that records its events gets its
-- `started` or `dead` event in `events` (CONTRACT V1). Returns the leased jobs' reply
-- rows, one flat array of 11 values per job (as claim.lua answers: a table per row costs
-- the reply more than its values), and the buried ids.
local function write_claim(ready, leases, list, running, finished, d, worker, expires, now,
    ckeys, kready, kleases, events)
  local claimed, corrupt, lease_pairs, klease_pairs = {}, {}, {}, {}
  for _, g in ipairs(d.gone) do
    local ckey = redis.call('HGET', ckeys, g[3])
    if ckey then
      d.ktaken[#d.ktaken + 1] = kready_member(g[1], g[2], ckey)
      redis.call('HDEL', ckeys, g[3])
    end
  end
  for _, l in ipairs(d.lease) do
    local job, v, queue, id = l[1], l[2], l[3], l[4]
    -- The counters as decide_claim found them next (succ), in one write.
    local attempts, token = l[5], l[6]
    redis.call('HSET', job, 'state', 'running', 'att', attempts, 'token', token,
      'worker', worker, 'lease_exp', expires, 'started', now, 'hb', now)
    local r = #claimed
    claimed[r + 1] = id
    for i = 2, 11 do
      claimed[r + i] = v[i]
    end
    if v[11] then
      klease_pairs[#klease_pairs + 1] = '0'
      klease_pairs[#klease_pairs + 1] = queue .. ' ' .. v[11] .. ' ' .. id
    end
    claimed[r + 4] = attempts
    claimed[r + 5] = token
    local pairs_of_queue = lease_pairs[queue]
    if not pairs_of_queue then
      pairs_of_queue = {}
      lease_pairs[queue] = pairs_of_queue
    end
    pairs_of_queue[#pairs_of_queue + 1] = expires
    pairs_of_queue[#pairs_of_queue + 1] = lease_member(queue, id)
    -- The list entry stays: queued and running share the code 'a'.
    if v[12] then
      record_change(events, id, queue, 'queued', 'running', nil, attempts, now)
    end
  end
  for _, b in ipairs(d.bury) do
    bury(b[1], list, finished, b[2], b[3], b[4], now, b[5])
    local v = b[6]
    if v[12] then
      record_change(events, b[3], b[2], v[1], 'dead', v[4], v[4], now)
    end
    corrupt[#corrupt + 1] = b[3]
  end
  zrem_members(ready, d.taken)
  zrem_members(kready, d.ktaken)
  for queue, flat in pairs(lease_pairs) do
    zadd_pairs(leases, flat)
    redis.call('HINCRBY', running, queue, string.format('%d', #flat / 2))
  end
  zadd_pairs(kleases, klease_pairs)
  zrem_members(list, d.list_old)
  return claimed, corrupt
end

-- Attempts (CONTRACT H1-H4). Only an attempt that ends other than by success is written
-- (fail.lua, release.lua, reclaim.lua, in the same call that ends its lease): the running
-- attempt is the job's lease, and the succeeded one its last lease (`worker`, `token`,
-- `started`, which complete.lua leaves in place) and `finished`, until a reopen (CONTRACT
-- D3) queues the job again: reopen.lua then writes it as a record, since the return to
-- queued clears `started` and `finished`. Each record goes into the
-- job's own hash, field 'a' .. (token mod ATTEMPTS_KEPT) (durq_core::attempts::slot), so it
-- is deleted with the job, a newer attempt overwrites the one 32 claims older, and no
-- key or trim pass is added.
local ATTEMPTS_KEPT = 32

-- The hash field of the attempt of `token` (an integer string, checked by the caller).
local function attempt_field(token)
  return 'a' .. string.format('%d', tonumber(token) % ATTEMPTS_KEPT)
end

-- An ended attempt, read by codec::decode_attempt:
-- "TOKEN STARTED ENDED OUTCOME WORKER_LEN WORKERERROR", outcome 'f' (failed), 'r'
-- (released: no error), 'e' (expired) or 's' (succeeded: no error; written only by
-- reopen.lua, see there); the worker is cut by its byte length, so it may hold spaces,
-- and the error is the rest. Every part is a string as stored or given.
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

-- CONTRACT O2: a job someone waits for carries `awt` (set by await.lua); the script that
-- ends it publishes `~ID` on the wake channel, which the store's subscriber hands to the
-- waits (no queue name starts with `~`, so no claimer mistakes it for work). A job
-- nobody waits for costs one more field in a read the script makes anyway.
local function announce_ending(channel, id)
  redis.call('PUBLISH', channel, '~' .. id)
end
