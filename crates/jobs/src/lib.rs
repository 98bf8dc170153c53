#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod connect;
mod handler;
pub mod telemetry;
mod worker;

pub use jobs_core::*;

pub use client::Client;
pub use connect::{connect, connect_with};
pub use handler::{CancelReason, JobContext, JobError, JobOutput, Json};
pub use worker::{
    ShutdownHandle, Worker, WorkerBuilder, WorkerHandle, DEFAULT_BLOCKING_THRESHOLD,
    DEFAULT_CONCURRENCY, DEFAULT_LEASE, DEFAULT_TIMEOUT,
};

/// The backends compiled in, one per enabled feature. Each module is the backend
/// crate itself, for backend-specific options; most code only needs [`connect`].
pub mod backends {
    /// The in-memory backend (`memory` feature): for tests and single-process use.
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    pub use jobs_memory as memory;

    /// The embedded SQLite backend (`sqlite` feature, on by default).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub use jobs_sqlite as sqlite;

    /// The Redis backend (`redis` feature).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub use jobs_redis as redis;

    /// The PostgreSQL backend (`postgres` feature).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use jobs_postgres as postgres;
}
