//! Decoding of script replies and job hashes. Stored data that cannot be read is
//! `Error::Corrupt`, never a panic.

use std::str::FromStr;

use jobs_core::{Bytes, Error, Job, JobId, JobState, Lease, LeaseToken, Result, Timestamp};
use redis::Value;

/// The job hash fields `get` reads and `claim.lua` returns, in this order. Must match
/// `JOB_FIELDS` in `lua/lib.lua`.
pub(crate) const JOB_FIELDS: [&str; 19] = [
    "queue",
    "tenant",
    "key",
    "prio",
    "run_at",
    "max_att",
    "parent",
    "state",
    "att",
    "token",
    "worker",
    "lease_exp",
    "created",
    "started",
    "hb",
    "finished",
    "error",
    "result",
    "cancel",
];

/// A reply's bytes: bulk and simple strings as they are, integers in decimal, nil as `None`.
pub(crate) fn opt_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        other => into_opt_bytes(other.clone()),
    }
}

/// Like [`opt_bytes`], moving the bytes out instead of copying them.
pub(crate) fn into_opt_bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

/// A reply that must be text.
pub(crate) fn text(value: &Value, what: &str) -> Result<String> {
    opt_bytes(value)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| Error::corrupt(what, format!("expected text, got {value:?}")))
}

/// A reply that must be an integer.
pub(crate) fn int(value: &Value, what: &str) -> Result<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        other => text(other, what)?
            .parse()
            .map_err(|_| Error::corrupt(what, format!("expected an integer, got {other:?}"))),
    }
}

/// A reply that must be an array.
pub(crate) fn array<'a>(value: &'a Value, what: &str) -> Result<&'a [Value]> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(Error::corrupt(
            what,
            format!("expected an array, got {other:?}"),
        )),
    }
}

/// A job id stored by this crate.
pub(crate) fn job_id(text: &str, what: &str) -> Result<JobId> {
    JobId::from_str(text).map_err(|_| Error::corrupt(what, format!("bad job id {text:?}")))
}

/// The id at the end of an index member (every member ends with the 36-character id).
pub(crate) fn member_id(member: &str, what: &str) -> Result<JobId> {
    let start = member
        .len()
        .checked_sub(36)
        .filter(|start| member.is_char_boundary(*start));
    match start {
        Some(start) => job_id(&member[start..], what),
        None => Err(Error::corrupt(what, format!("bad index member {member:?}"))),
    }
}

struct Fields<'a> {
    id: JobId,
    values: &'a [Option<Vec<u8>>],
}

impl Fields<'_> {
    fn corrupt(&self, field: &str, reason: impl std::fmt::Display) -> Error {
        Error::corrupt(
            format!("job {}", self.id),
            format!("field {field}: {reason}"),
        )
    }

    fn raw(&self, index: usize) -> Option<&[u8]> {
        self.values.get(index).and_then(|v| v.as_deref())
    }

    fn opt_text(&self, index: usize) -> Result<Option<String>> {
        self.raw(index)
            .map(|bytes| {
                String::from_utf8(bytes.to_vec())
                    .map_err(|_| self.corrupt(JOB_FIELDS[index], "not UTF-8"))
            })
            .transpose()
    }

    fn text(&self, index: usize) -> Result<String> {
        self.opt_text(index)?
            .ok_or_else(|| self.corrupt(JOB_FIELDS[index], "missing"))
    }

    fn opt_num<T: FromStr>(&self, index: usize) -> Result<Option<T>> {
        self.opt_text(index)?
            .map(|text| {
                text.parse()
                    .map_err(|_| self.corrupt(JOB_FIELDS[index], format!("not a number: {text:?}")))
            })
            .transpose()
    }

    fn num<T: FromStr>(&self, index: usize) -> Result<T> {
        self.opt_num(index)?
            .ok_or_else(|| self.corrupt(JOB_FIELDS[index], "missing"))
    }

    fn time(&self, index: usize) -> Result<Timestamp> {
        self.num::<i64>(index).map(Timestamp::from_millis)
    }

    fn opt_time(&self, index: usize) -> Result<Option<Timestamp>> {
        Ok(self.opt_num::<i64>(index)?.map(Timestamp::from_millis))
    }
}

/// Whether an HMGET of [`JOB_FIELDS`] found no hash at all.
pub(crate) fn is_missing(values: &[Option<Vec<u8>>]) -> bool {
    values.iter().all(Option::is_none)
}

/// A job from the values of [`JOB_FIELDS`], in order.
pub(crate) fn decode_job(id: JobId, mut values: Vec<Option<Vec<u8>>>) -> Result<Job> {
    let result = values.get_mut(17).and_then(Option::take).map(Bytes::from);
    let f = Fields {
        id,
        values: &values,
    };
    if values.len() < JOB_FIELDS.len() {
        return Err(f.corrupt(
            "*",
            format!("{} fields, expected {}", values.len(), JOB_FIELDS.len()),
        ));
    }
    let state_text = f.text(7)?;
    let state = JobState::from_str(&state_text)
        .map_err(|_| f.corrupt("state", format!("unknown state {state_text:?}")))?;
    let lease = if state == JobState::Running {
        Some(Lease {
            worker: f.text(10)?,
            token: LeaseToken::new(f.num(9)?),
            expires_at: f.time(11)?,
        })
    } else {
        None
    };
    let parent = f
        .opt_text(6)?
        .map(|text| {
            JobId::from_str(&text).map_err(|_| f.corrupt("parent", format!("bad id {text:?}")))
        })
        .transpose()?;
    Ok(Job {
        id,
        queue: f.text(0)?,
        tenant: f.opt_text(1)?.unwrap_or_default(),
        idempotency_key: f.opt_text(2)?,
        priority: f.num(3)?,
        run_at: f.time(4)?,
        max_attempts: f.num(5)?,
        parent,
        state,
        attempts: f.opt_num(8)?.unwrap_or(0),
        lease,
        created_at: f.time(12)?,
        started_at: f.opt_time(13)?,
        heartbeat_at: f.opt_time(14)?,
        finished_at: f.opt_time(15)?,
        last_error: f.opt_text(16)?,
        result,
        cancel_requested: f.raw(18) == Some(b"1"),
    })
}
