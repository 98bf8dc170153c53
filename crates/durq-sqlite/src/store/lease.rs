//! The lease calls (CONTRACT L1–L10, H1–H4): heartbeat, complete, fail, release, and the
//! state changes they share with reclaim and the operator's actions.

use super::*;

/// The parts of a job that the lease calls decide on.
pub(super) struct LeaseRow {
    row: i64,
    attempts: Attempts,
}

/// The counters [`transition`] decides on, read from a row; out-of-range values are a
/// corrupt record, found before anything is written.
pub(super) fn attempts_from_row(
    id: JobId,
    taken: i64,
    max: i64,
    cancel_requested: i64,
) -> Result<Attempts> {
    let counter = |field: &str, value: i64| {
        u32::try_from(value).map_err(|_| {
            Error::corrupt(
                format!("job {id}"),
                format!("{field} holds {value}, out of range"),
            )
        })
    };
    Ok(Attempts {
        cancel_requested: cancel_requested != 0,
        taken: counter("attempts", taken)?,
        max: counter("max_attempts", max)?,
    })
}

/// L2, L3: the job must exist (else not found), be running, and carry `token` (else
/// lease lost).
pub(super) fn check_lease(
    conn: &Connection,
    ns: i64,
    id: JobId,
    token: LeaseToken,
) -> Result<LeaseRow> {
    let found: Option<(i64, i64, i64, i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT job, state, lease_token, attempts, max_attempts, cancel_requested
             FROM jobq_jobs WHERE ns = ?1 AND id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })
            .optional()
        })
        .db("read the lease")?;
    let Some((row, state, current, attempts, max_attempts, cancel)) = found else {
        return Err(Error::NotFound { id });
    };
    if state != RUNNING || token_value(token) != Some(current) {
        return Err(Error::LeaseLost { id });
    }
    Ok(LeaseRow {
        row,
        attempts: attempts_from_row(id, attempts, max_attempts, cancel)?,
    })
}

/// Rule L1.
pub(crate) fn heartbeat(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    ttl: Duration,
    now: Timestamp,
) -> Result<Heartbeat> {
    let conn = tx.conn();
    let lease = check_lease(conn, ns, id, token)?;
    let expires_at = now.saturating_add(ttl);
    conn.prepare_cached(
        "UPDATE jobq_jobs SET lease_expires_at = ?2, heartbeat_at = ?3 WHERE job = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![lease.row, expires_at.as_millis(), now.as_millis()]))
    .db("extend the lease")?;
    Ok(Heartbeat {
        cancel_requested: lease.attempts.cancel_requested,
        expires_at,
    })
}

/// Rules L4, L5. The lease's worker and token stay on the row (only its expiry goes):
/// with `started_at` and `finished_at` they are the succeeded attempt (CONTRACT H2),
/// so a completion writes no attempt record. `Job::lease` is read only for a running
/// row, so the job shows no lease.
pub(crate) fn complete(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    result: Option<&[u8]>,
    now: Timestamp,
) -> Result<()> {
    Completer::new(tx)?.complete(ns, id, token, result, now)
}

/// The completion statement, prepared once for a batch of completions.
pub(crate) struct Completer<'t, 'c> {
    tx: &'t WriteTx<'c>,
    update: CachedStatement<'c>,
}

impl<'t, 'c> Completer<'t, 'c> {
    /// Prepares the statement on the write transaction's connection.
    pub(crate) fn new(tx: &'t WriteTx<'c>) -> Result<Self> {
        // The lease check is the UPDATE's own condition: one index seek and one write
        // per job. Only a completion that changes nothing reads the row again, to say
        // whether the job is gone or its lease is, or, when its lease is current, to
        // complete a job others wait for (G1), which has jobs to settle.
        let update = tx
            .conn()
            .prepare_cached(concat!(
                "UPDATE OR FAIL jobq_jobs SET state = 2, result = ?4, lease_expires_at = NULL,
                         finished_at = ?5, last_error = NULL, ",
                events_stamp!("5"),
                " WHERE ns = ?1 AND id = ?2 AND state = 1 AND lease_token = ?3
                         AND has_dependents IS NULL"
            ))
            .db("prepare the completion")?;
        Ok(Completer { tx, update })
    }

    /// Completes job `id` if `token` is its current lease (L2, L3, L4).
    pub(crate) fn complete(
        &mut self,
        ns: i64,
        id: JobId,
        token: LeaseToken,
        result: Option<&[u8]>,
        now: Timestamp,
    ) -> Result<()> {
        let conn = self.tx.conn();
        let Some(token_value) = token_value(token) else {
            // Never issued: no row can carry it.
            check_lease(conn, ns, id, token)?;
            return Err(Error::LeaseLost { id });
        };
        let changed = self
            .update
            .execute(params![
                ns,
                id.to_bytes(),
                token_value,
                result,
                now.as_millis()
            ])
            .db("complete the job")?;
        if changed == 0 {
            // The row is not running under this token (the check says which refusal),
            // or it is, and jobs wait for it.
            let lease = check_lease(conn, ns, id, token)?;
            conn.prepare_cached(concat!(
                "UPDATE OR FAIL jobq_jobs SET state = 2, result = ?2, lease_expires_at = NULL,
                         finished_at = ?3, last_error = NULL, ",
                events_stamp!("3"),
                " WHERE job = ?1"
            ))
            .and_then(|mut stmt| stmt.execute(params![lease.row, result, now.as_millis()]))
            .db("complete the job")?;
            graph::settle(self.tx, ns, id, JobState::Succeeded, now)?;
        }
        self.tx.ended();
        Ok(())
    }
}

/// Ends a job for good: `succeeded` is set by [`complete`]; this is `dead` or
/// `cancelled`, with the lease cleared and `last_error` set when given, and the jobs
/// waiting for it settled (G3) in the same transaction.
pub(super) fn finish(
    tx: &WriteTx<'_>,
    row: i64,
    state: i64,
    error: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let ended: Option<(i64, [u8; 16], Option<i64>)> = tx
        .conn()
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = ?2, lease_worker = NULL,
                     lease_expires_at = NULL, finished_at = ?3,
                     last_error = COALESCE(?4, last_error), waiting_for = NULL, ",
            events_stamp!("3"),
            " WHERE job = ?1
                 RETURNING ns, id, has_dependents"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![row, state, now.as_millis(), error], |found| {
                Ok((found.get(0)?, found.get(1)?, found.get(2)?))
            })
            .optional()
        })
        .db("finish the job")?;
    if ended.is_some() {
        tx.ended();
    }
    if let Some((ns, id, Some(_))) = ended {
        let id = id_from_blob("job id", id)?;
        let state = state_from_code(state)
            .ok_or_else(|| Error::corrupt(format!("job {id}"), format!("state {state}")))?;
        graph::settle(tx, ns, id, state, now)?;
    }
    Ok(())
}

/// Puts a job back in `queued`, ready at `run_at`, behind every job already there
/// (a fresh `seq`), at `now`. `attempts_delta` takes back an attempt on release (L8),
/// never below 0.
pub(super) fn requeue(
    tx: &mut WriteTx<'_>,
    ns: i64,
    row: i64,
    run_at: Timestamp,
    attempts_delta: i64,
    error: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let seq = tx.next_seq()?;
    tx.conn()
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = 0, run_at = ?2, seq = ?3,
                     attempts = CASE WHEN attempts + ?4 > 0 THEN attempts + ?4 ELSE 0 END,
                     lease_worker = NULL, lease_expires_at = NULL,
                     last_error = COALESCE(?5, last_error), ",
            events_stamp!("6"),
            " WHERE job = ?1"
        ))
        .and_then(|mut stmt| {
            stmt.execute(params![
                row,
                run_at.as_millis(),
                seq,
                attempts_delta,
                error,
                now.as_millis()
            ])
        })
        .db("requeue the job")?;
    tx.wake(ns);
    Ok(())
}

/// Moves a job whose attempt ended to where `next` says; `attempts_delta` is added to
/// its attempts if it is queued again.
pub(super) fn apply(
    tx: &mut WriteTx<'_>,
    ns: i64,
    row: i64,
    next: Next,
    attempts_delta: i64,
    error: Option<&str>,
    now: Timestamp,
) -> Result<JobState> {
    match next {
        Next::Queued { ready_at } => requeue(tx, ns, row, ready_at, attempts_delta, error, now)?,
        Next::Finished(state) => finish(tx, row, state_code(state), error, now)?,
    }
    Ok(next.state())
}

/// Rules H2, H3: records how the attempt holding lease `token` of job row `row` ended,
/// in the job's slot for that token, overwriting the attempt `ATTEMPTS_KEPT` claims
/// older. One statement, run before the state change drops the lease: the worker and
/// the start are the row's own (`lease_worker`, `started_at`), so the caller reads
/// nothing more than it did. A running row without them (changed behind the store's
/// back) records nothing rather than refusing the call: `reclaim` would otherwise meet
/// it again and again, and the row's own reads report it as corrupt.
pub(super) fn record_attempt(
    conn: &Connection,
    row: i64,
    token: LeaseToken,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    // A slot is below ATTEMPTS_KEPT (32); a token past i64::MAX was never issued.
    let slot = i64::try_from(attempts::slot(token)).unwrap_or(0);
    let token = token_value(token).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT OR REPLACE INTO jobq_attempts
             (ns, job_id, slot, token, worker, started_at, ended_at, outcome, error)
         SELECT ns, id, ?2, ?3, lease_worker, started_at, ?4, ?5, ?6 FROM jobq_jobs
         WHERE job = ?1 AND lease_worker IS NOT NULL AND started_at IS NOT NULL",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            row,
            slot,
            token,
            now.as_millis(),
            outcome.as_str(),
            error.map(durq_core::validate::truncate_attempt_error)
        ])
    })
    .db("record the attempt")?;
    Ok(())
}

/// Rules L6, L7, and a cancellation asked for while the job ran (CONTRACT A1). The
/// attempt ends failed with `error` whatever the job becomes (H2).
pub(crate) fn fail(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    error: &str,
    retry: Retry,
    now: Timestamp,
) -> Result<JobState> {
    let lease = check_lease(tx.conn(), ns, id, token)?;
    let next = transition::after_failure(lease.attempts, retry);
    record_attempt(
        tx.conn(),
        lease.row,
        token,
        AttemptOutcome::Failed,
        Some(error),
        now,
    )?;
    apply(tx, ns, lease.row, next, 0, Some(error), now)
}

/// Rules L8, L10: the attempt is given back if the job is queued again; its record
/// says released (H2), snoozes included.
pub(crate) fn release(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    ready_at: Timestamp,
    now: Timestamp,
) -> Result<()> {
    let lease = check_lease(tx.conn(), ns, id, token)?;
    let next = transition::after_release(lease.attempts.cancel_requested, ready_at);
    record_attempt(
        tx.conn(),
        lease.row,
        token,
        AttemptOutcome::Released,
        None,
        now,
    )?;
    apply(tx, ns, lease.row, next, -1, None, now).map(drop)
}
