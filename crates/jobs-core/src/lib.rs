#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backoff;
mod error;
mod id;
mod model;
mod order;
mod store;
mod time;
pub mod validate;

pub use backoff::Backoff;
pub use error::{BoxError, Error, Result};
pub use id::{JobId, JobIdHasher, JobIdMap};
pub use model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState, Lease,
    LeaseToken, ListPage, ListQuery, NewJob, QueueStats, ReclaimedJob, Retry, StoreSettings,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_PAYLOAD_BYTES,
};
pub use order::ReadyOrder;
pub use store::{complete_each, heartbeat_each, Store, StoreExt};
pub use time::{duration_millis, Clock, ManualClock, SystemClock, Timestamp};

/// The `last_error` a job gets when its lease expires and `reclaim` takes it back
/// (CONTRACT R1).
pub const LEASE_EXPIRED: &str = "lease expired";

/// Re-exported so backends and callers name one version.
pub use async_trait::async_trait;
pub use bytes::Bytes;
