//! The worker's configuration: [`WorkerBuilder`], checked once by `build`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use durq_core::validate::{
    validate_claim, validate_fit_keys, validate_lease_ttl, validate_new_job, validate_queue,
    validate_worker, MAX_CLAIM_LIMIT,
};
use durq_core::{Backoff, Budget, Capability, ClaimRequest, Error, Result, Schedule, Store};
use tokio_util::sync::CancellationToken;

use super::events::{Hooks, JobEvent};
use super::job::{InlinePolls, QueueHandler};
use super::Worker;
use crate::handler::{BytesHandler, JobContext, JobError, JobOutput, JsonHandler};

/// Default lease length.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default number of handlers running at once.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// Default time limit of one attempt, as asynq's: long enough for most work, short
/// enough that a hung handler gives its slot back the same day.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default length of one poll of a handler above which the worker logs it as blocking.
pub const DEFAULT_BLOCKING_THRESHOLD: Duration = Duration::from_millis(100);

/// Where handlers run.
#[derive(Clone)]
pub(crate) enum HandlerRuntime {
    /// Chosen by the store (see [`Capabilities::tied_to_runtime`](durq_core::Capabilities::tied_to_runtime)): on
    /// the worker's runtime when the store's calls do not need that runtime, else on a
    /// runtime of the worker's own with this many threads, over the store reopened
    /// there.
    Auto(usize),
    /// A multi-thread runtime the worker starts for its handlers, with this many threads.
    Own(usize),
    /// A runtime the caller gave.
    Shared(tokio::runtime::Handle),
}

/// Configures and builds a [`Worker`]. Start with [`Worker::builder`].
///
/// Every interval is real time (tokio timers), while lease expiry and retry times are
/// decided on the store's clock; tests shorten the intervals and drive a `ManualClock`.
pub struct WorkerBuilder {
    store: Store,
    handlers: Vec<(String, Arc<dyn crate::handler::ErasedHandler>)>,
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
    schedule_interval: Option<Duration>,
    queue_gauges_interval: Option<Duration>,
    worker_silence: Option<Duration>,
    schedules: Vec<Schedule>,
    shutdown_grace: Duration,
    cancel_grace: Duration,
    timeout: Option<Duration>,
    blocking_threshold: Duration,
    handler_runtime: Option<HandlerRuntime>,
    capacity: Option<Budget>,
    prefer: Vec<String>,
    hooks: Hooks,
    claim_limit: Option<usize>,
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
            .field("timeout", &self.timeout)
            .field("capacity", &self.capacity)
            .field("prefer", &self.prefer)
            .field("hooks", &self.hooks.len())
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    pub(crate) fn new(store: Store) -> Self {
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
            schedule_interval: Some(Duration::from_secs(1)),
            queue_gauges_interval: Some(Duration::from_secs(15)),
            worker_silence: None,
            schedules: Vec::new(),
            shutdown_grace: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            timeout: Some(DEFAULT_TIMEOUT),
            blocking_threshold: DEFAULT_BLOCKING_THRESHOLD,
            handler_runtime: None,
            capacity: None,
            prefer: Vec::new(),
            hooks: Hooks::default(),
            claim_limit: None,
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

    /// Runs `handler` for the jobs of type `J`, on `J`'s queue ([`TypedJob::QUEUE`]),
    /// each payload decoded from JSON into a `J`: the queue is named once, by the type,
    /// for the producer's `store.enqueue_typed(&job)` and for this handler.
    ///
    /// [`TypedJob::QUEUE`]: durq_core::TypedJob::QUEUE
    pub fn typed_handler<J, F, Fut, O>(self, handler: F) -> Self
    where
        J: durq_core::TypedJob,
        F: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<O, JobError>> + Send + 'static,
        O: JobOutput + 'static,
    {
        self.json_handler(J::QUEUE, handler)
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

    /// What this worker offers its jobs: named amounts (`cpu_milli`, `mem_bytes`,
    /// `gpu`, …) and capabilities (`fpga`). The worker keeps count of what is free as
    /// handlers start and end, and claims only jobs whose needs fit it (CONTRACT F2,
    /// F3); an amount it does not name is not counted. While it counts amounts it
    /// claims one job per call, so jobs claimed together never overcommit it. Default:
    /// none, every job is claimed.
    ///
    /// ```
    /// # fn example(store: durq::Store) -> durq::Result<()> {
    /// use durq::{Budget, JobContext};
    /// let worker = durq::Worker::builder(store)
    ///     .handler("render", |_ctx: JobContext, _payload: durq::Bytes| async { Ok(()) })
    ///     .capacity(Budget::new().amount("gpu", 2).amount("mem_bytes", 32 << 30))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn capacity(mut self, capacity: Budget) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// Localities this worker takes first within each priority (a host name, a warm
    /// cache's key): jobs enqueued with one of them as their `locality` (CONTRACT F5).
    /// Never a filter.
    pub fn prefer<L: Into<String>>(mut self, localities: impl IntoIterator<Item = L>) -> Self {
        self.prefer = localities.into_iter().map(Into::into).collect();
        self
    }

    /// How long a claim holds a job without a heartbeat. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the lease of every job the worker holds (waiting to start, running,
    /// or with its outcome on the way to the store) is extended, in one
    /// `heartbeat_batch` call. Default: a third of the lease. Must be shorter than the
    /// lease.
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

    /// Declares a periodic job: the worker stores it when it starts
    /// (`Store::put_schedule`: a known schedule keeps whether it is enabled and its
    /// last tick) and fires it with the namespace's other schedules. Any number of
    /// workers may declare and fire the same schedule: each tick is enqueued once
    /// (CONTRACT S3).
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// How often the worker fires the namespace's due schedules
    /// (`Store::fire_schedules`). Default 1 s, which bounds how late a tick is
    /// enqueued.
    pub fn schedule_interval(mut self, interval: Duration) -> Self {
        self.schedule_interval = Some(interval);
        self
    }

    /// How often the worker reads its queues' depth and lag (`Store::queues`,
    /// CONTRACT A7) into the `jobs_queue_depth` and `jobs_queue_lag_seconds` gauges.
    /// Default 15 s. Each read counts the namespace's jobs per queue and state, so a
    /// fleet of workers may leave it to a few ([`WorkerBuilder::disable_queue_gauges`]).
    pub fn queue_gauges_interval(mut self, interval: Duration) -> Self {
        self.queue_gauges_interval = Some(interval);
        self
    }

    /// How long a worker of the namespace may go unheard before this worker reaps its
    /// record (`Store::reap_workers`, CONTRACT W4; its jobs are left to reclaim).
    /// Default: four heartbeat intervals, and at least a minute.
    pub fn worker_silence(mut self, silence: Duration) -> Self {
        self.worker_silence = Some(silence);
        self
    }

    /// Exports no queue gauges.
    pub fn disable_queue_gauges(mut self) -> Self {
        self.queue_gauges_interval = None;
        self
    }

    /// Leaves firing schedules to other workers. Schedules declared with
    /// [`WorkerBuilder::schedule`] are still stored when the worker starts.
    pub fn disable_schedules(mut self) -> Self {
        self.schedule_interval = None;
        self
    }

    /// How long shutdown waits for running handlers before releasing their jobs.
    /// Default 30 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a handler whose job was cancelled (or whose lease was lost, or whose
    /// timeout passed) may keep running to wind down before the worker drops it.
    /// Default 5 s.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// How long one attempt may run, for jobs enqueued without a timeout of their own
    /// (`NewJob::timeout` overrides it), on the store's clock, as lease expiry and retry
    /// times are. Past it the handler is cancelled
    /// ([`crate::CancelReason::TimedOut`]), given the cancel grace, and the attempt
    /// fails as timed out, to be retried with backoff. Default 30 minutes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// No worker-wide time limit: only jobs enqueued with a timeout of their own have
    /// one.
    pub fn no_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// A poll of a handler longer than this is logged as blocking, with its queue and
    /// job id, and a queue whose first poll blocks stops starting its jobs in the claim
    /// loop. Default 100 ms.
    pub fn blocking_threshold(mut self, threshold: Duration) -> Self {
        self.blocking_threshold = threshold;
        self
    }

    /// Runs handlers on a multi-thread runtime of `threads` threads that the worker
    /// starts for them.
    ///
    /// By default the store decides: a store whose connections live on the runtime the
    /// worker was started from (Redis, PostgreSQL) gets handlers on a runtime of their
    /// own, one thread per core, with the store reopened there (`Store::reopen`), so
    /// that a handler that blocks its thread delays other handlers, never the rest of
    /// the program; a store that needs no runtime (memory, SQLite) runs handlers beside
    /// the claim loop. Either way the leases are kept from a thread of their own.
    pub fn handler_threads(mut self, threads: usize) -> Self {
        self.handler_runtime = Some(HandlerRuntime::Own(threads));
        self
    }

    /// Runs handlers on the given runtime instead of one of the worker's own, for
    /// example `tokio::runtime::Handle::current()`; a tied store is reopened there
    /// unless it is the runtime the worker was started from. Lease upkeep stays safe
    /// from handlers that block whatever runtime they run on: the keeper has a thread
    /// of its own.
    pub fn handler_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.handler_runtime = Some(HandlerRuntime::Shared(runtime));
        self
    }

    /// Calls `hook` each time the store has acknowledged an outcome of one of this
    /// worker's jobs: succeeded (recorded by the worker, in a batch or not, or by the
    /// handler in its own transaction), failed and to be retried, dead, snoozed,
    /// cancelled, or released. See [`JobEvent`] and [`JobOutcome`](crate::JobOutcome).
    /// May be called several times: every hook is called, in the order they were
    /// added.
    ///
    /// Never called for an outcome the store refused (the lease was lost, so another
    /// worker holds the job) or could not take. A job that dies because its lease
    /// expired on its last attempt (its worker crashed) is ended by a reclaim, not by a
    /// worker's outcome, and has no event: count `jobs_reclaimed{state="dead"}`.
    ///
    /// Hooks run synchronously on the worker's own tasks (the claim loop, for batched
    /// successes), right after the outcome is stored, so they must be quick: hand
    /// anything slow (an HTTP call, a page) to a channel or a task. A hook that panics
    /// is logged (`tracing::error`) and skipped; the worker and the other hooks go on.
    /// A worker without hooks builds no event.
    ///
    /// ```
    /// # fn example(store: durq::Store) -> durq::Result<()> {
    /// use durq::{JobContext, JobOutcome};
    /// let (dead_tx, _dead_rx) = tokio::sync::mpsc::unbounded_channel();
    /// let worker = durq::Worker::builder(store)
    ///     .handler("emails", |_ctx: JobContext, _payload: durq::Bytes| async { Ok(()) })
    ///     .on_event(move |event| {
    ///         if let JobOutcome::Dead { error } = event.outcome() {
    ///             // Quick: the alert itself is sent by whoever reads the channel.
    ///             let _ = dead_tx.send((event.id(), error.clone()));
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn on_event<F>(mut self, hook: F) -> Self
    where
        F: Fn(&JobEvent) + Send + Sync + 'static,
    {
        self.hooks.push(Box::new(hook));
        self
    }

    /// The queues the worker serves, in the order their handlers were added.
    #[cfg(feature = "testing")]
    pub(crate) fn queue_names(&self) -> Vec<String> {
        self.handlers
            .iter()
            .map(|(queue, _)| queue.clone())
            .collect()
    }

    /// Claims at most `jobs` jobs in all, then only waits to be shut down.
    #[cfg(feature = "testing")]
    pub(crate) fn claim_limit(mut self, jobs: usize) -> Self {
        self.claim_limit = Some(jobs);
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
        if !self.schedules.is_empty() && !self.store.supports(Capability::Schedules) {
            return Err(Error::unsupported(Capability::Schedules));
        }
        for schedule in &self.schedules {
            schedule.validate()?;
            validate_new_job(&schedule.job, self.store.settings())?;
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
            let name = Arc::from(queue.as_str());
            handlers.insert(
                queue,
                QueueHandler {
                    name,
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
        if let Some(capacity) = &self.capacity {
            validate_fit_keys("capacity", &capacity.amounts, &capacity.capabilities)?;
        }
        // The preferences travel in every claim: checked the way a claim checks them.
        validate_claim(
            &ClaimRequest::new(queue_names.iter().cloned(), worker_id.as_str(), self.lease)
                .prefer(self.prefer.iter().cloned()),
        )?;
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
            ("schedule_interval", self.schedule_interval),
            ("queue_gauges_interval", self.queue_gauges_interval),
            ("worker_silence", self.worker_silence),
            ("timeout", self.timeout),
            ("blocking_threshold", Some(self.blocking_threshold)),
        ];
        for (field, interval) in positive {
            if interval.is_some_and(|d| d.is_zero()) {
                return Err(Error::invalid(field, "must be above zero"));
            }
        }
        if self.reclaim_batch == 0 || self.purge_batch == 0 {
            return Err(Error::invalid("batch", "must be at least 1"));
        }
        let handler_runtime = match self.handler_runtime {
            Some(HandlerRuntime::Own(0)) => {
                return Err(Error::invalid("handler_threads", "must be at least 1"))
            }
            Some(runtime) => runtime,
            None => HandlerRuntime::Auto(
                std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            ),
        };
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
                schedule_interval: self.schedule_interval,
                queue_gauges_interval: self.queue_gauges_interval,
                worker_silence: self
                    .worker_silence
                    .unwrap_or_else(|| (heartbeat * 4).max(Duration::from_secs(60))),
                schedules: self.schedules,
                shutdown_grace: self.shutdown_grace,
                cancel_grace: self.cancel_grace,
                timeout: self.timeout,
                blocking_threshold: self.blocking_threshold,
                handler_runtime,
                capacity: self.capacity,
                prefer: self.prefer,
                hooks: self.hooks,
                claim_limit: self.claim_limit,
            },
            shutdown: CancellationToken::new(),
        })
    }
}

/// A built worker's settings, checked.
pub(crate) struct Config {
    pub(crate) store: Store,
    pub(crate) handlers: HashMap<String, QueueHandler>,
    pub(crate) queue_names: Vec<String>,
    pub(crate) worker_id: Arc<str>,
    pub(crate) concurrency: usize,
    pub(crate) claim_batch: usize,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) poll_interval: Duration,
    pub(crate) reclaim_interval: Option<Duration>,
    pub(crate) reclaim_batch: usize,
    pub(crate) purge_interval: Option<Duration>,
    pub(crate) purge_batch: usize,
    pub(crate) schedule_interval: Option<Duration>,
    pub(crate) queue_gauges_interval: Option<Duration>,
    /// How long another worker may go unheard before this one reaps its record.
    pub(crate) worker_silence: Duration,
    pub(crate) schedules: Vec<Schedule>,
    pub(crate) shutdown_grace: Duration,
    pub(crate) cancel_grace: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) blocking_threshold: Duration,
    pub(crate) handler_runtime: HandlerRuntime,
    pub(crate) capacity: Option<Budget>,
    pub(crate) prefer: Vec<String>,
    /// The lifecycle hooks, called once each outcome is stored.
    pub(crate) hooks: Hooks,
    /// How many jobs the worker claims in all before it only waits to be shut down
    /// (`durq::testing` runs one job at a time); `None`: no limit.
    pub(crate) claim_limit: Option<usize>,
}
