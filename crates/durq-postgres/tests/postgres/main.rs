//! Tests of what is particular to the PostgreSQL backend: races across connections,
//! server-side connection kills, concurrent migrations and upgrades, wake-ups, corrupt
//! rows, and fitted claims held to their reference in durq-core.
//!
//! Each needs the server at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`) and is skipped loudly without it.

mod enqueue_and_claims;
mod events;
mod flow_control;
mod leases_and_history;
mod reads_and_connections;
mod steps;

use durq_conformance::unique_namespace;
use durq_core::{
    AttemptOutcome, Budget, ClaimRequest, Clock, Completion, Error, Heartbeat, HeldLease, JobId,
    JobState, LeaseToken, ListQuery, ManualClock, Needs, NewJob, Retry, Store, StoreSettings,
    WorkerInfo, LEASE_EXPIRED,
};
use durq_postgres::{PgPool, PgPoolOptions, PostgresConfig, PostgresPool};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

const TTL: Duration = Duration::from_secs(30);

/// The schema version this build migrates to.
const LATEST_VERSION: i32 = 15;

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A backend of its own (its own pool) on the default schema, or `None` to skip.
async fn backend(application_name: &str, max_connections: u32) -> Option<PostgresPool> {
    let config = PostgresConfig::new(&url())
        .ok()?
        .max_connections(max_connections)
        .application_name(application_name);
    match PostgresPool::connect(config).await {
        Ok(backend) => Some(backend),
        Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url(), &err),
    }
}

/// Drops a schema a test made, with everything in it.
async fn drop_schema(admin: &PgPool, schema: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(admin)
    .await
    .expect("drop the schema");
}

fn settings(clock: &ManualClock) -> StoreSettings {
    StoreSettings::default()
        .namespace(unique_namespace("pg"))
        .clock(Arc::new(clock.clone()))
}

/// A `Store` handle on a store of `backend` for `settings`.
fn open(backend: &PostgresPool, settings: StoreSettings) -> Store {
    Store::new(backend.backend(settings).expect("valid settings"))
}

/// What an upgrade test starts from: a schema of its own at this build's version with
/// three jobs in it (`queued`; `running`, whose lease was taken at `started` with
/// `running_token`; `done`, completed), its pools closed, ready to be taken back to an
/// older version by the test and opened again with [`schema_config`].
struct JobsInFlight {
    schema: String,
    clock: ManualClock,
    settings: StoreSettings,
    queued: JobId,
    running: JobId,
    done: JobId,
    started: durq_core::Timestamp,
    running_token: LeaseToken,
}

impl JobsInFlight {
    async fn new(prefix: &str) -> JobsInFlight {
        let schema = unique_name(prefix);
        let clock = ManualClock::default();
        let settings = settings(&clock);
        let pool = PostgresPool::connect(schema_config(&schema))
            .await
            .expect("migrate");
        let old = open(&pool, settings.clone());
        let queued = old.enqueue(NewJob::new("q")).await.expect("enqueue").id;
        let running = old.enqueue(NewJob::new("r")).await.expect("enqueue").id;
        let done = old.enqueue(NewJob::new("d")).await.expect("enqueue").id;
        let started = clock.now();
        let held = old
            .claim(ClaimRequest::new(["r", "d"], "w-old", TTL).limit(2))
            .await
            .expect("claim");
        let token_of = |id: JobId| {
            held.iter()
                .find(|c| c.id() == id)
                .map(|c| c.token())
                .expect("claimed")
        };
        old.complete(done, token_of(done), None)
            .await
            .expect("complete");
        JobsInFlight {
            running_token: token_of(running),
            schema,
            clock,
            settings,
            queued,
            running,
            done,
            started,
        }
    }
}

/// The configuration of schema `schema` of the test server, for a pool of two
/// connections.
fn schema_config(schema: &str) -> PostgresConfig {
    PostgresConfig::new(&url())
        .expect("url")
        .schema(schema.to_owned())
        .expect("schema")
        .max_connections(2)
}

/// Deletes every row a test wrote in `namespace` of `backend`'s schema; each test
/// that writes ends with it, so the shared server keeps nothing of a passing run.
async fn clean_up(backend: &PostgresPool, namespace: &str) {
    backend
        .drop_namespace(namespace)
        .await
        .expect("delete the test's namespace");
}

fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}_{}_{nanos:x}", std::process::id())
}

async fn join<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(done) = set.join_next().await {
        match done {
            Ok(value) => out.push(value),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("a task did not finish: {err}"),
        }
    }
    out
}

/// The attempt rows of `namespace` in the default schema.
async fn attempt_rows(backend: &PostgresPool, namespace: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs.attempts WHERE namespace = $1")
        .bind(namespace)
        .fetch_one(backend.pool())
        .await
        .expect("count attempt rows")
}

/// The dependency edges of `namespace` in the default schema (CONTRACT G1).
async fn edge_rows(backend: &PostgresPool, namespace: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs.dependencies WHERE namespace = $1")
        .bind(namespace)
        .fetch_one(backend.pool())
        .await
        .expect("count dependency rows")
}

/// How many transactions wrote the job's row and its attempt rows as they stand: 1
/// when the last change of state and the attempt it ended were one statement.
async fn writers_of(backend: &PostgresPool, namespace: &str, id: JobId) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT x) FROM (
             SELECT xmin::text AS x FROM jobs.jobs
             WHERE namespace = $1 AND id = $2::text::uuid
             UNION ALL
             SELECT xmin::text FROM jobs.attempts
             WHERE namespace = $1 AND job = $2::text::uuid AND ended_at = (
                 SELECT max(ended_at) FROM jobs.attempts
                 WHERE namespace = $1 AND job = $2::text::uuid)
         ) t",
    )
    .bind(namespace)
    .bind(id.to_string())
    .fetch_one(backend.pool())
    .await
    .expect("read xmin")
}

/// A pool of its own, outside the store's, to look at and terminate sessions, read
/// catalogs, and create and drop schemas; `None` to skip.
async fn admin() -> Option<PgPool> {
    match PgPoolOptions::new()
        .max_connections(1)
        .connect(&url())
        .await
    {
        Ok(pool) => Some(pool),
        Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url(), &err),
    }
}

/// Opens every connection the backend's pool may hold and gives them back, so that a
/// terminate round leaves that many dead connections waiting in the pool, each
/// recently used (sqlx's own check before handing out a connection idle for long
/// would not catch them).
async fn fill_pool(backend: &PostgresPool) -> usize {
    let pool = backend.pool();
    let max = pool.options().get_max_connections() as usize;
    let mut held = Vec::with_capacity(max);
    for _ in 0..max {
        held.push(pool.acquire().await.expect("open a pooled connection"));
    }
    drop(held);
    // sqlx gives connections back from tasks of its own (after a ping of each).
    let all_idle = async {
        while pool.num_idle() < max {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_idle)
        .await
        .expect("the pool's connections come back idle");
    max
}

/// Terminates every session whose `application_name` is `app` (the store's pool and
/// nothing else) and waits for each to end; returns how many ended.
async fn terminate(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
         FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .expect("terminate backends")
}

/// A small deterministic generator, so a failing sequence replays from its seed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A queued job as the test knows it: what the claim order and the budget look at.
struct Known {
    id: JobId,
    queue: &'static str,
    priority: i16,
    run_at: durq_core::Timestamp,
    seq: u64,
    needs: Needs,
    locality: Option<String>,
}

/// The rows of `namespace` in the default schema: (jobs, idempotency keys).
async fn rows_of(backend: &PostgresPool, namespace: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobs.jobs WHERE namespace = $1),
                (SELECT count(*) FROM jobs.dedup WHERE namespace = $1)",
    )
    .bind(namespace)
    .fetch_one(backend.pool())
    .await
    .expect("count rows")
}

/// Waits until a session named `app` waits for a lock (a row lock, in these tests).
async fn until_waiting_for_a_lock(admin: &PgPool, app: &str) {
    let waiting = async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
            )
            .bind(app)
            .fetch_one(admin)
            .await
            .expect("read the sessions");
            if waiting > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap_or_else(|_| panic!("no session of {app} waited for a lock"));
}
