//! The one error type every backend reports (CONTRACT §5).

use std::borrow::Cow;

use crate::capability::Capability;
use crate::id::{JobId, ParseJobIdError};
use crate::state::{JobState, ParseJobStateError};

/// A boxed error from a driver or the operating system.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The source of an [`Error`]: an `Arc`, not a `Box`, so an [`Error`] clones and a group
/// commit hands one failure to every caller in the group without copying it by hand.
pub type SharedError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in terms a caller can act on. Every backend maps its failures
/// into these kinds; none turns a failure into "nothing to claim".
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No job with this id exists (never created, or deleted by retention).
    #[error("job {id} not found")]
    NotFound {
        /// The id asked for.
        id: JobId,
    },

    /// The call's lease token is not the job's current one, or the job is no longer
    /// running. Nothing was changed (CONTRACT L2).
    #[error("lease lost on job {id}")]
    LeaseLost {
        /// The job the call was about.
        id: JobId,
    },

    /// An argument was refused before anything was written (CONTRACT E7).
    #[error("invalid {field}: {reason}")]
    InvalidInput {
        /// The field or argument at fault.
        field: &'static str,
        /// Why it was refused.
        reason: Cow<'static, str>,
    },

    /// A payload or result is larger than the store's `max_payload_bytes`.
    #[error("{field} of {size} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// `payload` or `result`.
        field: &'static str,
        /// The size given.
        size: usize,
        /// The store's limit.
        max: usize,
    },

    /// The operation does not apply to the job in its current state, for example
    /// `retry` on a job that is not dead or cancelled (CONTRACT A2).
    #[error("cannot {operation} job {id}: it is {state}")]
    InvalidState {
        /// The job the call was about.
        id: JobId,
        /// The job's state when the call was refused.
        state: JobState,
        /// The operation refused.
        operation: &'static str,
    },

    /// A reopen named a generation the job has left: another reopen won (CONTRACT D3,
    /// D4). Nothing was changed; read the job's steps again to see what it holds now.
    #[error("cannot reopen job {id} at generation {expected}: it is at generation {current}")]
    StaleGeneration {
        /// The job the call was about.
        id: JobId,
        /// The generation the call named.
        expected: u64,
        /// The job's generation.
        current: u64,
    },

    /// No schedule of this name exists in the namespace (CONTRACT S1).
    #[error("schedule {name:?} not found")]
    ScheduleNotFound {
        /// The name asked for.
        name: String,
    },

    /// No worker of this id is registered in the namespace (CONTRACT W2).
    #[error("worker {id:?} not found")]
    WorkerNotFound {
        /// The id asked for.
        id: String,
    },

    /// The backend could not be reached or timed out. The caller may retry; the
    /// operation may or may not have been applied.
    #[error("backend unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The driver's error, if any.
        #[source]
        source: Option<SharedError>,
    },

    /// A stored record could not be read. Reported, never a panic.
    #[error("corrupt record for {what}: {reason}")]
    Corrupt {
        /// What record (a job id or key).
        what: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The operation belongs to a [capability](crate::capability) the backend does not
    /// declare. Nothing was done; asking again will not help.
    #[error("not supported: the backend does not declare the {capability} capability")]
    Unsupported {
        /// The capability the operation belongs to.
        capability: Capability,
    },

    /// Any other backend failure.
    #[error("backend error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The driver's error.
        #[source]
        source: Option<SharedError>,
    },
}

impl Error {
    /// An invalid-input error naming `field`.
    pub fn invalid(field: &'static str, reason: impl Into<Cow<'static, str>>) -> Self {
        Error::InvalidInput {
            field,
            reason: reason.into(),
        }
    }

    /// An unavailable error wrapping a driver error.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(SharedError::from(source.into())),
        }
    }

    /// A backend error wrapping a driver error.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(SharedError::from(source.into())),
        }
    }

    /// The error for an operation of `capability` on a backend that does not declare it.
    pub fn unsupported(capability: Capability) -> Self {
        Error::Unsupported { capability }
    }

    /// A corrupt-record error.
    pub fn corrupt(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Whether trying the same call again may succeed: true only for
    /// [`Error::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Whether this is [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether this is [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// The field named by an [`Error::InvalidInput`] or [`Error::PayloadTooLarge`].
    pub fn invalid_field(&self) -> Option<&'static str> {
        match self {
            Error::InvalidInput { field, .. } | Error::PayloadTooLarge { field, .. } => Some(field),
            _ => None,
        }
    }
}

impl From<ParseJobIdError> for Error {
    fn from(err: ParseJobIdError) -> Self {
        Error::invalid("id", err.reason)
    }
}

impl From<ParseJobStateError> for Error {
    fn from(err: ParseJobStateError) -> Self {
        Error::invalid("state", format!("unknown state {:?}", err.text))
    }
}

/// The result of every store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_is_retryable() {
        let io = std::io::Error::other("reset");
        assert!(Error::unavailable("connection reset", io).is_retryable());
        assert!(!Error::invalid("queue", "empty").is_retryable());
        assert!(!Error::corrupt("job", "bad state").is_retryable());
    }

    #[test]
    fn invalid_input_names_the_field() {
        let err = Error::invalid("queue", "must not be empty");
        assert_eq!(err.invalid_field(), Some("queue"));
        assert_eq!(err.to_string(), "invalid queue: must not be empty");
    }

    #[test]
    fn parse_errors_become_invalid_input_with_the_same_words() {
        let id = "not-an-id".parse::<JobId>().expect_err("not an id");
        let err = Error::from(id);
        assert_eq!(err.invalid_field(), Some("id"));
        assert_eq!(err.to_string(), id.to_string());

        let state = "Queued"
            .parse::<JobState>()
            .expect_err("names are lower-case");
        let err = Error::from(state.clone());
        assert_eq!(err.invalid_field(), Some("state"));
        assert_eq!(err.to_string(), state.to_string());
    }
}
