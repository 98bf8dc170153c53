//! The checker: reads every history file of a run, the orchestrator's fault log and
//! the store's final state, and decides.
//!
//! - **lost**: an acknowledged job that is not `succeeded` at the end (or is missing);
//! - **double completions**: more than one completion of a job accepted;
//! - **stale accepted**: an outcome (complete, fail, release) accepted under token `t`
//!   although a claim with a higher token had been returned before the call began, or
//!   a completion accepted under `t` for a job later claimed again with a higher token;
//! - **stuck**: a job still `running` whose lease has passed;
//! - **extra runs**: a run that follows an earlier run of the same job which did not
//!   end in an accepted fail or release (a planned retry or a shutdown release). Each
//!   one is explained by the earlier run's process having been SIGKILLed after that
//!   run began and before an accepted outcome, else by a store fault (Redis
//!   `CLIENT KILL`, Redis SIGKILL until it answers again, `pg_terminate_backend`)
//!   between the earlier claim (less a second) and the later one, else it is
//!   **unexplained**;
//! - **other violations**: a token handed out twice for one job, one claim run twice,
//!   a history line cut anywhere but at the end of its file;
//! - **dependency violations** (on a backend that keeps dependencies, whose run
//!   enqueues every third batch as graphs, CONTRACT G1): a job claimed before a job it
//!   waits for had succeeded: its first claim returned before the call that completed
//!   the dependency began (or, when no answer of that call came back, before the
//!   dependency's last run began); and a job still `waiting` once the queue drained;
//! - **limit violations** (on a backend with flow control, whose run's jobs carry
//!   concurrency keys limited to one running job each, CONTRACT K1): two leases of one
//!   key whose known parts overlap. A lease is known to hold from its claim's return to
//!   the start of the call whose outcome the store accepted under its token (or, for a
//!   lease that ended otherwise, a killed worker's, at its claim's return alone): both
//!   lie inside the store's own `running` interval of the job;
//! - **step violations** (on a backend with durable steps, whose worker runs every
//!   third job as three steps, CONTRACT D1, D2): a step run under a token above one
//!   whose save of it is known (a `step_saved` line, or a replay naming it): that run
//!   read the job's steps after the save, so a finished step ran again; a rerun of a
//!   step whose earlier run (the next lower token) was neither SIGKILLed after it began,
//!   nor overlapped by a store fault between that run (less a second) and the rerun,
//!   nor answered `Err` by `ctx.step` (its save refused or its answer lost); a step run
//!   twice under one token; a replay naming a run that never ran the step; and, read
//!   back from the store at the end, a succeeded step job whose saved steps are not all
//!   three in order, or whose saved output names a run the history contradicts;
//! - **stream violations** (on a backend with the event stream, where every store of
//!   the run records events, CONTRACT V1, V2): read whole at the end, each job's
//!   events replayed through the state machine of CONTRACT §2 from its `enqueued`
//!   (recorded once, first): a change from a state it cannot come from (a `started`
//!   of a job not queued, a `succeeded` of one not running, …), a job whose replayed
//!   state is not the state its record ends in, a job with a record and no events,
//!   fewer `started` events than the distinct claims the history saw, or a cursor not
//!   after the one before it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use durq::{Error, Job, JobId, JobState, Store};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::history::{now_us, Event, Op, ProcessHistory};
use crate::StoreArgs;

/// Arguments of `durq-chaos drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The longest wait, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout_s: u64,
}

/// Waits until the queue has nothing waiting, ready, scheduled or running; prints the
/// last counts. Fails if that does not happen in time.
pub async fn drain(args: DrainArgs) -> Result<(), String> {
    let store = crate::patiently("opening the store", || crate::open_store(&args.store)).await;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    loop {
        match store.stats(&args.store.queue).await {
            Ok(stats) => {
                let left = stats.waiting + stats.ready + stats.scheduled + stats.running;
                if left == 0 || Instant::now() >= deadline {
                    let counts = serde_json::json!({
                        "waiting": stats.waiting,
                        "ready": stats.ready,
                        "scheduled": stats.scheduled,
                        "running": stats.running,
                        "succeeded": stats.succeeded,
                        "dead": stats.dead,
                        "cancelled": stats.cancelled,
                    });
                    println!("{counts}");
                    if left == 0 {
                        return Ok(());
                    }
                    return Err(format!(
                        "{left} jobs still not done after {}s",
                        args.timeout_s
                    ));
                }
            }
            Err(err) if Instant::now() >= deadline => {
                return Err(format!("stats kept failing: {err}"));
            }
            Err(_) => {}
        }
        // Polling a store from outside the runtime under test: a wait on real time.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Arguments of `durq-chaos check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The backend's name, for the verdict.
    #[arg(long)]
    backend: String,
    /// The orchestrator's fault log.
    #[arg(long)]
    faults: PathBuf,
    /// When the fault window began (µs since the epoch).
    #[arg(long)]
    fault_start_us: u64,
    /// When it ended (µs since the epoch).
    #[arg(long)]
    fault_end_us: u64,
}

/// One line of the orchestrator's fault log.
#[derive(Debug, Clone, Deserialize)]
pub struct Fault {
    /// When it was injected (µs since the epoch).
    pub t: u64,
    /// `kill_worker`, `kill_producer`, `client_kill`, `redis_kill`, `pg_terminate`.
    pub kind: String,
    /// The process killed, for kills.
    pub pid: Option<u32>,
    /// When the fault was over (a restarted server answering again); `t` if absent.
    pub end: Option<u64>,
    /// How many connections it closed (`CLIENT KILL`, `pg_terminate_backend`).
    #[serde(default)]
    pub hits: Option<u64>,
}

impl Fault {
    fn is_store_fault(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "client_kill" | "redis_kill" | "pg_terminate"
        )
    }
}

/// The verdict of one backend's run: one JSON line on standard output.
#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    /// The backend.
    pub backend: String,
    /// Distinct jobs whose enqueue was acknowledged.
    pub jobs: usize,
    /// Jobs claimed that no acknowledged enqueue named (a batch cut by a producer kill
    /// and sent again without keys): not promised, not checked for loss.
    pub unacknowledged_jobs_run: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Connections closed by `CLIENT KILL` and `pg_terminate_backend`.
    pub connections_killed: u64,
    /// Worker store calls that failed (claims, reclaims, waits, heartbeats and
    /// outcomes answered with an error other than lease lost): the faults as the
    /// workers felt them.
    pub store_errors_seen: usize,
    /// Acknowledged jobs not `succeeded` at the end.
    pub lost: usize,
    /// Jobs with more than one accepted completion.
    pub double_completions: usize,
    /// Outcomes accepted under a stale token (see the module docs).
    pub stale_accepted: usize,
    /// Jobs left running after their lease passed.
    pub stuck: usize,
    /// Token reuse, a claim run twice, a corrupt history line.
    pub other_violations: usize,
    /// Leases of jobs with a concurrency key, checked against the key's limit.
    pub keyed_leases: usize,
    /// Pairs of leases of one key known to hold at once (its limit is one).
    pub limit_violations: usize,
    /// Jobs that waited for other jobs (CONTRACT G1), checked against them.
    pub dependent_jobs: usize,
    /// Jobs claimed before a job they wait for had succeeded, or left waiting.
    pub dependency_violations: usize,
    /// Handler runs in all.
    pub runs: usize,
    /// Runs after an accepted retryable failure or release (planned).
    pub planned_reruns: usize,
    /// Extra runs explained by a SIGKILLed worker.
    pub extra_runs_worker_kill: usize,
    /// Extra runs explained by a store fault.
    pub extra_runs_store_fault: usize,
    /// Extra runs nothing explains.
    pub extra_runs_unexplained: usize,
    /// Workers SIGKILLed.
    pub worker_kills: usize,
    /// Sum over worker kills of the claims the killed process held without an
    /// accepted outcome (kills × jobs in flight).
    pub claims_in_flight_at_kills: usize,
    /// The same for handler runs begun.
    pub runs_in_flight_at_kills: usize,
    /// Jobs that ended `succeeded` although no completion of theirs was answered
    /// `Ok` (an answer lost to a fault; a retry then found it done): not an error.
    pub succeeded_without_acknowledged_completion: usize,
    /// Distinct jobs completed per second during the fault window (until the last
    /// completion, if that came first).
    pub throughput_under_faults: f64,
    /// Acknowledged jobs per second from the first acknowledged enqueue to the last
    /// accepted completion.
    pub throughput_overall: f64,
    /// Jobs that ran durable steps (every third job, on a backend with `Steps`).
    pub step_jobs: usize,
    /// Step works begun (`step_run` lines).
    pub step_runs: usize,
    /// Steps saved by the run that ran them (`step_saved` lines).
    pub steps_saved: usize,
    /// Steps answered from a saved output, their work not run (`step_replayed`).
    pub steps_replayed: usize,
    /// Steps whose `ctx.step` answered `Err` (`step_failed`): a read or a save that
    /// failed, or a save refused by the fence.
    pub step_save_failures: usize,
    /// Steps run again after their earlier run's process was SIGKILLed.
    pub step_reruns_after_kill: usize,
    /// Steps run again after a store fault overlapped their earlier run.
    pub step_reruns_after_store_fault: usize,
    /// Steps run again after their earlier run's `ctx.step` answered `Err`.
    pub step_reruns_after_failed_save: usize,
    /// Saved steps read back from the store at the end and checked.
    pub steps_checked_in_store: usize,
    /// A finished step run again, a rerun nothing explains, a replay of a save no run
    /// made, or saved steps at the end that disagree with the history.
    pub step_violations: usize,
    /// Events read back from the stream at the end (on a backend with `Events`).
    pub stream_events: usize,
    /// Events out of cursor order, changes from a state a job cannot be in, a
    /// replayed state other than the job's final one, a job without events, or fewer
    /// starts than claims.
    pub stream_violations: usize,
    /// History lines cut by a kill (the last line of a killed process's file).
    pub cut_lines: usize,
    /// Whether every check passed.
    pub passed: bool,
    /// A few examples of each failure, for the report.
    pub examples: Vec<String>,
}

impl Verdict {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.double_completions == 0
            && self.stale_accepted == 0
            && self.stuck == 0
            && self.other_violations == 0
            && self.extra_runs_unexplained == 0
            && self.limit_violations == 0
            && self.dependency_violations == 0
            && self.step_violations == 0
            && self.stream_violations == 0
    }
}

#[derive(Debug, Clone, Copy)]
struct Claim {
    token: u64,
    pid: u32,
    t: u64,
}

#[derive(Debug, Clone, Copy)]
struct Outcome {
    op: Op,
    token: u64,
    pid: u32,
    t0: u64,
    t: u64,
    ok: bool,
}

#[derive(Debug, Default)]
struct JobHistory {
    claims: Vec<Claim>,
    /// Run starts: token, pid, time.
    runs: Vec<Claim>,
    outcomes: Vec<Outcome>,
    heartbeats_refused: usize,
}

impl JobHistory {
    fn accepted(&self, token: u64) -> Option<&Outcome> {
        self.outcomes.iter().find(|o| o.ok && o.token == token)
    }
}

/// Runs the checks and prints the verdict.
pub async fn run(args: CheckArgs) -> Result<(), String> {
    let histories = crate::history::read_dir(&args.store.run_dir, None)
        .map_err(|err| format!("cannot read the histories: {err}"))?;
    let faults = read_faults(&args.faults)?;
    let mut verdict = judge_history(&args.backend, &histories, &faults);
    let store = crate::patiently("opening the store", || crate::open_store(&args.store)).await;
    let (acked, jobs) = collect(&histories);
    let mut ids: Vec<JobId> = acked.keys().copied().collect();
    ids.extend(jobs.keys().filter(|id| !acked.contains_key(id)).copied());
    let finals = final_states(&store, ids).await?;
    judge_final(&mut verdict, &acked, &jobs, &finals);
    let keys: HashMap<JobId, &str> = finals
        .iter()
        .filter_map(|(id, job)| {
            let key = job.as_ref()?.concurrency_key.as_deref()?;
            Some((*id, key))
        })
        .collect();
    judge_limits(&mut verdict, &jobs, &keys);
    judge_dependencies(&mut verdict, &jobs, &finals);
    if store.supports(durq::Capability::Steps) {
        let steps = collect_steps(&histories);
        let saved = saved_steps(&store, &finals).await?;
        judge_saved_steps(&mut verdict, &steps, &saved);
    }
    if store.supports(durq::Capability::Events) {
        let stream = read_stream(&store).await?;
        judge_stream(&mut verdict, &stream, &jobs, &finals);
    }
    throughput(
        &mut verdict,
        &acked,
        &jobs,
        args.fault_start_us,
        args.fault_end_us,
    );
    verdict.cut_lines = histories.iter().map(|h| h.bad_lines).sum();
    verdict.passed = verdict.passed();
    let line = serde_json::to_string(&verdict).map_err(|err| format!("encode verdict: {err}"))?;
    println!("{line}");
    Ok(())
}

fn read_faults(path: &std::path::Path) -> Result<Vec<Fault>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).map_err(|err| format!("bad fault line {line:?}: {err}"))
        })
        .collect()
}

/// Acknowledged jobs (id → first acknowledgement) and every worker-side record per job.
fn collect(histories: &[ProcessHistory]) -> (HashMap<JobId, u64>, HashMap<JobId, JobHistory>) {
    let mut acked: HashMap<JobId, u64> = HashMap::new();
    let mut jobs: HashMap<JobId, JobHistory> = HashMap::new();
    for history in histories {
        let pid = history.pid;
        for event in &history.events {
            match event {
                Event::Enqueued { t, id, .. } => {
                    let first = acked.entry(*id).or_insert(*t);
                    *first = (*first).min(*t);
                }
                Event::Claim { t, id, token } => jobs.entry(*id).or_default().claims.push(Claim {
                    token: *token,
                    pid,
                    t: *t,
                }),
                Event::RunStart { t, id, token, .. } => {
                    jobs.entry(*id).or_default().runs.push(Claim {
                        token: *token,
                        pid,
                        t: *t,
                    })
                }
                Event::Outcome {
                    t0,
                    t,
                    op,
                    id,
                    token,
                    ok,
                    ..
                } => jobs.entry(*id).or_default().outcomes.push(Outcome {
                    op: *op,
                    token: *token,
                    pid,
                    t0: *t0,
                    t: *t,
                    ok: *ok,
                }),
                Event::HeartbeatRefused { id: Some(id), .. } => {
                    jobs.entry(*id).or_default().heartbeats_refused += 1;
                }
                _ => {}
            }
        }
    }
    (acked, jobs)
}

/// Every check that needs only the histories and the fault log.
fn judge_history(backend: &str, histories: &[ProcessHistory], faults: &[Fault]) -> Verdict {
    let mut verdict = Verdict {
        backend: backend.to_owned(),
        ..Verdict::default()
    };
    for fault in faults {
        *verdict.faults.entry(fault.kind.clone()).or_default() += 1;
        verdict.connections_killed += fault.hits.unwrap_or(0);
    }
    for history in histories {
        verdict.store_errors_seen += history
            .events
            .iter()
            .filter(|event| match event {
                Event::CallFailed { .. } => true,
                Event::HeartbeatRefused { err, .. } => !err.contains("lease lost"),
                Event::Outcome {
                    ok: false,
                    lease_lost,
                    ..
                } => !lease_lost,
                _ => false,
            })
            .count();
        if history.bad_inner_line {
            verdict.other_violations += 1;
            example(
                &mut verdict,
                format!("corrupt history line in {}-{}", history.role, history.pid),
            );
        }
    }
    let kills: HashMap<u32, u64> = faults
        .iter()
        .filter(|f| f.kind == "kill_worker")
        .filter_map(|f| f.pid.map(|pid| (pid, f.t)))
        .collect();
    verdict.worker_kills = kills.len();
    let store_faults: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.is_store_fault())
        .map(|f| (f.t, f.end.unwrap_or(f.t).max(f.t)))
        .collect();
    let (_, jobs) = collect(histories);

    // Kills × jobs in flight: what each killed process held without an accepted outcome.
    for history in histories.iter().filter(|h| kills.contains_key(&h.pid)) {
        let mut accepted: HashSet<(JobId, u64)> = HashSet::new();
        for event in &history.events {
            if let Event::Outcome {
                id,
                token,
                ok: true,
                ..
            } = event
            {
                accepted.insert((*id, *token));
            }
        }
        for event in &history.events {
            match event {
                Event::Claim { id, token, .. } if !accepted.contains(&(*id, *token)) => {
                    verdict.claims_in_flight_at_kills += 1;
                }
                Event::RunStart { id, token, .. } if !accepted.contains(&(*id, *token)) => {
                    verdict.runs_in_flight_at_kills += 1;
                }
                _ => {}
            }
        }
    }

    let mut ids: Vec<&JobId> = jobs.keys().collect();
    ids.sort();
    for id in ids {
        let Some(job) = jobs.get(id) else { continue };
        judge_job(&mut verdict, *id, job, &kills, &store_faults);
    }
    judge_steps(
        &mut verdict,
        &collect_steps(histories),
        &kills,
        &store_faults,
    );
    verdict
}

fn judge_job(
    verdict: &mut Verdict,
    id: JobId,
    job: &JobHistory,
    kills: &HashMap<u32, u64>,
    store_faults: &[(u64, u64)],
) {
    // C6: every claim of a job has a token of its own.
    let mut claims: BTreeMap<u64, Claim> = BTreeMap::new();
    for claim in &job.claims {
        if claims.insert(claim.token, *claim).is_some() {
            verdict.other_violations += 1;
            example(
                verdict,
                format!("{id}: token {} handed out twice", claim.token),
            );
        }
    }
    // One claim, one run.
    let mut runs: BTreeMap<u64, Claim> = BTreeMap::new();
    for run in &job.runs {
        if runs.insert(run.token, *run).is_some() {
            verdict.other_violations += 1;
            example(
                verdict,
                format!("{id}: the claim with token {} ran twice", run.token),
            );
        }
    }
    verdict.runs += runs.len();

    let completions: Vec<&Outcome> = job
        .outcomes
        .iter()
        .filter(|o| o.ok && o.op == Op::Complete)
        .collect();
    if completions.len() > 1 {
        verdict.double_completions += 1;
        example(
            verdict,
            format!(
                "{id}: {} completions accepted (tokens {:?})",
                completions.len(),
                completions.iter().map(|o| o.token).collect::<Vec<_>>()
            ),
        );
    }
    for outcome in job.outcomes.iter().filter(|o| o.ok) {
        let newer_before = job
            .claims
            .iter()
            .find(|c| c.token > outcome.token && c.t < outcome.t0);
        let newer_after_success = (outcome.op == Op::Complete)
            .then(|| job.claims.iter().find(|c| c.token > outcome.token))
            .flatten();
        if let Some(claim) = newer_before.or(newer_after_success) {
            verdict.stale_accepted += 1;
            example(
                verdict,
                format!(
                    "{id}: {:?} accepted under token {} (pid {}, call {}..{} µs) while token {} was claimed by pid {} at {} µs",
                    outcome.op, outcome.token, outcome.pid, outcome.t0, outcome.t, claim.token, claim.pid, claim.t
                ),
            );
        }
    }

    // Extra runs, in token order.
    let tokens: Vec<(u64, Claim)> = runs.iter().map(|(t, r)| (*t, *r)).collect();
    for pair in tokens.windows(2) {
        let (earlier, later) = (pair[0], pair[1]);
        let earlier_outcome = job.accepted(earlier.0);
        match earlier_outcome {
            Some(o) if matches!(o.op, Op::Fail | Op::Release) => {
                verdict.planned_reruns += 1;
                continue;
            }
            _ => {}
        }
        let killed = kills
            .get(&earlier.1.pid)
            .is_some_and(|kill| *kill >= earlier.1.t && earlier_outcome.is_none());
        let from = claims
            .get(&earlier.0)
            .map_or(earlier.1.t, |c| c.t)
            .saturating_sub(1_000_000);
        let to = claims.get(&later.0).map_or(later.1.t, |c| c.t);
        let store_fault = store_faults.iter().any(|(s, e)| *s <= to && *e >= from);
        if killed {
            verdict.extra_runs_worker_kill += 1;
        } else if store_fault {
            verdict.extra_runs_store_fault += 1;
        } else {
            verdict.extra_runs_unexplained += 1;
            let answers: Vec<String> = job
                .outcomes
                .iter()
                .filter(|o| o.token == earlier.0)
                .map(|o| {
                    format!(
                        "{:?} ok={} after {} µs",
                        o.op,
                        o.ok,
                        o.t.saturating_sub(o.t0)
                    )
                })
                .collect();
            example(
                verdict,
                format!(
                    "{id}: unexplained rerun: token {} (pid {}, run at {} µs, answers {answers:?}, {} heartbeats refused) then token {} (pid {}, run at {} µs)",
                    earlier.0, earlier.1.pid, earlier.1.t, job.heartbeats_refused, later.0, later.1.pid, later.1.t
                ),
            );
        }
    }
}

/// The store's state of every job, read with `get` (retrying what a restarted server
/// may still refuse).
/// CONTRACT K1 on the run's history: per concurrency key, no two leases known to hold
/// at once (each key is limited to one running job; see the module docs).
fn judge_limits(
    verdict: &mut Verdict,
    jobs: &HashMap<JobId, JobHistory>,
    keys: &HashMap<JobId, &str>,
) {
    let mut by_key: HashMap<&str, Vec<(u64, u64, JobId)>> = HashMap::new();
    for (id, history) in jobs {
        let Some(&key) = keys.get(id) else {
            continue;
        };
        for claim in &history.claims {
            let held_until = history
                .accepted(claim.token)
                .map_or(claim.t, |outcome| outcome.t0.max(claim.t));
            by_key
                .entry(key)
                .or_default()
                .push((claim.t, held_until, *id));
        }
    }
    for (key, mut leases) in by_key {
        verdict.keyed_leases += leases.len();
        leases.sort_unstable();
        let mut latest: Option<(u64, JobId)> = None;
        for (from, until, id) in leases {
            if let Some((end, other)) = latest {
                if from < end {
                    verdict.limit_violations += 1;
                    example(
                        verdict,
                        format!("key {key}: job {id} leased at {from} while job {other} held until {end}"),
                    );
                }
            }
            if latest.is_none_or(|(end, _)| until > end) {
                latest = Some((until, id));
            }
        }
    }
}

/// CONTRACT G1 on the run's history: no job was claimed before every job it waits for
/// had succeeded, and none is left waiting (see the module docs). What a job waits
/// for is read from its final state.
fn judge_dependencies(
    verdict: &mut Verdict,
    jobs: &HashMap<JobId, JobHistory>,
    finals: &HashMap<JobId, Option<Job>>,
) {
    // The earliest instant each job's success can have been stored at: the start of
    // the completion call whose answer came back, else the start of its last run.
    let succeeded_after = |id: &JobId| -> Option<u64> {
        let history = jobs.get(id)?;
        let accepted = history
            .outcomes
            .iter()
            .filter(|o| o.ok && o.op == Op::Complete)
            .map(|o| o.t0)
            .min();
        accepted.or_else(|| history.runs.iter().map(|run| run.t).max())
    };
    let mut ids: Vec<&JobId> = finals.keys().collect();
    ids.sort();
    for id in ids {
        let Some(job) = finals.get(id).and_then(Option::as_ref) else {
            continue;
        };
        if job.depends_on.is_empty() {
            continue;
        }
        verdict.dependent_jobs += 1;
        if job.state == JobState::Waiting {
            verdict.dependency_violations += 1;
            example(
                verdict,
                format!(
                    "{id}: still waiting for {:?} after the drain",
                    job.depends_on
                ),
            );
            continue;
        }
        let Some(first_claim) = jobs
            .get(id)
            .and_then(|h| h.claims.iter().map(|c| c.t).min())
        else {
            continue;
        };
        for dependency in &job.depends_on {
            if let Some(done) = succeeded_after(dependency) {
                if first_claim < done {
                    verdict.dependency_violations += 1;
                    example(
                        verdict,
                        format!(
                            "{id}: claimed at {first_claim} µs, before its dependency {dependency} succeeded (not before {done} µs)"
                        ),
                    );
                }
            }
        }
    }
}

/// The final state of every job of `ids`: `None` for a job the store does not hold.
async fn final_states(
    store: &Store,
    ids: Vec<JobId>,
) -> Result<HashMap<JobId, Option<Job>>, String> {
    read_each(ids, "record", |id| store.get(id)).await
}

/// How often the checker reads again what a store refused, and its deliberate
/// back-off between two tries: it runs right after the fault window, and a server a
/// fault restarted may still refuse for a moment.
const READ_TRIES: u32 = 20;
const READ_BACK_OFF: Duration = Duration::from_millis(100);

/// `read(id)` for every id of `ids`, 32 at a time: `None` where the store answers
/// `NotFound`. A read the store refuses otherwise is tried again after a deliberate
/// back-off ([`READ_BACK_OFF`], at most [`READ_TRIES`] times), since the checker runs right after the fault
/// window and a server a fault restarted may still refuse for a moment.
async fn read_each<T, F, Fut>(
    ids: Vec<JobId>,
    what: &str,
    read: F,
) -> Result<HashMap<JobId, Option<T>>, String>
where
    F: Fn(JobId) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let read = &read;
    let answers: Vec<(JobId, Result<Option<T>, Error>)> = futures::stream::iter(ids)
        .map(|id| async move {
            let mut tries = 0;
            loop {
                match read(id).await {
                    Ok(value) => return (id, Ok(Some(value))),
                    Err(err) if err.is_not_found() => return (id, Ok(None)),
                    Err(_) if tries < READ_TRIES => {
                        tries += 1;
                        tokio::time::sleep(READ_BACK_OFF).await;
                    }
                    Err(err) => return (id, Err(err)),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut out = HashMap::with_capacity(answers.len());
    for (id, answer) in answers {
        let value = answer.map_err(|err| format!("cannot read the {what} of job {id}: {err}"))?;
        out.insert(id, value);
    }
    Ok(out)
}

/// The checks on the final state: lost, stuck, and what the history cannot tell.
fn judge_final(
    verdict: &mut Verdict,
    acked: &HashMap<JobId, u64>,
    jobs: &HashMap<JobId, JobHistory>,
    finals: &HashMap<JobId, Option<Job>>,
) {
    verdict.jobs = acked.len();
    verdict.unacknowledged_jobs_run = jobs.keys().filter(|id| !acked.contains_key(id)).count();
    let now_ms = i64::try_from(now_us() / 1_000).unwrap_or(i64::MAX);
    let mut ids: Vec<&JobId> = finals.keys().collect();
    ids.sort();
    for id in ids {
        let state = finals.get(id).and_then(Option::as_ref);
        if acked.contains_key(id) && state.is_none_or(|job| job.state != JobState::Succeeded) {
            verdict.lost += 1;
            let shown = state.map_or("missing".to_owned(), |job| {
                format!(
                    "{} (attempts {}, last_error {:?})",
                    job.state, job.attempts, job.last_error
                )
            });
            example(verdict, format!("{id}: lost: {shown}"));
        }
        if let Some(job) = state {
            if job.state == JobState::Running
                && job
                    .lease
                    .as_ref()
                    .is_none_or(|lease| lease.expires_at.as_millis() < now_ms)
            {
                verdict.stuck += 1;
                example(
                    verdict,
                    format!("{id}: running after its lease passed: {:?}", job.lease),
                );
            }
            if job.state == JobState::Succeeded
                && jobs
                    .get(id)
                    .is_some_and(|h| !h.outcomes.iter().any(|o| o.ok && o.op == Op::Complete))
            {
                verdict.succeeded_without_acknowledged_completion += 1;
            }
        }
    }
}

fn throughput(
    verdict: &mut Verdict,
    acked: &HashMap<JobId, u64>,
    jobs: &HashMap<JobId, JobHistory>,
    start_us: u64,
    end_us: u64,
) {
    let firsts: Vec<u64> = jobs
        .values()
        .filter_map(|h| {
            h.outcomes
                .iter()
                .filter(|o| o.ok && o.op == Op::Complete)
                .map(|o| o.t)
                .min()
        })
        .collect();
    // The window ends with the faults, or with the last completion if the workers
    // were done before the faults were: an idle tail says nothing about throughput.
    let last = firsts.iter().max().copied().unwrap_or(end_us).min(end_us);
    let window = last.saturating_sub(start_us).max(1) as f64 / 1e6;
    let in_window = firsts
        .iter()
        .filter(|t| **t >= start_us && **t <= last)
        .count();
    verdict.throughput_under_faults = (in_window as f64 / window * 10.0).round() / 10.0;
    let first_ack = acked.values().min().copied().unwrap_or(0);
    let last_done = firsts.iter().max().copied().unwrap_or(first_ack);
    let span = last_done.saturating_sub(first_ack).max(1) as f64 / 1e6;
    verdict.throughput_overall = (acked.len() as f64 / span * 10.0).round() / 10.0;
}

/// What the history tells of one step of one job.
#[derive(Debug, Default)]
struct StepHistory {
    /// Its works begun (`step_run`): token, pid, time.
    runs: Vec<Claim>,
    /// Its saves by the run that ran it (`step_saved`).
    saved: Vec<Claim>,
    /// The tokens whose `ctx.step` of it answered `Err` (`step_failed`).
    failed: HashSet<u64>,
    /// Its replays (`step_replayed`), each with the token its saved output names.
    replays: Vec<(Claim, u64)>,
}

impl StepHistory {
    /// The lowest token whose save of the step the history proves stored: one that
    /// logged `step_saved`, or an earlier run a replay read the output of.
    fn known_save(&self) -> Option<u64> {
        let replayed = self
            .replays
            .iter()
            .filter(|(replay, saved_by)| {
                *saved_by < replay.token && self.runs.iter().any(|run| run.token == *saved_by)
            })
            .map(|(_, saved_by)| *saved_by);
        self.saved
            .iter()
            .map(|saved| saved.token)
            .chain(replayed)
            .min()
    }
}

/// Every step line of the run, per job and step name.
fn collect_steps(histories: &[ProcessHistory]) -> BTreeMap<(JobId, String), StepHistory> {
    let mut steps: BTreeMap<(JobId, String), StepHistory> = BTreeMap::new();
    for history in histories {
        let pid = history.pid;
        for event in &history.events {
            let (id, step) = match event {
                Event::StepRun { id, step, .. }
                | Event::StepSaved { id, step, .. }
                | Event::StepReplayed { id, step, .. }
                | Event::StepFailed { id, step, .. } => (*id, step.clone()),
                _ => continue,
            };
            let entry = steps.entry((id, step)).or_default();
            match event {
                Event::StepRun { t, token, .. } => entry.runs.push(Claim {
                    token: *token,
                    pid,
                    t: *t,
                }),
                Event::StepSaved { t, token, .. } => entry.saved.push(Claim {
                    token: *token,
                    pid,
                    t: *t,
                }),
                Event::StepReplayed {
                    t, token, saved_by, ..
                } => entry.replays.push((
                    Claim {
                        token: *token,
                        pid,
                        t: *t,
                    },
                    *saved_by,
                )),
                Event::StepFailed { token, .. } => {
                    entry.failed.insert(*token);
                }
                _ => {}
            }
        }
    }
    steps
}

/// CONTRACT D1 and D2 on the run's history: a finished step never runs again, and
/// every extra run of a step is explained (see the module docs).
///
/// Why a save by a lower token forbids any run under a higher one: a save is fenced
/// by its run's token, so it was stored while that run held the lease, before the
/// next claim minted a higher token (C6); the higher run read the job's steps after
/// its claim, so it saw the save and was answered from it. A run under a lower token
/// than the save's can still run the step (a run whose lease was taken back goes on
/// until it learns so), but the fence refuses its save; that is a rerun like any
/// other, to be explained.
fn judge_steps(
    verdict: &mut Verdict,
    steps: &BTreeMap<(JobId, String), StepHistory>,
    kills: &HashMap<u32, u64>,
    store_faults: &[(u64, u64)],
) {
    let mut jobs: HashSet<JobId> = HashSet::new();
    for ((id, name), step) in steps {
        jobs.insert(*id);
        verdict.step_runs += step.runs.len();
        verdict.steps_saved += step.saved.len();
        verdict.steps_replayed += step.replays.len();
        verdict.step_save_failures += step.failed.len();

        let ran = |token: u64| step.runs.iter().any(|run| run.token == token);
        for (replay, saved_by) in &step.replays {
            if !ran(*saved_by) || *saved_by >= replay.token {
                verdict.step_violations += 1;
                example(
                    verdict,
                    format!(
                        "{id}: step {name:?} replayed under token {} (pid {}) from a save by token {saved_by}, which {}",
                        replay.token,
                        replay.pid,
                        if ran(*saved_by) { "is not an earlier run" } else { "never ran the step" }
                    ),
                );
            }
        }
        let stored = step.known_save();

        let mut runs: BTreeMap<u64, Claim> = BTreeMap::new();
        for run in &step.runs {
            if runs.insert(run.token, *run).is_some() {
                verdict.step_violations += 1;
                example(
                    verdict,
                    format!("{id}: step {name:?} ran twice under token {}", run.token),
                );
            }
        }
        let runs: Vec<Claim> = runs.into_values().collect();
        for (i, run) in runs.iter().enumerate() {
            if let Some(saved_by) = stored.filter(|s| *s < run.token) {
                verdict.step_violations += 1;
                example(
                    verdict,
                    format!(
                        "{id}: step {name:?} ran again under token {} (pid {}, at {} µs) although token {saved_by} had saved it",
                        run.token, run.pid, run.t
                    ),
                );
                continue;
            }
            let Some(earlier) = i.checked_sub(1).and_then(|j| runs.get(j)) else {
                continue;
            };
            let killed = kills
                .get(&earlier.pid)
                .is_some_and(|kill| *kill >= earlier.t);
            let from = earlier.t.saturating_sub(1_000_000);
            let store_fault = store_faults.iter().any(|(s, e)| *s <= run.t && *e >= from);
            if killed {
                verdict.step_reruns_after_kill += 1;
            } else if store_fault {
                verdict.step_reruns_after_store_fault += 1;
            } else if step.failed.contains(&earlier.token) {
                verdict.step_reruns_after_failed_save += 1;
            } else {
                verdict.step_violations += 1;
                example(
                    verdict,
                    format!(
                        "{id}: unexplained rerun of step {name:?}: token {} (pid {}, at {} µs) then token {} (pid {}, at {} µs), with no kill, store fault or failed save between",
                        earlier.token, earlier.pid, earlier.t, run.token, run.pid, run.t
                    ),
                );
            }
        }
    }
    verdict.step_jobs = jobs.len();
}

/// The steps the store holds at the end for every succeeded job that ran steps
/// (chosen by [`crate::worker::runs_steps`], as the workers chose them).
async fn saved_steps(
    store: &Store,
    finals: &HashMap<JobId, Option<Job>>,
) -> Result<HashMap<JobId, durq::StepLog>, String> {
    let ids: Vec<JobId> = finals
        .iter()
        .filter(|(id, job)| {
            crate::worker::runs_steps(**id)
                && job
                    .as_ref()
                    .is_some_and(|job| job.state == JobState::Succeeded)
        })
        .map(|(id, _)| *id)
        .collect();
    read_each(ids, "steps", |id| store.steps(id))
        .await?
        .into_iter()
        .map(|(id, log)| {
            // It succeeded in the final state read just before: gone now, it was lost.
            log.map(|log| (id, log))
                .ok_or_else(|| format!("job {id} succeeded, then its steps were not found"))
        })
        .collect()
}

/// CONTRACT D1 and D2 on the store's final state: a succeeded step job holds every
/// step of [`crate::worker::STEPS`], in order, in generation 0 (nothing reopens it);
/// each saved output names a run that ran the step, the run that logged `step_saved`
/// if one did (the first save stands and no other can be stored), and the run every
/// replay read.
fn judge_saved_steps(
    verdict: &mut Verdict,
    steps: &BTreeMap<(JobId, String), StepHistory>,
    saved: &HashMap<JobId, durq::StepLog>,
) {
    let mut ids: Vec<&JobId> = saved.keys().collect();
    ids.sort();
    for id in ids {
        let Some(log) = saved.get(id) else { continue };
        let names: Vec<&str> = log.steps.iter().map(|step| step.name.as_str()).collect();
        if names != crate::worker::STEPS || log.generation != 0 {
            verdict.step_violations += 1;
            example(
                verdict,
                format!(
                    "{id}: succeeded with steps {names:?} in generation {}, not {:?} in generation 0",
                    log.generation,
                    crate::worker::STEPS
                ),
            );
            continue;
        }
        for saved_step in &log.steps {
            verdict.steps_checked_in_store += 1;
            let name = &saved_step.name;
            let by = match serde_json::from_slice::<crate::worker::StepOutput>(&saved_step.output) {
                Ok(output) => output.token,
                Err(err) => {
                    verdict.step_violations += 1;
                    example(
                        verdict,
                        format!("{id}: step {name:?} saved an output that does not read: {err}"),
                    );
                    continue;
                }
            };
            let history = steps.get(&(*id, name.clone()));
            let ran = history.is_some_and(|h| h.runs.iter().any(|run| run.token == by));
            let logged_saves: Vec<u64> = history
                .map(|h| h.saved.iter().map(|saved| saved.token).collect())
                .unwrap_or_default();
            let replayed_other = history.and_then(|h| {
                h.replays
                    .iter()
                    .map(|(_, saved_by)| *saved_by)
                    .find(|saved_by| *saved_by != by)
            });
            // The save stood from before any higher token's claim (see judge_steps),
            // even when the run that made it was killed before logging it. A rerun
            // the history alone convicts is counted there, not again here.
            let ran_after = history.and_then(|h| {
                let convicted = h.known_save().is_some_and(|known| known <= by);
                h.runs
                    .iter()
                    .map(|run| run.token)
                    .filter(|token| *token > by && !convicted)
                    .min()
            });
            let problem = if !ran {
                Some(format!("names token {by}, which never ran it"))
            } else if let Some(later) = ran_after {
                Some(format!(
                    "names token {by}, yet token {later} ran it again after that save"
                ))
            } else if !logged_saves.is_empty() && !logged_saves.contains(&by) {
                Some(format!(
                    "names token {by}, but tokens {logged_saves:?} logged saving it"
                ))
            } else {
                replayed_other.map(|other| {
                    format!("names token {by}, but a replay read token {other}'s output")
                })
            };
            if let Some(problem) = problem {
                verdict.step_violations += 1;
                example(verdict, format!("{id}: saved step {name:?} {problem}"));
            }
        }
    }
}

/// The whole event stream, page by page, each page read again after a deliberate
/// back-off ([`READ_BACK_OFF`], at most [`READ_TRIES`] times) while the store refuses, as `read_each` does.
async fn read_stream(store: &Store) -> Result<Vec<durq::stream::Event>, String> {
    let mut events = Vec::new();
    let mut after = durq::stream::EventCursor::START;
    let mut tries = 0;
    loop {
        match store.events(after, 1_000).await {
            Ok(page) if page.events.is_empty() => return Ok(events),
            Ok(page) => {
                after = page.next;
                events.extend(page.events);
            }
            Err(_) if tries < READ_TRIES => {
                tries += 1;
                tokio::time::sleep(READ_BACK_OFF).await;
            }
            Err(err) => return Err(format!("cannot read the event stream: {err}")),
        }
    }
}

/// Where a job's replayed events leave it: CONTRACT §2's states, with `Fresh` for a
/// job just enqueued (queued, or waiting for other jobs: `enqueued` does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replayed {
    Fresh,
    Is(JobState),
}

/// The state `kind` moves a job in `was` to, or `None` when no change of CONTRACT §2
/// goes from `was` by it.
fn replay(was: Replayed, kind: durq::stream::EventKind) -> Option<Replayed> {
    use durq::stream::EventKind as K;
    use JobState as S;
    use Replayed::{Fresh, Is};
    let queued = matches!(was, Fresh | Is(S::Queued));
    let next = match (kind, was) {
        (K::Started, _) if queued => S::Running,
        (K::Succeeded, Is(S::Running)) => S::Succeeded,
        (K::Failed | K::Released, Is(S::Running)) => S::Queued,
        (K::Ready, Fresh) => S::Queued,
        // A claim buries a record it cannot read without starting it.
        (K::Dead, Is(S::Running)) => S::Dead,
        (K::Dead, _) if queued => S::Dead,
        (K::Cancelled, Fresh | Is(S::Queued | S::Running | S::Waiting)) => S::Cancelled,
        (K::Retried, Is(S::Succeeded | S::Dead | S::Cancelled)) => S::Queued,
        (K::Emitted, Is(S::Running)) => return Some(was),
        _ => return None,
    };
    Some(Is(next))
}

/// CONTRACT V1, V2 under faults: every job's events, read back whole, replay into the
/// state its record ends in, from one `enqueued`, by changes the state machine allows,
/// in cursor order; and the store started each job at least as often as the history
/// saw it claimed.
fn judge_stream(
    verdict: &mut Verdict,
    stream: &[durq::stream::Event],
    jobs: &HashMap<JobId, JobHistory>,
    finals: &HashMap<JobId, Option<Job>>,
) {
    verdict.stream_events = stream.len();
    for pair in stream.windows(2) {
        if pair[0].cursor >= pair[1].cursor {
            verdict.stream_violations += 1;
            example(
                verdict,
                format!("stream: {} came before {}", pair[0].cursor, pair[1].cursor),
            );
        }
    }
    let mut per_job: HashMap<JobId, Vec<&durq::stream::Event>> = HashMap::new();
    for event in stream {
        per_job.entry(event.job).or_default().push(event);
    }
    let mut ids: Vec<&JobId> = finals.keys().collect();
    ids.sort();
    for id in ids {
        let Some(Some(job)) = finals.get(id) else {
            continue;
        };
        let events = per_job.get(id).map(Vec::as_slice).unwrap_or_default();
        let problem = replay_job(events, job.state).or_else(|| {
            let claims: HashSet<u64> = jobs
                .get(id)
                .map(|h| h.claims.iter().map(|claim| claim.token).collect())
                .unwrap_or_default();
            let started = events
                .iter()
                .filter(|e| e.kind == durq::stream::EventKind::Started)
                .count();
            (started < claims.len()).then(|| {
                format!(
                    "{started} started events, but the history saw {} claims",
                    claims.len()
                )
            })
        });
        if let Some(problem) = problem {
            verdict.stream_violations += 1;
            example(verdict, format!("{id}: stream: {problem}"));
        }
    }
}

/// What is wrong with one job's events, replayed, against the state it ends in.
fn replay_job(events: &[&durq::stream::Event], ends: JobState) -> Option<String> {
    use durq::stream::EventKind;
    let Some((first, rest)) = events.split_first() else {
        return Some("the job has a record and no events".to_owned());
    };
    if first.kind != EventKind::Enqueued {
        return Some(format!("its first event is {}, not enqueued", first.kind));
    }
    let mut state = Replayed::Fresh;
    for event in rest {
        match replay(state, event.kind) {
            Some(next) => state = next,
            None => {
                return Some(format!(
                    "{} at {} from {state:?}, which no change allows",
                    event.kind, event.cursor
                ))
            }
        }
    }
    let ended_as = match state {
        Replayed::Is(state) => state == ends,
        Replayed::Fresh => matches!(ends, JobState::Queued | JobState::Waiting),
    };
    (!ended_as).then(|| format!("its events leave it {state:?}, its record is {ends}"))
}

/// Keeps up to 20 examples, enough to start an investigation.
fn example(verdict: &mut Verdict, text: String) {
    if verdict.examples.len() < 20 {
        verdict.examples.push(text);
    }
}

#[cfg(test)]
mod tests;
