//! Writing jobs inside the caller's own database transaction (CONTRACT §7): the checks
//! and the clock read of the [`Store`](crate::Store) handle, for the backends that offer
//! transactional calls (PostgreSQL, SQLite).
//!
//! Those calls cannot go through the handle, because they take the caller's
//! transaction, whose type is the backend's. So each backend calls these functions at
//! the start of its own: the job is refused with the same error as through the handle,
//! and its time is read once from the store's clock, as the handle does.

use bytes::Bytes;

use crate::error::Result;
use crate::id::JobId;
use crate::model::{LeaseToken, NewJob, StoreSettings};
use crate::time::Timestamp;
use crate::validate;

/// An enqueue as the handle would send it to its backend: `job` checked
/// ([`validate::validate_new_job`]), the instant read once from `settings`' clock, and
/// a delay turned into a run time at that instant.
pub fn prepare_enqueue(settings: &StoreSettings, job: NewJob) -> Result<(NewJob, Timestamp)> {
    validate::validate_new_job(&job, settings)?;
    let now = settings.now();
    Ok((resolve_delay(job, now), now))
}

/// A batch enqueue as the handle would send it: refused whole if one job is invalid
/// (E9), the instant read once for every job.
pub fn prepare_batch(
    settings: &StoreSettings,
    jobs: Vec<NewJob>,
) -> Result<(Vec<NewJob>, Timestamp)> {
    validate::validate_batch(&jobs, settings)?;
    let now = settings.now();
    let mut jobs = jobs;
    // In place: a job is a few hundred bytes, and a batch a thousand of them.
    for job in &mut jobs {
        if let Some(delay) = job.delay.take() {
            job.run_at = Some(now.saturating_add(delay));
        }
    }
    Ok((jobs, now))
}

/// A completion as the handle would send it: the result within `max_payload_bytes`
/// (L4), and the instant it takes effect.
pub fn prepare_complete(settings: &StoreSettings, result: Option<&Bytes>) -> Result<Timestamp> {
    if let Some(bytes) = result {
        validate::validate_size("result", bytes.len(), settings)?;
    }
    Ok(settings.now())
}

/// A job's delay (`NewJob::delay`) as a run time at `now`.
pub(crate) fn resolve_delay(mut job: NewJob, now: Timestamp) -> NewJob {
    if let Some(delay) = job.delay.take() {
        job.run_at = Some(now.saturating_add(delay));
    }
    job
}

/// Proof that a job's completion was written in the caller's transaction, under the
/// lease it names (CONTRACT T3): what a backend's fenced completion returns.
///
/// A handler that completes its job this way returns it (it is a `JobOutput` of the
/// `durq` worker runtime) once its transaction has committed, and the worker then
/// records nothing more for the job: its outcome is already stored, with the
/// handler's own writes. Returned without the commit, the worker stops keeping the
/// lease all the same, and the job runs again once the lease has expired and been
/// reclaimed: the receipt can only make a job run again, never lose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "return it from the handler once the transaction committed"]
pub struct FencedCompletion {
    id: JobId,
    token: LeaseToken,
}

impl FencedCompletion {
    /// The receipt of job `id` completed under lease `token`. Backends make it; a
    /// caller has no use for making one.
    pub fn new(id: JobId, token: LeaseToken) -> Self {
        FencedCompletion { id, token }
    }

    /// The job that was completed.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// The lease under which it was completed.
    pub fn token(&self) -> LeaseToken {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::error::Error;
    use crate::time::ManualClock;

    fn settings() -> (StoreSettings, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let settings = StoreSettings {
            clock: clock.clone(),
            max_payload_bytes: 8,
            ..StoreSettings::default()
        };
        (settings, clock)
    }

    #[test]
    fn an_enqueue_is_checked_and_stamped_once() {
        let (settings, _clock) = settings();
        let (job, now) = prepare_enqueue(
            &settings,
            NewJob::new("q").delay(Duration::from_millis(500)),
        )
        .expect("valid");
        assert_eq!(now, Timestamp::from_millis(1_000));
        assert_eq!(job.run_at, Some(Timestamp::from_millis(1_500)));
        assert!(job.delay.is_none());
        let refused = prepare_enqueue(&settings, NewJob::new("bad queue!"));
        assert!(
            matches!(refused, Err(Error::InvalidInput { field: "queue", .. })),
            "{refused:?}"
        );
        let refused = prepare_enqueue(&settings, NewJob::new("q").payload("123456789"));
        assert!(
            matches!(refused, Err(Error::PayloadTooLarge { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn a_batch_with_one_bad_job_is_refused_whole() {
        let (settings, _clock) = settings();
        let refused = prepare_batch(&settings, vec![NewJob::new("q"), NewJob::new("")]);
        assert!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "{refused:?}"
        );
        let (jobs, _) =
            prepare_batch(&settings, vec![NewJob::new("q"), NewJob::new("r")]).expect("valid");
        assert_eq!(jobs.len(), 2);
    }

    #[test]
    fn a_completion_result_is_held_to_the_payload_limit() {
        let (settings, clock) = settings();
        clock.advance(Duration::from_millis(5));
        assert_eq!(
            prepare_complete(&settings, Some(&Bytes::from_static(b"12345678"))).ok(),
            Some(Timestamp::from_millis(1_005))
        );
        let refused = prepare_complete(&settings, Some(&Bytes::from_static(b"123456789")));
        assert!(
            matches!(refused, Err(Error::PayloadTooLarge { .. })),
            "{refused:?}"
        );
    }
}
