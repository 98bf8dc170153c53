//! The conformance suite against PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).
//!
//! Each test gets its own small pool (its runtime owns the sockets); a process-wide
//! semaphore caps how many tests hold one at once, so any number of test threads
//! stays well inside the server's `max_connections`. Every namespace a scenario
//! opens lives in the rows of the shared default schema; `teardown` deletes them.

use durq_conformance::Harness;
use durq_core::{async_trait, Error, JobId, Result, Store, StoreSettings};
use durq_postgres::{PostgresConfig, PostgresPool};
use tokio::sync::{Semaphore, SemaphorePermit};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Tests holding a pool at once: 12 × (4 + 1 listener) connections at most.
static POOLS: Semaphore = Semaphore::const_new(12);

struct PgHarness {
    backend: PostgresPool,
    _permit: SemaphorePermit<'static>,
}

#[async_trait]
impl Harness for PgHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        Ok(Store::new(self.backend.backend(settings)?))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.backend.vanish(namespace, id).await
    }

    /// Tags that are not JSON: text the column takes but the store cannot read.
    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        let sql = format!(
            "UPDATE \"{}\".jobs SET tags = '{{' WHERE namespace = $1 AND id = $2",
            self.backend.schema()
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(namespace)
            .bind(uuid::Uuid::from(id))
            .execute(self.backend.pool())
            .await
            .map_err(|err| Error::backend("corrupt a record", err))?;
        Ok(done.rows_affected() == 1)
    }

    /// A namespace is its rows in the schema's tables (jobs and idempotency keys);
    /// the schema itself is every namespace's and stays.
    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.backend.drop_namespace(namespace).await.map(drop)
    }
}

async fn harness() -> Option<PgHarness> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let permit = match POOLS.acquire().await {
        Ok(permit) => permit,
        Err(err) => panic!("the pool semaphore closed: {err}"),
    };
    let config = match PostgresConfig::new(&url) {
        Ok(config) => config
            .max_connections(4)
            .application_name("durq-postgres-conformance"),
        Err(err) => panic!("DATABASE_URL is not a Postgres URL: {err}"),
    };
    match PostgresPool::connect(config).await {
        Ok(backend) => Some(PgHarness {
            backend,
            _permit: permit,
        }),
        Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url, &err),
    }
}

durq_conformance::conformance_tests!(harness);
