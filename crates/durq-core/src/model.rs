//! The job model of CONTRACT §1–2 and the arguments and results of store operations.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Error;
use crate::fit::{Budget, FitOrder, Needs};
use crate::graph::{Dependency, DependencyFailure};
use crate::id::JobId;
use crate::meta::Tags;
use crate::order::ReadyOrder;
use crate::time::{Clock, SystemClock, Timestamp};

// The state is part of the job model; it has a module of its own only so that `error`
// can name it without depending on the model.
pub use crate::state::JobState;

// What reads of many jobs answer and take, kept apart from the job itself.
pub use crate::listing::{ListPage, ListQuery, QueueOverview, QueueStats};

/// A fencing token: proof of holding a job's lease. Every claim of a job issues a
/// token greater than all earlier tokens of that job (CONTRACT C6), so a worker whose
/// lease was reclaimed can never act on the job again (CONTRACT L9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseToken(u64);

impl LeaseToken {
    /// A token from its stored value.
    pub const fn new(value: u64) -> Self {
        LeaseToken(value)
    }

    /// The stored value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The lease of a running job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The worker holding it.
    pub worker: String,
    /// The fencing token every call on the job must carry.
    pub token: LeaseToken,
    /// The lease is expired once the clock is strictly past this instant (CONTRACT R1).
    pub expires_at: Timestamp,
}

/// The default `max_attempts` of a new job (CONTRACT §1).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// A job to enqueue. Only the queue is required.
///
/// ```
/// use durq_core::NewJob;
/// let job = NewJob::new("emails")
///     .payload(&b"{\"to\":\"ada@example.com\"}"[..])
///     .idempotency_key("welcome-ada")
///     .priority(10)
///     .max_attempts(5);
/// assert_eq!(job.queue, "emails");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// The queue to wait in: `[A-Za-z0-9._:-]`, 1..=128 bytes.
    pub queue: String,
    /// Opaque bytes handed to the handler.
    pub payload: Bytes,
    /// The scope of the idempotency key; empty by default.
    pub tenant: String,
    /// Deduplicates enqueues within the store's dedup window (CONTRACT E2), or while
    /// its job is active (see [`NewJob::uniqueness`]).
    pub idempotency_key: Option<String>,
    /// What the idempotency key deduplicates against (CONTRACT E2, E10).
    pub uniqueness: Uniqueness,
    /// Higher runs first.
    pub priority: i16,
    /// Earliest time the job may run; `None` means now (or `delay` after now).
    pub run_at: Option<Timestamp>,
    /// Run this long after the enqueue, on the store's clock. The [`Store`](crate::Store)
    /// turns it into `run_at` when it enqueues the job, so backends never see it set.
    pub delay: Option<Duration>,
    /// Claims allowed before the job is dead; at least 1.
    pub max_attempts: u32,
    /// The job that spawned this one.
    pub parent: Option<JobId>,
    /// How long one attempt may run before the worker cancels it and fails the attempt
    /// as timed out; `None` leaves it to the worker's default.
    pub timeout: Option<Duration>,
    /// What the job needs from the worker that runs it (CONTRACT F1–F3): only a worker
    /// whose claim budget admits it takes it.
    pub needs: Needs,
    /// Where the job would best run (a host, a cache, a region): claims that prefer it
    /// take it first within its priority (CONTRACT F5). Never a filter.
    pub locality: Option<String>,
    /// Tags for filtering and for people to read (CONTRACT E11); `list` filters by them.
    pub tags: Tags,
    /// The W3C `traceparent` of the span that enqueued the job (CONTRACT E12), so its
    /// attempts join that trace. The `durq` crate's `opentelemetry` feature fills it in.
    pub trace_context: Option<String>,
    /// What the job's queue limits jobs by when they run at once (a customer, an
    /// account, a document): CONTRACT K1. Any UTF-8, 1..=256 bytes. Needs a backend
    /// with flow control ([`crate::FlowControl`]).
    pub concurrency_key: Option<String>,
    /// The jobs this one waits for (CONTRACT G1): it is `waiting` until every one of
    /// them has succeeded, then `queued`. At most
    /// [`MAX_DEPENDENCIES`](crate::graph::MAX_DEPENDENCIES); needs a backend whose
    /// [`Capabilities::dependencies`](crate::Capabilities::dependencies) is true.
    pub depends_on: Vec<Dependency>,
    /// What the job does when one it waits for ends `dead` or `cancelled` (CONTRACT
    /// G3): cancel (the default) or run anyway.
    pub on_dependency_failure: DependencyFailure,
}

impl NewJob {
    /// A job for `queue` with an empty payload and every other field at its default.
    pub fn new(queue: impl Into<String>) -> Self {
        NewJob {
            queue: queue.into(),
            payload: Bytes::new(),
            tenant: String::new(),
            idempotency_key: None,
            uniqueness: Uniqueness::Window,
            priority: 0,
            run_at: None,
            delay: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            parent: None,
            timeout: None,
            needs: Needs::new(),
            locality: None,
            tags: Tags::new(),
            trace_context: None,
            concurrency_key: None,
            depends_on: Vec::new(),
            on_dependency_failure: DependencyFailure::Cancel,
        }
    }

    /// Whether the job sets any of the fields most jobs leave unset: a timeout, needs, a
    /// locality, tags, a trace context or a concurrency key. A backend may store a job
    /// that sets none of them with a leaner statement that leaves their columns NULL,
    /// as the full one would store them; this is the one place that says which fields
    /// those are.
    pub fn sets_rarer_fields(&self) -> bool {
        self.timeout.is_some()
            || !self.needs.is_empty()
            || self.locality.is_some()
            || !self.tags.is_empty()
            || self.trace_context.is_some()
            || self.concurrency_key.is_some()
    }

    /// Makes the job wait for `dependency` (CONTRACT G1): a stored job's id, or
    /// [`Dependency::Earlier`] for a job before it in the same batch (G2). A job waits
    /// for all it names (fan-in).
    ///
    /// ```
    /// use durq_core::graph::Dependency;
    /// use durq_core::NewJob;
    /// // A batch: charge, then an e-mail and an invoice, then a report reading both.
    /// let batch = vec![
    ///     NewJob::new("charge"),
    ///     NewJob::new("email").after(Dependency::Earlier(0)),
    ///     NewJob::new("invoice").after(Dependency::Earlier(0)),
    ///     NewJob::new("report")
    ///         .after(Dependency::Earlier(1))
    ///         .after(Dependency::Earlier(2)),
    /// ];
    /// assert_eq!(batch[3].depends_on.len(), 2);
    /// ```
    pub fn after(mut self, dependency: impl Into<Dependency>) -> Self {
        self.depends_on.push(dependency.into());
        self
    }

    /// Sets what the job does when a job it waits for ends `dead` or `cancelled`
    /// (CONTRACT G3).
    pub fn on_dependency_failure(mut self, policy: DependencyFailure) -> Self {
        self.on_dependency_failure = policy;
        self
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: impl Into<Bytes>) -> Self {
        self.payload = payload.into();
        self
    }

    /// Sets the payload to the JSON form of `value`.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Result<Self, Error> {
        let bytes = serde_json::to_vec(value)
            .map_err(|err| Error::invalid("payload", format!("cannot encode as JSON: {err}")))?;
        self.payload = Bytes::from(bytes);
        Ok(self)
    }

    /// Sets the tenant that scopes the idempotency key.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }

    /// Sets the idempotency key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the idempotency key, deduplicating while its job is active: an enqueue
    /// with this key returns the job it names while that job is queued (ready or
    /// scheduled) or running, and makes a new job once it has finished (CONTRACT E10).
    ///
    /// ```
    /// use durq_core::{NewJob, Uniqueness};
    /// let job = NewJob::new("reports").unique_while_active("nightly-report");
    /// assert_eq!(job.uniqueness, Uniqueness::WhileActive);
    /// ```
    pub fn unique_while_active(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self.uniqueness = Uniqueness::WhileActive;
        self
    }

    /// Sets the priority (higher runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the earliest time the job may run (replacing a `delay`). A
    /// [`SystemTime`](std::time::SystemTime) converts with `.into()`.
    pub fn run_at(mut self, at: impl Into<Timestamp>) -> Self {
        self.run_at = Some(at.into());
        self.delay = None;
        self
    }

    /// Runs the job `delay` after it is enqueued, on the store's clock (replacing a
    /// `run_at`).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// A job of type `J` with `job` as its JSON payload, and what the type declares for
    /// every job of it ([`TypedJob`]): its queue, attempts, priority, timeout, tags and
    /// idempotency key. Any of them can be changed afterwards with the methods here.
    ///
    /// ```
    /// # extern crate durq_core as durq; // users reach these through the `durq` facade
    /// use std::time::Duration;
    /// use durq::{NewJob, TypedJob};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Invoice { order: u64 }
    ///
    /// impl TypedJob for Invoice {
    ///     const QUEUE: &'static str = "invoices";
    ///     const MAX_ATTEMPTS: u32 = 10;
    ///     const TIMEOUT: Option<Duration> = Some(Duration::from_secs(60));
    ///     // One invoice per order while one is queued or running.
    ///     fn unique_key(&self) -> Option<String> {
    ///         Some(format!("order-{}", self.order))
    ///     }
    /// }
    ///
    /// let job = NewJob::typed(&Invoice { order: 7 })?.priority(5);
    /// assert_eq!((job.queue.as_str(), job.max_attempts, job.priority), ("invoices", 10, 5));
    /// assert_eq!(job.idempotency_key.as_deref(), Some("order-7"));
    /// # Ok::<(), durq::Error>(())
    /// ```
    pub fn typed<J: TypedJob>(job: &J) -> Result<Self, Error> {
        let mut new = NewJob::new(J::QUEUE)
            .json(job)?
            .max_attempts(J::MAX_ATTEMPTS)
            .priority(J::PRIORITY);
        new.timeout = J::TIMEOUT;
        for (key, value) in J::TAGS {
            new = new.tag(*key, *value);
        }
        if let Some(key) = job.unique_key() {
            new = new.unique_while_active(key);
        }
        Ok(new)
    }

    /// Sets how many claims the job gets before it is dead.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Sets the job's concurrency key: its queue's per-key limit
    /// ([`crate::QueueLimits::max_running_per_key`]) counts the running jobs of each key
    /// apart (CONTRACT K1).
    ///
    /// ```
    /// use durq_core::NewJob;
    /// let job = NewJob::new("invoices").concurrency_key("customer-42");
    /// assert_eq!(job.concurrency_key.as_deref(), Some("customer-42"));
    /// ```
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Records the job that spawned this one (fan-out).
    pub fn parent(mut self, parent: JobId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Sets how long one attempt may run, overriding the worker's default timeout.
    /// Whole milliseconds, above zero.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets what the job needs from the worker that runs it (CONTRACT F1–F3).
    ///
    /// ```
    /// use durq_core::{NewJob, Needs};
    /// let job = NewJob::new("render")
    ///     .needs(Needs::new().amount("gpu", 1).amount("mem_bytes", 8 << 30))
    ///     .locality("host-7");
    /// assert_eq!(job.needs.amounts()["gpu"], 1);
    /// ```
    pub fn needs(mut self, needs: Needs) -> Self {
        self.needs = needs;
        self
    }

    /// Sets where the job would best run; a claim preferring it takes it first within
    /// its priority (CONTRACT F5).
    pub fn locality(mut self, locality: impl Into<String>) -> Self {
        self.locality = Some(locality.into());
        self
    }

    /// Adds (or replaces) tag `key` (CONTRACT E11).
    ///
    /// ```
    /// let job = durq_core::NewJob::new("emails").tag("customer", "42").tag("plan", "pro");
    /// assert_eq!(job.tags["customer"], "42");
    /// ```
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// Sets the W3C `traceparent` the job's attempts join (CONTRACT E12).
    pub fn trace_context(mut self, traceparent: impl Into<String>) -> Self {
        self.trace_context = Some(traceparent.into());
        self
    }
}

/// A kind of job: its queue and what every job of it is enqueued with, so enqueueing and
/// handling it are checked by the compiler. `store.enqueue_typed(&job)` puts it on its
/// queue as JSON with the type's defaults ([`NewJob::typed`] to change one for one job),
/// and the worker's `typed_handler::<J>` reads it back as a `J`. Raw-bytes jobs (for
/// producers written in other languages) need none of this.
///
/// Only [`TypedJob::QUEUE`] must be given; everything else defaults to what
/// [`NewJob::new`] gives.
///
/// ```
/// # extern crate durq_core as durq; // users reach these through the `durq` facade
/// use durq::{NewJob, TypedJob};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendEmail { to: String }
///
/// impl TypedJob for SendEmail {
///     const QUEUE: &'static str = "emails";
///     const MAX_ATTEMPTS: u32 = 5;
///     const TAGS: &'static [(&'static str, &'static str)] = &[("team", "growth")];
/// }
/// // `store.enqueue_typed(&email)` enqueues with these; `NewJob::typed` starts from
/// // them and lets one enqueue change any of them.
/// let job = NewJob::typed(&SendEmail { to: "ada@example.com".into() })?.priority(3);
/// assert_eq!((job.queue.as_str(), job.max_attempts, job.priority), ("emails", 5, 3));
/// assert_eq!(job.tags["team"], "growth");
/// # Ok::<(), durq::Error>(())
/// ```
pub trait TypedJob: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static {
    /// The queue jobs of this type wait in.
    const QUEUE: &'static str;
    /// Claims a job of this type gets before it is dead (CONTRACT L7).
    const MAX_ATTEMPTS: u32 = DEFAULT_MAX_ATTEMPTS;
    /// Higher runs first (CONTRACT C3).
    const PRIORITY: i16 = 0;
    /// How long one attempt may run; `None` leaves it to the worker's default.
    const TIMEOUT: Option<Duration> = None;
    /// Tags every job of this type carries (CONTRACT E11).
    const TAGS: &'static [(&'static str, &'static str)] = &[];

    /// The key that keeps this job unique while a job with the same key is queued or
    /// running (CONTRACT E10): an enqueue meanwhile returns that job instead of adding
    /// one. `None` (the default): every enqueue adds a job.
    fn unique_key(&self) -> Option<String> {
        None
    }
}

/// A stored job, as `get` shows it. The payload is read separately (`Store::payload`)
/// so listing jobs does not move payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Minted by the store at enqueue.
    pub id: JobId,
    /// The queue it waits in.
    pub queue: String,
    /// The scope of its idempotency key.
    pub tenant: String,
    /// Its idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Higher runs first.
    pub priority: i16,
    /// The time the job became (or becomes) ready: as given at enqueue, then moved by
    /// every return to `queued` (release, retry, reclaim, failure with retry).
    pub run_at: Timestamp,
    /// Claims allowed before the job is dead.
    pub max_attempts: u32,
    /// The job that spawned it.
    pub parent: Option<JobId>,
    /// How long one attempt may run, as given at enqueue (whole milliseconds); `None`
    /// leaves it to the worker's default.
    pub timeout: Option<Duration>,
    /// Its state.
    pub state: JobState,
    /// Claims so far.
    pub attempts: u32,
    /// The current lease, while running.
    pub lease: Option<Lease>,
    /// When it was enqueued.
    pub created_at: Timestamp,
    /// When it was last claimed.
    pub started_at: Option<Timestamp>,
    /// When its lease was last claimed or extended.
    pub heartbeat_at: Option<Timestamp>,
    /// When it reached a terminal state.
    pub finished_at: Option<Timestamp>,
    /// The text of the last failure or eviction.
    pub last_error: Option<String>,
    /// The bytes stored on success.
    pub result: Option<Bytes>,
    /// Whether an operator asked the running job to stop.
    pub cancel_requested: bool,
    /// What it needs from the worker that runs it, as enqueued.
    pub needs: Needs,
    /// Where it would best run, as enqueued.
    pub locality: Option<String>,
    /// Its tags, as enqueued.
    pub tags: Tags,
    /// The trace context it was enqueued with.
    pub trace_context: Option<String>,
    /// The concurrency key it was enqueued with (CONTRACT K1).
    pub concurrency_key: Option<String>,
    /// The jobs it waits (or waited) for, as enqueued, each once (CONTRACT G1, G4).
    pub depends_on: Vec<JobId>,
    /// What it does when one of them ends other than by success (CONTRACT G3).
    pub on_dependency_failure: DependencyFailure,
}

impl Job {
    /// The job `new` becomes when it is stored with id `id` at `now`: queued, no
    /// attempts, ready at its `run_at` or at once (CONTRACT E1, E2). Returns the job
    /// and its payload, which backends keep apart from the record.
    ///
    /// It depends on nothing yet: a backend that keeps dependencies takes them out of
    /// `new` first, resolves a batch's [`Dependency::Earlier`]s into ids
    /// ([`crate::graph::resolve`]), and sets the job's `depends_on` and state from what
    /// they are ([`crate::graph::at_enqueue`]).
    pub fn enqueued(new: NewJob, id: JobId, now: Timestamp) -> (Job, Bytes) {
        let job = Job {
            id,
            queue: new.queue,
            tenant: new.tenant,
            idempotency_key: new.idempotency_key,
            priority: new.priority,
            run_at: new.run_at.unwrap_or(now),
            max_attempts: new.max_attempts,
            parent: new.parent,
            timeout: new.timeout,
            state: JobState::Queued,
            attempts: 0,
            lease: None,
            created_at: now,
            started_at: None,
            heartbeat_at: None,
            finished_at: None,
            last_error: None,
            result: None,
            cancel_requested: false,
            needs: new.needs,
            locality: new.locality,
            tags: new.tags,
            trace_context: new.trace_context,
            concurrency_key: new.concurrency_key,
            depends_on: Vec::new(),
            on_dependency_failure: new.on_dependency_failure,
        };
        (job, new.payload)
    }

    /// Whether the job is queued and its `run_at` has come.
    pub fn is_ready(&self, now: Timestamp) -> bool {
        self.state == JobState::Queued && self.run_at <= now
    }

    /// Where the job stands in the claim order (CONTRACT C3), given its enqueue sequence.
    pub fn ready_order(&self, seq: u64) -> crate::order::ReadyOrder {
        crate::order::ReadyOrder::new(self.priority, self.run_at, seq)
    }

    /// The text a backend stores for the job's needs and locality, `None` when it
    /// declares neither ([`crate::fit::encode_placement`]).
    pub fn placement(&self) -> Option<String> {
        crate::fit::encode_placement(&self.needs, self.locality.as_deref())
    }
}

/// A job handed out by `claim`, with its payload and lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedJob {
    /// The job as stored after the claim (running, lease set).
    pub job: Job,
    /// Its payload.
    pub payload: Bytes,
}

impl ClaimedJob {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.job.id
    }

    /// The fencing token of this claim.
    pub fn token(&self) -> LeaseToken {
        // A claimed job always carries its lease; a zero token is never current, so a
        // malformed value can only make later calls fail with lease lost.
        self.job
            .lease
            .as_ref()
            .map_or(LeaseToken::new(0), |lease| lease.token)
    }

    /// Decodes the payload as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.payload)
            .map_err(|err| Error::invalid("payload", format!("not the expected JSON: {err}")))
    }
}

/// The answer to an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job's id, or the existing job's id for a duplicate (CONTRACT E2).
    pub id: JobId,
    /// False when the idempotency key matched an existing job.
    pub created: bool,
}

/// The arguments of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The queues to claim from; the claim order spans all of them (CONTRACT C3).
    pub queues: Vec<String>,
    /// Who claims: recorded in the lease.
    pub worker: String,
    /// How long the lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// The most jobs to hand out.
    pub limit: usize,
    /// What the worker has free: only jobs it admits are claimed (CONTRACT F2–F4).
    /// `None` admits every job.
    pub budget: Option<Budget>,
    /// Localities to take first within a priority (CONTRACT F5); never a filter.
    pub prefer: Vec<String>,
    /// Claim only this job, if it is ready and fits (CONTRACT F6).
    pub reserved: Option<JobId>,
}

impl ClaimRequest {
    /// A claim of at most one job.
    pub fn new<Q: Into<String>>(
        queues: impl IntoIterator<Item = Q>,
        worker: impl Into<String>,
        lease_ttl: Duration,
    ) -> Self {
        ClaimRequest {
            queues: queues.into_iter().map(Into::into).collect(),
            worker: worker.into(),
            lease_ttl,
            limit: 1,
            budget: None,
            prefer: Vec::new(),
            reserved: None,
        }
    }

    /// Sets the most jobs to hand out.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Claims only jobs `budget` admits (CONTRACT F2–F4).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Takes jobs whose locality is one of `localities` first within each priority
    /// (CONTRACT F5).
    pub fn prefer<L: Into<String>>(mut self, localities: impl IntoIterator<Item = L>) -> Self {
        self.prefer = localities.into_iter().map(Into::into).collect();
        self
    }

    /// Claims only job `id`, if it is ready in a named queue and fits (CONTRACT F6).
    pub fn reserved(mut self, id: JobId) -> Self {
        self.reserved = Some(id);
        self
    }

    /// Whether the claim filters or reorders beyond the plain claim order: a budget, a
    /// preference or a reservation. Backends keep their plain claim for the rest.
    pub fn is_fitted(&self) -> bool {
        self.budget.is_some() || !self.prefer.is_empty() || self.reserved.is_some()
    }

    /// Whether a job with `needs` may be taken by this claim (CONTRACT F2, F3).
    pub fn admits(&self, needs: &Needs) -> bool {
        self.budget
            .as_ref()
            .is_none_or(|budget| budget.admits(needs))
    }

    /// Where a job that fits stands in this claim's order (CONTRACT F5): priority, then
    /// the localities the claim prefers, then its ready order.
    pub fn fit_order(&self, ready: ReadyOrder, locality: Option<&str>) -> FitOrder {
        FitOrder::new(ready, crate::fit::is_preferred(&self.prefer, locality))
    }
}

/// What `fail` should do with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Queue it again, ready at this time, unless its attempts are used up (CONTRACT L6).
    At(Timestamp),
    /// Make it dead now (CONTRACT L7).
    Never,
}

/// One entry of [`Store::complete_batch`](crate::Store::complete_batch): the arguments
/// of one `complete`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The job.
    pub id: JobId,
    /// The lease token its claim returned.
    pub token: LeaseToken,
    /// The bytes to store as its result.
    pub result: Option<Bytes>,
}

impl Completion {
    /// The completion of `id` under `token`, with `result`.
    pub fn new(id: JobId, token: LeaseToken, result: Option<Bytes>) -> Self {
        Completion { id, token, result }
    }
}

/// One entry of [`Store::heartbeat_batch`](crate::Store::heartbeat_batch): a lease to
/// extend, named by its job and the token its claim returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeldLease {
    /// The job.
    pub id: JobId,
    /// The lease token its claim returned.
    pub token: LeaseToken,
}

impl HeldLease {
    /// The lease of `id` taken under `token`.
    pub fn new(id: JobId, token: LeaseToken) -> Self {
        HeldLease { id, token }
    }
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Whether an operator asked the job to stop (CONTRACT L1).
    pub cancel_requested: bool,
    /// The new lease expiry.
    pub expires_at: Timestamp,
}

/// A job that `reclaim` took from an expired lease, and where it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimedJob {
    /// The job.
    pub id: JobId,
    /// `Queued` (will run again), `Dead` (last attempt) or `Cancelled` (cancel was
    /// requested), per CONTRACT R1 and R3.
    pub state: JobState,
}

/// What an idempotency key deduplicates against (CONTRACT E2, E10).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Uniqueness {
    /// The job the key names, while it exists and the store's dedup window, counted
    /// from that job's creation, has not passed (E2, E6). The default.
    #[default]
    Window,
    /// The job the key names, while it is queued (ready or scheduled) or running, however
    /// old; once it has succeeded, died or been cancelled (or is gone), the key makes a
    /// new job (E10). The dedup window does not apply.
    WhileActive,
}

/// Settings every store takes (CONTRACT §1, §3, A5).
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Isolates stores sharing one database or server (CONTRACT C8):
    /// `[A-Za-z0-9._:-]`, 1..=64 bytes.
    pub namespace: String,
    /// The largest payload or result accepted. Default 16 MiB.
    pub max_payload_bytes: usize,
    /// How long an idempotency key deduplicates, from the first job's creation
    /// (CONTRACT E6). Default 24 hours.
    pub dedup_window: Duration,
    /// How long a terminal job is kept after it finished (CONTRACT A5). Default 7 days.
    pub retention: Duration,
    /// The source of "now" for every decision (CONTRACT §3).
    pub clock: Arc<dyn Clock>,
    /// `Some(keep)` when the jobs this store enqueues record their state changes in
    /// the namespace's event stream (CONTRACT V1), and the worker's purge loop trims
    /// the stream to at least its newest `keep` events (V3). Default `None`: no job
    /// records events, and no write pays for them.
    pub events_kept: Option<u64>,
}

/// The default `max_payload_bytes`: 16 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            namespace: "default".to_owned(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            dedup_window: Duration::from_secs(24 * 60 * 60),
            retention: Duration::from_secs(7 * 24 * 60 * 60),
            clock: Arc::new(SystemClock),
            events_kept: None,
        }
    }
}

impl StoreSettings {
    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the largest payload or result accepted.
    pub fn max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// Sets the dedup window.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// Sets the retention of terminal jobs.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Makes the jobs this store enqueues record their state changes in the
    /// namespace's event stream (CONTRACT V1), and its worker's purge loop keep at least
    /// the newest `keep` events (V3). Set it on every store that enqueues jobs whose
    /// events a consumer reads.
    pub fn record_events(mut self, keep: u64) -> Self {
        self.events_kept = Some(keep);
        self
    }

    /// Whether the jobs this store enqueues record their events (CONTRACT V1).
    pub fn records_events(&self) -> bool {
        self.events_kept.is_some()
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The current instant on this store's clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether a dedup record made at `created_at` still deduplicates at `now`:
    /// the window is half-open, `[created_at, created_at + window)`.
    pub fn dedup_active(&self, created_at: Timestamp, now: Timestamp) -> bool {
        now < created_at.saturating_add(self.dedup_window)
    }

    /// Terminal jobs that finished at or before this instant are due for deletion.
    pub fn retention_cutoff(&self, now: Timestamp) -> Timestamp {
        now.saturating_sub(self.retention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend stores a job that sets none of the rarer fields with a statement that
    /// leaves their columns NULL: each of them must count, or it would be lost.
    #[test]
    fn each_rarer_field_counts() {
        assert!(!NewJob::new("q").payload(&b"{}"[..]).sets_rarer_fields());
        let rarer = [
            NewJob::new("q").timeout(Duration::from_secs(1)),
            NewJob::new("q").needs(Needs::new().amount("gpu", 1)),
            NewJob::new("q").needs(Needs::new().capability("fpga")),
            NewJob::new("q").locality("here"),
            NewJob::new("q").tag("tenant", "acme"),
            NewJob::new("q")
                .trace_context("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            NewJob::new("q").concurrency_key("customer-7"),
        ];
        for job in rarer {
            assert!(job.sets_rarer_fields(), "{job:?}");
        }
    }
}
