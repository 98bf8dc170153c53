//! Values between Rust and Postgres: job ids read from `uuid` columns, and jobs read
//! from rows, where anything out of shape is `Error::Corrupt`, never a panic.

use std::time::Duration;

use bytes::Bytes;
use durq_core::attempts::LastClaim;
use durq_core::fit::{decode_placement, encode_placement, PlacementCache};
use durq_core::graph::DependencyFailure;
use durq_core::meta::{decode_tags, encode_tags, validate_tags, validate_trace_context};
use durq_core::{
    Attempt, AttemptOutcome, Error, Job, JobId, JobState, Lease, LeaseToken, Needs, NewJob, Result,
    Tags, Timestamp,
};
use sqlx::postgres::{PgRow, Postgres};
use sqlx::{Decode, Row, Type};
use uuid::Uuid;

/// The id of a job as read back from a `uuid` column: only a UUIDv7 is one, so a
/// foreign value in the column is reported as corrupt.
pub(crate) fn job_id(uuid: Uuid) -> Result<JobId> {
    JobId::try_from(uuid).map_err(|err| Error::corrupt(format!("job id {uuid}"), err.to_string()))
}

/// Reads column `index`, reporting a failure as a corrupt record of `what`.
pub(crate) fn column<'r, T>(row: &'r PgRow, index: usize, what: &dyn Fn() -> String) -> Result<T>
where
    T: Decode<'r, Postgres> + Type<Postgres>,
{
    row.try_get(index)
        .map_err(|err| Error::corrupt(what(), format!("column {index}: {err}")))
}

fn text(bytes: Vec<u8>, field: &str, what: &dyn Fn() -> String) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::corrupt(what(), format!("{field} is not UTF-8")))
}

fn count(value: i64, field: &str, what: &dyn Fn() -> String) -> Result<u32> {
    u32::try_from(value).map_err(|_| Error::corrupt(what(), format!("{field} is {value}")))
}

/// The column after `sql::job_columns!` in a claim's rows: the payload.
pub(crate) const CLAIM_PAYLOAD: usize = 28;

/// A job from the columns of `sql::job_columns!`, starting at column 0.
pub(crate) fn job(row: &PgRow) -> Result<Job> {
    job_in(row, None)
}

/// [`job`], decoding placements through `placements` when given (the rows of one
/// claim share a few).
pub(crate) fn job_in(row: &PgRow, placements: Option<&mut PlacementCache>) -> Result<Job> {
    let id = job_id(column(row, 0, &|| "job row".to_owned())?)?;
    let what = || format!("job {id}");
    let what: &dyn Fn() -> String = &what;

    let state: String = column(row, 9, what)?;
    let state: JobState = state
        .parse()
        .map_err(|_| Error::corrupt(what(), format!("unknown state {state:?}")))?;
    let parent = column::<Option<Uuid>>(row, 8, what)?
        .map(job_id)
        .transpose()?;
    let idempotency_key = column::<Option<Vec<u8>>>(row, 3, what)?
        .map(|key| text(key, "idempotency_key", what))
        .transpose()?;
    let lease = if state == JobState::Running {
        let worker: Option<Vec<u8>> = column(row, 11, what)?;
        let token: i64 = column(row, 12, what)?;
        let expires_at: Option<i64> = column(row, 13, what)?;
        match (worker, expires_at) {
            (Some(worker), Some(expires_at)) if token > 0 => Some(Lease {
                worker: text(worker, "lease_worker", what)?,
                token: LeaseToken::new(token.unsigned_abs()),
                expires_at: Timestamp::from_millis(expires_at),
            }),
            _ => {
                return Err(Error::corrupt(
                    what(),
                    "a running job without a whole lease",
                ))
            }
        }
    } else {
        None
    };
    let (needs, locality) = match column::<Option<String>>(row, 22, what)? {
        Some(text) => match placements {
            Some(cache) => cache.decode(&text),
            None => decode_placement(&text),
        }
        .map_err(|err| Error::corrupt(what(), err))?,
        None => (Needs::new(), None),
    };
    let tags = match column::<Option<String>>(row, 23, what)? {
        Some(text) => tags(&text, what)?,
        None => Tags::new(),
    };
    let trace_context = column::<Option<String>>(row, 24, what)?;
    if let Some(traceparent) = &trace_context {
        // Outside the model (CONTRACT E12) as a timeout of zero is: corrupt.
        validate_trace_context(traceparent)
            .map_err(|err| Error::corrupt(what(), format!("trace_context: {err}")))?;
    }
    let stamp = |index: usize| -> Result<Option<Timestamp>> {
        Ok(column::<Option<i64>>(row, index, what)?.map(Timestamp::from_millis))
    };
    Ok(Job {
        id,
        queue: column(row, 1, what)?,
        tenant: text(column(row, 2, what)?, "tenant", what)?,
        idempotency_key,
        priority: column(row, 4, what)?,
        run_at: Timestamp::from_millis(column(row, 5, what)?),
        max_attempts: count(column(row, 7, what)?, "max_attempts", what)?,
        parent,
        state,
        attempts: count(column(row, 10, what)?, "attempts", what)?,
        lease,
        created_at: Timestamp::from_millis(column(row, 14, what)?),
        started_at: stamp(15)?,
        heartbeat_at: stamp(16)?,
        finished_at: stamp(17)?,
        last_error: column::<Option<Vec<u8>>>(row, 18, what)?
            .map(|bytes| text(bytes, "last_error", what))
            .transpose()?,
        result: column::<Option<Vec<u8>>>(row, 19, what)?.map(Bytes::from),
        cancel_requested: column(row, 20, what)?,
        timeout: column::<Option<i64>>(row, 21, what)?
            .map(|ms| timeout(ms, what))
            .transpose()?,
        needs,
        locality,
        tags,
        trace_context,
        concurrency_key: column::<Option<Vec<u8>>>(row, 25, what)?
            .map(|key| text(key, "concurrency_key", what))
            .transpose()?,
        depends_on: column::<Option<Vec<Uuid>>>(row, 26, what)?
            .unwrap_or_default()
            .into_iter()
            .map(job_id)
            .collect::<Result<Vec<JobId>>>()?,
        on_dependency_failure: match column::<Option<i16>>(row, 27, what)? {
            None => DependencyFailure::Cancel,
            Some(1) => DependencyFailure::Run,
            Some(other) => {
                return Err(Error::corrupt(
                    what(),
                    format!("dependency_policy holds {other}"),
                ))
            }
        },
    })
}

/// Stored tags (CONTRACT E11): the JSON map `encode_tags` wrote, and within the
/// limits of E11, or the record is corrupt.
fn tags(text: &str, what: &dyn Fn() -> String) -> Result<Tags> {
    let tags = decode_tags(text).map_err(|err| Error::corrupt(what(), err))?;
    validate_tags("tags", &tags).map_err(|err| Error::corrupt(what(), err.to_string()))?;
    Ok(tags)
}

/// A job's concurrency key as stored (CONTRACT K1): its bytes, NULL for none.
pub(crate) fn concurrency_key_param(job: &NewJob) -> Option<&[u8]> {
    job.concurrency_key.as_deref().map(str::as_bytes)
}

/// A job's tags as stored: the text of `encode_tags`, NULL for none.
pub(crate) fn tags_param(job: &NewJob) -> Option<String> {
    encode_tags(&job.tags)
}

/// What a row of `sql::ATTEMPTS` says of the job's last claim (columns 0 to 4).
pub(crate) fn last_claim(row: &PgRow, id: JobId) -> Result<LastClaim> {
    let what = || format!("job {id}");
    let what: &dyn Fn() -> String = &what;
    let token: i64 = column(row, 2, what)?;
    let token = u64::try_from(token)
        .map_err(|_| Error::corrupt(what(), format!("lease_token is {token}")))?;
    Ok(LastClaim {
        state: state(row, 0, what)?,
        worker: column::<Option<Vec<u8>>>(row, 1, what)?
            .map(|worker| text(worker, "lease_worker", what))
            .transpose()?,
        token: LeaseToken::new(token),
        started_at: column::<Option<i64>>(row, 3, what)?.map(Timestamp::from_millis),
        finished_at: column::<Option<i64>>(row, 4, what)?.map(Timestamp::from_millis),
    })
}

/// The stored attempt of a row of `sql::ATTEMPTS` (columns 5 to 10), `None` when the
/// job has none (the left join's NULLs).
pub(crate) fn attempt(row: &PgRow, id: JobId) -> Result<Option<Attempt>> {
    let what = || format!("attempt of job {id}");
    let what: &dyn Fn() -> String = &what;
    let Some(token) = column::<Option<i64>>(row, 5, what)? else {
        return Ok(None);
    };
    let token = match u64::try_from(token) {
        Ok(token) if token > 0 => LeaseToken::new(token),
        _ => return Err(Error::corrupt(what(), format!("token is {token}"))),
    };
    let outcome: String = column(row, 9, what)?;
    let outcome: AttemptOutcome = outcome
        .parse()
        .map_err(|_| Error::corrupt(what(), format!("unknown outcome {outcome:?}")))?;
    Ok(Some(Attempt::ended(
        token,
        text(column(row, 6, what)?, "worker", what)?,
        Timestamp::from_millis(column(row, 7, what)?),
        Timestamp::from_millis(column(row, 8, what)?),
        outcome,
        column::<Option<Vec<u8>>>(row, 10, what)?
            .map(|error| text(error, "error", what))
            .transpose()?,
    )))
}

/// A stored timeout: milliseconds above zero (`validate_timeout` admits no other).
fn timeout(ms: i64, what: &dyn Fn() -> String) -> Result<Duration> {
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::corrupt(what(), format!("timeout_ms is {ms}"))),
    }
}

/// A job's timeout as stored: whole milliseconds (validated to fit, and exact).
pub(crate) fn timeout_param(timeout: Option<Duration>) -> Option<i64> {
    timeout.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX))
}

/// A job's needs and locality as stored (CONTRACT F1): the placement text, NULL when
/// the job declares neither.
pub(crate) fn placement_param(job: &NewJob) -> Option<String> {
    encode_placement(&job.needs, job.locality.as_deref())
}

/// The claim-order sequence of a job row (column 6).
pub(crate) fn seq(row: &PgRow, id: JobId) -> Result<u64> {
    let seq: i64 = column(row, 6, &|| format!("job {id}"))?;
    u64::try_from(seq).map_err(|_| Error::corrupt(format!("job {id}"), format!("seq is {seq}")))
}

/// A state read back from a row.
pub(crate) fn state(row: &PgRow, index: usize, what: &dyn Fn() -> String) -> Result<JobState> {
    let state: String = column(row, index, what)?;
    state
        .parse()
        .map_err(|_| Error::corrupt(what(), format!("unknown state {state:?}")))
}
