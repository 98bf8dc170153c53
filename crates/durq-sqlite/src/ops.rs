//! The SQL behind each operation. Writes run on the writer thread inside a group
//! transaction ([`WriteTx`]); reads run on a reader connection. Every "now" is the
//! instant the `Store` handle read from its clock, passed in; no query calls SQLite's
//! time functions (CONTRACT §3). Inputs arrive validated by the handle.

use std::time::Duration;

use bytes::Bytes;
use durq_core::attempts::{self, LastClaim};
use durq_core::fit::{decode_placement, is_preferred, FitOrder, PlacementCache};
use durq_core::meta::{decode_tags, encode_tags};
use durq_core::transition::{self, Attempts, Next};
use durq_core::{
    Attempt, AttemptOutcome, ClaimRequest, ClaimedJob, Enqueued, Error, Heartbeat, Job, JobId,
    JobState, Lease, LeaseToken, ListPage, ListQuery, Needs, NewJob, QueueOverview, QueueStats,
    ReadyOrder, ReclaimedJob, Result, Retry, ScheduleUpdate, StoreSettings, StoredSchedule,
    StoredWorker, Tags, Timestamp, Uniqueness, LEASE_EXPIRED,
};
use rusqlite::types::ValueRef;
use rusqlite::{params, CachedStatement, Connection, OptionalExtension, Row};

use crate::engine::WriteTx;
use crate::error::DbResultExt;

const QUEUED: i64 = 0;
const RUNNING: i64 = 1;
const SUCCEEDED: i64 = 2;
const DEAD: i64 = 3;
const CANCELLED: i64 = 4;

fn state_code(state: JobState) -> i64 {
    match state {
        JobState::Queued => QUEUED,
        JobState::Running => RUNNING,
        JobState::Succeeded => SUCCEEDED,
        JobState::Dead => DEAD,
        JobState::Cancelled => CANCELLED,
    }
}

fn state_from_code(code: i64) -> Option<JobState> {
    Some(match code {
        QUEUED => JobState::Queued,
        RUNNING => JobState::Running,
        SUCCEEDED => JobState::Succeeded,
        DEAD => JobState::Dead,
        CANCELLED => JobState::Cancelled,
        _ => return None,
    })
}

/// The columns [`job_from_row`] reads, in its order. A macro, so the queries that use
/// it are `concat!`ed at compile time instead of formatted on every call.
macro_rules! job_columns {
    () => {
        "id, queue, tenant, idem_key, priority, run_at, max_attempts, parent, state, \
         attempts, lease_worker, lease_token, lease_expires_at, created_at, started_at, \
         heartbeat_at, finished_at, last_error, result, cancel_requested, timeout_ms, \
         placement, tags, trace_context"
    };
}

/// How many columns `job_columns!` names: a query that reads more puts them after.
const JOB_COLUMNS: usize = 24;

/// The job id in a 16-byte `id` blob, as `JobId::to_bytes` wrote it. The blob is read
/// as `[u8; 16]` (no allocation; a blob of another size fails in rusqlite and is
/// reported `Corrupt` by `db_error`); here the bytes must also be a UUIDv7.
fn id_from_blob(what: &str, bytes: [u8; 16]) -> Result<JobId> {
    JobId::from_bytes(bytes).map_err(|err| Error::corrupt(what.to_owned(), err.to_string()))
}

/// A job's needs and locality from its `placement` column: NULL when it declares
/// neither, else the text `durq_core::fit::encode_placement` wrote. Anything else is
/// described in the error, for the caller to report as a corrupt record.
///
/// With a cache, each text is decoded once per cache (a claim's jobs share a few).
fn placement_from(
    value: ValueRef<'_>,
    cache: Option<&mut PlacementCache>,
) -> std::result::Result<(Needs, Option<String>), String> {
    match value {
        ValueRef::Null => Ok((Needs::new(), None)),
        ValueRef::Text(bytes) => {
            let text = std::str::from_utf8(bytes)
                .map_err(|err| format!("placement is not UTF-8: {err}"))?;
            match cache {
                Some(cache) => cache.decode(text),
                None => decode_placement(text),
            }
        }
        other => Err(format!("placement holds a {} value", other.data_type())),
    }
}

/// A job's tags from its `tags` column: NULL for none, else the text
/// `durq_core::meta::encode_tags` wrote. Anything else is described in the error, for
/// the caller to report as a corrupt record.
fn tags_from(value: ValueRef<'_>) -> std::result::Result<Tags, String> {
    match value {
        ValueRef::Null => Ok(Tags::new()),
        ValueRef::Text(bytes) => {
            let text =
                std::str::from_utf8(bytes).map_err(|err| format!("tags are not UTF-8: {err}"))?;
            decode_tags(text)
        }
        other => Err(format!("tags hold a {} value", other.data_type())),
    }
}

fn millis(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp::from_millis)
}

/// A token as SQLite stores it. Tokens count claims, so a value past `i64::MAX` was
/// never issued: it can only be stale.
fn token_value(token: LeaseToken) -> Option<i64> {
    i64::try_from(token.get()).ok()
}

fn job_from_row(row: &Row<'_>) -> Result<Job> {
    job_from_row_in(row, None)
}

/// [`job_from_row`], decoding placements through `placements` when given.
fn job_from_row_in(row: &Row<'_>, placements: Option<&mut PlacementCache>) -> Result<Job> {
    let read = |err| crate::error::db_error("read a job row", err);
    let id = id_from_blob("job id", row.get(0).map_err(read)?)?;
    let what = || format!("job {id}");
    let corrupt = |field: &str, value: i64| {
        Error::corrupt(what(), format!("{field} holds {value}, out of range"))
    };
    let get_i64 = |index: usize| -> Result<i64> { row.get(index).map_err(read) };
    let get_opt_i64 = |index: usize| -> Result<Option<i64>> { row.get(index).map_err(read) };

    let priority_raw = get_i64(4)?;
    let priority = i16::try_from(priority_raw).map_err(|_| corrupt("priority", priority_raw))?;
    let max_attempts_raw = get_i64(6)?;
    let max_attempts =
        u32::try_from(max_attempts_raw).map_err(|_| corrupt("max_attempts", max_attempts_raw))?;
    let parent = match row.get::<_, Option<[u8; 16]>>(7).map_err(read)? {
        Some(bytes) => Some(id_from_blob(&what(), bytes)?),
        None => None,
    };
    let state_raw = get_i64(8)?;
    let state = state_from_code(state_raw).ok_or_else(|| corrupt("state", state_raw))?;
    let attempts_raw = get_i64(9)?;
    let attempts = u32::try_from(attempts_raw).map_err(|_| corrupt("attempts", attempts_raw))?;
    let lease = if state == JobState::Running {
        let worker: Option<String> = row.get(10).map_err(read)?;
        let token_raw = get_i64(11)?;
        let token = u64::try_from(token_raw).map_err(|_| corrupt("lease_token", token_raw))?;
        let expires = get_opt_i64(12)?;
        match (worker, expires) {
            (Some(worker), Some(expires)) => Some(Lease {
                worker,
                token: LeaseToken::new(token),
                expires_at: Timestamp::from_millis(expires),
            }),
            _ => return Err(Error::corrupt(what(), "running without a lease")),
        }
    } else {
        None
    };
    let result: Option<Vec<u8>> = row.get(18).map_err(read)?;
    let timeout = match get_opt_i64(20)? {
        Some(ms) => Some(Duration::from_millis(
            u64::try_from(ms)
                .ok()
                .filter(|ms| *ms > 0)
                .ok_or_else(|| corrupt("timeout_ms", ms))?,
        )),
        None => None,
    };
    let (needs, locality) = placement_from(row.get_ref(21).map_err(read)?, placements)
        .map_err(|why| Error::corrupt(what(), why))?;
    let tags =
        tags_from(row.get_ref(22).map_err(read)?).map_err(|why| Error::corrupt(what(), why))?;
    Ok(Job {
        id,
        queue: row.get(1).map_err(read)?,
        tenant: row.get(2).map_err(read)?,
        idempotency_key: row.get(3).map_err(read)?,
        priority,
        run_at: Timestamp::from_millis(get_i64(5)?),
        max_attempts,
        parent,
        timeout,
        state,
        attempts,
        lease,
        created_at: Timestamp::from_millis(get_i64(13)?),
        started_at: millis(get_opt_i64(14)?),
        heartbeat_at: millis(get_opt_i64(15)?),
        finished_at: millis(get_opt_i64(16)?),
        last_error: row.get(17).map_err(read)?,
        result: result.map(Bytes::from),
        cancel_requested: get_i64(19)? != 0,
        needs,
        locality,
        tags,
        trace_context: row.get(23).map_err(read)?,
    })
}

fn job_exists(conn: &Connection, ns: i64, id: JobId) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM jobq_jobs WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| stmt.exists(params![ns, id.to_bytes()]))
        .db("look a job up")
}

/// The state of job `id`, if it exists.
fn job_state(conn: &Connection, ns: i64, id: JobId) -> Result<Option<JobState>> {
    let code: Option<i64> = conn
        .prepare_cached("SELECT state FROM jobq_jobs WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| row.get(0))
                .optional()
        })
        .db("look a job up")?;
    code.map(|code| {
        state_from_code(code)
            .ok_or_else(|| Error::corrupt(format!("job {id}"), format!("unknown state {code}")))
    })
    .transpose()
}

/// Resolves (creating it if new) the small integer that stands for `name` in every row.
pub(crate) fn namespace_id(tx: &mut WriteTx<'_>, name: &str) -> Result<i64> {
    let conn = tx.conn();
    conn.prepare_cached("INSERT OR IGNORE INTO jobq_namespaces (name) VALUES (?1)")
        .and_then(|mut stmt| stmt.execute([name]))
        .db("register the namespace")?;
    conn.prepare_cached("SELECT id FROM jobq_namespaces WHERE name = ?1")
        .and_then(|mut stmt| stmt.query_row([name], |row| row.get(0)))
        .db("read the namespace id")
}

/// Rules E1–E7 for one job.
pub(crate) fn enqueue(
    tx: &mut WriteTx<'_>,
    ns: i64,
    settings: &StoreSettings,
    job: NewJob,
    now: Timestamp,
) -> Result<Enqueued> {
    Enqueuer::new(tx.conn())?.enqueue(tx, ns, settings, job, now)
}

/// Rules E1–E7 for each job of a batch, in order, all in the caller's transaction.
pub(crate) fn enqueue_batch(
    tx: &mut WriteTx<'_>,
    ns: i64,
    settings: &StoreSettings,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    let mut enqueuer = Enqueuer::new(tx.conn())?;
    jobs.into_iter()
        .map(|job| enqueuer.enqueue(tx, ns, settings, job, now))
        .collect()
}

/// The two statements every enqueue runs, prepared once per call rather than once per
/// job: looking a statement up in the connection's cache hashes its whole text, which
/// cost a batch of small jobs about as much as binding them.
struct Enqueuer<'c> {
    conn: &'c Connection,
    insert_job: CachedStatement<'c>,
    insert_payload: CachedStatement<'c>,
}

impl<'c> Enqueuer<'c> {
    fn new(conn: &'c Connection) -> Result<Self> {
        let insert_job = conn
            .prepare_cached(
                "INSERT INTO jobq_jobs (ns, id, queue, state, priority, run_at, seq, attempts,
                     max_attempts, lease_token, cancel_requested, created_at, tenant, idem_key,
                     parent, timeout_ms, placement, tags, trace_context)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                     ?17, ?18)",
            )
            .db("prepare the job insert")?;
        // OR REPLACE: a payload row left behind by a job deleted outside this crate must
        // not block the new job that reuses its rowid.
        let insert_payload = conn
            .prepare_cached("INSERT OR REPLACE INTO jobq_payloads (job, payload) VALUES (?1, ?2)")
            .db("prepare the payload insert")?;
        Ok(Enqueuer {
            conn,
            insert_job,
            insert_payload,
        })
    }

    fn enqueue(
        &mut self,
        tx: &mut WriteTx<'_>,
        ns: i64,
        settings: &StoreSettings,
        job: NewJob,
        now: Timestamp,
    ) -> Result<Enqueued> {
        let conn = self.conn;
        if let Some(parent) = job.parent {
            if !job_exists(conn, ns, parent)? {
                return Err(Error::invalid("parent", format!("no job {parent} exists")));
            }
        }
        if let Some(key) = &job.idempotency_key {
            if let Some(id) = held_key(conn, ns, settings, &job, key, now)? {
                return Ok(Enqueued { id, created: false });
            }
        }

        let id = JobId::mint(now);
        let seq = tx.next_seq()?;
        // The record is what durq-core says a new job is; the row stores it as it stands.
        let (job, payload) = Job::enqueued(job, id, now);
        self.insert_job
            .execute(params![
                ns,
                id.to_bytes(),
                job.queue,
                state_code(job.state),
                job.priority,
                job.run_at.as_millis(),
                seq,
                job.attempts,
                job.max_attempts,
                job.cancel_requested,
                job.created_at.as_millis(),
                job.tenant,
                job.idempotency_key,
                job.parent.map(JobId::to_bytes),
                job.timeout.map(durq_core::duration_millis),
                job.placement(),
                encode_tags(&job.tags),
                job.trace_context,
            ])
            .db("insert the job")?;
        let row = conn.last_insert_rowid();
        self.insert_payload
            .execute(params![row, &payload[..]])
            .db("insert the payload")?;
        if let Some(key) = &job.idempotency_key {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO jobq_dedup (ns, tenant, key, job_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![ns, job.tenant, key, id.to_bytes(), now.as_millis()])
            })
            .db("record the idempotency key")?;
        }
        if job.is_ready(now) {
            tx.wake(ns);
        }
        Ok(Enqueued { id, created: true })
    }
}

/// The job that holds `key` for `job`'s tenant now, if one does.
fn held_key(
    conn: &Connection,
    ns: i64,
    settings: &StoreSettings,
    job: &NewJob,
    key: &str,
    now: Timestamp,
) -> Result<Option<JobId>> {
    let existing: Option<([u8; 16], i64)> = conn
        .prepare_cached(
            "SELECT job_id, created_at FROM jobq_dedup
             WHERE ns = ?1 AND tenant = ?2 AND key = ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, job.tenant, key], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
        })
        .db("look the idempotency key up")?;
    let Some((id_bytes, created_at)) = existing else {
        return Ok(None);
    };
    let id = id_from_blob("idempotency record", id_bytes)?;
    // The key counts only while its window is open and its job still exists (E2, E6),
    // or, unique while active, while its job is queued or running (E10); a key whose
    // job is gone is taken over by the new job (E5).
    let holds = match job.uniqueness {
        Uniqueness::Window => {
            settings.dedup_active(Timestamp::from_millis(created_at), now)
                && job_exists(conn, ns, id)?
        }
        Uniqueness::WhileActive => job_state(conn, ns, id)?.is_some_and(JobState::is_active),
    };
    Ok(holds.then_some(id))
}

/// The highest priority below `?3` that holds queued jobs in one queue: one index seek.
const NEXT_BAND_SQL: &str = "SELECT priority FROM jobq_jobs INDEXED BY jobq_jobs_ready
     WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority < ?3
     ORDER BY priority DESC LIMIT 1";

/// Whether a queue is paused (CONTRACT Q1).
const PAUSED_SQL: &str = "SELECT 1 FROM jobq_paused WHERE ns = ?1 AND queue = ?2";

/// The priority band `priority` read from the ready index, or a corrupt record.
fn band_priority(queue: &str, priority: i64) -> Result<i16> {
    i16::try_from(priority).map_err(|_| {
        Error::corrupt(
            format!("queue {queue}"),
            format!("priority {priority} out of range"),
        )
    })
}

/// Up to `limit` ready jobs of one queue in claim order, appended to `out`.
///
/// SQLite cannot skip from one priority band to the next inside a range scan, so a
/// plain `ORDER BY priority DESC, run_at, seq` with `run_at <= now` would walk every
/// *scheduled* job of a band before reaching the ready jobs of the next. This walks the
/// bands itself: one index seek finds the next lower priority that has queued jobs, one
/// range scan takes that band's ready jobs. The cost follows the jobs returned and the
/// bands visited, not the scheduled backlog.
fn ready_candidates(
    conn: &Connection,
    ns: i64,
    queue: &str,
    now: Timestamp,
    limit: usize,
    out: &mut Vec<(ReadyOrder, i64)>,
) -> Result<()> {
    let mut band = conn
        .prepare_cached(NEXT_BAND_SQL)
        .db("prepare the priority scan")?;
    let mut ready = conn
        .prepare_cached(
            "SELECT job, run_at, seq FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq LIMIT ?5",
        )
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
        let remaining = i64::try_from(limit - found).unwrap_or(i64::MAX);
        let mut rows = ready
            .query(params![ns, queue, priority, now.as_millis(), remaining])
            .db("scan ready jobs")?;
        while let Some(row) = rows.next().db("scan ready jobs")? {
            let job: i64 = row.get(0).db("read a ready job")?;
            let run_at: i64 = row.get(1).db("read a ready job")?;
            let seq: i64 = row.get(2).db("read a ready job")?;
            let seq = u64::try_from(seq).unwrap_or(0);
            out.push((
                ReadyOrder::new(as_i16, Timestamp::from_millis(run_at), seq),
                job,
            ));
            found += 1;
        }
        below = priority;
    }
    Ok(())
}

/// The job a row of a scan names, for a corrupt-record report; the row number when
/// its id cannot be read either.
/// How an error names job row `job`: by its id, read apart (only for an error, so the
/// scans that find none stay within their index).
fn job_subject(conn: &Connection, job: i64) -> String {
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
/// memory.
fn fitting_candidates(
    conn: &Connection,
    ns: i64,
    queue: &str,
    request: &ClaimRequest,
    now: Timestamp,
    verdicts: &mut Verdicts<'_>,
    out: &mut Vec<(FitOrder, i64)>,
) -> Result<()> {
    let mut band = conn
        .prepare_cached(NEXT_BAND_SQL)
        .db("prepare the priority scan")?;
    // No LIMIT: how far to read depends on what the rows hold, so the scan is stepped
    // only as far as needed and dropped (which resets it) there.
    let mut ready = conn
        .prepare_cached(
            "SELECT job, run_at, seq, placement FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND priority = ?3 AND run_at <= ?4
             ORDER BY run_at, seq",
        )
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
        let mut rows = ready
            .query(params![ns, queue, priority, now.as_millis()])
            .db("scan ready jobs")?;
        while let Some(row) = rows.next().db("scan ready jobs")? {
            let job: i64 = row.get(0).db("read a ready job")?;
            let (fits, is_preferred) = match verdicts.judge(row.get_ref(3).db("read a ready job")?)
            {
                Ok(verdict) => verdict,
                Err(why) => {
                    // Buried once the scan is done (CONTRACT C10).
                    verdicts.unreadable.push((job, why));
                    continue;
                }
            };
            if !fits {
                continue;
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
            if preferred == room || (!prefers && elsewhere == room) {
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
struct Verdicts<'r> {
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
/// the claim's queues that is not paused, and admitted by its budget), found by id.
fn reserved_row(
    conn: &Connection,
    ns: i64,
    request: &ClaimRequest,
    id: JobId,
    now: Timestamp,
) -> Result<Option<i64>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT job, queue, state, run_at, placement FROM jobq_jobs
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
    drop(rows);
    let needs = match placement {
        Ok((needs, _)) => needs,
        Err(why) => {
            bury(conn, job, &unreadable_placement(&why), now)?;
            return Ok(None);
        }
    };
    if !request.admits(&needs) {
        return Ok(None);
    }
    let paused = conn
        .prepare_cached(PAUSED_SQL)
        .and_then(|mut stmt| stmt.exists(params![ns, queue]))
        .db("check a pause")?;
    Ok((!paused).then_some(job))
}

/// The distinct queues of a claim, less the paused ones. Read in the claim's own write
/// transaction, so a pause committed before the claim began is always seen (CONTRACT
/// Q1).
fn unpaused_queues<'a>(conn: &Connection, ns: i64, named: &'a [String]) -> Result<Vec<&'a str>> {
    let mut queues: Vec<&str> = named.iter().map(String::as_str).collect();
    queues.sort_unstable();
    queues.dedup();
    let mut paused = conn
        .prepare_cached(PAUSED_SQL)
        .db("prepare the pause check")?;
    let mut open = 0;
    for index in 0..queues.len() {
        if !paused
            .exists(params![ns, queues[index]])
            .db("check a pause")?
        {
            queues.swap(open, index);
            open += 1;
        }
    }
    queues.truncate(open);
    Ok(queues)
}

/// The rows a fitted claim takes (CONTRACT F2–F6), in its order: every queue's
/// candidates from [`fitting_candidates`], merged, ordered, then cut to the limit. Each
/// queue gave every job of its own that can make the cut, so the cut of the merge is
/// the cut of all the fitting jobs.
fn fitted_rows(
    conn: &Connection,
    ns: i64,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<i64>> {
    if let Some(id) = request.reserved {
        let row = reserved_row(conn, ns, request, id, now)?;
        return Ok(row.into_iter().take(request.limit).collect());
    }
    let mut candidates = Vec::new();
    let mut verdicts = Verdicts::new(request);
    for queue in unpaused_queues(conn, ns, &request.queues)? {
        fitting_candidates(
            conn,
            ns,
            queue,
            request,
            now,
            &mut verdicts,
            &mut candidates,
        )?;
    }
    for (row, why) in verdicts.unreadable {
        bury(conn, row, &unreadable_placement(&why), now)?;
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
    if request.is_fitted() {
        let rows = fitted_rows(conn, ns, request, now)?;
        return lease_rows(conn, rows.into_iter(), request, now);
    }
    let mut candidates = Vec::new();
    for queue in unpaused_queues(conn, ns, &request.queues)? {
        ready_candidates(conn, ns, queue, now, request.limit, &mut candidates)?;
    }
    // Each queue gave its first `limit` jobs, so the first `limit` of the merge are the
    // first `limit` of the whole ready set (C3).
    candidates.sort_by_key(|(order, _)| *order);
    candidates.truncate(request.limit);
    lease_rows(
        conn,
        candidates.into_iter().map(|(_, row)| row),
        request,
        now,
    )
}

/// Leases the jobs in `rows` to the claimer, in that order, and returns them as the
/// lease left them.
fn lease_rows(
    conn: &Connection,
    rows: impl ExactSizeIterator<Item = i64>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
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
            Err(Error::Corrupt { reason, .. }) => bury(conn, row, &reason, now)?,
            Err(other) => return Err(other),
        }
    }

    let expires_at = now.saturating_add(request.lease_ttl);
    let mut update = conn
        .prepare_cached(
            "UPDATE jobq_jobs SET state = 1, attempts = attempts + 1,
                 lease_token = lease_token + 1, lease_worker = ?2, lease_expires_at = ?3,
                 started_at = ?4, heartbeat_at = ?4
             WHERE job = ?1",
        )
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
fn claimable(found: &Row<'_>, placements: &mut PlacementCache) -> Result<(Job, u64, Vec<u8>)> {
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
fn bury(conn: &Connection, row: i64, reason: &str, now: Timestamp) -> Result<()> {
    finish(
        conn,
        row,
        DEAD,
        Some(&format!("corrupt record: {reason}")),
        now,
    )
}

/// The reason a job whose placement a fitted claim could not read is buried with.
fn unreadable_placement(why: &str) -> String {
    format!("placement unreadable: {why}")
}

/// The parts of a job that the lease calls decide on.
struct LeaseRow {
    row: i64,
    attempts: Attempts,
}

/// The counters [`transition`] decides on, read from a row; out-of-range values are a
/// corrupt record, found before anything is written.
fn attempts_from_row(id: JobId, taken: i64, max: i64, cancel_requested: i64) -> Result<Attempts> {
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
fn check_lease(conn: &Connection, ns: i64, id: JobId, token: LeaseToken) -> Result<LeaseRow> {
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
    Completer::new(tx.conn())?.complete(ns, id, token, result, now)
}

/// The completion statement, prepared once for a batch of completions.
pub(crate) struct Completer<'c> {
    conn: &'c Connection,
    update: CachedStatement<'c>,
}

impl<'c> Completer<'c> {
    /// Prepares the statement on the write transaction's connection.
    pub(crate) fn new(conn: &'c Connection) -> Result<Self> {
        // The lease check is the UPDATE's own condition: one index seek and one write
        // per job. Only a completion that changes nothing reads the row again, to say
        // whether the job is gone or its lease is.
        let update = conn
            .prepare_cached(
                "UPDATE jobq_jobs SET state = 2, result = ?4, lease_expires_at = NULL,
                     finished_at = ?5, last_error = NULL
                 WHERE ns = ?1 AND id = ?2 AND state = 1 AND lease_token = ?3",
            )
            .db("prepare the completion")?;
        Ok(Completer { conn, update })
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
        let Some(token_value) = token_value(token) else {
            // Never issued: no row can carry it.
            check_lease(self.conn, ns, id, token)?;
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
            // The row is not running under this token: the check says which refusal.
            check_lease(self.conn, ns, id, token)?;
            return Err(Error::LeaseLost { id });
        }
        Ok(())
    }
}

/// Ends a job for good: `succeeded` is set by [`complete`]; this is `dead` or
/// `cancelled`, with the lease cleared and `last_error` set when given.
fn finish(
    conn: &Connection,
    row: i64,
    state: i64,
    error: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    conn.prepare_cached(
        "UPDATE jobq_jobs SET state = ?2, lease_worker = NULL, lease_expires_at = NULL,
             finished_at = ?3, last_error = COALESCE(?4, last_error)
         WHERE job = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![row, state, now.as_millis(), error]))
    .db("finish the job")?;
    Ok(())
}

/// Puts a job back in `queued`, ready at `run_at`, behind every job already there
/// (a fresh `seq`). `attempts_delta` takes back an attempt on release (L8).
fn requeue(
    tx: &mut WriteTx<'_>,
    ns: i64,
    row: i64,
    run_at: Timestamp,
    attempts_delta: i64,
    error: Option<&str>,
) -> Result<()> {
    let seq = tx.next_seq()?;
    tx.conn()
        .prepare_cached(
            "UPDATE jobq_jobs SET state = 0, run_at = ?2, seq = ?3,
                 attempts = MAX(attempts + ?4, 0), lease_worker = NULL,
                 lease_expires_at = NULL, last_error = COALESCE(?5, last_error)
             WHERE job = ?1",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![row, run_at.as_millis(), seq, attempts_delta, error])
        })
        .db("requeue the job")?;
    tx.wake(ns);
    Ok(())
}

/// Moves a job whose attempt ended to where `next` says; `attempts_delta` is added to
/// its attempts if it is queued again.
fn apply(
    tx: &mut WriteTx<'_>,
    ns: i64,
    row: i64,
    next: Next,
    attempts_delta: i64,
    error: Option<&str>,
    now: Timestamp,
) -> Result<JobState> {
    match next {
        Next::Queued { ready_at } => requeue(tx, ns, row, ready_at, attempts_delta, error)?,
        Next::Finished(state) => finish(tx.conn(), row, state_code(state), error, now)?,
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
fn record_attempt(
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
    Ok(reclaimed)
}

fn current_state(conn: &Connection, ns: i64, id: JobId) -> Result<(i64, JobState)> {
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
        JobState::Queued => {
            finish(tx.conn(), row, CANCELLED, None, now)?;
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
    let seq = tx.next_seq()?;
    tx.conn()
        .prepare_cached(
            "UPDATE jobq_jobs SET state = 0, run_at = ?2, seq = ?3, attempts = 0,
                 cancel_requested = 0, finished_at = NULL, result = NULL,
                 lease_worker = NULL, lease_expires_at = NULL, started_at = NULL,
                 heartbeat_at = NULL, last_error = NULL
             WHERE job = ?1",
        )
        .and_then(|mut stmt| stmt.execute(params![row, now.as_millis(), seq]))
        .db("retry the job")?;
    tx.wake(ns);
    Ok(())
}

/// Rule A5: deletes terminal jobs that finished at or before `cutoff` with their
/// payloads, their attempts (H4) and the idempotency records that point at them.
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
fn delete_record(conn: &Connection, ns: i64, row: i64, id: &[u8]) -> Result<()> {
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

/// Deletes every job of namespace `ns` with its payload and attempts, and its
/// idempotency records, pauses, schedules and workers.
/// The namespace's row stays, so its id is never reused (see
/// `SqliteStore::clear_namespace`).
pub(crate) fn clear_namespace(tx: &mut WriteTx<'_>, ns: i64) -> Result<u64> {
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
    Ok(u64::try_from(jobs).unwrap_or(u64::MAX))
}

/// Rule S1: a new schedule starts enabled at `now`; a known one keeps both.
pub(crate) fn put_schedule(
    tx: &mut WriteTx<'_>,
    ns: i64,
    name: &str,
    spec: &str,
    now: Timestamp,
) -> Result<()> {
    tx.conn()
        .prepare_cached(
            "INSERT INTO jobq_schedules (ns, name, spec, enabled, last_tick)
             VALUES (?1, ?2, ?3, 1, ?4)
             ON CONFLICT (ns, name) DO UPDATE SET spec = excluded.spec",
        )
        .and_then(|mut stmt| stmt.execute(params![ns, name, spec, now.as_millis()]))
        .db("store a schedule")
        .map(drop)
}

/// Rule S1: every schedule, by name.
pub(crate) fn schedules(conn: &Connection, ns: i64) -> Result<Vec<StoredSchedule>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT name, spec, enabled, last_tick FROM jobq_schedules
             WHERE ns = ?1 ORDER BY name",
        )
        .db("prepare the schedules")?;
    let rows = stmt
        .query_map([ns], |row| {
            Ok(StoredSchedule {
                name: row.get(0)?,
                spec: row.get(1)?,
                enabled: row.get::<_, i64>(2)? != 0,
                last_tick: Timestamp::from_millis(row.get(3)?),
            })
        })
        .db("read the schedules")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .db("read the schedules")
}

/// Rule S2: only what `update` sets changes; the last tick only moves forward.
pub(crate) fn update_schedule(
    tx: &mut WriteTx<'_>,
    ns: i64,
    name: &str,
    update: ScheduleUpdate,
) -> Result<()> {
    let changed = tx
        .conn()
        .prepare_cached(
            "UPDATE jobq_schedules SET
                 enabled = COALESCE(?3, enabled),
                 last_tick = MAX(last_tick, COALESCE(?4, last_tick))
             WHERE ns = ?1 AND name = ?2",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                ns,
                name,
                update.enabled.map(i64::from),
                update.last_tick.map(Timestamp::as_millis)
            ])
        })
        .db("update a schedule")?;
    if changed == 0 {
        return Err(Error::ScheduleNotFound {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Rule S1: whether the schedule existed.
pub(crate) fn delete_schedule(tx: &mut WriteTx<'_>, ns: i64, name: &str) -> Result<bool> {
    tx.conn()
        .prepare_cached("DELETE FROM jobq_schedules WHERE ns = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, name]))
        .db("delete a schedule")
        .map(|deleted| deleted > 0)
}

/// Rule W1: stores worker `id` whole, its `in_flight` and `last_seen` `now`, replacing
/// any record of that id.
pub(crate) fn put_worker(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: &str,
    spec: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<()> {
    tx.conn()
        .prepare_cached(
            "INSERT INTO jobq_workers (ns, id, spec, in_flight, last_seen)
             VALUES (?1, ?2, ?3, ?5, ?4)
             ON CONFLICT (ns, id) DO UPDATE SET
                 spec = excluded.spec,
                 in_flight = excluded.in_flight,
                 last_seen = excluded.last_seen",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![ns, id, spec, now.as_millis(), i64::from(in_flight)])
        })
        .db("store a worker")
        .map(drop)
}

/// Rule W2: sets a worker's `in_flight` and `last_seen`; whether it is registered (an
/// unknown worker is not created).
pub(crate) fn touch_worker(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<bool> {
    tx.conn()
        .prepare_cached(
            "UPDATE jobq_workers SET in_flight = ?3, last_seen = ?4
             WHERE ns = ?1 AND id = ?2",
        )
        .and_then(|mut stmt| stmt.execute(params![ns, id, i64::from(in_flight), now.as_millis()]))
        .db("update a worker")
        .map(|changed| changed > 0)
}

/// Rule W3: whether the worker existed.
pub(crate) fn delete_worker(tx: &mut WriteTx<'_>, ns: i64, id: &str) -> Result<bool> {
    tx.conn()
        .prepare_cached("DELETE FROM jobq_workers WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, id]))
        .db("delete a worker")
        .map(|deleted| deleted > 0)
}

/// Rule W1: every worker of the namespace, by id. A negative or oversized `in_flight`,
/// or a value of the wrong type, is a corrupt record.
pub(crate) fn workers(conn: &Connection, ns: i64) -> Result<Vec<StoredWorker>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, spec, in_flight, last_seen FROM jobq_workers
             WHERE ns = ?1 ORDER BY id",
        )
        .db("prepare the workers")?;
    let mut rows = stmt.query([ns]).db("read the workers")?;
    let mut workers = Vec::new();
    while let Some(row) = rows.next().db("read the workers")? {
        let id: String = row.get(0).db("read a worker's id")?;
        let what = || format!("worker {id}");
        let spec: String = row
            .get(1)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        let raw: i64 = row
            .get(2)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        let in_flight = u32::try_from(raw)
            .map_err(|_| Error::corrupt(what(), format!("in_flight holds {raw}, out of range")))?;
        let last_seen: i64 = row
            .get(3)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        workers.push(StoredWorker {
            id,
            spec,
            in_flight,
            last_seen: Timestamp::from_millis(last_seen),
        });
    }
    Ok(workers)
}

/// Rule W4: deletes the workers last seen strictly before `cutoff`; their ids, sorted.
pub(crate) fn reap_workers(
    tx: &mut WriteTx<'_>,
    ns: i64,
    cutoff: Timestamp,
) -> Result<Vec<String>> {
    let conn = tx.conn();
    let mut ids = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM jobq_workers INDEXED BY jobq_workers_seen
                 WHERE ns = ?1 AND last_seen < ?2",
            )
            .db("prepare the silent workers")?;
        let rows = stmt
            .query_map(params![ns, cutoff.as_millis()], |row| {
                row.get::<_, String>(0)
            })
            .db("find the silent workers")?;
        rows.collect::<rusqlite::Result<Vec<String>>>()
            .db("find the silent workers")?
    };
    if ids.is_empty() {
        return Ok(ids);
    }
    conn.prepare_cached(
        "DELETE FROM jobq_workers INDEXED BY jobq_workers_seen
         WHERE ns = ?1 AND last_seen < ?2",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, cutoff.as_millis()]))
    .db("delete the silent workers")?;
    ids.sort_unstable();
    Ok(ids)
}

/// Deletes a job's record, payload and attempts but keeps its idempotency record: a
/// lost record, for testing C7 and R5.
pub(crate) fn vanish(tx: &mut WriteTx<'_>, ns: i64, id: JobId) -> Result<()> {
    let (row, _) = current_state(tx.conn(), ns, id)?;
    delete_record(tx.conn(), ns, row, &id.to_bytes())
}

/// Rule E1.
pub(crate) fn get(conn: &Connection, ns: i64, id: JobId) -> Result<Job> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobq_jobs WHERE ns = ?1 AND id = ?2"
        ))
        .db("prepare get")?;
    let mut rows = stmt.query(params![ns, id.to_bytes()]).db("read a job")?;
    match rows.next().db("read a job")? {
        Some(row) => job_from_row(row),
        None => Err(Error::NotFound { id }),
    }
}

/// Rule E1: the payload bytes.
pub(crate) fn payload(conn: &Connection, ns: i64, id: JobId) -> Result<Bytes> {
    let found: Option<Option<Vec<u8>>> = conn
        .prepare_cached(
            "SELECT p.payload FROM jobq_jobs j LEFT JOIN jobq_payloads p ON p.job = j.job
             WHERE j.ns = ?1 AND j.id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| row.get(0))
                .optional()
        })
        .db("read a payload")?;
    match found {
        None => Err(Error::NotFound { id }),
        Some(None) => Err(Error::corrupt(format!("job {id}"), "payload missing")),
        Some(Some(bytes)) => Ok(Bytes::from(bytes)),
    }
}

fn collect_jobs(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Job>> {
    let mut stmt = conn.prepare_cached(sql).db("prepare a job query")?;
    let mut rows = stmt.query(params).db("query jobs")?;
    let mut jobs = Vec::new();
    while let Some(row) = rows.next().db("query jobs")? {
        jobs.push(job_from_row(row)?);
    }
    Ok(jobs)
}

/// Rule E8.
pub(crate) fn children(conn: &Connection, ns: i64, parent: JobId) -> Result<Vec<Job>> {
    collect_jobs(
        conn,
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobq_jobs INDEXED BY jobq_jobs_parent
             WHERE ns = ?1 AND parent = ?2 ORDER BY id"
        ),
        params![ns, parent.to_bytes()],
    )
}

/// Rules H1–H4: the job's attempts, oldest first, from one snapshot: the records of
/// the attempts that ended by `fail`, `release` or `reclaim`, and the running or
/// succeeded attempt the job's own row describes (`durq_core::attempts::history` puts
/// them together). `NotFound` for an unknown job; a value that cannot be read back is
/// a corrupt record.
pub(crate) fn attempts(conn: &Connection, ns: i64, id: JobId) -> Result<Vec<Attempt>> {
    let what = || format!("job {id}");
    let corrupt = |why: String| Error::corrupt(what(), why);
    let tx = conn.unchecked_transaction().db("begin a read")?;
    type ClaimColumns = (i64, Option<String>, i64, Option<i64>, Option<i64>);
    let found: Option<ClaimColumns> = tx
        .prepare_cached(
            "SELECT state, lease_worker, lease_token, started_at, finished_at
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
                ))
            })
            .optional()
        })
        .db("read a job's last claim")?;
    let Some((state, worker, token, started_at, finished_at)) = found else {
        return Err(Error::NotFound { id });
    };
    let state = state_from_code(state).ok_or_else(|| corrupt(format!("unknown state {state}")))?;
    let token = u64::try_from(token)
        .map_err(|_| corrupt(format!("lease_token holds {token}, out of range")))?;
    let mut ended = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT token, worker, started_at, ended_at, outcome, error
                 FROM jobq_attempts WHERE ns = ?1 AND job_id = ?2",
            )
            .db("prepare the attempts")?;
        let mut rows = stmt
            .query(params![ns, id.to_bytes()])
            .db("read the attempts")?;
        while let Some(row) = rows.next().db("read the attempts")? {
            let field = |err: rusqlite::Error| corrupt(format!("an attempt record: {err}"));
            let token: i64 = row.get(0).map_err(field)?;
            let token = u64::try_from(token)
                .map_err(|_| corrupt(format!("an attempt's token holds {token}")))?;
            let outcome: String = row.get(4).map_err(field)?;
            let outcome = outcome
                .parse::<AttemptOutcome>()
                .map_err(|err| corrupt(format!("an attempt record: {err}")))?;
            ended.push(Attempt {
                token: LeaseToken::new(token),
                worker: row.get(1).map_err(field)?,
                started_at: Timestamp::from_millis(row.get(2).map_err(field)?),
                ended_at: Some(Timestamp::from_millis(row.get(3).map_err(field)?)),
                outcome,
                error: row.get(5).map_err(field)?,
            });
        }
    }
    tx.finish().db("end a read")?;
    Ok(attempts::history(
        ended,
        LastClaim {
            state,
            worker,
            token: LeaseToken::new(token),
            started_at: millis(started_at),
            finished_at: millis(finished_at),
        },
    ))
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

/// Adds `count` jobs of state `code` to a queue's counts (queued jobs to `queued`, to be
/// split into ready and scheduled); an unknown state code is a corrupt record.
fn count_state(
    stats: &mut QueueStats,
    queued: &mut u64,
    queue: &str,
    code: i64,
    count: i64,
) -> Result<()> {
    let count = u64::try_from(count).unwrap_or(0);
    match state_from_code(code) {
        Some(JobState::Queued) => *queued = count,
        Some(JobState::Running) => stats.running = count,
        Some(JobState::Succeeded) => stats.succeeded = count,
        Some(JobState::Dead) => stats.dead = count,
        Some(JobState::Cancelled) => stats.cancelled = count,
        None => {
            return Err(Error::corrupt(
                format!("queue {queue}"),
                format!("{count} jobs in unknown state {code}"),
            ))
        }
    }
    Ok(())
}

/// Rule A3, from one snapshot.
pub(crate) fn stats(conn: &Connection, ns: i64, queue: &str, now: Timestamp) -> Result<QueueStats> {
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let mut stats = QueueStats::default();
    let mut queued = 0u64;
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT state, COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
                 WHERE ns = ?1 AND queue = ?2 GROUP BY state",
            )
            .db("prepare stats")?;
        let mut rows = stmt.query(params![ns, queue]).db("count jobs")?;
        while let Some(row) = rows.next().db("count jobs")? {
            let code: i64 = row.get(0).db("count jobs")?;
            let count: i64 = row.get(1).db("count jobs")?;
            count_state(&mut stats, &mut queued, queue, code, count)?;
        }
    }
    let ready: i64 = tx
        .prepare_cached(
            "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND run_at <= ?3",
        )
        .and_then(|mut stmt| stmt.query_row(params![ns, queue, now.as_millis()], |r| r.get(0)))
        .db("count ready jobs")?;
    stats.ready = u64::try_from(ready).unwrap_or(0).min(queued);
    stats.scheduled = queued - stats.ready;
    tx.finish().db("end a read")?;
    Ok(stats)
}

/// Rule A7: every queue holding a job, by name, with its counts (as [`stats`] counts
/// them) and the ready time of its oldest ready job, in one read transaction. The
/// cost follows the namespace's queues and states, then each queue's ready jobs.
pub(crate) fn queues(conn: &Connection, ns: i64, now: Timestamp) -> Result<Vec<QueueOverview>> {
    let tx = conn.unchecked_transaction().db("begin a read")?;
    // (queue, counts, queued) in name order.
    let mut found: Vec<(String, QueueStats, u64)> = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT queue, state, COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
                 WHERE ns = ?1 GROUP BY queue, state ORDER BY queue",
            )
            .db("prepare the queue list")?;
        let mut rows = stmt.query(params![ns]).db("list the queues")?;
        while let Some(row) = rows.next().db("list the queues")? {
            let queue: String = row.get(0).db("list the queues")?;
            let code: i64 = row.get(1).db("list the queues")?;
            let count: i64 = row.get(2).db("list the queues")?;
            if found.last().is_none_or(|(last, _, _)| *last != queue) {
                found.push((queue.clone(), QueueStats::default(), 0));
            }
            if let Some((name, stats, queued)) = found.last_mut() {
                count_state(stats, queued, name, code, count)?;
            }
        }
    }
    let mut ready = tx
        .prepare_cached(
            "SELECT COUNT(*), MIN(run_at) FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND run_at <= ?3",
        )
        .db("prepare the ready count")?;
    let mut overviews = Vec::with_capacity(found.len());
    for (queue, mut stats, queued) in found {
        let mut oldest_ready = None;
        if queued > 0 {
            let (count, oldest): (i64, Option<i64>) = ready
                .query_row(params![ns, queue, now.as_millis()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .db("count ready jobs")?;
            stats.ready = u64::try_from(count).unwrap_or(0).min(queued);
            oldest_ready = oldest.map(Timestamp::from_millis);
        }
        stats.scheduled = queued - stats.ready;
        overviews.push(QueueOverview::new(queue, stats, oldest_ready));
    }
    drop(ready);
    tx.finish().db("end a read")?;
    Ok(overviews)
}

/// The most rows one `list` call examines before it ends its page early, `next` set
/// to the last id it examined (CONTRACT A4 lets a backend bound the work of one call):
/// a filter that matches few jobs costs at most this many rows per page, and the
/// caller pages on. A page the index ranges answer alone (one queue, or a few queues
/// and states, without a tenant or tag filter) never stops early: every row they yield
/// matches, and a page holds at most 1,000.
const LIST_EXAMINE_MAX: usize = 16_384;

/// The most (queue, state) streams one `list` call merges; a filter that would need
/// more walks the id index once instead.
const LIST_MAX_STREAMS: usize = 32;

/// The rows of one queue in one state, newest first, from the state index alone when
/// no tenant or tag filter needs the row.
const LIST_STATE_SQL: &str = "SELECT job, id, queue, state FROM jobq_jobs
     INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue = ?2 AND state = ?3 AND id < ?4 ORDER BY id DESC LIMIT ?5";
const LIST_STATE_SCOPED_SQL: &str = "SELECT job, id, queue, state, tenant, tags FROM jobq_jobs
     INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue = ?2 AND state = ?3 AND id < ?4 ORDER BY id DESC LIMIT ?5";
/// Every row of the namespace, newest first, through the id index.
const LIST_ALL_SQL: &str = "SELECT job, id, queue, state FROM jobq_jobs INDEXED BY jobq_jobs_id
     WHERE ns = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3";
const LIST_ALL_SCOPED_SQL: &str = "SELECT job, id, queue, state, tenant, tags FROM jobq_jobs
     INDEXED BY jobq_jobs_id
     WHERE ns = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3";

/// The first queue name at or after `?2`, and the first after it: one index seek each.
const FIRST_QUEUE_SQL: &str = "SELECT queue FROM jobq_jobs INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue >= ?2 ORDER BY queue LIMIT 1";
const NEXT_QUEUE_SQL: &str = "SELECT queue FROM jobq_jobs INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue > ?2 ORDER BY queue LIMIT 1";

/// Where one stream of `list` candidates comes from.
enum ListStream<'q> {
    /// One queue's jobs in one state.
    QueueState(&'q str, JobState),
    /// Every job of the namespace.
    All,
}

/// One stream of `list` candidates, newest first, read in chunks: each chunk is one
/// statement run to its end, so any number of streams share the cached statements.
struct ListSource<'q> {
    stream: ListStream<'q>,
    /// Fetched and not yet merged: (row, id, whether it matches every filter).
    buffered: std::collections::VecDeque<(i64, [u8; 16], bool)>,
    /// The last id fetched (exclusive bound of the next chunk).
    below: Vec<u8>,
    /// Rows the next chunk asks for; doubles with each chunk, so a stream that gives
    /// most of a page takes few statements.
    chunk: usize,
    exhausted: bool,
}

impl ListSource<'_> {
    /// Fetches the stream's next chunk, judging each row against `query`'s filters
    /// with the durq-core matchers, so a queue prefix is compared byte for byte and a
    /// tag exactly, as the reference does (no SQL pattern, no JSON path).
    fn refill(&mut self, conn: &Connection, ns: i64, query: &ListQuery) -> Result<()> {
        let scoped = !query.tenant.is_empty() || !query.tags.is_empty();
        let limit = i64::try_from(self.chunk).unwrap_or(i64::MAX);
        let mut stmt;
        let mut rows = match self.stream {
            ListStream::QueueState(queue, state) => {
                let sql = if scoped {
                    LIST_STATE_SCOPED_SQL
                } else {
                    LIST_STATE_SQL
                };
                stmt = conn.prepare_cached(sql).db("prepare the list scan")?;
                stmt.query(params![ns, queue, state_code(state), self.below, limit])
            }
            ListStream::All => {
                let sql = if scoped {
                    LIST_ALL_SCOPED_SQL
                } else {
                    LIST_ALL_SQL
                };
                stmt = conn.prepare_cached(sql).db("prepare the list scan")?;
                stmt.query(params![ns, self.below, limit])
            }
        }
        .db("scan jobs to list")?;
        let mut fetched = 0usize;
        while let Some(row) = rows.next().db("scan jobs to list")? {
            fetched += 1;
            let read = |err| crate::error::db_error("read a job to list", err);
            let job: i64 = row.get(0).map_err(read)?;
            let id: [u8; 16] = row.get(1).map_err(read)?;
            let matches = list_match(row, query, scoped)
                .map_err(|why| Error::corrupt(job_subject(conn, job), why))?;
            self.buffered.push_back((job, id, matches));
            self.below.clear();
            self.below.extend_from_slice(&id);
        }
        self.exhausted = fetched < self.chunk;
        self.chunk = (self.chunk * 2).min(1024);
        Ok(())
    }
}

/// Whether a row a list scan read passes every filter of `query`; why not, when a
/// value it must judge cannot be read.
fn list_match(row: &Row<'_>, query: &ListQuery, scoped: bool) -> std::result::Result<bool, String> {
    let text = |index: usize| -> std::result::Result<&str, String> {
        row.get_ref(index)
            .and_then(|value| value.as_str().map_err(Into::into))
            .map_err(|err| err.to_string())
    };
    let code: i64 = row.get(3).map_err(|err| err.to_string())?;
    let state = state_from_code(code).ok_or_else(|| format!("unknown state {code}"))?;
    if !(query.matches_queue(text(2)?) && query.matches_state(state)) {
        return Ok(false);
    }
    if !scoped {
        return Ok(true);
    }
    // Tags are decoded only when the query names some.
    let tags = if query.tags.is_empty() {
        Tags::new()
    } else {
        tags_from(row.get_ref(5).map_err(|err| err.to_string())?)?
    };
    Ok(query.matches_scope(text(4)?, &tags))
}

/// The queues of the namespace whose names start with `prefix` (every queue for an
/// empty one), in name order, one index seek each; `None` once there are more than
/// `cap`. Names compare as bytes in SQLite and in Rust alike, so the names with a
/// prefix are one run starting at the prefix itself.
fn queues_with_prefix(
    conn: &Connection,
    ns: i64,
    prefix: &str,
    cap: usize,
) -> Result<Option<Vec<String>>> {
    let mut first = conn
        .prepare_cached(FIRST_QUEUE_SQL)
        .db("prepare the queue seek")?;
    let mut next = conn
        .prepare_cached(NEXT_QUEUE_SQL)
        .db("prepare the queue seek")?;
    let mut found: Vec<String> = Vec::new();
    loop {
        let queue: Option<String> = match found.last() {
            None => first.query_row(params![ns, prefix], |row| row.get(0)),
            Some(last) => next.query_row(params![ns, last], |row| row.get(0)),
        }
        .optional()
        .db("find the queues to list")?;
        match queue {
            Some(queue) if queue.starts_with(prefix) => {
                if found.len() == cap {
                    return Ok(None);
                }
                found.push(queue);
            }
            _ => return Ok(Some(found)),
        }
    }
}

/// Rule A4: the jobs matching every filter of `query`, newest first by id, after its
/// cursor, from one snapshot.
///
/// The plan: the candidates come from streams that each yield rows newest first,
/// merged by id. A queue (and any states) reads one range of the state index
/// `(ns, queue, state, id)` per state asked; no queue, with a prefix or states, finds
/// the matching queues by seeking the same index and reads one range per (queue,
/// state), up to [`LIST_MAX_STREAMS`]; every queue and every state, or more streams
/// than that, walks the id index `(ns, id)` back from the cursor once. Tenant and
/// tags are judged on the rows read (no index serves them, so enqueues keep their
/// cost). Then the page's rows, and only those, are read whole. The cursor is only a
/// bound (`id < cursor`), so it works after its job is deleted.
pub(crate) fn list(conn: &Connection, ns: i64, query: &ListQuery) -> Result<ListPage> {
    // Every id is 16 bytes; 17 bytes of 0xff sort after all of them.
    let below: Vec<u8> = match query.cursor {
        Some(id) => id.to_bytes().to_vec(),
        None => vec![0xff; 17],
    };
    let states: Vec<JobState> = JobState::ALL
        .into_iter()
        .filter(|state| query.matches_state(*state))
        .collect();
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let found_queues;
    let streams: Vec<ListStream<'_>> = match (&query.queue, &query.queue_prefix) {
        (Some(queue), _) if !query.matches_queue(queue) => Vec::new(),
        (Some(queue), _) => states
            .iter()
            .map(|state| ListStream::QueueState(queue, *state))
            .collect(),
        (None, None) if query.states.is_empty() => vec![ListStream::All],
        (None, prefix) => {
            let cap = LIST_MAX_STREAMS / states.len().max(1);
            found_queues = queues_with_prefix(&tx, ns, prefix.as_deref().unwrap_or(""), cap)?;
            match &found_queues {
                Some(queues) => queues
                    .iter()
                    .flat_map(|queue| {
                        states
                            .iter()
                            .map(move |state| ListStream::QueueState(queue, *state))
                    })
                    .collect(),
                None => vec![ListStream::All],
            }
        }
    };
    let chunk = query.limit.div_ceil(streams.len().max(1)).clamp(16, 1024);
    let mut sources: Vec<ListSource<'_>> = streams
        .into_iter()
        .map(|stream| ListSource {
            stream,
            buffered: std::collections::VecDeque::new(),
            below: below.clone(),
            chunk,
            exhausted: false,
        })
        .collect();

    let mut matched: Vec<(i64, [u8; 16])> = Vec::with_capacity(query.limit.min(1024));
    let mut examined = 0usize;
    let mut last_examined = None;
    while matched.len() < query.limit && examined < LIST_EXAMINE_MAX {
        for source in &mut sources {
            if source.buffered.is_empty() && !source.exhausted {
                source.refill(&tx, ns, query)?;
            }
        }
        // The newest head of all streams; ids are unique, so there is one.
        let newest = sources
            .iter_mut()
            .filter_map(|source| {
                let id = source.buffered.front()?.1;
                Some((id, source))
            })
            .max_by_key(|(id, _)| *id);
        let Some((_, source)) = newest else { break };
        let Some((job, id, matches)) = source.buffered.pop_front() else {
            break;
        };
        examined += 1;
        last_examined = Some(id);
        if matches {
            matched.push((job, id));
        }
    }
    let more = sources
        .iter()
        .any(|source| !source.buffered.is_empty() || !source.exhausted);

    let mut jobs = Vec::with_capacity(matched.len());
    {
        let mut read = tx
            .prepare_cached(concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobq_jobs WHERE job = ?1"
            ))
            .db("prepare the list read")?;
        for (job, _) in &matched {
            let mut rows = read.query([job]).db("read a listed job")?;
            if let Some(row) = rows.next().db("read a listed job")? {
                jobs.push(job_from_row(row)?);
            }
        }
    }
    tx.finish().db("end a read")?;
    let next = if jobs.len() == query.limit {
        jobs.last().map(|job| job.id)
    } else if more {
        // The page ended at the bound of examined rows: the next one starts below the
        // last row examined.
        last_examined
            .map(|id| id_from_blob("job id", id))
            .transpose()?
    } else {
        None
    };
    Ok(ListPage { jobs, next })
}

/// Whether any of `queues` holds a ready job: what `wait_for_work` polls.
pub(crate) fn has_ready(
    conn: &Connection,
    ns: i64,
    queues: &[String],
    now: Timestamp,
) -> Result<bool> {
    let mut found = Vec::new();
    for queue in queues {
        ready_candidates(conn, ns, queue, now, 1, &mut found)?;
        if !found.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id blob of another size than 16 bytes, or 16 bytes that are no UUIDv7, is a
    /// corrupt record: never a panic, and never another kind of error.
    #[test]
    fn id_blobs_are_16_bytes_of_a_uuid_v7() {
        let conn = Connection::open_in_memory().expect("an in-memory database");
        let read = |blob: Vec<u8>| -> Result<JobId> {
            let bytes: [u8; 16] = conn
                .query_row("SELECT ?1", [blob], |row| row.get(0))
                .db("read an id")?;
            id_from_blob("job id", bytes)
        };
        let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(read(id.to_bytes().to_vec()).ok(), Some(id));
        for bad in [vec![0x77; 15], vec![0x77; 17], vec![0; 16], Vec::new()] {
            let len = bad.len();
            assert!(
                matches!(read(bad), Err(Error::Corrupt { .. })),
                "a blob of {len} bytes"
            );
        }
    }
}
