//! Operator actions: cancel and retry of one job (CONTRACT A1, A2), and pausing
//! queues (Q1).

use durq_core::{Error, JobId, JobState, Result, Timestamp};

use super::{parse_state, status, RedisBackend};
use crate::codec::text;
use crate::conn::map_err;
use crate::scripts;
use crate::store::enqueue::ready_hex;
use crate::store::graph::Dependents;

impl RedisBackend {
    /// Rules A1, G4: cancels a queued or waiting job (settling the jobs waiting for
    /// it), asks a running one to stop.
    pub(crate) async fn cancel_job(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        let keys = self.keys();
        let reply = Dependents::default()
            .send_settling(&self.conn(), keys, now, "cancel", || {
                let mut invocation = scripts::CANCEL.prepare_invoke();
                invocation
                    .key(keys.job(id))
                    .key(&keys.ready)
                    .key(&keys.sched)
                    .key(&keys.list)
                    .key(&keys.finished)
                    .key(&keys.kready)
                    .arg(id.to_string())
                    .arg(now.as_millis());
                invocation
            })
            .await?;
        match status(&reply, "cancel reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "cancel reply")?, "cancel reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "cancel reply")),
        }
    }

    /// Rule A2: queues a dead or cancelled job again.
    pub(crate) async fn retry_job(&self, id: JobId, now: Timestamp) -> Result<()> {
        let invocation = self.requeue_ended_call(&scripts::RETRY, id, now);
        let reply = self.invoke(&invocation, "retry").await?;
        match status(&reply, "retry reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, [state]) if word == "state" => Err(Error::InvalidState {
                id,
                state: parse_state(&text(state, "retry reply")?, "retry reply")?,
                operation: "retry",
            }),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "retry reply")),
        }
    }

    /// A call of `script`, one that queues the ended job `id` again through
    /// `requeue_ended.lua` (`retry.lua`, `reopen.lua`), with the keys and arguments
    /// that file reads first (KEYS[1..7], the event stream last, ARGV[1..4]); a script
    /// of its own takes more after them.
    pub(crate) fn requeue_ended_call<'a>(
        &self,
        script: &'a redis::Script,
        id: JobId,
        now: Timestamp,
    ) -> redis::ScriptInvocation<'a> {
        let keys = self.keys();
        let mut invocation = script.prepare_invoke();
        invocation
            .key(keys.job(id))
            .key(&keys.ready)
            .key(&keys.list)
            .key(&keys.done_v1)
            .key(&keys.seq)
            .key(&keys.kready)
            .key(&keys.events)
            .arg(id.to_string())
            .arg(now.as_millis())
            .arg(ready_hex(now))
            .arg(&keys.wake);
        invocation
    }

    /// Rule Q1: adds `queue` to the paused set or removes it; a resume wakes the
    /// claimers waiting on the queue. One set, read by every claim script.
    pub(crate) async fn pause_queue(&self, queue: &str, paused: bool) -> Result<()> {
        let keys = self.keys();
        let mut conn = self.conn();
        if paused {
            let _: i64 = redis::cmd("SADD")
                .arg(&keys.paused)
                .arg(queue)
                .query_async(&mut conn)
                .await
                .map_err(|err| map_err("pause", err))?;
            return Ok(());
        }
        let removed: i64 = redis::cmd("SREM")
            .arg(&keys.paused)
            .arg(queue)
            .query_async(&mut conn)
            .await
            .map_err(|err| map_err("resume", err))?;
        if removed > 0 {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&keys.wake)
                .arg(queue)
                .query_async(&mut conn)
                .await
                .map_err(|err| map_err("resume wake-up", err))?;
        }
        Ok(())
    }

    /// Rule Q1: the paused queues, by name.
    pub(crate) async fn read_paused_queues(&self) -> Result<Vec<String>> {
        let mut queues: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&self.keys().paused)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("paused queues", err))?;
        queues.sort_unstable();
        Ok(queues)
    }
}
