//! Enqueue and completion inside the caller's own transaction (CONTRACT §7), against
//! the real server: a rolled-back transaction leaves no job and sends no wake-up, a
//! committed one is claimable and wakes a waiting worker, a stale lease refuses the
//! whole transaction, keys hold across concurrent transactions, and a process killed
//! before its commit leaves neither its business row nor its job.
//!
//! Each needs the server at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and is skipped loudly without it.

mod in_the_callers_transaction;

use bytes::Bytes;
use durq_conformance::unique_namespace;
use durq_core::{
    AttemptOutcome, ClaimRequest, Clock, Error, JobId, JobState, ListQuery, ManualClock, NewJob,
    Store, StoreSettings,
};
use durq_postgres::{PostgresBackend, PostgresConfig, PostgresPool, DEFAULT_SCHEMA};
use sqlx::postgres::PgListener;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

const TTL: Duration = Duration::from_secs(30);

/// Set in the child process of `a_process_killed_before_its_commit_leaves_neither`:
/// `namespace '\n' business table`.
const CHILD: &str = "JOBS_PG_TRANSACTION_CHILD";

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

async fn backend(max_connections: u32) -> Option<PostgresPool> {
    let config = PostgresConfig::new(&url())
        .ok()?
        .max_connections(max_connections)
        .application_name("durq-postgres-transaction");
    match PostgresPool::connect(config).await {
        Ok(backend) => Some(backend),
        Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url(), &err),
    }
}

/// One test's world: a store on a namespace of its own, a handle on it, and a business
/// table of its own, all removed by [`Fixture::clean_up`].
struct Fixture {
    backend: PostgresPool,
    pg: PostgresBackend,
    store: Store,
    clock: ManualClock,
    table: String,
}

impl Fixture {
    async fn new(max_connections: u32) -> Option<Fixture> {
        let backend = backend(max_connections).await?;
        let clock = ManualClock::default();
        let settings = StoreSettings::default()
            .namespace(unique_namespace("pgtx"))
            .clock(Arc::new(clock.clone()));
        let pg = backend.backend(settings).expect("valid settings");
        let store = Store::new(pg.clone());
        let table = format!("jobs_test_orders_{}", unique_suffix());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, note text)"
        )))
        .execute(pg.pool())
        .await
        .expect("create the business table");
        Some(Fixture {
            backend,
            pg,
            store,
            clock,
            table,
        })
    }

    fn namespace(&self) -> String {
        self.store.settings().namespace.clone()
    }

    async fn insert_row(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        id: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id, note) VALUES ($1, 'order')",
            self.table
        )))
        .bind(id)
        .execute(&mut **tx)
        .await
        .map(|_| ())
    }

    /// A job of queue `work`, enqueued and claimed by `worker` for `ttl`.
    async fn enqueue_and_claim(&self, worker: &str, ttl: Duration) -> durq_core::ClaimedJob {
        self.store
            .enqueue(NewJob::new("work"))
            .await
            .expect("enqueue");
        let mut claimed = self
            .store
            .claim(ClaimRequest::new(["work"], worker, ttl))
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "the job is claimed");
        claimed.remove(0)
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.table
        )))
        .fetch_one(self.pg.pool())
        .await
        .expect("count the business rows")
    }

    async fn jobs_in(&self, queue: &str) -> u64 {
        let stats = self.store.stats(queue).await.expect("stats");
        stats.ready
            + stats.scheduled
            + stats.running
            + stats.succeeded
            + stats.dead
            + stats.cancelled
    }

    async fn clean_up(self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {}",
            self.table
        )))
        .execute(self.pg.pool())
        .await
        .expect("drop the business table");
        self.backend
            .drop_namespace(&self.namespace())
            .await
            .expect("delete the test's namespace");
    }
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}_{nanos:x}", std::process::id())
}
