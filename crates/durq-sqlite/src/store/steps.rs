//! Durable steps (CONTRACT D1–D4): the rows of `jobq_steps`, saved under a job's lease,
//! read back in save order, and cut by a reopen that moves the job's `generation`.
//!
//! A job's steps are keyed by its id and die with its record: purge (`sweep.rs`),
//! `drop_namespace` and the `vanish` test hook (`admin.rs`) delete them through
//! [`delete_steps_of`] or by namespace.

use durq_core::steps::{not_saved, too_many_steps, SavedStep, StepLog, MAX_STEPS};

use super::admin::{queue_again, Reopen};
use super::*;

/// A `generation` as read from a row: never negative, since it only counts up from 0.
fn generation_from(id: JobId, raw: i64) -> Result<u64> {
    u64::try_from(raw).map_err(|_| {
        Error::corrupt(
            format!("job {id}"),
            format!("generation holds {raw}, out of range"),
        )
    })
}

/// Rule D2: the job's generation and its steps in save order, from one snapshot, so a
/// reopen committing meanwhile is seen whole or not at all. `NotFound` for an unknown
/// job; a value that cannot be read back is a corrupt record.
pub(crate) fn step_log(conn: &Connection, ns: i64, id: JobId) -> Result<StepLog> {
    let job_id = id.to_bytes();
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let generation: Option<i64> = tx
        .prepare_cached("SELECT generation FROM jobq_jobs WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, job_id], |row| row.get(0))
                .optional()
        })
        .db("read the job's generation")?;
    let generation = generation_from(id, generation.ok_or(Error::NotFound { id })?)?;
    // Sorted here rather than by an ORDER BY: SQLite's sorter would copy every output
    // into its temporary b-tree, and an output may be as large as a payload.
    let mut saved: Vec<(i64, SavedStep)> = tx
        .prepare_cached(
            "SELECT step, name, output, saved_at FROM jobq_steps WHERE ns = ?1 AND job_id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![ns, job_id], |row| {
                Ok((
                    row.get(0)?,
                    SavedStep {
                        name: row.get(1)?,
                        output: Bytes::from(row.get::<_, Vec<u8>>(2)?),
                        saved_at: Timestamp::from_millis(row.get(3)?),
                    },
                ))
            })?
            .collect()
        })
        .db("read the job's steps")?;
    tx.finish().db("end a read")?;
    saved.sort_unstable_by_key(|(order, _)| *order);
    Ok(StepLog {
        generation,
        steps: saved.into_iter().map(|(_, step)| step).collect(),
    })
}

/// Rule D1: saves `output` as step `name` of job `id`, running under `token`. Every
/// check comes before the one write, so a refusal writes nothing: `NotFound` for an
/// unknown job and `LeaseLost` for a token that does not hold its lease, as every
/// lease call answers (`check_lease`); a name already saved in the generation is kept
/// as it is and the save succeeds; a new name past [`MAX_STEPS`] is refused.
pub(crate) fn save_step(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    name: &str,
    output: &[u8],
    now: Timestamp,
) -> Result<()> {
    let conn = tx.conn();
    check_lease(conn, ns, id, token)?;
    let job_id = id.to_bytes();
    let saved = conn
        .prepare_cached("SELECT 1 FROM jobq_steps WHERE ns = ?1 AND job_id = ?2 AND name = ?3")
        .and_then(|mut stmt| stmt.exists(params![ns, job_id, name]))
        .db("look the step up")?;
    if saved {
        // The first save of a name stands: a run after a crash may save again what an
        // earlier run saved, and must find the earlier output kept.
        return Ok(());
    }
    let count: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM jobq_steps WHERE ns = ?1 AND job_id = ?2")
        .and_then(|mut stmt| stmt.query_row(params![ns, job_id], |row| row.get(0)))
        .db("count the job's steps")?;
    if usize::try_from(count).map_or(true, |count| count >= MAX_STEPS) {
        return Err(too_many_steps());
    }
    conn.prepare_cached(
        "INSERT INTO jobq_steps (ns, job_id, name, output, saved_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, job_id, name, output, now.as_millis()]))
    .db("save the step")?;
    Ok(())
}

/// Rule D3: reopens ended job `id` from step `step` if its generation is still
/// `generation`, in the caller's one write transaction: the write lock held from its
/// `BEGIN IMMEDIATE` makes the generation's check and its move one atomic step, so of
/// concurrent reopens of one generation exactly one finds it (D4), whichever process
/// or connection they come from.
///
/// The checks come in the order `StepLog::reopened_from` makes them, after the state:
/// a job that has not ended (`InvalidState`), a generation it has left
/// (`StaleGeneration`), a step it has not saved in its generation (`step`). All come
/// before the first write, so a refusal writes nothing. Then `step` and every step
/// saved after it go, and the job is queued as `retry` queues it (A2), its generation
/// one more.
pub(crate) fn retry_from(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    step: &str,
    generation: u64,
    now: Timestamp,
) -> Result<()> {
    let conn = tx.conn();
    let job_id = id.to_bytes();
    let found: Option<(i64, i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT job, state, generation, lease_token FROM jobq_jobs
             WHERE ns = ?1 AND id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, job_id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .db("read the job to reopen")?;
    let (row, code, current, token) = found.ok_or(Error::NotFound { id })?;
    let state = state_from_code(code)
        .ok_or_else(|| Error::corrupt(format!("job {id}"), format!("state {code}")))?;
    if !matches!(
        state,
        JobState::Succeeded | JobState::Dead | JobState::Cancelled
    ) {
        return Err(Error::InvalidState {
            id,
            state,
            operation: "retry_from",
        });
    }
    let current = generation_from(id, current)?;
    if generation != current {
        return Err(Error::StaleGeneration {
            id,
            expected: generation,
            current,
        });
    }
    let from: Option<i64> = conn
        .prepare_cached("SELECT step FROM jobq_steps WHERE ns = ?1 AND job_id = ?2 AND name = ?3")
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, job_id, step], |row| row.get(0))
                .optional()
        })
        .db("look the step up")?;
    let from = from.ok_or_else(|| not_saved(step))?;

    if state == JobState::Succeeded {
        keep_succeeded_attempt(conn, row, token)?;
    }
    // Rowids grow with each save, so "saved after `step`" is "a larger rowid".
    conn.prepare_cached("DELETE FROM jobq_steps WHERE ns = ?1 AND job_id = ?2 AND step >= ?3")
        .and_then(|mut stmt| stmt.execute(params![ns, job_id, from]))
        .db("cut the steps")?;
    queue_again(tx, ns, row, Reopen::Yes, now)
}

/// Records the attempt that succeeded in job row `row` under lease token `token` in
/// `jobq_attempts`, before a reopen queues the job. A succeeded attempt lives only in
/// the job's own row (its lease worker, start and finish, which the completion left
/// there), and queueing the job clears them: without this record the reopen would drop
/// the attempt from the job's history, which a retry keeps (H3). Dead and cancelled
/// jobs need none: their last attempt was recorded when it ended. A row without the
/// fields of an attempt (a success from before version 7 kept no worker) records
/// nothing, as `attempts::history` would show nothing for it.
fn keep_succeeded_attempt(conn: &Connection, row: i64, token: i64) -> Result<()> {
    let Ok(token) = u64::try_from(token).map(LeaseToken::new) else {
        // Never issued: there is no attempt to keep, and `get` reports the row.
        return Ok(());
    };
    // A slot is below ATTEMPTS_KEPT (32).
    let slot = i64::try_from(attempts::slot(token)).unwrap_or(0);
    conn.prepare_cached(
        "INSERT OR REPLACE INTO jobq_attempts
             (ns, job_id, slot, token, worker, started_at, ended_at, outcome, error)
         SELECT ns, id, ?2, lease_token, lease_worker, started_at, finished_at, ?3, NULL
         FROM jobq_jobs
         WHERE job = ?1 AND lease_token > 0 AND lease_worker IS NOT NULL
             AND started_at IS NOT NULL AND finished_at IS NOT NULL",
    )
    .and_then(|mut stmt| stmt.execute(params![row, slot, AttemptOutcome::Succeeded.as_str()]))
    .db("keep the succeeded attempt")?;
    Ok(())
}

/// Deletes the steps of the jobs whose ids `ids` holds, 16 bytes each, concatenated,
/// in one statement whatever their number: the ids are split inside SQLite, and each
/// is one seek of the steps' unique index.
pub(super) fn delete_steps_of(conn: &Connection, ns: i64, ids: &[u8]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    conn.prepare_cached(
        "WITH RECURSIVE at(i) AS (
             SELECT 1 UNION ALL SELECT i + 16 FROM at WHERE i + 16 <= length(?2)
         )
         DELETE FROM jobq_steps
         WHERE ns = ?1 AND job_id IN (SELECT substr(?2, i, 16) FROM at)",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, ids]))
    .db("delete the jobs' steps")?;
    Ok(())
}
