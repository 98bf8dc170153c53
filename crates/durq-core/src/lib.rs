#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod attempts;
mod backend;
mod backoff;
#[cfg(feature = "batch")]
pub mod batch;
pub mod capability;
pub mod ending;
mod error;
pub mod events;
pub mod fair;
pub mod fit;
pub mod graph;
mod id;
mod layer;
mod limits;
mod listing;
pub mod meta;
mod model;
mod order;
mod schedule;
mod state;
pub mod steps;
mod store;
mod time;
pub mod transaction;
pub mod transition;
pub mod validate;
mod workers;

pub use attempts::{Attempt, AttemptOutcome, ATTEMPTS_KEPT};
pub use backend::{complete_each, heartbeat_each, Backend, Capabilities, Partitioning};
pub use backoff::Backoff;
pub use capability::{
    Admin, Capability, Events, FlowControl, Inspect, Pause, Schedules, Steps, WorkerRegistry,
};
pub use error::{BoxError, Error, Result, SharedError};
pub use events::{Event, EventCursor, EventKind, EventPage};
pub use fit::{Budget, Needs};
pub use graph::{Dependency, DependencyFailure};
pub use id::{JobId, JobIdHasher, JobIdMap, ParseJobIdError};
pub use layer::{Layer, LayeredBackend};
pub use limits::{
    FlowStatus, QueueLimits, Rate, StoredLimits, FLOW_KEYS_SHOWN, MAX_RATE_PERIOD, MAX_RATE_STARTS,
};
pub use meta::Tags;
pub use model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState, Lease,
    LeaseToken, ListPage, ListQuery, NewJob, QueueOverview, QueueStats, ReclaimedJob, Retry,
    StoreSettings, TypedJob, Uniqueness, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD_BYTES,
};
pub use order::ReadyOrder;
pub use schedule::{
    Cadence, CatchUp, Due, Schedule, ScheduleRecord, ScheduleUpdate, StoredSchedule,
};
pub use state::ParseJobStateError;
pub use steps::{SavedStep, StepLog};
pub use store::Store;
pub use time::{duration_millis, Clock, ManualClock, SystemClock, Timestamp};
pub use transaction::FencedCompletion;
pub use workers::{StoredWorker, WorkerInfo, MAX_HOST_BYTES};

// The contract is this module's documentation; the module holds no items.
#[doc = include_str!("../CONTRACT.md")]
pub mod contract {}

/// The text of the job store contract (see [`contract`]), in Markdown.
///
/// The `durq-conformance` crate reads the rule ids (`**E1**`, `**C2**`, …) from it, so
/// a rule added to the contract without a scenario named after it fails its tests.
pub const CONTRACT: &str = include_str!("../CONTRACT.md");

/// The `last_error` a job gets when its lease expires and `reclaim` takes it back
/// (rule R1 of the [`contract`]).
pub const LEASE_EXPIRED: &str = "lease expired";

/// Re-exported so backends and callers name one version.
pub use async_trait::async_trait;
pub use bytes::Bytes;
