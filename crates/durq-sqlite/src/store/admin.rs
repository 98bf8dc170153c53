//! Operator actions (CONTRACT A1, A2, Q1) and the test hooks that change rows directly.

use super::*;

pub(super) fn current_state(conn: &Connection, ns: i64, id: JobId) -> Result<(i64, JobState)> {
    let found: Option<(i64, i64)> = conn
        .prepare_cached("SELECT job, state FROM jobq_jobs WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
        })
        .db("read the job state")?;
    let (row, code) = found.ok_or(Error::NotFound { id })?;
    let state = state_from_code(code)
        .ok_or_else(|| Error::corrupt(format!("job {id}"), format!("state {code}")))?;
    Ok((row, state))
}

/// Rule A1.
pub(crate) fn cancel(tx: &mut WriteTx<'_>, ns: i64, id: JobId, now: Timestamp) -> Result<JobState> {
    let (row, state) = current_state(tx.conn(), ns, id)?;
    match state {
        JobState::Queued | JobState::Waiting => {
            finish(tx, row, CANCELLED, None, now)?;
            Ok(JobState::Cancelled)
        }
        JobState::Running => {
            tx.conn()
                .prepare_cached("UPDATE jobq_jobs SET cancel_requested = 1 WHERE job = ?1")
                .and_then(|mut stmt| stmt.execute([row]))
                .db("request cancellation")?;
            Ok(JobState::Running)
        }
        terminal => Ok(terminal),
    }
}

/// Rule A2.
pub(crate) fn retry(tx: &mut WriteTx<'_>, ns: i64, id: JobId, now: Timestamp) -> Result<()> {
    let (row, state) = current_state(tx.conn(), ns, id)?;
    if !matches!(state, JobState::Dead | JobState::Cancelled) {
        return Err(Error::InvalidState {
            id,
            state,
            operation: "retry",
        });
    }
    queue_again(tx, ns, row, Reopen::No, now)
}

/// Whether [`queue_again`] reopens the job from a step (CONTRACT D3), moving its
/// generation up by one, or retries it (A2), leaving the generation as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reopen {
    /// An operator's retry (A2).
    No,
    /// A reopen from a step (D3).
    Yes,
}

/// Queues ended job row `row` of namespace `ns` again as an operator's retry does
/// (A2), ready at `now` behind the jobs already queued: attempts 0, its result, error,
/// finish and lease cleared, its cancellation request dropped. A reopen (D3) also
/// moves its generation up by one, in the same statement. Wakes the namespace's
/// claimers once the transaction commits.
///
/// The one statement both `retry` and `retry_from` run, so a reopened job is queued
/// exactly as a retried one, and a change to how A2 queues a job changes both.
pub(super) fn queue_again(
    tx: &mut WriteTx<'_>,
    ns: i64,
    row: i64,
    reopen: Reopen,
    now: Timestamp,
) -> Result<()> {
    let seq = tx.next_seq()?;
    let generations = i64::from(reopen == Reopen::Yes);
    tx.conn()
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = 0, run_at = ?2, seq = ?3, attempts = 0,
                     cancel_requested = 0, finished_at = NULL, result = NULL,
                     lease_worker = NULL, lease_expires_at = NULL, started_at = NULL,
                     heartbeat_at = NULL, last_error = NULL, generation = generation + ?4, ",
            events_stamp!("2"),
            " WHERE job = ?1"
        ))
        .and_then(|mut stmt| stmt.execute(params![row, now.as_millis(), seq, generations]))
        .db("queue the job again")?;
    tx.wake(ns);
    Ok(())
}

/// Deletes every job of namespace `ns` with its payload, attempts and steps, and its
/// idempotency records, dependencies, pauses, schedules, workers and event stream (with
/// its trim record).
/// The namespace's row stays, so its id is never reused (see
/// `SqliteBackend::drop_namespace`).
pub(crate) fn drop_namespace(tx: &mut WriteTx<'_>, ns: i64) -> Result<u64> {
    let conn = tx.conn();
    let exec = |sql: &str, what: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([ns]))
            .db(what)
    };
    // Payloads first: they are found through the job rows.
    exec(
        "DELETE FROM jobq_payloads WHERE job IN (SELECT job FROM jobq_jobs WHERE ns = ?1)",
        "delete the namespace's payloads",
    )?;
    let jobs = exec(
        "DELETE FROM jobq_jobs WHERE ns = ?1",
        "delete the namespace's jobs",
    )?;
    exec(
        "DELETE FROM jobq_attempts WHERE ns = ?1",
        "delete the namespace's attempts",
    )?;
    exec(
        "DELETE FROM jobq_dedup WHERE ns = ?1",
        "delete the namespace's idempotency records",
    )?;
    exec(
        "DELETE FROM jobq_dependencies WHERE ns = ?1",
        "delete the namespace's dependencies",
    )?;
    exec(
        "DELETE FROM jobq_paused WHERE ns = ?1",
        "delete the namespace's pauses",
    )?;
    exec(
        "DELETE FROM jobq_schedules WHERE ns = ?1",
        "delete the namespace's schedules",
    )?;
    exec(
        "DELETE FROM jobq_workers WHERE ns = ?1",
        "delete the namespace's workers",
    )?;
    exec(
        "DELETE FROM jobq_steps WHERE ns = ?1",
        "delete the namespace's steps",
    )?;
    events::drop_events(conn, ns)?;
    Ok(u64::try_from(jobs).unwrap_or(u64::MAX))
}

/// Deletes a job's record, payload, attempts and steps but keeps its idempotency
/// record: a lost record, for testing C7 and R5.
#[cfg(feature = "testing")]
pub(crate) fn vanish(tx: &mut WriteTx<'_>, ns: i64, id: JobId) -> Result<()> {
    let (row, _) = current_state(tx.conn(), ns, id)?;
    let id = id.to_bytes();
    delete_record(tx.conn(), ns, row, &id)?;
    steps::delete_steps_of(tx.conn(), ns, &id)
}

/// Rule Q1: pauses or resumes `queue`; a resume wakes the claimers waiting here.
pub(crate) fn set_paused(tx: &mut WriteTx<'_>, ns: i64, queue: &str, paused: bool) -> Result<()> {
    let conn = tx.conn();
    let was = conn
        .prepare_cached("SELECT 1 FROM jobq_paused WHERE ns = ?1 AND queue = ?2")
        .and_then(|mut stmt| stmt.exists(params![ns, queue]))
        .db("check a pause")?;
    let sql = if paused {
        "INSERT OR IGNORE INTO jobq_paused (ns, queue) VALUES (?1, ?2)"
    } else {
        "DELETE FROM jobq_paused WHERE ns = ?1 AND queue = ?2"
    };
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params![ns, queue]))
        .db("pause or resume a queue")?;
    if was && !paused {
        tx.wake(ns);
    }
    Ok(())
}

/// Rule Q1: the paused queues, by name.
pub(crate) fn paused_queues(conn: &Connection, ns: i64) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached("SELECT queue FROM jobq_paused WHERE ns = ?1 ORDER BY queue")
        .db("prepare the paused queues")?;
    let rows = stmt
        .query_map([ns], |row| row.get(0))
        .db("read the paused queues")?;
    rows.collect::<rusqlite::Result<Vec<String>>>()
        .db("read the paused queues")
}
