-- trim_events.lua: deletes every event but the newest `keep` (CONTRACT V3), in one
-- step, and moves the trim marker to the newest id it deleted.
--
-- KEYS[1] event stream (core.lua, record_change)
-- KEYS[2] trim marker (string `MS-SEQ`: the newest id ever deleted; absent before the
--         first trim that deleted one), what events.lua reads as `trimmed_through`
-- ARGV[1] keep (>= 1, checked by the handle)
--
-- Returns how many entries it deleted.
--
-- The newest deleted id is what a reader needs (a read after a cursor older than it
-- missed events), and a stream does not keep it (XINFO's max-deleted-entry-id follows
-- XDEL, not XTRIM). So the trim is made in two: `XTRIM MAXLEN keep + 1` (exact) deletes
-- all but one of the entries to delete, the oldest entry left is then the newest to
-- delete (one `XRANGE … COUNT 1`), and `XTRIM MAXLEN keep` deletes it. No entry is read
-- but that one, so a trim costs the server its deletions (whole listpack nodes at a
-- time), however many entries it keeps.
--
-- Check before write: the marker is read and checked before the first XTRIM; it only
-- moves forward (ids compared as two decimal numbers, exact below 2^53: the ids the
-- server draws are milliseconds and a small sequence).

local events, marker = KEYS[1], KEYS[2]

-- The two numbers of an id `MS-SEQ`, or nil when it is not one.
local function parse_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if not ms then
    return nil
  end
  return tonumber(ms), tonumber(seq)
end

local current = redis.call('GET', marker)
local current_ms, current_seq = nil, nil
if current then
  current_ms, current_seq = parse_id(current)
  if not current_ms then
    abort_corrupt('event trim marker: not a stream id')
  end
end
local len = redis.call('XLEN', events)
local keep = tonumber(ARGV[1])
if len <= keep then
  return 0
end
-- keep < len: a count of entries, which a Lua number holds exactly.
local deleted = redis.call('XTRIM', events, 'MAXLEN', string.format('%d', keep + 1))
local newest = redis.call('XRANGE', events, '-', '+', 'COUNT', 1)[1][1]
deleted = deleted + redis.call('XTRIM', events, 'MAXLEN', ARGV[1])
local newest_ms, newest_seq = parse_id(newest)
if not current or newest_ms > current_ms or (newest_ms == current_ms and newest_seq > current_seq) then
  redis.call('SET', marker, newest)
end
return deleted
