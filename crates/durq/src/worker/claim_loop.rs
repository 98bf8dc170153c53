//! The claim loop: claims as many jobs as there are free slots, starts them, records
//! successes in batches, and runs the shutdown sequence. It runs on the handlers'
//! runtime, since it polls handlers' first steps itself.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{ClaimRequest, ClaimedJob, LeaseToken};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::job::{start_job, QueueHandler};
use super::leases::HeldJob;
use super::report::{record_completions, Succeeded};
use super::{Shared, StoreBackoff};
use crate::handler::CancelReason;
use crate::telemetry::QueueMetrics;

/// How long the worker waits, after cancelling the handlers still running at the end
/// of the shutdown grace period, for their releases to reach the store.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most completions handed to the store in one `complete_batch` call.
pub(crate) const COMPLETION_BATCH: usize = 256;

/// Early wake-ups in a row, each followed by an empty claim, after which the claim
/// loop pauses before it listens again (see `run_loop`).
const WAKES_FOR_NOTHING_BEFORE_A_PAUSE: u32 = 2;

/// The first such pause. Each further one in a row doubles, up to the poll interval;
/// a claim that finds jobs starts them over from here.
const FIRST_PAUSE_AFTER_WAKES_FOR_NOTHING: Duration = Duration::from_millis(10);

/// The claim loop, then the shutdown sequence.
pub(crate) async fn run_loop(
    shared: Arc<Shared>,
    mut completed: mpsc::UnboundedReceiver<Succeeded>,
    shutdown: CancellationToken,
) {
    let config = &shared.config;
    let mut jobs: JoinSet<()> = JoinSet::new();
    // Successes handed over by finished handlers, recorded together by this loop.
    let mut succeeded: Vec<Succeeded> = Vec::with_capacity(COMPLETION_BATCH);
    let mut error_delay = StoreBackoff::new();
    // Whether the last wait for work ended before its timeout.
    let mut woke_early = false;
    // Early wake-ups in a row that were followed by an empty claim.
    let mut empty_wakes = 0u32;
    // The next pause after wake-ups for nothing.
    let mut pause_for_nothing = FIRST_PAUSE_AFTER_WAKES_FOR_NOTHING;
    // Jobs still to claim, for a worker with a claim limit.
    let mut claims_left = config.claim_limit;
    loop {
        while let Some(done) = jobs.try_join_next() {
            log_job_task_end(done);
        }
        if shutdown.is_cancelled() {
            break;
        }
        take_completions(&mut completed, &mut succeeded);
        let free = config
            .concurrency
            .saturating_sub(shared.handlers_running.load(Ordering::Acquire));
        // Failures and releases are reported by the jobs' tasks; those in flight are
        // bounded too, so a slow store pushes back on claiming.
        if free == 0 || jobs.len() >= 2 * config.concurrency || claims_left == Some(0) {
            if !succeeded.is_empty() {
                record_completions(&shared, &mut succeeded, Some(&shutdown)).await;
                continue;
            }
            tokio::select! {
                done = jobs.join_next(), if !jobs.is_empty() => {
                    if let Some(done) = done {
                        log_job_task_end(done);
                    }
                }
                _ = completed.recv_many(&mut succeeded, COMPLETION_BATCH) => {}
                () = shared.slot_freed.notified() => {}
                () = shutdown.cancelled() => {}
            }
            continue;
        }
        let mut limit = free
            .min(config.claim_batch)
            .min(claims_left.unwrap_or(usize::MAX));
        let mut request = ClaimRequest::new(
            config.queue_names.iter().cloned(),
            config.worker_id.as_ref(),
            config.lease,
        );
        if let Some(capacity) = &shared.capacity {
            if capacity.claims_one_at_a_time() {
                limit = 1;
            }
            request = request.budget(capacity.free());
        }
        if !config.prefer.is_empty() {
            request = request.prefer(config.prefer.iter().cloned());
        }
        let request = request.limit(limit);
        // The completions and the claim that refills their slots go out together: they
        // share a round trip (a group commit, a pipeline) where the store allows, and
        // run one after the other on this task where it does not (the memory store),
        // never contending for the same lock from two threads.
        let ((), claimed) = tokio::join!(
            record_completions(&shared, &mut succeeded, Some(&shutdown)),
            config.store.claim(request)
        );
        // Early wake-ups followed by empty claims, twice in a row: the store's wake-up
        // may keep saying "work" for jobs this worker cannot take (jobs that do not fit
        // its capacity, a paused queue's backlog), so the next wait is a pause instead
        // of a spin. Once is not enough: a notice for a job another claim already took
        // (PostgreSQL, Redis) wakes a worker for nothing now and then, and a pause after
        // each such wake-up kept workers deaf to the next job (pickup p50 went from
        // 0.7 ms to 470 ms on PostgreSQL with a poll after each). Twice happens too,
        // at a few hundred jobs a second, so the pause starts short and doubles only
        // while the wake-ups stay empty: a pause of the whole poll interval at once
        // left a worker deaf for it now and then, which put PostgreSQL's pickup p99
        // at 975 ms in one run of 2,000 jobs at 500 a second.
        let wakes_for_nothing = match claimed {
            Ok(claimed) => {
                error_delay.reset();
                empty_wakes = if woke_early && claimed.is_empty() {
                    empty_wakes + 1
                } else {
                    0
                };
                if !claimed.is_empty() {
                    pause_for_nothing = FIRST_PAUSE_AFTER_WAKES_FOR_NOTHING;
                }
                let wakes_for_nothing = empty_wakes >= WAKES_FOR_NOTHING_BEFORE_A_PAUSE;
                if wakes_for_nothing {
                    empty_wakes = 0;
                }
                woke_early = false;
                let full = claimed.len() >= limit;
                claims_left = claims_left.map(|left| left.saturating_sub(claimed.len()));
                start_all(&shared, &mut jobs, claimed, &mut succeeded);
                if full {
                    continue;
                }
                wakes_for_nothing
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "claim failed; backing off");
                error_delay.wait(Some(&shutdown)).await;
                continue;
            }
        };
        take_completions(&mut completed, &mut succeeded);
        if !succeeded.is_empty() {
            // Jobs that finished at once: record them before waiting for more work.
            record_completions(&shared, &mut succeeded, Some(&shutdown)).await;
        }
        let wait_started = tokio::time::Instant::now();
        let pause = wakes_for_nothing.then(|| pause_for_nothing.min(config.poll_interval));
        if pause.is_some() {
            pause_for_nothing = pause_for_nothing
                .saturating_mul(2)
                .min(config.poll_interval);
        }
        let wait = async {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
                return Ok(());
            }
            config
                .store
                .wait_for_work(&config.queue_names, config.poll_interval)
                .await
        };
        tokio::select! {
            waited = wait => {
                // A pause is no wake-up: the claim after it starts the count again.
                woke_early = pause.is_none() && wait_started.elapsed() < config.poll_interval;
                if let Err(err) = waited {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "waiting for work failed; backing off");
                    error_delay.wait(Some(&shutdown)).await;
                }
            }
            // A handler finished: its success is recorded and its slot refilled.
            _ = completed.recv_many(&mut succeeded, COMPLETION_BATCH) => {}
            () = shared.slot_freed.notified() => {}
            () = shared.reclaimed.notified() => {}
            () = shutdown.cancelled() => {}
        }
    }

    // Graceful shutdown: nothing new is claimed from here on.
    tracing::info!(running = jobs.len(), "worker shutting down");
    let drained = tokio::time::timeout(
        config.shutdown_grace,
        finish_jobs(&shared, &mut jobs, &mut completed, &mut succeeded),
    )
    .await;
    if drained.is_err() {
        let left = shared.leases.running();
        tracing::warn!(
            jobs = left.len(),
            "shutdown grace period over; releasing unfinished jobs"
        );
        for job in left {
            job.cancel.cancel(CancelReason::Shutdown);
        }
        let released = tokio::time::timeout(
            RELEASE_TIMEOUT,
            finish_jobs(&shared, &mut jobs, &mut completed, &mut succeeded),
        )
        .await;
        if released.is_err() {
            tracing::error!(
                jobs = shared.leases.len(),
                "could not release or complete every job in time; their leases will expire"
            );
        }
    }
}

/// Holds every job of a claim before starting any, so that the leases of those whose
/// turn comes later are kept while the first ones start; then starts them in order.
///
/// Jobs that succeed in their first poll join `succeeded`, the next batch of
/// completions, without a trip through the channel.
fn start_all(
    shared: &Arc<Shared>,
    jobs: &mut JoinSet<()>,
    claimed: Vec<ClaimedJob>,
    succeeded: &mut Vec<Succeeded>,
) {
    let config = &shared.config;
    let now = config.store.settings().now();
    let hooks = !config.hooks.is_empty();
    let mut held = Vec::with_capacity(claimed.len());
    // The jobs of a claim mostly share a queue: its handler and metrics are looked up
    // once for each run of jobs of one queue.
    let mut last: Option<(&str, Option<&QueueHandler>, &Arc<QueueMetrics>)> = None;
    for ClaimedJob { job, payload } in claimed {
        let (handler, metrics) = match last {
            Some((name, handler, metrics)) if name == job.queue => (handler, metrics),
            _ => {
                let (name, handler) = match config.handlers.get_key_value(job.queue.as_str()) {
                    Some((name, handler)) => (Some(name.as_str()), Some(handler)),
                    None => (None, None),
                };
                let metrics = shared.metrics.queue(&job.queue);
                if let Some(name) = name {
                    last = Some((name, handler, metrics));
                }
                (handler, metrics)
            }
        };
        metrics.claimed.increment(1);
        let picked_up_at = job.started_at.unwrap_or(now);
        metrics
            .pickup_latency
            .record(picked_up_at.duration_since(job.run_at).as_secs_f64());
        let (token, expires_at) = job.lease.as_ref().map_or_else(
            || (LeaseToken::new(0), now.saturating_add(config.lease)),
            |lease| (lease.token, lease.expires_at),
        );
        // Only the lifecycle events name the queue; without hooks nothing is kept.
        let queue = hooks.then(|| match handler {
            Some(handler) => handler.name.clone(),
            None => Arc::from(job.queue.as_str()),
        });
        let job = HeldJob::new(job, token, expires_at, Arc::clone(metrics), queue);
        held.push((Arc::new(job), payload, handler));
    }
    shared.leases.hold_all(held.iter().map(|(job, _, _)| job));
    for (job, payload, handler) in held {
        start_job(shared, jobs, job, payload, handler, succeeded);
    }
}

/// Moves every success handed over so far into `succeeded`, up to a batch.
fn take_completions(
    completed: &mut mpsc::UnboundedReceiver<Succeeded>,
    succeeded: &mut Vec<Succeeded>,
) {
    while succeeded.len() < COMPLETION_BATCH {
        match completed.try_recv() {
            Ok(done) => succeeded.push(done),
            Err(_) => break,
        }
    }
}

/// Waits for every job task to end, recording successes as they come, then records the
/// last ones.
async fn finish_jobs(
    shared: &Shared,
    jobs: &mut JoinSet<()>,
    completed: &mut mpsc::UnboundedReceiver<Succeeded>,
    succeeded: &mut Vec<Succeeded>,
) {
    loop {
        take_completions(completed, succeeded);
        if !succeeded.is_empty() {
            record_completions(shared, succeeded, None).await;
            continue;
        }
        tokio::select! {
            done = jobs.join_next() => match done {
                Some(done) => log_job_task_end(done),
                None => break,
            },
            _ = completed.recv_many(succeeded, COMPLETION_BATCH) => {}
        }
    }
    // Every task has ended; what it handed over is in the channel.
    take_completions(completed, succeeded);
    while !succeeded.is_empty() {
        record_completions(shared, succeeded, None).await;
        take_completions(completed, succeeded);
    }
}

fn log_job_task_end(done: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(err) = done {
        // Handlers' panics are caught inside the task; this is the runtime's own.
        if err.is_panic() {
            tracing::error!("a job task panicked: {err}");
        }
    }
}
