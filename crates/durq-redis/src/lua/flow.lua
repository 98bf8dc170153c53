-- flow.lua: flow control (CONTRACT K1-K5), the helpers of claim_limited.lua, prepended
-- after core.lua (see scripts.rs).
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing; it only defines
-- local functions that the script after it uses.
--
-- What flow control keeps (keys.rs names each key):
--   limits   hash, queue -> 'MR MRK MS MS_MS MSK MSK_MS FAIR', each count or window a
--            decimal integer or '-' for none, FAIR '1' or '0' (written by Rust,
--            store/flow.rs, from durq_core::StoredLimits)
--   flow     hash: 's QUEUE' the queue's start log, 'k QUEUE HEXKEY' a key's start log,
--            't QUEUE PRIO4' the hex key a fair queue's claims served last at a priority
--            ('' for the jobs without a key)
--   kready   zset, 'QUEUE PRIO4 HEXKEY ORDER ID': the ready jobs that have a key
--   kleases  zset, 'QUEUE HEXKEY ID': leases of jobs that have a key; an entry counts
--            while the lease index holds 'QUEUE ID'
--   ckeys    hash, id -> hex key of every job that has one
--
-- A start log is the starts of one window, oldest first, each LOG_WIDTH decimal digits
-- (a start time in ms, zero-padded), so counting the starts after an instant is one
-- binary search and trimming the ones before it one string.sub, without a table.
-- Times are compared as numbers (exact below 2^53; 15 digits stay below it), never as
-- strings: Lua's string `<` follows the server's locale.

local LOG_WIDTH = 15

-- The limits of one queue from its `limits` field, or nil for none. A field that does
-- not parse stops the script before any write (check before write, core.lua).
local function parse_limits(queue, text)
  if not text then
    return nil
  end
  local f = {}
  for word in string.gmatch(text, '%S+') do
    f[#f + 1] = word
  end
  local function count(i)
    local word = f[i]
    if word == '-' then
      return nil
    end
    local n = tonumber(word)
    if not n or n < 1 or n ~= math.floor(n) then
      abort_corrupt('limits of queue ' .. queue .. ': ' .. text)
    end
    return n
  end
  if #f ~= 7 or (f[7] ~= '0' and f[7] ~= '1') then
    abort_corrupt('limits of queue ' .. queue .. ': ' .. text)
  end
  local l = {
    mr = count(1),
    mrk = count(2),
    ms = count(3),
    ms_per = count(4),
    msk = count(5),
    msk_per = count(6),
    fair = f[7] == '1',
  }
  if (l.ms and not l.ms_per) or (l.msk and not l.msk_per) then
    abort_corrupt('limits of queue ' .. queue .. ': ' .. text)
  end
  l.keyed = l.mrk ~= nil or l.msk ~= nil
  return l
end

-- The number of starts in `log` after `after` (ms), and the position of the first of
-- them (1-based, in entries).
local function log_after(log, after)
  local n = #log / LOG_WIDTH
  local lo, hi = 1, n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local at = tonumber(string.sub(log, (mid - 1) * LOG_WIDTH + 1, mid * LOG_WIDTH))
    if at > after then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return n - lo + 1, lo
end

-- A start log with `count` starts at `now` added in place and the starts at or before
-- `after` (out of every window from now on) trimmed: '' when none is left.
local function log_add(log, after, now, count)
  local _, first = log_after(log, after)
  local kept = string.sub(log, (first - 1) * LOG_WIDTH + 1)
  -- Starts dated after `now` (a clock set back) stay after it.
  local _, later = log_after(kept, now)
  local cut = (later - 1) * LOG_WIDTH
  local stamp = string.format('%0' .. LOG_WIDTH .. 'd', now)
  return string.sub(kept, 1, cut) .. string.rep(stamp, count) .. string.sub(kept, cut + 1)
end

-- Whether byte string `a` sorts before `b` (memcmp order, as ZRANGEBYLEX): Lua's `<`
-- would follow the server's locale.
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- What one claim may still take of one queue with limits (K1, K2, K4): the running jobs
-- and starts it counted, in all and per key as it meets them, those it takes included.
-- `stale` collects kleases entries whose lease is gone, for the claim to remove.
local function admission(flow, running, kleases, leases, queue, limits, now, stale)
  local a = { queue = queue, l = limits, keys = {}, started = 0, now = now }
  a.running = tonumber(redis.call('HGET', running, queue) or '0')
  if limits.ms then
    a.started = log_after(redis.call('HGET', flow, 's ' .. queue) or '', now - limits.ms_per)
  end
  a.flow, a.kleases, a.leases, a.stale = flow, kleases, leases, stale
  return a
end

-- Whether the queue admits no job at all now (K2, K4).
local function admission_full(a)
  local l = a.l
  return (l.mr ~= nil and a.running >= l.mr) or (l.ms ~= nil and a.started >= l.ms)
end

-- A key's running jobs: its lease entries the lease index still holds. The others are
-- left behind by jobs that stopped running, and are collected for removal.
local function key_running(a, key)
  local prefix = a.queue .. ' ' .. key .. ' '
  local entries = redis.call('ZRANGEBYLEX', a.kleases, '[' .. prefix, '(' .. a.queue .. ' ' .. key .. '!')
  local n = 0
  for _, entry in ipairs(entries) do
    if redis.call('ZSCORE', a.leases, a.queue .. ' ' .. string.sub(entry, -36)) then
      n = n + 1
    else
      a.stale[#a.stale + 1] = entry
    end
  end
  return n
end

-- Whether a job with hex key `key` (false for none) may be taken; if so, counts it.
local function admission_take(a, key)
  if admission_full(a) then
    return false
  end
  local l = a.l
  if key and l.keyed then
    local k = a.keys[key]
    if not k then
      k = { running = 0 }
      a.keys[key] = k
    end
    if l.mrk then
      -- A key runs no more jobs than its queue: while the queue runs fewer than the
      -- per-key limit in all (this claim's takes included), no key is at it, and the
      -- key's own entries are not read.
      if not k.read and a.running >= l.mrk then
        k.running = k.running + key_running(a, key)
        k.read = true
      end
      if k.running >= l.mrk then
        return false
      end
    end
    if l.msk then
      if not k.started then
        k.started = log_after(redis.call('HGET', a.flow, 'k ' .. a.queue .. ' ' .. key) or '',
          a.now - l.msk_per)
      end
      if k.started >= l.msk then
        return false
      end
      k.started = k.started + 1
    end
    k.running = k.running + 1
  end
  a.running = a.running + 1
  a.started = a.started + 1
  return true
end
