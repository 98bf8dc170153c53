//! Jobs in the application's own SQLite transactions (CONTRACT §7).
//!
//! ```text
//! cargo run --example transactional_sqlite
//! ```
//!
//! An `orders` table lives in the queue's file. Placing an order and enqueueing its
//! "send confirmation" job is one transaction: both commit, or neither does (a second
//! order is rolled back and leaves no job). A worker then handles the job by writing a
//! `receipts` row and completing the job in one transaction, fenced by its lease: the
//! receipt and the completion commit together, and a handler whose lease was taken
//! back would commit neither. The handler returns the `FencedCompletion` receipt, so the
//! worker records nothing more for the job.
//!
//! The queue is a file in a fresh temporary directory, deleted at the end. The example
//! checks its own outcome and exits non-zero if anything is off.

use std::time::Duration;

use durq::backends::sqlite::{rusqlite, SqliteBackend};
use durq::{Bytes, FencedCompletion, JobContext, JobState, NewJob, Store, StoreSettings, Worker};
use tokio::sync::mpsc;

const QUEUE: &str = "confirmations";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Saves an order and enqueues its confirmation in one transaction; commits it or not.
/// Blocking (rusqlite), like every call on a `SqliteTransaction`.
fn place_order(
    backend: &SqliteBackend,
    conn: &mut rusqlite::Connection,
    item: &str,
    commit: bool,
) -> Result<(i64, durq::JobId), BoxError> {
    let mut tx = backend.transaction(conn)?;
    tx.execute("INSERT INTO orders (item) VALUES (?1)", [item])?;
    let order = tx.last_insert_rowid();
    let job = tx.enqueue(
        NewJob::new(QUEUE)
            .payload(order.to_string())
            .idempotency_key(format!("confirm-order-{order}")),
    )?;
    if commit {
        tx.commit()?;
    } else {
        tx.rollback()?;
    }
    Ok((order, job.id))
}

/// The handler's work: the receipt row and the job's completion, in one transaction.
fn send_confirmation(
    backend: &SqliteBackend,
    ctx: &JobContext,
    payload: &[u8],
) -> Result<FencedCompletion, BoxError> {
    let order: i64 = std::str::from_utf8(payload)?.parse()?;
    let receipt = format!("confirmation for order {order} sent");
    let mut conn = backend.connection()?;
    let mut tx = backend.transaction(&mut conn)?;
    tx.execute(
        "INSERT INTO receipts (order_id, text) VALUES (?1, ?2)",
        rusqlite::params![order, receipt],
    )?;
    // Checks the lease in this transaction: a stale one spoils it, and the commit below
    // then rolls the receipt back and answers LeaseLost.
    let completed = tx.complete(ctx.id(), ctx.lease_token(), Some(Bytes::from(receipt)))?;
    tx.commit()?;
    Ok(completed)
}

fn count(conn: &rusqlite::Connection, table: &str) -> Result<i64, BoxError> {
    Ok(
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |row| {
            row.get(0)
        })?,
    )
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.db");
    let backend = SqliteBackend::open(&path, StoreSettings::default()).await?;
    let store = Store::new(backend.clone());
    println!("queue and shop tables in {}", path.display());

    let mut conn = backend.connection()?;
    conn.execute_batch(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL);
         CREATE TABLE receipts (order_id INTEGER PRIMARY KEY, text TEXT NOT NULL);",
    )?;

    // 1. An order and its job, committed together. rusqlite blocks: off the runtime.
    let (order, job, conn) = {
        let backend = backend.clone();
        tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
            let (order, job) = place_order(&backend, &mut conn, "a book", true)?;
            Ok((order, job, conn))
        })
        .await??
    };
    println!("order {order} placed with its confirmation job {job}, in one commit");

    // 2. An order rolled back: no row, and no job either.
    let (rolled_back, ghost, conn) = {
        let backend = backend.clone();
        let mut conn = conn;
        tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
            let (order, job) = place_order(&backend, &mut conn, "a lamp", false)?;
            Ok((order, job, conn))
        })
        .await??
    };
    match store.get(ghost).await {
        Err(durq::Error::NotFound { .. }) => {
            println!("order {rolled_back} rolled back: its job {ghost} does not exist")
        }
        other => return Err(format!("the rolled-back job exists: {other:?}").into()),
    }

    // 3. A worker whose handler writes a receipt and completes the job in one transaction.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let handler_backend = backend.clone();
    let worker = Worker::builder(store.clone())
        .worker_id("transactional-example")
        .handler(QUEUE, move |ctx: JobContext, payload: Bytes| {
            let backend = handler_backend.clone();
            let done = done_tx.clone();
            async move {
                let id = ctx.id();
                let completed = tokio::task::spawn_blocking(move || {
                    send_confirmation(&backend, &ctx, &payload)
                })
                .await??;
                let _ = done.send(id);
                // Already completed in the handler's transaction: the worker records
                // nothing more.
                Ok(completed)
            }
        })
        .build()?;
    let handle = worker.spawn();
    let handled = tokio::time::timeout(Duration::from_secs(10), done_rx.recv()).await;
    handle.shutdown().await;
    match handled {
        Ok(Some(id)) if id == job => {}
        other => return Err(format!("the job was not handled: {other:?}").into()),
    }

    let stored = store.get(job).await?;
    let result = stored
        .result
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default()
        .into_owned();
    let receipt: String = conn.query_row(
        "SELECT text FROM receipts WHERE order_id = ?1",
        [order],
        |row| row.get(0),
    )?;
    println!("job {job}: {:?}, result {result:?}", stored.state);
    println!("receipts row of order {order}: {receipt:?}");

    let stats = store.stats(QUEUE).await?;
    let (orders, receipts) = (count(&conn, "orders")?, count(&conn, "receipts")?);
    println!(
        "{orders} order(s), {receipts} receipt(s); queue: {} succeeded, {} waiting, {} running",
        stats.succeeded,
        stats.ready + stats.scheduled,
        stats.running
    );
    let waiting = stats.ready + stats.scheduled + stats.running + stats.dead + stats.cancelled;
    if stored.state != JobState::Succeeded
        || result != receipt
        || orders != 1
        || receipts != 1
        || stats.succeeded != 1
        || waiting != 0
    {
        return Err("the orders, receipts and jobs do not agree".into());
    }
    println!("ok: every order has its job, every receipt its completion");
    Ok(())
}
