//! Durable steps (CONTRACT D1–D4): `save_step`, one statement; `steps`, one statement;
//! `retry_from`, one transaction of two. The statements are in `sql/steps.rs`, the
//! table in migration 14.

use durq_core::steps::{not_saved, too_many_steps, SavedStep, StepLog, MAX_STEPS};

use super::*;

/// A generation as stored: a `bigint` the reopens count up from 0, so never negative.
fn generation(row: &PgRow, index: usize, id: JobId) -> Result<u64> {
    let stored: i64 = column(row, index, &|| format!("job {id}"))?;
    u64::try_from(stored)
        .map_err(|_| Error::corrupt(format!("job {id}"), format!("generation is {stored}")))
}

/// Rule D2: the job's generation and its steps, oldest first, read in one statement.
pub(crate) async fn steps(store: &PostgresBackend, id: JobId) -> Result<StepLog> {
    // A read: sent again if the connection broke.
    let rows = store
        .shared()
        .fetch_all_again("steps", |_| {
            sqlx::query(store.sql().steps.steps.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
        })
        .await?;
    // Every row repeats the job's generation; none means no such job.
    let Some(first) = rows.first() else {
        return Err(Error::NotFound { id });
    };
    let generation = generation(first, 0, id)?;
    let what = || format!("step of job {id}");
    let mut steps = Vec::with_capacity(rows.len());
    for row in &rows {
        // The left join's NULLs: the job has saved no step.
        let Some(name) = column::<Option<String>>(row, 1, &what)? else {
            continue;
        };
        let output: Vec<u8> = column(row, 2, &what)?;
        let saved_at: i64 = column(row, 3, &what)?;
        steps.push(SavedStep {
            name,
            output: Bytes::from(output),
            saved_at: Timestamp::from_millis(saved_at),
        });
    }
    Ok(StepLog { generation, steps })
}

/// Rule D1: one statement, one round trip, whatever it answers.
pub(crate) async fn save_step(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    name: &str,
    output: Bytes,
    now: Timestamp,
) -> Result<()> {
    // Sent again if the connection broke: a first run that committed unseen saved the
    // step, and the second finds it saved and keeps it, as a second save does (D1).
    let row = store
        .fetch_optional_again("save_step", || {
            sqlx::query(store.sql().steps.save.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
                .bind(token_param(token))
                .bind(name)
                .bind(output.as_ref())
                .bind(now.as_millis())
                .bind(limit_param(MAX_STEPS))
        })
        .await?
        .ok_or_else(|| Error::corrupt("save_step", "no result row"))?;
    let what = || format!("job {id}");
    let held: bool = column(&row, 0, &what)?;
    let fits: bool = column(&row, 1, &what)?;
    let found: bool = column(&row, 2, &what)?;
    // As a completion answers (L2, L3): the lease lost, or the job unknown.
    match (held, fits, found) {
        (true, true, _) => Ok(()),
        (true, false, _) => Err(too_many_steps()),
        (false, _, true) => Err(Error::LeaseLost { id }),
        (false, _, false) => Err(Error::NotFound { id }),
    }
}

/// Rule D3, refused in the order `NotFound`, `InvalidState`, `StaleGeneration`, then a
/// step not saved; each refusal writes nothing (the transaction is rolled back).
///
/// One transaction: the first statement locks the job's row and reads it, the second
/// (with a snapshot of its own, taken under the lock) cuts the steps, moves the
/// generation and queues the job. Of concurrent reopens the row lock lets one through;
/// the others, once it commits, read the job queued (D4).
pub(crate) async fn retry_from(
    store: &PostgresBackend,
    id: JobId,
    step: &str,
    expected: u64,
    now: Timestamp,
) -> Result<()> {
    let shared = store.shared();
    // Sent once: a second run after a first that committed unseen would refuse the job
    // as queued, as `retry` would.
    let mut tx = shared.begin("retry_from: begin").await?;
    let queue = match reopen(store, &mut tx, id, step, expected, now).await {
        Ok(queue) => queue,
        Err(refused) => {
            // Rolled back before the refusal is answered: a transaction only dropped
            // is rolled back when sqlx's pool next pings its connection, in a task of
            // its own, and until then it holds the job's row lock, so a claim made
            // right after the answer skipped the queued job (`SKIP LOCKED`; the
            // reopen races of tests/postgres met it). A rollback that fails leaves it
            // to the drop.
            if let Err(err) = tx.rollback().await {
                tracing::debug!(error = %err, "retry_from: rollback of a refusal");
            }
            return Err(refused);
        }
    };
    tx.commit()
        .await
        .map_err(|err| shared.error("retry_from: commit", err))?;
    // Claimers waiting on the queue look again, as after a retry (A2).
    shared.wake.announce(store.namespace(), [queue.as_str()]);
    Ok(())
}

/// The two statements of [`retry_from`] on `tx`: the job's queue once it is reopened,
/// or the refusal.
async fn reopen(
    store: &PostgresBackend,
    tx: &mut sqlx::PgConnection,
    id: JobId,
    step: &str,
    expected: u64,
    now: Timestamp,
) -> Result<String> {
    let shared = store.shared();
    let locked = sqlx::query(store.sql().steps.lock_for_reopen.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| shared.error("retry_from: lock the job", err))?;
    let Some(locked) = locked else {
        return Err(Error::NotFound { id });
    };
    let state = row::state(&locked, 0, &|| format!("job {id}"))?;
    if !state.is_terminal() {
        return Err(Error::InvalidState {
            id,
            state,
            operation: "retry_from",
        });
    }
    let current = generation(&locked, 1, id)?;
    if current != expected {
        return Err(Error::StaleGeneration {
            id,
            expected,
            current,
        });
    }
    let reopened = sqlx::query(store.sql().steps.reopen.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .bind(now.as_millis())
        .bind(step)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|err| shared.error("retry_from: reopen", err))?;
    let Some(reopened) = reopened else {
        return Err(not_saved(step));
    };
    column(&reopened, 0, &|| format!("job {id}"))
}
