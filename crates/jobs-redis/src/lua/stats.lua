-- stats.lua: counts one queue's jobs per state from index sizes (CONTRACT A3).
--
-- KEYS[1] ready index (zset)   KEYS[2] scheduled index (zset)
-- KEYS[3] list index (zset)
-- ARGV[1] now (ms)             ARGV[2] promotion bound
-- ARGV[3] queue
--
-- Returns {'promote'} when more scheduled jobs are due than the bound (some were moved;
-- call again), else {'ok', ready, queued, running, succeeded, dead, cancelled}.
-- Scheduled = queued - ready, once every due job is in the ready index.
--
-- Cost: O(log n) per count (ZLEXCOUNT), whatever the backlog.

local ready, sched, list = KEYS[1], KEYS[2], KEYS[3]
local queue = ARGV[3]
if not promote(ready, sched, ARGV[1], tonumber(ARGV[2])) then
  return { 'promote' }
end
local function count_state(code)
  local prefix = queue .. ' ' .. code
  return redis.call('ZLEXCOUNT', list, '[' .. prefix .. ' ', '(' .. prefix .. '!')
end
return { 'ok',
  redis.call('ZLEXCOUNT', ready, '[' .. queue .. ' ', '(' .. queue .. '!'),
  count_state('q'), count_state('r'), count_state('s'), count_state('d'), count_state('c') }
