//! The conformance suite against PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).
//!
//! Each test gets its own small pool (its runtime owns the sockets); a process-wide
//! semaphore caps how many tests hold one at once, so any number of test threads
//! stays well inside the server's `max_connections`. Every namespace a scenario
//! opens lives in the rows of the shared default schema; `teardown` deletes them.

use durq_conformance::{CallerTransaction, Harness, TransactionHarness};
use durq_core::{
    async_trait, Backend as _, Bytes, Enqueued, Error, FencedCompletion, JobId, LeaseToken, NewJob,
    Result, Store, StoreSettings,
};
use durq_postgres::{PostgresBackend, PostgresConfig, PostgresPool};
use sqlx::{Postgres, Transaction};
use tokio::sync::{OnceCell, Semaphore, SemaphorePermit};

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
        self.backend.drop_namespace(namespace).await?;
        let sql = format!(
            "DELETE FROM \"{}\".conformance_rows WHERE namespace = $1",
            self.backend.schema()
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(namespace)
            .execute(self.backend.pool())
            .await
            .map(drop)
            .map_err(|err| Error::backend("remove the caller's rows", err))
    }
}

/// The caller's side of CONTRACT §7: an `sqlx::Transaction` on the pool's database,
/// and a table of the caller's (`conformance_rows`) beside the queue's.
#[async_trait]
impl TransactionHarness for PgHarness {
    async fn begin(&self, settings: &StoreSettings) -> Result<Box<dyn CallerTransaction>> {
        let backend = self.backend.backend(settings.clone())?;
        let tx = self
            .backend
            .pool()
            .begin()
            .await
            .map_err(|err| Error::backend("begin the caller's transaction", err))?;
        Ok(Box::new(PgCallerTx {
            backend,
            tx,
            insert: format!(
                "INSERT INTO \"{}\".conformance_rows (namespace, mark) VALUES ($1, $2)",
                self.backend.schema()
            ),
        }))
    }

    async fn row_committed(&self, namespace: &str, mark: &str) -> Result<bool> {
        let sql = format!(
            "SELECT count(*) FROM \"{}\".conformance_rows WHERE namespace = $1 AND mark = $2",
            self.backend.schema()
        );
        let (count,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(namespace)
            .bind(mark)
            .fetch_one(self.backend.pool())
            .await
            .map_err(|err| Error::backend("read the caller's row", err))?;
        Ok(count > 0)
    }
}

struct PgCallerTx {
    backend: PostgresBackend,
    tx: Transaction<'static, Postgres>,
    insert: String,
}

#[async_trait]
impl CallerTransaction for PgCallerTx {
    async fn write_row(&mut self, mark: &str) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.insert.clone()))
            .bind(&self.backend.settings().namespace)
            .bind(mark)
            .execute(&mut *self.tx)
            .await
            .map(drop)
            .map_err(|err| Error::backend("write the caller's row", err))
    }

    async fn enqueue(&mut self, job: NewJob) -> Result<Enqueued> {
        self.backend.enqueue_in(&mut self.tx, job).await
    }

    async fn enqueue_batch(&mut self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.backend.enqueue_batch_in(&mut self.tx, jobs).await
    }

    async fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<FencedCompletion> {
        self.backend
            .complete_in(&mut self.tx, id, token, result)
            .await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.tx
            .commit()
            .await
            .map_err(|err| Error::backend("commit the caller's transaction", err))
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        self.tx
            .rollback()
            .await
            .map_err(|err| Error::backend("roll back the caller's transaction", err))
    }
}

/// Creates the caller's table once per test process. Parallel `CREATE TABLE IF NOT
/// EXISTS` can still collide in PostgreSQL's catalog (another process's test binary,
/// or a run beside this one), so a duplicate answer counts as done.
async fn caller_table(backend: &PostgresPool) {
    static CREATED: OnceCell<()> = OnceCell::const_new();
    CREATED
        .get_or_init(|| async {
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS \"{}\".conformance_rows \
                 (namespace text NOT NULL, mark text NOT NULL)",
                backend.schema()
            );
            match sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(backend.pool())
                .await
            {
                Ok(_) => {}
                Err(sqlx::Error::Database(db))
                    if matches!(db.code().as_deref(), Some("23505" | "42P07")) => {}
                Err(err) => panic!("cannot create the caller's table: {err}"),
            }
        })
        .await;
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
        Ok(backend) => {
            caller_table(&backend).await;
            Some(PgHarness {
                backend,
                _permit: permit,
            })
        }
        Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url, &err),
    }
}

durq_conformance::conformance_tests!(harness);
durq_conformance::transaction_tests!(harness);

/// The flow-control scenarios with every store on a pool of its own, as stores of
/// different processes are: each has its own memory of which queues have limits and
/// its own in-process turns (`FlowGates`), so only the advisory locks and the plain
/// claims' refusal of limited queues keep the limits. In the suite above, every store
/// of a scenario shares one pool, and those in-process parts could hide a gap.
mod flow_control_across_pools {
    use super::*;

    /// Opens each store on a new pool of one connection.
    struct PoolPerStore {
        inner: PgHarness,
        url: String,
    }

    #[async_trait]
    impl Harness for PoolPerStore {
        async fn open(&self, settings: StoreSettings) -> Result<Store> {
            let config = PostgresConfig::new(&self.url)?
                .max_connections(1)
                .application_name("durq-postgres-conformance-pools");
            let pool = PostgresPool::connect(config).await?;
            Ok(Store::new(pool.backend(settings)?))
        }

        async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
            self.inner.vanish(namespace, id).await
        }

        async fn teardown(&self, namespace: &str) -> Result<()> {
            self.inner.teardown(namespace).await
        }
    }

    fn check(name: &str) {
        let Some(scenario) = durq_conformance::SCENARIOS
            .iter()
            .find(|scenario| scenario.name == name)
        else {
            panic!("no scenario is named {name}");
        };
        durq_conformance::__private::run(async {
            let Some(inner) = harness().await else { return };
            let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
            let harness = PoolPerStore { inner, url };
            durq_conformance::__private::scenario(&harness, name, scenario.needs, scenario.run)
                .await;
        });
    }

    #[test]
    fn k1_concurrent_claimers_never_run_more_of_a_key_than_its_limit() {
        check("k1_concurrent_claimers_never_run_more_of_a_key_than_its_limit");
    }

    #[test]
    fn k3_limits_are_stored_per_queue_and_applied_by_the_next_claim() {
        check("k3_limits_are_stored_per_queue_and_applied_by_the_next_claim");
    }

    #[test]
    fn k4_concurrent_claimers_never_start_more_than_the_rate_in_any_window() {
        check("k4_concurrent_claimers_never_start_more_than_the_rate_in_any_window");
    }

    #[test]
    fn k5_claims_take_turns_over_the_keys_of_a_fair_queue() {
        check("k5_claims_take_turns_over_the_keys_of_a_fair_queue");
    }
}
