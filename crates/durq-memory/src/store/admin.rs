//! Operator actions (CONTRACT A1, A2, Q1) and the fault-injection hooks.

use super::*;

impl State {
    /// Rule Q1. Returns whether the queue was paused before.
    pub(crate) fn set_paused(&mut self, queue: &str, paused: bool) -> bool {
        let was = self.paused.contains(queue);
        if paused {
            self.paused.insert(queue.to_owned());
        } else {
            self.paused.remove(queue);
        }
        was
    }

    pub(crate) fn paused_queues(&self) -> Vec<String> {
        self.paused.iter().cloned().collect()
    }

    pub(crate) fn cancel(&mut self, id: JobId, now: Timestamp) -> Result<JobState> {
        let state = self.job(id)?.state;
        Ok(match state {
            JobState::Queued | JobState::Waiting => self.transition_checked(id, now, |job| {
                Self::finish(job, JobState::Cancelled, now);
                job.state
            })?,
            JobState::Running => self.transition_checked(id, now, |job| {
                job.cancel_requested = true;
                job.state
            })?,
            terminal => terminal,
        })
    }

    pub(crate) fn retry(&mut self, id: JobId, now: Timestamp) -> Result<()> {
        let state = self.job(id)?.state;
        if !matches!(state, JobState::Dead | JobState::Cancelled) {
            return Err(Error::InvalidState {
                id,
                state,
                operation: "retry",
            });
        }
        self.requeue(id, now)
    }

    /// Queues an ended job again as rule A2 does: attempts reset, its outcome cleared,
    /// ready now. Its steps stay (D2); a reopen (D3) cuts them first.
    pub(crate) fn requeue(&mut self, id: JobId, now: Timestamp) -> Result<()> {
        self.transition_checked(id, now, |job| {
            job.state = JobState::Queued;
            job.run_at = now;
            job.attempts = 0;
            job.cancel_requested = false;
            job.finished_at = None;
            job.result = None;
            job.lease = None;
            // It starts over (CONTRACT A2): its past runs are in its attempt history.
            job.started_at = None;
            job.heartbeat_at = None;
            job.last_error = None;
        })
    }

    #[cfg(feature = "testing")]
    pub(crate) fn vanish(&mut self, id: JobId) -> bool {
        let Some(record) = self.jobs.remove(&id) else {
            return false;
        };
        self.steps.remove(&id);
        // The index entries stay, as an eviction leaves them; the count of a queue's
        // running jobs is of records, and this one is gone.
        let job = &record.job;
        if job.state == JobState::Running {
            if let Some(running) = self.idx.running.get_mut(job.queue.as_str()) {
                running.remove(job.concurrency_key.as_deref());
            }
        }
        true
    }

    #[cfg(feature = "testing")]
    pub(crate) fn count_limits_once(&mut self, on: bool) {
        self.faults.count_limits_once = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn rate_on_system_clock(&mut self, on: bool) {
        self.faults.rate_on_system_clock = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn turns_restart(&mut self, on: bool) {
        self.faults.turns_restart = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn fitted_ignore_limits(&mut self, on: bool) {
        self.faults.fitted_ignore_limits = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn rates_keep_starts(&mut self, on: bool) {
        self.faults.rates_keep_starts = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn unfair_keeps_turns(&mut self, on: bool) {
        self.faults.unfair_keeps_turns = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn limits_before_preference(&mut self, on: bool) {
        self.faults.limits_before_preference = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn release_on_first_dependency(&mut self, on: bool) {
        self.faults.release_on_first_dependency = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn ignore_dependency_failures(&mut self, on: bool) {
        self.faults.ignore_dependency_failures = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn waiting_frees_unique_keys(&mut self, on: bool) {
        self.faults.waiting_frees_unique_keys = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn release_leaves_dependents(&mut self, on: bool) {
        self.faults.release_leaves_dependents = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn reopen_checks_apart(&mut self, on: bool) {
        self.faults.reopen_checks_apart = on;
    }

    #[cfg(feature = "testing")]
    pub(crate) fn reopens_checks_apart(&self) -> bool {
        self.faults.reopen_checks_apart
    }

    #[cfg(feature = "testing")]
    pub(crate) fn corrupt(&mut self, id: JobId) -> bool {
        match self.jobs.get_mut(&id) {
            Some(record) => {
                record.unreadable = true;
                true
            }
            None => false,
        }
    }
}
