//! `durq-bench-peers`: the enqueue and end-to-end workloads of `durq-bench`, run on
//! apalis 1.0 (apalis-redis, apalis-sqlite, apalis-postgres) so `cargo xtask bench` can
//! report our figures as ratios to theirs. Same command line, same JSON result lines.
//!
//! ```text
//! durq-bench-peers <info|enqueue-one|enqueue-batch|e2e-backlog|e2e-producer>
//!     --backend <redis|sqlite|postgres> [--jobs N] [--concurrency C] [--enqueue-batch B]
//!     [--producers P] [--stall-secs S]
//! ```
//!
//! How apalis is driven, and why:
//! - one `WorkerBuilder` worker per run with `.concurrency(C)` (tower's concurrency
//!   limit) and the backend's `batch_size` set to `C`, so it fetches as many jobs per
//!   round trip as it may run at once (the default, 10, is slower);
//! - `poll_with_interval(10 ms)`: with no poll strategy an apalis 1.0 worker whose fetch
//!   came back empty sleeps until its next heartbeat (30 s); 10 ms is more eager than any
//!   of apalis's examples (500 ms – 5 s) and only matters while the queue is empty;
//! - everything else at its default (task locks and result persistence on, as shipped);
//! - the handler takes the `u64` job number and does nothing else, like ours;
//! - a run ends when the handler has seen `N` jobs and stops the worker; `run()` returns
//!   after the worker flushed its acknowledgements. The clock runs from the first
//!   handler start to that return, and the backend is then checked to hold `N` done jobs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use serde_json::{Map, Value};

const WORKLOADS: &[&str] = &[
    "info",
    "enqueue-one",
    "enqueue-batch",
    "e2e-backlog",
    "e2e-producer",
];

/// How long an idle apalis worker waits before fetching again.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
struct Options {
    backend: String,
    jobs: u64,
    concurrency: usize,
    enqueue_batch: usize,
    producers: usize,
    stall: Duration,
}

fn usage() -> String {
    format!(
        "usage: durq-bench-peers <{}> --backend <redis|sqlite|postgres> [--jobs N] \
         [--concurrency C] [--enqueue-batch B] [--producers P] [--stall-secs S]",
        WORKLOADS.join("|")
    )
}

fn parse(args: &[String]) -> Result<(String, Options), String> {
    let workload = args.first().cloned().ok_or_else(usage)?;
    if !WORKLOADS.contains(&workload.as_str()) {
        return Err(format!("unknown workload {workload:?}\n{}", usage()));
    }
    let mut opts = Options {
        backend: String::new(),
        jobs: 20_000,
        concurrency: 32,
        enqueue_batch: 1_000,
        producers: 16,
        stall: Duration::from_secs(60),
    };
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))?;
        let number = || -> Result<u64, String> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} wants a positive integer, not {value:?}"))
        };
        match flag.as_str() {
            "--backend" => opts.backend = value.clone(),
            "--jobs" => opts.jobs = number()?,
            "--concurrency" => opts.concurrency = number()? as usize,
            "--enqueue-batch" => opts.enqueue_batch = number()? as usize,
            "--producers" => opts.producers = number()? as usize,
            "--stall-secs" => opts.stall = Duration::from_secs(number()?),
            // Accepted so xtask can pass one argument list to both binaries.
            "--claim-batch" | "--rate" | "--driver" | "--deadline-secs" => {}
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if !["redis", "sqlite", "postgres"].contains(&opts.backend.as_str()) {
        return Err(format!(
            "--backend must be redis, sqlite or postgres\n{}",
            usage()
        ));
    }
    Ok((workload, opts))
}

// ---------------------------------------------------------------------------------------
// Result lines

#[derive(Default)]
struct Line(Map<String, Value>);

impl Line {
    fn new(workload: &str, backend: &str) -> Self {
        Line::default()
            .text("impl", "apalis")
            .text("workload", workload)
            .text("backend", backend)
    }
    fn text(mut self, key: &str, value: impl Into<String>) -> Self {
        self.0.insert(key.to_owned(), Value::String(value.into()));
        self
    }
    fn num(mut self, key: &str, value: f64) -> Self {
        let number = serde_json::Number::from_f64(value).unwrap_or_else(|| 0.into());
        self.0.insert(key.to_owned(), Value::Number(number));
        self
    }
    fn int(mut self, key: &str, value: u64) -> Self {
        self.0.insert(key.to_owned(), Value::from(value));
        self
    }
    fn emit(self) {
        println!("{}", Value::Object(self.0));
    }
}

fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        0.0
    } else {
        count as f64 / secs
    }
}

// ---------------------------------------------------------------------------------------
// Backends: a fresh queue (Redis), file (SQLite) or database (PostgreSQL) per run

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn postgres_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let root = match base.rfind('/') {
        Some(slash) if slash > "postgres://".len() => &base[..slash],
        _ => base,
    };
    match query {
        Some(query) => format!("{root}/{database}?{query}"),
        None => format!("{root}/{database}"),
    }
}

struct RedisPeer {
    conn: apalis_redis::ConnectionManager,
    queue: String,
    batch: usize,
}

impl RedisPeer {
    fn storage(&self) -> apalis_redis::RedisStorage<u64> {
        let config = apalis_redis::Config::default()
            .queue(&self.queue)
            .batch_size(self.batch);
        apalis_redis::RedisStorage::new(self.conn.clone()).with_config(config)
    }
}

struct SqlitePeer {
    pool: apalis_sqlite::SqlitePool,
    queue: String,
    batch: usize,
    _dir: TempDir,
}

impl SqlitePeer {
    fn storage(&self) -> apalis_sqlite::SqliteStorage<u64> {
        let config = apalis_sqlite::Config::default()
            .queue(&self.queue)
            .batch_size(self.batch);
        apalis_sqlite::SqliteStorage::new(&self.pool).with_config(config)
    }
}

struct PostgresPeer {
    pool: apalis_postgres::PgPool,
    queue: String,
    batch: usize,
    database: String,
}

impl PostgresPeer {
    fn storage(&self) -> apalis_postgres::PostgresStorage<u64> {
        let config = apalis_postgres::Config::default()
            .queue(&self.queue)
            .batch_size(self.batch);
        apalis_postgres::PostgresStorage::new(&self.pool).with_config(config)
    }
}

enum Peer {
    Redis(RedisPeer),
    Sqlite(SqlitePeer),
    Postgres(PostgresPeer),
}

/// A directory removed on drop (std only: the peers crate keeps its dependencies few).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn open(opts: &Options) -> Result<Peer, String> {
    // Redis key prefixes and pubsub channels of apalis split on ':', so no ':' here.
    let queue = unique("benchpeer");
    let batch = opts.concurrency;
    match opts.backend.as_str() {
        "redis" => {
            let conn = apalis_redis::connect(redis_url())
                .await
                .map_err(|e| format!("redis connect: {e}"))?;
            Ok(Peer::Redis(RedisPeer { conn, queue, batch }))
        }
        "sqlite" => {
            let dir = std::env::temp_dir().join(unique("durq-bench-peer"));
            std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
            let dir = TempDir(dir);
            let path = dir.0.join("apalis.sqlite3");
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let pool = apalis_sqlite::SqlitePool::connect(&url)
                .await
                .map_err(|e| format!("sqlite connect: {e}"))?;
            apalis_sqlite::SqliteStorage::setup(&pool)
                .await
                .map_err(|e| format!("sqlite setup: {e}"))?;
            Ok(Peer::Sqlite(SqlitePeer {
                pool,
                queue,
                batch,
                _dir: dir,
            }))
        }
        "postgres" => {
            // apalis keeps its tables in a fixed `apalis` schema: a database per run keeps
            // runs apart and leaves nothing behind in the shared test database.
            let admin = postgres_url();
            let database = unique("jobs_bench_peer");
            let admin_pool = sqlx_connect_admin(&admin).await?;
            let created = sqlx_execute(&admin_pool, &format!("CREATE DATABASE {database}")).await;
            admin_pool.close().await;
            created?;
            let pool = apalis_postgres::PgPool::connect(&with_database(&admin, &database))
                .await
                .map_err(|e| format!("postgres connect: {e}"))?;
            apalis_postgres::PostgresStorage::setup(&pool)
                .await
                .map_err(|e| format!("postgres setup: {e}"))?;
            Ok(Peer::Postgres(PostgresPeer {
                pool,
                queue,
                batch,
                database,
            }))
        }
        other => Err(format!("unknown backend {other:?}")),
    }
}

async fn sqlx_connect_admin(url: &str) -> Result<apalis_postgres::PgPool, String> {
    apalis_postgres::PgPool::connect(url)
        .await
        .map_err(|e| format!("postgres connect: {e}"))
}

async fn sqlx_execute(pool: &apalis_postgres::PgPool, sql: &str) -> Result<(), String> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| format!("{sql}: {e}"))
}

impl Peer {
    /// How many of the run's jobs the backend holds as done.
    async fn done_count(&self) -> Result<u64, String> {
        match self {
            Peer::Redis(p) => {
                let mut conn = p.conn.clone();
                let count: u64 = redis::cmd("SCARD")
                    .arg(format!("{}:done", p.queue))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("SCARD: {e}"))?;
                Ok(count)
            }
            Peer::Sqlite(p) => {
                let count: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM Jobs WHERE job_type = ?1 AND status = 'Done'",
                )
                .bind(&p.queue)
                .fetch_one(&p.pool)
                .await
                .map_err(|e| format!("count: {e}"))?;
                Ok(count as u64)
            }
            Peer::Postgres(p) => {
                let count: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'",
                )
                .bind(&p.queue)
                .fetch_one(&p.pool)
                .await
                .map_err(|e| format!("count: {e}"))?;
                Ok(count as u64)
            }
        }
    }

    /// Removes everything the run created: its Redis keys, its file, its database.
    async fn cleanup(self) -> Result<(), String> {
        match self {
            Peer::Redis(p) => {
                let mut conn = p.conn.clone();
                let pattern = format!("{}:*", p.queue);
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1_000)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| format!("SCAN: {e}"))?;
                    if !keys.is_empty() {
                        redis::cmd("UNLINK")
                            .arg(&keys)
                            .query_async::<u64>(&mut conn)
                            .await
                            .map_err(|e| format!("UNLINK: {e}"))?;
                    }
                    if next == 0 {
                        return Ok(());
                    }
                    cursor = next;
                }
            }
            Peer::Sqlite(p) => {
                p.pool.close().await;
                Ok(())
            }
            Peer::Postgres(p) => {
                p.pool.close().await;
                let admin = sqlx_connect_admin(&postgres_url()).await?;
                let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", p.database);
                let dropped = sqlx_execute(&admin, &drop).await;
                admin.close().await;
                dropped
            }
        }
    }
}

/// Runs `$body` with `$s` bound to a new storage handle of the peer's concrete type.
macro_rules! with_storage {
    ($peer:expr, $s:ident => $body:expr) => {
        match $peer {
            Peer::Redis(p) => {
                #[allow(unused_mut)]
                let mut $s = p.storage();
                $body
            }
            Peer::Sqlite(p) => {
                #[allow(unused_mut)]
                let mut $s = p.storage();
                $body
            }
            Peer::Postgres(p) => {
                #[allow(unused_mut)]
                let mut $s = p.storage();
                $body
            }
        }
    };
}

// ---------------------------------------------------------------------------------------
// Workloads

/// Pushes jobs `range` in `push_bulk` calls of `batch`.
macro_rules! fill {
    ($storage:expr, $range:expr, $batch:expr) => {{
        let range: std::ops::Range<u64> = $range;
        let mut next = range.start;
        let mut outcome: Result<(), String> = Ok(());
        while next < range.end {
            let end = (next + $batch as u64).min(range.end);
            if let Err(e) = $storage.push_bulk((next..end).collect::<Vec<u64>>()).await {
                outcome = Err(format!("push_bulk: {e}"));
                break;
            }
            next = end;
        }
        outcome
    }};
}

async fn enqueue_one(peer: &Peer, opts: &Options) -> Result<(), String> {
    let per_producer = opts.jobs.div_ceil(opts.producers as u64);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..opts.producers as u64 {
        let range = (p * per_producer)..((p + 1) * per_producer).min(opts.jobs);
        with_storage!(peer, storage => {
            tasks.spawn(async move {
                for i in range {
                    storage.push(i).await.map_err(|e| format!("push: {e}"))?;
                }
                Ok::<(), String>(())
            });
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("producer: {e}"))??;
    }
    let elapsed = started.elapsed();
    Line::new("enqueue-one", &opts.backend)
        .int("jobs", opts.jobs)
        .int("producers", opts.producers as u64)
        .num("value", rate(opts.jobs, elapsed))
        .text("unit", "jobs/s")
        .num("seconds", elapsed.as_secs_f64())
        .emit();
    Ok(())
}

async fn enqueue_batch(peer: &Peer, opts: &Options) -> Result<(), String> {
    let started = Instant::now();
    with_storage!(peer, storage => fill!(storage, 0..opts.jobs, opts.enqueue_batch))?;
    let elapsed = started.elapsed();
    Line::new("enqueue-batch", &opts.backend)
        .int("jobs", opts.jobs)
        .int("batch", opts.enqueue_batch as u64)
        .num("value", rate(opts.jobs, elapsed))
        .text("unit", "jobs/s")
        .num("seconds", elapsed.as_secs_f64())
        .emit();
    Ok(())
}

/// What the handler records.
#[derive(Debug, Default)]
struct Counter {
    target: u64,
    seen: AtomicU64,
    first_start: OnceLock<Instant>,
    stop_error: Mutex<Option<String>>,
}

async fn handler(
    _job: u64,
    counter: Data<Arc<Counter>>,
    worker: WorkerContext,
) -> Result<(), BoxDynError> {
    let _ = counter.first_start.set(Instant::now());
    let seen = counter.seen.fetch_add(1, Ordering::AcqRel) + 1;
    if seen == counter.target {
        if let Err(e) = worker.stop() {
            *counter.stop_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }
    }
    Ok(())
}

/// Runs a worker over `$storage` until it has handled `$counter.target` jobs, failing
/// when no job is handled for `$stall`. Evaluates to `Result<Instant, String>`: when
/// `run()` returned.
macro_rules! drain {
    ($storage:expr, $opts:expr, $counter:expr) => {{
        let worker = WorkerBuilder::new(unique("benchpeer-worker"))
            .backend($storage.poll_with_interval(POLL_INTERVAL))
            .concurrency($opts.concurrency)
            .data(Arc::clone(&$counter))
            .build(handler);
        let mut running = tokio::spawn(worker.run());
        let mut last_seen = 0;
        let mut last_change = Instant::now();
        loop {
            tokio::select! {
                finished = &mut running => {
                    let ended = Instant::now();
                    break match finished {
                        Ok(Ok(())) => Ok(ended),
                        Ok(Err(e)) => Err(format!("worker: {e}")),
                        Err(e) => Err(format!("worker task: {e}")),
                    };
                }
                () = tokio::time::sleep_until(tokio::time::Instant::now() + Duration::from_millis(250)) => {
                    let seen = $counter.seen.load(Ordering::Acquire);
                    if seen != last_seen {
                        last_seen = seen;
                        last_change = Instant::now();
                    } else if last_change.elapsed() >= $opts.stall {
                        running.abort();
                        break Err(format!(
                            "stalled: {seen} of {} jobs handled, none for {:?}",
                            $counter.target, $opts.stall
                        ));
                    }
                }
            }
        }
    }};
}

async fn e2e(peer: &Peer, opts: &Options, producer_alongside: bool) -> Result<(), String> {
    let workload = if producer_alongside {
        "e2e-producer"
    } else {
        "e2e-backlog"
    };
    let counter = Arc::new(Counter {
        target: opts.jobs,
        ..Counter::default()
    });
    let mut fill_seconds = 0.0;
    let housekeeping = Housekeeping::start(peer).await?;
    if !producer_alongside {
        let started = Instant::now();
        with_storage!(peer, storage => fill!(storage, 0..opts.jobs, opts.enqueue_batch))?;
        fill_seconds = started.elapsed().as_secs_f64();
        housekeeping.after_fill().await?;
    }
    let _vacuum = housekeeping.while_draining();
    let producer = if producer_alongside {
        let (jobs, batch) = (opts.jobs, opts.enqueue_batch);
        let handle = with_storage!(peer, storage => tokio::spawn(async move {
            let started = Instant::now();
            fill!(storage, 0..jobs, batch)?;
            Ok::<Duration, String>(started.elapsed())
        }));
        Some(handle)
    } else {
        None
    };
    let ended = with_storage!(peer, storage => drain!(storage, opts, counter));
    let produced = match producer {
        Some(handle) => Some(handle.await.map_err(|e| format!("producer: {e}"))??),
        None => None,
    };
    let ended = ended?;
    if let Some(err) = counter
        .stop_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        return Err(format!("stopping the worker: {err}"));
    }
    let first = *counter.first_start.get().ok_or("no job ran")?;
    let span = ended.saturating_duration_since(first);
    let done = peer.done_count().await?;
    if done != opts.jobs {
        return Err(format!("{done} of {} jobs stored as done", opts.jobs));
    }
    let mut line = Line::new(workload, &opts.backend)
        .int("jobs", opts.jobs)
        .int("concurrency", opts.concurrency as u64)
        .text("driver", "apalis-worker")
        .num("value", rate(opts.jobs, span))
        .text("unit", "jobs/s")
        .num("seconds", span.as_secs_f64());
    line = match produced {
        Some(time) => line
            .int("batch", opts.enqueue_batch as u64)
            .num("produce_rate", rate(opts.jobs, time)),
        None => line.num("fill_seconds", fill_seconds),
    };
    line.emit();
    Ok(())
}

/// The stand-in for autovacuum that durq-bench runs on its own PostgreSQL runs where
/// the server has autovacuum off (see `bench/src/housekeeping.rs`), run the same way on
/// apalis' table, so both queues drain on equal terms.
struct Housekeeping(Option<apalis_postgres::PgPool>);

impl Housekeeping {
    const TABLE: &'static str = "apalis.jobs";
    const VACUUM_EVERY: Duration = Duration::from_secs(5);

    async fn start(peer: &Peer) -> Result<Self, String> {
        let Peer::Postgres(p) = peer else {
            return Ok(Housekeeping(None));
        };
        let autovacuum: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
            .fetch_one(&p.pool)
            .await
            .map_err(|e| format!("SHOW autovacuum: {e}"))?;
        Ok(Housekeeping((autovacuum != "on").then(|| p.pool.clone())))
    }

    async fn after_fill(&self) -> Result<(), String> {
        match &self.0 {
            Some(pool) => sqlx_execute(pool, &format!("ANALYZE {}", Self::TABLE)).await,
            None => Ok(()),
        }
    }

    fn while_draining(&self) -> Option<AbortOnDrop> {
        let pool = self.0.clone()?;
        Some(AbortOnDrop(tokio::spawn(async move {
            let sql = format!("VACUUM (ANALYZE) {}", Self::TABLE);
            let mut ticker = tokio::time::interval(Self::VACUUM_EVERY);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                if let Err(err) = sqlx_execute(&pool, &sql).await {
                    eprintln!("housekeeping: {err}");
                }
            }
        })))
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn info(opts: &Options) -> Result<(), String> {
    let server = match opts.backend.as_str() {
        "redis" => {
            let mut conn = apalis_redis::connect(redis_url())
                .await
                .map_err(|e| format!("redis connect: {e}"))?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("INFO: {e}"))?;
            info.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| format!("Redis {}", v.trim()))
                .unwrap_or_else(|| "Redis (version unknown)".to_owned())
        }
        "sqlite" => {
            let pool = apalis_sqlite::SqlitePool::connect("sqlite::memory:")
                .await
                .map_err(|e| format!("sqlite: {e}"))?;
            let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("sqlite_version: {e}"))?;
            format!("SQLite {version} (libsqlite3-sys bundled by sqlx)")
        }
        _ => {
            let pool = sqlx_connect_admin(&postgres_url()).await?;
            let version: String = sqlx::query_scalar("SHOW server_version")
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("server_version: {e}"))?;
            format!("PostgreSQL {version}")
        }
    };
    Line::new("info", &opts.backend)
        .text("server", server)
        .text("version", "apalis 1.0.0")
        .emit();
    Ok(())
}

async fn run(workload: &str, opts: &Options) -> Result<(), String> {
    if workload == "info" {
        return info(opts).await;
    }
    let peer = open(opts).await?;
    let outcome = match workload {
        "enqueue-one" => enqueue_one(&peer, opts).await,
        "enqueue-batch" => enqueue_batch(&peer, opts).await,
        "e2e-backlog" => e2e(&peer, opts, false).await,
        "e2e-producer" => e2e(&peer, opts, true).await,
        other => Err(format!("unknown workload {other:?}")),
    };
    let cleaned = peer.cleanup().await;
    outcome?;
    cleaned
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (workload, opts) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("durq-bench-peers: {message}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("durq-bench-peers: cannot start tokio: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&workload, &opts)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            Line::new(&workload, &opts.backend)
                .int("jobs", opts.jobs)
                .text("error", message.clone())
                .emit();
            eprintln!(
                "durq-bench-peers: {workload} on {}: {message}",
                opts.backend
            );
            std::process::ExitCode::FAILURE
        }
    }
}
