//! Gathering concurrent calls of one kind into one statement.
//!
//! Every durable statement costs a round trip and a commit that waits for the disk.
//! Calls are queued to a background task, which takes every call waiting at that
//! moment (without delay: a lone call goes out alone) and runs them as one statement;
//! each caller gets its own answer. While a statement runs, the next batch gathers, so
//! batches grow with the load and the cost per call falls as it rises.
//!
//! Each call carries the instant its caller's `Store` handle read, and a statement
//! takes effect at the latest instant among its calls. That instant falls inside
//! every one of those calls: each began before its own instant was read, and none is
//! answered before the statement, which runs after every instant was read. So each
//! call takes effect while its caller waits, as it would alone. (With a manual clock,
//! the calls of one statement normally share one instant anyway.)

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use jobs_core::{Error, Result, Timestamp};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// One kind of call that can be answered many at a time.
pub(crate) trait Batch: Send + Sync + 'static {
    /// One caller's request.
    type Call: Send + 'static;
    /// One caller's answer.
    type Answer: Send + 'static;
    /// Calls with equal keys never share a statement (they would see each other's
    /// writes as their own); the later one waits for the next batch.
    type Key: Eq + Hash;

    /// Most calls in one statement.
    const MAX_CALLS: usize;
    /// Most bytes in one statement; one larger call still goes, alone.
    const MAX_BYTES: usize;
    /// Statements of this kind in flight at once.
    const IN_FLIGHT: usize;

    /// The exclusivity key of a call, if it has one.
    fn key(call: &Self::Call) -> Option<Self::Key>;

    /// The bytes a call adds to the statement.
    fn size(call: &Self::Call) -> usize;

    /// The instant the call's caller read.
    fn now(call: &Self::Call) -> Timestamp;

    /// Answers every call, in order, with one statement taking effect at `now`; an
    /// error fails them all.
    fn run(
        &self,
        calls: &[Self::Call],
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Self::Answer>>> + Send;
}

struct Queued<B: Batch> {
    call: B::Call,
    reply: oneshot::Sender<Result<B::Answer>>,
}

/// The queue of one store's calls of kind `B`, with its task started on first use.
pub(crate) struct Batcher<B: Batch> {
    sender: Mutex<Option<mpsc::UnboundedSender<Queued<B>>>>,
}

impl<B: Batch> Default for Batcher<B> {
    fn default() -> Self {
        Batcher {
            sender: Mutex::new(None),
        }
    }
}

impl<B: Batch> std::fmt::Debug for Batcher<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl<B: Batch> Batcher<B> {
    /// Queues `call` for the next statement and waits for its answer. `batch` runs
    /// the statements if this call has to start the task.
    pub(crate) async fn call(&self, batch: impl FnOnce() -> B, call: B::Call) -> Result<B::Answer> {
        let (reply, answer) = oneshot::channel();
        self.send(batch, Queued { call, reply })?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn send(&self, batch: impl FnOnce() -> B, mut queued: Queued<B>) -> Result<()> {
        let mut sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // The task ends when its runtime does; a store used from a new runtime
        // starts a new task there.
        if let Some(live) = sender.as_ref() {
            match live.send(queued) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => queued = back,
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, Arc::new(batch())));
        tx.send(queued).map_err(|_| stopped())?;
        *sender = Some(tx);
        Ok(())
    }
}

fn stopped() -> Error {
    Error::Unavailable {
        message: "the batching task stopped (its runtime shut down)".to_owned(),
        source: None,
    }
}

async fn run<B: Batch>(mut calls: mpsc::UnboundedReceiver<Queued<B>>, batch: Arc<B>) {
    let in_flight = Arc::new(Semaphore::new(B::IN_FLIGHT));
    let mut waiting: VecDeque<Queued<B>> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match calls.recv().await {
                Some(call) => waiting.push_back(call),
                None => return,
            }
            // One turn of the scheduler lets the rest of a burst (a worker completing
            // the jobs of one claim) join the first call instead of trailing it.
            tokio::task::yield_now().await;
        }
        // Gather while every slot is busy: the longer the wait, the bigger the batch.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        while waiting.len() < B::MAX_CALLS * 2 {
            match calls.try_recv() {
                Ok(call) => waiting.push_back(call),
                Err(_) => break,
            }
        }
        let taken = take::<B>(&mut waiting);
        let batch = Arc::clone(&batch);
        tokio::spawn(async move {
            let (calls, replies): (Vec<B::Call>, Vec<_>) =
                taken.into_iter().map(|q| (q.call, q.reply)).unzip();
            // `take` never returns an empty batch; with nothing taken, nobody waits.
            let Some(now) = calls.iter().map(B::now).max() else {
                return;
            };
            match batch.run(&calls, now).await {
                Ok(answers) if answers.len() == calls.len() => {
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        let _ = reply.send(Ok(answer));
                    }
                }
                Ok(answers) => {
                    let reason = format!("{} answers for {} calls", answers.len(), calls.len());
                    for reply in replies {
                        let _ = reply.send(Err(Error::corrupt("batch", reason.clone())));
                    }
                }
                Err(err) => {
                    tracing::debug!(error = %err, size = calls.len(), "batched statement failed");
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Takes calls in arrival order up to the limits, at most one per key.
fn take<B: Batch>(waiting: &mut VecDeque<Queued<B>>) -> Vec<Queued<B>> {
    let mut taken = Vec::new();
    let mut keys = HashSet::new();
    let mut bytes = 0usize;
    let mut held = VecDeque::new();
    while let Some(queued) = waiting.pop_front() {
        let size = B::size(&queued.call);
        let fits = taken.is_empty() || bytes.saturating_add(size) <= B::MAX_BYTES;
        let key = B::key(&queued.call);
        let free = key.as_ref().is_none_or(|key| !keys.contains(key));
        if fits && free {
            if let Some(key) = key {
                keys.insert(key);
            }
            bytes = bytes.saturating_add(size);
            taken.push(queued);
            if taken.len() >= B::MAX_CALLS {
                break;
            }
        } else {
            held.push_back(queued);
        }
    }
    held.append(waiting);
    *waiting = held;
    taken
}
