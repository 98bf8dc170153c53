-- list_rows.lua: the second step of a `list` page (CONTRACT A4): reads the records of
-- the candidates list.lua found, in their order, keeps those of the tenant and tags
-- asked for, and returns their rows, until it has as many as the page still needs.
--
-- KEYS[i] the hash of candidate i, i = 1..N, newest first
-- ARGV[1] the most rows to return (>= 1)
-- ARGV[2] '=' and the tenant (exact; '=' alone: the default tenant), or '' for every
--         tenant
-- ARGV[3] T, the number of tags; ARGV[3+t], t = 1..T: tag t as codec::tag_pattern
--         writes it, `"key":"value"` as it stands in the stored tags
-- ARGV[4+T] F, the number of fields; ARGV[4+T+f], f = 1..F: the fields of a row
--         (codec::JOB_FIELDS, in order)
--
-- Returns {examined, rows}: examined = how many candidates were looked at (all of them
-- unless the rows were enough first); rows = flat {i, values, ...}: each kept candidate's
-- number and its fields' values (nil when absent).
--
-- Without a tenant or tag, a candidate is kept unless its record vanished (C7: every
-- field absent, as for a staged payload that is no job yet). With them, `meta` is read
-- first (HGET, the only field needed: see codec::Meta), and a record whose `meta` cannot
-- be read matches no tenant or tag: what it holds is unknown. Tags are matched without
-- decoding them: the stored text is JSON as durq_core::meta::encode_tags writes it, in
-- which a pattern standing between '{' or ',' and ',' or '}' is exactly one whole tag
-- (quotes inside values are escaped). Rust checks each row's decoded tenant and tags
-- again, so this can only leave out, never wrongly keep, a record spelt another way.
-- Writes nothing.

local most, ntags = tonumber(ARGV[1]), tonumber(ARGV[3])
local by_tenant, tenant = ARGV[2] ~= '', string.sub(ARGV[2], 2)
local patterns = {}
for t = 1, ntags do
  patterns[t] = ARGV[3 + t]
end
local nfields = tonumber(ARGV[4 + ntags])
local fields = {}
for f = 1, nfields do
  fields[f] = ARGV[4 + ntags + f]
end
local scoped = by_tenant or ntags > 0

-- Whether `text` holds `pattern` as a whole member of the JSON object.
local function has_tag(text, pattern)
  local from = 1
  while true do
    local s, e = string.find(text, pattern, from, true)
    if not s then
      return false
    end
    local before, after = string.sub(text, s - 1, s - 1), string.sub(text, e + 1, e + 1)
    if (before == '{' or before == ',') and (after == ',' or after == '}') then
      return true
    end
    from = s + 1
  end
end

-- Whether a `meta` field (codec::Meta) names the tenant and holds every tag asked for.
local function in_scope(meta)
  if not meta then
    return false
  end
  local tlen, klen, at = string.match(meta, '^%S+ %S+ %S+ %S+ %S+ (%d+) (%S+) ()')
  if not tlen then
    return false
  end
  tlen = tonumber(tlen)
  local key_len = 0
  if klen ~= '-' then
    key_len = tonumber(klen)
    if not key_len then
      return false
    end
  end
  if by_tenant and (tlen ~= #tenant or string.sub(meta, at, at + tlen - 1) ~= tenant) then
    return false
  end
  if ntags == 0 then
    return true
  end
  -- After tenant and key: ' TRACE TAGS', or nothing for a job with neither.
  local tags = string.match(string.sub(meta, at + tlen + key_len), '^ %S+ (.+)$')
  if not tags then
    return false
  end
  for t = 1, ntags do
    if not has_tag(tags, patterns[t]) then
      return false
    end
  end
  return true
end

local rows = {}
local kept = 0
local examined = 0
for i = 1, #KEYS do
  if kept >= most then
    break
  end
  examined = i
  local job = KEYS[i]
  if not scoped or in_scope(redis.call('HGET', job, 'meta')) then
    local v = redis.call('HMGET', job, unpack(fields))
    local found = false
    for f = 1, nfields do
      if v[f] then
        found = true
        break
      end
    end
    if found then
      kept = kept + 1
      rows[#rows + 1] = i
      rows[#rows + 1] = v
    end
  end
end
return { examined, rows }
