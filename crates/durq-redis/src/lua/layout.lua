-- layout.lua: records how a partitioned namespace is laid out the first time a store
-- opens it, and answers what an earlier open recorded, so no store works on a namespace
-- laid out otherwise than it expects. Partitioned opens only: an unpartitioned open
-- reads the record with a plain HMGET (config.rs), which needs only read access (CONTRACT §8; docs/redis.md, "Partitioned namespaces").
--
-- KEYS[1] the layout record (hash: partitions, version)
-- KEYS[2] the list index of the unpartitioned layout: it exists once an unpartitioned
--         store has written a job there
-- ARGV[1] the number of partitions the store opens with (decimal)
-- ARGV[2] the key layout version the store writes (decimal)
--
-- Returns {'ok'} (recorded now, or recorded before as given), {'partitions', recorded}
-- (another partition count), {'version', recorded} (another key layout), or
-- {'unpartitioned'} (a partitioned open of a namespace whose jobs an unpartitioned store
-- wrote before). Nothing is written but the first record of a partitioned namespace;
-- an unpartitioned namespace of version 1 has no record, as before records existed.
local found = redis.call('HMGET', KEYS[1], 'partitions', 'version')
if found[1] then
  if found[1] ~= ARGV[1] then
    return { 'partitions', found[1] }
  end
  if found[2] ~= ARGV[2] then
    return { 'version', found[2] or '' }
  end
  return { 'ok' }
end
-- No record: the namespace is new, or an unpartitioned store of this layout wrote it
-- (those write no record, so that opening one writes nothing).
if ARGV[1] == '1' then
  return { 'ok' }
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return { 'unpartitioned' }
end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'version', ARGV[2])
return { 'ok' }
