//! The producer of `latency-tx`: each job enqueued inside a database transaction of the
//! producer's own, beside one business row of a table the run creates, then committed
//! (CONTRACT §7), as an application enqueues the job of an order it records.

use std::time::Instant;

use crate::backends::Transactional;
use crate::workloads::Options;

/// The business table: one row per job, written in the job's transaction.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const TABLE: &str = "bench_orders";

/// Creates the business table, then enqueues jobs `0..opts.jobs` at `opts.rate` jobs/s,
/// each in a transaction of its own that first inserts its order row; answers when each
/// transaction's commit returned, in job order. Checks afterwards that every order row
/// is there (not timed).
pub async fn produce(target: &Transactional, opts: &Options) -> Result<Vec<Instant>, String> {
    // Built with neither SQL backend, there is no such store to be given.
    #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
    {
        let _ = opts;
        match *target {}
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    match target {
        #[cfg(feature = "sqlite")]
        Transactional::Sqlite(store) => {
            // rusqlite blocks: the producer gets a thread of its own, off the runtime
            // the workers run on.
            let (store, jobs, rate) = (store.clone(), opts.jobs, opts.rate);
            tokio::task::spawn_blocking(move || sqlite::produce(&store, jobs, rate))
                .await
                .map_err(|e| format!("sqlite producer thread: {e}"))?
        }
        #[cfg(feature = "postgres")]
        Transactional::Postgres { store, schema } => {
            postgres::produce(store, schema, opts.jobs, opts.rate).await
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::time::{Duration, Instant};

    use durq_sqlite::SqliteBackend;

    use super::TABLE;
    use crate::workloads::{payload, period};

    /// The blocking producer, on a connection of its own to the store's file.
    pub(super) fn produce(
        store: &SqliteBackend,
        jobs: u64,
        rate: u64,
    ) -> Result<Vec<Instant>, String> {
        let mut conn = store
            .connection()
            .map_err(|e| format!("sqlite connection: {e}"))?;
        conn.execute_batch(&format!("CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY)"))
            .map_err(|e| format!("create {TABLE}: {e}"))?;
        let insert = format!("INSERT INTO {TABLE} (id) VALUES (?1)");
        let mut pace = Pace::new(period(rate));
        let mut returned = Vec::with_capacity(jobs as usize);
        for i in 0..jobs {
            pace.tick();
            let mut tx = store
                .transaction(&mut conn)
                .map_err(|e| format!("begin: {e}"))?;
            tx.execute(&insert, [i as i64])
                .map_err(|e| format!("insert into {TABLE}: {e}"))?;
            tx.enqueue(payload(i))
                .map_err(|e| format!("enqueue in a transaction: {e}"))?;
            tx.commit().map_err(|e| format!("commit: {e}"))?;
            returned.push(Instant::now());
        }
        let rows: i64 = conn
            .query_row(&format!("SELECT count(*) FROM {TABLE}"), [], |row| {
                row.get(0)
            })
            .map_err(|e| format!("count {TABLE}: {e}"))?;
        if rows != jobs as i64 {
            return Err(format!("{TABLE} holds {rows} rows after {jobs} commits"));
        }
        Ok(returned)
    }

    /// The pace of a blocking producer, as [`crate::workloads::ticker`] paces an async
    /// one: the first tick at once, then one per `period`; a late tick delays the ones
    /// after it instead of bunching them up.
    struct Pace {
        period: Duration,
        next: Instant,
    }

    impl Pace {
        fn new(period: Duration) -> Self {
            Pace {
                period,
                next: Instant::now(),
            }
        }

        /// Sleeps until the next tick is due.
        fn tick(&mut self) {
            let now = Instant::now();
            if let Some(wait) = self.next.checked_duration_since(now) {
                std::thread::sleep(wait);
                self.next += self.period;
            } else {
                self.next = now + self.period;
            }
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Instant;

    use durq_postgres::PostgresBackend;
    use sqlx::AssertSqlSafe;

    use super::TABLE;
    use crate::workloads::{payload, ticker};

    /// The producer, on transactions begun from the store's own pool; the table goes
    /// in the run's schema, dropped with it.
    pub(super) async fn produce(
        store: &PostgresBackend,
        schema: &str,
        jobs: u64,
        rate: u64,
    ) -> Result<Vec<Instant>, String> {
        let table = format!("\"{}\".{TABLE}", schema.replace('"', "\"\""));
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY)"
        )))
        .execute(store.pool())
        .await
        .map_err(|e| format!("create {table}: {e}"))?;
        let insert = format!("INSERT INTO {table} (id) VALUES ($1)");
        let mut ticks = ticker(rate);
        let mut returned = Vec::with_capacity(jobs as usize);
        for i in 0..jobs {
            ticks.tick().await;
            let mut tx = store
                .pool()
                .begin()
                .await
                .map_err(|e| format!("begin: {e}"))?;
            sqlx::query(AssertSqlSafe(insert.as_str()))
                .bind(i as i64)
                .execute(&mut *tx)
                .await
                .map_err(|e| format!("insert into {table}: {e}"))?;
            store
                .enqueue_in(&mut tx, payload(i))
                .await
                .map_err(|e| format!("enqueue_in: {e}"))?;
            tx.commit().await.map_err(|e| format!("commit: {e}"))?;
            returned.push(Instant::now());
        }
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(store.pool())
            .await
            .map_err(|e| format!("count {table}: {e}"))?;
        if rows != jobs as i64 {
            return Err(format!("{table} holds {rows} rows after {jobs} commits"));
        }
        Ok(returned)
    }
}
