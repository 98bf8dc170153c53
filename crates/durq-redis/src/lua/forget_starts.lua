-- forget_starts.lua: one step of the sweep of the start logs (CONTRACT K4), run with
-- reclaim's housekeeping (store/flow.rs): a claim trims only the logs it adds to, so
-- the log of a key that stopped starting jobs would stay in `flow` for ever. This step
-- reads one HSCAN page of `flow` and deletes each start log whose newest start has
-- left its window (so none of its starts counts any more), and each start log of a
-- queue whose limits no longer have that rate. Fair turns (`t` fields) are kept (one
-- per queue and priority), but those of queue ARGV[4] when given. `set_limits` runs a
-- whole round of it at `now` 0, which deletes only the logs of rates taken away
-- (CONTRACT K4), and, for limits without fair shares, the queue's turns (K5).
-- Helpers: core.lua, flow.lua.
--
-- KEYS[1] flow (hash)   KEYS[2] limits (hash)
-- ARGV[1] now (ms)      ARGV[2] the HSCAN cursor ('0' to start)   ARGV[3] the page size
-- ARGV[4] the queue whose fair turns go ('' for none)
--
-- Returns the next cursor ('0' when the sweep went round, or `flow` does not exist).
-- An unreadable limits field judges nothing: that queue's logs stay, and the
-- step goes on with the others. (It used to stop the step, so `set_limits` of one queue
-- answered Corrupt for another's field after its own write; a claim of the queue whose
-- field it is still stops on it.)

local flow, limits = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
if redis.call('EXISTS', flow) == 0 then
  return '0'
end
local page = redis.call('HSCAN', flow, ARGV[2], 'COUNT', ARGV[3])
local fields = page[2]
local limits_of = {}
local gone = {}
local unfair = ARGV[4] or ''
for i = 1, #fields, 2 do
  local field, log = fields[i], fields[i + 1]
  local kind, queue = string.match(field, '^([skt]) (%S+)')
  if kind == 't' then
    if queue == unfair then
      gone[#gone + 1] = field
    end
  elseif kind then
    local l = limits_of[queue]
    if l == nil then
      local text = redis.call('HGET', limits, queue)
      local readable, parsed = pcall(parse_limits, queue, text)
      if readable then
        l = parsed or false
      else
        l = 'unreadable'
      end
      limits_of[queue] = l
    end
    if l ~= 'unreadable' then
      local per = l and (kind == 's' and l.ms_per or l.msk_per) or nil
      -- An unreadable log counts for nothing: it goes too.
      local newest = tonumber(string.sub(log, -LOG_WIDTH))
      if not per or not newest or newest <= now - per then
        gone[#gone + 1] = field
      end
    end
  end
end
if #gone > 0 then
  redis.call('HDEL', flow, unpack(gone))
end
return page[1]
