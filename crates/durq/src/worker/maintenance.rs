//! The worker's housekeeping: taking back expired leases, purging old jobs, and
//! firing the namespace's schedules.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;

use durq_core::{Error, JobState, Schedule, WorkerInfo};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{Shared, StoreBackoff};

/// Takes back jobs whose lease expired, every interval, until none are left.
pub(crate) async fn reclaim_loop(shared: Arc<Shared>, interval: Duration, stop: CancellationToken) {
    let config = &shared.config;
    every(interval, &stop, || async {
        loop {
            match shared.home.reclaim(config.reclaim_batch).await {
                Ok(reclaimed) => {
                    let mut requeued = false;
                    for job in &reclaimed {
                        shared.metrics.reclaimed(job.state).increment(1);
                        requeued |= job.state == JobState::Queued;
                        tracing::info!(job = %job.id, state = %job.state, "reclaimed an expired lease");
                    }
                    if requeued {
                        shared.reclaimed.notify_one();
                    }
                    if reclaimed.len() < config.reclaim_batch {
                        return;
                    }
                }
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "reclaim failed");
                    return;
                }
            }
        }
    })
    .await;
}

/// Reads the depth and lag of the worker's queues (CONTRACT A7) into gauges, every
/// interval. Only the queues the worker serves, so the gauges' labels stay as few as
/// its handlers; a queue it serves with no job reads zero. The first read comes one
/// interval after the start, not at it: workers started together (a deploy) would
/// otherwise all count the namespace's jobs at once, just as they begin to drain it
/// (measured: PostgreSQL end to end 0.97 of before, in a 20,000-job drain).
pub(crate) async fn queue_gauges_loop(
    shared: Arc<Shared>,
    interval: Duration,
    stop: CancellationToken,
) {
    let config = &shared.config;
    let first = tokio::time::Instant::now() + interval;
    every_from(first, interval, &stop, || async {
        match shared.home.queues().await {
            Ok(queues) => {
                for name in &config.queue_names {
                    let overview = queues.iter().find(|q| &q.queue == name);
                    let stats = overview.map(|q| q.stats).unwrap_or_default();
                    for (state, depth) in [
                        ("ready", stats.ready),
                        ("scheduled", stats.scheduled),
                        ("running", stats.running),
                    ] {
                        metrics::gauge!(
                            crate::telemetry::JOBS_QUEUE_DEPTH,
                            "queue" => name.clone(),
                            "state" => state
                        )
                        .set(depth as f64);
                    }
                    let lag = overview.and_then(|q| q.lag).unwrap_or_default();
                    metrics::gauge!(crate::telemetry::JOBS_QUEUE_LAG, "queue" => name.clone())
                        .set(lag.as_secs_f64());
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "reading the queues' depth and lag failed");
            }
        }
    })
    .await;
}

/// This worker's record among the namespace's live workers (CONTRACT W1–W4): registers
/// it, renews it every heartbeat interval with the jobs in flight (registering again
/// if it was reaped meanwhile), and reaps the records of workers silent for longer than
/// `worker_silence`. The record is removed at shutdown, by the worker's run.
pub(crate) async fn worker_record_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let config = &shared.config;
    let info = WorkerInfo::new(
        config.worker_id.to_string(),
        gethostname::gethostname().to_string_lossy().into_owned(),
        std::process::id(),
        config.queue_names.clone(),
        u32::try_from(config.concurrency).unwrap_or(u32::MAX),
    );
    let registered = std::sync::atomic::AtomicBool::new(false);
    every(config.heartbeat, &stop, || async {
        let in_flight =
            u32::try_from(shared.handlers_running.load(Ordering::Acquire)).unwrap_or(u32::MAX);
        if registered.load(Ordering::Relaxed) {
            match shared.home.worker_heartbeat(&info.id, in_flight).await {
                Ok(()) => {}
                Err(Error::WorkerNotFound { .. }) => {
                    tracing::info!("this worker's record was reaped; registering again");
                    registered.store(false, Ordering::Relaxed);
                }
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "renewing the worker's record failed");
                }
            }
        }
        if !registered.load(Ordering::Relaxed) {
            let mut record = info.clone();
            record.in_flight = in_flight;
            match shared.home.register_worker(&record).await {
                Ok(()) => registered.store(true, Ordering::Relaxed),
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "registering the worker failed");
                }
            }
        }
        match shared.home.reap_workers(config.worker_silence).await {
            Ok(reaped) => {
                for id in reaped {
                    tracing::info!(worker = %id, "reaped the record of a silent worker");
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "reaping silent workers failed");
            }
        }
    })
    .await;
}

/// Deletes terminal jobs past retention (CONTRACT A5), every interval.
pub(crate) async fn purge_loop(shared: Arc<Shared>, interval: Duration, stop: CancellationToken) {
    let config = &shared.config;
    every(interval, &stop, || async {
        while !stop.is_cancelled() {
            match shared.home.purge(config.purge_batch).await {
                Ok(deleted) => {
                    shared.metrics.purged.increment(deleted);
                    if deleted > 0 {
                        tracing::debug!(deleted, "purged jobs past retention");
                    }
                    if deleted < config.purge_batch as u64 {
                        trim_events(&shared).await;
                        return;
                    }
                }
                Err(err) => {
                    shared.metrics.store_errors.increment(1);
                    tracing::warn!(error = %err, "purge failed");
                    return;
                }
            }
        }
    })
    .await;
}

/// Trims the namespace's event stream to the newest events the worker's store keeps
/// (CONTRACT V3), when it records events; a backend without the stream is left alone.
async fn trim_events(shared: &Shared) {
    let store = &shared.home;
    let Some(keep) = store.settings().events_kept else {
        return;
    };
    if !store.supports(durq_core::Capability::Events) {
        return;
    }
    match store.trim_events(keep).await {
        Ok(deleted) if deleted > 0 => tracing::debug!(deleted, "trimmed the event stream"),
        Ok(_) => {}
        Err(err) => {
            shared.metrics.store_errors.increment(1);
            tracing::warn!(error = %err, "trimming the event stream failed");
        }
    }
}

/// Stores the schedules the worker declares, then fires the namespace's due schedules
/// every interval (CONTRACT S3), until `stop`.
pub(crate) async fn schedule_loop(
    shared: Arc<Shared>,
    declared: Vec<Schedule>,
    interval: Option<Duration>,
    stop: CancellationToken,
) {
    let store = &shared.home;
    for schedule in &declared {
        // Until it is stored, with the worker's store back-off: a worker that cannot
        // store its schedules still runs its handlers meanwhile.
        let mut delay = StoreBackoff::new();
        while let Err(err) = store.put_schedule(schedule).await {
            shared.metrics.store_errors.increment(1);
            tracing::warn!(schedule = %schedule.name, error = %err, "storing a schedule failed");
            if !delay.wait(Some(&stop)).await {
                return;
            }
        }
    }
    let Some(interval) = interval else {
        return;
    };
    every(interval, &stop, || async {
        match store.fire_schedules().await {
            Ok(fired) => {
                for (schedule, job) in &fired {
                    shared.metrics.scheduled.increment(1);
                    tracing::debug!(%schedule, %job, "schedule fired");
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "firing schedules failed");
            }
        }
    })
    .await;
}

/// Runs `round` at once and then every `interval` (a round that overruns delays the
/// next), until `stop`.
async fn every<F, Fut>(interval: Duration, stop: &CancellationToken, round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    every_from(tokio::time::Instant::now(), interval, stop, round).await;
}

/// [`every`], the first round at `start`.
async fn every_from<F, Fut>(
    start: tokio::time::Instant,
    interval: Duration,
    stop: &CancellationToken,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval_at(start, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        round().await;
    }
}
