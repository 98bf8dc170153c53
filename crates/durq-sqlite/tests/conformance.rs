//! The shared conformance suite against SQLite: every test of this binary shares one
//! file, so namespaces are tested side by side in it (CONTRACT C8), and each `open` is
//! a new store over that file (a reopen, CONTRACT A6). Each scenario's namespaces are
//! emptied after it, so the file holds no job once the suite is done.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use durq_core::{async_trait, Error, JobId, Result, Store, StoreSettings};
use durq_sqlite::{SqliteBackend, SqliteConfig};

struct SqliteHarness {
    path: PathBuf,
}

/// One file per test process, in the target directory. Files of test processes that
/// are gone are removed first, so runs do not pile them up.
fn shared_file() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sqlite-conformance");
        let _ = std::fs::create_dir_all(&dir);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let pid = name.split('.').next().unwrap_or_default();
                if !pid.is_empty() && !PathBuf::from(format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        dir.join(format!("{}.db", std::process::id()))
    })
    .clone()
}

/// The configuration a new user gets, so the suite checks what they run (the per-group
/// choice of `synchronous` included).
fn config() -> SqliteConfig {
    SqliteConfig::default()
}

impl SqliteHarness {
    /// A backend on `namespace` with the default settings, for the harness's own work.
    async fn backend(&self, namespace: &str) -> Result<SqliteBackend> {
        let settings = StoreSettings::default().namespace(namespace);
        config().open(&self.path, settings).await
    }
}

#[async_trait]
impl durq_conformance::Harness for SqliteHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let backend = config().open(&self.path, settings).await?;
        Ok(Store::new(backend))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.backend(namespace).await?.vanish(id).await
    }

    /// Tags that are not JSON: a value SQLite stores but the store cannot read.
    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        let (path, namespace) = (self.path.clone(), namespace.to_owned());
        let changed = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(Duration::from_secs(10))?;
            conn.execute(
                "UPDATE jobq_jobs SET tags = '{' WHERE id = ?1
                 AND ns = (SELECT id FROM jobq_namespaces WHERE name = ?2)",
                rusqlite::params![id.to_bytes(), namespace],
            )
        })
        .await
        .map_err(|err| Error::backend("corrupt a record", err))?
        .map_err(|err| Error::backend("corrupt a record", err))?;
        Ok(changed == 1)
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.backend(namespace).await?.drop_namespace().await?;
        Ok(())
    }
}

async fn harness() -> Option<SqliteHarness> {
    Some(SqliteHarness {
        path: shared_file(),
    })
}

durq_conformance::conformance_tests!(harness);
