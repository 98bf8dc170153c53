#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod engine;
mod error;
mod schema;
mod store;
mod transaction;

pub use backend::SqliteBackend;
pub use config::{SqliteConfig, Synchronous};
pub use transaction::SqliteTransaction;

/// The SQLite driver this crate is built on. A caller's transactions
/// ([`SqliteBackend::transaction`]) take its connections, so use this re-export (or the
/// same version) to write your own rows next to the jobs.
pub use rusqlite;

/// The schema version this build creates and migrates files to.
pub const SCHEMA_VERSION: i64 = schema::SCHEMA_VERSION;
