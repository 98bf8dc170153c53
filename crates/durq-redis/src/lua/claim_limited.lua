-- claim_limited.lua: the claim of queues with limits (CONTRACT K1-K5 with C1-C9), what
-- the claim loop (store/claim.rs) runs instead of claim.lua once claim.lua answered
-- {'limited'} for one of the named queues (store/flow.rs).
-- Helpers: core.lua, flow.lua (which describes the keys of flow control).
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] lease index (zset)   KEYS[4] list index (zset)
-- KEYS[5] running counters (hash: queue -> lease entries)
-- KEYS[6] finished log (list)  KEYS[7] paused queues (set)
-- KEYS[8] ckeys (hash)         KEYS[9] kready (zset)
-- KEYS[10] kleases (zset)      KEYS[11] limits (hash)
-- KEYS[12] event stream (CONTRACT V1; core.lua, record_change)
-- KEYS[13] flow (hash)
-- KEYS[13+i] the hash of candidate i, whose id is ARGV[7+Q+i]
--
-- ARGV[1] now (ms)             ARGV[2] worker
-- ARGV[3] lease expiry (ms)    ARGV[4] limit (>= 1)
-- ARGV[5] hint size            ARGV[6] promotion bound
-- ARGV[7] Q, the number of queues; ARGV[8..7+Q] the queues (distinct)
-- ARGV[8+Q..] candidate ids (see KEYS)
--
-- Returns one of:
--   {'promote'}  as claim.lua
--   {'ok', claimed, hint, corrupt, limited}
--                claimed, corrupt: as claim.lua; hint: the ready index members of the
--                jobs this call selected but could not lease (it was not given their
--                hashes), in claim order, at most `hint size`: the head of the
--                selection now, sliced between claimers as claim.lua's; limited: how many
--                of the named queues have limits (0: the caller may forget them)
--
-- The selection. Each named queue without limits gives its first ready jobs, as
-- claim.lua would. A queue with limits gives the ready jobs its admission lets through,
-- in claim order (K1, K2, K4: a job whose key is at a limit is passed over, and the
-- queue gives none once it is at its own), its ready index walked a page at a time; a
-- fair queue (K5) gives them by turns of key within each priority, each key's first
-- jobs read from kready and the jobs without a key from the ready index, and holds the
-- places in claim order that its first jobs hold (fair.rs's in_turn_places). The
-- queues' selections are merged in claim order and cut to `limit + hint size`; the
-- admission counts the selected jobs past `limit` too, so the hint names the jobs the
-- next call would select if this one leased its first `limit`.
--
-- Then the lease, as claim.lua: the selection in order, each job whose hash the call
-- holds, up to `limit`, stopping at the first it does not hold (leasing anything behind
-- it would break the order); the claim loop calls again holding the hint. Every limit is
-- counted and every job leased in this one script, so no other claim runs between the
-- count and the lease (the atomicity K1-K4 ask for). The leases write each start into
-- the start logs of the queue's rates, and each fair queue's turn moves to the key of
-- its last leased job at each priority.

local now, worker, expires = ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local hint_size = tonumber(ARGV[5])
local bound = tonumber(ARGV[6])
local nq = tonumber(ARGV[7])
local ready, sched, leases, list, running, finished = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local paused, ckeys, kready, kleases, limits_key, flow = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[13]
local events = KEYS[12]
local FIRST_HELD = 13
-- Values per leased job in the reply, as claim.lua's (codec.rs, CLAIMED_FIELDS).
local CLAIMED_WIDTH = 11
local call, sub = redis.call, string.sub
local now_n = tonumber(now)
-- Entries read per ZRANGEBYLEX of a walk.
local PAGE = 128

-- CONTRACT Q1: a paused queue gives no candidates.
local named = {}
for i = 1, nq do
  local q = ARGV[7 + i]
  if call('SISMEMBER', paused, q) == 0 then
    named[#named + 1] = q
  end
end
check_counters(running, named)

-- The limits of each named queue, read and checked before any write.
local limits_of, limited = {}, 0
if #named > 0 then
  local texts = call('HMGET', limits_key, unpack(named))
  for i, q in ipairs(named) do
    limits_of[q] = parse_limits(q, texts[i])
    if limits_of[q] then
      limited = limited + 1
    end
  end
end

if not promote(ready, sched, now, bound, ckeys, kready) then
  return { 'promote' }
end

local held = {}
for i = 1, #KEYS - FIRST_HELD do
  held[ARGV[7 + nq + i]] = KEYS[FIRST_HELD + i]
end

local want = limit + hint_size
-- kleases and kready entries found stale on the way, removed with the writes.
local stale_leases, stale_ready = {}, {}

-- A selected job: its place in claim order, its ready member, id, queue, and for a fair
-- queue the priority and key (hex, '' for none) whose turn it was.
local function selected(place, member, queue)
  return { place = place, member = member, id = sub(member, -36), queue = queue }
end

-- Up to `want` ready jobs of `queue` in claim order, those its admission `a` lets
-- through (all of them when it has no limits), appended to `out`.
local function ready_selection(queue, a, out)
  -- The jobs' keys matter to a per-key rate, and to a per-key running limit that this
  -- claim's takes could reach: a key runs no more jobs than its queue, so while the
  -- queue's running jobs and all the claim may take stay below the limit, none can.
  local l = a and a.l
  local keyed = l and (l.msk ~= nil or (l.mrk ~= nil and a.running + want >= l.mrk))
  local from, to = '[' .. queue .. ' ', '(' .. queue .. '!'
  local got = 0
  while got < want and not (a and admission_full(a)) do
    local page = call('ZRANGEBYLEX', ready, from, to, 'LIMIT', 0, keyed and PAGE or want - got)
    if #page == 0 then
      break
    end
    -- The page's keys in one read.
    local keys_of = nil
    if keyed then
      local ids = {}
      for i, member in ipairs(page) do
        ids[i] = sub(member, -36)
      end
      keys_of = call('HMGET', ckeys, unpack(ids))
    end
    for i, member in ipairs(page) do
      local key = keys_of and keys_of[i] or false
      if not a or admission_take(a, key) then
        out[#out + 1] = selected(sub(member, -72, -37), member, queue)
        got = got + 1
        if got >= want then
          break
        end
      elseif admission_full(a) then
        break
      end
    end
    from = '(' .. page[#page]
  end
end

-- The next `n` ready jobs of one key of `queue` at priority `prio` after kready entry
-- `after` (nil: from its first), each {member, kready entry}; entries whose job left
-- the ready index are collected as stale.
local function key_jobs(queue, prio, key, after, n)
  local band = queue .. ' ' .. prio .. ' ' .. key
  local from = after and ('(' .. after) or ('[' .. band .. ' ')
  local entries = call('ZRANGEBYLEX', kready, from, '(' .. band .. '!', 'LIMIT', 0, n)
  local jobs = {}
  for _, entry in ipairs(entries) do
    local member = queue .. ' ' .. sub(entry, -72)
    if call('ZSCORE', ready, member) then
      jobs[#jobs + 1] = { member, entry }
    else
      stale_ready[#stale_ready + 1] = entry
    end
  end
  return jobs, entries[#entries]
end

-- The next `n` ready jobs without a key of `queue` at `prio` after ready member `after`,
-- each {member}, and the last member read. Walks the band past its keyed jobs.
local function unkeyed_jobs(queue, prio, after, n)
  local band = queue .. ' ' .. prio
  local from = after and ('(' .. after) or ('[' .. band)
  local jobs, last = {}, after
  while #jobs < n do
    local page = call('ZRANGEBYLEX', ready, from, '(' .. band .. '~', 'LIMIT', 0, PAGE)
    if #page == 0 then
      break
    end
    for _, member in ipairs(page) do
      last = member
      if call('HEXISTS', ckeys, sub(member, -36)) == 0 then
        jobs[#jobs + 1] = { member }
        if #jobs >= n then
          break
        end
      end
    end
    from = '(' .. last
  end
  return jobs, last
end

-- The first key after `after` ('' for the jobs without a key, which come first) with
-- ready jobs of `queue` at `prio`, or nil.
local function key_after(queue, prio, after)
  local band = queue .. ' ' .. prio .. ' '
  local from = after == '' and ('[' .. band) or ('[' .. band .. after .. '!')
  local first = call('ZRANGEBYLEX', kready, from, '(' .. queue .. ' ' .. prio .. '!', 'LIMIT', 0, 1)[1]
  if not first then
    return nil
  end
  return sub(first, #band + 1, -74)
end

-- One priority's keys in turn order (K5): from the one after `served` (the turn) to
-- the last, then from the first (the jobs without a key) up to `served` itself.
local function ring(queue, prio, served)
  local r = { at = nil, wrapped = false, done = false }
  return function()
    while not r.done do
      local after
      if r.at then
        after = r.at
      elseif served and not r.wrapped then
        after = served
      end
      local key
      if after == nil then
        key = ''
      else
        key = key_after(queue, prio, after)
      end
      if key == nil then
        if not r.wrapped and served then
          r.wrapped, r.at = true, nil
        else
          r.done = true
        end
      elseif r.wrapped and served and bytes_less(served, key) then
        r.done = true
      else
        r.at = key
        return key
      end
    end
    return nil
  end
end

-- Up to `want` ready jobs of fair `queue` by turns of key (K5), priorities highest
-- first, those admission `a` lets through, appended to `out` with the places in claim
-- order that the queue's first jobs hold.
local function fair_selection(queue, a, out)
  local taken = {}
  local prio = nil
  local prefix = queue .. ' '
  while #taken < want and not admission_full(a) do
    local from = prio and ('(' .. prefix .. prio .. '~') or ('[' .. prefix)
    local first = call('ZRANGEBYLEX', ready, from, '(' .. queue .. '!', 'LIMIT', 0, 1)[1]
    if not first then
      break
    end
    prio = sub(first, #prefix + 1, #prefix + 4)
    local served = call('HGET', flow, 't ' .. queue .. ' ' .. prio) or nil
    -- The band's jobs without a key not yet taken: its ready entries less its kready
    -- entries (kept in step with the ready index by every script that changes it).
    local unkeyed = call('ZLEXCOUNT', ready, '[' .. prefix .. prio, '(' .. prefix .. prio .. '~')
      - call('ZLEXCOUNT', kready, '[' .. prefix .. prio .. ' ', '(' .. prefix .. prio .. '!')
    local next_key = ring(queue, prio, served)
    -- Keys that had a turn in this claim and have jobs left: {key, jobs, pos, last}.
    local again, again_pos = {}, 1
    while #taken < want do
      local turn
      local key = next_key()
      if key ~= nil then
        local jobs, last
        if key == '' then
          if unkeyed > 0 then
            jobs, last = unkeyed_jobs(queue, prio, nil, 1)
          else
            jobs = {}
          end
        else
          jobs, last = key_jobs(queue, prio, key, nil, 1)
        end
        turn = { key = key, jobs = jobs, pos = 1, last = last }
      else
        turn = again[again_pos]
        again_pos = again_pos + 1
        if not turn then
          break
        end
        if turn.pos > #turn.jobs then
          -- Read the key's next job only once it has another turn.
          local jobs, last
          if turn.key == '' then
            if unkeyed > 0 then
              jobs, last = unkeyed_jobs(queue, prio, turn.last, 1)
            else
              jobs = {}
            end
          else
            jobs, last = key_jobs(queue, prio, turn.key, turn.last, 1)
          end
          turn.jobs, turn.pos, turn.last = jobs, 1, last
        end
      end
      local job = turn.jobs[turn.pos]
      if job then
        turn.pos = turn.pos + 1
        if admission_take(a, turn.key ~= '' and turn.key or false) then
          local pick = selected(sub(job[1], -72, -37), job[1], queue)
          pick.prio, pick.key = prio, turn.key
          taken[#taken + 1] = pick
          if turn.key == '' then
            unkeyed = unkeyed - 1
          end
          again[#again + 1] = turn
        elseif admission_full(a) then
          break
        end
        -- Otherwise the key is at a limit: it has no more turns in this claim.
      end
    end
  end
  -- In turn order, the places of the queue's first jobs (sorted).
  local places = {}
  for i, pick in ipairs(taken) do
    places[i] = pick.place
  end
  table.sort(places, order_less)
  for i, pick in ipairs(taken) do
    pick.place = places[i]
    out[#out + 1] = pick
  end
end

-- The selection of every named queue, merged in claim order and cut to `want`.
local picks = {}
local admissions = {}
for _, q in ipairs(named) do
  local l = limits_of[q]
  local part = {}
  if l then
    local a = admission(flow, running, kleases, leases, q, l, now_n, stale_leases)
    admissions[q] = a
    if l.fair then
      fair_selection(q, a, part)
    else
      ready_selection(q, a, part)
    end
  else
    ready_selection(q, nil, part)
  end
  for _, pick in ipairs(part) do
    picks[#picks + 1] = pick
  end
end
if #named > 1 then
  table.sort(picks, function(x, y)
    return order_less(x.place, y.place)
  end)
end

-- The lease: the selection in order, while the call holds each job's hash (claim.lua's
-- pass 1, reading each job's key for the key indexes). Written out as claim.lua writes
-- it, not with lib.lua's decide_claim and write_claim (claim_fit.lua's): those build a
-- table per job and bring lib.lua's definitions into every call, and with them this
-- script's claims of limits that admit everything ran at 0.90 of this version's rate
-- (claim-limited, 6 alternating pairs, 0.78-1.09), which is the margin of issue #28's
-- target over plain claims.
local claimed, corrupt, taken, list_old, lease_pairs, per_queue = {}, {}, {}, {}, {}, {}
local lease_keys, buried, kready_old, kleases_new, kgone = {}, {}, {}, {}, {}
local starts = {}
local turns = {}
local nc, np, walked = 0, 0, 0
-- The leased jobs that record their events (CONTRACT V1): each one's row number and
-- queue; made by the first such job, so a claim of jobs without the mark builds nothing.
local marked, marked_queue = nil, nil
for i = 1, math.min(#picks, want) do
  if nc >= limit then
    break
  end
  local pick = picks[i]
  local job = held[pick.id]
  if not job then
    break
  end
  walked = i
  local queue, id, member = pick.queue, pick.id, pick.member
  local v = call('HMGET', job, 'state', 'meta', 'run_at', 'att', 'token', 'error', 'cancel',
    'payload', 'timeout', 'placement', 'ckey', 'ev')
  local state = v[1]
  taken[#taken + 1] = member
  local key = v[11]
  if not state then
    -- A vanished job's key is only in `ckeys`, whose entry goes with its others.
    key = call('HGET', ckeys, id)
    if key then
      kgone[#kgone + 1] = id
    end
  end
  if key then
    kready_old[#kready_old + 1] = queue .. ' ' .. sub(member, -72, -69) .. ' ' .. key .. ' ' .. sub(member, -72)
  end
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
      local r = CLAIMED_WIDTH * nc
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
      claimed[r + 11] = key or false
      nc = nc + 1
      lease_keys[nc] = job
      np = np + 2
      lease_pairs[np - 1] = expires
      lease_pairs[np] = queue .. ' ' .. id
      per_queue[queue] = (per_queue[queue] or 0) + 1
      if key then
        kleases_new[#kleases_new + 1] = queue .. ' ' .. key .. ' ' .. id
      end
      local l = limits_of[queue]
      if l and l.ms then
        starts['s ' .. queue] = { (starts['s ' .. queue] or { 0 })[1] + 1, l.ms_per }
      end
      if l and l.msk and key then
        local field = 'k ' .. queue .. ' ' .. key
        starts[field] = { (starts[field] or { 0 })[1] + 1, l.msk_per }
      end
      if pick.prio then
        turns['t ' .. queue .. ' ' .. pick.prio] = pick.key
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
    list_old[#list_old + 1] = queue .. ' a ' .. id
  end
  if reason then
    local _, parent = meta_queue_parent(v[2])
    buried[#buried + 1] = { job, queue, id, parent, reason, v[12], state, v[4] }
  end
end

-- The start logs this claim adds to, read before the first write.
local logs = {}
for field, _ in pairs(starts) do
  logs[field] = call('HGET', flow, field) or ''
end

-- Writes.
for i = 1, nc do
  local r = CLAIMED_WIDTH * (i - 1)
  call('HSET', lease_keys[i], 'state', 'running', 'att', claimed[r + 4], 'token', claimed[r + 5],
    'worker', worker, 'lease_exp', expires, 'started', now, 'hb', now)
end
if marked then
  for i, n in ipairs(marked) do
    local r = CLAIMED_WIDTH * (n - 1)
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
zrem_members(kready, kready_old)
zrem_members(kready, stale_ready)
zrem_members(kleases, stale_leases)
if np > 0 then
  zadd_pairs(leases, lease_pairs)
  for queue, n in pairs(per_queue) do
    call('HINCRBY', running, queue, n)
  end
  local flat = {}
  for i, entry in ipairs(kleases_new) do
    flat[2 * i - 1] = '0'
    flat[2 * i] = entry
  end
  zadd_pairs(kleases, flat)
end
zrem_members(list, list_old)
for _, id in ipairs(kgone) do
  call('HDEL', ckeys, id)
end
for field, s in pairs(starts) do
  call('HSET', flow, field, log_add(logs[field], now_n - s[2], now_n, s[1]))
end
for field, key in pairs(turns) do
  call('HSET', flow, field, key)
end

-- What the lease left of the selection is the head now (as claim.lua's hint).
local hint = {}
for i = walked + 1, math.min(#picks, walked + hint_size) do
  hint[#hint + 1] = picks[i].member
end
return { 'ok', claimed, hint, corrupt, limited }
