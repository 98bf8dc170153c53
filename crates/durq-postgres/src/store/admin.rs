//! Operator actions: cancel, retry, pause (CONTRACT A1, A2, Q1); and the hooks of tests
//! and of retiring a namespace, behind `PostgresPool::vanish` (a job's row deleted
//! behind the store's back) and `PostgresPool::drop_namespace`.

use super::*;

pub(crate) async fn cancel(store: &PostgresBackend, id: JobId, now: Timestamp) -> Result<JobState> {
    // The update acts on a queued or running job; otherwise the job is terminal
    // and stays as it is. A job that moves between the two statements (a
    // concurrent retry) is tried again.
    let mut attempts = 0;
    loop {
        // Cancelling twice is cancelling once: sent again if the connection broke.
        let row = store
            .fetch_optional_again("cancel", || {
                sqlx::query(store.sql().cancel.sql())
                    .bind(store.namespace())
                    .bind(Uuid::from(id))
                    .bind(now.as_millis())
            })
            .await?;
        if let Some(row) = row {
            return row::state(&row, 0, &|| format!("job {id}"));
        }
        match store.state_of("cancel", id).await? {
            None => return Err(Error::NotFound { id }),
            Some(state) if state.is_terminal() || attempts >= 8 => return Ok(state),
            Some(_) => attempts += 1,
        }
    }
}

pub(crate) async fn retry(store: &PostgresBackend, id: JobId, now: Timestamp) -> Result<()> {
    // Sent once: a second run after a first that committed unseen would refuse
    // the job as already queued.
    let query = sqlx::query(store.sql().retry.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .bind(now.as_millis());
    let row = store.fetch_optional_once("retry", query).await?;
    if let Some(row) = row {
        let queue: String = column(&row, 0, &|| format!("job {id}"))?;
        store
            .inner
            .shared
            .wake
            .announce(store.namespace(), [queue.as_str()]);
        return Ok(());
    }
    match store.state_of("retry", id).await? {
        None => Err(Error::NotFound { id }),
        Some(state) => Err(Error::InvalidState {
            id,
            state,
            operation: "retry",
        }),
    }
}

pub(crate) async fn set_paused(store: &PostgresBackend, queue: &str, paused: bool) -> Result<()> {
    // Pausing what is paused, or resuming what runs, changes nothing: sent again
    // if the connection broke.
    let sql = if paused {
        &store.sql().pause
    } else {
        &store.sql().resume
    };
    let rows = store
        .shared()
        .fetch_all_again("pause", |_| {
            sqlx::query(sql.sql()).bind(store.namespace()).bind(queue)
        })
        .await?;
    if !paused && !rows.is_empty() {
        // Claimers waiting on the queue look again.
        store.inner.shared.wake.announce(store.namespace(), [queue]);
    }
    Ok(())
}

pub(crate) async fn paused_queues(store: &PostgresBackend) -> Result<Vec<String>> {
    let rows = store
        .shared()
        .fetch_all_again("paused_queues", |_| {
            sqlx::query(store.sql().paused_queues.sql()).bind(store.namespace())
        })
        .await?;
    let what = || "paused queue".to_owned();
    rows.iter().map(|row| column(row, 0, &what)).collect()
}

/// Deletes the row of job `id` in `namespace`, leaving any dedup entry that points to
/// it (see `PostgresPool::vanish`).
#[cfg(feature = "testing")]
pub(crate) async fn vanish(shared: &Shared, namespace: &str, id: JobId) -> Result<()> {
    let query = sqlx::query(shared.sql.vanish.sql())
        .bind(namespace)
        .bind(Uuid::from(id));
    shared.fetch_all("vanish", query).await?;
    Ok(())
}

/// Deletes every row of `namespace`, in one transaction, and returns how many jobs it
/// deleted (see `PostgresPool::drop_namespace`).
pub(crate) async fn drop_namespace(shared: &Shared, namespace: &str) -> Result<u64> {
    // Deleting what is gone deletes nothing: sent again if the connection broke.
    let rows = shared
        .fetch_all_again("drop_namespace", |_| {
            sqlx::query(shared.sql.drop_namespace.sql()).bind(namespace)
        })
        .await?;
    let jobs: i64 = match rows.first() {
        Some(row) => crate::row::column(row, 0, &|| "drop_namespace result".to_owned())?,
        None => 0,
    };
    Ok(jobs.unsigned_abs())
}
