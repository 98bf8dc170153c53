//! Batched completion: concurrent `complete` calls of one store become one statement.
//!
//! Completion is the most frequent write after claiming, and each statement costs a
//! round trip and a commit. Calls are queued to a background task, which takes every
//! call waiting at that moment (without delay: a lone call goes out alone) and runs
//! them as one `UPDATE … FROM unnest(…)`. Each call gets its own answer. While one
//! batch runs, the next one gathers, so batches grow with the load.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use jobs_core::{Error, JobId, Result, StoreSettings};
use sqlx::postgres::PgBindIterExt;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::backend::Shared;
use crate::error::map;
use crate::row::{column, PgUuid};

/// Most calls in one statement.
const MAX_BATCH: usize = 1_000;
/// Most result bytes in one statement; a single larger result goes alone.
const MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;
/// Batches of one store in flight at once.
const MAX_IN_FLIGHT: usize = 2;

/// What became of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    LeaseLost,
    NotFound,
}

struct Call {
    id: JobId,
    token: i64,
    result: Option<Bytes>,
    reply: oneshot::Sender<Result<Outcome>>,
}

/// The sending side, started on first use.
#[derive(Debug, Default)]
pub(crate) struct Completer {
    sender: Mutex<Option<mpsc::UnboundedSender<Call>>>,
}

impl Completer {
    /// Completes job `id` if `token` is its current lease, in the next batch.
    pub(crate) async fn complete(
        &self,
        shared: &Arc<Shared>,
        settings: &StoreSettings,
        id: JobId,
        token: i64,
        result: Option<Bytes>,
    ) -> Result<Outcome> {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            id,
            token,
            result,
            reply,
        };
        self.send(shared, settings, call)?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    fn send(&self, shared: &Arc<Shared>, settings: &StoreSettings, mut call: Call) -> Result<()> {
        let mut sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // The task ends only when its runtime does; a store used from a new runtime
        // starts a new task there.
        if let Some(live) = sender.as_ref() {
            match live.send(call) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => call = back,
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, Arc::clone(shared), settings.clone()));
        tx.send(call).map_err(|_| gone())?;
        *sender = Some(tx);
        Ok(())
    }
}

fn gone() -> Error {
    Error::Unavailable {
        message: "complete: the batching task stopped (its runtime shut down)".to_owned(),
        source: None,
    }
}

async fn run(
    mut calls: mpsc::UnboundedReceiver<Call>,
    shared: Arc<Shared>,
    settings: StoreSettings,
) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut waiting: VecDeque<Call> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match calls.recv().await {
                Some(call) => waiting.push_back(call),
                None => return,
            }
        }
        // Gather while a slot is busy: the longer the wait, the bigger the batch.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        while waiting.len() < MAX_BATCH * 2 {
            match calls.try_recv() {
                Ok(call) => waiting.push_back(call),
                Err(_) => break,
            }
        }
        let batch = take_batch(&mut waiting);
        let shared = Arc::clone(&shared);
        let settings = settings.clone();
        tokio::spawn(async move {
            execute(&shared, &settings, batch).await;
            drop(permit);
        });
    }
}

/// Takes calls in arrival order up to the limits, at most one per job: a second call
/// for the same job in one statement would see the first one's update as its own.
fn take_batch(waiting: &mut VecDeque<Call>) -> Vec<Call> {
    let mut batch = Vec::new();
    let mut ids = HashSet::new();
    let mut bytes = 0usize;
    let mut held = VecDeque::new();
    while let Some(call) = waiting.pop_front() {
        let size = call.result.as_ref().map_or(0, Bytes::len);
        let fits = batch.is_empty() || bytes + size <= MAX_BATCH_BYTES;
        if batch.len() < MAX_BATCH && fits && !ids.contains(&call.id) {
            ids.insert(call.id);
            bytes += size;
            batch.push(call);
        } else {
            held.push_back(call);
        }
        if batch.len() >= MAX_BATCH {
            break;
        }
    }
    held.append(waiting);
    *waiting = held;
    batch
}

async fn execute(shared: &Shared, settings: &StoreSettings, batch: Vec<Call>) {
    match statement(shared, settings, &batch).await {
        Ok(outcomes) => {
            for call in batch {
                let outcome = outcomes.get(&call.id).copied().ok_or_else(|| {
                    Error::corrupt(
                        format!("job {}", call.id),
                        "the completion batch did not report this job",
                    )
                });
                let _ = call.reply.send(outcome);
            }
        }
        Err(err) => {
            // Every caller gets the kind of the failure; the source goes to the log.
            tracing::debug!(error = %err, size = batch.len(), "completion batch failed");
            for call in batch {
                let _ = call.reply.send(Err(copy_error(&err)));
            }
        }
    }
}

async fn statement(
    shared: &Shared,
    settings: &StoreSettings,
    batch: &[Call],
) -> Result<HashMap<JobId, Outcome>> {
    let now = settings.now().as_millis();
    let rows = sqlx::query(shared.sql.complete.sql())
        .bind(&settings.namespace)
        .bind(batch.iter().map(|c| PgUuid::from_id(c.id)).bind_iter())
        .bind(batch.iter().map(|c| c.token).bind_iter())
        .bind(batch.iter().map(|c| c.result.as_deref()).bind_iter())
        .bind(now)
        .fetch_all(&shared.pool)
        .await
        .map_err(|err| map("complete", err))?;
    let what = || "completion batch row".to_owned();
    rows.iter()
        .map(|row| {
            let id = column::<PgUuid>(row, 0, &what)?.job_id()?;
            let completed: bool = column(row, 1, &what)?;
            let found: bool = column(row, 2, &what)?;
            let outcome = match (completed, found) {
                (true, _) => Outcome::Completed,
                (false, true) => Outcome::LeaseLost,
                (false, false) => Outcome::NotFound,
            };
            Ok((id, outcome))
        })
        .collect()
}

/// The same kind of error for each caller of a failed batch (errors do not clone).
fn copy_error(err: &Error) -> Error {
    match err {
        Error::Unavailable { message, .. } => Error::Unavailable {
            message: message.clone(),
            source: None,
        },
        Error::Corrupt { what, reason } => Error::corrupt(what.clone(), reason.clone()),
        other => Error::Backend {
            message: other.to_string(),
            source: None,
        },
    }
}
