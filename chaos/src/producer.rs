//! The producer process: enqueues a fixed plan of batches, paced over the fault
//! window, and logs each acknowledged job only after the store answered `Ok`.
//!
//! The plan is a pure function of `--jobs` and the namespace, so a producer started
//! after a SIGKILL reads which batches its predecessors finished (`batch_done` lines)
//! and goes on with the first unfinished one. Half of the batches carry idempotency
//! keys: re-sending such a batch after a kill answers with the jobs the killed
//! producer may already have created. The other half do not, so a batch cut by a kill
//! and sent again may leave unacknowledged duplicates, which the checker ignores (only
//! acknowledged jobs are promised).

use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use durq::{NewJob, Store};

use crate::history::{now_us, Event, Log};
use crate::worker::FAIL_ONCE;
use crate::StoreArgs;

/// Arguments of `durq-chaos producer`.
#[derive(Debug, Args)]
pub struct ProducerArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Jobs in the plan.
    #[arg(long)]
    jobs: u64,
    /// The run's start (µs since the epoch), shared by every producer of the run so a
    /// restarted one keeps the pace.
    #[arg(long)]
    start_us: u64,
    /// Over how many milliseconds from the start the plan is spread.
    #[arg(long)]
    spread_ms: u64,
}

/// The concurrency keys of a run on a backend with flow control, each limited to one
/// running job.
pub const CHAOS_KEYS: u64 = 32;

/// One batch of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Its number.
    pub number: u64,
    /// Jobs in it.
    pub size: u64,
    /// Whether its jobs carry idempotency keys.
    pub keyed: bool,
    /// Whether its jobs go one `enqueue` each instead of one `enqueue_batch`.
    pub singles: bool,
    /// Jobs of the plan before it.
    pub before: u64,
    /// Whether its jobs are graphs (on a store that keeps dependencies; see
    /// [`graph_dependencies`]).
    pub graphs: bool,
}

/// Jobs of one graph of a graph batch: a root, ten jobs after it, one after those
/// (issue #29: fan-out to 10, fan-in to 1).
pub const GRAPH_JOBS: u64 = 12;

/// What job `i` of a graph batch of `size` jobs waits for, as indexes in the batch:
/// the batch is cut into graphs of [`GRAPH_JOBS`] (a root, ten after it, a fan-in
/// after those), and what is left over after the last whole graph waits for nothing.
pub fn graph_dependencies(i: u64, size: u64) -> Vec<u64> {
    let whole = size / GRAPH_JOBS * GRAPH_JOBS;
    if i >= whole {
        return Vec::new();
    }
    let root = i / GRAPH_JOBS * GRAPH_JOBS;
    match i - root {
        0 => Vec::new(),
        n if n < GRAPH_JOBS - 1 => vec![root],
        _ => (root + 1..root + GRAPH_JOBS - 1).collect(),
    }
}

/// SplitMix64: a fixed, well-mixed function of its input, so the plan is the same in
/// every producer of the run.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The plan for `jobs` jobs: batches of 50–500 through `enqueue_batch`, every sixth
/// batch 10–30 single `enqueue` calls, every other batch with idempotency keys, and
/// every third batch of `enqueue_batch` enqueued as graphs where the store keeps
/// dependencies (keyed or not: a graph sent again after a kill waits for the jobs its
/// keys answer with, or for its own copies).
pub fn plan(jobs: u64) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut before = 0;
    let mut number = 0;
    while before < jobs {
        let singles = number % 6 == 5;
        let size = if singles {
            10 + mix(number) % 21
        } else {
            50 + mix(number) % 451
        }
        .min(jobs - before);
        batches.push(Batch {
            number,
            size,
            keyed: number % 2 == 0,
            singles,
            before,
            graphs: !singles && number % 3 == 1,
        });
        before += size;
        number += 1;
    }
    batches
}

/// Runs the producer: until the plan is done or standard input closes.
pub async fn run(args: ProducerArgs) -> Result<(), String> {
    let done = finished_batches(&args)?;
    let log = Arc::new(
        Log::create(&args.store.run_dir, "producer")
            .map_err(|err| format!("cannot create the history file: {err}"))?,
    );
    let store = crate::patiently("opening the store", || crate::open_store(&args.store)).await;
    tokio::select! {
        result = produce(&args, store, &log, &done) => result,
        () = crate::stdin_closed() => Ok(()),
    }
}

/// The batches earlier producers of this run logged as done.
fn finished_batches(args: &ProducerArgs) -> Result<HashSet<u64>, String> {
    let histories = crate::history::read_dir(&args.store.run_dir, Some("producer"))
        .map_err(|err| format!("cannot read earlier producer histories: {err}"))?;
    Ok(histories
        .iter()
        .flat_map(|h| &h.events)
        .filter_map(|event| match event {
            Event::BatchDone { batch, .. } => Some(*batch),
            _ => None,
        })
        .collect())
}

async fn produce(
    args: &ProducerArgs,
    store: Store,
    log: &Log,
    done: &HashSet<u64>,
) -> Result<(), String> {
    let ns = &args.store.namespace;
    // On a backend with flow control the run's jobs carry concurrency keys under a
    // limit of one running job per key (CONTRACT K1), which the check verifies on the
    // history. Setting it again after a producer restart changes nothing.
    let keyed = store.supports(durq::Capability::FlowControl);
    // A partitioned store places a job by one key, not by two (CONTRACT P3): there the
    // jobs with an idempotency key carry no concurrency key.
    let one_key_each = store.capabilities().partitioning.is_some();
    let graphs = store.capabilities().dependencies;
    if keyed {
        until_ok("set_limits", || {
            store.set_limits(
                &args.store.queue,
                durq::QueueLimits::new().max_running_per_key(1),
            )
        })
        .await?;
    }
    for batch in plan(args.jobs) {
        if done.contains(&batch.number) {
            continue;
        }
        // Pace: batch k is due when its share of the spread has passed.
        let due_us = args.start_us + args.spread_ms * 1_000 * batch.before / args.jobs.max(1);
        let now = now_us();
        if due_us > now {
            tokio::time::sleep(Duration::from_micros(due_us - now)).await;
        }
        // Tell the orchestrator a batch is going out, so it can kill us mid-batch.
        println!("sending {}", batch.number);
        let _ = std::io::stdout().flush();
        let jobs: Vec<(NewJob, Option<String>)> = (0..batch.size)
            .map(|i| {
                let key = batch.keyed.then(|| format!("{ns}-{}-{i}", batch.number));
                let mut job = NewJob::new(args.store.queue.clone());
                if keyed && !(one_key_each && key.is_some()) {
                    job = job.concurrency_key(format!("k{}", (batch.before + i) % CHAOS_KEYS));
                }
                if mix(batch.number.wrapping_mul(1_000_003).wrapping_add(i)) % 50 == 0 {
                    job = job.payload(Bytes::from_static(FAIL_ONCE));
                }
                if let Some(key) = &key {
                    job = job.idempotency_key(key.clone());
                }
                if graphs && batch.graphs {
                    for earlier in graph_dependencies(i, batch.size) {
                        job = job.after(durq::Dependency::Earlier(earlier as usize));
                    }
                }
                (job, key)
            })
            .collect();
        if batch.singles {
            for (job, key) in jobs {
                let answer = until_ok("enqueue", || store.enqueue(job.clone())).await?;
                log.write(&Event::Enqueued {
                    t: now_us(),
                    id: answer.id,
                    created: answer.created,
                    key,
                    batch: batch.number,
                });
            }
        } else {
            let (new_jobs, keys): (Vec<NewJob>, Vec<Option<String>>) = jobs.into_iter().unzip();
            let answers =
                until_ok("enqueue_batch", || store.enqueue_batch(new_jobs.clone())).await?;
            if answers.len() != keys.len() {
                return Err(format!(
                    "enqueue_batch answered {} entries for {} jobs",
                    answers.len(),
                    keys.len()
                ));
            }
            let t = now_us();
            for (answer, key) in answers.into_iter().zip(keys) {
                log.write(&Event::Enqueued {
                    t,
                    id: answer.id,
                    created: answer.created,
                    key,
                    batch: batch.number,
                });
            }
        }
        log.write(&Event::BatchDone {
            t: now_us(),
            batch: batch.number,
        });
    }
    Ok(())
}

/// How long a store may keep failing before the producer gives up: far longer than
/// any fault the orchestrator injects.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// Calls `f` until it answers `Ok`: faults make calls fail, and the producer's job is
/// to get its plan acknowledged anyway, re-sending the same jobs (and keys).
async fn until_ok<T, F, Fut>(what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = durq::Result<T>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        match f().await {
            Ok(value) => return Ok(value),
            Err(err) if started.elapsed() < GIVE_UP_AFTER => {
                if !err.is_retryable() {
                    eprintln!("durq-chaos producer: {what} refused with a non-retryable error (retrying anyway): {err}");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Err(err) => return Err(format!("{what} kept failing for {GIVE_UP_AFTER:?}: {err}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_every_job_once_and_is_stable() {
        let a = plan(20_000);
        assert_eq!(a, plan(20_000));
        assert_eq!(a.iter().map(|b| b.size).sum::<u64>(), 20_000);
        let mut before = 0;
        for batch in &a {
            assert_eq!(batch.before, before);
            assert!(batch.size >= 1 && batch.size <= 500);
            before += batch.size;
        }
        assert!(a.iter().any(|b| b.singles) && a.iter().any(|b| b.keyed));
        assert!(a.iter().any(|b| b.graphs && b.keyed) && a.iter().any(|b| b.graphs && !b.keyed));
        assert!(a.iter().all(|b| !(b.graphs && b.singles)));
        assert_eq!(plan(0), Vec::new());
    }

    #[test]
    fn graphs_are_a_root_ten_after_it_and_a_fan_in() {
        let size = 2 * GRAPH_JOBS + 5;
        assert!(graph_dependencies(0, size).is_empty());
        for i in 1..=10 {
            assert_eq!(graph_dependencies(i, size), vec![0]);
        }
        assert_eq!(graph_dependencies(11, size), (1..=10).collect::<Vec<_>>());
        assert!(graph_dependencies(12, size).is_empty());
        assert_eq!(graph_dependencies(13, size), vec![12]);
        assert_eq!(graph_dependencies(23, size), (13..=22).collect::<Vec<_>>());
        for i in 2 * GRAPH_JOBS..size {
            assert!(graph_dependencies(i, size).is_empty(), "{i}: left over");
        }
        // Every reference is to an earlier job of the batch.
        for i in 0..size {
            assert!(graph_dependencies(i, size).iter().all(|d| *d < i));
        }
    }
}
