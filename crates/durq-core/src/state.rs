//! The state of a job (CONTRACT §2), apart from the rest of the model so the error
//! type can name it without depending on the model.

use std::fmt;
use std::str::FromStr;

/// The state of a job (CONTRACT §2). A queued job whose `run_at` is in the future is
/// *scheduled*, but still `Queued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    /// Waiting for the jobs it depends on to succeed (CONTRACT G1): no claim takes it
    /// until they have, when it becomes `Queued`.
    Waiting,
    /// Waiting to be claimed (ready, or scheduled for later).
    Queued,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Completed. Terminal.
    Succeeded,
    /// Failed for good: no retry asked, or attempts used up. Terminal.
    Dead,
    /// Cancelled by an operator. Terminal.
    Cancelled,
}

impl JobState {
    /// Every state, in declaration order.
    pub const ALL: [JobState; 6] = [
        JobState::Waiting,
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// Whether the job will never run again unless an operator retries it.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled
        )
    }

    /// Waiting, queued (ready or scheduled) or running: what a job unique while active
    /// must be to hold its key (CONTRACT E10).
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }

    /// The lower-case name stored by backends.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = ParseJobStateError;

    fn from_str(s: &str) -> Result<Self, ParseJobStateError> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseJobStateError { text: s.to_owned() })
    }
}

/// Text that names no [`JobState`]. Converts into [`Error::InvalidInput`] for the field
/// `state`, so `?` works in functions returning the crate's [`Result`].
///
/// [`Error::InvalidInput`]: crate::Error::InvalidInput
/// [`Result`]: crate::Result
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseJobStateError {
    /// The text refused.
    pub(crate) text: String,
}

impl fmt::Display for ParseJobStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid state: unknown state {:?}", self.text)
    }
}

impl std::error::Error for ParseJobStateError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().ok(), Some(state));
        }
        let err = "Queued"
            .parse::<JobState>()
            .expect_err("names are lower-case");
        assert_eq!(err.to_string(), "invalid state: unknown state \"Queued\"");
    }
}
