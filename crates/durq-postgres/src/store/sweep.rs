//! Housekeeping: reclaim of expired leases (CONTRACT R1–R6) and purge of finished jobs
//! past retention.

use super::*;

pub(crate) async fn reclaim(
    store: &PostgresBackend,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<ReclaimedJob>> {
    // Sent again when the connection broke: jobs a first run reclaimed unseen are
    // queued all the same; only their wake-up is left to the next poll.
    let rows = store
        .shared()
        .fetch_all_again("reclaim", |_| {
            sqlx::query(store.sql().reclaim.sql())
                .bind(store.namespace())
                .bind(now.as_millis())
                .bind(limit_param(limit))
                .bind(LEASE_EXPIRED.as_bytes())
        })
        .await?;
    if store.has_limited_queues().await? {
        // Starts a claim no longer trims: those of keys that stopped starting jobs.
        super::limits::forget_old_starts(store, now).await?;
    }
    let what = || "reclaim result row".to_owned();
    let mut reclaimed = Vec::with_capacity(rows.len());
    let mut requeued: Vec<String> = Vec::new();
    for row in &rows {
        let job = ReclaimedJob {
            id: row::job_id(column(row, 0, &what)?)?,
            state: row::state(row, 1, &what)?,
        };
        if job.state == JobState::Queued {
            requeued.push(column(row, 2, &what)?);
        }
        reclaimed.push(job);
    }
    store
        .inner
        .shared
        .wake
        .announce(store.namespace(), requeued.iter().map(String::as_str));
    Ok(reclaimed)
}

pub(crate) async fn purge(store: &PostgresBackend, limit: usize, cutoff: Timestamp) -> Result<u64> {
    // Keys this old are past their window whatever now is (see `sql::PURGE`).
    let keys_cutoff = cutoff.saturating_sub(store.inner.settings.dedup_window);
    // Deleting what is past retention twice deletes it once: sent again if the
    // connection broke (the count then misses what the first run deleted).
    let row = store
        .fetch_optional_again("purge", || {
            sqlx::query(store.sql().purge.sql())
                .bind(store.namespace())
                .bind(cutoff.as_millis())
                .bind(limit_param(limit))
                .bind(keys_cutoff.as_millis())
        })
        .await?
        .ok_or_else(|| Error::corrupt("purge", "no result row"))?;
    let jobs: i64 = column(&row, 0, &|| "purge result".to_owned())?;
    Ok(jobs.unsigned_abs())
}
