//! The SQL behind each operation. Writes run on the writer thread inside a group
//! transaction ([`WriteTx`]); reads run on a reader connection. Every "now" is the
//! instant the `Store` handle read from its clock, passed in; no query calls SQLite's
//! time functions (CONTRACT §3). Inputs arrive validated by the handle.
//!
//! Every statement that writes a job's `state` carries the event stream's cost for a
//! job that records events and nothing more for one that does not (CONTRACT V1; the
//! triggers of schema 12 record the change):
//!
//! - it sets `events_at` to its instant with [`events_stamp!`], so the trigger
//!   records the store's instant as `recorded_at`, for a job that records; for any
//!   other the column stays NULL;
//! - it is `INSERT OR FAIL` or `UPDATE OR FAIL`, and calls no SQL function (`MAX` is
//!   written as a `CASE`). The triggers make each of these statements one that may
//!   write two tables, and SQLite opens a statement journal for such a statement if it
//!   may also abort halfway (a NOT NULL column it sets under the default `ABORT`, or any
//!   function call, its own or a trigger's): a journal copies every page the statement
//!   first changes, whether the trigger records or not, which cost a claim and a
//!   completion about 40% more instructions. Under `FAIL` and without a function no
//!   journal is opened, and a job that records no events pays for the triggers their
//!   `WHEN` alone. Nothing here relies on one statement being undone alone: an
//!   operation that fails after writing has its whole group rolled back
//!   (`engine.rs`), or its savepoint, or spoils the caller's transaction.

use std::time::Duration;

use bytes::Bytes;
use durq_core::attempts::{self, LastClaim};
use durq_core::fit::{decode_placement, is_preferred, FitOrder, PlacementCache};
use durq_core::graph::DependencyFailure;
use durq_core::meta::{decode_tags, encode_tags};
use durq_core::transition::{self, Attempts, Next};
use durq_core::{
    Attempt, AttemptOutcome, ClaimRequest, ClaimedJob, Enqueued, Error, Heartbeat, Job, JobId,
    JobState, Lease, LeaseToken, ListPage, ListQuery, Needs, NewJob, QueueLimits, QueueOverview,
    QueueStats, ReadyOrder, ReclaimedJob, Result, Retry, ScheduleUpdate, StoreSettings,
    StoredSchedule, StoredWorker, Tags, Timestamp, Uniqueness, LEASE_EXPIRED,
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

const WAITING: i64 = 5;

fn state_code(state: JobState) -> i64 {
    match state {
        JobState::Waiting => WAITING,
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
        WAITING => JobState::Waiting,
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
         placement, tags, trace_context, concurrency_key, depends_on, dependency_policy"
    };
}

/// The assignment every statement that changes a job's `state` makes, with the
/// parameter that holds the operation's instant (`events_stamp!("4")` for `?4`): a job
/// that records events (`events_at` not NULL, schema 12) takes the instant, which the
/// event trigger records as the change's `recorded_at`; any other keeps its NULL. A
/// macro, so the statements that use it are `concat!`ed at compile time.
macro_rules! events_stamp {
    ($param:literal) => {
        concat!(
            "events_at = CASE WHEN events_at IS NULL THEN NULL ELSE ?",
            $param,
            " END"
        )
    };
}

/// How many columns `job_columns!` names: a query that reads more puts them after.
const JOB_COLUMNS: usize = 27;

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
    let depends_on = match row.get_ref(25).map_err(read)? {
        ValueRef::Null => Vec::new(),
        ValueRef::Blob(bytes) => {
            graph::ids_from_blob(bytes).map_err(|why| Error::corrupt(what(), why))?
        }
        other => {
            return Err(Error::corrupt(
                what(),
                format!("depends_on holds a {} value", other.data_type()),
            ))
        }
    };
    let on_dependency_failure = match get_opt_i64(26)? {
        None => DependencyFailure::Cancel,
        Some(1) => DependencyFailure::Run,
        Some(other) => return Err(corrupt("dependency_policy", other)),
    };
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
        concurrency_key: row.get(24).map_err(read)?,
        depends_on,
        on_dependency_failure,
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

/// Where one stream of `list` candidates comes from.
enum ListStream<'q> {
    /// One queue's jobs in one state.
    QueueState(&'q str, JobState),
    /// Every job of the namespace.
    All,
}

// After the row codec: `job_columns!` is in scope only below its definition.
mod admin;
mod claim;
mod enqueue;
mod events;
mod fair;
mod graph;
mod lease;
pub(crate) mod limits;
mod reads;
mod schedules;
mod steps;
mod sweep;
mod workers;

pub(crate) use self::admin::*;
pub(crate) use self::claim::*;
pub(crate) use self::enqueue::*;
pub(crate) use self::events::*;
pub(crate) use self::lease::*;
pub(crate) use self::reads::*;
pub(crate) use self::schedules::*;
pub(crate) use self::steps::*;
pub(crate) use self::sweep::*;
pub(crate) use self::workers::*;

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
