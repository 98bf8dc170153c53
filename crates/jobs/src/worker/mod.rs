//! The worker runtime: claims jobs, runs their handlers, keeps their leases alive,
//! reports every outcome through the lease token, and shuts down without losing work.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use jobs_core::validate::{validate_lease_ttl, validate_queue, validate_worker, MAX_CLAIM_LIMIT};
use jobs_core::{
    Backoff, ClaimRequest, ClaimedJob, Completion, Error, JobId, JobIdMap, JobState, LeaseToken,
    Result, Retry, Store,
};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handler::{
    BytesHandler, CancelReason, CancelState, ErasedHandler, HandlerFuture, JobContext, JobError,
    JobOutput, JsonHandler, RetryAdvice,
};
use crate::telemetry::{QueueMetrics, WorkerMetrics};

/// Default lease length.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default number of handlers running at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// How many times a completion, failure or release is tried when the store is
/// unavailable, before the lease is left to expire (and the job to be reclaimed).
const REPORT_ATTEMPTS: u32 = 4;
/// How long the worker waits, after cancelling the handlers still running at the end
/// of the shutdown grace period, for their releases to reach the store.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many heartbeats are in flight at once.
const HEARTBEAT_FAN_OUT: usize = 32;
/// The most completions handed to the store in one `complete_batch` call.
const COMPLETION_BATCH: usize = 256;

/// Configures and builds a [`Worker`]. Start with [`Worker::builder`].
///
/// Every interval is real time (tokio timers), while lease expiry and retry times are
/// decided on the store's clock; tests shorten the intervals and drive a `ManualClock`.
pub struct WorkerBuilder {
    store: Arc<dyn Store>,
    handlers: Vec<(String, Arc<dyn ErasedHandler>)>,
    worker_id: Option<String>,
    concurrency: usize,
    claim_batch: usize,
    lease: Duration,
    heartbeat: Option<Duration>,
    backoff: Backoff,
    poll_interval: Duration,
    reclaim_interval: Option<Duration>,
    reclaim_batch: usize,
    purge_interval: Option<Duration>,
    purge_batch: usize,
    shutdown_grace: Duration,
    cancel_grace: Duration,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field(
                "queues",
                &self.handlers.iter().map(|(q, _)| q).collect::<Vec<_>>(),
            )
            .field("worker_id", &self.worker_id)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    fn new(store: Arc<dyn Store>) -> Self {
        WorkerBuilder {
            store,
            handlers: Vec::new(),
            worker_id: None,
            concurrency: DEFAULT_CONCURRENCY,
            claim_batch: 100,
            lease: DEFAULT_LEASE,
            heartbeat: None,
            backoff: Backoff::default(),
            poll_interval: Duration::from_secs(1),
            reclaim_interval: Some(Duration::from_secs(5)),
            reclaim_batch: 100,
            purge_interval: Some(Duration::from_secs(60)),
            purge_batch: 1_000,
            shutdown_grace: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
        }
    }

    /// Runs `handler` for the jobs of `queue`, with the raw payload bytes.
    ///
    /// The handler is an async function of the job's [`JobContext`] and payload; it
    /// returns any [`JobOutput`] (stored as the job's result) or a [`JobError`].
    pub fn handler<F, Fut, O>(mut self, queue: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, JobError>> + Send + 'static,
        O: JobOutput + 'static,
    {
        let handler = BytesHandler {
            f: handler,
            _types: PhantomData,
        };
        self.handlers.push((queue.into(), Arc::new(handler)));
        self
    }

    /// Runs `handler` for the jobs of `queue`, with the payload decoded from JSON into
    /// `T`. A payload that does not decode fails the job for good (no retry can fix it).
    pub fn json_handler<T, F, Fut, O>(mut self, queue: impl Into<String>, handler: F) -> Self
    where
        T: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(JobContext, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, JobError>> + Send + 'static,
        O: JobOutput + 'static,
    {
        let handler = JsonHandler {
            f: handler,
            _types: PhantomData,
        };
        self.handlers.push((queue.into(), Arc::new(handler)));
        self
    }

    /// The id recorded in every lease this worker takes. Default:
    /// `worker-<pid>-<random>`. Must be unique among live workers.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// How many handlers run at once. Default 16.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// The most jobs one claim asks for; a claim never asks for more than the free
    /// slots. Default 100.
    pub fn claim_batch(mut self, batch: usize) -> Self {
        self.claim_batch = batch;
        self
    }

    /// How long a claim holds a job without a heartbeat. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often every running job's lease is extended. Default: a third of the lease.
    /// Must be shorter than the lease.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// The delays between attempts of a failing job. Default: 1 s doubling to 1 h,
    /// 20 % jitter.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest wait for new work before claiming again anyway; it bounds how late
    /// a scheduled job (or one enqueued where the store cannot signal) is picked up.
    /// Default 1 s.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How often the worker takes back jobs whose lease expired (CONTRACT R1–R4).
    /// Default 5 s.
    pub fn reclaim_interval(mut self, interval: Duration) -> Self {
        self.reclaim_interval = Some(interval);
        self
    }

    /// Leaves reclaiming to other workers.
    pub fn disable_reclaim(mut self) -> Self {
        self.reclaim_interval = None;
        self
    }

    /// How often the worker deletes terminal jobs past the store's retention
    /// (`Store::purge`, CONTRACT A5). Default 60 s.
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = Some(interval);
        self
    }

    /// Leaves purging to other workers (or to nobody: then terminal jobs are kept).
    pub fn disable_purge(mut self) -> Self {
        self.purge_interval = None;
        self
    }

    /// How long shutdown waits for running handlers before releasing their jobs.
    /// Default 30 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a handler whose job was cancelled (or whose lease was lost) may keep
    /// running to wind down before the worker drops it. Default 5 s.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// Checks the configuration and builds the worker.
    pub fn build(self) -> Result<Worker> {
        if self.handlers.is_empty() {
            return Err(Error::invalid(
                "queues",
                "a worker needs at least one handler",
            ));
        }
        let mut handlers = HashMap::with_capacity(self.handlers.len());
        let mut queue_names = Vec::with_capacity(self.handlers.len());
        for (queue, handler) in self.handlers {
            validate_queue(&queue)?;
            if handlers.contains_key(&queue) {
                return Err(Error::invalid(
                    "queues",
                    format!("queue {queue:?} has two handlers"),
                ));
            }
            queue_names.push(queue.clone());
            handlers.insert(
                queue,
                QueueHandler {
                    handler,
                    inline: InlinePolls::new(),
                },
            );
        }
        let worker_id = self.worker_id.unwrap_or_else(|| {
            format!(
                "worker-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            )
        });
        validate_worker(&worker_id)?;
        validate_lease_ttl(self.lease)?;
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3);
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return Err(Error::invalid(
                "heartbeat_interval",
                "must be above zero and shorter than the lease",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid("concurrency", "must be at least 1"));
        }
        if self.claim_batch == 0 || self.claim_batch > MAX_CLAIM_LIMIT {
            return Err(Error::invalid(
                "claim_batch",
                format!("must be 1..={MAX_CLAIM_LIMIT}"),
            ));
        }
        if !(0.0..=1.0).contains(&self.backoff.jitter) || self.backoff.initial > self.backoff.max {
            return Err(Error::invalid(
                "backoff",
                "jitter must be within 0..=1 and the initial delay at most the cap",
            ));
        }
        let positive = [
            ("poll_interval", Some(self.poll_interval)),
            ("reclaim_interval", self.reclaim_interval),
            ("purge_interval", self.purge_interval),
        ];
        for (field, interval) in positive {
            if interval.is_some_and(|d| d.is_zero()) {
                return Err(Error::invalid(field, "must be above zero"));
            }
        }
        if self.reclaim_batch == 0 || self.purge_batch == 0 {
            return Err(Error::invalid("batch", "must be at least 1"));
        }
        Ok(Worker {
            config: Config {
                store: self.store,
                handlers,
                queue_names,
                worker_id: Arc::from(worker_id),
                concurrency: self.concurrency,
                claim_batch: self.claim_batch,
                lease: self.lease,
                heartbeat,
                backoff: self.backoff,
                poll_interval: self.poll_interval,
                reclaim_interval: self.reclaim_interval,
                reclaim_batch: self.reclaim_batch,
                purge_interval: self.purge_interval,
                purge_batch: self.purge_batch,
                shutdown_grace: self.shutdown_grace,
                cancel_grace: self.cancel_grace,
            },
            shutdown: CancellationToken::new(),
        })
    }
}

struct Config {
    store: Arc<dyn Store>,
    handlers: HashMap<String, QueueHandler>,
    queue_names: Vec<String>,
    worker_id: Arc<str>,
    concurrency: usize,
    claim_batch: usize,
    lease: Duration,
    heartbeat: Duration,
    backoff: Backoff,
    poll_interval: Duration,
    reclaim_interval: Option<Duration>,
    reclaim_batch: usize,
    purge_interval: Option<Duration>,
    purge_batch: usize,
    shutdown_grace: Duration,
    cancel_grace: Duration,
}

/// A queue's handler, and whether its jobs start inline (see [`start_job`]).
struct QueueHandler {
    handler: Arc<dyn ErasedHandler>,
    inline: InlinePolls,
}

/// Whether a queue's handlers get their first poll in the claim loop: yes, until
/// [`SLOW_POLLS_IN_A_ROW`] first polls in a row took over [`INLINE_POLL_LIMIT`].
///
/// A handler that computes before it first awaits would hold up the claim loop and
/// every job behind it; one slow poll is not enough to say so (the thread may just
/// have been preempted). The decision is for good: such a handler stays slow.
#[derive(Debug)]
struct InlinePolls {
    allowed: AtomicBool,
    slow_in_a_row: AtomicU32,
}

impl InlinePolls {
    fn new() -> Self {
        InlinePolls {
            allowed: AtomicBool::new(true),
            slow_in_a_row: AtomicU32::new(0),
        }
    }

    fn allowed(&self) -> bool {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Records how long a first poll took; true if that ended inline polls.
    fn record(&self, took: Duration) -> bool {
        if took <= INLINE_POLL_LIMIT {
            self.slow_in_a_row.store(0, Ordering::Relaxed);
            return false;
        }
        let in_a_row = self.slow_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        in_a_row >= SLOW_POLLS_IN_A_ROW && self.allowed.swap(false, Ordering::Relaxed)
    }
}

/// A pool of handlers over one store: claims jobs from its queues, runs them, keeps
/// their leases alive, retries failures with backoff, and shuts down gracefully.
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn jobs::Store>) -> jobs::Result<()> {
/// use jobs::{JobContext, JobError, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
///
/// let worker = Worker::builder(store)
///     .json_handler("emails", |ctx: JobContext, email: Email| async move {
///         if email.to.is_empty() {
///             return Err(JobError::permanent("no recipient"));
///         }
///         tracing::info!(attempt = ctx.attempt(), "sending to {}", email.to);
///         Ok(())
///     })
///     .concurrency(32)
///     .build()?;
/// let handle = worker.shutdown_handle();
/// // ... later, from anywhere: handle.shutdown();
/// worker.run().await;
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    config: Config,
    shutdown: CancellationToken,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.config.worker_id)
            .field("queues", &self.config.queue_names)
            .field("concurrency", &self.config.concurrency)
            .finish_non_exhaustive()
    }
}

/// Asks a running [`Worker`] to shut down. Cheap to clone; any clone works.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    token: CancellationToken,
}

impl ShutdownHandle {
    /// Starts a graceful shutdown: the worker stops claiming, waits for running
    /// handlers up to its grace period, releases what is left, and returns.
    pub fn shutdown(&self) {
        self.token.cancel();
    }

    /// Whether shutdown was asked for.
    pub fn is_shutting_down(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// A worker running on its own task, from [`Worker::spawn`].
///
/// Dropping the handle leaves the worker running; call [`WorkerHandle::shutdown`].
#[derive(Debug)]
pub struct WorkerHandle {
    shutdown: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerHandle {
    /// Shuts the worker down gracefully and waits until it has.
    pub async fn shutdown(self) {
        self.shutdown.shutdown();
        self.join().await;
    }

    /// Waits for the worker to stop (after a shutdown from any [`ShutdownHandle`]).
    pub async fn join(self) {
        if let Err(err) = self.task.await {
            if err.is_panic() {
                tracing::error!("the worker task panicked: {err}");
            }
        }
    }

    /// A handle that starts the shutdown without waiting.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Stops the worker at once, as a crash would: nothing is completed or released,
    /// and its jobs come back only when their leases expire and are reclaimed.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the worker has stopped.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Worker {
    /// Starts configuring a worker over `store`.
    pub fn builder(store: Arc<dyn Store>) -> WorkerBuilder {
        WorkerBuilder::new(store)
    }

    /// The id recorded in this worker's leases.
    pub fn worker_id(&self) -> &str {
        &self.config.worker_id
    }

    /// A handle to shut the worker down from elsewhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            token: self.shutdown.clone(),
        }
    }

    /// Runs the worker on a new tokio task.
    pub fn spawn(self) -> WorkerHandle {
        let shutdown = self.shutdown_handle();
        let task = tokio::spawn(self.run());
        WorkerHandle { shutdown, task }
    }

    /// Runs until `signal` resolves (for example `tokio::signal::ctrl_c()`), then shuts
    /// down gracefully. A shutdown through a [`ShutdownHandle`] also ends it.
    pub async fn run_until<S>(self, signal: S)
    where
        S: Future<Output = ()>,
    {
        let shutdown = self.shutdown.clone();
        let run = self.run();
        tokio::pin!(run);
        tokio::pin!(signal);
        tokio::select! {
            () = &mut run => return,
            () = &mut signal => shutdown.cancel(),
        }
        run.await;
    }

    /// Runs until a [`ShutdownHandle`] asks it to stop, then shuts down gracefully:
    /// stops claiming, waits up to the grace period for running handlers, releases the
    /// jobs of those still running (CONTRACT L8), and returns.
    ///
    /// Store errors never end the loop: they are logged, counted, and retried with a
    /// backoff, since a worker outliving a database restart is what users want.
    pub async fn run(self) {
        let Worker { config, shutdown } = self;
        let metrics = WorkerMetrics::new(&config.queue_names);
        let (completions, completed) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            config,
            metrics,
            running: Mutex::new(JobIdMap::default()),
            completions,
            handlers_running: AtomicUsize::new(0),
            slot_freed: Notify::new(),
            reclaimed: Notify::new(),
        });
        let span = tracing::info_span!("worker", worker = %shared.config.worker_id);
        run_loop(shared, completed, shutdown).instrument(span).await;
    }
}

/// What the worker's tasks share.
struct Shared {
    config: Config,
    metrics: WorkerMetrics,
    /// The jobs whose handlers are running, for the heartbeat.
    running: Mutex<JobIdMap<RunningJob>>,
    /// Successes on their way to the store, recorded in batches by the claim loop.
    completions: mpsc::UnboundedSender<Succeeded>,
    /// Handlers running now: what the concurrency limit counts.
    handlers_running: AtomicUsize,
    /// Woken when a handler returns and its slot is free.
    slot_freed: Notify,
    /// Woken when a reclaim put jobs back, so an idle worker claims them at once.
    reclaimed: Notify,
}

impl Shared {
    fn running(&self) -> MutexGuard<'_, JobIdMap<RunningJob>> {
        // A panic while holding this lock cannot leave the map half-changed (every
        // critical section is one insert, remove or copy), so a poisoned lock is fine.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

struct RunningJob {
    token: LeaseToken,
    cancel: Arc<CancelState>,
}

/// The claim loop, then the shutdown sequence.
async fn run_loop(
    shared: Arc<Shared>,
    mut completed: mpsc::UnboundedReceiver<Succeeded>,
    shutdown: CancellationToken,
) {
    let config = &shared.config;
    let mut background = JoinSet::new();
    background.spawn(heartbeat_loop(shared.clone()));
    if let Some(interval) = config.reclaim_interval {
        background.spawn(reclaim_loop(shared.clone(), interval, shutdown.clone()));
    }
    if let Some(interval) = config.purge_interval {
        background.spawn(purge_loop(shared.clone(), interval, shutdown.clone()));
    }
    tracing::info!(
        queues = ?config.queue_names,
        concurrency = config.concurrency,
        "worker started"
    );

    let mut jobs: JoinSet<()> = JoinSet::new();
    // Successes handed over by finished handlers, recorded together by this loop.
    let mut succeeded: Vec<Succeeded> = Vec::with_capacity(COMPLETION_BATCH);
    let mut error_delay = ErrorDelay::default();
    loop {
        while let Some(done) = jobs.try_join_next() {
            log_job_task_end(done);
        }
        if shutdown.is_cancelled() {
            break;
        }
        take_completions(&mut completed, &mut succeeded);
        let free = config
            .concurrency
            .saturating_sub(shared.handlers_running.load(Ordering::Acquire));
        // Failures and releases are reported by the jobs' tasks; those in flight are
        // bounded too, so a slow store pushes back on claiming.
        if free == 0 || jobs.len() >= 2 * config.concurrency {
            if !succeeded.is_empty() {
                record_completions(&shared, &mut succeeded).await;
                continue;
            }
            tokio::select! {
                done = jobs.join_next(), if !jobs.is_empty() => {
                    if let Some(done) = done {
                        log_job_task_end(done);
                    }
                }
                _ = completed.recv_many(&mut succeeded, COMPLETION_BATCH) => {}
                () = shared.slot_freed.notified() => {}
                () = shutdown.cancelled() => {}
            }
            continue;
        }
        let limit = free.min(config.claim_batch);
        let request = ClaimRequest::new(
            config.queue_names.iter().cloned(),
            config.worker_id.as_ref(),
            config.lease,
        )
        .limit(limit);
        // The completions and the claim that refills their slots go out together: they
        // share a round trip (a group commit, a pipeline) where the store allows, and
        // run one after the other on this task where it does not (the memory store),
        // never contending for the same lock from two threads.
        let ((), claimed) = tokio::join!(
            record_completions(&shared, &mut succeeded),
            config.store.claim(request)
        );
        match claimed {
            Ok(claimed) => {
                error_delay.reset();
                let full = claimed.len() >= limit;
                for job in claimed {
                    start_job(&shared, &mut jobs, job);
                }
                if full {
                    continue;
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "claim failed; backing off");
                error_delay.wait(&shutdown).await;
                continue;
            }
        }
        take_completions(&mut completed, &mut succeeded);
        if !succeeded.is_empty() {
            // Jobs that finished at once: record them before waiting for more work.
            record_completions(&shared, &mut succeeded).await;
        }
        tokio::select! {
            waited = config.store.wait_for_work(&config.queue_names, config.poll_interval) => {
                if let Err(err) = waited {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "waiting for work failed; backing off");
                    error_delay.wait(&shutdown).await;
                }
            }
            // A handler finished: its success is recorded and its slot refilled.
            _ = completed.recv_many(&mut succeeded, COMPLETION_BATCH) => {}
            () = shared.slot_freed.notified() => {}
            () = shared.reclaimed.notified() => {}
            () = shutdown.cancelled() => {}
        }
    }

    // Graceful shutdown: nothing new is claimed from here on.
    tracing::info!(running = jobs.len(), "worker shutting down");
    let drained = tokio::time::timeout(
        config.shutdown_grace,
        finish_jobs(&shared, &mut jobs, &mut completed, &mut succeeded),
    )
    .await;
    if drained.is_err() {
        let left: Vec<Arc<CancelState>> = shared
            .running()
            .values()
            .map(|job| job.cancel.clone())
            .collect();
        tracing::warn!(
            jobs = left.len(),
            "shutdown grace period over; releasing unfinished jobs"
        );
        for cancel in left {
            cancel.cancel(CancelReason::Shutdown);
        }
        let released = tokio::time::timeout(
            RELEASE_TIMEOUT,
            finish_jobs(&shared, &mut jobs, &mut completed, &mut succeeded),
        )
        .await;
        if released.is_err() {
            tracing::error!(
                jobs = jobs.len() + succeeded.len(),
                "could not release or complete every job in time; their leases will expire"
            );
        }
    }
    // Dropping the sets aborts what is left: the heartbeat, reclaim and purge loops.
    drop(jobs);
    drop(background);
    tracing::info!("worker stopped");
}

/// Moves every success handed over so far into `succeeded`, up to a batch.
fn take_completions(
    completed: &mut mpsc::UnboundedReceiver<Succeeded>,
    succeeded: &mut Vec<Succeeded>,
) {
    while succeeded.len() < COMPLETION_BATCH {
        match completed.try_recv() {
            Ok(done) => succeeded.push(done),
            Err(_) => break,
        }
    }
}

/// Waits for every job task to end, recording successes as they come (a success left
/// waiting would let its lease run out), then records the last ones.
async fn finish_jobs(
    shared: &Shared,
    jobs: &mut JoinSet<()>,
    completed: &mut mpsc::UnboundedReceiver<Succeeded>,
    succeeded: &mut Vec<Succeeded>,
) {
    loop {
        take_completions(completed, succeeded);
        if !succeeded.is_empty() {
            record_completions(shared, succeeded).await;
            continue;
        }
        tokio::select! {
            done = jobs.join_next() => match done {
                Some(done) => log_job_task_end(done),
                None => break,
            },
            _ = completed.recv_many(succeeded, COMPLETION_BATCH) => {}
        }
    }
    // Every task has ended; what it handed over is in the channel.
    take_completions(completed, succeeded);
    while !succeeded.is_empty() {
        record_completions(shared, succeeded).await;
        take_completions(completed, succeeded);
    }
}

fn log_job_task_end(done: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(err) = done {
        // Handlers' panics are caught inside the task; this is the runtime's own.
        if err.is_panic() {
            tracing::error!("a job task panicked: {err}");
        }
    }
}

/// Doubling wait after store errors, 100 ms up to 5 s, cut short by shutdown.
#[derive(Default)]
struct ErrorDelay {
    next: Option<Duration>,
}

impl ErrorDelay {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn reset(&mut self) {
        self.next = None;
    }

    async fn wait(&mut self, shutdown: &CancellationToken) {
        let delay = self.next.unwrap_or(Self::FIRST);
        self.next = Some((delay * 2).min(Self::MAX));
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// Starts a claimed job's handler. A handler whose queue runs inline is polled once
/// right here: most short handlers finish in that poll, and then the job costs no task,
/// no wake-up and no thread hand-off. One that does not finish goes on in a task of its
/// own, as every handler of a queue whose first polls proved slow does from the start.
fn start_job(shared: &Arc<Shared>, jobs: &mut JoinSet<()>, claimed: ClaimedJob) {
    let config = &shared.config;
    let token = claimed.token();
    let ClaimedJob { job, payload } = claimed;
    let id = job.id;
    let span = tracing::info_span!(
        "job",
        queue = %job.queue,
        id = %job.id,
        attempt = job.attempts,
    );
    let _entered = span.enter();
    let metrics = Arc::clone(shared.metrics.queue(&job.queue));
    metrics.claimed.increment(1);
    let picked_up_at = job
        .started_at
        .unwrap_or_else(|| config.store.settings().now());
    metrics
        .pickup_latency
        .record(picked_up_at.duration_since(job.run_at).as_secs_f64());

    let Some(queue) = config.handlers.get(&job.queue) else {
        // Only a store breaking CONTRACT C4 hands out a job of a queue not asked for;
        // give it back untouched rather than guess what to run.
        tracing::error!("claimed a job of a queue this worker does not serve; releasing it");
        let (shared, span) = (Arc::clone(shared), span.clone());
        jobs.spawn(
            async move { report_outcome(&shared, &metrics, id, token, Report::Release).await }
                .instrument(span),
        );
        return;
    };

    let cancel = Arc::new(CancelState::default());
    let slot = SlotGuard::take(shared);
    shared.running().insert(
        id,
        RunningJob {
            token,
            cancel: cancel.clone(),
        },
    );
    let ctx = JobContext::new(
        job,
        token,
        config.worker_id.clone(),
        cancel.clone(),
        config.store.clone(),
    );
    let begun = Begun {
        id,
        token,
        attempt: ctx.attempt(),
        started: Instant::now(),
        metrics,
        cancel,
    };
    // Building the future runs the closure's synchronous part, which may panic too.
    let handler = Arc::clone(&queue.handler);
    let mut future = match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(ctx, payload)))
    {
        Ok(future) => future,
        Err(panic) => {
            slot.free_inline();
            let finished = Finished::Panicked(panic_message(panic.as_ref()));
            conclude_inline(shared, jobs, begun, finished, &span);
            return;
        }
    };
    if queue.inline.allowed() {
        // No waker to give: if the handler is not done, its task polls it again at once
        // and registers its own, so nothing it waits for can be missed.
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
        if queue.inline.record(begun.started.elapsed()) {
            tracing::info!(
                "the handler's first polls are slow; its queue's jobs now start in tasks"
            );
        }
        let finished = match polled {
            Ok(Poll::Ready(result)) => Some(Finished::Returned(result)),
            // Not done: it goes on below, in a task.
            Ok(Poll::Pending) => None,
            Err(panic) => Some(Finished::Panicked(panic_message(panic.as_ref()))),
        };
        if let Some(finished) = finished {
            slot.free_inline();
            conclude_inline(shared, jobs, begun, finished, &span);
            return;
        }
    }
    let shared = Arc::clone(shared);
    let cancel_grace = config.cancel_grace;
    jobs.spawn(
        async move {
            let finished = {
                let _slot = slot;
                run_handler(future, &begun.cancel, cancel_grace).await
            };
            if let Some(report) = conclude(&shared, &begun, finished) {
                report_outcome(&shared, &begun.metrics, begun.id, begun.token, report).await;
            }
        }
        .instrument(span.clone()),
    );
}

/// First polls of a queue's handler taking longer than this, [`SLOW_POLLS_IN_A_ROW`]
/// times in a row, move its jobs to tasks.
const INLINE_POLL_LIMIT: Duration = Duration::from_micros(50);
/// See [`INLINE_POLL_LIMIT`].
const SLOW_POLLS_IN_A_ROW: u32 = 4;

/// Frees the job's concurrency slot when dropped: when the handler returned, or when
/// the task is aborted.
struct SlotGuard {
    shared: Arc<Shared>,
    /// Whether to wake the claim loop: not when the claim loop frees it itself.
    wake: bool,
}

impl SlotGuard {
    fn take(shared: &Arc<Shared>) -> Self {
        shared.handlers_running.fetch_add(1, Ordering::AcqRel);
        SlotGuard {
            shared: Arc::clone(shared),
            wake: true,
        }
    }

    /// Frees the slot from the claim loop, which will see it free without a wake-up.
    fn free_inline(mut self) {
        self.wake = false;
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.shared.handlers_running.fetch_sub(1, Ordering::AcqRel);
        if self.wake {
            self.shared.slot_freed.notify_one();
        }
    }
}

/// A job whose handler was called.
struct Begun {
    id: JobId,
    token: LeaseToken,
    attempt: u32,
    started: Instant,
    metrics: Arc<QueueMetrics>,
    cancel: Arc<CancelState>,
}

/// How a handler ended.
enum Finished {
    /// It returned.
    Returned(std::result::Result<Option<Bytes>, JobError>),
    /// It panicked, with this message.
    Panicked(String),
    /// The worker dropped it: cancelled and not done within the grace period.
    Dropped,
}

/// Concludes a job that finished in its first poll: a success goes to the claim loop,
/// any other outcome to a task of its own.
fn conclude_inline(
    shared: &Arc<Shared>,
    jobs: &mut JoinSet<()>,
    begun: Begun,
    finished: Finished,
    span: &tracing::Span,
) {
    if let Some(report) = conclude(shared, &begun, finished) {
        let shared = Arc::clone(shared);
        jobs.spawn(
            async move {
                report_outcome(&shared, &begun.metrics, begun.id, begun.token, report).await;
            }
            .instrument(span.clone()),
        );
    }
}

/// Takes a finished handler's job out of the heartbeat's hands and decides what to
/// report. A success is handed to the claim loop here (`None` is returned, as when the
/// lease was lost and there is nothing to report); the rest is left to the caller.
fn conclude(shared: &Shared, begun: &Begun, finished: Finished) -> Option<Report> {
    let config = &shared.config;
    begun
        .metrics
        .run_time
        .record(begun.started.elapsed().as_secs_f64());
    // From here the heartbeat leaves the job alone; the outcome call ends the lease.
    shared.running().remove(&begun.id);

    let reason = begun.cancel.reason();
    if reason == Some(CancelReason::LeaseLost) {
        begun.metrics.lease_lost.increment(1);
        tracing::warn!("lease lost while running; the job is no longer ours to report");
        return None;
    }
    let cancelled = reason == Some(CancelReason::Requested);
    let attempt = begun.attempt;
    let report = match finished {
        Finished::Returned(Ok(result)) => Report::Complete(result),
        Finished::Returned(Err(error)) if cancelled => {
            Report::Fail(format!("cancelled: {}", error.to_error_text()), None)
        }
        Finished::Returned(Err(error)) => {
            let retry_in = match error.retry {
                RetryAdvice::Backoff => Some(config.backoff.delay(attempt)),
                RetryAdvice::After(delay) => Some(delay),
                RetryAdvice::Never => None,
            };
            Report::Fail(error.to_error_text(), retry_in)
        }
        Finished::Panicked(message) => {
            begun.metrics.panicked.increment(1);
            let text = format!("handler panicked: {message}");
            if cancelled {
                Report::Fail(text, None)
            } else {
                Report::Fail(text, Some(config.backoff.delay(attempt)))
            }
        }
        Finished::Dropped if cancelled => Report::Fail(
            "cancelled: the handler did not stop within the cancel grace period".to_owned(),
            None,
        ),
        Finished::Dropped => Report::Release,
    };
    let Report::Complete(result) = report else {
        return Some(report);
    };
    // Successes are the common case and need no answer here: the claim loop records
    // them in batches, so a thousand short jobs cost a few store calls.
    let handed_over = shared.completions.send(Succeeded {
        completion: Completion::new(begun.id, begun.token, result),
        metrics: Arc::clone(&begun.metrics),
    });
    match handed_over {
        Ok(()) => None,
        Err(mpsc::error::SendError(succeeded)) => {
            // The claim loop is gone only if the worker's own task was aborted midway;
            // report this one directly rather than drop it.
            Some(Report::Complete(succeeded.completion.result))
        }
    }
}

/// A handler's success, waiting for the claim loop to record it.
struct Succeeded {
    completion: Completion,
    metrics: Arc<QueueMetrics>,
}

/// Records a batch of successes with `complete_batch`, trying again what failed for
/// an unavailable store, as `report_outcome` does for one job. Leaves `batch` empty.
async fn record_completions(shared: &Shared, batch: &mut Vec<Succeeded>) {
    let store = &shared.config.store;
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=REPORT_ATTEMPTS {
        if batch.is_empty() {
            return;
        }
        let last_attempt = attempt == REPORT_ATTEMPTS;
        let completions = batch.iter().map(|done| done.completion.clone()).collect();
        // What to try again after the back-off: the whole batch, or its failed entries.
        let again = match store.complete_batch(completions).await {
            Ok(answers) => answer_each(shared, batch, answers, last_attempt),
            Err(err) if err.is_retryable() && !last_attempt => std::mem::take(batch),
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::error!(
                    error = %err,
                    jobs = batch.len(),
                    "could not record completions; the leases will expire and the jobs run again"
                );
                batch.clear();
                return;
            }
        };
        if again.is_empty() {
            return;
        }
        shared.metrics.store_errors.increment(1);
        tracing::warn!(jobs = again.len(), "recording completions failed; retrying");
        *batch = again;
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
}

/// Counts and logs each answer of a `complete_batch` call, draining `batch`; returns
/// the entries the store was unavailable for, to try again unless this was the last try.
fn answer_each(
    shared: &Shared,
    batch: &mut Vec<Succeeded>,
    answers: Vec<Result<()>>,
    last_attempt: bool,
) -> Vec<Succeeded> {
    if answers.len() != batch.len() {
        shared.metrics.store_errors.increment(1);
        tracing::error!(
            entries = batch.len(),
            answers = answers.len(),
            "the store answered a different number of completions than it was given"
        );
    }
    let mut again = Vec::new();
    for (done, answer) in batch.drain(..).zip(answers) {
        let id = done.completion.id;
        match answer {
            Ok(()) => {
                done.metrics.succeeded.increment(1);
                tracing::debug!(job = %id, "job succeeded");
            }
            Err(err) if err.is_retryable() && !last_attempt => again.push(done),
            Err(err) if err.is_lease_lost() || err.is_not_found() => {
                done.metrics.lease_lost.increment(1);
                tracing::warn!(job = %id, error = %err, "lease lost before the outcome was recorded");
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::error!(
                    job = %id,
                    error = %err,
                    "could not record the outcome; the lease will expire and the job run again"
                );
            }
        }
    }
    again
}

/// Runs a handler's future to its end, catching its panics; when the job is cancelled,
/// gives it the cancel grace period to return (none at shutdown, whose grace has
/// already passed).
async fn run_handler(
    future: HandlerFuture,
    cancel: &CancelState,
    cancel_grace: Duration,
) -> Finished {
    let mut future = AssertUnwindSafe(future).catch_unwind();
    let joined = tokio::select! {
        // The handler first: most return at once, before a cancellation could matter,
        // and polling the token first would register a waiter only to drop it.
        biased;
        joined = &mut future => Some(joined),
        () = cancel.token.cancelled() => None,
    };
    let joined = match joined {
        Some(joined) => joined,
        None if cancel.reason() == Some(CancelReason::Shutdown) => return Finished::Dropped,
        None => match tokio::time::timeout(cancel_grace, &mut future).await {
            Ok(joined) => joined,
            Err(_) => return Finished::Dropped,
        },
    };
    match joined {
        Ok(result) => Finished::Returned(result),
        Err(panic) => Finished::Panicked(panic_message(panic.as_ref())),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// The call that ends a job's lease.
enum Report {
    Complete(Option<Bytes>),
    /// The error text and, if the job may retry, after how long (store clock).
    Fail(String, Option<Duration>),
    Release,
}

async fn report_outcome(
    shared: &Shared,
    metrics: &QueueMetrics,
    id: JobId,
    token: LeaseToken,
    outcome: Report,
) {
    let store = &shared.config.store;
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=REPORT_ATTEMPTS {
        let result = match &outcome {
            Report::Complete(result) => store
                .complete(id, token, result.clone())
                .await
                .map(|()| JobState::Succeeded),
            Report::Fail(error, retry_in) => {
                let retry = match retry_in {
                    Some(delay) => Retry::At(store.settings().now().saturating_add(*delay)),
                    None => Retry::Never,
                };
                store.fail(id, token, error, retry).await
            }
            Report::Release => store.release(id, token).await.map(|()| JobState::Queued),
        };
        match result {
            Ok(state) => {
                count_outcome(metrics, &outcome, state);
                return;
            }
            Err(err) if err.is_retryable() && attempt < REPORT_ATTEMPTS => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "reporting the outcome failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(err) if err.is_lease_lost() || err.is_not_found() => {
                metrics.lease_lost.increment(1);
                tracing::warn!(error = %err, "lease lost before the outcome was recorded");
                return;
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::error!(
                    error = %err,
                    "could not record the outcome; the lease will expire and the job run again"
                );
                return;
            }
        }
    }
}

fn count_outcome(metrics: &QueueMetrics, outcome: &Report, state: JobState) {
    match outcome {
        Report::Complete(_) => {
            metrics.succeeded.increment(1);
            tracing::debug!("job succeeded");
        }
        Report::Fail(error, _) => {
            metrics.failed.increment(1);
            match state {
                JobState::Dead => {
                    metrics.dead.increment(1);
                    tracing::error!(error = %error, "job failed for good (dead)");
                }
                JobState::Cancelled => {
                    metrics.cancelled.increment(1);
                    tracing::info!("job cancelled");
                }
                _ => {
                    metrics.retried.increment(1);
                    tracing::warn!(error = %error, "job failed; will retry");
                }
            }
        }
        Report::Release => {
            if state == JobState::Queued {
                metrics.released.increment(1);
                tracing::info!("job released");
            }
        }
    }
}

/// Extends the lease of every running job each heartbeat interval, and cancels the
/// handlers whose job was cancelled or whose lease is gone.
async fn heartbeat_loop(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate; a job just claimed has a fresh lease.
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let due: Vec<(JobId, LeaseToken, Arc<CancelState>)> = shared
            .running()
            .iter()
            .filter(|(_, job)| job.cancel.reason() != Some(CancelReason::LeaseLost))
            .map(|(id, job)| (*id, job.token, job.cancel.clone()))
            .collect();
        futures::stream::iter(due)
            .for_each_concurrent(HEARTBEAT_FAN_OUT, |(id, token, cancel)| {
                let shared = &shared;
                async move {
                    match shared
                        .config
                        .store
                        .heartbeat(id, token, shared.config.lease)
                        .await
                    {
                        Ok(beat) if beat.cancel_requested => {
                            if !cancel.token.is_cancelled() {
                                tracing::info!(job = %id, "cancellation requested; stopping the handler");
                            }
                            cancel.cancel(CancelReason::Requested);
                        }
                        Ok(_) => {}
                        Err(err) if err.is_lease_lost() || err.is_not_found() => {
                            tracing::warn!(job = %id, "lease lost; stopping the handler");
                            cancel.cancel(CancelReason::LeaseLost);
                        }
                        Err(err) => {
                            shared.metrics.store_errors.increment(1);
                            tracing::warn!(job = %id, error = %err, "heartbeat failed");
                        }
                    }
                }
            })
            .await;
    }
}

/// Takes back jobs whose lease expired, every interval, until none are left.
async fn reclaim_loop(shared: Arc<Shared>, interval: Duration, stop: CancellationToken) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        loop {
            match config.store.reclaim(config.reclaim_batch).await {
                Ok(reclaimed) => {
                    let mut requeued = false;
                    for job in &reclaimed {
                        shared.metrics.reclaimed(job.state).increment(1);
                        requeued |= job.state == JobState::Queued;
                        tracing::info!(job = %job.id, state = %job.state, "reclaimed an expired lease");
                    }
                    if requeued {
                        shared.reclaimed.notify_one();
                    }
                    if reclaimed.len() < config.reclaim_batch {
                        break;
                    }
                }
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "reclaim failed");
                    break;
                }
            }
        }
    }
}

/// Deletes terminal jobs past retention (CONTRACT A5), every interval.
async fn purge_loop(shared: Arc<Shared>, interval: Duration, stop: CancellationToken) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        loop {
            match config.store.purge(config.purge_batch).await {
                Ok(deleted) => {
                    shared.metrics.purged.increment(deleted);
                    if deleted > 0 {
                        tracing::debug!(deleted, "purged jobs past retention");
                    }
                    if deleted < config.purge_batch as u64 {
                        break;
                    }
                }
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "purge failed");
                    break;
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_polls_end_after_slow_polls_in_a_row_only() {
        let fast = INLINE_POLL_LIMIT;
        let slow = INLINE_POLL_LIMIT + Duration::from_micros(1);
        let polls = InlinePolls::new();
        for _ in 0..10 {
            for _ in 1..SLOW_POLLS_IN_A_ROW {
                assert!(!polls.record(slow));
            }
            assert!(!polls.record(fast), "a fast poll breaks the streak");
            assert!(polls.allowed());
        }
        for _ in 1..SLOW_POLLS_IN_A_ROW {
            assert!(!polls.record(slow));
        }
        assert!(
            polls.record(slow),
            "the last slow poll of the streak ends inline polls"
        );
        assert!(!polls.allowed());
        assert!(!polls.record(slow), "ended once, reported once");
        assert!(!polls.record(fast));
        assert!(!polls.allowed(), "for good");
    }
}
