//! What a backend may do beyond the core of a job queue: one trait per capability,
//! each declared by the [`Backend`](crate::Backend) accessor that hands it out.
//!
//! The core ([`Backend`](crate::Backend) itself) is what every job queue needs:
//! enqueue, claim, the lease calls, reclaim and the reads of one job. Everything else
//! is optional, in the manner of OpenDAL's capabilities: a backend that implements
//! [`Admin`] says so by answering `Some(self)` from
//! [`Backend::as_admin`](crate::Backend::as_admin), and the [`Store`](crate::Store)
//! answers [`Error::Unsupported`](crate::Error::Unsupported) for the operations of a
//! capability its backend does not declare. The conformance suite runs a capability's
//! rules only where it is declared, and prints what it skipped.
//!
//! The declaration is the accessor rather than a flag so the two cannot disagree: a
//! backend cannot declare a capability it does not implement, or implement one and
//! forget to declare it without the suite saying so.

use std::fmt;

use async_trait::async_trait;

use crate::attempts::Attempt;
use crate::error::Result;
use crate::events::{EventCursor, EventPage};
use crate::id::JobId;
use crate::limits::{FlowStatus, QueueLimits};
use crate::model::LeaseToken;
use crate::model::{Job, JobState, ListPage, ListQuery, QueueOverview, QueueStats};
use crate::schedule::{ScheduleUpdate, StoredSchedule};
use crate::steps::StepLog;
use crate::time::Timestamp;
use crate::workers::StoredWorker;

/// One optional capability of a backend: which trait it is, for
/// [`Store::supports`](crate::Store::supports), errors and the conformance
/// suite's report of what it skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Capability {
    /// [`Inspect`]: listing, counts, children and attempt history.
    Inspect,
    /// [`Admin`]: an operator's cancel, retry and purge.
    Admin,
    /// [`Pause`]: pausing and resuming queues.
    Pause,
    /// [`Schedules`]: stored cron schedules.
    Schedules,
    /// [`WorkerRegistry`]: the registry of running workers.
    WorkerRegistry,
    /// [`FlowControl`]: limits on a queue's running jobs, enforced by the claim.
    FlowControl,
    /// [`Steps`]: durable steps, saved by a running job and kept across its runs.
    Steps,
    /// [`Events`]: the namespace's event stream, read from a cursor.
    Events,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 8] = [
        Capability::Inspect,
        Capability::Admin,
        Capability::Pause,
        Capability::Schedules,
        Capability::WorkerRegistry,
        Capability::FlowControl,
        Capability::Steps,
        Capability::Events,
    ];

    /// The capability's trait name, as the docs and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Inspect => "Inspect",
            Capability::Admin => "Admin",
            Capability::Pause => "Pause",
            Capability::Schedules => "Schedules",
            Capability::WorkerRegistry => "WorkerRegistry",
            Capability::FlowControl => "FlowControl",
            Capability::Steps => "Steps",
            Capability::Events => "Events",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads beyond one job: children, attempt history, counts, the queue overview and
/// filtered listing (rules E8, H1–H4, A3, A4, A7).
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Rule E8: the jobs enqueued with `parent`, oldest first.
    async fn children(&self, parent: JobId) -> Result<Vec<Job>>;

    /// Rules H1–H4: the job's attempts, oldest first, at most
    /// [`ATTEMPTS_KEPT`](crate::ATTEMPTS_KEPT), the running one included, read in one
    /// snapshot with the job's record ([`crate::attempts::history`] puts the stored
    /// records and the record's own attempt together). [`crate::Error::NotFound`] for
    /// an unknown job.
    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>>;

    /// Rule A3: counts of one queue's jobs per state at `now` (`paused` is left
    /// `false`: the handle fills it in from [`Pause::paused_queues`]).
    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats>;

    /// Rule A7: every queue of the namespace that holds a job, sorted by name, with its
    /// counts at `now` (as [`Inspect::stats`] counts them, `paused` left `false`) and
    /// the ready time of its oldest ready job (`lag` left `None`: the handle fills in
    /// both, and lists the paused queues that hold no job).
    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>>;

    /// Rule A4: one page of the jobs `query` matches ([`ListQuery::matches`]), newest
    /// first, after its cursor. A page holds at most `query.limit` jobs; `next` is the
    /// last listed id when the page is full, and `None` only when no job after the page
    /// matches. A backend that bounds the work of one call may end a page early, `next`
    /// set to the last id it examined.
    async fn list(&self, query: ListQuery) -> Result<ListPage>;
}

/// An operator's actions on jobs: cancel, retry and purge (rules A1, A2, A5).
#[async_trait]
pub trait Admin: Send + Sync {
    /// Rule A1: cancels a queued job, asks a running one to stop, leaves a terminal one.
    /// Returns the job's state afterwards.
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState>;

    /// Rule A2: queues a dead or cancelled job again with its attempts reset.
    /// Any other state is refused with [`crate::Error::InvalidState`].
    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()>;

    /// Rule A5: deletes up to `limit` terminal jobs that finished at or before
    /// `cutoff`, with their index entries. Returns how many were deleted.
    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64>;
}

/// Pausing queues for every store of a namespace (rule Q1). A backend that declares
/// it also makes its claims pass over paused queues.
#[async_trait]
pub trait Pause: Send + Sync {
    /// Rule Q1: pauses (`true`) or resumes (`false`) `queue` for every store of the
    /// namespace, in every process: no claim takes a job from a paused queue.
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()>;

    /// Rule Q1: the namespace's paused queues, sorted by name.
    async fn paused_queues(&self) -> Result<Vec<String>>;
}

/// Limits on the jobs of a queue that run at once and start, and fair shares (rules
/// K1–K5): stored per namespace
/// and queue, and enforced by the backend's claim, atomically with the leases it writes.
/// A backend that declares it also stores each job's concurrency key (`get` reads it
/// back); the [`Store`](crate::Store) refuses a job with a key on one that does not.
#[async_trait]
pub trait FlowControl: Send + Sync {
    /// Rule K3: stores `limits` as `queue`'s, replacing what it had; unlimited limits
    /// ([`QueueLimits::is_unlimited`]) remove the queue's. The next claim applies them.
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()>;

    /// Rule K3: the limits of every queue that has some, sorted by queue name.
    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>>;

    /// Rule K3: what `queue`'s limits hold back at `now`: its running jobs, the keys at
    /// their running limit, and when its rates admit a start again.
    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus>;
}

/// Durable steps (rules D1–D4): outputs a running job saves under names, fenced by its
/// lease token and kept across its runs, and an operator's reopen of an ended job from
/// one of them, guarded by the job's generation.
///
/// A backend keeps the steps beside the job's record, so that whatever deletes the
/// record (retention, A5) deletes them, and reopens in one atomic step: the generation
/// compared and moved, the steps from the named one on deleted, the job queued.
#[async_trait]
pub trait Steps: Send + Sync {
    /// Rule D2: the job's generation and the steps saved in it, oldest first;
    /// [`crate::Error::NotFound`] for an unknown job.
    async fn steps(&self, id: JobId) -> Result<StepLog>;

    /// Rule D1: saves `output` as step `name` of the job running under `token`, at
    /// `now`. The first save of a name in a generation stands: a later one changes
    /// nothing and succeeds. [`crate::Error::LeaseLost`] when `token` does not hold the
    /// job's lease, and `InvalidInput { field: "step" }` for a save past
    /// [`MAX_STEPS`](crate::steps::MAX_STEPS); either writes nothing.
    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: bytes::Bytes,
        now: Timestamp,
    ) -> Result<()>;

    /// Rule D3: reopens the ended job `id` from step `step`, if its generation is
    /// still `generation`: deletes `step` and every step saved after it, moves the
    /// generation up by one and queues the job as [`Admin::retry`] does, in one atomic
    /// step. Refused, writing nothing: [`crate::Error::StaleGeneration`],
    /// [`crate::Error::InvalidState`] for a job that has not ended, and
    /// `InvalidInput { field: "step" }` for a step not saved in the generation
    /// ([`crate::steps::StepLog::reopened_from`] decides the first and last from a
    /// log read in the same step).
    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()>;
}

/// The event stream (rules V1–V4): every state change of a job enqueued through a store
/// that records events ([`StoreSettings::record_events`](crate::StoreSettings::record_events)),
/// and the events handlers emit, in one ordered stream per namespace.
///
/// A backend records a change in the same atomic step as the change itself, whichever
/// store makes it, so the stream never shows a change that did not happen or misses
/// one that did. Its enqueue stores the mark on the job; every later write reads it
/// from the job.
#[async_trait]
pub trait Events: Send + Sync {
    /// Rule V2: up to `limit` events with cursors after `after`, oldest first
    /// ([`crate::events::page`] builds the answer). `limit` is 1..=
    /// [`MAX_EVENTS_PAGE`](crate::events::MAX_EVENTS_PAGE), checked by the handle.
    /// An event is answered only once no event with a smaller cursor can still
    /// appear, so a consumer that resumes from `next` never skips one.
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage>;

    /// Rule V1: records an `emitted` event `name` with `data` for the job running
    /// under `token`, at `now`. [`crate::Error::LeaseLost`] when `token` does not hold
    /// the job's lease, [`crate::Error::NotFound`] for an unknown job; either writes
    /// nothing.
    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: bytes::Bytes,
        now: Timestamp,
    ) -> Result<()>;

    /// Rule V3: deletes every event but the newest `keep`, in one atomic step, and
    /// remembers the newest cursor it deleted (a later read from before it is
    /// `trimmed`). Answers how many it deleted.
    async fn trim_events(&self, keep: u64) -> Result<u64>;
}

/// Stored cron schedules (rules S1–S3): the store keeps each schedule's definition as
/// opaque text and its last tick; the handle fires them.
#[async_trait]
pub trait Schedules: Send + Sync {
    /// Rule S1: stores schedule `name` with its definition `spec` (opaque text). A new
    /// schedule starts enabled, its last tick `now`; an existing one keeps both.
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()>;

    /// Rule S1: every schedule of the namespace, sorted by name.
    async fn schedules(&self) -> Result<Vec<StoredSchedule>>;

    /// Rule S2: changes only what `update` sets, in one atomic step; the last tick
    /// only moves forward. `ScheduleNotFound` for an unknown name.
    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()>;

    /// Rule S1: deletes schedule `name`; whether it existed.
    async fn delete_schedule(&self, name: &str) -> Result<bool>;
}

/// The registry of running workers (rules W1–W4).
#[async_trait]
pub trait WorkerRegistry: Send + Sync {
    /// Rule W1: stores worker `id` with its description `spec` (opaque text),
    /// `in_flight` and `last_seen` `now`, replacing any record of that id whole.
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()>;

    /// Rule W2: sets worker `id`'s `in_flight` and moves its `last_seen` to `now`;
    /// whether the worker is registered (an unknown one is left unregistered).
    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool>;

    /// Rule W3: removes worker `id`'s record; whether it existed.
    async fn delete_worker(&self, id: &str) -> Result<bool>;

    /// Rule W1: every registered worker of the namespace, sorted by id.
    async fn workers(&self) -> Result<Vec<StoredWorker>>;

    /// Rule W4: removes every worker last seen strictly before `cutoff`, and returns
    /// their ids, sorted.
    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>>;
}
