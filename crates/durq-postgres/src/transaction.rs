//! Enqueue and completion inside the caller's own transaction (CONTRACT §7): the
//! caller's business rows and the queue's rows commit together or not at all.

use bytes::Bytes;
use durq_core::transaction::{prepare_batch, prepare_complete, prepare_enqueue};
use durq_core::{Backend, Enqueued, Error, FencedCompletion, JobId, LeaseToken, NewJob, Result};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::backend::PostgresBackend;
use crate::store::{enqueue, token_param};

/// SQLSTATE of `fence` (migration 8) when the lease is not the current one.
const FENCE_LEASE_LOST: &str = "JB001";
/// SQLSTATE of `fence` when the job does not exist.
const FENCE_NOT_FOUND: &str = "JB002";

impl PostgresBackend {
    /// Enqueues `job` inside the caller's transaction `tx` (CONTRACT §7, T1): the job
    /// exists if and only if `tx` commits, and idle workers are woken at that commit,
    /// never for a rollback (T2). Checked as [`durq_core::Store::enqueue`] checks it:
    /// bad input is refused, writes nothing and leaves `tx` usable.
    ///
    /// An idempotency key holds across transactions (E2–E6, E10): a transaction
    /// enqueueing a key that another, uncommitted one holds waits for that one to end,
    /// then answers with its job if it committed. Under `REPEATABLE READ` or
    /// `SERIALIZABLE`, that wait can end in a serialization failure instead; run the
    /// transaction again, as PostgreSQL asks.
    ///
    /// ```no_run
    /// # async fn example(store: durq_postgres::PostgresBackend) -> Result<(), Box<dyn std::error::Error>> {
    /// use durq_core::NewJob;
    ///
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// store.enqueue_in(&mut tx, NewJob::new("emails").payload("order 42")).await?;
    /// tx.commit().await?; // the order and its job, or neither
    /// # Ok(())
    /// # }
    /// ```
    pub async fn enqueue_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        job: NewJob,
    ) -> Result<Enqueued> {
        let (job, now) = prepare_enqueue(self.settings(), job)?;
        let answers = enqueue::enqueue_in(
            self.shared(),
            self.settings(),
            tx,
            std::slice::from_ref(&job),
            now,
        )
        .await?;
        answers
            .into_iter()
            .next()
            .ok_or_else(|| Error::corrupt("enqueue", "no answer for the job"))
    }

    /// Enqueues `jobs` inside the caller's transaction `tx`, as
    /// [`durq_core::Store::enqueue_batch`] does (E9) and with the guarantees of
    /// [`PostgresBackend::enqueue_in`]. A refused batch (an invalid job, a parent that
    /// does not exist) writes none of its jobs and leaves `tx` usable.
    pub async fn enqueue_batch_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<Enqueued>> {
        let (jobs, now) = prepare_batch(self.settings(), jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        enqueue::enqueue_in(self.shared(), self.settings(), tx, &jobs, now).await
    }

    /// Completes job `id` under lease `token` inside the caller's transaction `tx`
    /// (CONTRACT §7, T3), storing `result`: the handler's writes in `tx` and the
    /// completion commit together or not at all. The job's row stays locked until `tx`
    /// ends, so no reclaim can take the job back in between.
    ///
    /// A stale token (the lease was reclaimed, or the job is no longer running) answers
    /// [`Error::LeaseLost`], a job that does not exist [`Error::NotFound`], and either
    /// way **aborts `tx`**: PostgreSQL refuses its later statements, and its commit
    /// rolls back, so none of its writes land beside a completion that did not happen.
    /// A result over `max_payload_bytes` is refused before anything is sent, leaving
    /// `tx` usable.
    ///
    /// Return the [`FencedCompletion`] from the handler once `tx` has committed; the
    /// worker then records nothing more for the job.
    pub async fn complete_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<FencedCompletion> {
        let now = prepare_complete(self.settings(), result.as_ref())?;
        let shared = self.shared();
        let done = sqlx::query(shared.sql.complete_in.sql())
            .bind(&self.settings().namespace)
            .bind(Uuid::from(id))
            .bind(token_param(token))
            .bind(result.as_deref())
            .bind(now.as_millis())
            .execute(&mut **tx)
            .await;
        match done {
            Ok(_) => Ok(FencedCompletion::new(id, token)),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(FENCE_LEASE_LOST) => {
                Err(Error::LeaseLost { id })
            }
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(FENCE_NOT_FOUND) => {
                Err(Error::NotFound { id })
            }
            Err(err) => Err(shared.error("complete in a transaction", err)),
        }
    }
}
