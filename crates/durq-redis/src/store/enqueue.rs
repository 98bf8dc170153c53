//! Enqueueing: batches through `enqueue.lua`, and the grouping of concurrent single
//! enqueues into one script call.
//!
//! Each job carries its own id and clock reading, so a job enqueued together with others
//! is stored exactly as if it had been enqueued alone at the moment it was called.
//!
//! A batch is all or nothing (CONTRACT E9), whatever its size: its jobs become visible in
//! one script call, which checks everything (parents, dedup keys, staged payloads) before
//! its first write. A batch whose payloads fit [`CHUNK_BYTES`] is that one call. A larger
//! one first stages its payloads: each goes into its job's own hash (field `payload`
//! only, no `state`, with a server TTL), which nothing reads as a job; the one call then
//! turns them into jobs. A batch that fails before that call leaves only staged hashes,
//! removed on the spot or, when the connection is gone, by their TTL.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use durq_core::batch::{Batch, Limits};
use durq_core::graph::Dependency;
use durq_core::{Enqueued, Error, JobId, NewJob, Result, Timestamp, Uniqueness};
use redis::Value;

use super::RedisBackend;
use crate::codec::{array, encode_meta, int, job_id, job_id_bytes, text};
use crate::conn::{map_err, Conn};
use crate::keys::{hex_key, Keys};
use crate::scripts::{self, Eval};

/// Grouped single enqueues per script call, and the payload bytes one call carries at
/// most (a larger batch stages its payloads first; a single larger job still goes
/// inline). Bounds how long one call holds the server and how large one command gets.
const CHUNK_JOBS: usize = 512;
const CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// Server TTL of a staged payload: only garbage collection of a batch whose client died
/// between staging and committing. The commit refuses a batch whose staged payload is
/// gone, so the TTL never decides anything but the memory kept.
const STAGE_TTL_MS: i64 = 60 * 60 * 1000;
/// Times a batch may be sent again because dedup keys point at jobs it did not read.
const NEED_ROUNDS: usize = 64;

/// A job with its minted id and the instant of its call.
pub(crate) struct Prepared {
    pub job: NewJob,
    pub id: JobId,
    pub now: Timestamp,
    /// The job's parent lives in another partition of a partitioned namespace (the
    /// job's idempotency key placed it here): checked before the call, which only
    /// writes the link.
    pub parent_elsewhere: bool,
}

/// What the scripts need besides the jobs.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub conn: Conn,
    pub keys: Keys,
    pub window: Duration,
    /// The dedup keys' garbage-collection TTL in ms; 0 when the window is empty.
    pub dedup_ttl: i64,
    /// Whether the jobs this store enqueues record their events (CONTRACT V1): the
    /// store's `StoreSettings::record_events`, on an unpartitioned namespace only (a
    /// partitioned one declares no `Events`, so nothing would read or trim a stream).
    pub record_events: bool,
}

/// One script call's answer. Every answer but `Done` means nothing was written.
pub(crate) enum Chunk {
    Done(Vec<Enqueued>),
    /// Dedup keys of the run point at these ids, whose hashes must be passed too.
    Need(Vec<JobId>),
    /// Job `at`'s parent does not exist.
    Parent(usize),
    /// Job `at` waits for this job, which does not exist (CONTRACT G1).
    DependsOn(usize, JobId),
    /// Job `at`'s staged payload is gone.
    Staged(usize),
}

/// The ready-time part (16 hex digits) of the claim-order key of `at`.
pub(crate) fn ready_hex(at: Timestamp) -> String {
    let key = durq_core::ReadyOrder::new(0, at, 0).sort_key();
    key[4..20].to_owned()
}

pub(crate) fn unknown_dependency(id: JobId) -> Error {
    Error::invalid("depends_on", format!("job {id} does not exist"))
}

pub(crate) fn invalid_parent(parent: Option<JobId>) -> Error {
    match parent {
        Some(parent) => Error::invalid("parent", format!("job {parent} does not exist")),
        None => Error::invalid("parent", "does not exist"),
    }
}

/// How many jobs from the start of `jobs` go into one grouped call.
fn chunk_len(jobs: &[&Prepared]) -> usize {
    let mut end = 0;
    let mut bytes = 0;
    while end < jobs.len()
        && end < CHUNK_JOBS
        && (end == 0 || bytes + jobs[end].job.payload.len() <= CHUNK_BYTES)
    {
        bytes += jobs[end].job.payload.len();
        end += 1;
    }
    end
}

/// The first 20 hex digits of `durq_core::ReadyOrder::sort_key()` of a job of
/// `priority` ready at `at`: what the claim order knows before the sequence number,
/// which `enqueue.lua` draws and appends. Written without the formatting machinery, as
/// it is once per enqueued job.
pub(crate) fn order_prefix(priority: i16, at: Timestamp) -> [u8; 20] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // As sort_key: priority inverted so the highest sorts first, the signed time shifted
    // into unsigned space so negative instants sort first.
    let inverted = (i32::from(i16::MAX) - i32::from(priority)) as u16;
    let ready = (at.as_millis() as u64) ^ (1 << 63);
    let mut out = [0u8; 20];
    for (i, digit) in out[..4].iter_mut().enumerate() {
        *digit = HEX[usize::from((inverted >> (12 - 4 * i)) & 0xf)];
    }
    for (i, digit) in out[4..].iter_mut().enumerate() {
        *digit = HEX[((ready >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// The value of option `w` of a job with dependencies (see the script's header):
/// `POLICY NOW REF...`, a batch index as `#i` counted from 1 within the call (a batch is
/// always one call, see [`run_all`]).
fn dependency_refs(job: &NewJob, now: Timestamp) -> String {
    let mut out = format!("{} {}", job.on_dependency_failure, now.as_millis());
    for dependency in &job.depends_on {
        out.push(' ');
        match dependency {
            Dependency::Job(id) => id.push_canonical(&mut out),
            Dependency::Earlier(index) => {
                out.push('#');
                out.push_str(&(index + 1).to_string());
            }
        }
    }
    out
}

/// Runs one script call over `jobs`, passing the hashes of the `known` jobs that dedup
/// keys point at. With `staged`, the payloads are already in the jobs' hashes.
async fn run_chunk(ctx: &Ctx, jobs: &[&Prepared], known: &[JobId], staged: bool) -> Result<Chunk> {
    let keys = &ctx.keys;
    let mut invocation = Eval::new(&scripts::ENQUEUE);
    let has_keys = jobs.iter().any(|p| p.job.idempotency_key.is_some());
    invocation
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.list)
        .key(&keys.seq)
        .key(&keys.children)
        .key(&keys.placement)
        .key(&keys.ckeys)
        .key(&keys.kready)
        .key(&keys.dependents)
        .key(&keys.finished)
        .key(&keys.events)
        .arg(ctx.dedup_ttl)
        .arg(jobs.len())
        .arg(&keys.wake)
        .arg(if has_keys { "1" } else { "0" })
        .arg(if ctx.record_events { "1" } else { "0" });
    let mut opts = String::with_capacity(8);
    for prepared in jobs {
        let (job, id, now) = (&prepared.job, prepared.id, prepared.now);
        let run_at = job.run_at.unwrap_or(now);
        let timeout = job
            .timeout
            .map(|t| durq_core::duration_millis(t).to_string());
        let placement = durq_core::fit::encode_placement(&job.needs, job.locality.as_deref());
        let ckey = job.concurrency_key.as_deref().map(hex_key);
        // The options of the entry (see the script's header), in the script's order.
        opts.clear();
        if run_at > now {
            opts.push('s');
        }
        if staged {
            opts.push('g');
        }
        invocation.job_key(keys, id);
        if let Some(key) = &job.idempotency_key {
            opts.push('k');
            if job.uniqueness == Uniqueness::WhileActive {
                opts.push('a');
            }
            invocation.key(keys.dedup(&job.tenant, key));
        }
        if job.parent.is_some() {
            if prepared.parent_elsewhere {
                opts.push('q');
            } else if let Some(parent) = job.parent {
                opts.push('p');
                invocation.job_key(keys, parent);
            }
        }
        if timeout.is_some() {
            opts.push('t');
        }
        if placement.is_some() {
            opts.push('l');
        }
        if ckey.is_some() {
            opts.push('c');
        }
        let dependencies = (!job.depends_on.is_empty()).then(|| dependency_refs(job, now));
        if !job.depends_on.is_empty() {
            opts.push('w');
            for dependency in &job.depends_on {
                if let Dependency::Job(id) = dependency {
                    invocation.job_key(keys, *id);
                }
            }
        }
        invocation
            .id_arg(id)
            .arg(&job.queue)
            .arg(encode_meta(job, now))
            .arg(if staged {
                &[][..]
            } else {
                job.payload.as_ref()
            })
            .arg(run_at.as_millis())
            .arg(&order_prefix(job.priority, run_at)[..])
            .arg(&opts);
        if job.idempotency_key.is_some() {
            invocation.arg(now.saturating_sub(ctx.window).as_millis());
        }
        if let Some(parent) = job.parent {
            invocation.id_arg(parent);
        }
        if let Some(timeout) = timeout {
            invocation.arg(timeout);
        }
        if let Some(placement) = placement {
            invocation.arg(placement);
        }
        if let Some(ckey) = ckey {
            invocation.arg(ckey);
        }
        if let Some(dependencies) = dependencies {
            invocation.arg(dependencies);
        }
    }
    for id in known {
        invocation.job_key(keys, *id).id_arg(*id);
    }
    let reply = invocation
        .invoke(&mut ctx.conn.clone())
        .await
        .map_err(|err| map_err("enqueue", err))?;
    parse_reply(&reply, jobs)
}

fn parse_reply(reply: &Value, jobs: &[&Prepared]) -> Result<Chunk> {
    const WHAT: &str = "enqueue reply";
    let len = jobs.len();
    let items = array(reply, WHAT)?;
    let (first, rest) = items
        .split_first()
        .ok_or_else(|| Error::corrupt(WHAT, "empty script reply"))?;
    let word = text(first, WHAT)?;
    // Per job: 1 when it was created under its own id, else the id its key points at.
    let results = |value: &Value| -> Result<Vec<Enqueued>> {
        array(value, WHAT)?
            .iter()
            .zip(jobs)
            .map(|(result, job)| match result {
                Value::Int(1) => Ok(Enqueued {
                    id: job.id,
                    created: true,
                }),
                Value::BulkString(bytes) => Ok(Enqueued {
                    id: job_id_bytes(bytes, WHAT)?,
                    created: false,
                }),
                other => Err(Error::corrupt(
                    WHAT,
                    format!("unexpected job result {other:?}"),
                )),
            })
            .collect()
    };
    let index = |value: &Value| -> Result<usize> {
        let j = int(value, WHAT)?;
        usize::try_from(j)
            .ok()
            .and_then(|j| j.checked_sub(1))
            .filter(|j| *j < len)
            .ok_or_else(|| Error::corrupt(WHAT, format!("bad job index {j}")))
    };
    match (word.as_str(), rest) {
        ("ok", [done]) => {
            if array(done, WHAT)?.len() != len {
                return Err(Error::corrupt(WHAT, "one result per job expected"));
            }
            Ok(Chunk::Done(results(done)?))
        }
        ("parent", [j]) => Ok(Chunk::Parent(index(j)?)),
        ("depends_on", [j, id]) => Ok(Chunk::DependsOn(index(j)?, job_id(&text(id, WHAT)?, WHAT)?)),
        ("staged", [j]) => Ok(Chunk::Staged(index(j)?)),
        ("need", [ids]) => Ok(Chunk::Need(
            array(ids, WHAT)?
                .iter()
                .map(|id| job_id(&text(id, WHAT)?, "dedup key"))
                .collect::<Result<_>>()?,
        )),
        (word, _) => Err(Error::corrupt(
            WHAT,
            format!("unexpected script reply {word:?}"),
        )),
    }
}

/// Guards the "need" loop: each answer names ids the script did not hold, so it only
/// repeats while other clients keep repointing the run's keys. A `need` answer wrote
/// nothing, so giving up leaves nothing behind.
fn note_needed(known: &mut Vec<JobId>, ids: Vec<JobId>, rounds: &mut usize) -> Result<()> {
    *rounds += 1;
    if *rounds > NEED_ROUNDS || ids.is_empty() || ids.iter().any(|id| known.contains(id)) {
        return Err(Error::Backend {
            message: "dedup keys kept changing under the enqueue".to_owned(),
            source: None,
        });
    }
    known.extend(ids);
    Ok(())
}

impl RedisBackend {
    /// `enqueue_batch`: `jobs` in order as one batch at `now`, each with an id of its own;
    /// the ids their dedup keys point at are read first.
    pub(crate) async fn enqueue_many(
        &self,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        let prepared: Vec<Prepared> = jobs
            .into_iter()
            .map(|job| Prepared {
                job,
                id: JobId::mint(now),
                now,
                parent_elsewhere: false,
            })
            .collect();
        self.enqueue_prepared(&prepared).await
    }

    /// `enqueue_batch` of jobs whose ids are already minted (a partitioned store pins
    /// them to this partition first): one batch, all or nothing.
    pub(crate) async fn enqueue_prepared(&self, prepared: &[Prepared]) -> Result<Vec<Enqueued>> {
        let ctx = &self.inner.enqueue_ctx;
        let mut known = read_dedup_keys(ctx, prepared).await?;
        run_all(ctx, prepared, &mut known).await
    }

    /// Whether each of `ids` has a job record in this store (a partition's, for a
    /// partitioned one), one pipelined `EXISTS` each.
    pub(crate) async fn jobs_exist(&self, ids: &[JobId]) -> Result<Vec<bool>> {
        let keys = &self.inner.keys;
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hexists(keys.job(*id), "state");
        }
        pipe.query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("enqueue parent check", err))
    }
}

/// The ids the batch's dedup keys point at now, so the script rarely has to ask for
/// them (a `need` answer and a second call). A batch without keys reads nothing.
pub(crate) async fn read_dedup_keys(ctx: &Ctx, jobs: &[Prepared]) -> Result<Vec<JobId>> {
    let keys: Vec<String> = jobs
        .iter()
        .map(|prepared| &prepared.job)
        .filter_map(|job| {
            let key = job.idempotency_key.as_ref()?;
            Some(ctx.keys.dedup(&job.tenant, key))
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.get(key);
    }
    let values: Vec<Option<String>> = pipe
        .query_async(&mut ctx.conn.clone())
        .await
        .map_err(|err| map_err("enqueue dedup read", err))?;
    values
        .into_iter()
        .flatten()
        .map(|id| job_id(&id, "dedup key"))
        .collect::<Result<HashSet<_>>>()
        .map(|ids| ids.into_iter().collect())
}

/// Enqueues `jobs` in order as one batch, all or nothing (see the module's header).
/// An unknown parent fails the call.
pub(crate) async fn run_all(
    ctx: &Ctx,
    jobs: &[Prepared],
    known: &mut Vec<JobId>,
) -> Result<Vec<Enqueued>> {
    let jobs: Vec<&Prepared> = jobs.iter().collect();
    let bytes: usize = jobs.iter().map(|p| p.job.payload.len()).sum();
    if jobs.len() <= 1 || bytes <= CHUNK_BYTES {
        return commit(ctx, &jobs, known, false).await;
    }
    // Staging a batch that names a missing parent would only be undone.
    check_parents(ctx, &jobs).await?;
    let outcome = match stage(ctx, &jobs).await {
        Ok(()) => commit(ctx, &jobs, known, true).await,
        Err(err) => Err(err),
    };
    if outcome.is_err() {
        unstage(ctx, &jobs).await;
    }
    outcome
}

/// The one call that writes the batch, sent again (nothing written) while dedup keys
/// point at jobs it was not given.
async fn commit(
    ctx: &Ctx,
    jobs: &[&Prepared],
    known: &mut Vec<JobId>,
    staged: bool,
) -> Result<Vec<Enqueued>> {
    let mut rounds = 0;
    loop {
        match run_chunk(ctx, jobs, known, staged).await? {
            Chunk::Done(done) => return Ok(done),
            Chunk::Need(ids) => note_needed(known, ids, &mut rounds)?,
            Chunk::Parent(at) => return Err(invalid_parent(jobs[at].job.parent)),
            Chunk::DependsOn(_, id) => return Err(unknown_dependency(id)),
            Chunk::Staged(at) => {
                return Err(Error::Unavailable {
                    message: format!(
                        "the staged payload of job {} vanished before the batch was written",
                        jobs[at].id
                    ),
                    source: None,
                })
            }
        }
    }
}

/// Checks every parent of a staged batch before staging (the commit checks them again).
async fn check_parents(ctx: &Ctx, jobs: &[&Prepared]) -> Result<()> {
    let parents: Vec<JobId> = jobs
        .iter()
        .filter(|p| !p.parent_elsewhere)
        .filter_map(|p| p.job.parent)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if parents.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for parent in &parents {
        pipe.exists(ctx.keys.job(*parent));
    }
    let exists: Vec<bool> = pipe
        .query_async(&mut ctx.conn.clone())
        .await
        .map_err(|err| map_err("enqueue parent check", err))?;
    match parents.iter().zip(exists).find(|(_, exists)| !exists) {
        Some((parent, _)) => Err(invalid_parent(Some(*parent))),
        None => Ok(()),
    }
}

/// Writes every payload into its job's hash (field `payload` only, with a TTL), in
/// pipelines of about [`CHUNK_BYTES`].
async fn stage(ctx: &Ctx, jobs: &[&Prepared]) -> Result<()> {
    let mut start = 0;
    while start < jobs.len() {
        let mut end = start;
        let mut bytes = 0;
        let mut pipe = redis::pipe();
        while end < jobs.len()
            && (end == start || bytes + jobs[end].job.payload.len() <= CHUNK_BYTES)
        {
            let job = jobs[end];
            let key = ctx.keys.job(job.id);
            pipe.hset(&key, "payload", job.job.payload.as_ref())
                .ignore()
                .pexpire(&key, STAGE_TTL_MS)
                .ignore();
            bytes += job.job.payload.len();
            end += 1;
        }
        let () = pipe
            .query_async(&mut ctx.conn.clone())
            .await
            .map_err(|err| map_err("enqueue staging", err))?;
        start = end;
    }
    Ok(())
}

/// Removes the staged payloads of a batch that failed, best effort: `unstage.lua` deletes
/// only hashes that are still no job (no `state`), so a commit whose reply was lost keeps
/// its jobs. What this cannot reach expires by its TTL.
async fn unstage(ctx: &Ctx, jobs: &[&Prepared]) {
    for chunk in jobs.chunks(1000) {
        let mut invocation = scripts::UNSTAGE.prepare_invoke();
        for job in chunk {
            invocation.key(ctx.keys.job(job.id));
        }
        if let Err(err) = invocation.invoke_async::<i64>(&mut ctx.conn.clone()).await {
            tracing::debug!(error = %err, "staged payloads left to their TTL");
            return;
        }
    }
}

/// Concurrent single enqueues of one store, grouped by the shared
/// [`durq_core::batch`] batcher into script calls. The first enqueue after a quiet
/// spell goes out at once; those arriving while calls are in flight make up the next.
pub(crate) struct Enqueues {
    pub ctx: Ctx,
}

impl Batch for Enqueues {
    type Call = Prepared;
    type Answer = Result<Enqueued>;
    /// The script enqueues its jobs one after the other, so two with one dedup key in
    /// one call behave as two calls in a row.
    type Key = Infallible;

    const LIMITS: Limits = Limits {
        max_calls: CHUNK_JOBS,
        max_bytes: CHUNK_BYTES,
        in_flight: 4,
        queued: 4 * CHUNK_JOBS,
    };

    fn size(call: &Prepared) -> usize {
        call.job.payload.len()
    }

    /// Each job gets its own answer: one whose parent is missing gets its error and the
    /// others go on without it (the script refused the call before writing anything, so
    /// it is sent again without that job). A failure after some jobs were written
    /// fails only the jobs not yet written.
    async fn run(&self, calls: &[Prepared]) -> Result<Vec<Result<Enqueued>>> {
        let ctx = &self.ctx;
        let mut answers: Vec<Option<Result<Enqueued>>> = calls.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..calls.len()).collect();
        let mut known = Vec::new();
        let mut rounds = 0;
        let mut failure = None;
        while !pending.is_empty() {
            let jobs: Vec<&Prepared> = pending.iter().map(|&at| &calls[at]).collect();
            let end = chunk_len(&jobs);
            match run_chunk(ctx, &jobs[..end], &known, false).await {
                Ok(Chunk::Done(done)) => {
                    for (at, enqueued) in pending.drain(..end).zip(done) {
                        answers[at] = Some(Ok(enqueued));
                    }
                }
                Ok(Chunk::Need(ids)) => {
                    if let Err(err) = note_needed(&mut known, ids, &mut rounds) {
                        failure = Some(err);
                        break;
                    }
                }
                Ok(Chunk::Parent(at)) => {
                    let at = pending.remove(at);
                    answers[at] = Some(Err(invalid_parent(calls[at].job.parent)));
                }
                Ok(Chunk::DependsOn(at, id)) => {
                    let at = pending.remove(at);
                    answers[at] = Some(Err(unknown_dependency(id)));
                }
                Ok(Chunk::Staged(_)) => {
                    // Grouped enqueues carry their payloads inline; a script that says
                    // otherwise is not the one this crate sent.
                    failure = Some(Error::corrupt("enqueue reply", "unexpected 'staged'"));
                    break;
                }
                Err(err) => {
                    failure = Some(err);
                    break;
                }
            }
        }
        let unanswered = || Error::corrupt("enqueue reply", "a job went unanswered");
        Ok(answers
            .into_iter()
            .map(|answer| match (answer, &failure) {
                (Some(answer), _) => answer,
                (None, Some(err)) => Err(err.clone()),
                (None, None) => Err(unanswered()),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_prefixes_are_the_start_of_the_sort_key() {
        for priority in [i16::MIN, -1, 0, 1, 7, i16::MAX] {
            for millis in [i64::MIN, -1, 0, 1, 1_764_000_000_123, i64::MAX] {
                let at = Timestamp::from_millis(millis);
                let key = durq_core::ReadyOrder::new(priority, at, 42).sort_key();
                assert_eq!(
                    std::str::from_utf8(&order_prefix(priority, at)).expect("hex"),
                    &key[..20],
                    "priority {priority}, at {millis}"
                );
            }
        }
    }
}
