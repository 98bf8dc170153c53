//! Flow control (CONTRACT K1–K4): each queue's limits, and the claim of a queue that
//! has some.
//!
//! A claim runs inside the one write transaction, so the running jobs and the starts
//! it counts cannot change under it: counting, leasing and logging the starts are one
//! step, across every connection and process of the file. A queue without limits is
//! claimed as before; only its limits row is looked up.

use std::collections::HashMap;

use durq_core::{ClaimedJob, FlowStatus, Rate, StoredLimits, FLOW_KEYS_SHOWN};

use super::*;

/// The columns of a limits row, in the order [`limits_from`] reads them.
pub(super) const LIMITS_COLUMNS: &str = "max_running, max_running_per_key, max_starts, \
     max_starts_ms, max_starts_per_key, max_starts_per_key_ms, fair_shares";

/// The key of a queue's own start log in `jobq_starts` (a concurrency key is never
/// empty, CONTRACT K1).
const QUEUE_LOG: &str = "";

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
        let stored = StoredLimits::from(limits);
        conn.prepare_cached(
            "INSERT INTO jobq_limits (ns, queue, max_running, max_running_per_key,
                 max_starts, max_starts_ms, max_starts_per_key, max_starts_per_key_ms,
                 fair_shares)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (ns, queue) DO UPDATE SET max_running = excluded.max_running,
                 max_running_per_key = excluded.max_running_per_key,
                 max_starts = excluded.max_starts, max_starts_ms = excluded.max_starts_ms,
                 max_starts_per_key = excluded.max_starts_per_key,
                 max_starts_per_key_ms = excluded.max_starts_per_key_ms,
                 fair_shares = excluded.fair_shares",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                ns,
                queue,
                stored.max_running,
                stored.max_running_per_key,
                stored.max_starts,
                stored.max_starts_ms,
                stored.max_starts_per_key,
                stored.max_starts_per_key_ms,
                stored.fair_shares,
            ])
        })
        .db("store a queue's limits")?;
    }
    if !limits.fair_shares {
        // Turns no claim reads any more.
        conn.prepare_cached("DELETE FROM jobq_turns WHERE ns = ?1 AND queue = ?2")
            .and_then(|mut stmt| stmt.execute(params![ns, queue]))
            .db("drop a queue's turns")?;
    }
    let (queue_rate_gone, key_rate_gone) = (
        limits.max_starts.is_none(),
        limits.max_starts_per_key.is_none(),
    );
    if queue_rate_gone || key_rate_gone {
        // Logs no rate reads any more: each rate taken away forgets its starts (K4).
        conn.prepare_cached(
            "DELETE FROM jobq_starts WHERE ns = ?1 AND queue = ?2
                 AND ((key = ?3 AND ?4) OR (key <> ?3 AND ?5))",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                ns,
                queue,
                QUEUE_LOG,
                queue_rate_gone,
                key_rate_gone
            ])
        })
        .db("drop a queue's start logs")?;
    }
    tx.wake(ns);
    Ok(())
}

/// Rule K3: every queue's limits, by name.
pub(crate) fn all_limits(conn: &Connection, ns: i64) -> Result<Vec<(String, QueueLimits)>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT queue, {LIMITS_COLUMNS} FROM jobq_limits WHERE ns = ?1 ORDER BY queue"
        ))
        .db("prepare the limits")?;
    let mut rows = stmt.query([ns]).db("read the limits")?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db("read the limits")? {
        let queue: String = row.get(0).db("read the limits")?;
        let limits = limits_from(&queue, row, 1)?;
        out.push((queue, limits));
    }
    Ok(out)
}

/// Limits as stored in [`LIMITS_COLUMNS`] from column `first` of `row` on, checked
/// ([`StoredLimits::into_limits`]).
pub(super) fn limits_from(queue: &str, row: &Row<'_>, first: usize) -> Result<QueueLimits> {
    StoredLimits::from_columns(
        |column| row.get(first + column).db("read a queue's limits"),
        row.get(first + 6).db("read a queue's limits")?,
    )?
    .into_limits(queue)
}

/// The starts of one log inside the window of a claim at `now` (CONTRACT K4), at most
/// `rate.starts` of them (more cannot change a verdict), and when the window admits a
/// start again if it is full: the instant its `rate.starts`-th newest start leaves it.
fn window(
    conn: &Connection,
    ns: i64,
    queue: &str,
    key: &str,
    rate: Rate,
    now: Timestamp,
) -> Result<(u64, Option<Timestamp>)> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT at FROM jobq_starts WHERE ns = ?1 AND queue = ?2 AND key = ?3 AND at > ?4
             ORDER BY at DESC LIMIT ?5",
        )
        .db("prepare the start log read")?;
    let mut rows = stmt
        .query(params![
            ns,
            queue,
            key,
            rate.window_opens_after(now).as_millis(),
            rate.starts
        ])
        .db("read a start log")?;
    let (mut count, mut oldest) = (0u64, None);
    while let Some(row) = rows.next().db("read a start log")? {
        count += 1;
        oldest = Some(Timestamp::from_millis(row.get(0).db("read a start log")?));
    }
    let frees_at = oldest
        .filter(|_| !rate.admits(count))
        .map(|at| rate.frees_at(at));
    Ok((count, frees_at))
}

/// Logs the starts of the jobs a claim leased, for the queues with a rate (K4), and
/// trims what left their windows. `open` are the claim's queues with their limits.
pub(super) fn record_starts(
    conn: &Connection,
    ns: i64,
    open: &[(&str, Option<QueueLimits>)],
    claimed: &[ClaimedJob],
    now: Timestamp,
) -> Result<()> {
    if !open
        .iter()
        .any(|(_, limits)| limits.is_some_and(|l| l.limits_starts()))
    {
        return Ok(());
    }
    let mut insert = conn
        .prepare_cached("INSERT INTO jobq_starts (ns, queue, key, at) VALUES (?1, ?2, ?3, ?4)")
        .db("prepare the start log")?;
    let mut trim = conn
        .prepare_cached(
            "DELETE FROM jobq_starts WHERE ns = ?1 AND queue = ?2 AND key = ?3 AND at <= ?4",
        )
        .db("prepare the start log trim")?;
    // The logs this claim trimmed already.
    let mut trimmed: std::collections::HashSet<(&str, &str)> = Default::default();
    for ClaimedJob { job, .. } in claimed {
        let Some(limits) = open
            .iter()
            .find(|(queue, _)| *queue == job.queue)
            .and_then(|(_, limits)| *limits)
        else {
            continue;
        };
        let logs = [
            limits.max_starts.map(|rate| (QUEUE_LOG, rate)),
            limits
                .max_starts_per_key
                .zip(job.concurrency_key.as_deref())
                .map(|(rate, key)| (key, rate)),
        ];
        for (key, rate) in logs.into_iter().flatten() {
            if trimmed.insert((job.queue.as_str(), key)) {
                trim.execute(params![
                    ns,
                    job.queue,
                    key,
                    rate.window_opens_after(now).as_millis()
                ])
                .db("trim a start log")?;
            }
            insert
                .execute(params![ns, job.queue, key, now.as_millis()])
                .db("log a start")?;
        }
    }
    Ok(())
}

/// Deletes the starts that left their queue's windows (and every start of a queue
/// whose rate is gone): a claim trims only the logs it writes to, so the log of a key
/// that stopped starting jobs is trimmed here, with the housekeeping of reclaim.
pub(crate) fn forget_old_starts(conn: &Connection, ns: i64, now: Timestamp) -> Result<()> {
    conn.prepare_cached(
        "DELETE FROM jobq_starts WHERE ns = ?1 AND at <= ?2 - COALESCE(
             (SELECT MAX(COALESCE(l.max_starts_ms, 0), COALESCE(l.max_starts_per_key_ms, 0))
              FROM jobq_limits l WHERE l.ns = jobq_starts.ns AND l.queue = jobq_starts.queue),
             0)",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, now.as_millis()]))
    .db("forget old starts")?;
    Ok(())
}

/// Rule K3: what `queue`'s limits hold back at `now`: its running jobs, the keys at
/// their running limit, and when its rates admit a start again; each list at most
/// [`FLOW_KEYS_SHOWN`] long, the first by key.
pub(crate) fn flow_status(
    conn: &Connection,
    ns: i64,
    queue: &str,
    now: Timestamp,
) -> Result<FlowStatus> {
    let mut status = FlowStatus::new(count_running(conn, ns, queue)?);
    let limits = {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {LIMITS_COLUMNS} FROM jobq_limits WHERE ns = ?1 AND queue = ?2"
            ))
            .db("prepare a queue's limits")?;
        let mut rows = stmt.query(params![ns, queue]).db("read a queue's limits")?;
        match rows.next().db("read a queue's limits")? {
            Some(row) => limits_from(queue, row, 0)?,
            None => return Ok(status),
        }
    };
    let shown = i64::try_from(FLOW_KEYS_SHOWN).unwrap_or(i64::MAX);
    if let Some(limit) = limits.max_running_per_key {
        status.keys_at_limit = conn
            .prepare_cached(
                "SELECT concurrency_key, COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_running_key
                 WHERE ns = ?1 AND queue = ?2 AND state = 1 AND concurrency_key IS NOT NULL
                 GROUP BY concurrency_key HAVING COUNT(*) >= ?3
                 ORDER BY concurrency_key LIMIT ?4",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![ns, queue, limit, shown], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })?
                .map(|row| row.map(|(key, n)| (key, u64::try_from(n).unwrap_or(0))))
                .collect()
            })
            .db("read the keys at their limit")?;
    }
    if let Some(rate) = limits.max_starts {
        status.next_start = window(conn, ns, queue, QUEUE_LOG, rate, now)?.1;
    }
    if let Some(rate) = limits.max_starts_per_key {
        for key in full_key_windows(conn, ns, queue, rate, now, Some(shown))? {
            if let (_, Some(at)) = window(conn, ns, queue, &key, rate, now)? {
                status.keys_rate_limited.push((key, at));
            }
        }
    }
    Ok(status)
}

/// The keys of `queue` whose rate window is full at `now`, by key; at most `shown`.
fn full_key_windows(
    conn: &Connection,
    ns: i64,
    queue: &str,
    rate: Rate,
    now: Timestamp,
    shown: Option<i64>,
) -> Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT key FROM jobq_starts
         WHERE ns = ?1 AND queue = ?2 AND key <> '' AND at > ?3
         GROUP BY key HAVING COUNT(*) >= ?4 ORDER BY key LIMIT ?5",
    )
    .and_then(|mut stmt| {
        stmt.query_map(
            params![
                ns,
                queue,
                rate.window_opens_after(now).as_millis(),
                rate.starts,
                shown.unwrap_or(-1)
            ],
            |row| row.get(0),
        )?
        .collect()
    })
    .db("read the full key windows")
}

/// The earliest instant after `now` at which a rate of `queue` admits a start it holds
/// back now (K4): the queue's own window, or the earliest of its keys' full windows.
pub(super) fn next_rate_free(
    conn: &Connection,
    ns: i64,
    queue: &str,
    limits: QueueLimits,
    now: Timestamp,
) -> Result<Option<Timestamp>> {
    let mut next = match limits.max_starts {
        Some(rate) => window(conn, ns, queue, QUEUE_LOG, rate, now)?.1,
        None => None,
    };
    if let Some(rate) = limits.max_starts_per_key {
        // The keys whose window is full, and the start that frees each: the window's
        // `starts`-th newest, i.e. the oldest of a full window's newest `starts`.
        let full = full_key_windows(conn, ns, queue, rate, now, None)?;
        for key in full {
            if let (_, Some(at)) = window(conn, ns, queue, &key, rate, now)? {
                next = Some(next.map_or(at, |next: Timestamp| next.min(at)));
            }
        }
    }
    Ok(next)
}

/// What one claim may still take of one queue with limits: the running jobs and starts
/// it counted (in all, and per key as it meets them) and those it took (K1, K2, K4
/// count both).
pub(super) struct Admission {
    limits: QueueLimits,
    /// The queue's running jobs, this claim's included, once counted.
    running: Option<u64>,
    /// The queue's starts in its rate window, those this claim took included (K4).
    started: u64,
    now: Timestamp,
    /// Per key met: what this claim knows of it.
    by_key: HashMap<String, KeyCounts>,
}

/// One key's counts in a claim, this claim's takes included.
#[derive(Default)]
struct KeyCounts {
    /// Running jobs: the stored ones once read, plus this claim's.
    running: u64,
    /// Whether the stored running jobs were read (K1). Not while the queue runs fewer
    /// jobs in all than the per-key limit: no key can be at it then.
    running_read: bool,
    /// Starts in the key's window, once read, plus this claim's (K4).
    started: Option<u64>,
}

impl Admission {
    /// The queue's admission at the start of a claim: its running jobs counted when it
    /// has a limit on them, its starts when it has a rate.
    pub(super) fn start(
        conn: &Connection,
        ns: i64,
        queue: &str,
        limits: QueueLimits,
        now: Timestamp,
    ) -> Result<Self> {
        let started = match limits.max_starts {
            Some(rate) => window(conn, ns, queue, QUEUE_LOG, rate, now)?.0,
            None => 0,
        };
        // A per-key limit above 1 may be met without reading each key (see `take`),
        // when the queue runs fewer jobs in all: counted once here.
        let running = if limits.max_running.is_some()
            || limits.max_running_per_key.is_some_and(|limit| limit > 1)
        {
            Some(count_running(conn, ns, queue)?)
        } else {
            None
        };
        Ok(Admission {
            limits,
            running,
            started,
            now,
            by_key: HashMap::new(),
        })
    }

    /// Whether the queue admits no job at all now (K2, K4).
    pub(super) fn queue_full(&self) -> bool {
        !self.limits.admits_queue(self.running.unwrap_or(0))
            || self
                .limits
                .max_starts
                .is_some_and(|rate| !rate.admits(self.started))
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
        if let Some(key) = key.filter(|_| self.limits.counts_keys()) {
            let counts = match self.by_key.get_mut(key) {
                Some(counts) => counts,
                None => self.by_key.entry(key.to_owned()).or_default(),
            };
            if let Some(limit) = self.limits.max_running_per_key {
                // A key runs no more jobs than its queue: below the limit in all, no key
                // is at it, and the key's own count is not read.
                let below_in_all = self
                    .running
                    .is_some_and(|running| running < u64::from(limit));
                if !below_in_all && !counts.running_read {
                    counts.running += count_key_running(conn, ns, queue, key)?;
                    counts.running_read = true;
                }
                if !self.limits.admits_key(counts.running) {
                    return Ok(false);
                }
            }
            if let Some(rate) = self.limits.max_starts_per_key {
                let started = match counts.started {
                    Some(started) => started,
                    None => window(conn, ns, queue, key, rate, self.now)?.0,
                };
                if !rate.admits(started) {
                    counts.started = Some(started);
                    return Ok(false);
                }
                counts.started = Some(started + 1);
            }
            counts.running += 1;
        }
        if let Some(running) = self.running.as_mut() {
            *running += 1;
        }
        self.started += 1;
        Ok(true)
    }
}

/// The queue's running jobs, on `jobq_jobs_state`.
fn count_running(conn: &Connection, ns: i64, queue: &str) -> Result<u64> {
    let running: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
             WHERE ns = ?1 AND queue = ?2 AND state = 1",
        )
        .and_then(|mut stmt| stmt.query_row(params![ns, queue], |row| row.get(0)))
        .db("count a queue's running jobs")?;
    Ok(u64::try_from(running).unwrap_or(0))
}

/// One key's running jobs, on `jobq_jobs_running_key`.
fn count_key_running(conn: &Connection, ns: i64, queue: &str, key: &str) -> Result<u64> {
    let running: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_running_key
             WHERE ns = ?1 AND queue = ?2 AND concurrency_key = ?3
                 AND state = 1 AND concurrency_key IS NOT NULL",
        )
        .and_then(|mut stmt| stmt.query_row(params![ns, queue, key], |row| row.get(0)))
        .db("count a key's running jobs")?;
    Ok(u64::try_from(running).unwrap_or(0))
}
