//! The workloads of `cargo xtask bench`, each measured on one fresh store.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durq_core::graph::Dependency;
use durq_core::{Budget, ClaimRequest, Completion, JobState, Needs, NewJob, QueueLimits, Store};
use tokio::task::JoinSet;

use crate::backends::Transactional;
use crate::drain::{self, DrainConfig, Driver};
use crate::housekeeping::Housekeeping;
use crate::probe::Probe;
use crate::progress::Progress;
use crate::report::{millis, quantile, rate, Line};

/// The queue every workload uses (the namespace isolates runs).
pub const QUEUE: &str = "bench";

/// Options shared by the workloads.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backend name, for the result lines.
    pub backend: String,
    /// Jobs per run.
    pub jobs: u64,
    /// Jobs run at once by the workers.
    pub concurrency: usize,
    /// Jobs per claim of the loop driver.
    pub claim_batch: usize,
    /// Concurrent claimers of the claim workloads.
    pub claimers: usize,
    /// Jobs per `enqueue_batch`.
    pub enqueue_batch: usize,
    /// Concurrent producers of the one-at-a-time enqueue workload.
    pub producers: usize,
    /// Jobs per second of the latency workloads' producer.
    pub rate: u64,
    /// The drain driver.
    pub driver: Driver,
    /// How long without a finished job before a run is declared stalled.
    pub stall: Duration,
    /// `e2e-backlog` stops after draining this long, and reports the rate so far.
    pub deadline: Option<Duration>,
    /// The drain fails each job's first attempt and completes its second.
    pub fail_first: bool,
}

impl Options {
    fn line(&self, workload: &str) -> Line {
        Line::new(workload, &self.backend).int("jobs", self.jobs)
    }

    fn drain_config(&self) -> DrainConfig {
        DrainConfig {
            queue: QUEUE.to_owned(),
            concurrency: self.concurrency,
            batch: self.claim_batch,
            lease: Duration::from_secs(60),
            fail_first: self.fail_first,
        }
    }
}

/// The payload of job `index`: its number in decimal, as a JSON number (what apalis
/// stores for a `u64` argument too).
pub fn payload(index: u64) -> NewJob {
    NewJob::new(QUEUE).payload(index.to_string().into_bytes())
}

/// Enqueues jobs `range` in batches of `batch`, as fast as the store takes them.
async fn fill(store: &Store, range: std::ops::Range<u64>, batch: usize) -> Result<(), String> {
    fill_by(store, range, batch as u64, |i, jobs| jobs.push(payload(i))).await
}

/// Enqueues the units of `range` (a job, a graph), `per_batch` of them to an
/// `enqueue_batch`, each unit's jobs made by `push`, as fast as the store takes them.
async fn fill_by(
    store: &Store,
    range: std::ops::Range<u64>,
    per_batch: u64,
    push: impl Fn(u64, &mut Vec<NewJob>),
) -> Result<(), String> {
    let mut next = range.start;
    while next < range.end {
        let end = (next + per_batch.max(1)).min(range.end);
        // Exact for one job a unit (what `enqueue-batch` times); a graph's grow.
        let mut jobs = Vec::with_capacity((end - next) as usize);
        for unit in next..end {
            push(unit, &mut jobs);
        }
        store
            .enqueue_batch(jobs)
            .await
            .map_err(|e| format!("enqueue_batch: {e}"))?;
        next = end;
    }
    Ok(())
}

/// `enqueue-one`: `producers` tasks each enqueue their share one job per call.
pub async fn enqueue_one(store: Store, opts: &Options) -> Result<(), String> {
    let per_producer = opts.jobs.div_ceil(opts.producers as u64);
    let probe = Probe::start(&opts.backend).await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for p in 0..opts.producers as u64 {
        let store = store.clone();
        let range = (p * per_producer)..((p + 1) * per_producer).min(opts.jobs);
        tasks.spawn(async move {
            for i in range {
                store
                    .enqueue(payload(i))
                    .await
                    .map_err(|e| format!("enqueue: {e}"))?;
            }
            Ok::<(), String>(())
        });
    }
    join_all(tasks).await?;
    let elapsed = started.elapsed();
    let probed = probe.finish(opts.jobs, Line::default()).await;
    opts.line("enqueue-one")
        .merge(probed)
        .int("producers", opts.producers as u64)
        .num("value", rate(opts.jobs, elapsed))
        .text("unit", "jobs/s")
        .num("seconds", elapsed.as_secs_f64())
        .emit();
    Ok(())
}

/// `enqueue-batch`: one producer enqueues `enqueue_batch` jobs per call.
pub async fn enqueue_batch(store: Store, opts: &Options) -> Result<(), String> {
    let probe = Probe::start(&opts.backend).await;
    let started = Instant::now();
    fill(&store, 0..opts.jobs, opts.enqueue_batch).await?;
    let elapsed = started.elapsed();
    let probed = probe.finish(opts.jobs, Line::default()).await;
    opts.line("enqueue-batch")
        .merge(probed)
        .int("batch", opts.enqueue_batch as u64)
        .num("value", rate(opts.jobs, elapsed))
        .text("unit", "jobs/s")
        .num("seconds", elapsed.as_secs_f64())
        .emit();
    Ok(())
}

/// Jobs of one graph of `e2e-graphs`: a root, [`FAN_OUT`] jobs after it, and one job
/// after all of those (issue #29: fan-out to 10, fan-in to 1).
pub const GRAPH_JOBS: u64 = 2 + FAN_OUT;
const FAN_OUT: u64 = 10;

/// Enqueues `graphs` graphs (see [`GRAPH_JOBS`]), each whole in one batch with the
/// graphs beside it, as many to a batch as fit `batch` jobs; job numbers (payloads) run
/// from 0 in enqueue order.
async fn fill_graphs(store: &Store, graphs: u64, batch: usize) -> Result<(), String> {
    fill_by(
        store,
        0..graphs,
        batch as u64 / GRAPH_JOBS,
        |graph, jobs| {
            let first = graph * GRAPH_JOBS;
            let root = jobs.len();
            jobs.push(payload(first));
            for i in 1..=FAN_OUT {
                jobs.push(payload(first + i).after(Dependency::Earlier(root)));
            }
            let mut fan_in = payload(first + FAN_OUT + 1);
            for i in 1..=FAN_OUT as usize {
                fan_in = fan_in.after(Dependency::Earlier(root + i));
            }
            jobs.push(fan_in);
        },
    )
    .await
}

/// `e2e-backlog`: enqueue every job, then start the workers and time them from the
/// first job started to the last completion stored.
pub async fn e2e_backlog(
    store: Store,
    housekeeping: &Housekeeping,
    opts: &Options,
) -> Result<(), String> {
    drain_backlog(store, housekeeping, opts, false).await
}

/// `e2e-graphs`: as `e2e-backlog`, with the jobs enqueued as graphs of [`GRAPH_JOBS`]
/// (`--jobs` rounded down to whole graphs): only the roots are ready at first, and
/// each completion of a root releases ten jobs, the tenth of those its fan-in. What a
/// workflow costs against plain jobs, which `e2e-backlog` at the same size measures.
pub async fn e2e_graphs(
    store: Store,
    housekeeping: &Housekeeping,
    opts: &Options,
) -> Result<(), String> {
    if !store.capabilities().dependencies {
        return Err("the store does not keep dependencies".to_owned());
    }
    let graphs = opts.jobs / GRAPH_JOBS;
    if graphs == 0 {
        return Err(format!("--jobs below one graph ({GRAPH_JOBS} jobs)"));
    }
    let opts = Options {
        jobs: graphs * GRAPH_JOBS,
        ..opts.clone()
    };
    drain_backlog(store, housekeeping, &opts, true).await
}

async fn drain_backlog(
    store: Store,
    housekeeping: &Housekeeping,
    opts: &Options,
    graphs: bool,
) -> Result<(), String> {
    let fill_started = Instant::now();
    if graphs {
        fill_graphs(&store, opts.jobs / GRAPH_JOBS, opts.enqueue_batch.max(1)).await?;
    } else {
        fill(&store, 0..opts.jobs, opts.enqueue_batch.max(1)).await?;
    }
    let fill_time = fill_started.elapsed();
    housekeeping.after_fill().await?;
    let _vacuum = housekeeping.while_draining();
    let progress = Arc::new(Progress::new(opts.jobs, false));
    let probe = Probe::start(&opts.backend).await;
    let workers = drain::start(
        opts.driver,
        store.clone(),
        &opts.drain_config(),
        Arc::clone(&progress),
    )
    .await?;
    let waited = progress.wait(opts.stall, opts.deadline).await;
    let stopped = workers.stop().await;
    let finished = waited?;
    let stored_by = stopped?;
    let (drained, span) = if finished {
        let span = progress.span(stored_by).ok_or("no job ran")?;
        (opts.jobs, span)
    } else {
        // Past the deadline: the rate over the jobs drained so far, all of them with
        // the rest of the backlog still waiting behind them.
        let first = progress.first_start().ok_or("no job ran")?;
        let end = stored_by.unwrap_or_else(Instant::now);
        (progress.completed(), end.saturating_duration_since(first))
    };
    let probed = probe.finish(drained, Line::default()).await;
    if finished {
        check_drained(&store).await?;
    }
    opts.line(if graphs { "e2e-graphs" } else { "e2e-backlog" })
        .merge(probed)
        .int("fail_first", u64::from(opts.fail_first))
        .int("concurrency", opts.concurrency as u64)
        .text("driver", opts.driver.name())
        .num("value", rate(drained, span))
        .text("unit", "jobs/s")
        .num("seconds", span.as_secs_f64())
        .num("fill_seconds", fill_time.as_secs_f64())
        .int("drained", drained)
        .text("vacuum", housekeeping.describe())
        .emit();
    Ok(())
}

/// `e2e-producer`: start the workers on an empty queue, then one producer enqueues
/// every job in batches while they run; timed from the first job started to the last
/// completion stored.
pub async fn e2e_producer(
    store: Store,
    housekeeping: &Housekeeping,
    opts: &Options,
) -> Result<(), String> {
    let _vacuum = housekeeping.while_draining();
    let progress = Arc::new(Progress::new(opts.jobs, false));
    let probe = Probe::start(&opts.backend).await;
    let workers = drain::start(
        opts.driver,
        store.clone(),
        &opts.drain_config(),
        Arc::clone(&progress),
    )
    .await?;
    let producer = {
        let store = store.clone();
        let (jobs, batch) = (opts.jobs, opts.enqueue_batch.max(1));
        tokio::spawn(async move {
            let started = Instant::now();
            fill(&store, 0..jobs, batch).await?;
            Ok::<Duration, String>(started.elapsed())
        })
    };
    let waited = progress.wait(opts.stall, None).await.map(|_| ());
    let stopped = workers.stop().await;
    let produced = producer.await.map_err(|e| format!("producer: {e}"))?;
    waited?;
    let stored_by = stopped?;
    let produce_time = produced?;
    let span = progress.span(stored_by).ok_or("no job ran")?;
    let probed = probe.finish(opts.jobs, Line::default()).await;
    check_drained(&store).await?;
    opts.line("e2e-producer")
        .merge(probed)
        .int("concurrency", opts.concurrency as u64)
        .int("batch", opts.enqueue_batch as u64)
        .text("driver", opts.driver.name())
        .num("value", rate(opts.jobs, span))
        .text("unit", "jobs/s")
        .num("seconds", span.as_secs_f64())
        .num("produce_rate", rate(opts.jobs, produce_time))
        .emit();
    Ok(())
}

/// `latency`: a producer enqueues one job at a time at a steady rate into idle workers;
/// the pickup latency of a job runs from its enqueue returning to its handler starting.
pub async fn latency(store: Store, opts: &Options) -> Result<(), String> {
    let producer = store.clone();
    pickup_latency("latency", store, opts, || async move {
        let mut returned = Vec::with_capacity(opts.jobs as usize);
        let mut ticks = ticker(opts.rate);
        for i in 0..opts.jobs {
            ticks.tick().await;
            producer
                .enqueue(payload(i))
                .await
                .map_err(|e| format!("enqueue: {e}"))?;
            returned.push(Instant::now());
        }
        Ok(returned)
    })
    .await
}

/// `latency-tx`: `latency`, but each job is enqueued inside a transaction of the
/// producer's own that also writes one business row, and its pickup latency runs from
/// that transaction's commit returning (CONTRACT §7). Only the SQL backends have such
/// transactions; on the others it fails, saying so.
pub async fn latency_tx(
    store: Store,
    transactional: Option<&Transactional>,
    opts: &Options,
) -> Result<(), String> {
    let Some(transactional) = transactional else {
        return Err(format!(
            "latency-tx enqueues inside the caller's database transaction, which the {} \
             backend does not have (only sqlite and postgres do)",
            opts.backend
        ));
    };
    pickup_latency("latency-tx", store, opts, || {
        crate::transactional::produce(transactional, opts)
    })
    .await
}

/// Drives a pickup-latency run: workers start idle on `store`, then `produce` enqueues
/// jobs `0..opts.jobs` at `opts.rate` jobs/s, answering when each job's enqueue (or its
/// transaction's commit) returned, in job order. Each job's latency runs from then to
/// its handler starting; emits p50, p99 and max as `workload`'s line.
async fn pickup_latency<F, Fut>(
    workload: &str,
    store: Store,
    opts: &Options,
    produce: F,
) -> Result<(), String>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Vec<Instant>, String>>,
{
    let progress = Arc::new(Progress::new(opts.jobs, true));
    let workers = drain::start(
        opts.driver,
        store,
        &opts.drain_config(),
        Arc::clone(&progress),
    )
    .await?;
    // Let the workers reach their idle wait before the first job arrives.
    idle(Duration::from_millis(200)).await;
    let produced = produce().await;
    // A producer that failed enqueued only some jobs: do not wait for the rest.
    let waited = match &produced {
        Ok(_) => progress.wait(opts.stall, None).await.map(|_| ()),
        Err(_) => Ok(()),
    };
    let stopped = workers.stop().await;
    let returned = produced?;
    waited?;
    stopped?;
    if returned.len() as u64 != opts.jobs {
        return Err(format!(
            "the producer reported {} enqueues, not {}",
            returned.len(),
            opts.jobs
        ));
    }
    let mut latencies: Vec<f64> = returned
        .iter()
        .enumerate()
        .map(|(i, enqueued)| {
            let started = progress
                .start_of(i)
                .ok_or(format!("job {i} never started"))?;
            // A handler may start before the enqueue call has returned to the producer;
            // that pickup took no time after the enqueue returned.
            Ok(millis(started.saturating_duration_since(*enqueued)))
        })
        .collect::<Result<_, String>>()?;
    latencies.sort_by(f64::total_cmp);
    opts.line(workload)
        .int("rate", opts.rate)
        .int("concurrency", opts.concurrency as u64)
        .text("driver", opts.driver.name())
        .num("p50_ms", quantile(&latencies, 0.50))
        .num("p99_ms", quantile(&latencies, 0.99))
        .num("max_ms", quantile(&latencies, 1.0))
        .num("value", quantile(&latencies, 0.50))
        .text("unit", "ms")
        .emit();
    Ok(())
}

/// The time between two jobs of a producer at `rate` jobs/s.
pub fn period(rate: u64) -> Duration {
    Duration::from_secs_f64(1.0 / rate.max(1) as f64)
}

/// A latency producer's pace on the async runtime: one tick per job, the first at once;
/// a late tick delays the ones after it instead of bunching them up.
pub fn ticker(rate: u64) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period(rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// What every job of the `claim-budget` workload needs, and the budget its claims carry:
/// a budget that admits every job, so the figure is the price of checking each fit, not
/// of skipping jobs (a claim that skips jobs reads more of the queue, whatever it costs).
fn fitted_needs(index: u64) -> Needs {
    Needs::new()
        .amount("cpu_milli", 250 + index % 4 * 250)
        .amount("mem_bytes", 64 << 20)
        .capability("x86_64")
}

fn admitting_budget() -> Budget {
    Budget::new()
        .amount("cpu_milli", 4_000)
        .amount("mem_bytes", 16 << 30)
        .amount("gpu", 0)
        .capability("x86_64")
        .capability("avx2")
}

/// `claim` and `claim-budget`: enqueue every job, then `claimers` claimers take them
/// `claim_batch` at a time (leasing only: nothing completes), timed from the first claim
/// to the last. With `budget`, every job declares needs and every claim carries a
/// budget admitting them all (CONTRACT F2, F3).
pub async fn claim(store: Store, opts: &Options, budget: bool) -> Result<(), String> {
    let workload = if budget { "claim-budget" } else { "claim" };
    let mut next = 0;
    while next < opts.jobs {
        let end = (next + opts.enqueue_batch.max(1) as u64).min(opts.jobs);
        let jobs: Vec<NewJob> = (next..end)
            .map(|i| {
                let job = payload(i);
                if budget {
                    job.needs(fitted_needs(i))
                } else {
                    job
                }
            })
            .collect();
        store
            .enqueue_batch(jobs)
            .await
            .map_err(|e| format!("enqueue_batch: {e}"))?;
        next = end;
    }
    let claimed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..opts.claimers {
        let store = store.clone();
        let claimed = Arc::clone(&claimed);
        let mut request = ClaimRequest::new(
            [QUEUE],
            format!("bench-claim-{c}"),
            Duration::from_secs(3_600),
        )
        .limit(opts.claim_batch);
        if budget {
            request = request.budget(admitting_budget());
        }
        tasks.spawn(async move {
            loop {
                let got = store
                    .claim(request.clone())
                    .await
                    .map_err(|e| format!("claim: {e}"))?;
                if got.is_empty() {
                    return Ok(());
                }
                claimed.fetch_add(got.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    join_all(tasks).await?;
    let span = started.elapsed();
    let claimed = claimed.load(std::sync::atomic::Ordering::Relaxed);
    if claimed != opts.jobs {
        return Err(format!("claimed {claimed} of {} jobs", opts.jobs));
    }
    opts.line(workload)
        .int("claimers", opts.claimers as u64)
        .int("claim_batch", opts.claim_batch as u64)
        .num("value", rate(claimed, span))
        .text("unit", "jobs/s")
        .num("seconds", span.as_secs_f64())
        .emit();
    Ok(())
}

/// The concurrency keys the flow-control workloads spread their jobs over.
const FLOW_KEYS: u64 = 1_000;

/// What a flow-control workload sets on its queue (CONTRACT K1–K3).
#[derive(Debug, Clone, Copy)]
pub enum FlowLimits {
    /// `claim-keys`: keyed jobs, no limits: the plain claims the others are judged by.
    None,
    /// `claim-limited`: limits that admit everything (a running limit per key and in
    /// all above the jobs), so each claim counts and checks them and passes over none.
    AdmitAll,
    /// `claim-one-per-key`: at most one running job per key.
    OnePerKey,
}

impl FlowLimits {
    fn workload(self) -> &'static str {
        match self {
            FlowLimits::None => "claim-keys",
            FlowLimits::AdmitAll => "claim-limited",
            FlowLimits::OnePerKey => "claim-one-per-key",
        }
    }

    fn limits(self) -> Option<QueueLimits> {
        match self {
            FlowLimits::None => None,
            FlowLimits::AdmitAll => Some(
                QueueLimits::new()
                    .max_running(u32::MAX)
                    .max_running_per_key(u32::MAX),
            ),
            FlowLimits::OnePerKey => Some(QueueLimits::new().max_running_per_key(1)),
        }
    }
}

/// `claim-keys`, `claim-limited`, `claim-one-per-key` (issue #28): N jobs spread over
/// 1,000 concurrency keys in turn, then `claimers` claimers claim `claim-batch` at a
/// time and complete what they took in one batch, until every job is done; timed from
/// the first claim to the last completion. Completions free the keys' slots, so a key
/// limited to one running job gives its next one to a later claim.
pub async fn claim_limited(store: Store, opts: &Options, mode: FlowLimits) -> Result<(), String> {
    if let Some(limits) = mode.limits() {
        store
            .set_limits(QUEUE, limits)
            .await
            .map_err(|e| format!("set_limits: {e}"))?;
    }
    let mut next = 0;
    while next < opts.jobs {
        let end = (next + opts.enqueue_batch.max(1) as u64).min(opts.jobs);
        let jobs: Vec<NewJob> = (next..end)
            .map(|i| payload(i).concurrency_key(format!("key-{}", i % FLOW_KEYS)))
            .collect();
        store
            .enqueue_batch(jobs)
            .await
            .map_err(|e| format!("enqueue_batch: {e}"))?;
        next = end;
    }
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let total = opts.jobs;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for c in 0..opts.claimers {
        let store = store.clone();
        let done = Arc::clone(&done);
        let request = ClaimRequest::new(
            [QUEUE],
            format!("bench-flow-{c}"),
            Duration::from_secs(3_600),
        )
        .limit(opts.claim_batch);
        tasks.spawn(async move {
            while done.load(std::sync::atomic::Ordering::Relaxed) < total {
                let got = store
                    .claim(request.clone())
                    .await
                    .map_err(|e| format!("claim: {e}"))?;
                if got.is_empty() {
                    // The jobs left belong to keys running elsewhere, or are done.
                    tokio::task::yield_now().await;
                    continue;
                }
                let completions: Vec<Completion> = got
                    .iter()
                    .map(|job| Completion::new(job.id(), job.token(), None))
                    .collect();
                for answer in store
                    .complete_batch(completions)
                    .await
                    .map_err(|e| format!("complete_batch: {e}"))?
                {
                    answer.map_err(|e| format!("complete: {e}"))?;
                }
                done.fetch_add(got.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        });
    }
    join_all(tasks).await?;
    let span = started.elapsed();
    let done = done.load(std::sync::atomic::Ordering::Relaxed);
    if done != total {
        return Err(format!("completed {done} of {total} jobs"));
    }
    opts.line(mode.workload())
        .int("claimers", opts.claimers as u64)
        .int("claim_batch", opts.claim_batch as u64)
        .int("keys", FLOW_KEYS)
        .num("value", rate(done, span))
        .text("unit", "jobs/s")
        .num("seconds", span.as_secs_f64())
        .emit();
    Ok(())
}

/// `reclaim`: `jobs` live leases and a few expired ones; times `reclaim` recovering the
/// expired ones, several times.
pub async fn reclaim(store: Store, opts: &Options) -> Result<(), String> {
    const EXPIRED: usize = 10;
    const REPEATS: usize = 20;
    let live = opts.jobs;
    fill(&store, 0..(EXPIRED as u64), EXPIRED).await?;
    fill(&store, (EXPIRED as u64)..(EXPIRED as u64 + live), 1_000).await?;
    let short = Duration::from_millis(1);
    let long = Duration::from_secs(3_600);
    // The first jobs enqueued are claimed first (FIFO), on a lease that runs out at once.
    let request =
        |ttl: Duration, limit: usize| ClaimRequest::new([QUEUE], "bench-reclaim", ttl).limit(limit);
    let expiring = store
        .claim(request(short, EXPIRED))
        .await
        .map_err(|e| format!("claim: {e}"))?;
    if expiring.len() != EXPIRED {
        return Err(format!(
            "claimed {} expiring jobs, wanted {EXPIRED}",
            expiring.len()
        ));
    }
    let mut leased = 0u64;
    while leased < live {
        let limit = (live - leased).min(1_000) as usize;
        let claimed = store
            .claim(request(long, limit))
            .await
            .map_err(|e| format!("claim: {e}"))?;
        if claimed.is_empty() {
            return Err(format!("only {leased} of {live} jobs could be leased"));
        }
        leased += claimed.len() as u64;
    }
    let mut expired_times = Vec::with_capacity(REPEATS);
    let mut empty_times = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        // The clock has millisecond resolution and expiry is strict (R1): wait past it.
        idle(Duration::from_millis(5)).await;
        let started = Instant::now();
        let reclaimed = store
            .reclaim(100)
            .await
            .map_err(|e| format!("reclaim: {e}"))?;
        expired_times.push(millis(started.elapsed()));
        if reclaimed.len() != EXPIRED || reclaimed.iter().any(|r| r.state != JobState::Queued) {
            return Err(format!(
                "reclaim returned {reclaimed:?}, wanted {EXPIRED} requeued"
            ));
        }
        let started = Instant::now();
        let none = store
            .reclaim(100)
            .await
            .map_err(|e| format!("reclaim: {e}"))?;
        empty_times.push(millis(started.elapsed()));
        if !none.is_empty() {
            return Err(format!("a second reclaim returned {none:?}"));
        }
        // The requeued jobs are the only ready ones: lease them again, briefly.
        let again = store
            .claim(request(short, EXPIRED))
            .await
            .map_err(|e| format!("claim: {e}"))?;
        if again.len() != EXPIRED {
            return Err(format!("re-claimed {} jobs, wanted {EXPIRED}", again.len()));
        }
    }
    expired_times.sort_by(f64::total_cmp);
    empty_times.sort_by(f64::total_cmp);
    opts.line("reclaim")
        .int("expired", EXPIRED as u64)
        .int("repeats", REPEATS as u64)
        .num("value", quantile(&expired_times, 0.5))
        .text("unit", "ms")
        .num("max_ms", quantile(&expired_times, 1.0))
        .num("empty_ms", quantile(&empty_times, 0.5))
        .emit();
    Ok(())
}

/// Checks the queue holds no ready or running job: every job ran and completed.
async fn check_drained(store: &Store) -> Result<(), String> {
    let stats = store
        .stats(QUEUE)
        .await
        .map_err(|e| format!("stats: {e}"))?;
    if stats.waiting + stats.ready + stats.scheduled + stats.running + stats.dead + stats.cancelled
        != 0
    {
        return Err(format!("queue not drained cleanly: {stats:?}"));
    }
    Ok(())
}

/// Waits for `duration` of real time (a benchmark pause, not a test's wait for expiry).
async fn idle(duration: Duration) {
    tokio::time::sleep_until(tokio::time::Instant::now() + duration).await;
}

async fn join_all(mut tasks: JoinSet<Result<(), String>>) -> Result<(), String> {
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.map_err(|e| format!("task: {e}")).and_then(|r| r);
        if let Err(err) = outcome {
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}
