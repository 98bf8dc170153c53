-- claim.lua: leases the first ready jobs of the named queues, in claim order
-- (CONTRACT C1-C9). A claim that fits the worker (a budget, preferred localities or a
-- reservation, CONTRACT F2-F6) runs claim_fit.lua instead, so this one, the hot path,
-- never decodes a placement: it only hands the stored text back to Rust.
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] lease index (zset)   KEYS[4] list index (zset)
-- KEYS[5] running counters (hash: queue -> lease entries)
-- KEYS[6] finished index (zset)  KEYS[7] paused queues (set)
-- KEYS[7+i] the hash of candidate i, whose id is ARGV[7+Q+i]
--
-- ARGV[1] now (ms)             ARGV[2] worker
-- ARGV[3] lease expiry (ms)    ARGV[4] limit (>= 1)
-- ARGV[5] hint size            ARGV[6] promotion bound (due scheduled entries moved per call)
-- ARGV[7] Q, the number of queues; ARGV[8..7+Q] the queues (distinct)
-- ARGV[8+Q..] candidate ids (see KEYS)
--
-- Returns one of:
--   {'promote'}               more due scheduled jobs than the bound: some were moved to
--                             the ready index, nothing was claimed; call again
--   {'ok', claimed, hint, corrupt}
--                             claimed: one array per leased job: id, meta, run_at, att,
--                             token (both as now stored), error, cancel, payload, timeout,
--                             placement (needs and locality, decoded by Rust);
--                             the rest of the record is what this call wrote from its ARGV
--                             (state running, worker, lease_exp, started = hb = now) or
--                             absent on a queued job (finished, result), so Rust fills it in
--                             without the script reading and returning it; hint: the ids now
--                             at the head of the ready order (at most the hint size), for the
--                             next call; corrupt: ids of jobs whose record cannot be read
--                             (unreadable `meta`, `att` or `token`, or an unknown state),
--                             which this call moved to `dead` with last_error
--                             'corrupt record: ...' (CONTRACT §5, corrupt records), so one bad
--                             record neither blocks its queue nor leaves the indexes
--
-- The script only touches hashes passed in KEYS, so it cannot follow the ready index to
-- a job it was not given. It walks the merged head of the named queues in order and
-- leases each entry whose hash it holds; at the first entry it does not hold it stops,
-- because leasing anything behind it would break the order. Rust then calls again with
-- the hint. Entries whose hash is gone are removed on the way (C7) and never written.
--
-- Atomicity: each job leaves the ready index and enters the lease index (and its queue's
-- running counter) in the same script that marks it running, so a crash never strands a
-- job in neither. Every value read is checked before the first write (the running
-- counters before the promotion, the records in a first pass, see lib.lua).

local now, worker, expires = ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local hint_size = tonumber(ARGV[5])
local bound = tonumber(ARGV[6])
local nq = tonumber(ARGV[7])
local ready, sched, leases, list, running, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local paused = KEYS[7]

-- CONTRACT Q1: a paused queue gives no candidates.
local named = {}
for i = 1, nq do
  local q = ARGV[7 + i]
  if redis.call('SISMEMBER', paused, q) == 0 then
    named[#named + 1] = q
  end
end
check_counters(running, named)

if not promote(ready, sched, now, bound) then
  return { 'promote' }
end

local held = {}
for i = 1, #KEYS - 7 do
  held[ARGV[7 + nq + i]] = KEYS[7 + i]
end

-- The first `n` entries of the ready order over all named queues: each queue's range is
-- already in order, so a merge of the queues' heads (Q - 1 comparisons per entry).
local function head(n)
  if #named == 1 then
    local q = named[1]
    return redis.call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
  end
  local parts, pos = {}, {}
  for i = 1, #named do
    local q = named[i]
    parts[i] = redis.call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
    pos[i] = 1
  end
  local first = {}
  while #first < n do
    local best, best_order = nil, nil
    for i = 1, #named do
      local member = parts[i][pos[i]]
      if member then
        local order = string.sub(member, -72, -37)
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


local claimed = {}
local corrupt = {}
-- Pass 1: read and decide, no writes.
local d = claim_decisions()
for _, member in ipairs(head(limit)) do
  if #d.lease >= limit then
    break
  end
  local id = string.sub(member, -36)
  local job = held[id]
  if not job then
    break
  end
  decide_claim(d, job, read_for_claim(job), member, string.sub(member, 1, #member - 73), id)
end

-- Pass 2: writes.
local leased, buried = write_claim(ready, leases, list, running, done, d, worker, expires, now)
for _, v in ipairs(leased) do
  claimed[#claimed + 1] = v
end
for _, id in ipairs(buried) do
  corrupt[#corrupt + 1] = id
end

local hint = {}
for i, member in ipairs(head(hint_size)) do
  hint[i] = string.sub(member, -36)
end
return { 'ok', claimed, hint, corrupt }
