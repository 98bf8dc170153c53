//! Fair shares (CONTRACT K5): a queue's ready jobs taken by turns of concurrency key.
//!
//! Within each priority, the keys with queued jobs are walked in key order on
//! `jobq_jobs_ready_key` from the one after the queue's turn (`jobq_turns`), one index
//! seek per key, and each key's first jobs are read with one seek more; the jobs
//! without a key take their turn first, read from the plain ready index. A claim of
//! `limit` jobs thus reads about as many keys as it takes jobs, however deep the
//! backlog of any one key. Runs inside the claim's write transaction, like every
//! claim, so the turn it reads and the one it writes are one step.

use std::collections::VecDeque;

use durq_core::fair::{in_turn_places, turns_left, Found, Look, Turn, NO_KEY};

use super::*;

/// One key's ready jobs read for this claim, in claim order: (row, run_at, seq).
type KeyJobs = VecDeque<(i64, i64, i64)>;

/// Up to `limit` ready jobs of fair `queue` by turns of key (K5), priorities highest
/// first; within one, the first admitted job of each key in turn from the one after
/// the queue's turn, round after round. Appended to `out` with the places in claim
/// order that the queue's first jobs hold, so a claim across queues merges them as it
/// would the queue's first jobs, in turn order; noted in `turns`.
#[allow(clippy::too_many_arguments)] // The claim's state, threaded through its steps.
pub(super) fn fair_candidates(
    conn: &Connection,
    ns: i64,
    queue: &str,
    limits: QueueLimits,
    now: Timestamp,
    limit: usize,
    out: &mut Vec<(ReadyOrder, i64)>,
    turns: &mut Vec<Turn<i64>>,
) -> Result<()> {
    let mut admission = limits::Admission::start(conn, ns, queue, limits, now)?;
    let mut band = conn
        .prepare_cached(NEXT_BAND_SQL)
        .db("prepare the priority scan")?;
    // In turn order, with the key whose turn each was.
    let mut taken: Vec<(ReadyOrder, i64)> = Vec::new();
    let mut keys_taken: Vec<String> = Vec::new();
    let mut below = i64::from(i16::MAX) + 1;
    'bands: while taken.len() < limit && !admission.queue_full() {
        let priority: Option<i64> = band
            .query_row(params![ns, queue, below], |row| row.get(0))
            .optional()
            .db("find the next priority")?;
        let Some(priority) = priority else { break };
        below = priority;
        let as_i16 = claim::band_priority(queue, priority)?;
        let served = turn_of(conn, ns, queue, priority)?;
        let mut ring = Ring::new(served);
        // Keys that had a turn this claim and may have another, with their jobs left.
        let mut again: VecDeque<(String, KeyJobs)> = VecDeque::new();
        loop {
            if taken.len() >= limit {
                break 'bands;
            }
            let (key, mut jobs) = match ring.next_key(conn, ns, queue, priority)? {
                Some(key) => {
                    let room = limit - taken.len();
                    let jobs = key_jobs(conn, ns, queue, priority, &key, now, room)?;
                    (key, jobs)
                }
                None => match again.pop_front() {
                    Some(next_round) => next_round,
                    None => break,
                },
            };
            let Some((row, run_at, seq)) = jobs.pop_front() else {
                continue;
            };
            let job_key = (key != NO_KEY).then_some(key.as_str());
            if !admission.take(conn, ns, queue, job_key)? {
                if admission.queue_full() {
                    break 'bands;
                }
                // The key is at a limit: it has no more turns in this claim.
                continue;
            }
            let seq = u64::try_from(seq).unwrap_or(0);
            let order = ReadyOrder::new(as_i16, Timestamp::from_millis(run_at), seq);
            taken.push((order, row));
            keys_taken.push(key.clone());
            if !jobs.is_empty() {
                again.push_back((key, jobs));
            }
        }
    }
    out.extend(in_turn_places(&taken));
    for ((order, row), key) in taken.iter().zip(keys_taken) {
        turns.push(Turn {
            id: *row,
            queue: queue.to_owned(),
            priority: order.priority,
            key,
        });
    }
    Ok(())
}

/// The key `queue`'s claims served last at `priority`, if any.
fn turn_of(conn: &Connection, ns: i64, queue: &str, priority: i64) -> Result<Option<String>> {
    conn.prepare_cached(
        "SELECT last_key FROM jobq_turns WHERE ns = ?1 AND queue = ?2 AND priority = ?3",
    )
    .and_then(|mut stmt| {
        stmt.query_row(params![ns, queue, priority], |row| row.get(0))
            .optional()
    })
    .db("read a queue's turn")
}

/// The keys of one priority in turn order ([`durq_core::fair::Ring`]), each found with
/// one seek of `jobq_jobs_ready_key`.
struct Ring(durq_core::fair::Ring);

impl Ring {
    fn new(served: Option<String>) -> Self {
        Ring(durq_core::fair::Ring::new(served))
    }

    /// The next key in turn order, or `None` once every key had its turn.
    fn next_key(
        &mut self,
        conn: &Connection,
        ns: i64,
        queue: &str,
        priority: i64,
    ) -> Result<Option<String>> {
        loop {
            let key = match self.0.look() {
                Look::Done => return Ok(None),
                Look::NoKey => Some(NO_KEY.to_owned()),
                Look::After(after) => next_key_after(conn, ns, queue, priority, after)?,
            };
            match self.0.found(key.as_deref()) {
                Found::Take => return Ok(key),
                Found::Again => continue,
                Found::Done => return Ok(None),
            }
        }
    }
}

/// The first key above `after` that has queued jobs at `priority`: one seek.
fn next_key_after(
    conn: &Connection,
    ns: i64,
    queue: &str,
    priority: i64,
    after: &str,
) -> Result<Option<String>> {
    conn.prepare_cached(
        "SELECT concurrency_key FROM jobq_jobs INDEXED BY jobq_jobs_ready_key
         WHERE ns = ?1 AND queue = ?2 AND state = 0 AND concurrency_key IS NOT NULL
             AND priority = ?3 AND concurrency_key > ?4
         ORDER BY concurrency_key LIMIT 1",
    )
    .and_then(|mut stmt| {
        stmt.query_row(params![ns, queue, priority, after], |row| row.get(0))
            .optional()
    })
    .db("find the next key")
}

/// Up to `room` ready jobs of one key (or, for [`NO_KEY`], of no key) at `priority`,
/// in claim order.
fn key_jobs(
    conn: &Connection,
    ns: i64,
    queue: &str,
    priority: i64,
    key: &str,
    now: Timestamp,
    room: usize,
) -> Result<KeyJobs> {
    let room = i64::try_from(room).unwrap_or(i64::MAX);
    let now = now.as_millis();
    let read = |row: &Row<'_>| Ok((row.get(0)?, row.get(1)?, row.get(2)?));
    let jobs = if key == NO_KEY {
        // Read from the plain ready index, past the band's keyed jobs.
        conn.prepare_cached(
            "SELECT job, run_at, seq FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
                 AND concurrency_key IS NULL
             ORDER BY run_at, seq LIMIT ?5",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![ns, queue, priority, now, room], read)?
                .collect()
        })
    } else {
        conn.prepare_cached(
            "SELECT job, run_at, seq FROM jobq_jobs INDEXED BY jobq_jobs_ready_key
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND concurrency_key IS NOT NULL
                 AND priority = ?3 AND concurrency_key = ?4 AND run_at <= ?5
             ORDER BY run_at, seq LIMIT ?6",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![ns, queue, priority, key, now, room], read)?
                .collect()
        })
    };
    jobs.db("read a key's ready jobs")
}

/// Moves each fair queue's turn, per priority, to the key of the last job the claim
/// keeps (`kept`, its rows) in turn order (K5): the next claim starts after it.
pub(super) fn advance_turns(
    conn: &Connection,
    ns: i64,
    turns: &[Turn<i64>],
    kept: &[i64],
) -> Result<()> {
    let mut upsert = conn
        .prepare_cached(
            "INSERT INTO jobq_turns (ns, queue, priority, last_key) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (ns, queue, priority) DO UPDATE SET last_key = excluded.last_key",
        )
        .db("prepare the turn")?;
    for turn in turns_left(turns, kept) {
        upsert
            .execute(params![ns, turn.queue, turn.priority, turn.key])
            .db("move a queue's turn on")?;
    }
    Ok(())
}
