//! The worker runtime: claims jobs, runs their handlers, keeps their leases alive,
//! reports every outcome through the lease token, and shuts down without losing work.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use jobs_core::validate::{validate_lease_ttl, validate_queue, validate_worker, MAX_CLAIM_LIMIT};
use jobs_core::{
    Backoff, ClaimRequest, ClaimedJob, Error, JobId, JobState, LeaseToken, Result, Retry, Store,
};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handler::{
    BytesHandler, CancelReason, CancelState, ErasedHandler, JobContext, JobError, JobOutput,
    JsonHandler, RetryAdvice,
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
            handlers.insert(queue, handler);
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
    handlers: HashMap<String, Arc<dyn ErasedHandler>>,
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
        let shared = Arc::new(Shared {
            config,
            metrics,
            running: Mutex::new(HashMap::new()),
            handlers_running: AtomicUsize::new(0),
            slot_freed: Notify::new(),
            reclaimed: Notify::new(),
        });
        let span = tracing::info_span!("worker", worker = %shared.config.worker_id);
        run_loop(shared, shutdown).instrument(span).await;
    }
}

/// What the worker's tasks share.
struct Shared {
    config: Config,
    metrics: WorkerMetrics,
    /// The jobs whose handlers are running, for the heartbeat.
    running: Mutex<HashMap<JobId, RunningJob>>,
    /// Handlers running now: what the concurrency limit counts.
    handlers_running: AtomicUsize,
    /// Woken when a handler returns and its slot is free.
    slot_freed: Notify,
    /// Woken when a reclaim put jobs back, so an idle worker claims them at once.
    reclaimed: Notify,
}

impl Shared {
    fn running(&self) -> MutexGuard<'_, HashMap<JobId, RunningJob>> {
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
async fn run_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
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
    let mut error_delay = ErrorDelay::default();
    loop {
        while let Some(done) = jobs.try_join_next() {
            log_job_task_end(done);
        }
        if shutdown.is_cancelled() {
            break;
        }
        // A slot frees when its handler returns; the outcome call then finishes in the
        // background, so it shares a store round trip (a group commit, a pipeline) with
        // the claim that refills the slot instead of delaying it. Outcome calls in flight
        // are bounded too, so a slow store pushes back on claiming.
        let free = config
            .concurrency
            .saturating_sub(shared.handlers_running.load(Ordering::Acquire));
        if free == 0 || jobs.len() >= 2 * config.concurrency {
            tokio::select! {
                done = jobs.join_next(), if !jobs.is_empty() => {
                    if let Some(done) = done {
                        log_job_task_end(done);
                    }
                }
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
        match config.store.claim(request).await {
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
        tokio::select! {
            waited = config.store.wait_for_work(&config.queue_names, config.poll_interval) => {
                if let Err(err) = waited {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "waiting for work failed; backing off");
                    error_delay.wait(&shutdown).await;
                }
            }
            () = shared.reclaimed.notified() => {}
            () = shutdown.cancelled() => {}
        }
    }

    // Graceful shutdown: nothing new is claimed from here on.
    tracing::info!(running = jobs.len(), "worker shutting down");
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while let Some(done) = jobs.join_next().await {
            log_job_task_end(done);
        }
    })
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
        let released = tokio::time::timeout(RELEASE_TIMEOUT, async {
            while let Some(done) = jobs.join_next().await {
                log_job_task_end(done);
            }
        })
        .await;
        if released.is_err() {
            tracing::error!(
                jobs = jobs.len(),
                "could not release every job in time; their leases will expire"
            );
        }
    }
    // Dropping the sets aborts what is left: the heartbeat, reclaim and purge loops.
    drop(jobs);
    drop(background);
    tracing::info!("worker stopped");
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

fn start_job(shared: &Arc<Shared>, jobs: &mut JoinSet<()>, claimed: ClaimedJob) {
    let cancel = Arc::new(CancelState::default());
    shared.handlers_running.fetch_add(1, Ordering::AcqRel);
    shared.running().insert(
        claimed.id(),
        RunningJob {
            token: claimed.token(),
            cancel: cancel.clone(),
        },
    );
    let span = tracing::info_span!(
        "job",
        queue = %claimed.job.queue,
        id = %claimed.job.id,
        attempt = claimed.job.attempts,
    );
    jobs.spawn(run_job(shared.clone(), claimed, cancel).instrument(span));
}

/// Frees the job's concurrency slot when dropped: when the handler returned, or when
/// the task is aborted.
struct SlotGuard<'a>(&'a Shared);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.handlers_running.fetch_sub(1, Ordering::AcqRel);
        self.0.slot_freed.notify_one();
    }
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

async fn run_job(shared: Arc<Shared>, claimed: ClaimedJob, cancel: Arc<CancelState>) {
    let config = &shared.config;
    let token = claimed.token();
    let ClaimedJob { job, payload } = claimed;
    let id = job.id;
    let queue_metrics = shared.metrics.queue(&job.queue);
    queue_metrics.claimed.increment(1);
    let picked_up_at = job
        .started_at
        .unwrap_or_else(|| config.store.settings().now());
    queue_metrics
        .pickup_latency
        .record(picked_up_at.duration_since(job.run_at).as_secs_f64());

    let Some(handler) = config.handlers.get(&job.queue).cloned() else {
        drop(SlotGuard(&shared));
        // Only a store breaking CONTRACT C4 hands out a job of a queue not asked for;
        // give it back untouched rather than guess what to run.
        shared.running().remove(&id);
        tracing::error!("claimed a job of a queue this worker does not serve; releasing it");
        report_outcome(&shared, queue_metrics, id, token, Report::Release).await;
        return;
    };

    let ctx = JobContext::new(
        job,
        token,
        config.worker_id.clone(),
        cancel.clone(),
        config.store.clone(),
    );
    let attempt = ctx.attempt();
    let started = Instant::now();
    let finished = {
        let _slot = SlotGuard(&shared);
        run_handler(handler.as_ref(), ctx, payload, &cancel, config.cancel_grace).await
    };
    queue_metrics
        .run_time
        .record(started.elapsed().as_secs_f64());
    // From here the heartbeat leaves the job alone; the outcome call ends the lease.
    shared.running().remove(&id);

    let reason = cancel.reason();
    if reason == Some(CancelReason::LeaseLost) {
        queue_metrics.lease_lost.increment(1);
        tracing::warn!("lease lost while running; the job is no longer ours to report");
        return;
    }
    let cancelled = reason == Some(CancelReason::Requested);
    let outcome = match finished {
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
            queue_metrics.panicked.increment(1);
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
    report_outcome(&shared, queue_metrics, id, token, outcome).await;
}

/// Runs the handler, catching its panics; when the job is cancelled, gives it the
/// cancel grace period to return (none at shutdown, whose grace has already passed).
async fn run_handler(
    handler: &dyn ErasedHandler,
    ctx: JobContext,
    payload: Bytes,
    cancel: &CancelState,
    cancel_grace: Duration,
) -> Finished {
    // Building the future runs the closure's synchronous part, which may panic too.
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| handler.call(ctx, payload))) {
        Ok(future) => future,
        Err(panic) => return Finished::Panicked(panic_message(panic.as_ref())),
    };
    let mut future = AssertUnwindSafe(future).catch_unwind();
    let joined = tokio::select! {
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
