#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

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

pub use pool::{
    Durability, PostgresConfig, PostgresPool, DEFAULT_APPLICATION_NAME, DEFAULT_SCHEMA,
};
pub use store::PostgresBackend;

/// The sqlx this crate is built with: the transactions `PostgresBackend::enqueue_in`
/// and `complete_in` take are this version's.
pub use sqlx;
/// Re-exported so callers can build pools and options without naming sqlx's version.
pub use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
