//! Fenced completion through the worker runtime (CONTRACT §7, T3), on the backends that
//! take the caller's transaction: a handler that writes its results and completes its
//! job in one transaction returns the receipt, and the worker records nothing more; a
//! handler whose lease was taken over has its whole transaction refused, and the worker
//! records nothing for the attempt.
//!
//! SQLite always runs; PostgreSQL (`DATABASE_URL`) is skipped loudly when unreachable,
//! and fails under `JOBS_REQUIRE_SERVICES=1`.

#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durq::backends::postgres::{sqlx, PostgresBackend, PostgresConfig, PostgresPool};
use durq::backends::sqlite::SqliteBackend;
use durq::layers::{async_trait, Backend, LayeredBackend};
use durq::worker_calls::{ClaimRequest, Completion, HeldLease, Retry};
use durq::{
    Backoff, Error, FencedCompletion, JobContext, JobEvent, JobId, JobOutcome, JobState,
    LeaseToken, ManualClock, NewJob, Result, Store, StoreSettings, Timestamp, Worker,
};
use tokio::sync::{mpsc, Notify};

const PATIENCE: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);

/// A backend whose transactions a handler can write business rows in.
#[async_trait]
trait Transactional: Send + Sync + 'static {
    /// A plain handle on the test's store.
    fn store(&self) -> Store;

    /// In one transaction: writes business row `row`, completes job `id` under
    /// `token` (fenced), and commits. A refused completion refuses the transaction.
    async fn write_and_complete(
        &self,
        row: i64,
        id: JobId,
        token: LeaseToken,
    ) -> Result<FencedCompletion>;

    /// How many business rows are committed.
    async fn rows(&self) -> i64;

    /// Removes what the test wrote.
    async fn teardown(&self);
}

struct Postgres {
    backend: PostgresPool,
    pg: PostgresBackend,
    table: String,
}

impl Postgres {
    async fn open(settings: StoreSettings) -> Option<Arc<dyn Transactional>> {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let config = PostgresConfig::new(&url).ok()?.max_connections(8);
        let backend = match PostgresPool::connect(config).await {
            Ok(backend) => backend,
            Err(err) => return durq_conformance::skip_or_fail("PostgreSQL", &url, &err),
        };
        let pg = backend.backend(settings.clone()).expect("valid settings");
        let table = format!(
            "jobs_test_receipts_{}",
            settings
                .namespace
                .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY)"
        )))
        .execute(pg.pool())
        .await
        .expect("create the business table");
        Some(Arc::new(Postgres { backend, pg, table }))
    }
}

#[async_trait]
impl Transactional for Postgres {
    fn store(&self) -> Store {
        Store::new(self.pg.clone())
    }

    async fn write_and_complete(
        &self,
        row: i64,
        id: JobId,
        token: LeaseToken,
    ) -> Result<FencedCompletion> {
        let mut tx = self.pg.pool().begin().await.map_err(backend_error)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id) VALUES ($1)",
            self.table
        )))
        .bind(row)
        .execute(&mut *tx)
        .await
        .map_err(backend_error)?;
        let receipt = self.pg.complete_in(&mut tx, id, token, None).await?;
        tx.commit().await.map_err(backend_error)?;
        Ok(receipt)
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

    async fn teardown(&self) {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {}", self.table)))
            .execute(self.pg.pool())
            .await
            .expect("drop the business table");
        let namespace = Backend::settings(&self.pg).namespace.clone();
        self.backend
            .drop_namespace(&namespace)
            .await
            .expect("drop the namespace");
    }
}

struct Sqlite {
    store: SqliteBackend,
    _dir: tempfile::TempDir,
}

impl Sqlite {
    async fn open(settings: StoreSettings) -> Option<Arc<dyn Transactional>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteBackend::open(dir.path().join("jobs.db"), settings)
            .await
            .expect("open the store");
        let conn = store.connection().expect("a connection");
        conn.execute("CREATE TABLE receipts (id INTEGER PRIMARY KEY)", [])
            .expect("create the business table");
        Some(Arc::new(Sqlite { store, _dir: dir }))
    }
}

#[async_trait]
impl Transactional for Sqlite {
    fn store(&self) -> Store {
        Store::new(self.store.clone())
    }

    async fn write_and_complete(
        &self,
        row: i64,
        id: JobId,
        token: LeaseToken,
    ) -> Result<FencedCompletion> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = store.connection()?;
            let mut tx = store.transaction(&mut conn)?;
            tx.execute("INSERT INTO receipts (id) VALUES (?1)", [row])
                .map_err(backend_error)?;
            let receipt = tx.complete(id, token, None)?;
            tx.commit()?;
            Ok(receipt)
        })
        .await
        .map_err(backend_error)?
    }

    async fn rows(&self) -> i64 {
        let conn = self.store.connection().expect("a connection");
        conn.query_row("SELECT count(*) FROM receipts", [], |row| row.get(0))
            .expect("count the business rows")
    }

    async fn teardown(&self) {}
}

fn backend_error(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Backend {
        message: err.to_string(),
        source: Some(Arc::new(err)),
    }
}

/// Counts the outcomes the worker records, and holds heartbeats back while asked to,
/// so a test can take a lease over without the worker hearing of it.
#[derive(Debug)]
struct Watch {
    inner: Arc<dyn Backend>,
    completions: AtomicUsize,
    failures: AtomicUsize,
    releases: AtomicUsize,
    hold_heartbeats: AtomicBool,
    released: Notify,
}

impl Watch {
    fn new(inner: Arc<dyn Backend>) -> Self {
        Watch {
            inner,
            completions: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
            hold_heartbeats: AtomicBool::new(false),
            released: Notify::new(),
        }
    }

    fn recorded(&self) -> (usize, usize, usize) {
        (
            self.completions.load(Ordering::SeqCst),
            self.failures.load(Ordering::SeqCst),
            self.releases.load(Ordering::SeqCst),
        )
    }

    async fn held(&self) -> Result<()> {
        if self.hold_heartbeats.load(Ordering::SeqCst) {
            self.released.notified().await;
            return Err(Error::Unavailable {
                message: "heartbeats held by the test".to_owned(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl LayeredBackend for Watch {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        self.completions
            .fetch_add(completions.len(), Ordering::SeqCst);
        self.inner.complete_batch(completions, now).await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.failures.fetch_add(1, Ordering::SeqCst);
        self.inner.fail(id, token, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(id, token, ready_at, now).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<durq::worker_calls::Heartbeat>>> {
        self.held().await?;
        self.inner.heartbeat_batch(leases, ttl, now).await
    }
}

fn settings(clock: &ManualClock) -> StoreSettings {
    StoreSettings::default()
        .namespace(durq_conformance::unique_namespace("rttx"))
        .clock(Arc::new(clock.clone()))
}

fn worker(store: Store) -> durq::WorkerBuilder {
    Worker::builder(store)
        .worker_id("fenced")
        .lease(LEASE)
        .heartbeat_interval(Duration::from_millis(20))
        .poll_interval(Duration::from_millis(20))
        .reclaim_interval(Duration::from_secs(3600))
        .backoff(Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(3600),
            jitter: 0.0,
        })
}

/// Waits for the worker's `Succeeded` event of every job in `ids`: the hook is called
/// once the success is stored, so nothing needs polling.
async fn succeeded_events(events: &mut mpsc::UnboundedReceiver<JobId>, ids: &[JobId]) {
    let mut left: std::collections::HashSet<JobId> = ids.iter().copied().collect();
    let heard = tokio::time::timeout(PATIENCE, async {
        while !left.is_empty() {
            match events.recv().await {
                Some(id) => {
                    left.remove(&id);
                }
                None => return,
            }
        }
    })
    .await;
    assert!(
        heard.is_ok() && left.is_empty(),
        "no success heard for {left:?}"
    );
}

/// Twenty jobs, each completed by its handler in the transaction that writes its
/// business row: every row is there, every job succeeded, and the worker stored no
/// completion, failure or release of its own.
async fn handlers_complete_their_jobs_in_their_own_transactions(
    open: impl std::future::Future<Output = Option<Arc<dyn Transactional>>>,
) {
    let Some(db) = open.await else {
        return;
    };
    let plain = db.store();
    let watch = Arc::new(Watch::new(plain.backend().clone()));
    let watched = Store::from(watch.clone() as Arc<dyn Backend>);
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(
            plain
                .enqueue(NewJob::new("receipts"))
                .await
                .expect("enqueue")
                .id,
        );
    }
    let handler_db = Arc::clone(&db);
    let (succeeded, mut events) = mpsc::unbounded_channel();
    let running = worker(watched)
        .concurrency(4)
        .on_event(move |event: &JobEvent| {
            if matches!(event.outcome(), JobOutcome::Succeeded) {
                let _ = succeeded.send(event.id());
            }
        })
        .handler("receipts", move |ctx: JobContext, _payload: durq::Bytes| {
            let db = Arc::clone(&handler_db);
            async move {
                let (id, token) = (ctx.id(), ctx.lease_token());
                // Where the store's pool lives (see `JobContext::on_store_runtime`).
                let receipt = ctx
                    .on_store_runtime(async move {
                        db.write_and_complete(unique_row(), id, token).await
                    })
                    .await??;
                Ok(receipt)
            }
        })
        .build()
        .expect("worker")
        .spawn();
    succeeded_events(&mut events, &ids).await;
    running.shutdown().await;
    assert_eq!(db.rows().await, 20, "a business row is missing");
    assert_eq!(
        watch.recorded(),
        (0, 0, 0),
        "the worker recorded an outcome (completions, failures, releases) the handlers had stored"
    );
    for id in &ids {
        let job = plain.get(*id).await.expect("get");
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.attempts, 1, "job {id} ran twice");
        assert!(job.lease.is_none());
    }
    db.teardown().await;
}

/// A business row id no two handlers share.
fn unique_row() -> i64 {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    i64::try_from(NEXT.fetch_add(1, Ordering::SeqCst)).unwrap_or(i64::MAX)
}

/// The handler's lease is taken over while it runs (expired, reclaimed, claimed by
/// another worker) without the worker hearing of it. Its fenced completion is refused:
/// its business row is not written, the worker records nothing for the attempt, and
/// the new holder completes the job.
async fn a_handler_whose_lease_was_taken_over_writes_nothing(
    open: impl std::future::Future<Output = Option<Arc<dyn Transactional>>>,
    clock: ManualClock,
) {
    let Some(db) = open.await else {
        return;
    };
    let plain = db.store();
    let watch = Arc::new(Watch::new(plain.backend().clone()));
    watch.hold_heartbeats.store(true, Ordering::SeqCst);
    let watched = Store::from(watch.clone() as Arc<dyn Backend>);
    let id = plain
        .enqueue(NewJob::new("receipts"))
        .await
        .expect("enqueue")
        .id;

    let (started_tx, mut started) = mpsc::unbounded_channel::<LeaseToken>();
    let (go_tx, go) = mpsc::unbounded_channel::<()>();
    let go = Arc::new(tokio::sync::Mutex::new(go));
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<Result<FencedCompletion>>();
    let handler_db = Arc::clone(&db);
    let running = worker(watched)
        .concurrency(1)
        .handler("receipts", move |ctx: JobContext, _payload: durq::Bytes| {
            let (db, started_tx, go, ended_tx) = (
                Arc::clone(&handler_db),
                started_tx.clone(),
                Arc::clone(&go),
                ended_tx.clone(),
            );
            async move {
                let _ = started_tx.send(ctx.lease_token());
                let _ = go.lock().await.recv().await;
                let (id, token) = (ctx.id(), ctx.lease_token());
                let answer = ctx
                    .on_store_runtime(async move { db.write_and_complete(1, id, token).await })
                    .await?;
                let _ = ended_tx.send(answer.clone());
                Ok(answer?)
            }
        })
        .build()
        .expect("worker")
        .spawn();

    let old_token = tokio::time::timeout(PATIENCE, started.recv())
        .await
        .expect("the handler starts")
        .expect("a token");
    clock.advance(LEASE + Duration::from_secs(1));
    let reclaimed = plain.reclaim(10).await.expect("reclaim");
    assert_eq!(reclaimed.len(), 1);
    let thief = plain
        .claim(ClaimRequest::new(["receipts"], "thief", LEASE))
        .await
        .expect("claim")
        .remove(0);
    assert!(thief.token() > old_token);

    go_tx.send(()).expect("the handler waits");
    let answer = tokio::time::timeout(PATIENCE, ended.recv())
        .await
        .expect("the handler ends")
        .expect("an answer");
    assert!(
        matches!(answer, Err(Error::LeaseLost { .. })),
        "the stale completion was not refused: {answer:?}"
    );
    running.shutdown().await;
    watch.released.notify_waiters();
    assert_eq!(
        db.rows().await,
        0,
        "the stale handler's business row was written"
    );
    assert_eq!(
        watch.recorded(),
        (0, 0, 0),
        "the worker recorded an outcome (completions, failures, releases) for a lease it lost"
    );
    let job = plain.get(id).await.expect("get");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.lease.as_ref().map(|l| l.worker.as_str()), Some("thief"));
    plain
        .complete(thief.id(), thief.token(), None)
        .await
        .expect("the new holder completes");
    db.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_handlers_complete_their_jobs_in_their_own_transactions() {
    let clock = ManualClock::default();
    handlers_complete_their_jobs_in_their_own_transactions(Sqlite::open(settings(&clock))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_handlers_complete_their_jobs_in_their_own_transactions() {
    let clock = ManualClock::default();
    handlers_complete_their_jobs_in_their_own_transactions(Postgres::open(settings(&clock))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_handler_whose_lease_was_taken_over_writes_nothing() {
    let clock = ManualClock::default();
    a_handler_whose_lease_was_taken_over_writes_nothing(Sqlite::open(settings(&clock)), clock)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_handler_whose_lease_was_taken_over_writes_nothing() {
    let clock = ManualClock::default();
    a_handler_whose_lease_was_taken_over_writes_nothing(Postgres::open(settings(&clock)), clock)
        .await;
}
