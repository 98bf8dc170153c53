//! What a backend implements: [`Backend`], the core of a job queue, narrow on purpose;
//! the optional [capabilities](crate::capability) beside it; and the tools for writing
//! layers over one ([`LayeredBackend`](crate::LayeredBackend), [`Layer`](crate::Layer)).
//!
//! A backend never sees input the [contract](crate::contract) refuses: the
//! [`Store`](crate::Store) handle validates every argument, reads the clock once and
//! passes that instant down, and answers the trivial calls (`limit == 0`, empty batches)
//! itself. So a backend is only the storage: its own transactions, scripts and indexes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::capability::{
    Admin, Capability, Events, FlowControl, Inspect, Pause, Schedules, Steps, WorkerRegistry,
};
use crate::error::{Error, Result};
use crate::id::JobId;
use crate::model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState,
    LeaseToken, NewJob, ReclaimedJob, Retry, StoreSettings,
};
use crate::time::Timestamp;

/// What a backend can do beyond the contract, read by the [`Store`](crate::Store)
/// handle and the worker runtime to choose how to drive it.
///
/// Every field's default is the answer that is safe for any backend, so a backend
/// written before a field existed keeps working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether the backend's calls need the tokio runtime it was opened on to make
    /// progress: its connections' I/O is driven there (a Redis connection's driver
    /// task, a PostgreSQL pool's sockets). A backend whose calls complete on any
    /// runtime, or on none (in-process state, a writer thread of its own), says
    /// `false`.
    ///
    /// The worker runtime reads it to keep leases where handlers cannot starve them:
    /// beside a tied backend's connections, or on a thread of its own for a backend
    /// that is not tied. Default `true`.
    pub tied_to_runtime: bool,

    /// How the backend spreads one namespace over partitions, or `None` when it keeps
    /// it whole (the default). On a partitioned store the rules CONTRACT §8 names hold
    /// within each partition only (the claim order of C3 above all); the conformance
    /// suite asserts those rules per partition, locating each job with
    /// [`Partitioning::of`], and every other rule as it is.
    pub partitioning: Option<Partitioning>,

    /// Whether a backend that declares [`FlowControl`](crate::FlowControl) keeps the
    /// limits that count a whole queue: `max_running` (K2), `max_starts` (K4's queue
    /// rate) and fair shares (K5). A partitioned store that keeps a queue's jobs in
    /// several partitions and counts each concurrency key in its one partition says
    /// `false` (CONTRACT P3): the handle then refuses those limits, naming the field,
    /// and the suite skips their rules, saying so. Default `true`.
    pub queue_wide_limits: bool,

    /// Whether the backend keeps jobs that wait for jobs (CONTRACT G1–G5): a job
    /// enqueued with `depends_on` is `waiting` until they have succeeded. Where it is
    /// `false` the handle refuses such a job, naming `depends_on`, and the suite skips
    /// the rules, saying so. Default `false`.
    pub dependencies: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            tied_to_runtime: true,
            partitioning: None,
            queue_wide_limits: true,
            dependencies: false,
        }
    }
}

impl Capabilities {
    /// Sets [`Capabilities::tied_to_runtime`].
    pub fn tied_to_runtime(mut self, tied: bool) -> Self {
        self.tied_to_runtime = tied;
        self
    }

    /// Sets [`Capabilities::partitioning`].
    pub fn partitioning(mut self, partitioning: Option<Partitioning>) -> Self {
        self.partitioning = partitioning;
        self
    }

    /// Sets [`Capabilities::queue_wide_limits`].
    pub fn queue_wide_limits(mut self, kept: bool) -> Self {
        self.queue_wide_limits = kept;
        self
    }

    /// Sets [`Capabilities::dependencies`].
    pub fn dependencies(mut self, kept: bool) -> Self {
        self.dependencies = kept;
        self
    }
}

/// How a partitioned store places its jobs (CONTRACT §8): how many partitions it has,
/// and which one holds a job, a pure function of the job's id.
///
/// ```
/// use durq_core::{JobId, Partitioning, Timestamp};
/// fn by_low_bits(id: JobId, count: usize) -> usize {
///     (id.as_u128() % count as u128) as usize
/// }
/// let partitioning = Partitioning::new(4, by_low_bits);
/// let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
/// assert!(partitioning.of(id) < 4);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Partitioning {
    count: usize,
    locate: fn(JobId, usize) -> usize,
}

impl Partitioning {
    /// `count` partitions (at least 1), a job's found by `locate(id, count)`, which
    /// must answer below `count`.
    pub fn new(count: usize, locate: fn(JobId, usize) -> usize) -> Self {
        Partitioning {
            count: count.max(1),
            locate,
        }
    }

    /// How many partitions the store has.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The partition that holds job `id`: `0..count()`.
    pub fn of(&self, id: JobId) -> usize {
        (self.locate)(id, self.count)
    }
}

impl PartialEq for Partitioning {
    /// The same count, located by the same function (compared by address: two
    /// copies of one function may compare unequal, never two different ones equal).
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && std::ptr::fn_addr_eq(self.locate, other.locate)
    }
}

impl Eq for Partitioning {}

/// The core of a durable job store's storage: one method per operation every job queue
/// needs (enqueue, claim, the lease calls, reclaim, the reads of one job), each a rule
/// of the [contract](crate::contract).
///
/// What a job queue may do beyond that (listing, operator actions, pause, schedules,
/// the worker registry) is a [capability](crate::capability): a trait of its own that a
/// backend implements and declares by answering `Some(self)` from its accessor
/// ([`Backend::as_admin`], …). A backend that declares none is a complete job queue;
/// the [`Store`](crate::Store) answers [`crate::Error::Unsupported`] for the rest.
///
/// Object-safe; users never call it directly but through the [`Store`](crate::Store)
/// handle, which guarantees what every method may assume:
///
/// - every argument passed the checks of [`crate::validate`] (queue names, sizes,
///   leases, limits, no queue named twice in one claim), and error messages are
///   already cut to [`crate::validate::MAX_ERROR_BYTES`];
/// - `now` was read once from [`StoreSettings::clock`]; a backend takes every
///   decision at that instant and never reads a server's clock;
/// - `limit` is at least 1 and batches hold at least one entry;
/// - a retry time is not before `now`.
///
/// What a backend still checks itself is what only it can see: whether a parent
/// exists, whether a lease token is current, whether a record is corrupt.
///
/// Every core operation but two has no default, so a backend cannot lose behaviour by
/// accident. The two defaults, [`Backend::complete_batch`] and
/// [`Backend::heartbeat_batch`], are defined by `complete` and `heartbeat` and only
/// forgo a speed-up when not overridden. A layer that wraps another backend implements
/// [`LayeredBackend`](crate::LayeredBackend) instead, and writes only the methods it changes.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// The settings the backend was opened with, its clock included.
    fn settings(&self) -> &StoreSettings;

    /// What the backend can do; see [`Capabilities`]. The default is safe for any
    /// backend.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// This backend opened again: the same namespace and settings, over connections of
    /// its own opened from the runtime this is called on, and so driven by that runtime
    /// alone. `None` for a backend that cannot be (the default), and for one whose calls
    /// need no particular runtime, which serves every runtime as it is.
    ///
    /// The worker's lease keeper runs on a thread of its own and reopens a backend
    /// [tied to its runtime](Capabilities::tied_to_runtime) there, so that handlers
    /// blocking every thread of the worker's runtime cannot stall a heartbeat, while
    /// the claim loop and the handlers share that runtime with the store's connections
    /// (no hop between threads per call). A reopened backend needs a connection or two
    /// and starts nothing else: no migrations, no listener until it is waited on.
    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(None)
    }

    /// Rules E1–E7: adds a job, or returns the existing job for a live idempotency key.
    /// Whether `job.parent` exists is for the backend to check, in the same
    /// transaction as the insert.
    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued>;

    /// Rule E9: the same as enqueueing each job in order, answered in order, all or
    /// nothing: a batch naming a missing parent writes nothing.
    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>>;

    /// Rule E1: the job as stored, or [`crate::Error::NotFound`].
    async fn get(&self, id: JobId) -> Result<Job>;

    /// Rule E1: the job's payload bytes, exactly as enqueued.
    async fn payload(&self, id: JobId) -> Result<Bytes>;

    /// Rules C1–C9: leases up to `request.limit` ready jobs in claim order and returns
    /// them, with payloads, in that order.
    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>>;

    /// Rule L1: extends the lease to `now + ttl`; reports a requested cancellation.
    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat>;

    /// Rule L1, one `heartbeat` per entry: the answer at index `i` is what `heartbeat`
    /// would have answered for `leases[i]`, and an entry that fails leaves the others
    /// alone. `Err` means the call failed as a whole.
    ///
    /// The default issues the `heartbeat` calls concurrently; a backend that can renew
    /// many leases in one round trip overrides it.
    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        Ok(heartbeat_each(self, leases, ttl, now).await)
    }

    /// Rules L4, L5: marks the job succeeded and stores `result`.
    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()>;

    /// Rules L4, L5, one `complete` per entry, in order: the answer at index `i` is
    /// what `complete` would have answered for `completions[i]`, and an entry that fails
    /// (a stale token, a second completion of a job earlier in the batch) leaves the
    /// others alone. `Err` means the call failed as a whole; any entry may or may not
    /// have taken effect.
    ///
    /// The default issues the `complete` calls concurrently, which keeps a backend that
    /// groups concurrent calls grouping them; a backend that can do better overrides it.
    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        Ok(complete_each(self, completions, now).await)
    }

    /// Rules L6, L7: records `error` and requeues the job at the retry time, or makes it
    /// dead when asked to or when its attempts are used up; a job whose cancellation was
    /// requested becomes cancelled ([`crate::transition::after_failure`]). Returns the
    /// new state.
    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState>;

    /// Rules L8, L10: gives the job back, ready at `ready_at` (`now` for a release,
    /// later for a snooze; never earlier than `now`), without counting the attempt or
    /// touching `last_error`.
    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()>;

    /// Rules R1–R6: recovers up to `limit` jobs whose lease expired strictly before
    /// `now` (`expires_at < now`: a lease expiring at `now` still holds, R2).
    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>>;

    /// Resolves when work may have arrived on one of `queues`, or after `timeout`
    /// (real time), whichever comes first. Spurious wake-ups are allowed; a claimer
    /// calls `claim` after it either way.
    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()>;

    /// Rules O1, O2: the job once it has ended (`succeeded`, `dead` or `cancelled`),
    /// as stored then, or `None` when `timeout` (real time) passes first; an unknown
    /// job is [`Error::NotFound`].
    ///
    /// A backend wakes the waiter when the job ends, whichever handle or process ended
    /// it, and polls only as a fallback for notices it can lose: it hands
    /// [`ending::wait_until_ended`](crate::ending::wait_until_ended) an arming step that
    /// registers for the news before it reads the job. This default has no news to
    /// register for and reads the job every
    /// [`DEFAULT_ENDING_POLL`](crate::ending::DEFAULT_ENDING_POLL): correct on any
    /// backend, but not O2's prompt wake-up at no cost.
    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        crate::ending::wait_until_ended(timeout, Some(crate::ending::DEFAULT_ENDING_POLL), || {
            Box::pin(async move { Ok(crate::ending::Armed::unwatched(self.get(id).await?)) })
        })
        .await
    }

    /// [`Inspect`] if the backend declares it: listing, counts, children, attempts.
    fn as_inspect(&self) -> Option<&dyn Inspect> {
        None
    }

    /// [`Admin`] if the backend declares it: an operator's cancel, retry and purge.
    fn as_admin(&self) -> Option<&dyn Admin> {
        None
    }

    /// [`Pause`] if the backend declares it: pausing and resuming queues.
    fn as_pause(&self) -> Option<&dyn Pause> {
        None
    }

    /// [`Schedules`] if the backend declares it: stored cron schedules.
    fn as_schedules(&self) -> Option<&dyn Schedules> {
        None
    }

    /// [`WorkerRegistry`] if the backend declares it: the registry of running workers.
    fn as_worker_registry(&self) -> Option<&dyn WorkerRegistry> {
        None
    }

    /// [`FlowControl`] if the backend declares it: limits on running jobs, enforced
    /// by its claim.
    fn as_flow_control(&self) -> Option<&dyn FlowControl> {
        None
    }

    /// [`Steps`] if the backend declares it: durable steps and reopening from one.
    fn as_steps(&self) -> Option<&dyn Steps> {
        None
    }

    /// [`Events`] if the backend declares it: the namespace's event stream.
    fn as_events(&self) -> Option<&dyn Events> {
        None
    }
}

// Inherent, not a trait method with a default: what a backend declares is its
// accessors, and no override can make `supports` disagree with them.
impl dyn Backend + '_ {
    /// Whether the backend declares `capability`, read from its accessor.
    pub fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::Inspect => self.as_inspect().is_some(),
            Capability::Admin => self.as_admin().is_some(),
            Capability::Pause => self.as_pause().is_some(),
            Capability::Schedules => self.as_schedules().is_some(),
            Capability::WorkerRegistry => self.as_worker_registry().is_some(),
            Capability::FlowControl => self.as_flow_control().is_some(),
            Capability::Steps => self.as_steps().is_some(),
            Capability::Events => self.as_events().is_some(),
        }
    }

    /// [`Backend::as_inspect`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_inspect(&self) -> Result<&dyn Inspect> {
        self.as_inspect()
            .ok_or(Error::unsupported(Capability::Inspect))
    }

    /// [`Backend::as_admin`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_admin(&self) -> Result<&dyn Admin> {
        self.as_admin().ok_or(Error::unsupported(Capability::Admin))
    }

    /// [`Backend::as_flow_control`], or
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_flow_control(&self) -> Result<&dyn FlowControl> {
        self.as_flow_control()
            .ok_or(Error::unsupported(Capability::FlowControl))
    }

    /// [`Backend::as_steps`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_steps(&self) -> Result<&dyn Steps> {
        self.as_steps().ok_or(Error::unsupported(Capability::Steps))
    }

    /// [`Backend::as_events`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_events(&self) -> Result<&dyn Events> {
        self.as_events()
            .ok_or(Error::unsupported(Capability::Events))
    }

    /// [`Backend::as_pause`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_pause(&self) -> Result<&dyn Pause> {
        self.as_pause().ok_or(Error::unsupported(Capability::Pause))
    }

    /// [`Backend::as_schedules`], or [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_schedules(&self) -> Result<&dyn Schedules> {
        self.as_schedules()
            .ok_or(Error::unsupported(Capability::Schedules))
    }

    /// [`Backend::as_worker_registry`], or
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn require_worker_registry(&self) -> Result<&dyn WorkerRegistry> {
        self.as_worker_registry()
            .ok_or(Error::unsupported(Capability::WorkerRegistry))
    }
}

/// [`Backend::complete_batch`] as `complete` calls: its default, and what a backend
/// that overrides it can fall back on.
pub async fn complete_each<B: Backend + ?Sized>(
    backend: &B,
    completions: Vec<Completion>,
    now: Timestamp,
) -> Vec<Result<()>> {
    // Entries for one job are serialised (L5: the first one stands, the next is lease
    // lost), so only distinct jobs' completions run at the same time.
    let mut seen = std::collections::HashSet::with_capacity(completions.len());
    if completions.iter().all(|c| seen.insert(c.id)) {
        futures_util::future::join_all(
            completions
                .into_iter()
                .map(|c| backend.complete(c.id, c.token, c.result, now)),
        )
        .await
    } else {
        let mut answers = Vec::with_capacity(completions.len());
        for c in completions {
            answers.push(backend.complete(c.id, c.token, c.result, now).await);
        }
        answers
    }
}

/// [`Backend::heartbeat_batch`] as concurrent `heartbeat` calls: its default, and what
/// a backend that overrides it can fall back on.
pub async fn heartbeat_each<B: Backend + ?Sized>(
    backend: &B,
    leases: Vec<HeldLease>,
    ttl: Duration,
    now: Timestamp,
) -> Vec<Result<Heartbeat>> {
    futures_util::future::join_all(
        leases
            .into_iter()
            .map(|lease| backend.heartbeat(lease.id, lease.token, ttl, now)),
    )
    .await
}
