//! The worker registry (CONTRACT W1–W4).

use super::*;

pub(crate) async fn put_worker(
    store: &PostgresBackend,
    id: &str,
    spec: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<()> {
    // Storing the same record twice at the same instant is storing it once: sent
    // again if the connection broke.
    store
        .shared()
        .fetch_all_again("put_worker", |_| {
            sqlx::query(store.sql().put_worker.sql())
                .bind(store.namespace())
                .bind(id)
                .bind(spec)
                .bind(now.as_millis())
                .bind(i64::from(in_flight))
        })
        .await
        .map(drop)
}

pub(crate) async fn touch_worker(
    store: &PostgresBackend,
    id: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<bool> {
    // Setting the same two values twice is setting them once, and answers the
    // same: sent again if the connection broke.
    let rows = store
        .shared()
        .fetch_all_again("touch_worker", |_| {
            sqlx::query(store.sql().touch_worker.sql())
                .bind(store.namespace())
                .bind(id)
                .bind(i64::from(in_flight))
                .bind(now.as_millis())
        })
        .await?;
    Ok(!rows.is_empty())
}

pub(crate) async fn delete_worker(store: &PostgresBackend, id: &str) -> Result<bool> {
    // Sent once, as `delete_schedule` is: a second run after a broken connection
    // would answer `false` for a worker the first run deleted.
    let query = sqlx::query(store.sql().delete_worker.sql())
        .bind(store.namespace())
        .bind(id);
    Ok(store
        .fetch_optional_once("delete_worker", query)
        .await?
        .is_some())
}

pub(crate) async fn workers(store: &PostgresBackend) -> Result<Vec<StoredWorker>> {
    let rows = store
        .shared()
        .fetch_all_again("workers", |_| {
            sqlx::query(store.sql().workers.sql()).bind(store.namespace())
        })
        .await?;
    rows.iter()
        .map(|row| {
            let id: String = column(row, 0, &|| "worker row".to_owned())?;
            let what = || format!("worker {id}");
            let in_flight: i64 = column(row, 2, &what)?;
            let in_flight = u32::try_from(in_flight)
                .map_err(|_| Error::corrupt(what(), format!("in_flight is {in_flight}")))?;
            Ok(StoredWorker {
                spec: column(row, 1, &what)?,
                in_flight,
                last_seen: Timestamp::from_millis(column(row, 3, &what)?),
                id,
            })
        })
        .collect()
}

pub(crate) async fn reap_workers(
    store: &PostgresBackend,
    cutoff: Timestamp,
) -> Result<Vec<String>> {
    // Deleting the silent workers twice deletes them once: sent again if the
    // connection broke (the answer then misses the ids the first run deleted, as
    // `reclaim`'s and `purge`'s do).
    let rows = store
        .shared()
        .fetch_all_again("reap_workers", |_| {
            sqlx::query(store.sql().reap_workers.sql())
                .bind(store.namespace())
                .bind(cutoff.as_millis())
        })
        .await?;
    let what = || "reaped worker row".to_owned();
    let mut ids = rows
        .iter()
        .map(|row| column(row, 0, &what))
        .collect::<Result<Vec<String>>>()?;
    ids.sort_unstable();
    Ok(ids)
}
