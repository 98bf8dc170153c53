-- list.lua: the first step of a `list` page (CONTRACT A4): the ids of the jobs of the
-- queues and states asked for, newest first, after the cursor. list_rows.lua, the second
-- step, reads their records, filters them by tenant and tags and returns the rows.
--
-- KEYS[1] list index (zset)    KEYS[2] lease index (zset)
-- ARGV[1] the queue, or '' for every queue
-- ARGV[2] a queue-name prefix, or '' for none (only used when ARGV[1] is '')
-- ARGV[3] the state codes whose list-index ranges are read: any of 'a', 's', 'd', 'c'
--         ('a' holds queued and running jobs alike)
-- ARGV[4] 'q' when only the queued jobs of code 'a' are wanted (the running ones, named
--         by the lease index, are skipped), else ''
-- ARGV[5] '1' to read the running jobs from the lease index (a page of running jobs
--         only: code 'a' is then not read), else ''
-- ARGV[6] the cursor id (exclusive), or '' for the first page
-- ARGV[7] the most ids to return (>= 1)
--
-- Returns {ids, queue numbers, queues, exhausted}: the ids newest first, for each the
-- number of its queue in `queues` (so a record whose own queue cannot be read is shown
-- with the one its index entry names), and exhausted = 1 when no further id follows
-- (the page can end there), else 0.
--
-- No new index: each (queue, code) range of the list index (members `QUEUE CODE ID`, lex
-- ordered) is already newest last by id, so the ranges are read backwards from the
-- cursor and merged by id, as a heap of range heads. Queues are found as queues.lua
-- finds them, one ZRANGEBYLEX per queue, within the members starting with the prefix
-- when there is one (queue names are [A-Za-z0-9._:-], so '(' .. prefix .. '\255' lies
-- after all of them). Each range is read in chunks, the first about want / ranges long,
-- each next one twice as long, so a page of many queues reads little more than it
-- returns. The lease index (one entry per running job) is read whole, only when the
-- page asks for running jobs without queued ones or the other way round.
--
-- Ids are compared as three exact numbers (id_key), never with Lua's locale-dependent
-- `<`. A member whose id is not one is skipped, like a member that names no queue: a
-- damaged index entry never breaks listing. Writes nothing.

local list, leases = KEYS[1], KEYS[2]
local only_queue, prefix, codes = ARGV[1], ARGV[2], ARGV[3]
local queued_only, running_stream = ARGV[4] == 'q', ARGV[5] == '1'
local cursor, want = ARGV[6], tonumber(ARGV[7])

-- An id as three numbers of at most 48 bits (exact in a double), in id order; nil when
-- the text is no id.
local function id_key(id)
  if #id ~= 36 then
    return nil
  end
  local a = tonumber(string.sub(id, 1, 8) .. string.sub(id, 10, 13), 16)
  local b = tonumber(string.sub(id, 15, 18) .. string.sub(id, 20, 23) .. string.sub(id, 25, 28), 16)
  local c = tonumber(string.sub(id, 29, 36), 16)
  if not a or not b or not c then
    return nil
  end
  return a, b, c
end

local function key_less(a1, b1, c1, a2, b2, c2)
  if a1 ~= a2 then
    return a1 < a2
  end
  if b1 ~= b2 then
    return b1 < b2
  end
  return c1 < c2
end

local ca, cb, cc = nil, nil, nil
if cursor ~= '' then
  ca, cb, cc = id_key(cursor)
end

-- The queues.
local queues = {}
if only_queue ~= '' then
  queues[1] = only_queue
else
  local low, high = '-', '+'
  if prefix ~= '' then
    low, high = '[' .. prefix, '(' .. prefix .. '\255'
  end
  while true do
    local member = redis.call('ZRANGEBYLEX', list, low, high, 'LIMIT', 0, 1)[1]
    if not member then
      break
    end
    local space = string.find(member, ' ', 1, true)
    if not space or space == 1 then
      low = '(' .. member
    else
      local queue = string.sub(member, 1, space - 1)
      queues[#queues + 1] = queue
      low = '(' .. queue .. '!'
    end
  end
end
local queue_number = {}
for i, queue in ipairs(queues) do
  queue_number[queue] = i
end

-- Whether a lease entry's queue is one of the page's.
local function queue_wanted(queue)
  if only_queue ~= '' then
    return queue == only_queue
  end
  return prefix == '' or string.sub(queue, 1, #prefix) == prefix
end

-- A stream: ids newest first with their keys (ids, a, b, c; the head at pos, n of them),
-- refilled from its range (high, low, size, more) of queue number q, or (the running
-- stream) a whole sorted array with a queue number per id (qs). skip_running: the
-- stream of code 'a' on a page of queued jobs only.
local streams = {}

local function fill(s, members)
  local n = 0
  for _, member in ipairs(members) do
    local id = string.sub(member, -36)
    local a, b, c = id_key(id)
    if a then
      n = n + 1
      s.ids[n], s.a[n], s.b[n], s.c[n] = id, a, b, c
    end
  end
  s.n, s.pos = n, 1
end

-- Reads the next chunk of a list-index stream; false when it has no entry left.
local function refill(s)
  while s.more do
    local members = redis.call('ZREVRANGEBYLEX', list, s.high, s.low, 'LIMIT', 0, s.size)
    s.more = #members == s.size
    if #members > 0 then
      s.high = '(' .. members[#members]
    end
    s.size = math.min(s.size * 2, want)
    s.ids, s.a, s.b, s.c = {}, {}, {}, {}
    fill(s, members)
    if s.n > 0 then
      return true
    end
  end
  return false
end

-- The number of `queue` in `queues`. A running job's queue is always among them (every
-- job has a list entry); one that is not is added, so its job is still shown.
local function number_of(queue)
  local n = queue_number[queue]
  if not n then
    queues[#queues + 1] = queue
    n = #queues
    queue_number[queue] = n
  end
  return n
end

-- The running jobs (lease entries `QUEUE ID`): a set of ids for a page of queued jobs,
-- a stream of their own (sorted here, newest first) for a page of running ones.
local running = {}
if running_stream or queued_only then
  local entries = {}
  for _, member in ipairs(redis.call('ZRANGE', leases, 0, -1)) do
    local id = string.sub(member, -36)
    running[id] = true
    local queue = string.sub(member, 1, #member - 37)
    if running_stream and queue_wanted(queue) then
      local a, b, c = id_key(id)
      if a and (not ca or key_less(a, b, c, ca, cb, cc)) then
        entries[#entries + 1] = { id, a, b, c, number_of(queue) }
      end
    end
  end
  if #entries > 0 then
    table.sort(entries, function(x, y)
      return key_less(y[2], y[3], y[4], x[2], x[3], x[4])
    end)
    local s = { ids = {}, a = {}, b = {}, c = {}, qs = {}, pos = 1, n = #entries, more = false }
    for i, e in ipairs(entries) do
      s.ids[i], s.a[i], s.b[i], s.c[i], s.qs[i] = e[1], e[2], e[3], e[4], e[5]
    end
    streams[#streams + 1] = s
  end
end

local ranges = #queues * #codes
local first = math.max(1, math.min(want, math.ceil(want / math.max(ranges, 1))))
for qi, queue in ipairs(queues) do
  for i = 1, #codes do
    local code = string.sub(codes, i, i)
    local head = queue .. ' ' .. code .. ' '
    local high = '(' .. queue .. ' ' .. code .. '!'
    if ca then
      high = '(' .. head .. cursor
    end
    local s = { high = high, low = '[' .. head, size = first, more = true, q = qi,
      skip_running = queued_only and code == 'a' }
    if refill(s) then
      streams[#streams + 1] = s
    end
  end
end

-- A max-heap of the streams by their head ids.
local heap = {}
local function above(i, j)
  local s, t = streams[heap[i]], streams[heap[j]]
  return key_less(t.a[t.pos], t.b[t.pos], t.c[t.pos], s.a[s.pos], s.b[s.pos], s.c[s.pos])
end
local function swap(i, j)
  heap[i], heap[j] = heap[j], heap[i]
end
local function sift_down(i)
  local n = #heap
  while true do
    local l, r, top = 2 * i, 2 * i + 1, i
    if l <= n and above(l, top) then
      top = l
    end
    if r <= n and above(r, top) then
      top = r
    end
    if top == i then
      return
    end
    swap(i, top)
    i = top
  end
end
for i = 1, #streams do
  heap[i] = i
end
for i = math.floor(#heap / 2), 1, -1 do
  sift_down(i)
end

local ids, numbers = {}, {}
while #ids < want and #heap > 0 do
  local s = streams[heap[1]]
  local id = s.ids[s.pos]
  if not (s.skip_running and running[id]) then
    ids[#ids + 1] = id
    numbers[#numbers + 1] = s.qs and s.qs[s.pos] or s.q
  end
  s.pos = s.pos + 1
  if s.pos > s.n and not refill(s) then
    heap[1] = heap[#heap]
    heap[#heap] = nil
  end
  if #heap > 0 then
    sift_down(1)
  end
end
return { ids, numbers, queues, #heap == 0 and 1 or 0 }
