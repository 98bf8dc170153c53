-- requeue_ended.lua: the return of an ended job to `queued` as CONTRACT A2 makes it,
-- prepended after core.lua and lib.lua to the two scripts that make it: retry.lua (A2)
-- and reopen.lua (D3, which queues the job "as A2 queues it"). One definition, so the
-- two cannot drift apart; a helper file of its own rather than part of lib.lua, whose
-- every definition the server runs again on each call of every script that includes it
-- (see core.lua).
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing; it only defines
-- local functions that the script after it uses.

-- Queues the ended job `id` (hash `job`, in `state`, with its `meta`, `ckey` and `ev`
-- fields as the caller read them) again, ready now: attempts 0, no cancel request, no
-- `finished`, `result`, `error`, `started` or `hb` of a past run (they are in its attempt
-- history), a fresh place behind the jobs already ready, and a wake-up on `channel` for
-- its queue.
-- `now` is the instant in ms and `now_hex` its 16 hex digits (formatted by Rust). A job
-- that records its events (`ev`) records `retried` in `events` (CONTRACT V1).
--
-- Check before write: returns {'corrupt', reason} having written nothing when `meta` is
-- unreadable; else makes every write and returns nil. Its first write is the INCR of the
-- sequence counter, which fails the script on a corrupt counter before anything changed,
-- so a caller whose own writes come after this call leaves nothing half done either way.
local function requeue_ended(job, ready, list, done_v1, seq, kready, events, id, now, now_hex,
    channel, state, meta, ckey, ev)
  local queue, parent, prio = meta_head(meta)
  if not queue or not is_int(prio) then
    return { 'corrupt', 'field meta unreadable' }
  end
  local next_seq = redis.call('INCR', seq)
  -- A job that finished under layout 1 has an entry in that layout's finished index,
  -- which purge still reads: it leaves with the job's return to queued. One that finished
  -- under this layout has an entry in the finished log, which stays: purge finds the job
  -- alive (or finished later) and drops the entry then.
  redis.call('ZREM', done_v1, queue .. ' ' .. STATE_CODE[state] .. ' ' .. id .. ' ' .. (parent or ''))
  redis.call('HSET', job, 'att', '0', 'cancel', '0')
  redis.call('HDEL', job, 'finished', 'result', 'error', 'started', 'hb')
  requeue(job, ready, nil, list, next_seq, queue, id, prio, now, now_hex, true, state, ckey, kready)
  if ev then
    record_change(events, id, queue, state, 'queued', '0', '0', now)
  end
  redis.call('PUBLISH', channel, queue)
  return nil
end
