//! Group completion: concurrent `complete` calls on one store are sent to Redis as one
//! `complete.lua` call per batch (by the shared [`durq_core::batch`] batcher). Each
//! completion still gets its own outcome and its own instant, and is applied atomically
//! with its indexes; only the round trips and the per-call script overhead are shared.
//! A call returns after its batch ran.

use std::convert::Infallible;

use durq_core::batch::{Batch, Limits};
use durq_core::{Bytes, Error, JobId, LeaseToken, Result, Timestamp};
use redis::Value;

use crate::codec::{array, text};
use crate::conn::{map_err, Conn};
use crate::keys::Keys;
use crate::scripts::{self, Eval};

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
}

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
        run_script(self.conn.clone(), &self.keys, &entries).await
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
/// failed, else one outcome per entry.
pub(crate) async fn run_script(
    mut conn: Conn,
    keys: &Keys,
    entries: &[Entry<'_>],
) -> Result<Vec<Result<()>>> {
    let mut invocation = Eval::new(&scripts::COMPLETE);
    invocation
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.done)
        .key(&keys.running);
    // The first entry's instant is the call's default: a batch shares one, and grouped
    // calls mostly do, so most entries pass '' instead of their own.
    let default_now = entries.first().map_or(0, |e| e.now.as_millis());
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
    let reply: Value = invocation
        .invoke(&mut conn)
        .await
        .map_err(|err| map_err("complete", err))?;
    let items = array(&reply, "complete reply")?;
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
