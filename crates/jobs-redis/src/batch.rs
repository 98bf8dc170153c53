//! Group completion: concurrent `complete` calls on one store are sent to Redis as one
//! `complete.lua` call per batch. Each completion still gets its own outcome and its own
//! clock reading, and is applied atomically with its indexes; only the round trips and
//! the per-call script overhead are shared. A call returns after its batch ran.
//!
//! The first completion after a quiet spell goes out at once (no waiting for a batch to
//! fill); completions arriving while batches are in flight make up the next batch.

use std::sync::{Arc, Mutex};

use jobs_core::{Bytes, Error, JobId, LeaseToken, Result, Timestamp};
use redis::Value;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::codec::{array, text};
use crate::conn::{map_err, Conn};
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
    sender: Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

impl Completer {
    pub(crate) fn new(conn: Conn, keys: Keys) -> Self {
        Completer {
            conn,
            keys,
            sender: Mutex::new(None),
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
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let request = match sender.as_ref() {
            Some(live) => match live.send(request) {
                Ok(()) => return,
                // The task is gone (its runtime shut down): start a new one.
                Err(mpsc::error::SendError(request)) => request,
            },
            None => request,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, self.conn.clone(), self.keys.clone()));
        // The receiver is alive: it was just created and moved into the task.
        let _ = tx.send(request);
        *sender = Some(tx);
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

async fn execute(mut conn: Conn, keys: &Keys, batch: Vec<Request>) {
    let mut invocation = scripts::COMPLETE.prepare_invoke();
    invocation
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.done)
        .key(&keys.running);
    for request in &batch {
        invocation
            .key(keys.job(request.id))
            .arg(request.id.to_string())
            .arg(request.token.get())
            .arg(request.now.as_millis())
            .arg(if request.result.is_some() { "1" } else { "0" })
            .arg(request.result.as_deref().unwrap_or(b""));
    }
    let reply: Result<Value> = invocation
        .invoke_async(&mut conn)
        .await
        .map_err(|err| map_err("complete", err));
    let statuses: Result<Vec<String>> = reply.and_then(|reply| {
        let items = array(&reply, "complete reply")?;
        if items.len() != batch.len() {
            return Err(Error::corrupt(
                "complete reply",
                "one status per job expected",
            ));
        }
        items
            .iter()
            .map(|item| text(item, "complete reply"))
            .collect()
    });
    match statuses {
        Ok(statuses) => {
            for (request, status) in batch.into_iter().zip(statuses) {
                let outcome = match status.as_str() {
                    "ok" => Ok(()),
                    "notfound" => Err(Error::NotFound { id: request.id }),
                    "lost" => Err(Error::LeaseLost { id: request.id }),
                    "corrupt" => Err(Error::corrupt(
                        format!("job {}", request.id),
                        "unreadable meta field",
                    )),
                    other => Err(Error::corrupt(
                        "complete reply",
                        format!("unexpected status {other:?}"),
                    )),
                };
                let _ = request.reply.send(outcome);
            }
        }
        Err(err) => {
            // Every completion of the batch shares the failure, kind and text alike.
            let message = err.to_string();
            let retryable = err.is_retryable();
            for request in batch {
                let shared = if retryable {
                    Error::Unavailable {
                        message: message.clone(),
                        source: None,
                    }
                } else {
                    Error::Backend {
                        message: message.clone(),
                        source: None,
                    }
                };
                let _ = request.reply.send(Err(shared));
            }
        }
    }
}
