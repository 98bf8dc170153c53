#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod handler;
pub mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub mod trace_context;
mod tracing_layer;
mod worker;

// What a user of the queue needs, and nothing a backend author needs: those tools
// (`validate`, `ReadyOrder`, `JobIdHasher`, …) stay in `durq-core`.
pub use connect::{connect, connect_with};
pub use durq_core::{
    contract, Attempt, AttemptOutcome, Backoff, Budget, Bytes, Cadence, Capability, CatchUp, Clock,
    Dependency, DependencyFailure, Enqueued, Error, FencedCompletion, FlowStatus, Job, JobId,
    JobState, Lease, LeaseToken, ListPage, ListQuery, ManualClock, Needs, NewJob, QueueLimits,
    QueueOverview, QueueStats, Rate, Result, SavedStep, Schedule, ScheduleRecord, StepLog, Store,
    StoreSettings, SystemClock, Tags, Timestamp, TypedJob, Uniqueness, WorkerInfo, ATTEMPTS_KEPT,
};

/// The namespace's event stream (CONTRACT V1–V4): what
/// [`Store::events`](durq_core::Store::events) reads. Not to be confused with
/// [`JobEvent`], the lifecycle hooks of one worker process: the stream is durable,
/// ordered across every process, and resumable from a cursor.
pub mod stream {
    pub use durq_core::events::MAX_EVENTS_PAGE;
    pub use durq_core::{Event, EventCursor, EventKind, EventPage};
}

/// The requests and answers of the calls a worker makes on the store: `claim`,
/// `heartbeat`, `complete`, `fail`, `release`, `reclaim` (CONTRACT C, L, R).
/// [`Worker`] makes these calls for you, keeping each lease from claim to stored outcome;
/// they are here for runtimes of your own and for tests of the contract.
pub mod worker_calls {
    pub use durq_core::{
        ClaimRequest, ClaimedJob, Completion, Heartbeat, HeldLease, ReclaimedJob, Retry,
    };
}
pub use handler::{CancelReason, JobContext, JobError, JobOutput, Json};
pub use worker::{
    JobEvent, JobOutcome, ShutdownHandle, Worker, WorkerBuilder, WorkerHandle,
    DEFAULT_BLOCKING_THRESHOLD, DEFAULT_CONCURRENCY, DEFAULT_LEASE, DEFAULT_TIMEOUT,
};

/// Writing layers: code that wraps every store call (metrics, tracing, fault
/// injection, a tenant guard). A layer implements [`LayeredBackend`](layers::LayeredBackend)
/// and overrides only the calls it changes; `store.layer(..)` adds it to a handle.
pub mod layers {
    pub use crate::telemetry::MetricsLayer;
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub use crate::trace_context::TraceContextLayer;
    pub use crate::tracing_layer::TracingLayer;
    pub use durq_core::{async_trait, Backend, Capabilities, Layer, LayeredBackend};
}

/// The backends compiled in, one per enabled feature. Each module is the backend
/// crate itself, for backend-specific options; most code only needs [`connect`].
pub mod backends {
    /// The in-memory backend (`memory` feature): for tests and single-process use.
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    pub use durq_memory as memory;

    /// The embedded SQLite backend (`sqlite` feature, on by default).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub use durq_sqlite as sqlite;

    /// The Redis backend (`redis` feature).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub use durq_redis as redis;

    /// The PostgreSQL backend (`postgres` feature).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use durq_postgres as postgres;
}
