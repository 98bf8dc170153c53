//! Attempt history (CONTRACT H1–H4): every claim of a job is an attempt, read back
//! with [`Store::attempts`](crate::Store::attempts).
//!
//! What a backend stores is only the attempts that ended *off* the hot path: a
//! failure, a release (or snooze) and a reclaim each write one record. The two
//! attempts a job's own record already describes are not written twice: the running
//! attempt is its current lease, and the attempt that succeeded is its last lease
//! with `finished_at`. [`history`] puts the two together, so a completion costs a
//! backend no write beyond the one it already makes (the worker and token of the last
//! lease stay on the job's record after it succeeds).
//!
//! Records are kept per job in [`ATTEMPTS_KEPT`] slots chosen by [`slot`]: a token is
//! the job's claim count (C6), so the newest attempts overwrite the oldest and the
//! history is bounded without a trimming pass.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::model::{JobState, LeaseToken};
use crate::time::Timestamp;

/// The most attempts kept per job (CONTRACT H3): older ones drop off.
pub const ATTEMPTS_KEPT: u64 = 32;

/// The slot a backend stores the attempt of `token` in: `token mod ATTEMPTS_KEPT`.
/// A newer attempt overwrites the record [`ATTEMPTS_KEPT`] claims older.
pub fn slot(token: LeaseToken) -> u64 {
    token.get() % ATTEMPTS_KEPT
}

/// How an attempt ended (CONTRACT H2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// It holds the job's lease now.
    Running,
    /// `complete` ended it: the job succeeded.
    Succeeded,
    /// `fail` ended it, with an error; the job was requeued, or died, or was cancelled.
    Failed,
    /// `release` or a snooze gave the job back.
    Released,
    /// Its lease expired and `reclaim` took the job back.
    Expired,
}

impl AttemptOutcome {
    /// Every outcome, in declaration order.
    pub const ALL: [AttemptOutcome; 5] = [
        AttemptOutcome::Running,
        AttemptOutcome::Succeeded,
        AttemptOutcome::Failed,
        AttemptOutcome::Released,
        AttemptOutcome::Expired,
    ];

    /// The lower-case name backends store and tools print.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Released => "released",
            AttemptOutcome::Expired => "expired",
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttemptOutcome {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        AttemptOutcome::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == s)
            .ok_or_else(|| Error::invalid("outcome", format!("unknown attempt outcome {s:?}")))
    }
}

/// One attempt of a job: one claim, from its lease to the call that ended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The fencing token of its claim; also its number, since tokens count a job's
    /// claims (CONTRACT C6).
    pub token: LeaseToken,
    /// The worker that claimed it.
    pub worker: String,
    /// When it was claimed.
    pub started_at: Timestamp,
    /// When the call that ended it ran; `None` while it runs.
    pub ended_at: Option<Timestamp>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error text of a failure or an expiry, cut as `last_error` is.
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt that ended at `ended_at` with `outcome`, as a backend records it.
    pub fn ended(
        token: LeaseToken,
        worker: impl Into<String>,
        started_at: Timestamp,
        ended_at: Timestamp,
        outcome: AttemptOutcome,
        error: Option<String>,
    ) -> Self {
        Attempt {
            token,
            worker: worker.into(),
            started_at,
            ended_at: Some(ended_at),
            outcome,
            error,
        }
    }

    /// How long it ran: to its end, or to `now` while it runs.
    pub fn run_time(&self, now: Timestamp) -> std::time::Duration {
        self.ended_at.unwrap_or(now).duration_since(self.started_at)
    }
}

/// What a job's own record says of its last claim: the fields [`history`] reads the
/// running or the succeeded attempt from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastClaim {
    /// The job's state.
    pub state: JobState,
    /// The worker of its last lease (kept after a success).
    pub worker: Option<String>,
    /// The token of its last claim (0 when never claimed).
    pub token: LeaseToken,
    /// When it was last claimed.
    pub started_at: Option<Timestamp>,
    /// When it finished, if it has.
    pub finished_at: Option<Timestamp>,
}

/// A job's attempts, oldest first (CONTRACT H1–H3): the records a backend stored
/// (`ended`, in any order) and the attempt its record holds (`last`): the running one,
/// or the one that succeeded. At most [`ATTEMPTS_KEPT`], the newest.
pub fn history(mut ended: Vec<Attempt>, last: LastClaim) -> Vec<Attempt> {
    let from_record = match (last.state, last.worker, last.started_at) {
        (JobState::Running, Some(worker), Some(started_at)) => Some(Attempt {
            token: last.token,
            worker,
            started_at,
            ended_at: None,
            outcome: AttemptOutcome::Running,
            error: None,
        }),
        (JobState::Succeeded, Some(worker), Some(started_at)) if last.token.get() > 0 => {
            last.finished_at.map(|finished_at| {
                Attempt::ended(
                    last.token,
                    worker,
                    started_at,
                    finished_at,
                    AttemptOutcome::Succeeded,
                    None,
                )
            })
        }
        _ => None,
    };
    if let Some(attempt) = from_record {
        // A record of the same claim would be stale (a slot reused), never newer.
        ended.retain(|a| a.token != attempt.token);
        ended.push(attempt);
    }
    ended.sort_by_key(|a| a.token);
    ended.dedup_by_key(|a| a.token);
    let keep = usize::try_from(ATTEMPTS_KEPT).unwrap_or(usize::MAX);
    if ended.len() > keep {
        ended.drain(..ended.len() - keep);
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(token: u64) -> Attempt {
        Attempt::ended(
            LeaseToken::new(token),
            "w",
            Timestamp::from_millis(token as i64),
            Timestamp::from_millis(token as i64 + 1),
            AttemptOutcome::Failed,
            Some("boom".into()),
        )
    }

    fn last(state: JobState, token: u64) -> LastClaim {
        LastClaim {
            state,
            worker: Some("w2".into()),
            token: LeaseToken::new(token),
            started_at: Some(Timestamp::from_millis(100)),
            finished_at: (state == JobState::Succeeded).then(|| Timestamp::from_millis(150)),
        }
    }

    #[test]
    fn the_running_and_the_succeeded_attempt_come_from_the_record() {
        let running = history(vec![ended(2), ended(1)], last(JobState::Running, 3));
        let tokens: Vec<u64> = running.iter().map(|a| a.token.get()).collect();
        assert_eq!(tokens, [1, 2, 3]);
        assert_eq!(running[2].outcome, AttemptOutcome::Running);
        assert_eq!(running[2].ended_at, None);
        let done = history(vec![ended(1)], last(JobState::Succeeded, 2));
        assert_eq!(done[1].outcome, AttemptOutcome::Succeeded);
        assert_eq!(done[1].ended_at, Some(Timestamp::from_millis(150)));
        assert_eq!(done[1].worker, "w2");
        let queued = history(vec![ended(1)], last(JobState::Queued, 1));
        assert_eq!(
            queued,
            vec![ended(1)],
            "a queued job's record holds no attempt"
        );
    }

    #[test]
    fn only_the_newest_attempts_are_kept() {
        let stored: Vec<Attempt> = (1..=ATTEMPTS_KEPT + 5).map(ended).collect();
        let kept = history(stored, last(JobState::Running, ATTEMPTS_KEPT + 6));
        assert_eq!(kept.len() as u64, ATTEMPTS_KEPT);
        assert_eq!(kept[0].token.get(), 7);
        assert_eq!(
            kept.last().map(|a| a.outcome),
            Some(AttemptOutcome::Running)
        );
    }

    #[test]
    fn slots_cycle_through_the_kept_count() {
        assert_eq!(slot(LeaseToken::new(1)), 1);
        assert_eq!(slot(LeaseToken::new(ATTEMPTS_KEPT)), 0);
        assert_eq!(slot(LeaseToken::new(ATTEMPTS_KEPT + 1)), 1);
        for outcome in AttemptOutcome::ALL {
            assert_eq!(
                outcome.as_str().parse::<AttemptOutcome>().ok(),
                Some(outcome)
            );
        }
        assert!("lost".parse::<AttemptOutcome>().is_err());
    }
}
