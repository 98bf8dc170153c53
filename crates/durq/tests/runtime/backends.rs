use super::*;

/// In-process: nothing outlives the test's server.
struct Memory(durq_memory::MemoryServer);

#[async_trait]
impl Server for Memory {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(self.0.open(settings).expect("open a memory store"))
    }

    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        self.0.drop_namespace(namespace);
        Ok(())
    }
}

pub(crate) async fn memory() -> Option<Arc<dyn Server>> {
    Some(Arc::new(Memory(durq_memory::MemoryServer::new())))
}

runtime_tests!(memory, memory());

/// A fresh file per test, in its own temporary directory, with the default
/// configuration, as the quickstart uses it. The directory goes with the server.
struct Sqlite(tempfile::TempDir);

#[async_trait]
impl Server for Sqlite {
    async fn open(&self, settings: StoreSettings) -> Store {
        let path = self.0.path().join("jobs.db");
        Store::new(
            durq_sqlite::SqliteBackend::open(path, settings)
                .await
                .expect("open an sqlite store"),
        )
    }

    async fn teardown(&self, _namespace: &str) -> Result<(), String> {
        Ok(())
    }
}

async fn sqlite() -> Option<Arc<dyn Server>> {
    Some(Arc::new(Sqlite(tempfile::tempdir().expect("a temp dir"))))
}

runtime_tests!(sqlite, sqlite());

#[cfg(feature = "redis")]
struct Redis(String);

#[cfg(feature = "redis")]
#[async_trait]
impl Server for Redis {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(
            durq::backends::redis::RedisBackend::connect(&self.0, settings)
                .await
                .expect("connect to redis"),
        )
    }

    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        common::drop_redis_namespace(&self.0, namespace).await
    }
}

#[cfg(feature = "redis")]
/// `REDIS_URL`, default `redis://127.0.0.1:6379`; skipped loudly when unreachable.
async fn redis() -> Option<Arc<dyn Server>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Connecting writes no key, so the probe leaves nothing to remove.
    let probe = StoreSettings::default().namespace(unique_namespace());
    match durq::backends::redis::RedisBackend::connect(&url, probe).await {
        Ok(_) => Some(Arc::new(Redis(url))),
        Err(err) => skip_or_fail("Redis", &url, &err),
    }
}

#[cfg(feature = "redis")]
runtime_tests!(redis, redis());

#[cfg(feature = "postgres")]
/// One small pool per test, shared by the test's stores.
struct Postgres(durq::backends::postgres::PostgresPool);

#[cfg(feature = "postgres")]
#[async_trait]
impl Server for Postgres {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(self.0.backend(settings).expect("a postgres store"))
    }

    /// The namespace's rows in the shared schema; the schema stays.
    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        self.0
            .drop_namespace(namespace)
            .await
            .map(drop)
            .map_err(|err| format!("could not remove PostgreSQL namespace {namespace}: {err}"))
    }
}

#[cfg(feature = "postgres")]
/// `DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`; skipped loudly
/// when unreachable.
async fn postgres() -> Option<Arc<dyn Server>> {
    use durq::backends::postgres::{PostgresConfig, PostgresPool};
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let config = PostgresConfig::new(&url)
        .expect("DATABASE_URL is a postgres URL")
        .max_connections(4)
        .application_name("jobs-runtime-tests");
    match PostgresPool::connect(config).await {
        Ok(backend) => Some(Arc::new(Postgres(backend))),
        Err(err) => skip_or_fail("PostgreSQL", &url, &err),
    }
}

#[cfg(feature = "postgres")]
runtime_tests!(postgres, postgres());
