-- list.lua: reads one page of a queue's list index, newest first (CONTRACT A4).
--
-- KEYS[1] list index (zset)
-- ARGV[1] queue                ARGV[2] state codes to read (e.g. 'a' or 'asdc'; 'a'
--                              holds queued and running jobs alike)
-- ARGV[3] cursor id, or '' for the first page
-- ARGV[4] page size
--
-- Returns one array of ids per state code, each newest first and at most a page long;
-- Rust merges them. Reading every state in one script gives one consistent snapshot.

local list, queue, codes, cursor, n = KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local out = {}
for i = 1, #codes do
  local prefix = queue .. ' ' .. string.sub(codes, i, i) .. ' '
  local high
  if cursor == '' then
    high = '(' .. queue .. ' ' .. string.sub(codes, i, i) .. '!'
  else
    high = '(' .. prefix .. cursor
  end
  local members = redis.call('ZREVRANGEBYLEX', list, high, '[' .. prefix, 'LIMIT', 0, n)
  local ids = {}
  for j, member in ipairs(members) do
    ids[j] = string.sub(member, -36)
  end
  out[i] = ids
end
return out
