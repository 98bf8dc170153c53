//! Batched completion (CONTRACT L4, L5): concurrent `complete` calls of one store
//! become one `UPDATE … FROM unnest(…)`, each caller getting its own outcome.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use durq_core::batch::{Batch, Limits};
use durq_core::{JobId, Result, StoreSettings, Timestamp};
use sqlx::postgres::PgBindIterExt;
use uuid::Uuid;

use crate::conn::Shared;
use crate::row::{self, column};

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

/// The instant a statement of several calls takes effect: the latest its callers read.
///
/// That instant falls inside every one of those calls: each began before its own
/// instant was read, and none is answered before the statement, which runs after every
/// instant was read. So each call takes effect while its caller waits, as it would
/// alone. (With a manual clock, the calls of one statement normally share one instant.)
pub(crate) fn latest(instants: impl Iterator<Item = Timestamp>) -> Timestamp {
    instants.max().unwrap_or(Timestamp::from_millis(0))
}
