//! Lease calls: heartbeat, complete, fail, release.
//!
//! Group completion: concurrent `complete` calls on one store are sent to Redis as one
//! `complete.lua` call per batch (by the shared [`durq_core::batch`] batcher). Each
//! completion still gets its own outcome and its own instant, and is applied atomically
//! with its indexes; only the round trips and the per-call script overhead are shared.
//! A call returns after its batch ran.

use std::convert::Infallible;
use std::time::Duration;

use durq_core::batch::{Batch, Limits};
use durq_core::{
    complete_each, Bytes, Error, Heartbeat, HeldLease, JobId, JobState, LeaseToken, Result, Retry,
    Timestamp,
};
use redis::Value;

use super::{parse_state, status, unexpected, RedisBackend};
use crate::codec::{array, id_string, text};
use crate::conn::{map_err, Conn};
use crate::keys::Keys;
use crate::scripts::{self, Eval};
use crate::store::enqueue::ready_hex;
use crate::store::graph::Dependents;

impl RedisBackend {
    /// One `heartbeat.lua` call over `leases`, one answer per entry: each lease that is
    /// still held now runs to `now + ttl`.
    pub(crate) async fn heartbeat_many(
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

    pub(super) fn lease_call_error(id: JobId, word: &str, rest: &[Value], what: &str) -> Error {
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
    /// [`fits_one_call`]), else [`complete_each`], whose concurrent `complete`
    /// calls the completion grouper sends together anyway.
    pub(crate) async fn complete_many(
        &self,
        completions: Vec<durq_core::Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        let entries: Vec<Entry<'_>> = completions
            .iter()
            .map(|completion| Entry {
                id: completion.id,
                token: completion.token,
                now,
                result: completion.result.as_deref(),
            })
            .collect();
        if !fits_one_call(&entries) {
            drop(entries);
            return Ok(complete_each(self, completions, now).await);
        }
        run_script(
            self.conn(),
            self.keys(),
            &entries,
            &self.inner.completion_graphs,
        )
        .await
    }

    /// Rules L6, L7: `fail.lua` decides the new state (as
    /// [`durq_core::transition::after_failure`]) and moves the job there.
    pub(crate) async fn fail_job(
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
        let reply = Dependents::default()
            .send_settling(&self.conn(), keys, now, "fail", || {
                let mut invocation = scripts::FAIL.prepare_invoke();
                lease_end_keys(&mut invocation, keys, id)
                    .arg(id.to_string())
                    .arg(token.get())
                    .arg(now.as_millis())
                    .arg(error)
                    .arg(&at)
                    .arg(&at_hex)
                    .arg(if due { "1" } else { "0" })
                    .arg(&keys.wake)
                    .arg(durq_core::validate::truncate_attempt_error(error).len());
                invocation
            })
            .await?;
        match status(&reply, "fail reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "fail reply")?, "fail reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "fail reply")),
        }
    }

    /// Rules L8, G3: `release.lua` hands the job back (as
    /// [`durq_core::transition::after_release`]), and a cancel-requested one it ends
    /// settles the jobs waiting for it.
    pub(crate) async fn release_job(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let keys = self.keys();
        // A cancel-requested job ends cancelled here (A1), settling the jobs waiting
        // for it (G3): the call carries a graph tail, as `fail` does.
        let reply = Dependents::default()
            .send_settling(&self.conn(), keys, now, "release", || {
                let mut invocation = scripts::RELEASE.prepare_invoke();
                lease_end_keys(&mut invocation, keys, id)
                    .arg(id.to_string())
                    .arg(token.get())
                    .arg(now.as_millis())
                    .arg(ready_hex(ready_at))
                    .arg(&keys.wake)
                    .arg(ready_at.as_millis())
                    .arg(if ready_at <= now { "1" } else { "0" });
                invocation
            })
            .await?;
        match status(&reply, "release reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "release reply")),
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
        .key(&keys.finished)
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.seq)
        .key(&keys.running)
        .key(&keys.kready)
        .key(&keys.kleases)
}

/// Completions one script call takes at most, and the result bytes it carries at most
/// (a single larger result still goes alone). Bounds how long one call holds the server.
const MAX_BATCH: usize = 512;
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// One `complete` call, with the instant its caller read.
pub(crate) struct Completion {
    pub id: JobId,
    pub token: LeaseToken,
    pub now: Timestamp,
    pub result: Option<Bytes>,
}

/// The completions of one store.
pub(crate) struct Completions {
    pub conn: Conn,
    pub keys: Keys,
    pub graphs: GraphHint,
}

/// Whether a store's last batch of completions had a job others wait for (CONTRACT
/// G1). While it does, the next batch skips the plain `complete.lua`, which would only
/// answer `graph` having read every job, and goes to `complete_graph` with the jobs
/// waiting for its jobs read first: a workload of graphs pays two round trips a batch
/// instead of three. The first batch that finds no such job clears it, so plain jobs
/// take the plain call again. A hint only: either script is correct for any batch.
pub(crate) type GraphHint = std::sync::Arc<std::sync::atomic::AtomicBool>;

impl Batch for Completions {
    type Call = Completion;
    type Answer = Result<()>;
    /// The script applies its completions one after the other, so a second call for
    /// a job in the same batch finds the first one's work done, as it would alone.
    type Key = Infallible;

    const LIMITS: Limits = Limits {
        max_calls: MAX_BATCH,
        max_bytes: MAX_BATCH_BYTES,
        // Enough to keep the connection busy while one batch runs.
        in_flight: 4,
        queued: 4 * MAX_BATCH,
    };

    fn size(call: &Completion) -> usize {
        call.result.as_ref().map_or(0, Bytes::len)
    }

    async fn run(&self, calls: &[Completion]) -> Result<Vec<Result<()>>> {
        let entries: Vec<Entry<'_>> = calls
            .iter()
            .map(|c| Entry {
                id: c.id,
                token: c.token,
                now: c.now,
                result: c.result.as_deref(),
            })
            .collect();
        run_script(self.conn.clone(), &self.keys, &entries, &self.graphs).await
    }
}

/// One completion as `complete.lua` takes it.
pub(crate) struct Entry<'a> {
    pub id: JobId,
    pub token: LeaseToken,
    pub now: Timestamp,
    pub result: Option<&'a [u8]>,
}

/// Whether `entries` fit one script call (see [`MAX_BATCH`]), so a caller with a batch
/// of its own can send it whole.
pub(crate) fn fits_one_call(entries: &[Entry<'_>]) -> bool {
    entries.len() <= MAX_BATCH
        && entries
            .iter()
            .map(|e| e.result.map_or(0, <[u8]>::len))
            .sum::<usize>()
            <= MAX_BATCH_BYTES
}

/// Runs one `complete.lua` call over `entries`, in order; `Err` when the call as a whole
/// failed, else one outcome per entry. A batch in which some job has jobs waiting for it
/// is sent again as `complete_graph` (nothing was written), which settles them too.
pub(crate) async fn run_script(
    mut conn: Conn,
    keys: &Keys,
    entries: &[Entry<'_>],
    graphs: &GraphHint,
) -> Result<Vec<Result<()>>> {
    use std::sync::atomic::Ordering::Relaxed;
    // The first entry's instant is the call's default: a batch shares one, and grouped
    // calls mostly do, so most entries pass '' instead of their own.
    let default_now = entries.first().map_or(Timestamp::from_millis(0), |e| e.now);
    if !graphs.load(Relaxed) {
        let reply = complete_call(&scripts::COMPLETE, keys, entries, default_now)
            .invoke(&mut conn)
            .await
            .map_err(|err| map_err("complete", err))?;
        if !is_graph_answer(&reply) {
            return outcomes(&reply, entries);
        }
        graphs.store(true, Relaxed);
    }
    // Settling happens at the call's instant: a batch's completions share it.
    let mut dependents = Dependents::default();
    let waited_for = dependents
        .prefetch(
            entries.iter().map(|entry| entry.id).collect(),
            &conn,
            keys,
            "complete reply",
        )
        .await?;
    if !waited_for {
        graphs.store(false, Relaxed);
    }
    let reply = dependents
        .send_settling(&conn, keys, default_now, "complete", || {
            complete_call(&scripts::COMPLETE_GRAPH, keys, entries, default_now)
        })
        .await?;
    outcomes(&reply, entries)
}

/// Whether a `complete.lua` reply is `{'graph'}` (nothing written), read without
/// copying it: the plain path asks this of every reply.
fn is_graph_answer(reply: &Value) -> bool {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::BulkString(word)] => word == b"graph",
            [Value::SimpleString(word)] => word == "graph",
            _ => false,
        },
        _ => false,
    }
}

/// One outcome per entry from a `complete.lua` reply; `Err` when the reply is not one
/// status per entry.
fn outcomes(reply: &Value, entries: &[Entry<'_>]) -> Result<Vec<Result<()>>> {
    let items = array(reply, "complete reply")?;
    if items.len() != entries.len() {
        return Err(Error::corrupt(
            "complete reply",
            "one status per job expected",
        ));
    }
    let mut outcomes = Vec::with_capacity(entries.len());
    for (entry, item) in entries.iter().zip(items) {
        let outcome = match item {
            Value::SimpleString(s) if s == "ok" => Ok(()),
            Value::BulkString(b) if b == b"ok" => Ok(()),
            other => match text(other, "complete reply")?.as_str() {
                "ok" => Ok(()),
                "notfound" => Err(Error::NotFound { id: entry.id }),
                "lost" => Err(Error::LeaseLost { id: entry.id }),
                "corrupt" => Err(Error::corrupt(
                    format!("job {}", entry.id),
                    "unreadable meta field",
                )),
                other => {
                    return Err(Error::corrupt(
                        "complete reply",
                        format!("unexpected status {other:?}"),
                    ))
                }
            },
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The KEYS and ARGV of a `complete.lua` call over `entries` (see its header).
fn complete_call(
    script: &'static redis::Script,
    keys: &Keys,
    entries: &[Entry<'_>],
    default_now: Timestamp,
) -> Eval {
    let mut invocation = Eval::new(script);
    invocation
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.finished)
        .key(&keys.running)
        .key(&keys.kleases)
        .key(&keys.events);
    let default_now = default_now.as_millis();
    invocation.arg(default_now);
    // Results follow the entries' values (ARGV is 1-based: the default instant, then
    // four values per entry).
    let mut next_result = 2 + 4 * entries.len();
    for entry in entries {
        invocation
            .job_key(keys, entry.id)
            .id_arg(entry.id)
            .arg(entry.token.get());
        let now = entry.now.as_millis();
        if now == default_now {
            invocation.arg("");
        } else {
            invocation.arg(now);
        }
        if entry.result.is_some() {
            invocation.arg(next_result);
            next_result += 1;
        } else {
            invocation.arg("");
        }
    }
    for result in entries.iter().filter_map(|e| e.result) {
        invocation.arg(result);
    }
    invocation
}
