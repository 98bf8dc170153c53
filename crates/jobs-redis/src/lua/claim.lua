-- claim.lua: leases the first ready jobs of the named queues, in claim order
-- (CONTRACT C1-C9).
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] lease index (zset)   KEYS[4] list index (zset)
-- KEYS[5] running counters (hash: queue -> lease entries)
-- KEYS[5+i] the hash of candidate i, whose id is ARGV[7+Q+i]
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
--                             token (both as now stored), error, cancel, payload; the rest
--                             of the record is what this call wrote from its ARGV (state
--                             running, worker, lease_exp, started = hb = now) or absent on
--                             a queued job (finished, result), so Rust fills it in without
--                             the script reading and returning it; hint: the ids now at the
--                             head of the ready order (at most the hint size), for the next
--                             call; corrupt: ids of jobs whose `meta` cannot be read, which
--                             are not leased and leave the ready index (so one bad record
--                             cannot block a queue; `get` reports it as corrupt)
--
-- The script only touches hashes passed in KEYS, so it cannot follow the ready index to
-- a job it was not given. It walks the merged head of the named queues in order and
-- leases each entry whose hash it holds; at the first entry it does not hold it stops,
-- because leasing anything behind it would break the order. Rust then calls again with
-- the hint. Entries whose hash is gone are removed on the way (C7) and never written.
--
-- Atomicity: each job leaves the ready index and enters the lease index (and its queue's
-- running counter) in the same script that marks it running, so a crash never strands a
-- job in neither.

local now, worker, expires = ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local hint_size = tonumber(ARGV[5])
local bound = tonumber(ARGV[6])
local nq = tonumber(ARGV[7])
local ready, sched, leases, list, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

if not promote(ready, sched, now, bound) then
  return { 'promote' }
end

local held = {}
for i = 1, #KEYS - 5 do
  held[ARGV[7 + nq + i]] = KEYS[5 + i]
end

-- The first `n` entries of the ready order over all named queues: each queue's range is
-- already in order, so a merge of the queues' heads (Q - 1 comparisons per entry).
local function head(n)
  if nq == 1 then
    local q = ARGV[8]
    return redis.call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
  end
  local parts, pos = {}, {}
  for i = 1, nq do
    local q = ARGV[7 + i]
    parts[i] = redis.call('ZRANGEBYLEX', ready, '[' .. q .. ' ', '(' .. q .. '!', 'LIMIT', 0, n)
    pos[i] = 1
  end
  local first = {}
  while #first < n do
    local best, best_order = nil, nil
    for i = 1, nq do
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
local taken = {}
local lease_pairs = {}  -- per queue: flat score/member list
local list_old = {}
for _, member in ipairs(head(limit)) do
  if #claimed >= limit then
    break
  end
  local id = string.sub(member, -36)
  local job = held[id]
  if not job then
    break
  end
  local queue = string.sub(member, 1, #member - 73)
  -- The reply's order (see the header), with the id in front: v[1] is overwritten by it.
  local v = redis.call('HMGET', job, 'state', 'meta', 'run_at', 'att', 'token', 'error',
    'cancel', 'payload')
  taken[#taken + 1] = member
  local state = v[1]
  if state == 'queued' and not meta_ok(v[2]) then
    corrupt[#corrupt + 1] = id
  elseif state == 'queued' then
    -- Counters are small integers: incremented and formatted exactly, in one write.
    local attempts = string.format('%d', (tonumber(v[4]) or 0) + 1)
    local token = string.format('%d', (tonumber(v[5]) or 0) + 1)
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
  elseif not state then
    -- The hash vanished under its index entries (C7): drop them, write nothing.
    list_old[#list_old + 1] = list_member(queue, 'queued', id)
  end
  -- Any other state means the entry is stale: it is only dropped.
end

zrem_members(ready, taken)
for queue, flat in pairs(lease_pairs) do
  zadd_pairs(leases, flat)
  redis.call('HINCRBY', running, queue, string.format('%d', #flat / 2))
end
zrem_members(list, list_old)

local hint = {}
for i, member in ipairs(head(hint_size)) do
  hint[i] = string.sub(member, -36)
end
return { 'ok', claimed, hint, corrupt }
