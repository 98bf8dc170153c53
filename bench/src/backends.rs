//! Opening a fresh store per run on each backend, and cleaning up after it.
//!
//! Every run gets its own namespace (Redis, PostgreSQL) or its own file (SQLite), so runs
//! never see each other's jobs, and removes exactly what it created: never `FLUSHALL`,
//! never another namespace's rows, because other tests may share the servers.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use durq_core::{Store, StoreSettings, SystemClock};

use crate::housekeeping::Housekeeping;

/// The backends this binary was built with, in the order `--backend all` runs them.
pub fn compiled() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "memory") {
        names.push("memory");
    }
    if cfg!(feature = "sqlite") {
        names.push("sqlite");
    }
    if cfg!(feature = "redis") {
        names.push("redis");
    }
    if cfg!(feature = "postgres") {
        names.push("postgres");
    }
    names
}

/// A namespace no earlier run used: `bench-<pid>-<nanoseconds>`.
pub fn fresh_namespace() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("bench-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Settings of a benchmark store: the system clock (the benchmark measures real time)
/// and a fresh namespace.
pub fn settings(namespace: &str) -> StoreSettings {
    StoreSettings::default()
        .namespace(namespace)
        .clock(Arc::new(SystemClock))
}

/// A store opened for one run, and what to remove when the run ends.
pub struct Opened {
    /// The store every task of the run shares, as one process would.
    pub store: Store,
    /// The namespace it writes to.
    pub namespace: String,
    /// What the server would do on its own in production, where it does not here.
    pub housekeeping: Housekeeping,
    /// The same store as its concrete type, for the workloads that write jobs inside
    /// the caller's own transaction (CONTRACT §7); `None` on backends without them.
    pub transactional: Option<Transactional>,
    cleanup: Cleanup,
}

/// A store whose backend takes jobs inside the caller's own database transaction.
pub enum Transactional {
    /// The SQLite store: its transactions run on a connection of the caller's own.
    #[cfg(feature = "sqlite")]
    Sqlite(durq_sqlite::SqliteBackend),
    /// The PostgreSQL store, and the run's schema, where the workload's own tables go.
    #[cfg(feature = "postgres")]
    Postgres {
        /// The store; its pool begins the transactions.
        store: durq_postgres::PostgresBackend,
        /// The run's schema (dropped whole with everything in it afterwards).
        schema: String,
    },
}

enum Cleanup {
    /// The memory backend's data goes with its store.
    #[cfg(feature = "memory")]
    Nothing,
    #[cfg(feature = "sqlite")]
    Dir(tempfile::TempDir),
    #[cfg(feature = "redis")]
    Redis(durq_redis::RedisBackend),
    #[cfg(feature = "postgres")]
    Postgres(String, String),
}

impl Opened {
    /// Removes the run's data: its SQLite file, its Redis keys, its PostgreSQL rows.
    pub async fn cleanup(self) -> Result<(), String> {
        let Opened {
            store,
            namespace,
            housekeeping,
            transactional,
            cleanup,
        } = self;
        housekeeping.close().await;
        // Close the store's connections (through both handles) before removing what
        // they point at.
        drop((store, transactional));
        // No clean-up needs the name: each removes what its own handle points at.
        let _ = namespace;
        match cleanup {
            #[cfg(feature = "memory")]
            Cleanup::Nothing => Ok(()),
            #[cfg(feature = "sqlite")]
            Cleanup::Dir(dir) => dir.close().map_err(|e| format!("remove sqlite dir: {e}")),
            #[cfg(feature = "redis")]
            Cleanup::Redis(redis) => match redis.drop_namespace().await {
                Ok(_) => Ok(()),
                Err(e) => Err(format!("redis cleanup: {e}")),
            },
            #[cfg(feature = "postgres")]
            Cleanup::Postgres(url, schema) => postgres_cleanup(&url, &schema).await,
        }
    }
}

/// The Redis server to use: `REDIS_URL`, or the local default. Its query (a
/// `partitions` parameter, say) is the store's; [`redis_nodes`] is where to read the
/// server's counters.
#[cfg(feature = "redis")]
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A Redis Cluster to use instead of one server: the node URLs of
/// `JOBS_REDIS_CLUSTER_URLS` (comma-separated), as `cargo xtask bench-cluster` sets it.
#[cfg(feature = "redis")]
pub fn redis_cluster_urls() -> Option<Vec<String>> {
    let urls: Vec<String> = std::env::var("JOBS_REDIS_CLUSTER_URLS")
        .ok()?
        .split(',')
        .map(|url| url.trim().to_owned())
        .filter(|url| !url.is_empty())
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// The servers whose counters a Redis run reads: the cluster's nodes, or the one server,
/// each without its query.
#[cfg(feature = "redis")]
pub fn redis_nodes() -> Vec<String> {
    let urls = redis_cluster_urls().unwrap_or_else(|| vec![redis_url()]);
    urls.into_iter()
        .map(|url| match url.split_once('?') {
            Some((base, _)) => base.to_owned(),
            None => url,
        })
        .collect()
}

/// The PostgreSQL database to use: `DATABASE_URL`, or the local default.
#[cfg(feature = "postgres")]
pub fn postgres_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Opens a store on `backend` with a fresh namespace.
pub async fn open(backend: &str) -> Result<Opened, String> {
    let namespace = fresh_namespace();
    let settings = settings(&namespace);
    match backend {
        #[cfg(feature = "memory")]
        "memory" => {
            let store = durq_memory::MemoryBackend::new(settings).map_err(|e| e.to_string())?;
            Ok(Opened {
                store: Store::new(store),
                namespace,
                housekeeping: Housekeeping::none(),
                transactional: None,
                cleanup: Cleanup::Nothing,
            })
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let dir = tempfile::Builder::new()
                .prefix("durq-bench-")
                .tempdir()
                .map_err(|e| format!("temp dir: {e}"))?;
            // The backend's default configuration, durability included (see
            // docs/sqlite.md): what a user who opens a file gets.
            let store = durq_sqlite::SqliteBackend::open(dir.path().join("jobs.sqlite3"), settings)
                .await
                .map_err(|e| format!("open sqlite: {e}"))?;
            Ok(Opened {
                store: Store::new(store.clone()),
                namespace,
                housekeeping: Housekeeping::none(),
                transactional: Some(Transactional::Sqlite(store)),
                cleanup: Cleanup::Dir(dir),
            })
        }
        #[cfg(feature = "redis")]
        "redis" => {
            let store = match redis_cluster_urls() {
                Some(urls) => durq_redis::RedisConfig::cluster(urls).open(settings).await,
                None => durq_redis::RedisBackend::connect(&redis_url(), settings).await,
            }
            .map_err(|e| format!("connect redis: {e}"))?;
            Ok(Opened {
                store: Store::new(store.clone()),
                namespace,
                housekeeping: Housekeeping::none(),
                transactional: None,
                cleanup: Cleanup::Redis(store),
            })
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            // A schema of its own: its tables are dropped whole afterwards, and no
            // other test's rows are ever touched.
            let url = postgres_url();
            let schema = namespace.replace(['-', '.', ':'], "_");
            let config = durq_postgres::PostgresConfig::new(&url)
                .and_then(|c| c.schema(schema.clone()))
                .map_err(|e| format!("postgres config: {e}"))?;
            let store = config
                .open(settings)
                .await
                .map_err(|e| format!("connect postgres: {e}"))?;
            let housekeeping = Housekeeping::postgres(&url, &schema).await?;
            Ok(Opened {
                store: Store::new(store.clone()),
                namespace,
                housekeeping,
                transactional: Some(Transactional::Postgres {
                    store,
                    schema: schema.clone(),
                }),
                cleanup: Cleanup::Postgres(url, schema),
            })
        }
        other => Err(format!(
            "backend {other:?} is not built into this binary (built: {})",
            compiled().join(", ")
        )),
    }
}

/// Drops the run's schema with everything in it.
#[cfg(feature = "postgres")]
async fn postgres_cleanup(url: &str, schema: &str) -> Result<(), String> {
    let pool = sqlx::PgPool::connect(url)
        .await
        .map_err(|e| format!("postgres cleanup connect: {e}"))?;
    let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let dropped = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .map(|_| ())
        .map_err(|e| format!("DROP SCHEMA {schema}: {e}"));
    pool.close().await;
    dropped
}

/// A description of the server behind `backend`, for the report.
pub async fn server_version(backend: &str) -> Result<String, String> {
    match backend {
        "memory" => Ok("in process".to_owned()),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(format!(
            "SQLite {} (bundled by rusqlite), durq-sqlite's default durability: {:?}",
            rusqlite::version(),
            durq_sqlite::SqliteConfig::default().synchronous
        )),
        #[cfg(feature = "redis")]
        "redis" => {
            let client =
                redis::Client::open(redis_url().as_str()).map_err(|e| format!("redis url: {e}"))?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("redis connect: {e}"))?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("INFO: {e}"))?;
            let version = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .unwrap_or("unknown")
                .trim()
                .to_owned();
            let persistence: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("INFO: {e}"))?;
            let aof = persistence
                .lines()
                .find_map(|l| l.strip_prefix("aof_enabled:"))
                .map(|v| if v.trim() == "1" { "AOF on" } else { "AOF off" })
                .unwrap_or("AOF unknown");
            Ok(format!("Redis {version} ({aof})"))
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            let pool = sqlx::PgPool::connect(&postgres_url())
                .await
                .map_err(|e| format!("postgres connect: {e}"))?;
            let version: String = sqlx::query_scalar("SHOW server_version")
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("server_version: {e}"))?;
            let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("synchronous_commit: {e}"))?;
            let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
                .fetch_one(&pool)
                .await
                .map_err(|e| format!("autovacuum: {e}"))?;
            pool.close().await;
            let vacuum = if autovacuum == "on" {
                "autovacuum = on"
            } else {
                "autovacuum = off, so the bench stands in for it: ANALYZE after each fill, \
                 VACUUM (ANALYZE) every 5 s while workers run"
            };
            Ok(format!(
                "PostgreSQL {version} (synchronous_commit = {sync}; {vacuum}); durq-postgres's \
                 default durability: {:?}",
                durq_postgres::Durability::default()
            ))
        }
        other => Err(format!("no server version for {other:?}")),
    }
}
