//! Lifecycle hooks: what the worker tells its hooks once a job's outcome is stored
//! ([`JobEvent`], [`JobOutcome`]), and how it calls them ([`Hooks`]).
//!
//! An event is built only when the store has acknowledged the outcome, so a hook never
//! hears of an outcome that was refused (a lost lease) or never stored. A worker with
//! no hook builds no event: every emission point checks [`Hooks::is_empty`] first, and
//! what the event needs besides is kept with the job's lease (see `leases.rs`) only
//! when there are hooks.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{JobId, Timestamp};

/// A lifecycle hook, as [`crate::WorkerBuilder::on_event`] takes it.
pub(crate) type Hook = Box<dyn Fn(&JobEvent) + Send + Sync + 'static>;

/// What happened to a job, as one of the worker's lifecycle hooks hears it
/// ([`crate::WorkerBuilder::on_event`]).
///
/// Sent once the store has acknowledged the outcome, never for one it refused (the
/// lease was lost: another worker holds the job) or could not take. Cheap to clone,
/// to hand it to a channel.
#[derive(Clone)]
#[non_exhaustive]
pub struct JobEvent {
    id: JobId,
    queue: Arc<str>,
    attempt: u32,
    worker_id: Arc<str>,
    ran_for: Option<Duration>,
    outcome: JobOutcome,
}

impl fmt::Debug for JobEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobEvent")
            .field("id", &self.id)
            .field("queue", &&*self.queue)
            .field("attempt", &self.attempt)
            .field("worker_id", &&*self.worker_id)
            .field("ran_for", &self.ran_for)
            .field("outcome", &self.outcome)
            .finish()
    }
}

impl JobEvent {
    pub(crate) fn new(
        id: JobId,
        queue: Arc<str>,
        attempt: u32,
        worker_id: Arc<str>,
        ran_for: Option<Duration>,
        outcome: JobOutcome,
    ) -> Self {
        JobEvent {
            id,
            queue,
            attempt,
            worker_id,
            ran_for,
            outcome,
        }
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// The queue the job came from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The attempt that ended, as the handler saw it in `JobContext::attempt` (1 on
    /// the first run). A snoozed or released attempt is not counted by the store, so
    /// the job's next run has the same number.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The id of the worker that ran the attempt and reported its outcome.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// How long the handler ran (wall clock, from its start until it returned, or
    /// until the worker gave up on it); `None` for a job released before its handler
    /// started.
    pub fn ran_for(&self) -> Option<Duration> {
        self.ran_for
    }

    /// What happened.
    pub fn outcome(&self) -> &JobOutcome {
        &self.outcome
    }

    /// Whether the job will not run again: it succeeded, died or was cancelled.
    pub fn is_final(&self) -> bool {
        matches!(
            self.outcome,
            JobOutcome::Succeeded | JobOutcome::Dead { .. } | JobOutcome::Cancelled { .. }
        )
    }
}

/// How an attempt ended, as the store recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome {
    /// The job succeeded: its completion was stored, by the worker or by the handler
    /// in its own transaction (a returned `FencedCompletion`).
    Succeeded,
    /// The attempt failed and the job will run again at `retry_at` (store clock; the
    /// store keeps now instead if that time had passed when the call reached it).
    Failed {
        /// The error text given to the store (which may keep a shortened copy).
        error: String,
        /// When the job runs again.
        retry_at: Timestamp,
    },
    /// The attempt failed and the job is dead: the error was permanent, or it was the
    /// last attempt (`max_attempts`). Nothing runs it again unless an operator
    /// retries it.
    Dead {
        /// The error text given to the store (which may keep a shortened copy).
        error: String,
    },
    /// The handler asked to run again later (`JobError::snooze`): the job is queued
    /// for `until` (store clock), the attempt not counted.
    Snoozed {
        /// When the job runs again, as the worker computed it from the store's clock
        /// just before the call.
        until: Timestamp,
    },
    /// An operator cancelled the job while it ran, and the handler did not succeed:
    /// the job ended `cancelled`.
    Cancelled {
        /// The error text given to the store.
        error: String,
    },
    /// The job was handed back to the queue, ready at once, the attempt not counted:
    /// at shutdown (its handler still running past the grace period), or because its
    /// lease expired before its handler could start (CONTRACT L8).
    Released,
}

/// The hooks of one worker, called in the order they were added.
#[derive(Default)]
pub(crate) struct Hooks(Vec<Hook>);

impl Hooks {
    pub(crate) fn push(&mut self, hook: Hook) {
        self.0.push(hook);
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no hook: then no event is built.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Calls every hook with `event`. A hook that panics is logged and skipped; the
    /// others are still called, and the worker goes on.
    pub(crate) fn emit(&self, event: &JobEvent) {
        for (index, hook) in self.0.iter().enumerate() {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| hook(event))) {
                tracing::error!(
                    hook = index,
                    job = %event.id,
                    panic = %super::job::panic_message(panic.as_ref()),
                    "a lifecycle hook panicked; the worker goes on"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn event(outcome: JobOutcome) -> JobEvent {
        JobEvent::new(
            JobId::mint(Timestamp::from_millis(1)),
            Arc::from("q"),
            1,
            Arc::from("w"),
            Some(Duration::from_millis(3)),
            outcome,
        )
    }

    #[test]
    fn a_panicking_hook_does_not_stop_the_others() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut hooks = Hooks::default();
        assert!(hooks.is_empty());
        let before = calls.clone();
        hooks.push(Box::new(move |_| {
            before.fetch_add(1, Ordering::SeqCst);
        }));
        hooks.push(Box::new(|_| panic!("a broken hook")));
        let after = calls.clone();
        hooks.push(Box::new(move |event| {
            assert_eq!(event.queue(), "q");
            after.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(hooks.len(), 3);
        hooks.emit(&event(JobOutcome::Succeeded));
        hooks.emit(&event(JobOutcome::Released));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "both sound hooks saw both events"
        );
    }

    #[test]
    fn final_outcomes() {
        assert!(event(JobOutcome::Succeeded).is_final());
        assert!(event(JobOutcome::Dead { error: "e".into() }).is_final());
        assert!(event(JobOutcome::Cancelled { error: "e".into() }).is_final());
        assert!(!event(JobOutcome::Failed {
            error: "e".into(),
            retry_at: Timestamp::from_millis(1),
        })
        .is_final());
        assert!(!event(JobOutcome::Snoozed {
            until: Timestamp::from_millis(1)
        })
        .is_final());
        assert!(!event(JobOutcome::Released).is_final());
    }
}
