//! Lease calls (heartbeat, complete, fail, release) and the admin calls that change
//! one job's state (cancel, retry).

use std::time::Duration;

use durq_core::{
    complete_each, Completion, Error, Heartbeat, HeldLease, JobId, JobState, LeaseToken, Result,
    Retry, Timestamp,
};
use redis::Value;

use super::{parse_state, status, unexpected, RedisBackend};
use crate::codec::{array, id_string, text};
use crate::keys::Keys;
use crate::scripts;
use crate::store::complete::{self, Entry as BatchEntry};
use crate::store::enqueue::ready_hex;

impl RedisBackend {
    /// One `heartbeat.lua` call over `leases`, one answer per entry: each lease that is
    /// still held now runs to `now + ttl`.
    pub(super) async fn heartbeat_many(
        &self,
        leases: &[HeldLease],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let expires_at = now.saturating_add(ttl);
        let keys = self.keys();
        let mut invocation = scripts::HEARTBEAT.prepare_invoke();
        invocation
            .key(&keys.leases)
            .key(&keys.running)
            .arg(now.as_millis())
            .arg(expires_at.as_millis());
        for lease in leases {
            invocation
                .key(keys.job(lease.id))
                .arg(id_string(lease.id))
                .arg(lease.token.get());
        }
        let reply = self.invoke(&invocation, "heartbeat").await?;
        let items = array(&reply, "heartbeat reply")?;
        if items.len() != leases.len() {
            return Err(Error::corrupt(
                "heartbeat reply",
                "one status per lease expected",
            ));
        }
        leases
            .iter()
            .zip(items)
            .map(|(lease, item)| {
                let word = text(item, "heartbeat reply")?;
                Ok(match word.as_str() {
                    "0" | "1" => Ok(Heartbeat {
                        cancel_requested: word == "1",
                        expires_at,
                    }),
                    other => Err(Self::lease_call_error(
                        lease.id,
                        other,
                        &[],
                        "heartbeat reply",
                    )),
                })
            })
            .collect()
    }

    fn lease_call_error(id: JobId, word: &str, rest: &[Value], what: &str) -> Error {
        match word {
            "notfound" => Error::NotFound { id },
            "lost" => Error::LeaseLost { id },
            "corrupt" => Error::corrupt(
                format!("job {id}"),
                rest.first()
                    .and_then(|reason| text(reason, what).ok())
                    .unwrap_or_else(|| "unreadable meta field".to_owned()),
            ),
            other => unexpected(what, other),
        }
    }

    /// One `complete.lua` call for the whole batch when it fits one (see
    /// [`complete::fits_one_call`]), else [`complete_each`], whose concurrent `complete`
    /// calls the completion grouper sends together anyway.
    pub(super) async fn complete_many(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        let entries: Vec<BatchEntry<'_>> = completions
            .iter()
            .map(|completion| BatchEntry {
                id: completion.id,
                token: completion.token,
                now,
                result: completion.result.as_deref(),
            })
            .collect();
        if !complete::fits_one_call(&entries) {
            drop(entries);
            return Ok(complete_each(self, completions, now).await);
        }
        complete::run_script(self.conn(), self.keys(), &entries).await
    }

    /// Rules L6, L7: `fail.lua` decides the new state (as
    /// [`durq_core::transition::after_failure`]) and moves the job there.
    pub(super) async fn fail_job(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let keys = self.keys();
        let (at, at_hex, due) = match retry {
            Retry::At(at) => (at.as_millis().to_string(), ready_hex(at), at <= now),
            Retry::Never => (String::new(), String::new(), false),
        };
        let mut invocation = scripts::FAIL.prepare_invoke();
        lease_end_keys(&mut invocation, keys, id)
            .arg(id.to_string())
            .arg(token.get())
            .arg(now.as_millis())
            .arg(error)
            .arg(at)
            .arg(at_hex)
            .arg(if due { "1" } else { "0" })
            .arg(&keys.wake)
            .arg(durq_core::validate::truncate_attempt_error(error).len());
        let reply = self.invoke(&invocation, "fail").await?;
        match status(&reply, "fail reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "fail reply")?, "fail reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "fail reply")),
        }
    }

    /// Rule L8: `release.lua` hands the job back (as
    /// [`durq_core::transition::after_release`]).
    pub(super) async fn release_job(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let keys = self.keys();
        let mut invocation = scripts::RELEASE.prepare_invoke();
        lease_end_keys(&mut invocation, keys, id)
            .arg(id.to_string())
            .arg(token.get())
            .arg(now.as_millis())
            .arg(ready_hex(ready_at))
            .arg(&keys.wake)
            .arg(ready_at.as_millis())
            .arg(if ready_at <= now { "1" } else { "0" });
        let reply = self.invoke(&invocation, "release").await?;
        match status(&reply, "release reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "release reply")),
        }
    }

    /// Rule A1: cancels a queued job, asks a running one to stop.
    pub(super) async fn cancel_job(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        let keys = self.keys();
        let mut invocation = scripts::CANCEL.prepare_invoke();
        invocation
            .key(keys.job(id))
            .key(&keys.ready)
            .key(&keys.sched)
            .key(&keys.list)
            .key(&keys.done)
            .arg(id.to_string())
            .arg(now.as_millis());
        let reply = self.invoke(&invocation, "cancel").await?;
        match status(&reply, "cancel reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "cancel reply")?, "cancel reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "cancel reply")),
        }
    }

    /// Rule A2: queues a dead or cancelled job again.
    pub(super) async fn retry_job(&self, id: JobId, now: Timestamp) -> Result<()> {
        let keys = self.keys();
        let mut invocation = scripts::RETRY.prepare_invoke();
        invocation
            .key(keys.job(id))
            .key(&keys.ready)
            .key(&keys.list)
            .key(&keys.done)
            .key(&keys.seq)
            .arg(id.to_string())
            .arg(now.as_millis())
            .arg(ready_hex(now))
            .arg(&keys.wake);
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
}

/// Adds the KEYS shared by the scripts that end a lease and send the job back to
/// `queued` or to a terminal state (`fail.lua`, `release.lua`), in their headers' order.
fn lease_end_keys<'i, 'a>(
    invocation: &'i mut redis::ScriptInvocation<'a>,
    keys: &Keys,
    id: JobId,
) -> &'i mut redis::ScriptInvocation<'a> {
    invocation
        .key(keys.job(id))
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.done)
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.seq)
        .key(&keys.running)
}
