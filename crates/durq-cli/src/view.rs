//! The JSON documents `--json` prints: one serializable form per thing the store
//! returns. Times are RFC 3339 UTC strings to the millisecond, durations whole
//! milliseconds (`*_ms`), ids their canonical text, and absent values `null`.

use std::collections::BTreeMap;
use std::time::Duration;

use durq::{Cadence, Job, JobId, Lease, QueueOverview, QueueStats, ScheduleRecord, WorkerInfo};
use serde::Serialize;

use crate::format::time_ms;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A job, as `list`, `inspect` and `workers` print it.
#[derive(Debug, Serialize)]
pub struct JobJson<'a> {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: &'a str,
    /// `queued`, `running`, `succeeded`, `dead` or `cancelled`.
    pub state: &'static str,
    /// Whether it is queued with a `run_at` still to come.
    pub scheduled: bool,
    /// Higher runs first.
    pub priority: i16,
    /// Claims so far.
    pub attempts: u32,
    /// Claims allowed before it is dead.
    pub max_attempts: u32,
    /// When it became (or becomes) ready.
    pub run_at: String,
    /// When it was enqueued.
    pub created_at: String,
    /// When it was last claimed.
    pub started_at: Option<String>,
    /// When its lease was last claimed or extended.
    pub heartbeat_at: Option<String>,
    /// When it finished.
    pub finished_at: Option<String>,
    /// The scope of its idempotency key (`""` by default).
    pub tenant: &'a str,
    /// Its idempotency key.
    pub idempotency_key: Option<&'a str>,
    /// The job that enqueued it.
    pub parent: Option<JobId>,
    /// How long one attempt may run, when the job says.
    pub timeout_ms: Option<u64>,
    /// Its lease, while running.
    pub lease: Option<LeaseJson<'a>>,
    /// Whether an operator asked it to stop.
    pub cancel_requested: bool,
    /// The text of its last failure.
    pub last_error: Option<&'a str>,
    /// The amounts it needs from a worker, by name.
    pub needs: &'a BTreeMap<String, u64>,
    /// The capabilities it needs from a worker.
    pub capabilities: Vec<&'a str>,
    /// Where it would best run.
    pub locality: Option<&'a str>,
    /// Its tags (CONTRACT E11).
    pub tags: &'a durq::Tags,
    /// The W3C traceparent it was enqueued with (CONTRACT E12).
    pub trace_context: Option<&'a str>,
}

impl<'a> JobJson<'a> {
    /// The form of `job`, read at `now`.
    pub fn new(job: &'a Job, now: durq::Timestamp) -> Self {
        JobJson {
            id: job.id,
            queue: &job.queue,
            state: job.state.as_str(),
            scheduled: job.state == durq::JobState::Queued && job.run_at > now,
            priority: job.priority,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            run_at: time_ms(job.run_at),
            created_at: time_ms(job.created_at),
            started_at: job.started_at.map(time_ms),
            heartbeat_at: job.heartbeat_at.map(time_ms),
            finished_at: job.finished_at.map(time_ms),
            tenant: &job.tenant,
            idempotency_key: job.idempotency_key.as_deref(),
            parent: job.parent,
            timeout_ms: job.timeout.map(millis),
            lease: job.lease.as_ref().map(LeaseJson::new),
            cancel_requested: job.cancel_requested,
            last_error: job.last_error.as_deref(),
            needs: job.needs.amounts(),
            capabilities: job
                .needs
                .capabilities()
                .iter()
                .map(String::as_str)
                .collect(),
            locality: job.locality.as_deref(),
            tags: &job.tags,
            trace_context: job.trace_context.as_deref(),
        }
    }
}

/// A running job's lease.
#[derive(Debug, Serialize)]
pub struct LeaseJson<'a> {
    /// The worker holding it.
    pub worker: &'a str,
    /// Its fencing token.
    pub token: u64,
    /// When it expires unless renewed.
    pub expires_at: String,
}

impl<'a> LeaseJson<'a> {
    /// The form of `lease`.
    pub fn new(lease: &'a Lease) -> Self {
        LeaseJson {
            worker: &lease.worker,
            token: lease.token.get(),
            expires_at: time_ms(lease.expires_at),
        }
    }
}

/// A queue's counts, as `stats` prints them and `queues` lists them.
#[derive(Debug, Serialize)]
pub struct StatsJson<'a> {
    /// The queue.
    pub queue: &'a str,
    /// Waiting for the jobs they depend on.
    pub waiting: u64,
    /// Queued and due.
    pub ready: u64,
    /// Queued for later.
    pub scheduled: u64,
    /// Claimed.
    pub running: u64,
    /// Completed.
    pub succeeded: u64,
    /// Failed for good.
    pub dead: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// All of them.
    pub total: u64,
    /// Whether the queue is paused.
    pub paused: bool,
}

impl<'a> StatsJson<'a> {
    /// The form of `stats` of `queue`.
    pub fn new(queue: &'a str, stats: &QueueStats) -> Self {
        StatsJson {
            queue,
            waiting: stats.waiting,
            ready: stats.ready,
            scheduled: stats.scheduled,
            running: stats.running,
            succeeded: stats.succeeded,
            dead: stats.dead,
            cancelled: stats.cancelled,
            total: stats.total(),
            paused: stats.paused,
        }
    }
}

/// A queue as `queues` lists it: its counts, and its lag.
#[derive(Debug, Serialize)]
pub struct QueueJson<'a> {
    /// The counts.
    #[serde(flatten)]
    pub stats: StatsJson<'a>,
    /// When its oldest ready job became ready.
    pub oldest_ready: Option<String>,
    /// How long that job has waited.
    pub lag_ms: Option<u64>,
}

impl<'a> QueueJson<'a> {
    /// The form of `overview`.
    pub fn new(overview: &'a QueueOverview) -> Self {
        QueueJson {
            stats: StatsJson::new(&overview.queue, &overview.stats),
            oldest_ready: overview.oldest_ready.map(time_ms),
            lag_ms: overview.lag.map(millis),
        }
    }
}

/// A live worker, with the jobs found running under its leases.
#[derive(Debug, Serialize)]
pub struct WorkerJson<'a> {
    /// Its id.
    pub id: &'a str,
    /// The host it runs on.
    pub host: &'a str,
    /// Its process id there.
    pub pid: u32,
    /// The queues it serves.
    pub queues: &'a [String],
    /// How many jobs it runs at once.
    pub concurrency: u32,
    /// How many it reported running at its last heartbeat.
    pub in_flight: u32,
    /// When it registered.
    pub started_at: String,
    /// When it was last heard of.
    pub last_seen: String,
    /// The jobs running under its leases now.
    pub running: Vec<JobJson<'a>>,
}

impl<'a> WorkerJson<'a> {
    /// The form of `worker`, running `running`.
    pub fn new(worker: &'a WorkerInfo, running: Vec<JobJson<'a>>) -> Self {
        WorkerJson {
            id: &worker.id,
            host: &worker.host,
            pid: worker.pid,
            queues: &worker.queues,
            concurrency: worker.concurrency,
            in_flight: worker.in_flight,
            started_at: time_ms(worker.started_at),
            last_seen: time_ms(worker.last_seen),
            running,
        }
    }
}

/// A periodic job.
#[derive(Debug, Serialize)]
pub struct ScheduleJson<'a> {
    /// Its name.
    pub name: &'a str,
    /// `{"cron": "0 0 2 * * *", "time_zone": "UTC"}` or `{"every_ms": 30000}`.
    pub cadence: CadenceJson<'a>,
    /// The queue its jobs go to.
    pub queue: &'a str,
    /// Whether schedulers fire it.
    pub enabled: bool,
    /// Its latest tick fired (or the time it was put, before its first).
    pub last_run: String,
    /// Its next tick.
    pub next_run: Option<String>,
}

/// When a schedule ticks.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum CadenceJson<'a> {
    /// A cron expression in a time zone.
    Cron {
        /// The expression, with seconds.
        cron: &'a str,
        /// The IANA time zone it is read in.
        time_zone: &'a str,
    },
    /// A fixed interval from the epoch.
    Every {
        /// The interval.
        every_ms: u64,
    },
}

impl<'a> ScheduleJson<'a> {
    /// The form of `record`.
    pub fn new(record: &'a ScheduleRecord) -> Self {
        let cadence = match &record.schedule.cadence {
            Cadence::Cron {
                expression,
                time_zone,
            } => CadenceJson::Cron {
                cron: expression,
                time_zone,
            },
            Cadence::Every(interval) => CadenceJson::Every {
                every_ms: millis(*interval),
            },
        };
        ScheduleJson {
            name: &record.schedule.name,
            cadence,
            queue: &record.schedule.job.queue,
            enabled: record.enabled,
            last_run: time_ms(record.last_tick),
            next_run: record.next_tick.map(time_ms),
        }
    }
}
