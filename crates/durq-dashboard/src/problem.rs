//! A request the dashboard refuses or cannot answer: a status and the words to show.

use axum::http::StatusCode;

/// Why a request failed, shown to the person who made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The status of the answer.
    pub status: StatusCode,
    /// What went wrong, in a sentence (escaped when shown).
    pub detail: String,
    /// Whether logging in would help (a token is needed).
    pub login: bool,
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            detail: detail.into(),
            login: false,
        }
    }

    /// 400: the request's input is refused; nothing was written.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 403.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::FORBIDDEN, detail)
    }

    /// 401: the action needs the dashboard's token.
    pub fn needs_login() -> Self {
        Problem {
            login: true,
            ..Problem::new(
                StatusCode::UNAUTHORIZED,
                "This action needs the dashboard's token: log in first, or send \
                 `Authorization: Bearer <token>`.",
            )
        }
    }

    /// 429: too many wrong tokens lately; the next attempt is allowed after `wait`.
    pub fn throttled(wait: std::time::Duration) -> Self {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "Too many wrong tokens lately: try again in {} s.",
                wait.as_secs().max(1)
            ),
        )
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::NOT_FOUND, detail)
    }

    /// The title of the page that shows it.
    pub fn title(&self) -> &'static str {
        self.status.canonical_reason().unwrap_or("Error")
    }
}

impl From<durq::Error> for Problem {
    fn from(err: durq::Error) -> Self {
        let status = match &err {
            durq::Error::NotFound { .. }
            | durq::Error::ScheduleNotFound { .. }
            | durq::Error::WorkerNotFound { .. } => StatusCode::NOT_FOUND,
            durq::Error::InvalidInput { .. } | durq::Error::PayloadTooLarge { .. } => {
                StatusCode::BAD_REQUEST
            }
            durq::Error::InvalidState { .. } | durq::Error::StaleGeneration { .. } => {
                StatusCode::CONFLICT
            }
            durq::Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            // A page over a capability the store lacks (an event stream, a worker
            // registry): nothing the request or a retry can change.
            durq::Error::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Problem::new(status, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_statuses() {
        let id = durq::JobId::mint(durq::Timestamp::from_millis(1_700_000_000_000));
        let cases = [
            (durq::Error::NotFound { id }, StatusCode::NOT_FOUND),
            (
                durq::Error::InvalidInput {
                    field: "queue",
                    reason: "bad".into(),
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                durq::Error::InvalidState {
                    id,
                    state: durq::JobState::Running,
                    operation: "retry",
                },
                StatusCode::CONFLICT,
            ),
            (
                durq::Error::StaleGeneration {
                    id,
                    expected: 0,
                    current: 1,
                },
                StatusCode::CONFLICT,
            ),
            (
                durq::Error::Unavailable {
                    message: "down".into(),
                    source: None,
                },
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                durq::Error::unsupported(durq::Capability::Events),
                StatusCode::NOT_IMPLEMENTED,
            ),
            (
                durq::Error::Corrupt {
                    what: "x".into(),
                    reason: "y".into(),
                },
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (err, status) in cases {
            assert_eq!(Problem::from(err).status, status);
        }
    }
}
