//! Claim (CONTRACT C1–C10, F1–F6, Q1): the ready set across queues, fitted or not,
//! ordered, cut to the limit and leased; unreadable records buried.

use super::*;

/// The highest priority below `?3` that holds queued jobs in one queue: one index seek.
pub(super) const NEXT_BAND_SQL: &str = "SELECT priority FROM jobq_jobs INDEXED BY jobq_jobs_ready
     WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority < ?3
     ORDER BY priority DESC LIMIT 1";

/// The priority band `priority` read from the ready index, or a corrupt record.
pub(super) fn band_priority(queue: &str, priority: i64) -> Result<i16> {
    i16::try_from(priority).map_err(|_| {
        Error::corrupt(
            format!("queue {queue}"),
            format!("priority {priority} out of range"),
        )
    })
}

/// Up to `limit` ready jobs of one queue in claim order, appended to `out`: with the
/// queue's `limits`, those they admit (K1, K2).
///
/// SQLite cannot skip from one priority band to the next inside a range scan, so a
/// plain `ORDER BY priority DESC, run_at, seq` with `run_at <= now` would walk every
/// *scheduled* job of a band before reaching the ready jobs of the next. This walks the
/// bands itself: one index seek finds the next lower priority that has queued jobs, one
/// range scan takes that band's ready jobs. The cost follows the jobs returned and the
/// bands visited, not the scheduled backlog.
///
/// A queue with limits reads each ready row's key with it (the ready index's last
/// column, schema 9), passes over a job whose key is at its limit and ends once the queue is at
/// its limit; its scan has no `LIMIT`, since how far to read depends on the keys, so a
/// key at its limit with a deep ready backlog is walked past by every claim.
pub(super) fn ready_candidates(
    conn: &Connection,
    ns: i64,
    queue: &str,
    limits: Option<QueueLimits>,
    now: Timestamp,
    limit: usize,
    out: &mut Vec<(ReadyOrder, i64)>,
) -> Result<()> {
    let mut admission = match limits {
        Some(limits) => {
            let admission = limits::Admission::start(conn, ns, queue, limits, now)?;
            if admission.queue_full() {
                return Ok(());
            }
            Some(admission)
        }
        None => None,
    };
    let mut band = conn
        .prepare_cached(NEXT_BAND_SQL)
        .db("prepare the priority scan")?;
    let mut ready = conn
        .prepare_cached(if admission.is_some() {
            "SELECT job, run_at, seq, concurrency_key FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq LIMIT ?5"
        } else {
            "SELECT job, run_at, seq FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq LIMIT ?5"
        })
        .db("prepare the ready scan")?;
    let mut below = i64::from(i16::MAX) + 1;
    let mut found = 0usize;
    while found < limit {
        let priority: Option<i64> = band
            .query_row(params![ns, queue, below], |row| row.get(0))
            .optional()
            .db("find the next priority")?;
        let Some(priority) = priority else { break };
        let as_i16 = band_priority(queue, priority)?;
        // SQLite reads `LIMIT -1` as no limit.
        let remaining = match admission {
            Some(_) => -1,
            None => i64::try_from(limit - found).unwrap_or(i64::MAX),
        };
        let mut rows = ready
            .query(params![ns, queue, priority, now.as_millis(), remaining])
            .db("scan ready jobs")?;
        while let Some(row) = rows.next().db("scan ready jobs")? {
            if let Some(admission) = admission.as_mut() {
                let key: Option<String> = row.get(3).db("read a ready job")?;
                if !admission.take(conn, ns, queue, key.as_deref())? {
                    if admission.queue_full() {
                        break;
                    }
                    continue;
                }
            }
            let job: i64 = row.get(0).db("read a ready job")?;
            let run_at: i64 = row.get(1).db("read a ready job")?;
            let seq: i64 = row.get(2).db("read a ready job")?;
            let seq = u64::try_from(seq).unwrap_or(0);
            out.push((
                ReadyOrder::new(as_i16, Timestamp::from_millis(run_at), seq),
                job,
            ));
            found += 1;
            if found == limit {
                break;
            }
        }
        if admission
            .as_ref()
            .is_some_and(limits::Admission::queue_full)
        {
            break;
        }
        below = priority;
    }
    Ok(())
}

/// The job a row of a scan names, for a corrupt-record report; the row number when
/// its id cannot be read either.
/// How an error names job row `job`: by its id, read apart (only for an error, so the
/// scans that find none stay within their index).
pub(super) fn job_subject(conn: &Connection, job: i64) -> String {
    let id = conn
        .query_row("SELECT id FROM jobq_jobs WHERE job = ?1", [job], |row| {
            row.get::<_, [u8; 16]>(0)
        })
        .map(JobId::from_bytes);
    match id {
        Ok(Ok(id)) => format!("job {id}"),
        _ => format!("job row {job}"),
    }
}

/// The fitting ready jobs of one queue that can be among the claim's first
/// `request.limit` (CONTRACT F2–F5), appended to `out` with their place in the claim's
/// order; [`fitted_rows`] merges the queues and makes the cut.
///
/// Walks the bands as [`ready_candidates`] does, but reads each ready row's placement
/// (from the index, like the rest) and skips the rows the budget does
/// not admit, so the cut falls after the filter. Within a band the claim takes
/// preferred jobs first, so the band in which the `limit`-th fitting job turns up is
/// read to its end, where a preferred job may still outrank the ones in hand (F5);
/// that stops early only once the band has given as many preferred jobs as the cut can
/// take, or at once when the claim prefers no locality (its order is then the index
/// order). No lower band can outrank a higher one. Of each kind, preferred or not, a
/// band keeps only as many jobs as the cut can take, so a long band costs reading, not
/// memory. On a queue with limits a preferring claim reads a band twice, its preferred
/// jobs first, so the limits' slots go in the claim's order (K1 with F5).
#[allow(clippy::too_many_arguments)] // The claim's state, threaded through its steps.
pub(super) fn fitting_candidates(
    conn: &Connection,
    ns: i64,
    queue: &str,
    limits: Option<QueueLimits>,
    request: &ClaimRequest,
    now: Timestamp,
    verdicts: &mut Verdicts<'_>,
    out: &mut Vec<(FitOrder, i64)>,
) -> Result<()> {
    // A queue with limits (K1, K2): a job that fits takes a slot of its key, and one
    // whose key is at its limit is passed over like one that does not fit. Its scan
    // reads each row's key from the index too.
    let mut admission = match limits {
        Some(limits) => {
            let admission = limits::Admission::start(conn, ns, queue, limits, now)?;
            if admission.queue_full() {
                return Ok(());
            }
            Some(admission)
        }
        None => None,
    };
    let mut band = conn
        .prepare_cached(NEXT_BAND_SQL)
        .db("prepare the priority scan")?;
    // No LIMIT: how far to read depends on what the rows hold, so the scan is stepped
    // only as far as needed and dropped (which resets it) there.
    let mut ready = conn
        .prepare_cached(if admission.is_some() {
            "SELECT job, run_at, seq, placement, concurrency_key FROM jobq_jobs
             INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq"
        } else {
            "SELECT job, run_at, seq, placement FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq"
        })
        .db("prepare the fitting scan")?;
    let prefers = !request.prefer.is_empty();
    let mut below = i64::from(i16::MAX) + 1;
    let mut found = 0usize;
    while found < request.limit {
        let priority: Option<i64> = band
            .query_row(params![ns, queue, below], |row| row.get(0))
            .optional()
            .db("find the next priority")?;
        let Some(priority) = priority else { break };
        let as_i16 = band_priority(queue, priority)?;
        // The most jobs this band can still put under the cut.
        let room = request.limit - found;
        let (mut preferred, mut elsewhere) = (0usize, 0usize);
        // A preferring claim on a queue with limits spends their slots in its own
        // order (K1 with F5): the band's preferred jobs in a first scan, the others in
        // a second. Otherwise one scan, in which every fitting job is admitted as met.
        let scans: &[Option<bool>] = if prefers && admission.is_some() {
            &[Some(true), Some(false)]
        } else {
            &[None]
        };
        for (scan, only) in scans.iter().enumerate() {
            let mut rows = ready
                .query(params![ns, queue, priority, now.as_millis()])
                .db("scan ready jobs")?;
            while let Some(row) = rows.next().db("scan ready jobs")? {
                let job: i64 = row.get(0).db("read a ready job")?;
                let (fits, is_preferred) =
                    match verdicts.judge(row.get_ref(3).db("read a ready job")?) {
                        Ok(verdict) => verdict,
                        Err(why) => {
                            // Buried once the scan is done (CONTRACT C10), noted once.
                            if scan == 0 {
                                verdicts.unreadable.push((job, why));
                            }
                            continue;
                        }
                    };
                if !fits || only.is_some_and(|only| only != is_preferred) {
                    continue;
                }
                if let Some(admission) = admission.as_mut() {
                    let key: Option<String> = row.get(4).db("read a ready job")?;
                    if !admission.take(conn, ns, queue, key.as_deref())? {
                        if admission.queue_full() {
                            break;
                        }
                        continue;
                    }
                }
                let kept = if is_preferred {
                    &mut preferred
                } else {
                    &mut elsewhere
                };
                if *kept == room {
                    // `room` jobs of its kind that come before it are in hand already.
                    continue;
                }
                *kept += 1;
                let run_at: i64 = row.get(1).db("read a ready job")?;
                let seq: i64 = row.get(2).db("read a ready job")?;
                let seq = u64::try_from(seq).unwrap_or(0);
                let order = ReadyOrder::new(as_i16, Timestamp::from_millis(run_at), seq);
                out.push((FitOrder::new(order, is_preferred), job));
                // Ordered scans stop at the cut; one scan of both kinds stops once the
                // preferred jobs fill it, or at once when nothing is preferred.
                let full = match only {
                    Some(_) => preferred + elsewhere == room,
                    None => preferred == room || (!prefers && elsewhere == room),
                };
                if full {
                    break;
                }
            }
            if preferred + elsewhere >= room {
                break;
            }
        }
        found += (preferred + elsewhere).min(room);
        below = priority;
    }
    Ok(())
}

/// What a fitted claim makes of each placement text: whether the budget admits it and
/// whether its locality is preferred. Jobs of one kind share their text, so each text
/// is decoded once per claim, not once per row.
pub(super) struct Verdicts<'r> {
    request: &'r ClaimRequest,
    seen: std::collections::HashMap<Vec<u8>, (bool, bool)>,
    /// The rows whose placement could not be read, and why: the claim buries them.
    unreadable: Vec<(i64, String)>,
}

impl<'r> Verdicts<'r> {
    /// Texts remembered per claim; past it, a text is decoded each time it is met.
    const MAX_SEEN: usize = 256;

    fn new(request: &'r ClaimRequest) -> Self {
        Verdicts {
            request,
            seen: std::collections::HashMap::new(),
            unreadable: Vec::new(),
        }
    }

    /// (fits, preferred) of a stored placement; a job without one fits every budget
    /// and is never preferred.
    fn judge(&mut self, value: ValueRef<'_>) -> std::result::Result<(bool, bool), String> {
        let ValueRef::Text(bytes) = value else {
            return placement_from(value, None).map(|_| (true, false));
        };
        if let Some(verdict) = self.seen.get(bytes) {
            return Ok(*verdict);
        }
        let (needs, locality) = placement_from(value, None)?;
        let verdict = (
            self.request.admits(&needs),
            is_preferred(&self.request.prefer, locality.as_deref()),
        );
        if self.seen.len() < Self::MAX_SEEN {
            self.seen.insert(bytes.to_vec(), verdict);
        }
        Ok(verdict)
    }
}

/// CONTRACT F6: the row of job `id` if the claim may take it (queued and due, in one of
/// the claim's queues that is not paused, admitted by its budget and by its queue's
/// limits, K1 and K2), found by id.
pub(super) fn reserved_row(
    tx: &WriteTx<'_>,
    ns: i64,
    open: &[(&str, Option<QueueLimits>)],
    request: &ClaimRequest,
    id: JobId,
    now: Timestamp,
) -> Result<Option<i64>> {
    let conn = tx.conn();
    let mut stmt = conn
        .prepare_cached(
            "SELECT job, queue, state, run_at, placement, concurrency_key FROM jobq_jobs
             WHERE ns = ?1 AND id = ?2",
        )
        .db("prepare the reservation read")?;
    let mut rows = stmt
        .query(params![ns, id.to_bytes()])
        .db("read the reserved job")?;
    let Some(row) = rows.next().db("read the reserved job")? else {
        return Ok(None);
    };
    let read = || -> rusqlite::Result<(i64, String, i64, i64)> {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
    };
    let (job, queue, state, run_at) = read().db("read the reserved job")?;
    if state != QUEUED || run_at > now.as_millis() || !request.queues.contains(&queue) {
        return Ok(None);
    }
    let placement = placement_from(row.get_ref(4).db("read the reserved job")?, None);
    let key: Option<String> = row.get(5).db("read the reserved job")?;
    drop(rows);
    let needs = match placement {
        Ok((needs, _)) => needs,
        Err(why) => {
            bury(tx, job, &unreadable_placement(&why), now)?;
            return Ok(None);
        }
    };
    if !request.admits(&needs) {
        return Ok(None);
    }
    let Some(&(queue, limits)) = open.iter().find(|(open, _)| *open == queue) else {
        return Ok(None);
    };
    if let Some(limits) = limits {
        let mut admission = limits::Admission::start(conn, ns, queue, limits, now)?;
        if !admission.take(conn, ns, queue, key.as_deref())? {
            return Ok(None);
        }
    }
    Ok(Some(job))
}

/// Whether a queue is paused (CONTRACT Q1), and its limits (K1–K3) when it has any:
/// both in one statement, so a claim of a queue without limits pays one statement per
/// queue, as it did for the pause alone.
const GATES_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM jobq_paused p WHERE p.ns = ?1 AND p.queue = ?2),
         l.queue IS NOT NULL, l.max_running, l.max_running_per_key, l.max_starts,
         l.max_starts_ms, l.max_starts_per_key, l.max_starts_per_key_ms, l.fair_shares
     FROM (SELECT 1) LEFT JOIN jobq_limits l ON l.ns = ?1 AND l.queue = ?2";

/// The distinct queues of a claim, less the paused ones, each with its limits. Read in
/// the claim's own write transaction, so a pause or limits committed before the claim
/// began are always seen (CONTRACT Q1, K3).
pub(super) fn open_queues<'a>(
    conn: &Connection,
    ns: i64,
    named: &'a [String],
) -> Result<Vec<(&'a str, Option<QueueLimits>)>> {
    let mut queues: Vec<&str> = named.iter().map(String::as_str).collect();
    queues.sort_unstable();
    queues.dedup();
    let mut gates = conn
        .prepare_cached(GATES_SQL)
        .db("prepare the pause and limits check")?;
    let mut open = Vec::with_capacity(queues.len());
    for queue in queues {
        let mut rows = gates
            .query(params![ns, queue])
            .db("check a pause and limits")?;
        let Some(row) = rows.next().db("check a pause and limits")? else {
            continue;
        };
        if row.get::<_, bool>(0).db("check a pause")? {
            continue;
        }
        let limits = if row.get::<_, bool>(1).db("read a queue's limits")? {
            Some(limits::limits_from(queue, row, 2)?)
        } else {
            None
        };
        open.push((queue, limits));
    }
    Ok(open)
}

/// The rows a fitted claim takes (CONTRACT F2–F6), in its order: every queue's
/// candidates from [`fitting_candidates`], merged, ordered, then cut to the limit. Each
/// queue gave every job of its own that can make the cut, so the cut of the merge is
/// the cut of all the fitting jobs.
pub(super) fn fitted_rows(
    tx: &WriteTx<'_>,
    ns: i64,
    open: &[(&str, Option<QueueLimits>)],
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<i64>> {
    let conn = tx.conn();
    if let Some(id) = request.reserved {
        let row = reserved_row(tx, ns, open, request, id, now)?;
        return Ok(row.into_iter().take(request.limit).collect());
    }
    let mut candidates = Vec::new();
    let mut verdicts = Verdicts::new(request);
    for &(queue, limits) in open {
        fitting_candidates(
            conn,
            ns,
            queue,
            limits,
            request,
            now,
            &mut verdicts,
            &mut candidates,
        )?;
    }
    for (row, why) in verdicts.unreadable {
        bury(tx, row, &unreadable_placement(&why), now)?;
    }
    candidates.sort_unstable_by_key(|(order, _)| *order);
    candidates.truncate(request.limit);
    Ok(candidates.into_iter().map(|(_, row)| row).collect())
}

/// Rules C1–C9 and F1–F6: one transaction picks the ready set across the queues, orders
/// it, cuts it to `limit`, and leases each job. A claim that is not fitted (no budget,
/// preference or reservation) never reads a placement.
pub(crate) fn claim(
    tx: &mut WriteTx<'_>,
    ns: i64,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    let conn = tx.conn();
    let open = open_queues(conn, ns, &request.queues)?;
    let claimed = if request.is_fitted() {
        let rows = fitted_rows(tx, ns, &open, request, now)?;
        lease_rows(tx, rows.into_iter(), request, now)?
    } else {
        let mut candidates = Vec::new();
        let mut turns = Vec::new();
        for &(queue, limits) in &open {
            match limits.filter(|limits| limits.fair_shares) {
                Some(limits) => fair::fair_candidates(
                    conn,
                    ns,
                    queue,
                    limits,
                    now,
                    request.limit,
                    &mut candidates,
                    &mut turns,
                )?,
                None => {
                    ready_candidates(conn, ns, queue, limits, now, request.limit, &mut candidates)?
                }
            }
        }
        // Each queue gave its first `limit` jobs, so the first `limit` of the merge are
        // the first `limit` of the whole ready set (C3).
        candidates.sort_by_key(|(order, _)| *order);
        candidates.truncate(request.limit);
        if !turns.is_empty() {
            let kept: Vec<i64> = candidates.iter().map(|(_, row)| *row).collect();
            fair::advance_turns(conn, ns, &turns, &kept)?;
        }
        lease_rows(tx, candidates.into_iter().map(|(_, row)| row), request, now)?
    };
    // The starts a rate counts are logged in the claim's transaction (K4).
    limits::record_starts(conn, ns, &open, &claimed, now)?;
    Ok(claimed)
}

/// Leases the jobs in `rows` to the claimer, in that order, and returns them as the
/// lease left them.
pub(super) fn lease_rows(
    tx: &WriteTx<'_>,
    rows: impl ExactSizeIterator<Item = i64>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    let conn = tx.conn();
    // Everything is read and checked before the first lease is written. A row that
    // cannot be read (a corrupt record, a missing payload) is buried, never leased and
    // never in the way of the jobs behind it (CONTRACT C10); the claim needs no
    // savepoint (whose sub-journal would copy every page it touches).
    let mut read = conn
        .prepare_cached(concat!(
            "SELECT ",
            job_columns!(),
            ", j.lease_token, p.payload
             FROM jobq_jobs j LEFT JOIN jobq_payloads p ON p.job = j.job
             WHERE j.job = ?1"
        ))
        .db("prepare the claim read")?;
    let mut picked = Vec::with_capacity(rows.len());
    let mut placements = PlacementCache::new();
    for row in rows {
        let mut answer = read.query([row]).db("read a claimed job")?;
        let Some(found) = answer.next().db("read a claimed job")? else {
            continue;
        };
        match claimable(found, &mut placements) {
            Ok((job, token, payload)) => picked.push((row, job, token, payload)),
            Err(Error::Corrupt { reason, .. }) => bury(tx, row, &reason, now)?,
            Err(other) => return Err(other),
        }
    }

    let expires_at = now.saturating_add(request.lease_ttl);
    let mut update = conn
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = 1, attempts = attempts + 1,
                     lease_token = lease_token + 1, lease_worker = ?2, lease_expires_at = ?3,
                     started_at = ?4, heartbeat_at = ?4, ",
            events_stamp!("4"),
            " WHERE job = ?1"
        ))
        .db("prepare the claim")?;
    let mut claimed = Vec::with_capacity(picked.len());
    for (row, mut job, token, payload) in picked {
        update
            .execute(params![
                row,
                request.worker,
                expires_at.as_millis(),
                now.as_millis()
            ])
            .db("lease a job")?;
        // The job as the UPDATE above stored it (C6: `get` shows the same).
        job.state = JobState::Running;
        job.attempts = job.attempts.saturating_add(1);
        job.lease = Some(Lease {
            worker: request.worker.clone(),
            token: LeaseToken::new(token.saturating_add(1)),
            expires_at,
        });
        job.started_at = Some(now);
        job.heartbeat_at = Some(now);
        claimed.push(ClaimedJob {
            job,
            payload: Bytes::from(payload),
        });
    }
    Ok(claimed)
}

/// A row read for a claim: the job, its current lease token and its payload.
pub(super) fn claimable(
    found: &Row<'_>,
    placements: &mut PlacementCache,
) -> Result<(Job, u64, Vec<u8>)> {
    let job = job_from_row_in(found, Some(placements))?;
    let token: i64 = found.get(JOB_COLUMNS).db("read a claimed job")?;
    let token = u64::try_from(token)
        .map_err(|_| Error::corrupt(format!("job {}", job.id), "negative lease token"))?;
    let payload: Option<Vec<u8>> = found.get(JOB_COLUMNS + 1).db("read a claimed job")?;
    let payload =
        payload.ok_or_else(|| Error::corrupt(format!("job {}", job.id), "payload missing"))?;
    Ok((job, token, payload))
}

/// Moves the job of row `row`, which a claim could not read, to `dead` with the reason
/// (CONTRACT C10): it leaves the ready index, so no claim meets it again, and keeps
/// its row for an operator to look at or purge.
pub(super) fn bury(tx: &WriteTx<'_>, row: i64, reason: &str, now: Timestamp) -> Result<()> {
    finish(
        tx,
        row,
        DEAD,
        Some(&format!("corrupt record: {reason}")),
        now,
    )
}

/// The reason a job whose placement a fitted claim could not read is buried with.
pub(super) fn unreadable_placement(why: &str) -> String {
    format!("placement unreadable: {why}")
}

/// What a wait for work finds on its queues (paused ones left out).
pub(crate) enum Readiness {
    /// A ready job the queue's limits admit.
    Ready,
    /// None; a rate (K4) admits a start it holds back now at this instant.
    FreedAt(Timestamp),
    /// None, and no rate holds one back.
    Nothing,
}

/// Whether any of `queues`, paused ones left out, holds a ready job its limits admit:
/// what `wait_for_work` polls; if none, when a rate frees a start.
pub(crate) fn readiness(
    conn: &Connection,
    ns: i64,
    queues: &[String],
    now: Timestamp,
) -> Result<Readiness> {
    // Jobs a queue's limits hold back are not work: a claimer woken for them would find
    // nothing it may take (K1, K2, K4).
    let mut found = Vec::new();
    let open = open_queues(conn, ns, queues)?;
    for &(queue, limits) in &open {
        ready_candidates(conn, ns, queue, limits, now, 1, &mut found)?;
        if !found.is_empty() {
            return Ok(Readiness::Ready);
        }
    }
    let mut next: Option<Timestamp> = None;
    for &(queue, limits) in &open {
        let Some(limits) = limits.filter(QueueLimits::limits_starts) else {
            continue;
        };
        if let Some(at) = limits::next_rate_free(conn, ns, queue, limits, now)? {
            next = Some(next.map_or(at, |next| next.min(at)));
        }
    }
    Ok(next.map_or(Readiness::Nothing, Readiness::FreedAt))
}
