#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod codec;
mod config;
mod conn;
mod keys;
mod scripts;
mod store;
mod wake;

pub use backend::{ReclaimReport, RedisBackend};
pub use config::RedisConfig;
#[cfg(feature = "tls")]
pub use config::TlsConfig;

/// The key of job `id`'s hash in `namespace`: for operators and test harnesses that
/// inspect or delete a record behind the store's back (see `docs/redis.md`).
pub fn job_key(namespace: &str, id: durq_core::JobId) -> String {
    keys::Keys::new(namespace).job(id)
}
