-- bury.lua: moves a job the claim just leased to `dead` because Rust could not read its
-- record (CONTRACT §5, corrupt records). claim.lua buries what Lua can tell is unreadable;
-- this covers what only the Rust decoder finds (a bad parent id, an out-of-range number),
-- so such a job is neither handed out nor left leased to come back after every reclaim.
--
-- KEYS[1] the job's hash       KEYS[2] lease index (zset)
-- KEYS[3] list index (zset)    KEYS[4] finished log (list)
-- KEYS[5] running counters (hash)
-- KEYS[6] kleases (zset: leases of jobs with a concurrency key, see core.lua)
-- ARGV[1] job id               ARGV[2] token of the claim that leased it
-- ARGV[3] now (ms)             ARGV[4] what is unreadable
-- then a graph tail (graph.lua): the buried job settles the jobs waiting for it (G3);
-- its event stream is where a job that records its events records `dead` (CONTRACT V1).
--
-- Returns {'ok', 'dead'} | {'notfound'} | {'lost'} | {'corrupt', reason} |
-- {'need', {id, ...}} (graph.lua; nothing written)
--
-- Fenced like a lease call: only the claim's own lease is buried. Check before write:
-- the queue comes from `meta` (which claim.lua found readable) and its running counter is
-- checked before the first write.

local job, leases, list, finished, running, kleases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, now = ARGV[1], ARGV[3]
local g = graph_tail()
local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'ckey', 'awt', 'ev', 'att')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue, parent = meta_queue_parent(v[3])
if not queue then
  return { 'corrupt', 'field meta unreadable' }
end
check_counters(running, { queue })
local plan, need = settle_plan(g, { { id, 'dead' } })
if not plan then
  return { 'need', need }
end
drop_lease(leases, running, queue, id, kleases, v[4])
bury(job, list, finished, queue, id, parent, now, ARGV[4])
if v[6] then
  record_change(g.events, id, queue, 'running', 'dead', v[7], v[7], now)
end
settle_write(g, plan)
if v[5] then
  announce_ending(g.channel, id)
end
return { 'ok', 'dead' }
