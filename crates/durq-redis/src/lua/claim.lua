-- claim.lua: leases the first ready jobs of the named queues, in claim order
-- (CONTRACT C1-C9). A claim that fits the worker (a budget, preferred localities or a
-- reservation, CONTRACT F2-F6) runs claim_fit.lua instead, so this one, the hot path,
-- never decodes a placement: it only hands the stored text back to Rust.
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] lease index (zset)   KEYS[4] list index (zset)
-- KEYS[5] running counters (hash: queue -> lease entries)
-- KEYS[6] finished log (list)  KEYS[7] paused queues (set)
-- KEYS[8] concurrency keys (hash: id -> hex key, jobs that have one)
-- KEYS[9] kready (zset: ready jobs with a concurrency key, see core.lua)
-- KEYS[10] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- KEYS[11] queue limits (hash: queue -> limits text, lua/flow.lua)
-- KEYS[12] event stream (CONTRACT V1; core.lua, record_change)
-- KEYS[1..12] are the same for claim_fit.lua and claim_limited.lua (store/claim.rs,
-- claim_invocation)
-- KEYS[12+i] the hash of candidate i, whose id is ARGV[7+Q+i]
--
-- ARGV[1] now (ms)             ARGV[2] worker
-- ARGV[3] lease expiry (ms)    ARGV[4] limit (>= 1)
-- ARGV[5] hint size            ARGV[6] promotion bound (due scheduled entries moved per call)
-- ARGV[7] Q, the number of queues; ARGV[8..7+Q] the queues (distinct)
-- ARGV[8+Q..] candidate ids (see KEYS)
--
-- Returns one of:
--   {'limited'}               a named, unpaused queue has limits (CONTRACT K1-K5): this
--                             script does not enforce them, claim_limited.lua does;
--                             nothing was promoted or written (checked right after
--                             the paused set: one EXISTS while no queue has limits)
--   {'promote'}               more due scheduled jobs than the bound: some were moved to
--                             the ready index, nothing was claimed; call again
--   {'ok', claimed, hint, corrupt}
--                             claimed: 11 values per leased job, one flat array: id,
--                             meta, run_at, att, token (both as now stored), error, cancel,
--                             payload, timeout, placement (needs and locality, decoded by
--                             Rust), ckey (the concurrency key as hex, or nil for none);
--                             the rest of the record is what this call wrote from its ARGV
--                             (state running, worker, lease_exp, started = hb = now) or
--                             absent on a queued job (finished, result), so Rust fills it in
--                             without the script reading and returning it; hint: the ready
--                             index members now at the head of the ready order (at most the
--                             hint size; each ends with its job's id), for the next call;
--                             corrupt: ids of jobs whose record cannot be read (unreadable
--                             `meta`, `att` or `token`, or an unknown state), which this call
--                             moved to `dead` with last_error 'corrupt record: ...'
--                             (CONTRACT §5, corrupt records), so one bad record neither
--                             blocks its queue nor leaves the indexes
--
-- The script only touches hashes passed in KEYS, so it cannot follow the ready index to
-- a job it was not given. It walks the merged head of the named queues in order and
-- leases each entry whose hash it holds; at the first entry it does not hold it stops,
-- because leasing anything behind it would break the order. Rust then calls again with
-- the hint. Entries whose hash is gone are removed on the way (C7) and never written.
-- The kready entries of the jobs it takes off the ready index go with them, and a
-- leased job with a concurrency key gets its kleases entry (core.lua): found from the
-- `ckey` field read with the others, or, for a vanished job, from `ckeys` (whose entry
-- goes too).
-- The head is read once, `limit + hint size` entries deep: what the walk leaves of it is
-- the hint, since nothing but this call changes the ready index while it runs.
--
-- Atomicity: each job leaves the ready index and enters the lease index (and its queue's
-- running counter) in the same script that marks it running, so a crash never strands a
-- job in neither. A job that records its events (`ev`, read with the other fields) gets
-- its `started` event, a buried one its `dead` event, in the same script. Every value
-- read is checked before the first write (the running counters before the promotion,
-- the records in a first pass, see lib.lua).
--
-- Cost: this is the hot path, so it is written for the server's time per job: one
-- HMGET and one HSET per job, the index writes of the whole call batched, no table or
-- string built per job beyond the reply row, the lease member and the id, and the
-- counters incremented without `tonumber`/`string.format` in the common case (see
-- `succ` in lib.lua).

local now, worker, expires = ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local hint_size = tonumber(ARGV[5])
local bound = tonumber(ARGV[6])
local nq = tonumber(ARGV[7])
local ready, sched, leases, list, running, finished = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local paused = KEYS[7]
local ckeys, kready, kleases, limits = KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local events = KEYS[12]
local call, sub = redis.call, string.sub

-- CONTRACT Q1: a paused queue gives no candidates.
local named = {}
for i = 1, nq do
  local q = ARGV[7 + i]
  if call('SISMEMBER', paused, q) == 0 then
    named[#named + 1] = q
  end
end
-- Queues with limits are claimed by claim_limited.lua; a store without any pays one EXISTS.
if call('EXISTS', limits) == 1 then
  for i = 1, #named do
    if call('HEXISTS', limits, named[i]) == 1 then
      return { 'limited' }
    end
  end
end
check_counters(running, named)

if not promote(ready, sched, now, bound, ckeys, kready) then
  return { 'promote' }
end

local held = {}
for i = 1, #KEYS - 12 do
  held[ARGV[7 + nq + i]] = KEYS[12 + i]
end

-- The first `n` entries of the ready order over all named queues: each queue's range is
-- already in order, so a merge of the queues' heads (Q - 1 comparisons per entry).
local function head(n)
  if #named == 1 then
    local q = named[1]
    return call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
  end
  local parts, pos = {}, {}
  for i = 1, #named do
    local q = named[i]
    parts[i] = call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
    pos[i] = 1
  end
  local first = {}
  while #first < n do
    local best, best_order = nil, nil
    for i = 1, #named do
      local member = parts[i][pos[i]]
      if member then
        local order = sub(member, -72, -37)
        if not best or order_less(order, best_order) then
          best, best_order = i, order
        end
      end
    end
    if not best then
      break
    end
    first[#first + 1] = parts[best][pos[best]]
    pos[best] = pos[best] + 1
  end
  return first
end

-- Pass 1: read and decide, no writes. One queue (the common case) needs no queue name
-- cut out of each member.
local members = #named > 0 and head(limit + hint_size) or {}
local only = #named == 1 and named[1] or nil
local claimed, corrupt, taken, list_old, lease_pairs, per_queue = {}, {}, {}, {}, {}, {}
local lease_keys = {}
local buried = {}
-- Concurrency keys: kready members to remove, kleases pairs to add, vanished jobs' ids.
local ktaken, klease_pairs, kgone = {}, {}, {}
local nc, nt, np = 0, 0, 0
local walked = 0
-- The leased jobs that record their events (CONTRACT V1): each one's row number and
-- queue; made by the first such job, so a claim of jobs without the mark builds nothing.
local marked, marked_queue = nil, nil
for i = 1, #members do
  if nc >= limit then
    break
  end
  local member = members[i]
  local id = sub(member, -36)
  local job = held[id]
  if not job then
    break
  end
  walked = i
  local queue = only or sub(member, 1, #member - 73)
  local v = call('HMGET', job, 'state', 'meta', 'run_at', 'att', 'token', 'error', 'cancel',
    'payload', 'timeout', 'placement', 'ckey', 'ev')
  local state = v[1]
  nt = nt + 1
  taken[nt] = member
  local ckey = v[11]
  if not state then
    -- A vanished job's key is only in `ckeys`.
    ckey = call('HGET', ckeys, id)
    if ckey then
      kgone[#kgone + 1] = id
    end
  end
  if ckey then
    ktaken[#ktaken + 1] = kready_member(queue, member, ckey)
  end
  local reason = nil
  if state == 'queued' then
    -- A job never claimed before, the common case, without a function call.
    local attempts, token
    if v[4] == '0' and v[5] == '0' then
      attempts, token = '1', '1'
    else
      attempts, token = succ(v[4]), succ(v[5])
    end
    if not meta_ok(v[2]) then
      reason = 'field meta unreadable'
    elseif not attempts then
      reason = 'field att not a number'
    elseif not token then
      reason = 'field token not a number'
    else
      -- The reply row, flat: the id in place of the state, the counters as this call
      -- writes them (a table per row would cost the reply more than its values).
      local r = 11 * nc
      claimed[r + 1] = id
      claimed[r + 2] = v[2]
      claimed[r + 3] = v[3]
      claimed[r + 4] = attempts
      claimed[r + 5] = token
      claimed[r + 6] = v[6]
      claimed[r + 7] = v[7]
      claimed[r + 8] = v[8]
      claimed[r + 9] = v[9]
      claimed[r + 10] = v[10]
      claimed[r + 11] = ckey
      nc = nc + 1
      lease_keys[nc] = job
      np = np + 2
      lease_pairs[np - 1] = expires
      lease_pairs[np] = queue .. ' ' .. id
      per_queue[queue] = (per_queue[queue] or 0) + 1
      if ckey then
        klease_pairs[#klease_pairs + 1] = '0'
        klease_pairs[#klease_pairs + 1] = queue .. ' ' .. ckey .. ' ' .. id
      end
      if v[12] then
        if not marked then
          marked, marked_queue = {}, {}
        end
        marked[#marked + 1] = nc
        marked_queue[#marked_queue + 1] = queue
      end
    end
  elseif state and not STATE_CODE[state] then
    reason = 'unknown state'
  elseif not state then
    -- The hash vanished under its index entries (C7): drop them, write nothing.
    list_old[#list_old + 1] = queue .. ' a ' .. id
  end
  -- Any other state means the entry is stale: it is only dropped.
  if reason then
    local _, parent = meta_queue_parent(v[2])
    buried[#buried + 1] = { job, queue, id, parent, reason, v[12], state, v[4] }
  end
end

-- Pass 2: writes. Each leased job in one HSET; the index entries of the call together.
for i = 1, nc do
  local r = 11 * (i - 1)
  call('HSET', lease_keys[i], 'state', 'running', 'att', claimed[r + 4], 'token', claimed[r + 5],
    'worker', worker, 'lease_exp', expires, 'started', now, 'hb', now)
end
if marked then
  for i, n in ipairs(marked) do
    local r = 11 * (n - 1)
    record_change(events, claimed[r + 1], marked_queue[i], 'queued', 'running', nil,
      claimed[r + 4], now)
  end
end
for _, b in ipairs(buried) do
  bury(b[1], list, finished, b[2], b[3], b[4], now, b[5])
  if b[6] then
    record_change(events, b[3], b[2], b[7], 'dead', b[8], b[8], now)
  end
  corrupt[#corrupt + 1] = b[3]
end
zrem_members(ready, taken)
zrem_members(kready, ktaken)
if np > 0 then
  zadd_pairs(leases, lease_pairs)
  for queue, n in pairs(per_queue) do
    call('HINCRBY', running, queue, n)
  end
end
zadd_pairs(kleases, klease_pairs)
zrem_members(list, list_old)
for _, id in ipairs(kgone) do
  call('HDEL', ckeys, id)
end

-- What the walk left of the head is the head now.
local hint = {}
for i = walked + 1, math.min(#members, walked + hint_size) do
  hint[#hint + 1] = members[i]
end
return { 'ok', claimed, hint, corrupt }
