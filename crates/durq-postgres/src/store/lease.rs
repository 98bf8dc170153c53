//! The calls of a lease's holder (CONTRACT L1–L10): heartbeat (of one lease, or of
//! every lease a worker holds, in one statement), complete, fail and release.
//!
//! Batched completion (CONTRACT L4, L5): concurrent `complete` calls of one store
//! become one `UPDATE … FROM unnest(…)`, each caller getting its own outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use durq_core::batch::{Batch, Limits};
use durq_core::{
    Error, Heartbeat, HeldLease, JobId, JobState, LeaseToken, Result, Retry, StoreSettings,
    Timestamp,
};
use sqlx::postgres::PgBindIterExt;
use uuid::Uuid;

use super::{latest, token_param};
use crate::backend::PostgresBackend;
use crate::conn::Shared;
use crate::row::{self, column};

pub(crate) async fn heartbeat(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    ttl: Duration,
    now: Timestamp,
) -> Result<Heartbeat> {
    let expires_at = now.saturating_add(ttl);
    // Sent again when the connection broke: a second run sets the same expiry.
    let row = store
        .fetch_optional_again("heartbeat", || {
            sqlx::query(store.sql().heartbeat.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
                .bind(token_param(token))
                .bind(expires_at.as_millis())
                .bind(now.as_millis())
        })
        .await?;
    match row {
        Some(row) => Ok(Heartbeat {
            cancel_requested: column(&row, 0, &|| format!("job {id}"))?,
            expires_at,
        }),
        None => Err(store.lease_miss("heartbeat", id).await),
    }
}

pub(crate) async fn heartbeat_batch(
    store: &PostgresBackend,
    leases: Vec<HeldLease>,
    ttl: Duration,
    now: Timestamp,
) -> Result<Vec<Result<Heartbeat>>> {
    let expires_at = now.saturating_add(ttl);
    // Sent in id order, as completions are (see `Completions::run`): two
    // statements locking some of the same rows lock them in the same order, so
    // they queue on each other instead of deadlocking.
    let mut sorted: Vec<(usize, &HeldLease)> = leases.iter().enumerate().collect();
    sorted.sort_unstable_by_key(|(_, lease)| lease.id);
    let rows = store
        .shared()
        .fetch_all_again("heartbeat_batch", |_| {
            sqlx::query(store.sql().heartbeat_batch.sql())
                .bind(store.namespace())
                .bind(
                    sorted
                        .iter()
                        .map(|(_, lease)| Uuid::from(lease.id))
                        .bind_iter(),
                )
                .bind(
                    sorted
                        .iter()
                        .map(|(_, lease)| token_param(lease.token))
                        .bind_iter(),
                )
                .bind(expires_at.as_millis())
                .bind(now.as_millis())
        })
        .await?;
    let what = || "heartbeat batch row".to_owned();
    let mut answers: Vec<Option<Result<Heartbeat>>> = leases.iter().map(|_| None).collect();
    for row in &rows {
        let ord: i64 = column(row, 0, &what)?;
        // `ord` counts the sorted entries from 1.
        let Some(&(index, lease)) = usize::try_from(ord - 1)
            .ok()
            .and_then(|position| sorted.get(position))
        else {
            return Err(Error::corrupt(what(), format!("no entry {ord}")));
        };
        let extended: bool = column(row, 1, &what)?;
        let found: bool = column(row, 3, &what)?;
        let answer = match (extended, found) {
            (true, _) => Ok(Heartbeat {
                cancel_requested: column(row, 2, &what)?,
                expires_at,
            }),
            (false, true) => Err(Error::LeaseLost { id: lease.id }),
            (false, false) => Err(Error::NotFound { id: lease.id }),
        };
        if let Some(slot) = answers.get_mut(index) {
            *slot = Some(answer);
        }
    }
    answers
        .into_iter()
        .zip(&leases)
        .map(|(answer, lease)| {
            answer.ok_or_else(|| {
                Error::corrupt(
                    format!("job {}", lease.id),
                    "the heartbeat batch did not report this job",
                )
            })
        })
        .collect()
}

pub(crate) async fn complete(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    result: Option<Bytes>,
    now: Timestamp,
) -> Result<()> {
    let call = Completion {
        id,
        token: token_param(token),
        result,
        now,
    };
    let outcome = store.inner.completions.call(call).await?;
    match outcome {
        Outcome::Completed => Ok(()),
        Outcome::LeaseLost => Err(Error::LeaseLost { id }),
        Outcome::NotFound => Err(Error::NotFound { id }),
    }
}

/// What became of one completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    LeaseLost,
    NotFound,
}

/// One `complete` call, with the instant its caller read.
pub(crate) struct Completion {
    pub(crate) id: JobId,
    pub(crate) token: i64,
    pub(crate) result: Option<Bytes>,
    pub(crate) now: Timestamp,
}

/// The completions of one store.
pub(crate) struct Completions {
    pub(crate) shared: Arc<Shared>,
    pub(crate) settings: StoreSettings,
}

impl Batch for Completions {
    type Call = Completion;
    type Answer = Outcome;
    /// A second call for a job in the same statement would see the first one's
    /// update as its own; it goes in the next statement and finds the job finished.
    type Key = JobId;

    const LIMITS: Limits = Limits {
        max_calls: 1_000,
        max_bytes: 32 * 1024 * 1024,
        in_flight: 2,
        queued: 4_000,
    };

    fn key(call: &Completion) -> Option<JobId> {
        Some(call.id)
    }

    fn size(call: &Completion) -> usize {
        call.result.as_ref().map_or(0, Bytes::len)
    }

    async fn run(&self, calls: &[Completion]) -> Result<Vec<Outcome>> {
        let now = latest(calls.iter().map(|c| c.now));
        let settings = &self.settings;
        // Sent in id order. Two batches in flight can share a job (a second call
        // for it goes in the next batch, which may start before this one ends); a
        // plan that locks rows in input order then locks them in the same order in
        // both, so they queue on each other instead of deadlocking.
        let mut sorted: Vec<&Completion> = calls.iter().collect();
        sorted.sort_unstable_by_key(|c| c.id);
        // One `now` for both runs: a second run (after a broken connection) knows
        // its first one's completions by this `finished_at` (see `sql::COMPLETE`).
        let now = now.as_millis();
        let sql = &self.shared.sql;
        let rows = self
            .shared
            .fetch_all_again("complete", |again| {
                let text = if again {
                    &sql.complete_again
                } else {
                    &sql.complete
                };
                sqlx::query(text.sql())
                    .bind(&settings.namespace)
                    .bind(sorted.iter().map(|c| Uuid::from(c.id)).bind_iter())
                    .bind(sorted.iter().map(|c| c.token).bind_iter())
                    .bind(sorted.iter().map(|c| c.result.as_deref()).bind_iter())
                    .bind(now)
            })
            .await?;
        let what = || "completion batch row".to_owned();
        let mut outcomes = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id = row::job_id(column(row, 0, &what)?)?;
            let completed: bool = column(row, 1, &what)?;
            let found: bool = column(row, 2, &what)?;
            let outcome = match (completed, found) {
                (true, _) => Outcome::Completed,
                (false, true) => Outcome::LeaseLost,
                (false, false) => Outcome::NotFound,
            };
            outcomes.insert(id, outcome);
        }
        calls
            .iter()
            .map(|call| {
                outcomes.get(&call.id).copied().ok_or_else(|| {
                    durq_core::Error::corrupt(
                        format!("job {}", call.id),
                        "the completion batch did not report this job",
                    )
                })
            })
            .collect()
    }
}

/// How many bytes of a failure's error its attempt record keeps (CONTRACT H2): the
/// text cut at 4 KiB on a character boundary, so `FAIL` cuts the bytes it already has
/// instead of receiving the text twice.
fn attempt_error_len(error: &str) -> i32 {
    let kept = durq_core::validate::truncate_attempt_error(error).len();
    i32::try_from(kept).unwrap_or(i32::MAX)
}

pub(crate) async fn fail(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    error: &str,
    retry: Retry,
    now: Timestamp,
) -> Result<JobState> {
    let retry_at = match retry {
        Retry::At(at) => Some(at.as_millis()),
        Retry::Never => None,
    };
    // Sent once: a second run after a first that committed unseen would answer
    // "lease lost" for a failure that was recorded.
    let query = sqlx::query(store.sql().fail.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .bind(token_param(token))
        .bind(retry_at)
        .bind(now.as_millis())
        .bind(error.as_bytes())
        .bind(attempt_error_len(error));
    let row = store.fetch_optional_once("fail", query).await?;
    match row {
        Some(row) => row::state(&row, 0, &|| format!("job {id}")),
        None => Err(store.lease_miss("fail", id).await),
    }
}

pub(crate) async fn release(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    ready_at: Timestamp,
    now: Timestamp,
) -> Result<()> {
    // Sent once, as `fail` is.
    let query = sqlx::query(store.sql().release.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .bind(token_param(token))
        .bind(now.as_millis())
        .bind(ready_at.as_millis());
    let row = store.fetch_optional_once("release", query).await?;
    let Some(row) = row else {
        return Err(store.lease_miss("release", id).await);
    };
    let what = || format!("job {id}");
    // A snoozed job is announced when it comes due, like any scheduled job.
    if row::state(&row, 0, &what)? == JobState::Queued && ready_at <= now {
        let queue: String = column(&row, 1, &what)?;
        store
            .inner
            .shared
            .wake
            .announce(store.namespace(), [queue.as_str()]);
    }
    Ok(())
}
