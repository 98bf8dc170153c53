//! Opening a fresh store per run on each backend, and cleaning up after it.
//!
//! Every run gets its own namespace (Redis, PostgreSQL) or its own file (SQLite), so runs
//! never see each other's jobs, and removes exactly what it created: never `FLUSHALL`,
//! never another namespace's rows, because other tests may share the servers.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jobs_core::{Store, StoreSettings, SystemClock};

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
    pub store: Arc<dyn Store>,
    /// The namespace it writes to.
    pub namespace: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Nothing,
    #[cfg(feature = "sqlite")]
    Dir(tempfile::TempDir),
    #[cfg(feature = "redis")]
    Redis(redis::Client),
    #[cfg(feature = "postgres")]
    Postgres(String),
}

impl Opened {
    /// Removes the run's data: its SQLite file, its Redis keys, its PostgreSQL rows.
    pub async fn cleanup(self) -> Result<(), String> {
        let Opened {
            store,
            namespace,
            cleanup,
        } = self;
        // Close the store's connections before removing what they point at.
        drop(store);
        match cleanup {
            Cleanup::Nothing => {
                let _ = namespace;
                Ok(())
            }
            #[cfg(feature = "sqlite")]
            Cleanup::Dir(dir) => dir.close().map_err(|e| format!("remove sqlite dir: {e}")),
            #[cfg(feature = "redis")]
            Cleanup::Redis(client) => redis_cleanup(&client, &namespace).await,
            #[cfg(feature = "postgres")]
            Cleanup::Postgres(url) => postgres_cleanup(&url, &namespace).await,
        }
    }
}

/// The Redis server to use: `REDIS_URL`, or the local default.
#[cfg(feature = "redis")]
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
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
            let store = jobs_memory::MemoryStore::new(settings).map_err(|e| e.to_string())?;
            Ok(Opened {
                store: Arc::new(store),
                namespace,
                cleanup: Cleanup::Nothing,
            })
        }
        other => Err(format!(
            "backend {other:?} is not built into this binary (built: {})",
            compiled().join(", ")
        )),
    }
}

/// A description of the server behind `backend`, for the report.
pub async fn server_version(backend: &str) -> Result<String, String> {
    match backend {
        "memory" => Ok("in process".to_owned()),
        other => Err(format!("no server version for {other:?}")),
    }
}
