//! Housekeeping: reclaim of expired leases (CONTRACT R1–R6) and purge after retention.

use super::*;

/// Rules R1–R6: only the expired leases are read, through the lease index. Each ends
/// its attempt as expired (H2).
pub(crate) fn reclaim(
    tx: &mut WriteTx<'_>,
    ns: i64,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<ReclaimedJob>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let expired: Vec<(i64, [u8; 16], i64, i64, i64, i64)> = tx
        .conn()
        .prepare_cached(
            "SELECT job, id, attempts, max_attempts, cancel_requested, lease_token
             FROM jobq_jobs INDEXED BY jobq_jobs_lease
             WHERE ns = ?1 AND state = 1 AND lease_expires_at < ?2
             ORDER BY lease_expires_at LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![ns, now.as_millis(), limit], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })?
            .collect()
        })
        .db("find expired leases")?;
    // Every row is read and checked before the first write, so a corrupt one refuses
    // the whole reclaim without leaving part of it done.
    let expired = expired
        .into_iter()
        .map(|(row, id, attempts, max_attempts, cancel, token)| {
            let id = id_from_blob("job id", id)?;
            // A negative token was never issued: like a missing worker, the attempt
            // cannot be described, and the reclaim goes on without recording it.
            let token = u64::try_from(token).ok().map(LeaseToken::new);
            Ok((
                row,
                id,
                attempts_from_row(id, attempts, max_attempts, cancel)?,
                token,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut reclaimed = Vec::with_capacity(expired.len());
    for (row, id, attempts, token) in expired {
        if let Some(token) = token {
            record_attempt(
                tx.conn(),
                row,
                token,
                AttemptOutcome::Expired,
                Some(LEASE_EXPIRED),
                now,
            )?;
        }
        let next = transition::after_lease_expired(attempts, now);
        let state = apply(tx, ns, row, next, 0, Some(LEASE_EXPIRED), now)?;
        reclaimed.push(ReclaimedJob { id, state });
    }
    limits::forget_old_starts(tx.conn(), ns, now)?;
    Ok(reclaimed)
}

/// Rule A5: deletes terminal jobs that finished at or before `cutoff` with their
/// payloads, their attempts (H4), their steps (D1) and the idempotency records that
/// point at them.
pub(crate) fn purge(tx: &mut WriteTx<'_>, ns: i64, limit: usize, cutoff: Timestamp) -> Result<u64> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let conn = tx.conn();
    let due: Vec<(i64, Vec<u8>, String, Option<String>)> = conn
        .prepare_cached(
            "SELECT job, id, tenant, idem_key FROM jobq_jobs INDEXED BY jobq_jobs_finished
             WHERE ns = ?1 AND finished_at IS NOT NULL AND finished_at <= ?2
             ORDER BY finished_at LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![ns, cutoff.as_millis(), limit], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
        })
        .db("find jobs past retention")?;
    if due.is_empty() {
        return Ok(0);
    }
    // The batch's steps in one statement, whatever the number of jobs: most purged jobs
    // saved none, and a statement per job would be paid for each of them. An id that is
    // not 16 bytes (a row damaged outside this crate) would shift every id after it in
    // the concatenation; no step is stored under such an id, so it is left out.
    let ids: Vec<u8> = due
        .iter()
        .filter(|(_, id, _, _)| id.len() == 16)
        .flat_map(|(_, id, _, _)| id.iter().copied())
        .collect();
    steps::delete_steps_of(conn, ns, &ids)?;
    let mut deleted = 0u64;
    for (row, id, tenant, key) in due {
        delete_record(conn, ns, row, &id)?;
        if let Some(key) = key {
            conn.prepare_cached(
                "DELETE FROM jobq_dedup
                 WHERE ns = ?1 AND tenant = ?2 AND key = ?3 AND job_id = ?4",
            )
            .and_then(|mut stmt| stmt.execute(params![ns, tenant, key, id]))
            .db("delete the idempotency record")?;
        }
        deleted += 1;
    }
    Ok(deleted)
}

/// Deletes job row `row` (of id blob `id`) with its payload and its attempts.
pub(super) fn delete_record(conn: &Connection, ns: i64, row: i64, id: &[u8]) -> Result<()> {
    conn.prepare_cached("DELETE FROM jobq_jobs WHERE job = ?1")
        .and_then(|mut stmt| stmt.execute([row]))
        .db("delete the job")?;
    conn.prepare_cached("DELETE FROM jobq_payloads WHERE job = ?1")
        .and_then(|mut stmt| stmt.execute([row]))
        .db("delete the payload")?;
    conn.prepare_cached("DELETE FROM jobq_attempts WHERE ns = ?1 AND job_id = ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, id]))
        .db("delete the attempts")?;
    Ok(())
}
