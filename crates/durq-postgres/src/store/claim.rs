//! Claims: the statement that leases jobs (plain, budgeted, preferring localities, or
//! of a reservation), what a claim does with the rows it leased: their order (CONTRACT
//! C3, F5) and the burial of those that do not decode (C10); and `wait_for_work`, which
//! watches for the wake-up notices a claim has not seen yet.

use std::collections::HashMap;
use std::time::Duration;

use durq_core::Budget;
use tokio::time::Instant;

use super::*;

pub(crate) async fn claim(
    store: &PostgresBackend,
    request: ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    let hub = &store.inner.shared.wake.hub;
    if hub.is_active() {
        // Notices from here on may be for jobs this claim does not see.
        let counters = hub.observe(store.namespace(), &request.queues);
        let mut seen = store.seen();
        for (queue, counter) in request.queues.iter().zip(counters) {
            seen.insert(queue.clone(), counter);
        }
    }
    // A queue with limits is claimed apart (CONTRACT K1–K5). The plain statements
    // refuse one this handle did not know of, and the claim goes there then.
    if store.names_limited_queue(&request.queues).await? {
        return limits::claim(store, request, now).await;
    }
    match plain_claim(store, &request, now).await {
        Err(err) if limits::is_limited_refusal(&err) => {
            store.forget_limited_queues();
            limits::claim(store, request, now).await
        }
        claimed => claimed,
    }
}

/// A claim of queues without limits: one statement.
async fn plain_claim(
    store: &PostgresBackend,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    let expires_at = now.saturating_add(request.lease_ttl).as_millis();
    let budget = request.budget.as_ref().map(Budget::to_json);
    // Sent again when the connection broke: if the first run committed unseen,
    // its jobs wait for their lease to expire and reclaim, exactly as when the
    // caller claims again after an `Unavailable`.
    let rows = store
        .shared()
        .fetch_all_again("claim", |_| {
            if !request.is_fitted() {
                let claim = store.sql().plain_claim(request.queues.len(), request.limit);
                return sqlx::query(claim.sql())
                    .bind(store.namespace())
                    .bind(&request.queues[..])
                    .bind(now.as_millis())
                    .bind(limit_param(request.limit))
                    .bind(request.worker.as_bytes())
                    .bind(expires_at);
            }
            // A reservation needs no order; a budget alone keeps the claim order.
            if let Some(reserved) = request.reserved {
                sqlx::query(store.sql().claim_reserved.sql())
                    .bind(store.namespace())
                    .bind(&request.queues[..])
                    .bind(now.as_millis())
                    .bind(Uuid::from(reserved))
                    .bind(request.worker.as_bytes())
                    .bind(expires_at)
                    .bind(budget.as_deref())
            } else if request.prefer.is_empty() {
                sqlx::query(store.sql().claim_budgeted.sql())
                    .bind(store.namespace())
                    .bind(&request.queues[..])
                    .bind(now.as_millis())
                    .bind(limit_param(request.limit))
                    .bind(request.worker.as_bytes())
                    .bind(expires_at)
                    .bind(budget.as_deref())
            } else {
                sqlx::query(store.sql().claim_preferring.sql())
                    .bind(store.namespace())
                    .bind(&request.queues[..])
                    .bind(now.as_millis())
                    .bind(limit_param(request.limit))
                    .bind(request.worker.as_bytes())
                    .bind(expires_at)
                    .bind(budget.as_deref())
                    .bind(&request.prefer[..])
            }
        })
        .await?;
    let shared = store.shared();
    let claimed = u64::try_from(rows.len()).unwrap_or(u64::MAX);
    shared.growth.passed(claimed, &shared.pool, &shared.sql);
    let (claimed, unreadable) = claim_order(rows, request)?;
    for job in unreadable {
        store.bury(job, now).await?;
    }
    Ok(claimed)
}

/// A job a claim leased but could not decode (CONTRACT C10): its row's id and lease
/// token, and why.
pub(super) struct Unreadable {
    pub(super) id: Uuid,
    pub(super) token: i64,
    pub(super) reason: String,
}

/// The claimed jobs in the request's order (CONTRACT C3, F5: `UPDATE … RETURNING` has
/// none), and those of its rows that did not decode.
pub(super) fn claim_order(
    rows: Vec<PgRow>,
    request: &ClaimRequest,
) -> Result<(Vec<ClaimedJob>, Vec<Unreadable>)> {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    let mut placements = durq_core::fit::PlacementCache::new();
    for row in rows {
        match claimed_job(&row, request, &mut placements) {
            Ok(job) => claimed.push(job),
            Err(Error::Corrupt { what, reason }) => {
                // The id and token columns are typed by the schema: they decode.
                let id: Uuid = column(&row, 0, &|| what.clone())?;
                let token: i64 = column(&row, 12, &|| what.clone())?;
                unreadable.push(Unreadable { id, token, reason });
            }
            Err(other) => return Err(other),
        }
    }
    claimed.sort_by_key(|(order, _)| *order);
    Ok((
        claimed.into_iter().map(|(_, job)| job).collect(),
        unreadable,
    ))
}

/// One row of a claim, decoded, with its place in the claim's order.
fn claimed_job(
    row: &PgRow,
    request: &ClaimRequest,
    placements: &mut durq_core::fit::PlacementCache,
) -> Result<(durq_core::fit::FitOrder, ClaimedJob)> {
    let job = row::job_in(row, Some(placements))?;
    let seq = row::seq(row, job.id)?;
    let payload: Vec<u8> = column(row, row::CLAIM_PAYLOAD, &|| format!("job {}", job.id))?;
    let order = request.fit_order(
        ReadyOrder::new(job.priority, job.run_at, seq),
        job.locality.as_deref(),
    );
    Ok((
        order,
        ClaimedJob {
            job,
            payload: Bytes::from(payload),
        },
    ))
}

impl PostgresBackend {
    /// Buries a job this store's claim leased and could not decode (CONTRACT C10), so
    /// it is neither handed out nor left leased to nobody.
    pub(super) async fn bury(&self, job: Unreadable, now: Timestamp) -> Result<()> {
        let error = format!("corrupt record: {}", job.reason);
        // Sent again when the connection broke: the lease token fences a second run.
        self.shared()
            .fetch_all_again("bury", |_| {
                sqlx::query(self.sql().bury.sql())
                    .bind(self.namespace())
                    .bind(job.id)
                    .bind(job.token)
                    .bind(now.as_millis())
                    .bind(error.as_bytes())
            })
            .await?;
        Ok(())
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) async fn wait_for_work(
    store: &PostgresBackend,
    queues: &[String],
    timeout: Duration,
) -> Result<()> {
    let mut deadline = Instant::now() + timeout;
    // A rate that holds jobs back frees a start at a known instant (K4): the wait ends
    // then, not a poll later. Read on the store's clock, which dates the starts.
    if store.names_limited_queue(queues).await? {
        let now = store.inner.settings.now();
        if let Some(at) = limits::next_rate_free(store, queues, now).await? {
            let frees_in =
                u64::try_from(at.as_millis().saturating_sub(now.as_millis())).unwrap_or(0);
            deadline = deadline.min(Instant::now() + Duration::from_millis(frees_in));
        }
    }
    let wake = &store.inner.shared.wake;
    let hub = &wake.hub;
    // Read before the listener may start: once its LISTEN is in force it moves every
    // counter (notices sent before then are lost), so a first wait returns then and
    // the caller's next claim covers that gap.
    let before = hub.observe(store.namespace(), queues);
    wake.ensure_listening().await;
    let baseline: Vec<u64> = {
        let seen = store.seen();
        queues
            .iter()
            .zip(&before)
            .map(|(queue, was)| seen.get(queue).copied().unwrap_or(*was))
            .collect()
    };
    loop {
        let notified = hub.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let current = hub.observe(store.namespace(), queues);
        let moved = current.iter().zip(&baseline).any(|(now, was)| now > was);
        if moved || Instant::now() >= deadline {
            let mut seen = store.seen();
            for (queue, counter) in queues.iter().zip(current) {
                seen.insert(queue.clone(), counter);
            }
            return Ok(());
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}
