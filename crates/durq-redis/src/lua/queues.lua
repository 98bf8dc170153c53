-- queues.lua: every queue of the namespace that holds a job, by name, with its counts
-- and the order key of its oldest ready job (CONTRACT A7), one page per call.
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] list index (zset)   KEYS[4] running counters (hash)
-- KEYS[5] concurrency keys (hash)   KEYS[6] kready (zset): kept by the promotion (core.lua)
-- ARGV[1] now (ms)             ARGV[2] promotion bound
-- ARGV[3] the last queue the previous call listed, or '' for the first call
-- ARGV[4] read budget: once the call has made this many range reads it starts no
--         further queue (a queue is always read whole, in one call)
--
-- Returns {'promote'} when more scheduled jobs are due than the bound (some were moved;
-- call again), {'corrupt', member} for a list index member without a queue, else
-- {'ok', next, rows}: one row {queue, counts, order key} per queue after ARGV[3], in
-- index order, with counts as queue_counts (lib.lua) gives them and the order key of the
-- queue's oldest ready job ('' when none is ready; a member whose key is not 36 hex
-- digits is returned as found, for Rust to report); `next` is '' when the index holds no
-- further queue, else the last queue listed (call again with it).
--
-- Queues are found in the list index (member `QUEUE C ID`, every job of every state),
-- one ZRANGEBYLEX per queue: the first member after the previous queue's range. Queue
-- names are [A-Za-z0-9._:-], so '(' .. queue .. '!' lies after every `QUEUE ` member
-- ('!' sorts after the space) and before the members of any longer name (every name
-- character sorts after '!').
--
-- The oldest ready job: the ready index orders a queue's jobs by inverted priority (4 hex
-- digits), then ready time (16), then sequence, so the first member of each priority
-- band holds the band's earliest ready time. The walk reads the head of the queue's
-- range, then jumps past its band ('(' .. queue .. ' ' .. band .. '~': hex digits sort
-- below '~'), one ZRANGEBYLEX per band, and keeps the smallest ready time. The 16-digit
-- times are compared as two exact 8-digit numbers, not with Lua's locale-dependent `<`.
--
-- Cost per queue: one range read to find it, seven counts (O(log n) each) and bands + 1
-- range reads; the backlog behind each band head is never read.

local ready, sched, list, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local after, budget = ARGV[3], tonumber(ARGV[4])
if not promote(ready, sched, ARGV[1], tonumber(ARGV[2]), KEYS[5], KEYS[6]) then
  return { 'promote' }
end

local reads = 0

-- Whether the ready time inside order key `a` is before the one inside `b`.
local function ready_before(a, b)
  local x, y = tonumber(string.sub(a, 5, 12), 16), tonumber(string.sub(b, 5, 12), 16)
  if x ~= y then
    return x < y
  end
  return tonumber(string.sub(a, 13, 20), 16) < tonumber(string.sub(b, 13, 20), 16)
end

-- The order key of `queue`'s oldest ready job, or '' when none is ready.
local function oldest_ready(queue)
  local best = ''
  local low, high = '[' .. queue .. ' ', '(' .. queue .. '!'
  local skip = #queue + 1
  while true do
    local head = redis.call('ZRANGEBYLEX', ready, low, high, 'LIMIT', 0, 1)[1]
    reads = reads + 1
    if not head then
      return best
    end
    local key = string.sub(head, skip + 1, skip + 36)
    if #key ~= 36 or not string.find(key, '^%x+$') then
      return key
    end
    if best == '' or ready_before(key, best) then
      best = key
    end
    low = '(' .. queue .. ' ' .. string.sub(key, 1, 4) .. '~'
  end
end

local rows = {}
local low = '-'
if after ~= '' then
  low = '(' .. after .. '!'
end
while true do
  if reads >= budget and #rows > 0 then
    return { 'ok', rows[#rows][1], rows }
  end
  local member = redis.call('ZRANGEBYLEX', list, low, '+', 'LIMIT', 0, 1)[1]
  reads = reads + 1
  if not member then
    return { 'ok', '', rows }
  end
  local space = string.find(member, ' ', 1, true)
  if not space or space == 1 then
    return { 'corrupt', member }
  end
  local queue = string.sub(member, 1, space - 1)
  local counts = queue_counts(ready, list, running, queue)
  reads = reads + 7
  rows[#rows + 1] = { queue, counts, oldest_ready(queue) }
  low = '(' .. queue .. '!'
end
