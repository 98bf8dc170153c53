//! The state a job moves to when an attempt ends without success: written once here.
//!
//! The Rust backends (`durq-memory`, `durq-sqlite`) call these functions; the Lua
//! scripts of `durq-redis` and the SQL of `durq-postgres` cannot, so each copy there
//! names the function it mirrors, and the conformance suite holds every copy to the same
//! answers.

use crate::model::{JobState, Retry};
use crate::time::Timestamp;

/// Where a job goes after an attempt ended without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Back to `queued`, ready at this instant.
    Queued {
        /// When the job becomes ready again.
        ready_at: Timestamp,
    },
    /// To a terminal state: `dead` or `cancelled`.
    Finished(JobState),
}

impl Next {
    /// The state the job is in afterwards.
    pub fn state(self) -> JobState {
        match self {
            Next::Queued { .. } => JobState::Queued,
            Next::Finished(state) => state,
        }
    }
}

/// The attempt counters that decide a transition, read from the job as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    /// Whether cancellation was requested while the job ran (CONTRACT A1).
    pub cancel_requested: bool,
    /// Attempts taken, the one ending now included.
    pub taken: u32,
    /// The job's `max_attempts`.
    pub max: u32,
}

impl Attempts {
    fn left(self) -> bool {
        self.taken < self.max
    }
}

/// A failed attempt (CONTRACT L6, L7): a requested cancellation wins; then
/// `Retry::At` with attempts left queues the job at that time; anything else is dead.
pub fn after_failure(attempts: Attempts, retry: Retry) -> Next {
    match retry {
        _ if attempts.cancel_requested => Next::Finished(JobState::Cancelled),
        Retry::At(ready_at) if attempts.left() => Next::Queued { ready_at },
        _ => Next::Finished(JobState::Dead),
    }
}

/// An expired lease taken back by `reclaim` (CONTRACT R1): a requested cancellation
/// wins; then a job with attempts left is ready again at once; else it is dead.
pub fn after_lease_expired(attempts: Attempts, now: Timestamp) -> Next {
    after_failure(attempts, Retry::At(now))
}

/// A job handed back with `release` or `snooze` (CONTRACT L8, L10, A1): ready again
/// at `ready_at` (now for a release), unless its cancellation was requested, when it
/// is cancelled (its attempt stays counted).
pub fn after_release(cancel_requested: bool, ready_at: Timestamp) -> Next {
    if cancel_requested {
        Next::Finished(JobState::Cancelled)
    } else {
        Next::Queued { ready_at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempts(cancel_requested: bool, taken: u32, max: u32) -> Attempts {
        Attempts {
            cancel_requested,
            taken,
            max,
        }
    }

    #[test]
    fn a_requested_cancellation_wins_over_everything() {
        let at = Timestamp::from_millis(5);
        assert_eq!(
            after_failure(attempts(true, 1, 3), Retry::At(at)).state(),
            JobState::Cancelled
        );
        assert_eq!(
            after_lease_expired(attempts(true, 1, 3), at).state(),
            JobState::Cancelled
        );
        assert_eq!(after_release(true, at).state(), JobState::Cancelled);
    }

    #[test]
    fn attempts_left_requeue_at_the_retry_time_and_the_last_one_is_dead() {
        let at = Timestamp::from_millis(9);
        assert_eq!(
            after_failure(attempts(false, 2, 3), Retry::At(at)),
            Next::Queued { ready_at: at }
        );
        assert_eq!(
            after_failure(attempts(false, 3, 3), Retry::At(at)),
            Next::Finished(JobState::Dead)
        );
        assert_eq!(
            after_failure(attempts(false, 1, 3), Retry::Never),
            Next::Finished(JobState::Dead)
        );
        assert_eq!(
            after_lease_expired(attempts(false, 3, 3), at),
            Next::Finished(JobState::Dead)
        );
        assert_eq!(after_release(false, at), Next::Queued { ready_at: at });
    }
}
