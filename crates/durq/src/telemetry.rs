//! The names of the metrics the runtime records through the [`metrics`] crate.
//!
//! Install a recorder (for example `metrics-exporter-prometheus`) before starting a
//! worker: the worker registers its metric handles once, when `run` begins, so a
//! recorder installed later does not see them.
//!
//! Per-job metrics carry a `queue` label; `jobs_reclaimed` carries `state` (where the
//! job went: `queued`, `dead` or `cancelled`).

use std::collections::HashMap;
use std::sync::Arc;

use durq_core::{async_trait, Backend, Enqueued, JobState, Layer, LayeredBackend, NewJob};
use durq_core::{Result, Timestamp};
use metrics::{counter, histogram, Counter, Histogram};

/// Counter: jobs enqueued through a store carrying the [`MetricsLayer`] (created, not
/// deduplicated).
pub const JOBS_ENQUEUED: &str = "jobs_enqueued";
/// Counter: jobs claimed by a worker.
pub const JOBS_CLAIMED: &str = "jobs_claimed";
/// Counter: jobs completed successfully.
pub const JOBS_SUCCEEDED: &str = "jobs_succeeded";
/// Counter: failed attempts (each failure, whether it is retried or not).
pub const JOBS_FAILED: &str = "jobs_failed";
/// Counter: failed attempts that were scheduled to run again.
pub const JOBS_RETRIED: &str = "jobs_retried";
/// Counter: jobs that ended dead (no retry asked, or attempts used up).
pub const JOBS_DEAD: &str = "jobs_dead";
/// Counter: running jobs that ended cancelled after an operator's request.
pub const JOBS_CANCELLED: &str = "jobs_cancelled";
/// Counter: handlers that panicked (also counted as failed).
pub const JOBS_PANICKED: &str = "jobs_panicked";
/// Counter: jobs handed back at shutdown without counting the attempt.
pub const JOBS_RELEASED: &str = "jobs_released";
/// Counter: attempts whose handler asked to run again later (`JobError::snooze`),
/// not counted as attempts or failures.
pub const JOBS_SNOOZED: &str = "jobs_snoozed";
/// Counter: attempts that ran past their time limit (failed as timed out).
pub const JOBS_TIMED_OUT: &str = "jobs_timed_out";
/// Counter: jobs whose lease this worker lost while holding them.
pub const JOBS_LEASE_LOST: &str = "jobs_lease_lost";
/// Counter: expired leases taken back by this worker's reclaim, labelled by `state`.
pub const JOBS_RECLAIMED: &str = "jobs_reclaimed";
/// Counter: jobs enqueued by the schedules this worker fired (CONTRACT S3).
pub const JOBS_SCHEDULED: &str = "jobs_scheduled";
/// Counter: terminal jobs deleted past retention.
pub const JOBS_PURGED: &str = "jobs_purged";
/// Counter: store calls that failed (the worker logs them and carries on).
pub const JOBS_STORE_ERRORS: &str = "jobs_store_errors";
/// Gauge: jobs of a queue the worker serves, by `state` (`ready`, `scheduled`,
/// `running`), as `Store::queues` last read them (CONTRACT A7).
pub const JOBS_QUEUE_DEPTH: &str = "jobs_queue_depth";
/// Gauge: seconds the oldest ready job of a queue the worker serves has waited; 0 when
/// none is ready.
pub const JOBS_QUEUE_LAG: &str = "jobs_queue_lag_seconds";
/// Histogram, seconds: from the time a job became ready (`run_at`) to its claim, on
/// the store's clock.
pub const JOBS_PICKUP_LATENCY: &str = "jobs_pickup_latency_seconds";
/// Histogram, seconds: how long each attempt ran, from its claim to the end of its
/// handler, on the store's clock: the span its attempt record shows (CONTRACT H2).
pub const JOBS_RUN_TIME: &str = "jobs_run_time_seconds";

/// The handles of one queue's metrics, registered once.
pub(crate) struct QueueMetrics {
    pub(crate) claimed: Counter,
    pub(crate) succeeded: Counter,
    pub(crate) failed: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead: Counter,
    pub(crate) cancelled: Counter,
    pub(crate) panicked: Counter,
    pub(crate) released: Counter,
    pub(crate) snoozed: Counter,
    pub(crate) lease_lost: Counter,
    pub(crate) timed_out: Counter,
    pub(crate) pickup_latency: Histogram,
    pub(crate) run_time: Histogram,
}

impl QueueMetrics {
    fn new(queue: &str) -> Self {
        let q = || ("queue", queue.to_owned());
        QueueMetrics {
            claimed: counter!(JOBS_CLAIMED, &[q()]),
            succeeded: counter!(JOBS_SUCCEEDED, &[q()]),
            failed: counter!(JOBS_FAILED, &[q()]),
            retried: counter!(JOBS_RETRIED, &[q()]),
            dead: counter!(JOBS_DEAD, &[q()]),
            cancelled: counter!(JOBS_CANCELLED, &[q()]),
            panicked: counter!(JOBS_PANICKED, &[q()]),
            released: counter!(JOBS_RELEASED, &[q()]),
            snoozed: counter!(JOBS_SNOOZED, &[q()]),
            lease_lost: counter!(JOBS_LEASE_LOST, &[q()]),
            timed_out: counter!(JOBS_TIMED_OUT, &[q()]),
            pickup_latency: histogram!(JOBS_PICKUP_LATENCY, &[q()]),
            run_time: histogram!(JOBS_RUN_TIME, &[q()]),
        }
    }
}

/// Every handle one worker records to.
pub(crate) struct WorkerMetrics {
    queues: HashMap<String, Arc<QueueMetrics>>,
    /// For a job of a queue the worker does not serve (a store bug, logged).
    other: Arc<QueueMetrics>,
    reclaimed_queued: Counter,
    reclaimed_dead: Counter,
    reclaimed_cancelled: Counter,
    pub(crate) purged: Counter,
    pub(crate) scheduled: Counter,
    pub(crate) store_errors: Counter,
}

impl WorkerMetrics {
    pub(crate) fn new(queues: &[String]) -> Self {
        WorkerMetrics {
            queues: queues
                .iter()
                .map(|queue| (queue.clone(), Arc::new(QueueMetrics::new(queue))))
                .collect(),
            other: Arc::new(QueueMetrics::new("(unknown)")),
            reclaimed_queued: counter!(JOBS_RECLAIMED, "state" => "queued"),
            reclaimed_dead: counter!(JOBS_RECLAIMED, "state" => "dead"),
            reclaimed_cancelled: counter!(JOBS_RECLAIMED, "state" => "cancelled"),
            purged: counter!(JOBS_PURGED),
            scheduled: counter!(JOBS_SCHEDULED),
            store_errors: counter!(JOBS_STORE_ERRORS),
        }
    }

    /// Shared, so an outcome recorded later (a batched completion) counts where it belongs.
    pub(crate) fn queue(&self, queue: &str) -> &Arc<QueueMetrics> {
        self.queues.get(queue).unwrap_or(&self.other)
    }

    pub(crate) fn reclaimed(&self, state: JobState) -> &Counter {
        match state {
            JobState::Dead => &self.reclaimed_dead,
            JobState::Cancelled => &self.reclaimed_cancelled,
            _ => &self.reclaimed_queued,
        }
    }
}

/// Counts what passes through a store in the metrics above: enqueued jobs
/// ([`JOBS_ENQUEUED`], by queue). [`crate::connect`] adds it; add it to a store built
/// by hand with `store.layer(MetricsLayer)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetricsLayer;

impl Layer for MetricsLayer {
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(Metered { inner })
    }
}

/// A backend seen through the [`MetricsLayer`].
#[derive(Debug)]
struct Metered {
    inner: Arc<dyn Backend>,
}

#[async_trait]
impl LayeredBackend for Metered {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let queue = job.queue.clone();
        let enqueued = self.inner.enqueue(job, now).await?;
        if enqueued.created {
            counter!(JOBS_ENQUEUED, "queue" => queue).increment(1);
        }
        Ok(enqueued)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let queues: Vec<String> = jobs.iter().map(|job| job.queue.clone()).collect();
        let enqueued = self.inner.enqueue_batch(jobs, now).await?;
        let mut created: HashMap<String, u64> = HashMap::new();
        for (queue, result) in queues.into_iter().zip(&enqueued) {
            if result.created {
                *created.entry(queue).or_default() += 1;
            }
        }
        for (queue, count) in created {
            counter!(JOBS_ENQUEUED, "queue" => queue).increment(count);
        }
        Ok(enqueued)
    }
}
