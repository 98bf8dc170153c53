#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod conn;
mod error;
mod health;
mod pool;
mod row;
mod schema;
mod sql;
mod statistics;
mod store;
mod transaction;
mod wake;
mod warm;

pub use backend::PostgresBackend;
pub use config::{Durability, PostgresConfig, DEFAULT_APPLICATION_NAME, DEFAULT_SCHEMA};
pub use pool::PostgresPool;

/// The sqlx this crate is built with: the transactions `PostgresBackend::enqueue_in`
/// and `complete_in` take are this version's.
pub use sqlx;
/// Re-exported so callers can build pools and options without naming sqlx's version.
pub use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
