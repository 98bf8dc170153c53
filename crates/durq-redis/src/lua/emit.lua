-- emit.lua: records an event a running job's handler emits (CONTRACT V1, `emitted`),
-- fenced by its lease token as save_step.lua fences a step (D1).
--
-- KEYS[1] the job's hash       KEYS[2] event stream (core.lua, record_change)
-- ARGV[1] job id               ARGV[2] lease token
-- ARGV[3] event name ([A-Za-z0-9._:-]{1,128}, checked by the handle)
-- ARGV[4] data (at most 64 KiB, checked by the handle)
-- ARGV[5] now (ms)
--
-- Returns {'ok'} | {'notfound'} | {'lost'} (the job is not running, or `token` is not
-- its lease's) | {'corrupt', reason} (its `meta` or `att` cannot be read); every answer
-- but `ok` wrote nothing.
--
-- Recorded whether or not the job carries the mark `ev`: a job that does not record its
-- changes still emits (V1). The entry is the stream's usual one, `j q k a t`, with the
-- kind `emitted`, the attempt that emits it, and `n NAME d DATA`.
--
-- Atomicity: the lease check and the XADD are one step, so a run that lost its lease
-- (reclaimed, released, ended) emits nothing, as complete.lua answers such a run.

local job, events = KEYS[1], KEYS[2]
local v = redis.call('HMGET', job, 'state', 'token', 'meta', 'att')
if not v[1] then
  return { 'notfound' }
end
if v[1] ~= 'running' or v[2] ~= ARGV[2] then
  return { 'lost' }
end
local queue = meta_queue_parent(v[3])
if not queue then
  return { 'corrupt', 'field meta unreadable' }
end
if not v[4] or not string.find(v[4], '^%d+$') or tonumber(v[4]) > 4294967295 then
  return { 'corrupt', 'field att not a number' }
end
redis.call('XADD', events, '*', 'j', ARGV[1], 'q', queue, 'k', 'emitted', 'a', v[4], 't', ARGV[5],
  'n', ARGV[3], 'd', ARGV[4])
return { 'ok' }
