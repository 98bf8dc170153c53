//! Decoding of script replies and job hashes. Stored data that cannot be read is
//! `Error::Corrupt`, never a panic.

use std::str::FromStr;
use std::time::Duration;

use durq_core::attempts::{Attempt, AttemptOutcome};
use durq_core::fit::{decode_placement, PlacementCache};
use durq_core::graph::DependencyFailure;
use durq_core::meta::{decode_tags, encode_tags};
use durq_core::{
    Bytes, ClaimedJob, Error, Job, JobId, JobState, Lease, LeaseToken, Needs, Result, Tags,
    Timestamp,
};
use redis::Value;

/// The job hash fields `get` reads, in this order.
pub(crate) const JOB_FIELDS: [&str; 16] = [
    "meta",
    "run_at",
    "state",
    "att",
    "token",
    "worker",
    "lease_exp",
    "started",
    "hb",
    "finished",
    "error",
    "result",
    "cancel",
    "timeout",
    "placement",
    "ckey",
];

/// The prefix of `last_error` on a job a claim or reclaim buried because its record could
/// not be read (`CORRUPT_PREFIX` in `lua/lib.lua`).
pub(crate) const CORRUPT_PREFIX: &str = "corrupt record: ";

/// A stored timeout: whole milliseconds above zero (`None` when the field is absent).
fn timeout_of(text: Option<&str>) -> std::result::Result<Option<Duration>, &'static str> {
    match text {
        None => Ok(None),
        Some(text) => match text.parse::<u64>() {
            Ok(0) => Err("zero"),
            Ok(ms) => Ok(Some(Duration::from_millis(ms))),
            Err(_) => Err("not a number"),
        },
    }
}

/// A stored placement (`Job::placement()` text; `None` when the field is absent): the
/// job's needs and locality, or why they cannot be read.
fn placement_of(text: Option<&str>) -> std::result::Result<(Needs, Option<String>), String> {
    text.map_or_else(|| Ok((Needs::new(), None)), decode_placement)
}

/// A stored concurrency key (`ckey`: the key's bytes hex-encoded, lower case, as
/// [`crate::keys::hex_key`] writes it; `None` when the field is absent), or why it cannot
/// be read.
pub(crate) fn concurrency_key_of(
    hex: Option<&[u8]>,
) -> std::result::Result<Option<String>, &'static str> {
    let Some(hex) = hex else {
        return Ok(None);
    };
    if hex.is_empty() || hex.len() % 2 != 0 {
        return Err("not hex");
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let bytes = hex
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or("not hex")?;
    String::from_utf8(bytes).map(Some).map_err(|_| "not UTF-8")
}

/// [`placement_of`] through `cache`, for the many jobs of one claim reply, which share a
/// few placements.
fn cached_placement_of(
    text: Option<&str>,
    cache: &mut PlacementCache,
) -> std::result::Result<(Needs, Option<String>), String> {
    text.map_or_else(|| Ok((Needs::new(), None)), |text| cache.decode(text))
}

/// The fields a job never changes, packed into the `meta` hash field so the scripts read
/// and write few values per job:
/// `QUEUE PARENT PRIO MAX_ATTEMPTS CREATED TENANT_LEN KEY_LEN TENANTKEY[ EXT]`, with
/// `PARENT` and `KEY_LEN` `-` when absent. Tenant and key come last, cut by their byte
/// lengths, so they may hold spaces or any other character. `lua/lib.lua` (`meta_head`)
/// reads the first five; `lua/list_rows.lua` reads the tenant and the tags.
///
/// `EXT` is only there when the job has tags or a trace context (CONTRACT E11, E12):
/// ` TRACE TAGS`, `TRACE` the traceparent or `-` (a traceparent never is `-` and holds no
/// space), `TAGS` the text of [`encode_tags`] or nothing. Keeping them in `meta` costs the
/// hot path nothing: a claim already reads and returns `meta`, a job without either
/// stores the same `meta` as before, and records written before tags existed read as
/// having none.
///
/// `DEPS` ends the field of a job enqueued with dependencies (CONTRACT G1-G3):
/// ` ~POLICY:ID,ID,...`, POLICY as [`DependencyFailure::as_str`] names it (`cancel` or
/// `run`), the ids in the order first
/// named. `enqueue.lua` appends it, because only it knows the id a batch index resolves
/// to (G2). It cannot be mistaken for the end of `EXT`: encoded tags end with `}`, and a
/// traceparent holds no space.
pub(crate) struct Meta {
    pub queue: String,
    pub parent: Option<JobId>,
    pub priority: i16,
    pub max_attempts: u32,
    pub created_at: Timestamp,
    pub tenant: String,
    pub idempotency_key: Option<String>,
    pub tags: Tags,
    pub trace_context: Option<String>,
    pub depends_on: Vec<JobId>,
    pub on_dependency_failure: DependencyFailure,
}

/// Packs a new job's immutable fields (see [`Meta`]).
pub(crate) fn encode_meta(job: &durq_core::NewJob, created_at: Timestamp) -> String {
    let parent = job.parent.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let key_len = job
        .idempotency_key
        .as_ref()
        .map_or_else(|| "-".to_owned(), |k| k.len().to_string());
    let mut meta = format!(
        "{} {parent} {} {} {} {} {key_len} {}{}",
        job.queue,
        job.priority,
        job.max_attempts,
        created_at.as_millis(),
        job.tenant.len(),
        job.tenant,
        job.idempotency_key.as_deref().unwrap_or(""),
    );
    let tags = encode_tags(&job.tags);
    if tags.is_some() || job.trace_context.is_some() {
        meta.push(' ');
        meta.push_str(job.trace_context.as_deref().unwrap_or("-"));
        meta.push(' ');
        meta.push_str(tags.as_deref().unwrap_or(""));
    }
    meta
}

/// Unpacks a `meta` field, or says why it cannot be read.
pub(crate) fn decode_meta(text: &str) -> std::result::Result<Meta, String> {
    let malformed = || "malformed".to_owned();
    let mut parts = text.splitn(8, ' ');
    let mut next = || parts.next().ok_or_else(malformed);
    let queue = next()?.to_owned();
    let parent = match next()? {
        "-" => None,
        id => Some(JobId::from_str(id).map_err(|_| "bad parent id".to_owned())?),
    };
    let priority = next()?.parse().map_err(|_| "bad priority".to_owned())?;
    let max_attempts = next()?.parse().map_err(|_| "bad max attempts".to_owned())?;
    let created_at = Timestamp::from_millis(next()?.parse().map_err(|_| malformed())?);
    let tenant_len: usize = next()?.parse().map_err(|_| malformed())?;
    let key_len: Option<usize> = match next()? {
        "-" => None,
        len => Some(len.parse().map_err(|_| malformed())?),
    };
    let rest = next()?;
    let end = tenant_len
        .checked_add(key_len.unwrap_or(0))
        .filter(|end| *end <= rest.len())
        .ok_or_else(|| "tenant and key longer than the field".to_owned())?;
    if !rest.is_char_boundary(tenant_len) || !rest.is_char_boundary(end) {
        return Err("tenant and key not cut at characters".to_owned());
    }
    let (tenant, after) = rest.split_at(tenant_len);
    let (key, ext) = after.split_at(end - tenant_len);
    let (ext, depends_on, on_dependency_failure) = split_dependencies(ext)?;
    let (tags, trace_context) = decode_ext(ext)?;
    Ok(Meta {
        queue,
        parent,
        priority,
        max_attempts,
        created_at,
        tenant: tenant.to_owned(),
        idempotency_key: key_len.map(|_| key.to_owned()),
        tags,
        trace_context,
        depends_on,
        on_dependency_failure,
    })
}

/// `EXT` and the dependencies of the part of `meta` after tenant and key (`DEPS` of
/// [`Meta`]; none when it does not end with one).
fn split_dependencies(
    ext: &str,
) -> std::result::Result<(&str, Vec<JobId>, DependencyFailure), String> {
    let none = Ok((ext, Vec::new(), DependencyFailure::Cancel));
    let Some(at) = ext.rfind(" ~") else {
        return none;
    };
    let (rest, deps) = ext.split_at(at);
    let Some((policy, ids)) = deps[2..].split_once(':') else {
        return none;
    };
    let Some(policy) = DependencyFailure::from_name(policy) else {
        return none;
    };
    if ids.is_empty()
        || !ids
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b',')
    {
        return none;
    }
    let ids = ids
        .split(',')
        .map(|id| JobId::from_str(id).map_err(|_| format!("bad dependency id {id:?}")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((rest, ids, policy))
}

/// The tags and trace context after tenant and key (`EXT` of [`Meta`]).
fn decode_ext(ext: &str) -> std::result::Result<(Tags, Option<String>), String> {
    if ext.is_empty() {
        return Ok((Tags::new(), None));
    }
    let (trace, tags) = ext
        .strip_prefix(' ')
        .and_then(|ext| ext.split_once(' '))
        .ok_or_else(|| "trailing text after tenant and key".to_owned())?;
    let trace_context = match trace {
        "-" => None,
        "" => return Err("empty trace context".to_owned()),
        trace => Some(trace.to_owned()),
    };
    let tags = if tags.is_empty() {
        Tags::new()
    } else {
        decode_tags(tags)?
    };
    Ok((tags, trace_context))
}

/// The text `lua/list_rows.lua` looks for in a job's stored tags to match tag `key` =
/// `value`: the pair exactly as [`encode_tags`] writes it inside its braces
/// (`"key":"value"`). The script accepts it only between `{` or `,` and `,` or `}`, where
/// in that encoding only a whole key and its whole value can stand (a quote inside a
/// value is always escaped), so `pro` never matches `professional`. Rust checks every
/// listed job's decoded tags again, so a hand-written record in another spelling can
/// only be left out, never listed wrongly.
pub(crate) fn tag_pattern(key: &str, value: &str) -> String {
    let one = Tags::from([(key.to_owned(), value.to_owned())]);
    let text = encode_tags(&one).unwrap_or_default();
    text.strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_default()
        .to_owned()
}

/// The hash field of the attempt stored in slot `slot` (`a0` .. `a31`): fail, release
/// and reclaim write it, `attempts` reads every slot.
pub(crate) fn attempt_field(slot: u64) -> String {
    format!("a{slot}")
}

/// Reads an ended attempt as `fail.lua`, `release.lua` and `reclaim.lua` store it
/// (`attempt_record` in `lua/lib.lua`), and `reopen.lua` the attempt that succeeded
/// before a reopen (CONTRACT D3: kept in the history once the job's lease fields, which
/// held it, start over):
/// `TOKEN STARTED ENDED OUTCOME WORKER_LEN WORKERERROR`, `OUTCOME` one letter (`f`
/// failed, `r` released, `e` expired, `s` succeeded), the worker cut by its byte
/// length, the error the rest (none for a release or a success, possibly empty for a
/// failure).
pub(crate) fn decode_attempt(text: &str) -> std::result::Result<Attempt, String> {
    let malformed = || format!("unreadable attempt {text:?}");
    let mut parts = text.splitn(6, ' ');
    let mut next = || parts.next().ok_or_else(malformed);
    let token: u64 = next()?.parse().map_err(|_| malformed())?;
    let started: i64 = next()?.parse().map_err(|_| malformed())?;
    let ended: i64 = next()?.parse().map_err(|_| malformed())?;
    let outcome = match next()? {
        "f" => AttemptOutcome::Failed,
        "r" => AttemptOutcome::Released,
        "e" => AttemptOutcome::Expired,
        "s" => AttemptOutcome::Succeeded,
        _ => return Err(malformed()),
    };
    let worker_len: usize = next()?.parse().map_err(|_| malformed())?;
    let rest = next()?;
    if worker_len > rest.len() || !rest.is_char_boundary(worker_len) {
        return Err(malformed());
    }
    let (worker, error) = rest.split_at(worker_len);
    let error = match outcome {
        AttemptOutcome::Released | AttemptOutcome::Succeeded if error.is_empty() => None,
        AttemptOutcome::Released | AttemptOutcome::Succeeded => return Err(malformed()),
        _ => Some(error.to_owned()),
    };
    Ok(Attempt::ended(
        LeaseToken::new(token),
        worker,
        Timestamp::from_millis(started),
        Timestamp::from_millis(ended),
        outcome,
        error,
    ))
}

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
    job_id_bytes(text.as_bytes(), what)
}

/// [`job_id`] from the bytes of a reply, without copying them into a `String` first.
pub(crate) fn job_id_bytes(bytes: &[u8], what: &str) -> Result<JobId> {
    JobId::parse_canonical(bytes).map_err(|_| {
        Error::corrupt(
            what,
            format!("bad job id {:?}", String::from_utf8_lossy(bytes)),
        )
    })
}

/// The canonical text of `id` in a new string (`JobId::push_canonical`, which skips
/// the formatting machinery: ids are formatted once or twice per job on hot paths).
pub(crate) fn id_string(id: JobId) -> String {
    let mut out = String::with_capacity(36);
    id.push_canonical(&mut out);
    out
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

/// What a claim wrote into every job it leased, from its own arguments: `claim.lua`
/// returns only the fields it did not take from them.
pub(crate) struct LeaseWrite<'a> {
    pub worker: &'a str,
    pub expires_at: Timestamp,
    /// The claim's clock reading: `started_at` and `heartbeat_at`.
    pub now: Timestamp,
}

/// A claimed job's reply entry whose record Rust could not read: the claim leased it, and
/// the store buries it (`bury.lua`) rather than hand it out.
pub(crate) struct Unreadable {
    pub id: JobId,
    pub token: Option<LeaseToken>,
    pub error: Error,
}

/// The values of one leased job in a claim reply (see [`decode_claimed`]).
pub(crate) const CLAIMED_FIELDS: usize = 11;

/// A job leased by `claim.lua` or `claim_fit.lua`, from its reply entry `[id, meta, run_at,
/// att, token, error, cancel, payload, timeout, placement, ckey]` (see the scripts'
/// headers) and what the claim wrote.
/// `Err(None)` when the entry itself is malformed (no id to name).
pub(crate) fn decode_claimed(
    row: [Value; CLAIMED_FIELDS],
    lease: &LeaseWrite<'_>,
    placements: &mut PlacementCache,
) -> std::result::Result<ClaimedJob, std::result::Result<Unreadable, Error>> {
    let [id, meta, run_at, att, token, error, cancel, payload, timeout, placement, ckey] = row;
    let id = match &id {
        Value::BulkString(bytes) => job_id_bytes(bytes, "claim reply"),
        other => text(other, "claim reply").and_then(|t| job_id(&t, "claim reply")),
    }
    .map_err(Err)?;
    let token_value = into_opt_bytes(token);
    let parsed_token = token_value
        .as_deref()
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|t| t.parse().ok())
        .map(LeaseToken::new);
    decode_claimed_fields(
        id,
        [
            into_opt_bytes(meta),
            into_opt_bytes(run_at),
            into_opt_bytes(att),
            token_value,
            into_opt_bytes(error),
            into_opt_bytes(timeout),
            into_opt_bytes(placement),
            into_opt_bytes(ckey),
        ],
        &cancel,
        payload,
        lease,
        placements,
    )
    .map_err(|error| {
        Ok(Unreadable {
            id,
            token: parsed_token,
            error,
        })
    })
}

fn decode_claimed_fields(
    id: JobId,
    values: [Option<Vec<u8>>; 8],
    cancel: &Value,
    payload: Value,
    lease: &LeaseWrite<'_>,
    placements: &mut PlacementCache,
) -> Result<ClaimedJob> {
    // Field names for error messages, in the order of `values`.
    const NAMES: [&str; 8] = [
        "meta",
        "run_at",
        "att",
        "token",
        "error",
        "timeout",
        "placement",
        "ckey",
    ];
    let corrupt = |i: usize, reason: &str| {
        Error::corrupt(format!("job {id}"), format!("field {}: {reason}", NAMES[i]))
    };
    let text_at = |i: usize| -> Result<&str> {
        let bytes = values[i].as_deref().ok_or_else(|| corrupt(i, "missing"))?;
        std::str::from_utf8(bytes).map_err(|_| corrupt(i, "not UTF-8"))
    };
    fn parse<T: FromStr>(text: &str) -> Option<T> {
        text.parse().ok()
    }
    let num_at =
        |i: usize| -> Result<i64> { parse(text_at(i)?).ok_or_else(|| corrupt(i, "not a number")) };
    let meta_text = text_at(0)?;
    let meta = decode_meta(meta_text)
        .map_err(|why| corrupt(0, &format!("unreadable ({why}): {meta_text:?}")))?;
    let attempts = parse(text_at(2)?).ok_or_else(|| corrupt(2, "not a number"))?;
    let token = parse(text_at(3)?).ok_or_else(|| corrupt(3, "not a number"))?;
    let last_error = values[4]
        .as_deref()
        .map(|bytes| String::from_utf8(bytes.to_vec()).map_err(|_| corrupt(4, "not UTF-8")))
        .transpose()?;
    let timeout = timeout_of(
        values[5]
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
            .map_err(|_| corrupt(5, "not UTF-8"))?,
    )
    .map_err(|reason| corrupt(5, reason))?;
    let (needs, locality) = cached_placement_of(
        values[6]
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
            .map_err(|_| corrupt(6, "not UTF-8"))?,
        placements,
    )
    .map_err(|reason| corrupt(6, &reason))?;
    let concurrency_key =
        concurrency_key_of(values[7].as_deref()).map_err(|reason| corrupt(7, reason))?;
    let job = Job {
        id,
        queue: meta.queue,
        tenant: meta.tenant,
        idempotency_key: meta.idempotency_key,
        priority: meta.priority,
        run_at: Timestamp::from_millis(num_at(1)?),
        max_attempts: meta.max_attempts,
        parent: meta.parent,
        timeout,
        state: JobState::Running,
        attempts,
        lease: Some(Lease {
            worker: lease.worker.to_owned(),
            token: LeaseToken::new(token),
            expires_at: lease.expires_at,
        }),
        created_at: meta.created_at,
        started_at: Some(lease.now),
        heartbeat_at: Some(lease.now),
        // A queued job has neither: retry removes both when it requeues a finished job.
        finished_at: None,
        last_error,
        result: None,
        cancel_requested: matches!(cancel, Value::BulkString(b) if b == b"1"),
        needs,
        locality,
        tags: meta.tags,
        trace_context: meta.trace_context,
        concurrency_key,
        depends_on: meta.depends_on,
        on_dependency_failure: meta.on_dependency_failure,
    };
    Ok(ClaimedJob {
        job,
        payload: into_opt_bytes(payload).map(Bytes::from).unwrap_or_default(),
    })
}

/// Whether an HMGET of [`JOB_FIELDS`] found no hash at all.
pub(crate) fn is_missing(values: &[Option<Vec<u8>>]) -> bool {
    values.iter().all(Option::is_none)
}

/// A job from the values of [`JOB_FIELDS`], in order.
pub(crate) fn decode_job(id: JobId, mut values: Vec<Option<Vec<u8>>>) -> Result<Job> {
    let result = values.get_mut(11).and_then(Option::take).map(Bytes::from);
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
    let meta_text = f.text(0)?;
    let meta = decode_meta(&meta_text)
        .map_err(|why| f.corrupt("meta", format!("unreadable ({why}): {meta_text:?}")))?;
    let state_text = f.text(2)?;
    let state = JobState::from_str(&state_text)
        .map_err(|_| f.corrupt("state", format!("unknown state {state_text:?}")))?;
    let (needs, locality) = placement_of(f.opt_text(14)?.as_deref())
        .map_err(|reason| f.corrupt("placement", reason))?;
    let concurrency_key =
        concurrency_key_of(f.raw(15)).map_err(|reason| f.corrupt("ckey", reason))?;
    let lease = if state == JobState::Running {
        Some(Lease {
            worker: f.text(5)?,
            token: LeaseToken::new(f.num(4)?),
            expires_at: f.time(6)?,
        })
    } else {
        None
    };
    Ok(Job {
        id,
        queue: meta.queue,
        tenant: meta.tenant,
        idempotency_key: meta.idempotency_key,
        priority: meta.priority,
        run_at: f.time(1)?,
        max_attempts: meta.max_attempts,
        parent: meta.parent,
        timeout: timeout_of(f.opt_text(13)?.as_deref())
            .map_err(|reason| f.corrupt("timeout", reason))?,
        state,
        attempts: f.opt_num(3)?.unwrap_or(0),
        lease,
        created_at: meta.created_at,
        started_at: f.opt_time(7)?,
        heartbeat_at: f.opt_time(8)?,
        finished_at: f.opt_time(9)?,
        last_error: f.opt_text(10)?,
        result,
        cancel_requested: f.raw(12) == Some(b"1"),
        needs,
        locality,
        tags: meta.tags,
        trace_context: meta.trace_context,
        concurrency_key,
        depends_on: meta.depends_on,
        on_dependency_failure: meta.on_dependency_failure,
    })
}

/// A job as `list` and `children` show it: [`decode_job`], except that a record a claim or
/// reclaim buried as corrupt (state `dead`, `last_error` starting with [`CORRUPT_PREFIX`])
/// is shown dead even when other fields cannot be read, so it stays visible where stats
/// count it (CONTRACT §5, corrupt records). Fields that cannot be read take neutral values
/// (`queue` the one the index named); `get` still reports such a record as corrupt.
pub(crate) fn decode_listed(id: JobId, values: Vec<Option<Vec<u8>>>, queue: &str) -> Result<Job> {
    let buried = values.get(2).and_then(Option::as_deref) == Some(b"dead")
        && values
            .get(10)
            .and_then(Option::as_deref)
            .is_some_and(|e| e.starts_with(CORRUPT_PREFIX.as_bytes()));
    if !buried {
        return decode_job(id, values);
    }
    let strict = decode_job(id, values.clone());
    if strict.is_ok() {
        return strict;
    }
    let text = |i: usize| {
        values
            .get(i)
            .and_then(Option::as_deref)
            .and_then(|b| std::str::from_utf8(b).ok())
    };
    let time = |i: usize| {
        text(i)
            .and_then(|t| t.parse().ok())
            .map(Timestamp::from_millis)
    };
    let meta = text(0).and_then(|t| decode_meta(t).ok());
    let (needs, locality) = placement_of(text(14)).unwrap_or_default();
    Ok(Job {
        id,
        queue: meta
            .as_ref()
            .map_or_else(|| queue.to_owned(), |m| m.queue.clone()),
        tenant: meta.as_ref().map(|m| m.tenant.clone()).unwrap_or_default(),
        idempotency_key: meta.as_ref().and_then(|m| m.idempotency_key.clone()),
        priority: meta.as_ref().map_or(0, |m| m.priority),
        run_at: time(1).unwrap_or_else(|| id.timestamp()),
        max_attempts: meta.as_ref().map_or(1, |m| m.max_attempts),
        parent: meta.as_ref().and_then(|m| m.parent),
        timeout: timeout_of(text(13)).ok().flatten(),
        state: JobState::Dead,
        attempts: text(3).and_then(|t| t.parse().ok()).unwrap_or(0),
        lease: None,
        created_at: meta
            .as_ref()
            .map_or_else(|| id.timestamp(), |m| m.created_at),
        started_at: time(7),
        heartbeat_at: time(8),
        finished_at: time(9),
        last_error: text(10).map(str::to_owned),
        result: None,
        cancel_requested: values.get(12).and_then(Option::as_deref) == Some(b"1"),
        needs,
        locality,
        tags: meta.as_ref().map(|m| m.tags.clone()).unwrap_or_default(),
        trace_context: meta.as_ref().and_then(|m| m.trace_context.clone()),
        concurrency_key: concurrency_key_of(values.get(15).and_then(Option::as_deref))
            .ok()
            .flatten(),
        depends_on: meta
            .as_ref()
            .map(|m| m.depends_on.clone())
            .unwrap_or_default(),
        on_dependency_failure: meta
            .as_ref()
            .map_or_else(Default::default, |m| m.on_dependency_failure),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use durq_core::NewJob;

    #[test]
    fn ids_format_and_parse_as_job_id_does() {
        for millis in [0, 1, 1_764_000_000_000, 0xffff_ffff_ffff] {
            let id = JobId::mint(Timestamp::from_millis(millis));
            let text = id_string(id);
            assert_eq!(text, id.to_string());
            assert_eq!(job_id(&text, "t").expect("parses"), id);
            assert_eq!(job_id(&text.to_uppercase(), "t").expect("parses"), id);
        }
        for bad in [
            "",
            "x",
            "0190-",
            &"0".repeat(36),
            "g0000000-0000-7000-8000-000000000000",
        ] {
            assert!(job_id(bad, "t").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn meta_round_trips_any_tenant_and_key() {
        let parent = JobId::mint(Timestamp::from_millis(5));
        let cases = [
            NewJob::new("q"),
            NewJob::new("a.b:c-d_e")
                .tenant("t with spaces ")
                .idempotency_key(" k\n{}")
                .priority(i16::MIN)
                .max_attempts(u32::MAX)
                .parent(parent),
            NewJob::new("q").tenant("ünï").idempotency_key("é"),
            NewJob::new("q").idempotency_key("-"),
            NewJob::new("q")
                .tenant("t ")
                .idempotency_key("k ")
                .tag("plan", "pro x")
                .tag("a.b", ""),
            NewJob::new("q")
                .trace_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            NewJob::new("q")
                .tag("k", "ünï \"{}\"")
                .trace_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ];
        for job in cases {
            let text = encode_meta(&job, Timestamp::from_millis(-42));
            let meta = decode_meta(&text).expect("decodes");
            assert_eq!(meta.tags, job.tags);
            assert_eq!(meta.trace_context, job.trace_context);
            assert_eq!(meta.queue, job.queue);
            assert_eq!(meta.parent, job.parent);
            assert_eq!(meta.priority, job.priority);
            assert_eq!(meta.max_attempts, job.max_attempts);
            assert_eq!(meta.created_at, Timestamp::from_millis(-42));
            assert_eq!(meta.tenant, job.tenant);
            assert_eq!(meta.idempotency_key, job.idempotency_key);
        }
        assert!(decode_meta("q - 0 1 5 3 - ab").is_err());
        assert!(decode_meta("garbage").is_err());
        // What follows tenant and key is a space, a trace context or `-`, a space, tags.
        assert!(decode_meta("q - 0 1 5 1 - ab").is_err());
        assert!(decode_meta("q - 0 1 5 1 - a -").is_err());
        assert!(decode_meta("q - 0 1 5 1 - a - [1]").is_err());
        assert!(decode_meta("q - 0 1 5 1 - a  {}").is_err());
        let meta = decode_meta("q - 0 1 5 1 - a - ").expect("no tags, no trace");
        assert!(meta.tags.is_empty() && meta.trace_context.is_none());
        // A job without tags or trace context stores `meta` as before they existed.
        assert_eq!(
            encode_meta(&NewJob::new("q").tenant("t"), Timestamp::from_millis(5)),
            "q - 0 25 5 1 - t"
        );
    }

    /// `DEPS` as enqueue.lua appends it reads back after any `meta`, and text inside
    /// tags that looks like it is never taken for it.
    #[test]
    fn dependencies_read_back_after_any_meta() {
        let a = JobId::mint(Timestamp::from_millis(1));
        let b = JobId::mint(Timestamp::from_millis(2));
        let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cases = [
            NewJob::new("q"),
            NewJob::new("q")
                .tenant("t ~cancel:")
                .idempotency_key(" ~run:"),
            NewJob::new("q").tag("k", format!("x ~cancel:{a}")),
            NewJob::new("q").trace_context(trace),
            NewJob::new("q").tag("k", "v").trace_context(trace),
        ];
        for job in cases {
            let plain = encode_meta(&job, Timestamp::from_millis(7));
            let meta = decode_meta(&plain).expect("decodes");
            assert!(meta.depends_on.is_empty(), "{plain:?} has no dependencies");
            for policy in [DependencyFailure::Cancel, DependencyFailure::Run] {
                let text = format!("{plain} ~{policy}:{a},{b}");
                let meta = decode_meta(&text).expect("decodes");
                assert_eq!(meta.depends_on, vec![a, b], "{text:?}");
                assert_eq!(meta.on_dependency_failure, policy, "{text:?}");
                assert_eq!(meta.tags, job.tags, "{text:?}");
                assert_eq!(meta.trace_context, job.trace_context, "{text:?}");
                assert_eq!(meta.tenant, job.tenant, "{text:?}");
                assert_eq!(meta.idempotency_key, job.idempotency_key, "{text:?}");
            }
        }
        assert!(decode_meta(&format!("q - 0 1 5 1 - a ~cancel:{a},nope")).is_err());
    }

    #[test]
    fn concurrency_keys_decode_as_hex_key_writes_them() {
        for key in [
            "k",
            "customer-42",
            "a b {x} }{",
            "ünï€😀\u{0}",
            &"é".repeat(128),
        ] {
            let hex = crate::keys::hex_key(key);
            assert!(hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert_eq!(
                concurrency_key_of(Some(hex.as_bytes())),
                Ok(Some(key.to_owned()))
            );
        }
        // Hex keeps byte order, and a key sorts before its extensions.
        assert!(crate::keys::hex_key("a") < crate::keys::hex_key("a b"));
        assert!(crate::keys::hex_key("a b") < crate::keys::hex_key("ab"));
        assert_eq!(concurrency_key_of(None), Ok(None));
        for bad in ["", "6", "6g", "6A", "zz", "ff", "c3"] {
            assert!(concurrency_key_of(Some(bad.as_bytes())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tag_patterns_are_the_encoded_pair() {
        assert_eq!(tag_pattern("plan", "pro"), r#""plan":"pro""#);
        assert_eq!(tag_pattern("k", "a\"b\\"), r#""k":"a\"b\\""#);
        assert_eq!(tag_pattern("k", ""), r#""k":"""#);
    }

    #[test]
    fn attempts_decode_as_the_scripts_write_them() {
        let failed = decode_attempt("3 100 150 f 6 w 1 :2boom here").expect("failed");
        assert_eq!(
            failed,
            Attempt::ended(
                LeaseToken::new(3),
                "w 1 :2",
                Timestamp::from_millis(100),
                Timestamp::from_millis(150),
                AttemptOutcome::Failed,
                Some("boom here".into()),
            )
        );
        let empty = decode_attempt("1 -5 7 f 1 w").expect("an empty error");
        assert_eq!(empty.error.as_deref(), Some(""));
        let released = decode_attempt("2 1 2 r 3 wü").expect("released");
        assert_eq!(
            (released.outcome, released.error, released.worker.as_str()),
            (AttemptOutcome::Released, None, "wü")
        );
        let expired = decode_attempt("4 1 2 e 1 wlease expired").expect("expired");
        assert_eq!(expired.error.as_deref(), Some("lease expired"));
        let succeeded = decode_attempt("5 1 2 s 2 w5").expect("succeeded");
        assert_eq!(
            (
                succeeded.outcome,
                succeeded.error,
                succeeded.worker.as_str()
            ),
            (AttemptOutcome::Succeeded, None, "w5")
        );
        for bad in [
            "",
            "1 2 3 f",
            "x 1 2 f 1 w",
            "1 2 3 x 1 w",
            "1 2 3 s 1 wx",
            "1 2 3 f 9 w",
            "1 2 3 r 1 wx",
            "1 2 3 f 1 ü",
        ] {
            assert!(decode_attempt(bad).is_err(), "{bad:?}");
        }
    }
}
