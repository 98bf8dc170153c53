-- schedule.lua: writes one schedule (CONTRACT S1, S2). Three hashes keyed by schedule
-- name hold its definition, whether it is enabled and its last tick, so each write
-- changes exactly the fields it is about.
--
-- KEYS[1] definitions (hash)   KEYS[2] enabled flags (hash: '1' / '0')
-- KEYS[3] last ticks (hash, ms)
-- ARGV[1] the operation: 'put', 'update' or 'delete'      ARGV[2] the name
-- put:    ARGV[3] the definition, ARGV[4] now (ms): a new schedule starts enabled, its
--         last tick now; a known one keeps both.
-- update: ARGV[3] '1' / '0' / '' (enabled unchanged), ARGV[4] a tick (ms) or '': the
--         last tick only moves forward.
-- delete: removes the three fields.
--
-- Returns 1, or 0 when an update or delete found no such schedule.

local specs, enabled, last = KEYS[1], KEYS[2], KEYS[3]
local op, name = ARGV[1], ARGV[2]
if op == 'put' then
  redis.call('HSET', specs, name, ARGV[3])
  redis.call('HSETNX', enabled, name, '1')
  redis.call('HSETNX', last, name, ARGV[4])
  return 1
end
if redis.call('HEXISTS', specs, name) == 0 then
  return 0
end
if op == 'delete' then
  redis.call('HDEL', specs, name)
  redis.call('HDEL', enabled, name)
  redis.call('HDEL', last, name)
  return 1
end
if ARGV[3] ~= '' then
  redis.call('HSET', enabled, name, ARGV[3])
end
if ARGV[4] ~= '' then
  local current = tonumber(redis.call('HGET', last, name))
  if not current or tonumber(ARGV[4]) > current then
    redis.call('HSET', last, name, ARGV[4])
  end
end
return 1
