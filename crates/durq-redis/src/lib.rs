#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod codec;
mod config;
mod conn;
mod keys;
mod partitions;
mod scripts;
mod store;
mod wake;

pub use backend::{ReclaimReport, RedisBackend};
pub use config::RedisConfig;
#[cfg(feature = "tls")]
pub use config::TlsConfig;

/// The key of job `id`'s hash in `namespace`: for operators and test harnesses that
/// inspect or delete a record behind the store's back (see `docs/redis.md`). For a
/// partitioned namespace, see [`job_key_in`].
pub fn job_key(namespace: &str, id: durq_core::JobId) -> String {
    keys::Keys::new(namespace).job(id)
}

/// The key of job `id`'s hash in `namespace` spread over `partitions` partitions (1 is
/// an unpartitioned namespace, as [`job_key`]): the hash is in the partition the id
/// names.
pub fn job_key_in(namespace: &str, partitions: usize, id: durq_core::JobId) -> String {
    if partitions <= 1 {
        return job_key(namespace, id);
    }
    keys::Keys::partition(namespace, partitions::of_id(id, partitions), partitions).job(id)
}

/// The key of job `id`'s steps hash (CONTRACT D1–D4) in `namespace` spread over
/// `partitions` partitions (1 is an unpartitioned namespace): in the job's slot, beside
/// [`job_key_in`]. For operators and test harnesses that delete a record behind the
/// store's back: its steps go with it (see `docs/redis.md`, "Durable steps").
pub fn steps_key_in(namespace: &str, partitions: usize, id: durq_core::JobId) -> String {
    if partitions <= 1 {
        return keys::Keys::new(namespace).steps(id);
    }
    keys::Keys::partition(namespace, partitions::of_id(id, partitions), partitions).steps(id)
}

/// The hash tag of partition `partition` of a namespace spread over `partitions`: every
/// key of that partition is `jobs:{TAG}:…`. For operators and test harnesses that look
/// at one partition's keys (see `docs/redis.md`, "Partitioned namespaces").
pub fn partition_tag(namespace: &str, partition: usize, partitions: usize) -> String {
    keys::partition_tag(namespace, partition, partitions)
}
