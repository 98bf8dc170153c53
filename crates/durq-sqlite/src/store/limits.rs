//! Flow control (CONTRACT K1–K3): each queue's limits, and the claim of a queue that
//! has some.
//!
//! A claim runs inside the one write transaction, so the running jobs it counts cannot
//! change under it: counting and leasing are one step, across every connection and
//! process of the file. A queue without limits is claimed as before; only its limits
//! row is looked up.

use std::collections::HashMap;

use super::*;

/// Rule K3: stores `queue`'s limits; unlimited ones delete its row. Wakes the claimers
/// waiting here, since jobs the old limits held back may be admitted now.
pub(crate) fn set_limits(
    tx: &mut WriteTx<'_>,
    ns: i64,
    queue: &str,
    limits: QueueLimits,
) -> Result<()> {
    let conn = tx.conn();
    if limits.is_unlimited() {
        conn.prepare_cached("DELETE FROM jobq_limits WHERE ns = ?1 AND queue = ?2")
            .and_then(|mut stmt| stmt.execute(params![ns, queue]))
            .db("remove a queue's limits")?;
    } else {
        conn.prepare_cached(
            "INSERT INTO jobq_limits (ns, queue, max_running, max_running_per_key)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (ns, queue) DO UPDATE SET max_running = excluded.max_running,
                 max_running_per_key = excluded.max_running_per_key",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                ns,
                queue,
                limits.max_running,
                limits.max_running_per_key
            ])
        })
        .db("store a queue's limits")?;
    }
    tx.wake(ns);
    Ok(())
}

/// Rule K3: every queue's limits, by name.
pub(crate) fn all_limits(conn: &Connection, ns: i64) -> Result<Vec<(String, QueueLimits)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT queue, max_running, max_running_per_key FROM jobq_limits
             WHERE ns = ?1 ORDER BY queue",
        )
        .db("prepare the limits")?;
    let mut rows = stmt.query([ns]).db("read the limits")?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db("read the limits")? {
        let queue: String = row.get(0).db("read the limits")?;
        let limits = limits_from(&queue, row.get(1), row.get(2))?;
        out.push((queue, limits));
    }
    Ok(out)
}

/// Limits as stored, checked: a limit that is not a positive `u32` is a corrupt row.
pub(super) fn limits_from(
    queue: &str,
    max_running: rusqlite::Result<Option<i64>>,
    per_key: rusqlite::Result<Option<i64>>,
) -> Result<QueueLimits> {
    let read = |field: &str, value: rusqlite::Result<Option<i64>>| -> Result<Option<u32>> {
        match value.db("read a queue's limits")? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .map(Some)
                .ok_or_else(|| {
                    Error::corrupt(format!("limits of queue {queue}"), format!("{field} {n}"))
                }),
        }
    };
    let mut limits = QueueLimits::new();
    if let Some(n) = read("max_running", max_running)? {
        limits = limits.max_running(n);
    }
    if let Some(n) = read("max_running_per_key", per_key)? {
        limits = limits.max_running_per_key(n);
    }
    Ok(limits)
}

/// What one claim may still take of one queue with limits: the running jobs it counted
/// (in all, and per key as it meets them) and those it took (K1, K2 count both).
pub(super) struct Admission {
    limits: QueueLimits,
    running: u64,
    by_key: HashMap<String, u64>,
}

impl Admission {
    /// The queue's admission at the start of a claim: its running jobs counted when it
    /// has a limit on them.
    pub(super) fn start(
        conn: &Connection,
        ns: i64,
        queue: &str,
        limits: QueueLimits,
    ) -> Result<Self> {
        let running = if limits.max_running.is_some() {
            conn.prepare_cached(
                "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
                 WHERE ns = ?1 AND queue = ?2 AND state = 1",
            )
            .and_then(|mut stmt| stmt.query_row(params![ns, queue], |row| row.get::<_, i64>(0)))
            .db("count a queue's running jobs")?
        } else {
            0
        };
        Ok(Admission {
            limits,
            running: u64::try_from(running).unwrap_or(0),
            by_key: HashMap::new(),
        })
    }

    /// Whether the queue admits no job at all now (K2).
    pub(super) fn queue_full(&self) -> bool {
        !self.limits.admits_queue(self.running)
    }

    /// Whether a job with concurrency key `key` may be taken; if so, counts it.
    pub(super) fn take(
        &mut self,
        conn: &Connection,
        ns: i64,
        queue: &str,
        key: Option<&str>,
    ) -> Result<bool> {
        if self.queue_full() {
            return Ok(false);
        }
        if let Some(key) = key.filter(|_| self.limits.max_running_per_key.is_some()) {
            let count = match self.by_key.get_mut(key) {
                Some(count) => count,
                None => {
                    let running: i64 = conn
                        .prepare_cached(
                            "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_running_key
                             WHERE ns = ?1 AND queue = ?2 AND concurrency_key = ?3
                                 AND state = 1 AND concurrency_key IS NOT NULL",
                        )
                        .and_then(|mut stmt| {
                            stmt.query_row(params![ns, queue, key], |row| row.get(0))
                        })
                        .db("count a key's running jobs")?;
                    self.by_key
                        .entry(key.to_owned())
                        .or_insert(u64::try_from(running).unwrap_or(0))
                }
            };
            if !self.limits.admits_key(*count) {
                return Ok(false);
            }
            *count += 1;
        }
        self.running += 1;
        Ok(true)
    }
}
