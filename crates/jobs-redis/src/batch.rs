//! Group completion: concurrent `complete` calls on one store are sent to Redis as one
//! `complete.lua` call per batch. Each completion still gets its own outcome and its own
//! instant, and is applied atomically with its indexes; only the round trips and
//! the per-call script overhead are shared. A call returns after its batch ran.
//!
//! The first completion after a quiet spell goes out at once (no waiting for a batch to
//! fill); completions arriving while batches are in flight make up the next batch.

use std::sync::Arc;

use jobs_core::{Bytes, Error, JobId, LeaseToken, Result, Timestamp};
use redis::Value;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::codec::{array, id_string, text};
use crate::conn::{map_err, Conn};
use crate::feeder::Feeder;
use crate::keys::Keys;
use crate::scripts;

/// Completions one script call takes at most, and the result bytes it carries at most
/// (a single larger result still goes alone).
const MAX_BATCH: usize = 512;
const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Batches in flight at once: enough to keep the connection busy while one runs.
const IN_FLIGHT: usize = 4;

struct Request {
    id: JobId,
    token: LeaseToken,
    now: Timestamp,
    result: Option<Bytes>,
    reply: oneshot::Sender<Result<()>>,
}

/// The batcher of one store. Its task ends when the store (and so the sender) drops.
pub(crate) struct Completer {
    conn: Conn,
    keys: Keys,
    feeder: Feeder<Request>,
}

impl Completer {
    pub(crate) fn new(conn: Conn, keys: Keys) -> Self {
        Completer {
            conn,
            keys,
            feeder: Feeder::new(),
        }
    }

    /// Completes one job; resolves when its batch has run.
    pub(crate) async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        now: Timestamp,
        result: Option<Bytes>,
    ) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request {
            id,
            token,
            now,
            result,
            reply,
        });
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                message: "the completion batch was dropped before it ran".to_owned(),
                source: None,
            })
        })
    }

    fn submit(&self, request: Request) {
        self.feeder
            .send(request, |rx| run(rx, self.conn.clone(), self.keys.clone()));
    }
}

async fn run(mut requests: mpsc::UnboundedReceiver<Request>, conn: Conn, keys: Keys) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = requests.recv().await {
        // Waiting for a slot lets the next batch grow while the others run.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.result.as_ref().map_or(0, Bytes::len);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            match requests.try_recv() {
                Ok(request) => {
                    bytes += request.result.as_ref().map_or(0, Bytes::len);
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
        let conn = conn.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            let _slot = slot;
            execute(conn, &keys, batch).await;
        });
    }
}

async fn execute(conn: Conn, keys: &Keys, batch: Vec<Request>) {
    let entries: Vec<Entry<'_>> = batch
        .iter()
        .map(|r| Entry {
            id: r.id,
            token: r.token,
            now: r.now,
            result: r.result.as_deref(),
        })
        .collect();
    match run_script(conn, keys, &entries).await {
        Ok(outcomes) => {
            for (request, outcome) in batch.into_iter().zip(outcomes) {
                let _ = request.reply.send(outcome);
            }
        }
        Err(err) => {
            // Every completion of the batch shares the failure.
            for request in batch {
                let _ = request.reply.send(Err(err.clone()));
            }
        }
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
    let mut invocation = scripts::COMPLETE.prepare_invoke();
    invocation
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.done)
        .key(&keys.running);
    for entry in entries {
        invocation
            .key(keys.job(entry.id))
            .arg(id_string(entry.id))
            .arg(entry.token.get())
            .arg(entry.now.as_millis())
            .arg(if entry.result.is_some() { "1" } else { "0" })
            .arg(entry.result.unwrap_or(b""));
    }
    let reply: Value = invocation
        .invoke_async(&mut conn)
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
