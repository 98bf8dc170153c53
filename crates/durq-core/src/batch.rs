//! Group commit: concurrent calls of one kind answered by one statement (or one script
//! call), each caller getting its own answer.
//!
//! A durable write costs a round trip and, on a database, a commit that waits for the
//! disk. A [`Batcher`] queues its store's calls to a background task, which takes every
//! call waiting at that moment (without delay: a lone call goes out alone) and hands
//! them to [`Batch::run`] together. While one batch runs, the next gathers, so batches
//! grow with the load and the cost per call falls as it rises.
//!
//! Everything is bounded ([`Limits`]): the calls and bytes of one batch, the batches in
//! flight, and the calls queued behind them. A caller that finds the queue full waits
//! for room (backpressure), so a producer faster than the server slows down instead of
//! growing the process's memory.
//!
//! An answer whose caller stopped waiting goes to [`Batch::undelivered`], where a kind
//! whose answers hand something over (PostgreSQL's limited claims hand over leased
//! jobs) gives it back.
//!
//! Enabled by the `batch` feature; the PostgreSQL and Redis backends use it.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{Error, Result};

/// How large batches grow, and how much waits behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most calls in one batch.
    pub max_calls: usize,
    /// Most bytes (as [`Batch::size`] counts them) in one batch; one larger call
    /// still goes, alone.
    pub max_bytes: usize,
    /// Batches running at once.
    pub in_flight: usize,
    /// Calls waiting for a batch at most; a caller beyond that waits to be queued.
    pub queued: usize,
}

/// One kind of call that can be answered many at a time.
pub trait Batch: Send + Sync + 'static {
    /// One caller's request.
    type Call: Send + 'static;
    /// One caller's answer.
    type Answer: Send + 'static;
    /// Calls with equal keys never share a batch (one would see the other's write as
    /// its own); the later one goes in a later batch.
    type Key: Eq + Hash;

    /// The bounds of this kind's batches and queue.
    const LIMITS: Limits;

    /// The exclusivity key of a call, if it has one. By default no call has one.
    fn key(call: &Self::Call) -> Option<Self::Key> {
        let _ = call;
        None
    }

    /// The bytes a call adds to a batch.
    fn size(call: &Self::Call) -> usize;

    /// Answers every call of a batch, in order; an error fails them all.
    fn run(&self, calls: &[Self::Call]) -> impl Future<Output = Result<Vec<Self::Answer>>> + Send;

    /// Takes back an answer whose caller stopped waiting before it came. By default it
    /// is dropped; a kind whose answers hand something over that the caller would have
    /// had to give back (jobs leased to it) gives it back here.
    fn undelivered(&self, answer: Self::Answer) -> impl Future<Output = ()> + Send {
        drop(answer);
        async {}
    }
}

struct Queued<B: Batch> {
    call: B::Call,
    reply: oneshot::Sender<Result<B::Answer>>,
}

/// The queue of one store's calls of kind `B`. Its task starts on first use, on the
/// runtime of that call, and ends when the batcher drops.
pub struct Batcher<B: Batch> {
    batch: Arc<B>,
    sender: Mutex<Option<mpsc::Sender<Queued<B>>>>,
}

impl<B: Batch> fmt::Debug for Batcher<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("limits", &B::LIMITS)
            .finish_non_exhaustive()
    }
}

impl<B: Batch> Batcher<B> {
    /// A batcher whose batches `batch` runs.
    pub fn new(batch: B) -> Self {
        Batcher {
            batch: Arc::new(batch),
            sender: Mutex::new(None),
        }
    }

    /// Queues `call` (waiting while the queue is full) and waits for its batch's
    /// answer. Dropping the future before it is queued leaves nothing behind;
    /// dropping it later leaves the call to run without anyone waiting, its answer to
    /// [`Batch::undelivered`].
    pub async fn call(&self, call: B::Call) -> Result<B::Answer> {
        let (reply, answer) = oneshot::channel();
        let mut queued = Queued { call, reply };
        // A task ends with its runtime; a store used from a new runtime starts a new
        // task there. Twice is enough: a task started just now on a live runtime
        // takes the call.
        let mut sent = false;
        for _ in 0..2 {
            let sender = self.sender()?;
            match sender.send(queued).await {
                Ok(()) => {
                    sent = true;
                    break;
                }
                Err(mpsc::error::SendError(back)) => queued = back,
            }
        }
        if !sent {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The live task's sender, starting the task if there is none.
    fn sender(&self) -> Result<mpsc::Sender<Queued<B>>> {
        let mut sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(live) = sender.as_ref().filter(|live| !live.is_closed()) {
            return Ok(live.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Unavailable {
            message: "a batched call needs a Tokio runtime".to_owned(),
            source: None,
        })?;
        let (tx, rx) = mpsc::channel(B::LIMITS.queued.max(1));
        runtime.spawn(gather(rx, Arc::clone(&self.batch)));
        *sender = Some(tx.clone());
        Ok(tx)
    }
}

fn stopped() -> Error {
    Error::Unavailable {
        message: "the batching task stopped (its runtime shut down)".to_owned(),
        source: None,
    }
}

async fn gather<B: Batch>(mut calls: mpsc::Receiver<Queued<B>>, batch: Arc<B>) {
    let limits = B::LIMITS;
    let in_flight = Arc::new(Semaphore::new(limits.in_flight.max(1)));
    let mut waiting: VecDeque<Queued<B>> = VecDeque::new();
    let max_calls = limits.max_calls.max(1);
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
        // Twice a batch, so calls held back by a key still leave a full batch behind.
        while waiting.len() < max_calls * 2 {
            match calls.try_recv() {
                Ok(call) => waiting.push_back(call),
                Err(_) => break,
            }
        }
        let taken = take::<B>(&mut waiting, &limits);
        let batch = Arc::clone(&batch);
        tokio::spawn(async move {
            let (calls, replies): (Vec<B::Call>, Vec<_>) =
                taken.into_iter().map(|q| (q.call, q.reply)).unzip();
            match batch.run(&calls).await {
                Ok(answers) if answers.len() == calls.len() => {
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        if let Err(Ok(answer)) = reply.send(Ok(answer)) {
                            batch.undelivered(answer).await;
                        }
                    }
                }
                Ok(answers) => {
                    let reason = format!("{} answers for {} calls", answers.len(), calls.len());
                    let err = Error::corrupt("batch", reason);
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
                Err(err) => {
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
fn take<B: Batch>(waiting: &mut VecDeque<Queued<B>>, limits: &Limits) -> Vec<Queued<B>> {
    let mut taken = Vec::new();
    let mut keys = HashSet::new();
    let mut bytes = 0usize;
    let mut held = VecDeque::new();
    while let Some(queued) = waiting.pop_front() {
        let size = B::size(&queued.call);
        let fits = taken.is_empty() || bytes.saturating_add(size) <= limits.max_bytes;
        let key = B::key(&queued.call);
        let free = key.as_ref().is_none_or(|key| !keys.contains(key));
        if fits && free {
            if let Some(key) = key {
                keys.insert(key);
            }
            bytes = bytes.saturating_add(size);
            taken.push(queued);
            if taken.len() >= limits.max_calls.max(1) {
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
