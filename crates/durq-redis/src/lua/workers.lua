-- workers.lua: the live workers of a namespace (CONTRACT W1-W4). A worker's record is
-- three entries under its id: its spec (opaque text) in the specs hash, its jobs in
-- flight in the busy hash, its last report (ms) as its score in the seen zset. The
-- record exists exactly when the specs hash has the id; an entry of the other two
-- without one is a leftover that reap and delete remove and nothing reports.
--
-- KEYS[1] specs (hash: id -> spec)   KEYS[2] busy (hash: id -> in flight)
-- KEYS[3] seen (zset: score last seen in ms, member id)
-- ARGV[1] the operation: 'put', 'touch', 'delete', 'read' or 'reap'
-- put:    ARGV[2] id, ARGV[3] spec, ARGV[4] now (ms), ARGV[5] in flight: replaces the
--         record whole, last seen now. Returns 1.
-- touch:  ARGV[2] id, ARGV[3] in flight, ARGV[4] now (ms): sets in flight and last seen
--         of a known worker. Returns 1, or 0 (nothing written) when the id is unknown.
-- delete: ARGV[2] id: removes the three entries. Returns 1 when the record existed.
-- read:   Returns {id, spec, in flight or false, last seen or false, ...} for every
--         record, in no particular order (Rust sorts by id and checks the values).
-- reap:   ARGV[2] cutoff (ms), ARGV[3] limit: removes the workers last seen strictly
--         before the cutoff, at most `limit` seen entries per call, oldest first.
--         Returns {examined, {ids of the removed records}}; Rust calls again while
--         `examined` is the limit.

local specs, busy, seen = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

if op == 'put' then
  local id = ARGV[2]
  redis.call('HSET', specs, id, ARGV[3])
  redis.call('HSET', busy, id, ARGV[5])
  redis.call('ZADD', seen, ARGV[4], id)
  return 1
end

if op == 'touch' then
  local id = ARGV[2]
  if redis.call('HEXISTS', specs, id) == 0 then
    return 0
  end
  redis.call('HSET', busy, id, ARGV[3])
  redis.call('ZADD', seen, ARGV[4], id)
  return 1
end

if op == 'delete' then
  local id = ARGV[2]
  local existed = redis.call('HDEL', specs, id)
  redis.call('HDEL', busy, id)
  redis.call('ZREM', seen, id)
  return existed
end

if op == 'read' then
  local all = redis.call('HGETALL', specs)
  local out = {}
  for i = 1, #all, 2 do
    local id = all[i]
    out[#out + 1] = id
    out[#out + 1] = all[i + 1]
    -- false (a nil reply) when missing, so the table keeps its length.
    out[#out + 1] = redis.call('HGET', busy, id)
    out[#out + 1] = redis.call('ZSCORE', seen, id)
  end
  return out
end

if op == 'reap' then
  local silent = redis.call('ZRANGEBYSCORE', seen, '-inf', '(' .. ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
  local reaped = {}
  for _, id in ipairs(silent) do
    if redis.call('HDEL', specs, id) == 1 then
      reaped[#reaped + 1] = id
    end
    redis.call('HDEL', busy, id)
    redis.call('ZREM', seen, id)
  end
  return { #silent, reaped }
end

return redis.error_reply('workers.lua: unknown operation ' .. tostring(op))
