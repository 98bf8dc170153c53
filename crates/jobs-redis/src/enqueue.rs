//! Enqueueing: runs of jobs through `enqueue.lua`, and the grouping of concurrent single
//! enqueues into one script call.
//!
//! Each job carries its own id and clock reading, so a job enqueued together with others
//! is stored exactly as if it had been enqueued alone at the moment it was called. A
//! script call either handles a whole run, or stops before the first job whose dedup key
//! points at a job it was not given (Rust calls again with that job's hash), or refuses
//! the run before writing anything when a parent is missing.

use std::sync::Arc;
use std::time::Duration;

use jobs_core::{Enqueued, Error, JobId, NewJob, Result, Timestamp};
use redis::Value;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::codec::{array, encode_meta, id_string, int, job_id, text};
use crate::conn::{map_err, Conn};
use crate::feeder::Feeder;
use crate::keys::Keys;
use crate::scripts;

/// Jobs per script call, and the payload bytes one call carries at most (a single larger
/// job still goes alone). Bounds how long one call holds the server.
const CHUNK_JOBS: usize = 512;
const CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// Grouped single enqueues in flight at once.
const IN_FLIGHT: usize = 4;

/// A validated job with its minted id and the clock reading of its call.
pub(crate) struct Prepared {
    pub job: NewJob,
    pub id: JobId,
    pub now: Timestamp,
}

/// What the scripts need besides the jobs.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub conn: Conn,
    pub keys: Keys,
    pub window: Duration,
    /// The dedup keys' garbage-collection TTL in ms; 0 when the window is empty.
    pub dedup_ttl: i64,
}

/// One script call's answer.
pub(crate) enum Chunk {
    Done(Vec<Enqueued>),
    /// Jobs before `at` (0-based within the run) are written; the dedup key of job `at`
    /// points at `id`, whose hash must be passed too.
    Need {
        done: Vec<Enqueued>,
        at: usize,
        id: JobId,
    },
    /// Job `at`'s parent does not exist; nothing of the run was written.
    Parent(usize),
}

/// The ready-time part (16 hex digits) of the claim-order key of `at`.
pub(crate) fn ready_hex(at: Timestamp) -> String {
    let key = jobs_core::ReadyOrder::new(0, at, 0).sort_key();
    key[4..20].to_owned()
}

pub(crate) fn invalid_parent(parent: Option<JobId>) -> Error {
    match parent {
        Some(parent) => Error::invalid("parent", format!("job {parent} does not exist")),
        None => Error::invalid("parent", "does not exist"),
    }
}

/// How many jobs from the start of `jobs` go into one script call.
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

/// Runs one script call over `jobs` (at most [`CHUNK_JOBS`]), passing the hashes of the
/// `known` jobs that dedup keys point at.
async fn run_chunk(ctx: &Ctx, jobs: &[&Prepared], known: &[JobId]) -> Result<Chunk> {
    let keys = &ctx.keys;
    let mut invocation = scripts::ENQUEUE.prepare_invoke();
    invocation
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.list)
        .key(&keys.seq)
        .key(&keys.children)
        .arg(ctx.dedup_ttl)
        .arg(jobs.len())
        .arg(&keys.wake);
    for prepared in jobs {
        let (job, id, now) = (&prepared.job, prepared.id, prepared.now);
        let run_at = job.run_at.unwrap_or(now);
        invocation.key(keys.job(id));
        match &job.idempotency_key {
            Some(key) => invocation.key(keys.dedup(&job.tenant, key)),
            None => invocation.key(&keys.none),
        };
        match job.parent {
            Some(parent) => invocation.key(keys.job(parent)),
            None => invocation.key(&keys.none),
        };
        invocation
            .arg(id_string(id))
            .arg(&job.queue)
            .arg(encode_meta(job, now))
            .arg(if job.idempotency_key.is_some() {
                "1"
            } else {
                "0"
            })
            .arg(job.payload.as_ref())
            .arg(job.priority)
            .arg(run_at.as_millis())
            .arg(ready_hex(run_at))
            .arg(if run_at <= now { "1" } else { "0" })
            .arg(job.parent.map(|p| p.to_string()).unwrap_or_default())
            .arg(now.saturating_sub(ctx.window).as_millis());
    }
    for id in known {
        invocation.key(keys.job(*id));
    }
    for id in known {
        invocation.arg(id_string(*id));
    }
    let reply = invocation
        .invoke_async(&mut ctx.conn.clone())
        .await
        .map_err(|err| map_err("enqueue", err))?;
    parse_reply(&reply, jobs.len())
}

fn parse_reply(reply: &Value, len: usize) -> Result<Chunk> {
    const WHAT: &str = "enqueue reply";
    let items = array(reply, WHAT)?;
    let (first, rest) = items
        .split_first()
        .ok_or_else(|| Error::corrupt(WHAT, "empty script reply"))?;
    let word = text(first, WHAT)?;
    let results = |value: &Value| -> Result<Vec<Enqueued>> {
        array(value, WHAT)?
            .iter()
            .map(|pair| {
                let [id, created] = array(pair, WHAT)? else {
                    return Err(Error::corrupt(WHAT, "expected id and flag"));
                };
                Ok(Enqueued {
                    id: job_id(&text(id, WHAT)?, WHAT)?,
                    created: int(created, WHAT)? == 1,
                })
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
        ("ok", [done]) => Ok(Chunk::Done(results(done)?)),
        ("parent", [j]) => Ok(Chunk::Parent(index(j)?)),
        ("need", [j, id, done]) => Ok(Chunk::Need {
            done: results(done)?,
            at: index(j)?,
            id: job_id(&text(id, WHAT)?, "dedup key")?,
        }),
        (word, _) => Err(Error::corrupt(
            WHAT,
            format!("unexpected script reply {word:?}"),
        )),
    }
}

/// Guards the "need" loop: each answer names an id the script did not hold, so it only
/// repeats while other clients keep repointing the run's keys.
fn note_needed(known: &mut Vec<JobId>, id: JobId, needs: &mut usize, limit: usize) -> Result<()> {
    *needs += 1;
    if *needs > limit + 64 || known.contains(&id) {
        return Err(Error::Backend {
            message: "dedup keys kept changing under the enqueue".to_owned(),
            source: None,
        });
    }
    known.push(id);
    Ok(())
}

/// Enqueues `jobs` in order, in script calls of at most [`CHUNK_JOBS`]. An unknown parent
/// fails the call (the caller checked every parent before, so only a parent deleted
/// meanwhile gets here).
pub(crate) async fn run_all(
    ctx: &Ctx,
    jobs: &[Prepared],
    known: &mut Vec<JobId>,
) -> Result<Vec<Enqueued>> {
    let jobs: Vec<&Prepared> = jobs.iter().collect();
    let mut out = Vec::with_capacity(jobs.len());
    let mut start = 0;
    let mut needs = 0;
    while start < jobs.len() {
        let end = start + chunk_len(&jobs[start..]);
        match run_chunk(ctx, &jobs[start..end], known).await? {
            Chunk::Done(done) => {
                out.extend(done);
                start = end;
            }
            Chunk::Need { done, at, id } => {
                out.extend(done);
                start += at;
                note_needed(known, id, &mut needs, jobs.len())?;
            }
            Chunk::Parent(at) => return Err(invalid_parent(jobs[start + at].job.parent)),
        }
    }
    Ok(out)
}

struct Request {
    job: Prepared,
    reply: oneshot::Sender<Result<Enqueued>>,
}

/// Groups concurrent single enqueues of one store into script calls. The first enqueue
/// after a quiet spell goes out at once; those arriving while calls are in flight make up
/// the next one. Its task ends when the store (and so the sender) drops.
pub(crate) struct Enqueuer {
    ctx: Ctx,
    feeder: Feeder<Request>,
}

impl Enqueuer {
    pub(crate) fn new(ctx: Ctx) -> Self {
        Enqueuer {
            ctx,
            feeder: Feeder::new(),
        }
    }

    /// Enqueues one validated job; resolves when its group has run.
    pub(crate) async fn enqueue(&self, job: Prepared) -> Result<Enqueued> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request { job, reply });
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                message: "the enqueue group was dropped before it ran".to_owned(),
                source: None,
            })
        })
    }

    fn submit(&self, request: Request) {
        self.feeder
            .send(request, |rx| group_loop(rx, self.ctx.clone()));
    }
}

async fn group_loop(mut requests: mpsc::UnboundedReceiver<Request>, ctx: Ctx) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = requests.recv().await {
        // Waiting for a slot lets the next group grow while the others run.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = first.job.job.payload.len();
        let mut group = vec![first];
        while group.len() < CHUNK_JOBS && bytes < CHUNK_BYTES {
            match requests.try_recv() {
                Ok(request) => {
                    bytes += request.job.job.payload.len();
                    group.push(request);
                }
                Err(_) => break,
            }
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            run_group(&ctx, group).await;
        });
    }
}

/// Runs a group of independent enqueues: each gets its own answer; a job whose parent
/// is missing gets its error and the others go on without it.
async fn run_group(ctx: &Ctx, mut group: Vec<Request>) {
    let mut known = Vec::new();
    let mut needs = 0;
    let limit = group.len();
    while !group.is_empty() {
        let jobs: Vec<&Prepared> = group.iter().map(|r| &r.job).collect();
        let end = chunk_len(&jobs);
        let outcome = run_chunk(ctx, &jobs[..end], &known).await;
        match outcome {
            Ok(Chunk::Done(done)) => {
                for (request, result) in group.drain(..end).zip(done) {
                    let _ = request.reply.send(Ok(result));
                }
            }
            Ok(Chunk::Need { done, at, id }) => {
                for (request, result) in group.drain(..at).zip(done) {
                    let _ = request.reply.send(Ok(result));
                }
                if let Err(err) = note_needed(&mut known, id, &mut needs, limit) {
                    fail_all(group, &err);
                    return;
                }
            }
            Ok(Chunk::Parent(at)) => {
                let request = group.remove(at);
                let _ = request
                    .reply
                    .send(Err(invalid_parent(request.job.job.parent)));
            }
            Err(err) => {
                fail_all(group, &err);
                return;
            }
        }
    }
}

/// Every remaining enqueue shares the failure, kind and text alike.
fn fail_all(group: Vec<Request>, err: &Error) {
    let message = err.to_string();
    let retryable = err.is_retryable();
    for request in group {
        let shared = if retryable {
            Error::Unavailable {
                message: message.clone(),
                source: None,
            }
        } else {
            Error::Backend {
                message: message.clone(),
                source: None,
            }
        };
        let _ = request.reply.send(Err(shared));
    }
}
