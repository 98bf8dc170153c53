//! Rule M1: random operation sequences checked against a reference model.
//!
//! Each case draws a sequence of operations (enqueue alone and in batches, with and
//! without idempotency keys and parents, claims by three workers over two queues,
//! heartbeat, complete, fail, release, reclaim, cancel, retry, purge, get, children,
//! stats, list, and clock jumps, some landing exactly on a lease expiry, a `run_at`,
//! the end of a dedup window or of a retention), runs it on a fresh store, and runs it
//! on the reference model in `model`, written from the [contract](durq_core::contract)
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
//! The code: this file runs the cases (the seed, the proptest runner, shrinking, the
//! failure report); `ops` draws the operations; `case` holds a case in progress and
//! maps store ids to model ids; `step` runs one operation on the store and on the
//! model and compares their answers, one function per operation; `invariants` checks
//! the whole store after every step; `model` is the reference model.
//!
//! Knobs (environment variables): `JOBS_M1_CASES` (default 64), `JOBS_M1_OPS` (the
//! longest sequence, default 40), `JOBS_M1_SEED` (replays a run; a failure prints its
//! seed), `JOBS_M1_SHRINK` (how many runs to spend shrinking a failure, default 256)
//! and `JOBS_M1_TRACE=1` (prints every step of every case).

mod case;
mod invariants;
mod model;
mod ops;
mod step;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use durq_core::Clock;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::{Harness, TestEnv};
use case::Run;
use ops::Op;

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

    let mut runner = seeded_runner(seed, cases);
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
        let replay = format!("JOBS_M1_SEED={seed}, case {case} of {cases}");
        panic!("{}", failure.report(&replay, runs, &shrunk, &original));
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

/// A proptest runner drawing from `seed` alone, so a seed replays its cases exactly;
/// failures are not persisted to files, the seed in the report is the replay.
fn seeded_runner(seed: u64, cases: u64) -> TestRunner {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: cases as u32,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    )
}

/// The value of environment variable `name`, or `default` when unset or not a number.
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
    /// The index of the failing step.
    step: usize,
    /// What the store did that the model does not allow.
    message: String,
    /// Every step up to the failing one, with what each returned.
    trace: Vec<String>,
}

impl Failure {
    /// The panic message of a failed run: how to replay it (`replay`), where and why
    /// the shrunk sequence fails, its steps with what each returned, then the shrunk
    /// and the original sequence as data.
    fn report(&self, replay: &str, runs: u64, shrunk: &[Op], original: &[Op]) -> String {
        let mut report = String::new();
        let _ = writeln!(
            report,
            "M1 model check failed ({replay}, shrunk in {runs} runs)"
        );
        let _ = writeln!(report, "\nat step {}: {}", self.step, self.message);
        let _ = writeln!(report, "\nshrunk sequence, with what each step returned:");
        for line in &self.trace {
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
        report
    }
}

/// Runs `ops` on a fresh store and on the model, step by step, checking each answer
/// and then the invariants; counts each step's outcome in `coverage`.
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
