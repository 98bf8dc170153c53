//! What reads over many jobs take and answer: a queue's counts (CONTRACT A3), the
//! overview of every queue (A7), and `list`'s query and pages (A4).

use crate::error::Error;
use crate::id::JobId;
use crate::meta::Tags;
use crate::time::Timestamp;

use crate::model::{Job, JobState};

/// Counts of one queue's jobs per state (CONTRACT A3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Waiting for the jobs they depend on (CONTRACT G1).
    pub waiting: u64,
    /// Queued and due.
    pub ready: u64,
    /// Queued with `run_at` in the future.
    pub scheduled: u64,
    /// Claimed and leased.
    pub running: u64,
    /// Completed.
    pub succeeded: u64,
    /// Failed for good.
    pub dead: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Whether the queue is paused (CONTRACT Q1): its jobs are counted as usual, but no
    /// claim takes them.
    pub paused: bool,
}

impl QueueStats {
    /// All jobs counted.
    pub fn total(&self) -> u64 {
        self.waiting
            + self.ready
            + self.scheduled
            + self.running
            + self.succeeded
            + self.dead
            + self.cancelled
    }
}

/// One queue of a namespace, as [`Store::queues`](crate::Store::queues) lists it
/// (CONTRACT A7): its counts per state, whether it is paused, and its lag.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueOverview {
    /// The queue's name.
    pub queue: String,
    /// Its jobs per state and whether it is paused, as [`Store::stats`](crate::Store::stats)
    /// counts them.
    pub stats: QueueStats,
    /// When its oldest ready job became ready (the earliest ready time among its
    /// ready jobs); `None` when none is ready.
    pub oldest_ready: Option<Timestamp>,
    /// How long that job has waited at the instant of the call: the queue's lag.
    /// `None` when no job is ready.
    pub lag: Option<std::time::Duration>,
    /// Its limits on running jobs (CONTRACT K3); unlimited on a backend without flow
    /// control.
    pub limits: crate::QueueLimits,
}

impl QueueOverview {
    /// A queue's overview as a backend reads it: `paused`, `lag` and `limits` are the
    /// handle's to fill in.
    pub fn new(
        queue: impl Into<String>,
        stats: QueueStats,
        oldest_ready: Option<Timestamp>,
    ) -> Self {
        QueueOverview {
            queue: queue.into(),
            stats,
            oldest_ready,
            lag: None,
            limits: crate::QueueLimits::default(),
        }
    }
}

/// A page request for `list` (CONTRACT A4): the jobs that match every filter set,
/// newest first.
///
/// ```
/// use durq_core::{JobState, ListQuery};
/// let dead_emails = ListQuery::new("emails").state(JobState::Dead).limit(50);
/// let a_customers_jobs = ListQuery::all().tag("customer", "42").tenant("acme");
/// assert!(dead_emails.matches_queue("emails") && a_customers_jobs.matches_queue("any"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only this queue (whole name); `None` lists every queue.
    pub queue: Option<String>,
    /// Only queues whose name starts with this text, compared byte for byte: no
    /// wildcards, case counts.
    pub queue_prefix: Option<String>,
    /// Only jobs in one of these states; empty means every state.
    pub states: Vec<JobState>,
    /// Only this tenant (whole value): `None` lists every tenant's jobs,
    /// `Some("")` the default tenant's only (jobs enqueued without one).
    pub tenant: Option<String>,
    /// Only jobs carrying every one of these tags with exactly these values.
    pub tags: Tags,
    /// The most jobs per page: 1..=1000.
    pub limit: usize,
    /// Continue after this job (from [`ListPage::next`]).
    pub cursor: Option<JobId>,
}

impl ListQuery {
    /// The first page of every queue's jobs, 100 jobs at most.
    pub fn all() -> Self {
        ListQuery {
            queue: None,
            queue_prefix: None,
            states: Vec::new(),
            tenant: None,
            tags: Tags::new(),
            limit: 100,
            cursor: None,
        }
    }

    /// The first page of `queue`, 100 jobs at most.
    pub fn new(queue: impl Into<String>) -> Self {
        ListQuery::all().queue(queue)
    }

    /// Only jobs of `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs of queues whose name starts with `prefix` (literally, case counts).
    pub fn queue_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.queue_prefix = Some(prefix.into());
        self
    }

    /// Also lists jobs in `state` (the first call narrows from every state to it).
    pub fn state(mut self, state: JobState) -> Self {
        if !self.states.contains(&state) {
            self.states.push(state);
        }
        self
    }

    /// Only jobs in one of `states`.
    pub fn states(mut self, states: impl IntoIterator<Item = JobState>) -> Self {
        self.states.clear();
        for state in states {
            self = self.state(state);
        }
        self
    }

    /// Only jobs of `tenant`, whole value; `""` is the default tenant (jobs enqueued
    /// without one). Without this call every tenant's jobs are listed.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only jobs tagged `key` = `value` (with any other tags set, all must match).
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// At most `limit` jobs per page.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Continue after `cursor`.
    pub fn after(mut self, cursor: JobId) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// Continue after the cursor a caller handed back as text (a [`ListPage::next`]
    /// printed by a tool); text that is not a job id is refused naming `cursor`.
    pub fn after_cursor(self, cursor: &str) -> Result<Self, Error> {
        let id = cursor.parse::<JobId>().map_err(|err| {
            Error::invalid(
                "cursor",
                format!("{cursor:?} is not a cursor of `list`: {err}"),
            )
        })?;
        Ok(self.after(id))
    }

    /// Whether a job of `queue` passes the queue filters.
    pub fn matches_queue(&self, queue: &str) -> bool {
        self.queue.as_deref().is_none_or(|q| q == queue)
            && self
                .queue_prefix
                .as_deref()
                .is_none_or(|prefix| queue.starts_with(prefix))
    }

    /// Whether a job in `state` passes the state filter.
    pub fn matches_state(&self, state: JobState) -> bool {
        self.states.is_empty() || self.states.contains(&state)
    }

    /// Whether a job of `tenant` with `tags` passes the tenant and tag filters.
    pub fn matches_scope(&self, tenant: &str, tags: &Tags) -> bool {
        self.tenant.as_deref().is_none_or(|wanted| wanted == tenant)
            && self
                .tags
                .iter()
                .all(|(key, value)| tags.get(key) == Some(value))
    }

    /// Whether `job` passes every filter (the cursor aside).
    pub fn matches(&self, job: &Job) -> bool {
        self.matches_queue(&job.queue)
            && self.matches_state(job.state)
            && self.matches_scope(&job.tenant, &job.tags)
    }
}

/// One page of `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Newest first.
    pub jobs: Vec<Job>,
    /// The cursor of the next page; `None` on the last page.
    pub next: Option<JobId>,
}
