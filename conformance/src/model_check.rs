//! Rule M1: random operation sequences checked against a reference model.
//!
//! Each case draws a sequence of operations (enqueue alone and in batches, with and
//! without idempotency keys and parents, claims by three workers over two queues,
//! heartbeat, complete, fail, release, reclaim, cancel, retry, purge, get, children,
//! stats, list, and clock jumps, some landing exactly on a lease expiry, a `run_at`,
//! the end of a dedup window or of a retention), runs it on a fresh store, and runs it
//! on the reference model in `model`, written from the [contract](jobs_core::contract)
//! alone. After every step it compares what the store answered with what the model
//! allows, then checks the invariants on the whole store: every job, as listed, equals
//! the model's, field by field; the per-state listings partition each queue (each job
//! in exactly one state); `stats` agree; no claim hands out a running job; and every
//! job is found by `get` until `purge` removes it (the jobs the step changed are read
//! back at once, all of them every eighth step and at the end).
//!
//! Where the contract leaves a choice to the store, the model accepts any allowed
//! answer and adopts it: which expired jobs a limited `reclaim` takes and how jobs
//! reclaimed by one call are ordered among themselves, which jobs a limited `purge`
//! deletes, the `started_at`/`heartbeat_at` of a job no longer running, and the
//! `cancel_requested` flag of a finished one. Store ids map to model ids in order of
//! creation, and must be time-ordered.
//!
//! Knobs (environment variables): `JOBS_M1_CASES` (default 64), `JOBS_M1_OPS` (the
//! longest sequence, default 40), `JOBS_M1_SEED` (replays a run; a failure prints its
//! seed), `JOBS_M1_SHRINK` (how many runs to spend shrinking a failure, default 256)
//! and `JOBS_M1_TRACE=1` (prints every step of every case).

mod case;
mod invariants;
mod model;
mod ops;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use jobs_core::{
    ClaimRequest, Clock, Completion, Enqueued, Error, JobId, JobState, LeaseToken, ListQuery,
    NewJob, Retry, Timestamp,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::{Harness, TestEnv};
use case::{Claim, Run};
use model::{Expect, ModelJob, NewModelJob};
use ops::{Link, Mark, Op, Spec};

/// The queues every sequence works on.
const QUEUES: [&str; 2] = ["m1-a", "m1-b"];
/// Tenants scoping the idempotency keys; the first is the default.
const TENANTS: [&str; 2] = ["", "tenant-1"];
/// The workers that claim.
const WORKERS: [&str; 3] = ["worker-0", "worker-1", "worker-2"];
/// Short enough that clock jumps in a sequence cross it.
const DEDUP_WINDOW: Duration = Duration::from_secs(30 * 60);
/// Short enough that clock jumps cross it, long enough that a Redis garbage-collection
/// TTL derived from it (in real time) never fires during a test.
const RETENTION: Duration = Duration::from_secs(60 * 60);
/// Every this many steps, every job is read back with `get`, not only the changed ones.
const SWEEP: usize = 8;

/// Rule M1: random sequences of operations give the same observable results as the
/// reference model, and the invariants hold after every step.
///
/// On a failure it shrinks the sequence, then panics with the seed, the failing step,
/// the shrunk sequence with what each step returned, and the original sequence.
pub async fn m1_model_check(harness: &dyn Harness) {
    let cases = env_number("JOBS_M1_CASES", 64);
    let max_ops = env_number("JOBS_M1_OPS", 40) as usize;
    let shrink_budget = env_number("JOBS_M1_SHRINK", 256);
    let seed = std::env::var("JOBS_M1_SEED")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(fresh_seed);

    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: cases as u32,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = ops::sequence(max_ops);

    let mut coverage: BTreeMap<String, u64> = BTreeMap::new();
    for case in 0..cases {
        // Draw the whole case up front: proptest's value trees are not `Send`, and the
        // scenario future must be.
        let original = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree.current(),
            Err(reason) => panic!("M1: cannot draw a sequence: {reason}"),
        };
        let Err(failure) = run_case(harness, &original, &mut coverage).await else {
            continue;
        };
        let (shrunk, failure, runs) =
            shrink(harness, original.clone(), failure, shrink_budget).await;
        let mut report = String::new();
        let _ = writeln!(
            report,
            "M1 model check failed (JOBS_M1_SEED={seed}, case {case} of {cases}, shrunk in {runs} runs)"
        );
        let _ = writeln!(report, "\nat step {}: {}", failure.step, failure.message);
        let _ = writeln!(report, "\nshrunk sequence, with what each step returned:");
        for line in &failure.trace {
            let _ = writeln!(report, "  {line}");
        }
        let _ = writeln!(
            report,
            "\nshrunk sequence ({} ops):\n{shrunk:?}",
            shrunk.len()
        );
        let _ = writeln!(
            report,
            "\noriginal sequence ({} ops):\n{original:?}",
            original.len()
        );
        panic!("{report}");
    }
    // Shown with --nocapture: how often each operation met each outcome, to see that
    // the sequences reach the interesting cases.
    eprintln!(
        "M1: {cases} cases of at most {max_ops} steps passed (JOBS_M1_SEED={seed}); outcomes:"
    );
    for (outcome, count) in &coverage {
        eprintln!("  {count:>6}  {outcome}");
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A seed that differs between runs, so repeated runs explore new sequences.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish()
}

/// Shrinks a failing sequence by deleting runs of steps while it still fails, halving
/// the run length when no deletion of that length fails (delta debugging). Steps name
/// jobs and claims by position, so every subsequence is a meaningful case. Runs after
/// the failing step never matter and are cut first, for free.
async fn shrink(
    harness: &dyn Harness,
    mut best: Vec<Op>,
    mut failure: Failure,
    budget: u64,
) -> (Vec<Op>, Failure, u64) {
    let mut runs = 0;
    best.truncate(failure.step + 1);
    let mut chunk = best.len().div_ceil(2);
    while chunk >= 1 && runs < budget {
        let mut progressed = false;
        let mut start = 0;
        while start < best.len() && runs < budget {
            let end = (start + chunk).min(best.len());
            let candidate = [&best[..start], &best[end..]].concat();
            if candidate.is_empty() {
                start = end;
                continue;
            }
            runs += 1;
            match run_case(harness, &candidate, &mut BTreeMap::new()).await {
                Err(found) => {
                    best = candidate;
                    best.truncate(found.step + 1);
                    failure = found;
                    progressed = true;
                }
                Ok(()) => start = end,
            }
        }
        if !progressed {
            chunk /= 2;
        }
    }
    (best, failure, runs)
}

/// Why and where a case failed.
#[derive(Debug)]
struct Failure {
    step: usize,
    message: String,
    trace: Vec<String>,
}

async fn run_case(
    harness: &dyn Harness,
    ops: &[Op],
    coverage: &mut BTreeMap<String, u64>,
) -> Result<(), Failure> {
    let env = TestEnv::new(harness);
    let store = env
        .store_with(|s| s.dedup_window(DEDUP_WINDOW).retention(RETENTION))
        .await;
    let mut run = Run::new(store, env.clock.clone());
    let trace = std::env::var("JOBS_M1_TRACE").is_ok_and(|v| v == "1");
    for (step, op) in ops.iter().enumerate() {
        run.model.now = run.clock.now();
        let before = run.model.jobs.clone();
        match run.step(step, op).await {
            Ok(note) => {
                *coverage.entry(outcome(op, &note)).or_default() += 1;
                if trace {
                    eprintln!("{step:>3}. {op:?}  =>  {note}");
                }
                run.trace.push(format!("{step:>3}. {op:?}  =>  {note}"));
            }
            Err(message) => {
                run.trace.push(format!("{step:>3}. {op:?}  =>  FAILED"));
                return Err(Failure {
                    step,
                    message,
                    trace: run.trace,
                });
            }
        }
        run.model.now = run.clock.now();
        // `get` every job the step changed; every job on every SWEEP-th step and the
        // last. (The listings compare every job after every step regardless.)
        let sweep = step % SWEEP == SWEEP - 1 || step + 1 == ops.len();
        let changed: Vec<usize> = (0..run.model.jobs.len())
            .filter(|&i| sweep || before.get(i) != Some(&run.model.jobs[i]))
            .collect();
        if let Err(message) = run.check_invariants(&changed).await {
            return Err(Failure {
                step,
                message: format!("after the step, an invariant does not hold: {message}"),
                trace: run.trace,
            });
        }
    }
    Ok(())
}

/// A coarse name for what a step did, for the coverage summary.
fn outcome(op: &Op, note: &str) -> String {
    let name = format!("{op:?}");
    let name = name
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default();
    let class = if note.starts_with("skipped") {
        "skipped".to_owned()
    } else if note.contains("error ") || note.contains("not found") {
        let kinds = ["not found", "lease lost", "invalid", "cannot"];
        let kind = kinds
            .iter()
            .find(|k| note.contains(**k))
            .unwrap_or(&"other");
        format!("error: {kind}")
    } else if let Some(rest) = note.strip_prefix("claimed [") {
        format!("claimed {}", rest.matches('#').count())
    } else if let Some(rest) = note.strip_prefix("reclaimed ") {
        format!("reclaimed {}", rest.matches('(').count())
    } else if note.starts_with("purged") {
        note.split(':').next().unwrap_or_default().to_owned()
    } else if note.contains("duplicate") {
        "with a duplicate".to_owned()
    } else {
        match op {
            Op::Fail { .. } | Op::Cancel { .. } => {
                note.rsplit(' ').next().unwrap_or_default().to_owned()
            }
            _ => "ok".to_owned(),
        }
    };
    format!("{name}: {class}")
}

/// Whether `err` is the error the model expects, about job `id`.
fn error_matches(err: &Error, want: Expect, id: Option<JobId>) -> bool {
    let about = |got: &JobId| id.is_none_or(|id| id == *got);
    match (err, want) {
        (Error::NotFound { id: got }, Expect::NotFound) => about(got),
        (Error::LeaseLost { id: got }, Expect::LeaseLost) => about(got),
        (Error::InvalidInput { field, .. }, Expect::Invalid(want)) => *field == want,
        (Error::InvalidState { id: got, state, .. }, Expect::InvalidState(want)) => {
            about(got) && *state == want
        }
        _ => false,
    }
}

/// Compares a store answer with the model's, for calls that must agree exactly.
fn agree<W: std::fmt::Debug, G: std::fmt::Debug>(
    what: &str,
    id: JobId,
    want: Result<W, Expect>,
    got: jobs_core::Result<G>,
    same: impl Fn(&W, &G) -> bool,
) -> Result<String, String> {
    match (&want, &got) {
        (Ok(w), Ok(g)) if same(w, g) => Ok(format!("{g:?}")),
        (Err(w), Err(g)) if error_matches(g, *w, Some(id)) => Ok(format!("error {g}")),
        _ => Err(format!(
            "{what}: the store answered {got:?}, the model expects {want:?}"
        )),
    }
}

fn payload_of(variant: u8, step: usize) -> Vec<u8> {
    match variant {
        0 => Vec::new(),
        // Distinct per step, so a duplicate enqueue that overwrote a payload shows.
        1 => format!("payload of step {step}").into_bytes(),
        _ => vec![0, 0xff, step as u8, 0, b'\n'],
    }
}

impl Run {
    /// The store's job and the model's job for `spec`.
    fn resolve(&self, spec: &Spec, step: usize) -> (NewJob, NewModelJob) {
        let now = self.model.now;
        let queue = usize::from(spec.queue) % QUEUES.len();
        let tenant = TENANTS[usize::from(spec.tenant) % TENANTS.len()];
        let (key, parent) = match spec.link {
            Link::None => (None, None),
            Link::Key(k) => (Some(format!("k{k}")), None),
            Link::Parent(n) => (None, self.job_ref(n)),
        };
        let run_at = spec
            .delay
            .map(|ms| Timestamp::from_millis(now.as_millis() + ms));
        let payload = payload_of(spec.payload, step);
        let mut job = NewJob::new(QUEUES[queue])
            .tenant(tenant)
            .priority(spec.priority)
            .max_attempts(spec.max_attempts)
            .payload(payload.clone());
        if let Some(key) = &key {
            job = job.idempotency_key(key.clone());
        }
        if let Some(at) = run_at {
            job = job.run_at(at);
        }
        if let Some(p) = parent {
            job = job.parent(self.ids[p]);
        }
        let model = NewModelJob {
            queue,
            tenant: tenant.to_owned(),
            key,
            priority: spec.priority,
            run_at,
            max_attempts: spec.max_attempts,
            parent,
            payload,
        };
        (job, model)
    }

    /// Records the store's answer to one enqueue the model answered with `want`.
    fn adopt(&mut self, want: (usize, bool), got: Enqueued) -> Result<String, String> {
        let (idx, created) = want;
        if created {
            if !got.created {
                return Err(format!(
                    "enqueue deduplicated into {} ({}); the model creates job #{idx}",
                    got.id,
                    self.label(&got.id)
                ));
            }
            if self.by_id.contains_key(&got.id) {
                return Err(format!(
                    "enqueue created a job with the id of {}",
                    self.label(&got.id)
                ));
            }
            if let Some(last) = self.ids.last() {
                if got.id <= *last {
                    return Err(format!(
                        "ids are not time-ordered: new job {} after {last}",
                        got.id
                    ));
                }
            }
            self.ids.push(got.id);
            self.by_id.insert(got.id, idx);
            Ok(format!("new #{idx}"))
        } else if got.created || got.id != self.ids[idx] {
            Err(format!(
                "enqueue answered {{ id: {} ({}), created: {} }}; the model returns job #{idx}, created: false",
                got.id,
                self.label(&got.id),
                got.created
            ))
        } else {
            Ok(format!("duplicate of #{idx}"))
        }
    }

    async fn step(&mut self, step: usize, op: &Op) -> Result<String, String> {
        let now = self.model.now;
        match op {
            Op::Enqueue(spec) => {
                let (job, new) = self.resolve(spec, step);
                let want = self.model.enqueue(&new);
                let got = self.store.enqueue(job).await;
                match (want, got) {
                    (Ok(want), Ok(got)) => self.adopt(want, got),
                    (Err(want), Err(err)) if error_matches(&err, want, None) => {
                        Ok(format!("error {err}"))
                    }
                    (want, got) => Err(format!(
                        "enqueue: the store answered {got:?}, the model expects {want:?}"
                    )),
                }
            }
            Op::EnqueueBatch(specs) => {
                let (jobs, news): (Vec<NewJob>, Vec<NewModelJob>) =
                    specs.iter().map(|s| self.resolve(s, step)).unzip();
                let want = self.model.enqueue_batch(&news);
                let got = self.store.enqueue_batch(jobs).await;
                match (want, got) {
                    (Ok(want), Ok(got)) if want.len() == got.len() => {
                        let mut notes = Vec::new();
                        for (w, g) in want.into_iter().zip(got) {
                            notes.push(self.adopt(w, g)?);
                        }
                        Ok(notes.join(", "))
                    }
                    (Err(want), Err(err)) if error_matches(&err, want, None) => {
                        Ok(format!("error {err}"))
                    }
                    (want, got) => Err(format!(
                        "enqueue_batch: the store answered {got:?}, the model expects {want:?}"
                    )),
                }
            }
            Op::Claim {
                worker,
                queues,
                limit,
                ttl_ms,
            } => {
                let queues: Vec<usize> = match queues {
                    0 => vec![0],
                    1 => vec![1],
                    2 => vec![0, 1],
                    3 => vec![1, 0],
                    _ => vec![],
                };
                let worker = WORKERS[usize::from(*worker) % WORKERS.len()];
                let ttl = Duration::from_millis(*ttl_ms);
                let request =
                    ClaimRequest::new(queues.iter().map(|&q| QUEUES[q]), worker, ttl).limit(*limit);
                let got = self.store.claim(request).await;
                if queues.is_empty() {
                    return match got {
                        Err(Error::InvalidInput { field: "queues", .. }) => {
                            Ok("refused: no queues".to_owned())
                        }
                        other => Err(format!(
                            "a claim naming no queue must be refused (C1, field \"queues\"), got {other:?}"
                        )),
                    };
                }
                let claimed = got.map_err(|err| format!("claim failed: {err}"))?;
                let mut picked = Vec::with_capacity(claimed.len());
                for job in &claimed {
                    let idx = self.model_id(job.id(), "claim")?;
                    if self.model.jobs[idx].state == JobState::Running {
                        return Err(format!(
                            "claim handed out #{idx}, which is running under another lease (C2)"
                        ));
                    }
                    picked.push(idx);
                }
                self.model.claim(&queues, worker, ttl, *limit, &picked)?;
                let mut notes = Vec::new();
                for (job, &idx) in claimed.iter().zip(&picked) {
                    self.model
                        .check_job(idx, &job.job, &self.ids, &QUEUES)
                        .map_err(|diff| format!("the claimed job: {diff}"))?;
                    if job.payload.as_ref() != self.model.jobs[idx].payload.as_slice() {
                        return Err(format!(
                            "claim returned #{idx} with payload {:?}; enqueued was {:?}",
                            job.payload, self.model.jobs[idx].payload
                        ));
                    }
                    let token = self.model.jobs[idx].claims;
                    self.claims.push(Claim { job: idx, token });
                    notes.push(format!("#{idx} token {token}"));
                }
                Ok(format!("claimed [{}]", notes.join(", ")))
            }
            Op::Heartbeat {
                claim,
                token,
                ttl_ms,
            } => {
                let Some(c) = self.pick_claim(*claim, *token) else {
                    return Ok("skipped: no claims yet".to_owned());
                };
                let ttl = Duration::from_millis(*ttl_ms);
                let id = self.ids[c.job];
                let want = self.model.heartbeat(c.job, c.token, ttl);
                let got = self
                    .store
                    .heartbeat(id, LeaseToken::new(c.token), ttl)
                    .await;
                agree("heartbeat", id, want, got, |w, g| {
                    w.0 == g.cancel_requested && w.1 == g.expires_at
                })
                .map(|note| format!("#{} token {}: {note}", c.job, c.token))
            }
            Op::Complete {
                claim,
                token,
                result,
            } => {
                let Some(c) = self.pick_claim(*claim, *token) else {
                    return Ok("skipped: no claims yet".to_owned());
                };
                let result = result.then(|| format!("result of step {step}").into_bytes());
                let id = self.ids[c.job];
                let want = self.model.complete(c.job, c.token, result.clone());
                let got = self
                    .store
                    .complete(id, LeaseToken::new(c.token), result.map(Into::into))
                    .await;
                agree("complete", id, want, got, |_, _| true)
                    .map(|note| format!("#{} token {}: {note}", c.job, c.token))
            }
            Op::CompleteBatch(entries) => {
                let mut picked = Vec::new();
                for (n, (claim, token, result)) in entries.iter().enumerate() {
                    if let Some(c) = self.pick_claim(*claim, *token) {
                        let result = result.then(|| format!("result {n} of step {step}"));
                        picked.push((c, result.map(String::into_bytes)));
                    }
                }
                if picked.is_empty() {
                    return Ok("skipped: no claims yet".to_owned());
                }
                let completions = picked
                    .iter()
                    .map(|(c, result)| {
                        Completion::new(
                            self.ids[c.job],
                            LeaseToken::new(c.token),
                            result.clone().map(Into::into),
                        )
                    })
                    .collect();
                let answers = match self.store.complete_batch(completions).await {
                    Ok(answers) => answers,
                    Err(err) => return Err(format!("complete_batch failed as a whole: {err}")),
                };
                if answers.len() != picked.len() {
                    return Err(format!(
                        "complete_batch answered {} of {} entries",
                        answers.len(),
                        picked.len()
                    ));
                }
                let mut notes = Vec::new();
                for ((c, result), got) in picked.into_iter().zip(answers) {
                    let id = self.ids[c.job];
                    let want = self.model.complete(c.job, c.token, result);
                    let note = agree("complete_batch entry", id, want, got, |_, _| true)?;
                    notes.push(format!("#{} token {}: {note}", c.job, c.token));
                }
                Ok(notes.join("; "))
            }
            Op::Fail {
                claim,
                token,
                retry_in,
            } => {
                let Some(c) = self.pick_claim(*claim, *token) else {
                    return Ok("skipped: no claims yet".to_owned());
                };
                let retry = match retry_in {
                    None => Retry::Never,
                    Some(ms) => Retry::At(Timestamp::from_millis(now.as_millis() + ms)),
                };
                let message = format!("failure at step {step}");
                let id = self.ids[c.job];
                let want = self.model.fail(c.job, c.token, &message, retry);
                let got = self
                    .store
                    .fail(id, LeaseToken::new(c.token), &message, retry)
                    .await;
                agree("fail", id, want, got, |w, g| w == g)
                    .map(|note| format!("#{} token {}: {note}", c.job, c.token))
            }
            Op::Release { claim, token } => {
                let Some(c) = self.pick_claim(*claim, *token) else {
                    return Ok("skipped: no claims yet".to_owned());
                };
                let id = self.ids[c.job];
                let want = self.model.release(c.job, c.token);
                let got = self.store.release(id, LeaseToken::new(c.token)).await;
                agree("release", id, want, got, |_, _| true)
                    .map(|note| format!("#{} token {}: {note}", c.job, c.token))
            }
            Op::Reclaim { limit } => {
                let got = self
                    .store
                    .reclaim(*limit)
                    .await
                    .map_err(|err| format!("reclaim failed: {err}"))?;
                let mut mapped = Vec::with_capacity(got.len());
                for r in &got {
                    mapped.push((self.model_id(r.id, "reclaim")?, r.state));
                }
                self.model.reclaim(*limit, &mapped)?;
                Ok(format!("reclaimed {mapped:?}"))
            }
            Op::Cancel { job } => {
                // Narrow: a running job if any (the interesting case), else a queued one.
                let running = self.job_where(job.n, |j| j.present && j.state == JobState::Running);
                let Some(idx) = running
                    .filter(|_| !job.wide)
                    .or_else(|| self.pick_job(*job, |j| j.present && !j.state.is_terminal()))
                else {
                    return Ok("skipped: no jobs yet".to_owned());
                };
                let id = self.ids[idx];
                let want = self.model.cancel(idx);
                let got = self.store.cancel(id).await;
                agree("cancel", id, want, got, |w, g| w == g).map(|note| format!("#{idx}: {note}"))
            }
            Op::Retry { job } => {
                let retryable = |j: &ModelJob| {
                    j.present && matches!(j.state, JobState::Dead | JobState::Cancelled)
                };
                let Some(idx) = self.pick_job(*job, retryable) else {
                    return Ok("skipped: no jobs yet".to_owned());
                };
                let id = self.ids[idx];
                let want = self.model.retry(idx);
                let got = self.store.retry(id).await;
                agree("retry", id, want, got, |_, _| true).map(|note| format!("#{idx}: {note}"))
            }
            Op::Purge { limit } => {
                let purgeable = self.model.purgeable();
                let count = self
                    .store
                    .purge(*limit)
                    .await
                    .map_err(|err| format!("purge failed: {err}"))?;
                let mut deleted = Vec::new();
                for &idx in &purgeable {
                    match self.store.get(self.ids[idx]).await {
                        Ok(_) => {}
                        Err(err) if err.is_not_found() => deleted.push(idx),
                        Err(err) => return Err(format!("get #{idx} after purge failed: {err}")),
                    }
                }
                self.model.purge(*limit, count, &deleted)?;
                Ok(format!("purged {count}: {deleted:?}"))
            }
            Op::Get { job } => {
                // Narrow: a purged job, to see it stays gone.
                let Some(idx) = self.pick_job(*job, |j| !j.present) else {
                    return Ok("skipped: no jobs yet".to_owned());
                };
                let id = self.ids[idx];
                let got = self.store.get(id).await;
                let payload = self.store.payload(id).await;
                let want = &self.model.jobs[idx];
                if want.present {
                    let job = got.map_err(|err| format!("get #{idx} failed: {err}"))?;
                    self.model.check_job(idx, &job, &self.ids, &QUEUES)?;
                    let payload = payload.map_err(|err| format!("payload #{idx} failed: {err}"))?;
                    if payload.as_ref() != want.payload.as_slice() {
                        return Err(format!(
                            "payload of #{idx} is {payload:?}; enqueued was {:?}",
                            want.payload
                        ));
                    }
                    Ok(format!("#{idx} {}", job.state))
                } else {
                    match (got, payload) {
                        (Err(a), Err(b)) if a.is_not_found() && b.is_not_found() => {
                            Ok(format!("#{idx} not found (purged)"))
                        }
                        (got, payload) => Err(format!(
                            "#{idx} was purged, yet get answered {got:?} and payload {payload:?}"
                        )),
                    }
                }
            }
            Op::Children { job } => {
                let parents: Vec<Option<usize>> =
                    self.model.jobs.iter().map(|j| j.parent).collect();
                let Some(idx) = self
                    .pick_job(*job, |j| j.present)
                    .filter(|_| job.wide)
                    .or_else(|| {
                        let with_children: Vec<usize> = parents.iter().flatten().copied().collect();
                        (!with_children.is_empty())
                            .then(|| with_children[usize::from(job.n) % with_children.len()])
                    })
                    .or_else(|| self.job_ref(job.n))
                else {
                    return Ok("skipped: no jobs yet".to_owned());
                };
                let Ok(want) = self.model.children(idx) else {
                    // Children of a deleted job are not written down.
                    return Ok(format!("skipped: #{idx} was purged"));
                };
                let got = self
                    .store
                    .children(self.ids[idx])
                    .await
                    .map_err(|err| format!("children of #{idx} failed: {err}"))?;
                let got: Vec<String> = got.iter().map(|j| self.label(&j.id)).collect();
                let want: Vec<String> = want.iter().map(|i| format!("#{i}")).collect();
                if got != want {
                    return Err(format!(
                        "children of #{idx}: the store lists {got:?}, the model {want:?} (E8, oldest first)"
                    ));
                }
                Ok(format!("children of #{idx}: {got:?}"))
            }
            Op::Stats { queue } => {
                let q = usize::from(*queue) % QUEUES.len();
                let got = self
                    .store
                    .stats(QUEUES[q])
                    .await
                    .map_err(|err| format!("stats failed: {err}"))?;
                let want = self.model.stats(q);
                if got != want {
                    return Err(format!(
                        "stats of {}: the store counts {got:?}, the model {want:?}",
                        QUEUES[q]
                    ));
                }
                Ok(format!("{got:?}"))
            }
            Op::List { queue, state, page } => {
                let q = usize::from(*queue) % QUEUES.len();
                let listed = self.list_paged(q, *state, *page).await?;
                let want = self.model.list(q, *state);
                if listed != want {
                    return Err(format!(
                        "list of {} in {state:?}, {page} per page: the store lists {listed:?}, the model {want:?}",
                        QUEUES[q]
                    ));
                }
                Ok(format!("{listed:?}"))
            }
            Op::Advance { ms } => {
                self.clock.advance(Duration::from_millis(*ms as u64));
                Ok(format!("now {:?}", self.clock.now()))
            }
            Op::AdvanceTo { mark, offset } => {
                let Some(target) = self.mark_time(*mark) else {
                    return Ok("skipped: no such mark".to_owned());
                };
                let target = Timestamp::from_millis(target.as_millis() + offset);
                if target <= now {
                    return Ok(format!("skipped: {target:?} is not ahead"));
                }
                self.clock.set(target);
                Ok(format!("now {target:?}"))
            }
        }
    }

    fn mark_time(&self, mark: Mark) -> Option<Timestamp> {
        let now = self.model.now;
        let (n, at): (u16, fn(&ModelJob) -> Option<Timestamp>) = match mark {
            Mark::LeaseExpiry(n) => (n, |j| {
                (j.state == JobState::Running)
                    .then(|| j.lease.as_ref().map(|l| l.expires_at))
                    .flatten()
            }),
            Mark::RunAt(n) => (n, |j| (j.state == JobState::Queued).then_some(j.run_at)),
            Mark::DedupEnd(n) => (n, |j| {
                j.key
                    .as_ref()
                    .map(|_| j.created_at.saturating_add(DEDUP_WINDOW))
            }),
            Mark::RetentionEnd(n) => (n, |j| j.finished_at.map(|t| t.saturating_add(RETENTION))),
        };
        // Only marks still ahead (or just behind, for the -1 and 0 offsets) are useful.
        let idx = self.job_where(n, |j| j.present && at(j).is_some_and(|t| t >= now))?;
        at(&self.model.jobs[idx])
    }

    /// Reads a whole listing page by page, checking the cursor rules decided under A4.
    async fn list_paged(
        &self,
        queue: usize,
        state: Option<JobState>,
        page: usize,
    ) -> Result<Vec<usize>, String> {
        let mut listed = Vec::new();
        let mut cursor = None;
        // Every page but the last is full, so this many pages always suffice.
        let bound = self.ids.len() / page + 2;
        for _ in 0..bound {
            let mut query = ListQuery::new(QUEUES[queue]).limit(page);
            query.state = state;
            query.cursor = cursor;
            let got = self
                .store
                .list(query)
                .await
                .map_err(|err| format!("list failed: {err}"))?;
            for job in &got.jobs {
                let idx = self.model_id(job.id, "list")?;
                if state.is_some_and(|s| s != job.state) {
                    return Err(format!(
                        "list of state {state:?} returned #{idx} in state {}",
                        job.state
                    ));
                }
                listed.push(idx);
            }
            let full = got.jobs.len() == page;
            let last = got.jobs.last().map(|j| j.id);
            if got.next != if full { last } else { None } {
                return Err(format!(
                    "list page of {} jobs (limit {page}) has next {:?}; A4, decided: the last id when the page is full, else none",
                    got.jobs.len(),
                    got.next
                ));
            }
            match got.next {
                Some(next) => cursor = Some(next),
                None => return Ok(listed),
            }
        }
        Err(format!(
            "list kept returning full pages after {bound} pages"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suite boxes every scenario as a `Send` future; this one holds a proptest
    /// runner and value tree across awaits, so prove they are `Send`.
    #[allow(dead_code)]
    fn model_check_future_is_send(harness: &dyn Harness) {
        fn is_send<T: Send>(_: &T) {}
        is_send(&m1_model_check(harness));
    }
}
