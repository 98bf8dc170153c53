-- layout.lua: records how a namespace is laid out, upgrades a namespace of layout 1 in
-- place, and answers what an earlier open recorded otherwise, so no store works on a
-- namespace laid out otherwise than it expects (CONTRACT §8; docs/redis.md, "Layout
-- versions" and "Partitioned namespaces"). config.rs reads the record with a plain
-- HMGET first and calls this only when it is missing or not this layout's; an
-- unpartitioned open calls it only when the namespace holds jobs, so opening a new
-- namespace (a probe, a read of a namespace that does not exist) writes nothing.
--
-- KEYS[1] the layout record (hash: partitions, version)
-- KEYS[2] the list index of the unpartitioned layout: it exists once an unpartitioned
--         store has written a job there
-- ARGV[1] the number of partitions the store opens with (decimal)
-- ARGV[2] the key layout version the store writes (decimal)
--
-- Returns {'ok'} (recorded now, upgraded now, nothing to record yet, or recorded before
-- as given), {'partitions', recorded} (another partition count), {'version',
-- recorded} (another key layout, neither this one nor 1), or {'unpartitioned'} (a
-- partitioned open of a namespace whose jobs an unpartitioned store wrote before).
--
-- Layout 1 wrote no record for an unpartitioned namespace, so a namespace without one
-- is new or of layout 1. Version 2 reads everything version 1 wrote (it differs only in
-- where finished jobs are recorded, and purge and retry read both places), so the
-- upgrade is this one write, made while stores of either version run; stores of
-- layout 1 refuse to open the namespace once it is recorded as version 2. A partitioned
-- namespace is recorded by its first open, jobs or not: the count is fixed from then.
local found = redis.call('HMGET', KEYS[1], 'partitions', 'version')
if found[1] then
  if found[1] ~= ARGV[1] then
    return { 'partitions', found[1] }
  end
  if found[2] ~= ARGV[2] and found[2] ~= '1' then
    return { 'version', found[2] or '' }
  end
else
  local holds_jobs = redis.call('EXISTS', KEYS[2]) == 1
  if ARGV[1] ~= '1' and holds_jobs then
    return { 'unpartitioned' }
  end
  if ARGV[1] == '1' and not holds_jobs then
    return { 'ok' }
  end
end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'version', ARGV[2])
return { 'ok' }
