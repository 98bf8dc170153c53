//! What each operation of [`PostgresBackend`] does: one statement per operation (the
//! texts are in `sql/`), at the instant the `Store` handle passes down, split by job:
//! [`enqueue`] (single calls gathered, and batches), [`claim`] (and waiting for work),
//! [`lease`] (heartbeat, complete and its gathering, fail, release), [`sweep`] (reclaim,
//! purge), [`reads`] (get, payload, children, attempts, stats, queues, list), [`admin`]
//! (cancel, retry, pause, and the hooks of tests), [`schedules`], [`workers`],
//! [`steps`] (durable steps: save, read, reopen) and [`events`] (the event stream:
//! read, emit, trim).
//!
//! This module holds what they share: the backend's statements, namespace and
//! connections, the runs of a statement that answer one row, the reading of a job's
//! state after a lease call missed, and the binding of tokens and limits.

use bytes::Bytes;
use durq_core::attempts::history;
use durq_core::meta::encode_tags;
use durq_core::{
    Attempt, ClaimRequest, ClaimedJob, Error, Job, JobId, JobState, LeaseToken, ListPage,
    ListQuery, QueueOverview, QueueStats, ReadyOrder, ReclaimedJob, Result, ScheduleUpdate,
    StoredSchedule, StoredWorker, Timestamp, LEASE_EXPIRED,
};
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::backend::PostgresBackend;
use crate::conn::{PgQuery, Shared};
use crate::row::{self, column};

pub(crate) mod admin;
pub(crate) mod claim;
pub(crate) mod enqueue;
pub(crate) mod events;
pub(crate) mod graph;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod reads;
pub(crate) mod schedules;
pub(crate) mod steps;
pub(crate) mod sweep;
pub(crate) mod workers;

impl PostgresBackend {
    fn sql(&self) -> &crate::sql::Statements {
        &self.inner.shared.sql
    }

    fn namespace(&self) -> &str {
        &self.inner.settings.namespace
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Runs the statement `build` makes, once more if its connection broke (for
    /// statements that may run twice; see `conn`), and returns its first row.
    async fn fetch_optional_again<'q>(
        &'q self,
        what: &str,
        build: impl Fn() -> PgQuery<'q>,
    ) -> Result<Option<PgRow>> {
        let rows = self.shared().fetch_all_again(what, |_| build()).await?;
        Ok(rows.into_iter().next())
    }

    /// Runs `query` once and returns its first row.
    async fn fetch_optional_once(&self, what: &str, query: PgQuery<'_>) -> Result<Option<PgRow>> {
        let rows = self.shared().fetch_all(what, query).await?;
        Ok(rows.into_iter().next())
    }

    async fn lease_miss(&self, what: &str, id: JobId) -> Error {
        match self.state_of(what, id).await {
            Ok(Some(_)) => Error::LeaseLost { id },
            Ok(None) => Error::NotFound { id },
            Err(err) => err,
        }
    }

    /// The job's current state, or `None` if it does not exist.
    async fn state_of(&self, what: &str, id: JobId) -> Result<Option<JobState>> {
        let row = self
            .fetch_optional_again(what, || {
                sqlx::query(self.sql().exists.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
            })
            .await?;
        row.map(|row| row::state(&row, 0, &|| format!("job {id}")))
            .transpose()
    }
}

pub(crate) fn token_param(token: LeaseToken) -> i64 {
    // Stored tokens are positive; one beyond i64 can never be current.
    i64::try_from(token.get()).unwrap_or(-1)
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
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
