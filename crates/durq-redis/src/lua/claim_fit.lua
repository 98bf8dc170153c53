-- claim_fit.lua: leases the first ready jobs of the named queues that fit the worker, in
-- the order of a fitted claim (CONTRACT F2-F6; C1-C9 as claim.lua). Used only for claims
-- with a budget, preferred localities or a reservation; the others run claim.lua.
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] lease index (zset)   KEYS[4] list index (zset)
-- KEYS[5] running counters (hash: queue -> lease entries)
-- KEYS[6] finished log (list)  KEYS[7] paused queues (set)
-- KEYS[8] concurrency keys (hash)  KEYS[9] kready (zset)  KEYS[10] kleases (zset)
-- KEYS[11] queue limits (hash)     KEYS[12] event stream (KEYS[1..12] as claim.lua's)
-- KEYS[13] placement index (hash: id -> placement text, only jobs that declare one)
-- KEYS[14] flow control state (hash, see flow.lua)
-- KEYS[14+i] the hash of held job i, whose id is ARGV[12+Q+P+i]
--
-- ARGV[1] now (ms)             ARGV[2] worker
-- ARGV[3] lease expiry (ms)    ARGV[4] limit (>= 1)
-- ARGV[5] hint size (>= limit) ARGV[6] promotion bound (as claim.lua)
-- ARGV[7] scan bound: the most ready entries one call examines
-- ARGV[8] budget as Budget::to_json writes it ({"a":{name:amount},"c":[key]}), or ''
--         for none (every job fits)
-- ARGV[9] reserved job id, or '' (CONTRACT F6; Rust always passes its hash)
-- ARGV[10] where the walk starts: '' at the head, else ORDERKEY..ID of the entry an
--          earlier call of the same claim stopped at (the walk starts just after it)
-- ARGV[11] Q; ARGV[12..11+Q] the queues (distinct)
-- ARGV[12+Q] P; ARGV[13+Q..12+Q+P] the preferred localities
-- ARGV[13+Q+P..] held ids (see KEYS)
--
-- Returns one of:
--   {'promote'}    as claim.lua: nothing claimed, call again
--   {'ok', claimed, hint, corrupt, more, stop}
--       claimed, corrupt: as claim.lua, 11 values per job (a job whose placement is
--         unreadable is buried too, 'corrupt record: field placement unreadable')
--       hint: the ids whose hashes the next call needs: the selected jobs this call did
--         not lease and unreadable jobs it could not bury, then fitting jobs behind the
--         selection, for the next claim
--       more: 1 when the selection was not wholly leased (a hash not held, a stale or
--         vanished entry, an index entry repaired): call again with the hint
--       stop: '' when the walk ended within the scan bound; else ORDERKEY..ID of the
--         last entry examined, behind which nothing was looked at: a claim that wants
--         more may call again starting there
--
-- The selection (recomputed by every call, so the call that leases decides atomically):
-- the walk reads the merged head of the named, unpaused queues in ready order, in
-- chunks, and keeps the jobs the budget admits (`admits`, Budget::admits transcribed; a
-- job without a placement fits every budget). The cut to `limit` comes after the filter
-- and the order. Each placement is decoded once per call (cjson), however many jobs
-- share its text. A job that does not fit is never written.
--
-- With no preferred locality (the common case, and the hot path), the order is the
-- ready order and the walk is one pass, as claim.lua's: a job whose hash the call holds
-- is judged by its own `placement` field, read with the fields the lease needs, and
-- leased at once when it fits; the first fitting job it does not hold (judged by the
-- placement index) ends the walk, since nothing behind it can be leased now. It stops
-- at `limit` leased jobs. Once it meets a job that does not fit, it reads the index for
-- the rest of the chunk in one HMGET and passes over held jobs the index says do not
-- fit without reading their records.
--
-- With preferred localities the order is priority, then preferred first, then ready
-- order (FitOrder), so a preferred job late in a priority band overtakes the others of
-- its band: the walk judges by the placement index (read a chunk at a time) and reads
-- the band of the last job it would take to its end, or until the preferred jobs of
-- that band alone fill the claim. Then, as claim.lua, the selected jobs are leased in
-- order while their hashes are held, stopping at the first that is not. A reservation
-- skips the walk: its job is selected when its ready entry (found from its hash's
-- `meta` and `order`) is in a named queue and fits.
--
-- The scan bound keeps one call short when the head of the queues holds many jobs the
-- worker does not fit: past it the walk stops, and what it took or selected so far is
-- all this call takes (with preferred localities, a preferred job of the last band
-- beyond the bound is not seen).
--
-- A job's own `placement` field is the truth; the placement index is what a call judges
-- by where it cannot read the record. Where both were read and disagree (the index
-- changed behind the store's back), the index entry is set from the record: a job the
-- index selected wrongly waits for the next call (preferred walk), or the record decides
-- at once (ready-order walk).
--
-- Atomicity and check before write: as claim.lua. The walk and every record it acts on
-- are read in a first pass, the writes come after. The concurrency-key indexes and the
-- events of marked jobs are kept as claim.lua keeps them (write_claim in lib.lua).

local now, worker, expires = ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local hint_size = tonumber(ARGV[5])
local bound = tonumber(ARGV[6])
local scan_bound = tonumber(ARGV[7])
local budget_text, reserved, start_after = ARGV[8], ARGV[9], ARGV[10]
local nq = tonumber(ARGV[11])
local np = tonumber(ARGV[12 + nq])
local held_from = 12 + nq + np
local ready, sched, leases, list, running, finished = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local paused, placements, flow = KEYS[7], KEYS[13], KEYS[14]
local ckeys, kready, kleases, limits, events = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]

-- CONTRACT Q1: a paused queue gives no candidates.
local named, is_named = {}, {}
for i = 1, nq do
  local q = ARGV[11 + i]
  if redis.call('SISMEMBER', paused, q) == 0 then
    named[#named + 1] = q
    is_named[q] = true
  end
end
check_counters(running, named)

-- Flow control (CONTRACT K1, K2, K4): a fitted claim keeps its own order (K5's fair
-- shares do not reorder it), but a queue's limits on running jobs and starts admit
-- each job it selects, in the claim's order (flow.lua's admission, as
-- claim_limited.lua's; a preferring walk admits a band's preferred jobs before the
-- others). A job its limits hold back is passed over like one that does not fit. Read
-- and checked before any write.
local admissions, stale_leases = {}, {}
if #named > 0 and redis.call('EXISTS', limits) == 1 then
  local texts = redis.call('HMGET', limits, unpack(named))
  for i, q in ipairs(named) do
    local l = parse_limits(q, texts[i])
    if l and (l.mr or l.ms or l.keyed) then
      admissions[q] = admission(flow, running, kleases, leases, q, l, tonumber(now), stale_leases)
    end
  end
end
-- Whether queue `q`'s limits admit job `id` (`key`: its hex concurrency key, nil to
-- look it up); if so, counted.
local function admit(q, id, key)
  local a = admissions[q]
  if not a then
    return true
  end
  if key == nil then
    key = redis.call('HGET', ckeys, id)
  end
  return admission_take(a, key or false)
end

if not promote(ready, sched, now, bound, ckeys, kready) then
  return { 'promote' }
end

local held = {}
for i = 1, #KEYS - 14 do
  held[ARGV[held_from + i]] = KEYS[14 + i]
end
local preferred = {}
for i = 1, np do
  preferred[ARGV[12 + nq + i]] = true
end
-- When no job of the namespace declares a placement, none can be preferred (nor fail to
-- fit): the walk need not read a priority band to its end looking for one.
if np > 0 and redis.call('HLEN', placements) == 0 then
  np = 0
end

-- The budget: `offered` (name -> amount) is nil when the claim has none, so every job
-- fits; `offers` is the set of capabilities.
local offered, offers = nil, {}
if budget_text ~= '' then
  local budget = cjson.decode(budget_text)
  offered = budget.a
  for _, key in ipairs(budget.c) do
    offers[key] = true
  end
end

-- Whether a decoded placement has the shape Rust writes. What this lets through and Rust
-- still cannot read (an amount beyond u64, say) is buried by Rust once leased, as any
-- record only Rust can tell is unreadable.
local function readable(p)
  if type(p) ~= 'table' then
    return false
  end
  for field in pairs(p) do
    if type(field) ~= 'string' then
      return false
    end
  end
  local a, c, l = p.a, p.c, p.l
  if a ~= nil then
    if type(a) ~= 'table' then
      return false
    end
    for name, amount in pairs(a) do
      if type(name) ~= 'string' or type(amount) ~= 'number' or amount < 0
        or amount ~= math.floor(amount) then
        return false
      end
    end
  end
  if c ~= nil then
    if type(c) ~= 'table' then
      return false
    end
    for i, key in pairs(c) do
      if type(i) ~= 'number' or type(key) ~= 'string' then
        return false
      end
    end
  end
  return l == nil or l == cjson.null or type(l) == 'string'
end

-- Budget::admits: every amount the job needs is at most the budget's amount of that name
-- when the budget names it (zero is a limit like any other); every capability it needs
-- is offered, whole key for whole key. Amounts are at most 2^53 - 1 (CONTRACT F1), so
-- the comparison of doubles is exact.
local function admits(p)
  if not offered then
    return true
  end
  if p.a then
    for name, amount in pairs(p.a) do
      local free = offered[name]
      if free and amount > free then
        return false
      end
    end
  end
  if p.c then
    for _, key in pairs(p.c) do
      if not offers[key] then
        return false
      end
    end
  end
  return true
end

-- The verdict on a placement text ('fit', 'no' or 'bad' when unreadable) and whether
-- its locality is preferred; `false` (no placement) fits every budget and is never
-- preferred. Jobs of one kind share their text, so each text is decoded once.
local judged = {}
local function judge(text)
  if not text then
    return 'fit', false
  end
  local j = judged[text]
  if not j then
    local ok, p = pcall(cjson.decode, text)
    if not ok or not readable(p) then
      j = { 'bad', false }
    else
      local l = p.l
      j = { admits(p) and 'fit' or 'no', type(l) == 'string' and preferred[l] == true }
    end
    judged[text] = j
  end
  return j[1], j[2]
end

-- An entry is {ready member, placement text or false, queue}.
local selected = {}  -- the jobs to take, in the claim's order
-- Jobs that fit behind them, hints for the next claim: preferred ones (what the next
-- claim will take first), then the others.
local extra_first, extra = {}, {}
local bad = {}       -- jobs whose placement cannot be read, to bury
local stop = ''

local claimed, corrupt, hint = {}, {}, {}
local more = 0
local d = claim_decisions()
local unplaced = {}    -- placement index entries of vanished jobs
local repaired = {}    -- {id, placement text or false} set from the record

-- decide_claim for a job this call takes; the placement index entry of a vanished job
-- goes with its other entries. Returns what decide_claim did.
local function decide(job, v, member, queue, id)
  local done = decide_claim(d, job, v, member, queue, id)
  if done == 'vanished' then
    unplaced[#unplaced + 1] = id
  end
  return done
end

if reserved ~= '' then
  local job = held[reserved]
  local v = job and redis.call('HMGET', job, 'meta', 'order')
  local queue = v and meta_queue_parent(v[1])
  if queue and is_named[queue] and v[2] then
    local member = queue .. ' ' .. v[2] .. reserved
    if redis.call('ZSCORE', ready, member) then
      local place = redis.call('HGET', placements, reserved)
      local verdict = judge(place)
      if verdict == 'fit' and admit(queue, reserved) then
        selected[1] = { member, place, queue }
      elseif verdict == 'bad' then
        bad[1] = { member, place, queue }
      end
    end
  end
else
  -- One stream per queue, read in chunks that start at the claim's size plus its hint
  -- (about what claim.lua reads for both) and double while the walk goes on, up to
  -- CHUNK (a bound of unpack).
  local streams = {}
  for i, q in ipairs(named) do
    local from = '[' .. q .. ' '
    if start_after ~= '' then
      from = '(' .. q .. ' ' .. start_after
    end
    streams[i] = {
      q = q, from = from, to = '(' .. q .. '!', buf = {}, pos = 1, n = 0, ids = {}, places = {}, placed = 0,
      done = false, chunk = math.max(1, math.min(limit + hint_size, scan_bound, CHUNK)),
      order = nil,
    }
  end
  local single = #streams == 1

  local function fill(s)
    local members = redis.call('ZRANGEBYLEX', ready, s.from, s.to, 'LIMIT', 0, s.chunk)
    local n = #members
    s.buf, s.pos, s.n = members, 1, n
    s.ids, s.places, s.placed = {}, {}, 0
    s.done = n < s.chunk
    if n > 0 then
      s.from = '(' .. members[n]
    end
    s.chunk = math.min(2 * s.chunk, CHUNK)
  end

  -- The ids and placements of the next `want` entries of a stream's chunk from `pos`
  -- (at most the chunk's end), read in one HMGET: the placements the walk is about to
  -- judge, never those of the entries it only passes on as a hint. An entry without a
  -- placement reads as false.
  local function read_places(s, pos, want)
    local last = math.min(s.n, pos + want - 1)
    local ids, buf = s.ids, s.buf
    for i = pos, last do
      ids[i] = string.sub(buf[i], -36)
    end
    local got = redis.call('HMGET', placements, unpack(ids, pos, last))
    local places = s.places
    for i = pos, last do
      places[i] = got[i - pos + 1]
    end
    s.placed = last
  end

  -- The stream whose head is the next entry of the merged ready order, nil at the end.
  -- Each head's order key is cut out once (`s.order`).
  local function next_stream()
    local best, best_order
    for i = 1, #streams do
      local s = streams[i]
      if s.pos > s.n and not s.done then
        fill(s)
      end
      if s.pos <= s.n then
        if single then
          return s
        end
        local order = s.order
        if not order then
          order = string.sub(s.buf[s.pos], -72, -37)
          s.order = order
        end
        if not best or order_less(order, best_order) then
          best, best_order = s, order
        end
      end
    end
    return best
  end

  -- Moves past the next entry of the merged ready order, counting it as examined:
  -- returns its stream and its position in the stream's chunk, nil at the end.
  local examined, last = 0, nil
  local function step()
    local s = next_stream()
    if not s then
      return nil
    end
    local pos = s.pos
    s.pos, s.order = pos + 1, nil
    examined = examined + 1
    last = s.buf[pos]
    return s, pos
  end

  -- The walk without a preference, in one pass: the jobs that fit are taken in ready
  -- order. A job this call holds is judged by its own record, which the lease reads
  -- anyway, so a claim whose jobs all fit reads no placement index at all. A job it
  -- does not hold is judged by the placement index: the first one that fits ends the
  -- walk (nothing behind it can be leased now; contended calls meet it at once, and
  -- stopping there keeps them cheap) and heads the hint, then the ready order behind
  -- it, as claim.lua's: a job there that does not fit is held by the next call, not
  -- taken. An unreadable one not held goes into the hint, to be buried by the next
  -- call. Once the walk meets a job that does not fit, it reads the index for the rest
  -- of the chunk in one HMGET, and a held job the index says does not fit is passed
  -- over unread (its record, payload and all, is not read for nothing). Where a record
  -- and the index disagree, the record decides and the index is set from it.
  local function walk_in_ready_order()
    local leased, stopped, unheld_bad = 0, nil, {}
    while leased < limit do
      if examined >= scan_bound then
        stop = string.sub(last, -72)
        break
      end
      local s, pos = step()
      if not s then
        break
      end
      local member = s.buf[pos]
      local id = string.sub(member, -36)
      local job = held[id]
      local indexed = pos <= s.placed
      if job and not (indexed and judge(s.places[pos]) == 'no') then
        local v = read_for_claim(job)
        local verdict = v[1] == 'queued' and judge(v[10])
        if verdict == 'fit' and not admit(s.q, id, v[11]) then
          -- Held back by its queue's limits: passed over, as a job that does not fit.
          verdict = 'held'
        end
        if verdict == 'no' and not indexed then
          read_places(s, pos, s.n)
          indexed = true
        end
        if verdict and indexed and s.places[pos] ~= v[10] then
          repaired[#repaired + 1] = { id, v[10] }
        end
        if verdict == 'bad' then
          decide_bury(d, job, v, member, s.q, id, 'field placement unreadable')
        elseif verdict ~= 'no' and verdict ~= 'held' and decide(job, v, member, s.q, id) == 'leased' then
          leased = leased + 1
        end
      elseif not job then
        if not indexed then
          read_places(s, pos, s.n)
        end
        local verdict = judge(s.places[pos])
        if verdict == 'fit' and admit(s.q, id) then
          stopped = id
          break
        elseif verdict == 'bad' and #unheld_bad < hint_size then
          unheld_bad[#unheld_bad + 1] = id
        end
      end
    end
    if stopped or #unheld_bad > 0 then
      more = 1
    end
    if stopped then
      hint[1] = stopped
    end
    for _, id in ipairs(unheld_bad) do
      hint[#hint + 1] = id
    end
    while examined < scan_bound and #hint < hint_size do
      local s, pos = step()
      if not s then
        return
      end
      hint[#hint + 1] = string.sub(s.buf[pos], -36)
    end
  end

  -- The jobs that fit in the priority band being read: preferred ones, then the others,
  -- each in ready order. A band is closed into the selection when the walk leaves it.
  -- The limits' slots go in that order too (K1 with F5): a preferred job is admitted as
  -- the walk meets it, the others only when the band closes, after every preferred one.
  local band, first, rest = nil, {}, {}
  local function close_band()
    for _, e in ipairs(first) do
      if #selected < limit then
        selected[#selected + 1] = e
      else
        extra_first[#extra_first + 1] = e
      end
    end
    for _, e in ipairs(rest) do
      if #selected < limit then
        if admit(e[3], string.sub(e[1], -36)) then
          selected[#selected + 1] = e
        end
      else
        extra[#extra + 1] = e
      end
    end
    first, rest = {}, {}
  end

  -- The walk with preferred localities: the order is priority, then preferred first,
  -- then ready order (FitOrder). Entries are only built into tables for the jobs that
  -- fit: most of a long walk is over jobs that do not.
  local function walk_by_preference()
    local pending = nil
    while true do
      if examined >= scan_bound then
        stop = string.sub(last, -72)
        break
      end
      local s, pos = step()
      if not s then
        break
      end
      -- The band is read to its end: placements come a chunk at a time.
      if pos > s.placed then
        read_places(s, pos, s.n)
      end
      local member, place = s.buf[pos], s.places[pos]
      -- The first 4 hex digits of the order key are the (inverted) priority.
      local b = string.sub(member, -72, -69)
      if b ~= band then
        close_band()
        band = b
        if #selected >= limit then
          pending = { member, place, s.q }
          break
        end
      end
      local verdict, pref = judge(place)
      if verdict == 'fit' and pref and not admit(s.q, string.sub(member, -36)) then
        verdict = 'held'
      end
      if verdict == 'fit' then
        if pref then
          first[#first + 1] = { member, place, s.q }
        else
          rest[#rest + 1] = { member, place, s.q }
        end
        -- Nothing later can move ahead of what was read once the preferred jobs of this
        -- band fill the claim.
        if #selected + #first >= limit then
          break
        end
      elseif verdict == 'bad' and #bad < hint_size then
        bad[#bad + 1] = { member, place, s.q }
      end
    end
    close_band()

    -- Hints from what was read already: the jobs that fit right behind the selection,
    -- looking on for preferred ones when the claim prefers (the next claim takes those
    -- first, wherever they are in their band).
    -- As many as the hint holds, so the next claim of this size holds every job it
    -- selects and needs one call (what claim.lua's hint of the head gives a plain claim).
    local wanted = hint_size
    local function hinted(member, place, queue)
      local verdict, pref = judge(place)
      if verdict == 'fit' and pref then
        extra_first[#extra_first + 1] = { member, place, queue }
      elseif verdict == 'fit' then
        extra[#extra + 1] = { member, place, queue }
      end
    end
    if pending then
      hinted(pending[1], pending[2], pending[3])
    end
    while examined < scan_bound and #extra_first < wanted do
      local s, pos = step()
      if not s then
        break
      end
      if pos > s.placed then
        read_places(s, pos, s.n)
      end
      hinted(s.buf[pos], s.places[pos], s.q)
    end
  end

  if np == 0 then
    walk_in_ready_order()
  else
    walk_by_preference()
  end
end

-- Pass 1 of the walks judged by the index: read and decide, no writes.
local blocked = false
for _, e in ipairs(selected) do
  local member, place, queue = e[1], e[2], e[3]
  local id = string.sub(member, -36)
  local job = held[id]
  if blocked or not job then
    -- Leasing a job behind this one would break the order.
    blocked = true
    hint[#hint + 1] = id
  else
    local v = read_for_claim(job)
    if v[1] == 'queued' and v[10] ~= place then
      repaired[#repaired + 1] = { id, v[10] }
      blocked = true
      hint[#hint + 1] = id
    elseif decide(job, v, member, queue, id) ~= 'leased' then
      more = 1
    end
  end
end
if blocked then
  more = 1
end
for _, e in ipairs(bad) do
  local member, place, queue = e[1], e[2], e[3]
  local id = string.sub(member, -36)
  local job = held[id]
  if not job then
    hint[#hint + 1] = id
    more = 1
  else
    -- The fields decide_claim reads (the concurrency key among them): this is the rare
    -- path of an unreadable placement.
    local v = read_for_claim(job)
    if v[1] == 'queued' and v[10] ~= place then
      repaired[#repaired + 1] = { id, v[10] }
      hint[#hint + 1] = id
      more = 1
    elseif v[1] == 'queued' then
      decide_bury(d, job, v, member, queue, id, 'field placement unreadable')
    else
      decide(job, v, member, queue, id)
    end
  end
end
for _, group in ipairs({ extra_first, extra }) do
  for _, e in ipairs(group) do
    if #hint >= hint_size then
      break
    end
    hint[#hint + 1] = string.sub(e[1], -36)
  end
end

-- The start logs the leases add to (K4), read before the first write.
local starts, logs = {}, {}
for _, e in ipairs(d.lease) do
  local a = admissions[e[3]]
  if a then
    local queue, key = e[3], e[2][11]
    if a.l.ms then
      local field = 's ' .. queue
      starts[field] = { (starts[field] or { 0 })[1] + 1, a.l.ms_per }
    end
    if a.l.msk and key then
      local field = 'k ' .. queue .. ' ' .. key
      starts[field] = { (starts[field] or { 0 })[1] + 1, a.l.msk_per }
    end
  end
end
for field, _ in pairs(starts) do
  logs[field] = redis.call('HGET', flow, field) or ''
end

-- Pass 2: writes.
local now_n = tonumber(now)
for field, s in pairs(starts) do
  redis.call('HSET', flow, field, log_add(logs[field], now_n - s[2], now_n, s[1]))
end
zrem_members(kleases, stale_leases)
local leased, buried = write_claim(ready, leases, list, running, finished, d, worker, expires, now,
  ckeys, kready, kleases, events)
for _, v in ipairs(leased) do
  claimed[#claimed + 1] = v
end
for _, id in ipairs(buried) do
  corrupt[#corrupt + 1] = id
end
hdel_fields(placements, unplaced)
for _, r in ipairs(repaired) do
  if r[2] then
    redis.call('HSET', placements, r[1], r[2])
  else
    redis.call('HDEL', placements, r[1])
  end
end

return { 'ok', claimed, hint, corrupt, more, stop }
