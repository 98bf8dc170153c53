//! The lease calls (CONTRACT L1–L10, H1–H4) and the endings they share with reclaim.

use super::*;

impl State {
    pub(crate) fn heartbeat(
        &mut self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.check_lease(id, token)?;
        let expires_at = now.saturating_add(ttl);
        self.transition_checked(id, now, |job| {
            job.heartbeat_at = Some(now);
            if let Some(lease) = &mut job.lease {
                lease.expires_at = expires_at;
            }
            Heartbeat {
                cancel_requested: job.cancel_requested,
                expires_at,
            }
        })
    }

    pub(super) fn finish(job: &mut Job, state: JobState, now: Timestamp) {
        job.state = state;
        job.lease = None;
        job.finished_at = Some(now);
    }

    /// Moves a job whose attempt ended without success where `transition` decided.
    pub(super) fn apply(job: &mut Job, next: Next, now: Timestamp) {
        match next {
            Next::Queued { ready_at } => {
                job.state = JobState::Queued;
                job.lease = None;
                job.run_at = ready_at;
            }
            Next::Finished(state) => Self::finish(job, state, now),
        }
    }

    pub(super) fn attempts(job: &Job) -> Attempts {
        Attempts {
            cancel_requested: job.cancel_requested,
            taken: job.attempts,
            max: job.max_attempts,
        }
    }

    pub(crate) fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.check_lease(id, token)?;
        // Moved out of the ending lease (after `transition` unindexed it), not copied.
        self.transition_record(id, now, |record| {
            let job = &mut record.job;
            record.last_worker = job.lease.take().map(|lease| lease.worker);
            Self::finish(job, JobState::Succeeded, now);
            job.result = result;
            // An earlier attempt's error is in the history, not on a succeeded job (L4).
            job.last_error = None;
        })
        .ok_or(Error::NotFound { id })
    }

    pub(crate) fn fail(
        &mut self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.check_lease(id, token)?;
        self.end_attempt(id, AttemptOutcome::Failed, Some(error), now);
        self.transition_checked(id, now, |job| {
            job.last_error = Some(error.to_owned());
            Self::apply(
                job,
                transition::after_failure(Self::attempts(job), retry),
                now,
            );
            job.state
        })
    }

    pub(crate) fn release(
        &mut self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<JobState> {
        self.check_lease(id, token)?;
        self.end_attempt(id, AttemptOutcome::Released, None, now);
        let release = |record: &mut Record| {
            let job = &mut record.job;
            let next = transition::after_release(job.cancel_requested, ready_at);
            if next.state() == JobState::Queued {
                // A released attempt does not count; a cancelled one stays counted (A1).
                job.attempts = job.attempts.saturating_sub(1);
            }
            Self::apply(job, next, now);
            job.state
        };
        if self.faults.release_leaves_dependents {
            return self
                .transition_unsettled(id, now, release)
                .map(|(state, _)| state)
                .ok_or(Error::NotFound { id });
        }
        self.transition_record(id, now, release)
            .ok_or(Error::NotFound { id })
    }

    /// Records how the running attempt of `id` ended, before its lease is dropped.
    pub(super) fn end_attempt(
        &mut self,
        id: JobId,
        outcome: AttemptOutcome,
        error: Option<&str>,
        now: Timestamp,
    ) {
        let Some(record) = self.jobs.get_mut(&id) else {
            return;
        };
        let (Some(lease), Some(started_at)) = (&record.job.lease, record.job.started_at) else {
            return;
        };
        let attempt = Attempt::ended(
            lease.token,
            lease.worker.clone(),
            started_at,
            now,
            outcome,
            error.map(|error| durq_core::validate::truncate_attempt_error(error).to_owned()),
        );
        record.ended.push(attempt);
        let kept = usize::try_from(durq_core::ATTEMPTS_KEPT).unwrap_or(usize::MAX);
        if record.ended.len() > kept {
            record.ended.remove(0);
        }
    }
}
