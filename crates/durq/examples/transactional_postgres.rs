//! Jobs inside your own PostgreSQL transactions (CONTRACT §7): an order and its
//! confirmation job commit together or not at all, and the handler that sends the
//! confirmation records its receipt and completes its job in one transaction, fenced
//! by its lease.
//!
//! ```text
//! cargo run --example transactional_postgres --features postgres
//! ```
//!
//! Needs the PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); it creates two tables of its own and
//! drops them, and its jobs, at the end.

use std::time::Duration;

use durq::backends::postgres::{sqlx, PostgresConfig, PostgresPool};
use durq::{JobContext, JobState, NewJob, Store, StoreSettings, Worker};

#[derive(serde::Serialize, serde::Deserialize)]
struct Confirmation {
    order: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let backend = PostgresPool::connect(PostgresConfig::new(&url)?).await?;
    let namespace = format!("example-tx-{}", std::process::id());
    let pg = backend.backend(StoreSettings::default().namespace(namespace.as_str()))?;
    let store = Store::new(pg.clone());
    let (orders, receipts) = (
        format!("example_orders_{}", std::process::id()),
        format!("example_receipts_{}", std::process::id()),
    );
    for table in [&orders, &receipts] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY)"
        )))
        .execute(pg.pool())
        .await?;
    }
    let outcome = run(&pg, &store, &orders, &receipts).await;
    for table in [&orders, &receipts] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(pg.pool())
            .await?;
    }
    backend.drop_namespace(&namespace).await?;
    outcome
}

async fn run(
    pg: &durq::backends::postgres::PostgresBackend,
    store: &Store,
    orders: &str,
    receipts: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    // Order 1: the order row and its confirmation job, one transaction. In place of an
    // outbox table: no job is lost if the process dies after the commit, and none runs
    // for an order that was rolled back.
    let mut tx = pg.pool().begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {orders} (id) VALUES (1)"
    )))
    .execute(&mut *tx)
    .await?;
    let job = NewJob::new("confirmations").json(&Confirmation { order: 1 })?;
    let confirmation = pg.enqueue_in(&mut tx, job).await?;
    tx.commit().await?;
    println!(
        "order 1 placed, its confirmation job {} enqueued with it",
        confirmation.id
    );

    // Order 2: the payment is declined and the transaction rolled back; its job never
    // existed, and no worker was woken for it.
    let mut tx = pg.pool().begin().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {orders} (id) VALUES (2)"
    )))
    .execute(&mut *tx)
    .await?;
    let declined = pg
        .enqueue_in(
            &mut tx,
            NewJob::new("confirmations").json(&Confirmation { order: 2 })?,
        )
        .await?;
    tx.rollback().await?;
    println!("order 2 declined: rolled back with its job");

    // The worker: the receipt row and the job's completion commit together. A worker
    // whose lease was taken over has this transaction refused (`LeaseLost`), so no
    // receipt is ever written twice.
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let handler_pg = pg.clone();
    let receipts_table = receipts.to_owned();
    let worker = Worker::builder(store.clone())
        .json_handler("confirmations", move |ctx: JobContext, c: Confirmation| {
            let (pg, receipts, done) = (handler_pg.clone(), receipts_table.clone(), done.clone());
            let (id, token) = (ctx.id(), ctx.lease_token());
            async move {
                // On the runtime the pool lives on: handlers run on one of the worker's
                // own, and a connection opened there would die with it.
                let receipt = ctx
                    .on_store_runtime(async move {
                        let mut tx = pg.pool().begin().await?;
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "INSERT INTO {receipts} (id) VALUES ($1)"
                        )))
                        .bind(c.order)
                        .execute(&mut *tx)
                        .await?;
                        let receipt = pg.complete_in(&mut tx, id, token, None).await?;
                        tx.commit().await?;
                        Ok::<_, durq::JobError>(receipt)
                    })
                    .await??;
                let _ = done.send(c.order);
                Ok(receipt) // completed already: the worker records nothing more
            }
        })
        .build()?;
    let running = worker.spawn();
    let sent = tokio::time::timeout(Duration::from_secs(30), finished.recv()).await?;
    running.shutdown().await;
    println!(
        "confirmation of order {} sent, its receipt and completion committed together",
        sent.unwrap_or(0)
    );

    let job = store.get(confirmation.id).await?;
    let receipts_kept: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {receipts}"
    )))
    .fetch_one(pg.pool())
    .await?;
    let orders_kept: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {orders}"
    )))
    .fetch_one(pg.pool())
    .await?;
    let declined_exists = store.get(declined.id).await.is_ok();
    println!(
        "orders kept: {orders_kept}, receipts: {receipts_kept}, job of order 1: {:?}, job of order 2 exists: {declined_exists}",
        job.state
    );
    if sent != Some(1)
        || job.state != JobState::Succeeded
        || job.attempts != 1
        || receipts_kept != 1
        || orders_kept != 1
        || declined_exists
    {
        return Err("the transactions did not keep their promises".into());
    }
    Ok(())
}
