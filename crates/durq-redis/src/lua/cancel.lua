-- cancel.lua: cancels a queued or waiting job, asks a running one to stop, leaves a
-- terminal one (CONTRACT A1, C9, G4).
--
-- KEYS[1] the job's hash       KEYS[2] ready index (zset)
-- KEYS[3] scheduled index (zset)
-- KEYS[4] list index (zset)    KEYS[5] finished log (list)
-- KEYS[6] kready (zset: ready jobs with a concurrency key, see core.lua)
-- ARGV[1] job id               ARGV[2] now (ms)
-- then a graph tail (graph.lua): a cancelled job settles the jobs waiting for it (G3);
-- its event stream is where a job that records its events records `cancelled`
-- (CONTRACT V1). A cancel request to a running job changes no state and records nothing.
--
-- Returns {'ok', state after the call} | {'notfound'} | {'corrupt', reason} |
-- {'need', {id, ...}} (graph.lua; nothing written)
--
-- Atomicity: a queued job leaves the ready and scheduled indexes in the same step that
-- makes it cancelled, so no claim can take it afterwards (a job with a concurrency key
-- leaves `kready` with it; its `ckeys` entry stays until purge deletes the job). Every
-- value used is checked before the first write.

local job, ready, sched, list, finished, kready = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, now = ARGV[1], ARGV[2]
local g = graph_tail()
local v = redis.call('HMGET', job, 'state', 'meta', 'order', 'ckey', 'awt', 'ev', 'att')
if not v[1] then
  return { 'notfound' }
end
local state = v[1]
local queue, parent = meta_head(v[2])
if state == 'queued' or state == 'waiting' then
  -- Check before write: without a readable queue (and, for a queued job, order key)
  -- its index entries cannot be found, and cancelling would leave them behind.
  if not queue then
    return { 'corrupt', 'field meta unreadable' }
  end
  if state == 'queued' and (not v[3] or string.find(v[3], '^%x+$') == nil or #v[3] ~= 36) then
    return { 'corrupt', 'field order unreadable' }
  end
  local plan, need = settle_plan(g, { { id, 'cancelled' } })
  if not plan then
    return { 'need', need }
  end
  if state == 'queued' then
    local member = queue_member(queue, v[3], id)
    redis.call('ZREM', ready, member)
    redis.call('ZREM', sched, member)
    if v[4] then
      redis.call('ZREM', kready, kready_member(queue, member, v[4]))
    end
  else
    -- In no ready or scheduled index; its `wfor` goes with the wait (G4).
    redis.call('HDEL', job, 'wfor')
  end
  finish(job, list, finished, queue, id, parent, state, 'cancelled', now)
  if v[6] then
    record_change(g.events, id, queue, state, 'cancelled', v[7], v[7], now)
  end
  settle_write(g, plan)
  if v[5] then
    announce_ending(g.channel, id)
  end
  return { 'ok', 'cancelled' }
end
if state == 'running' then
  redis.call('HSET', job, 'cancel', '1')
end
return { 'ok', state }
