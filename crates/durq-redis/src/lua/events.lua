-- events.lua: reads the event stream after a cursor (CONTRACT V2, V3): its entries and
-- the newest id a trim deleted, in one step, so a trim between the two reads cannot
-- hide a gap (entries read after a trim that the marker does not show yet).
--
-- KEYS[1] event stream (core.lua, record_change)
-- KEYS[2] trim marker (string: the newest id trim_events.lua deleted; absent before)
-- ARGV[1] where the range starts, inclusive: '-' for the stream's start, else the
--         smallest id above the cursor (store/events.rs, `range_start`)
-- ARGV[2] the most entries to answer (1..1,000, checked by the handle)
--
-- Returns {marker or false, entries}: entries as XRANGE answers them ({id, {field,
-- value, ...}} each, oldest first), decoded by Rust (store/events.rs), which refuses an
-- entry it cannot read as `Corrupt`. Reads only.

local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
return { redis.call('GET', KEYS[2]), entries }
