//! The pages: one module each, every one a handler that checks its input, reads the
//! store, and renders a [`View`](crate::layout::View).

pub(crate) mod events;
pub(crate) mod job;
pub(crate) mod list;
pub(crate) mod overview;
pub(crate) mod queue;
pub(crate) mod schedules;
pub(crate) mod workers;

use axum::http::Uri;
use axum::response::Response;
use durq::{Job, JobState, Tags, Timestamp};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::input::Params;
use crate::layout;
use crate::problem::Problem;

/// Any path the dashboard does not have.
pub(crate) async fn not_found(ctx: Ctx, uri: Uri) -> Response {
    let problem = Problem::not_found(format!(
        "The dashboard has no page at {}.",
        uri.path().chars().take(200).collect::<String>()
    ));
    layout::problem_response(&ctx, &problem)
}

/// What an action did, shown on the page it leads back to. Only these fixed texts
/// (and counts) are shown, so a link cannot make the dashboard say anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    Retried,
    Reopened,
    CancelRequested,
    Cancelled,
    Paused,
    Resumed,
    LimitsSet,
    RetriedDead { retried: u64, skipped: u64 },
    LoggedIn,
    LoggedOut,
}

/// The query fields a page showing notices takes.
pub(crate) const NOTICE_FIELDS: [&str; 3] = ["notice", "n", "skipped"];

impl Notice {
    /// The notice a page's query names, if any.
    pub fn from_params(params: &Params) -> Result<Option<Notice>, Problem> {
        let Some(name) = params.get("notice") else {
            return Ok(None);
        };
        let count = |key: &str| -> Result<u64, Problem> {
            params.get(key).map_or(Ok(0), |text| {
                text.parse()
                    .map_err(|_| Problem::bad_request(format!("{key} must be a count")))
            })
        };
        let notice = match name {
            "retried" => Notice::Retried,
            "reopened" => Notice::Reopened,
            "cancel-requested" => Notice::CancelRequested,
            "cancelled" => Notice::Cancelled,
            "paused" => Notice::Paused,
            "resumed" => Notice::Resumed,
            "limits-set" => Notice::LimitsSet,
            "retried-dead" => Notice::RetriedDead {
                retried: count("n")?,
                skipped: count("skipped")?,
            },
            "logged-in" => Notice::LoggedIn,
            "logged-out" => Notice::LoggedOut,
            _ => return Err(Problem::bad_request("unknown notice")),
        };
        Ok(Some(notice))
    }

    /// The query fields that name this notice.
    pub fn query(self) -> Vec<(&'static str, String)> {
        let name = match self {
            Notice::Retried => "retried",
            Notice::Reopened => "reopened",
            Notice::CancelRequested => "cancel-requested",
            Notice::Cancelled => "cancelled",
            Notice::Paused => "paused",
            Notice::Resumed => "resumed",
            Notice::LimitsSet => "limits-set",
            Notice::RetriedDead { retried, skipped } => {
                return vec![
                    ("notice", "retried-dead".to_owned()),
                    ("n", retried.to_string()),
                    ("skipped", skipped.to_string()),
                ]
            }
            Notice::LoggedIn => "logged-in",
            Notice::LoggedOut => "logged-out",
        };
        vec![("notice", name.to_owned())]
    }

    fn text(self) -> String {
        match self {
            Notice::Retried => "Queued again, with its attempts reset.".to_owned(),
            Notice::Reopened => {
                "Reopened: queued again; the step and those after it run again, the ones before it are kept."
                    .to_owned()
            }
            Notice::CancelRequested => {
                "Cancel requested: the worker running it is told at its next heartbeat.".to_owned()
            }
            Notice::Cancelled => "Cancelled.".to_owned(),
            Notice::Paused => "Paused: no worker claims its jobs until it is resumed.".to_owned(),
            Notice::Resumed => "Resumed: workers claim its jobs again.".to_owned(),
            Notice::LimitsSet => "Limits saved: the next claim applies them.".to_owned(),
            Notice::RetriedDead {
                retried,
                skipped: 0,
            } => {
                format!("Retried {retried} dead jobs.")
            }
            Notice::RetriedDead { retried, skipped } => format!(
                "Retried {retried} dead jobs; {skipped} were no longer dead when their turn came."
            ),
            Notice::LoggedIn => "Logged in: actions are open to this browser.".to_owned(),
            Notice::LoggedOut => "Logged out.".to_owned(),
        }
    }
}

/// The notice, if any, as a banner.
pub(crate) fn notice(notice: Option<Notice>) -> Markup {
    html! {
        @if let Some(notice) = notice {
            p class="notice" role="status" { (notice.text()) }
        }
    }
}

/// A job's state as a badge; a queued job whose time has not come says so.
pub(crate) fn state_badge(job: &Job, now: Timestamp) -> Markup {
    let scheduled = job.state == JobState::Queued && job.run_at > now;
    html! {
        span class={ "badge state-" (job.state.as_str()) } data-state=(job.state.as_str()) {
            (job.state.as_str())
            @if scheduled { " (scheduled)" }
            @if job.cancel_requested && job.state == JobState::Running { " (cancel requested)" }
        }
    }
}

/// Tags as `key=value` chips, each a link to every job carrying it when `ctx` is
/// given; nothing for no tags.
pub(crate) fn tag_chips(ctx: Option<&Ctx>, tags: &Tags) -> Markup {
    html! {
        @if !tags.is_empty() {
            span class="tags" {
                @for (key, value) in tags {
                    @let text = format!("{key}={value}");
                    @match ctx {
                        Some(ctx) => a class="tag" data-tag=(text) href=(ctx.href_query("/jobs", &[("tag", &text)])) { (text) },
                        None => span class="tag" data-tag=(text) { (text) },
                    }
                }
            }
        }
    }
}

/// The list of `queue`'s jobs in `state` (all states for `None`).
pub(crate) fn list_href(ctx: &Ctx, queue: &str, state: Option<JobState>) -> String {
    match state {
        Some(state) => ctx.href_query("/jobs", &[("queue", queue), ("state", state.as_str())]),
        None => ctx.href_query("/jobs", &[("queue", queue)]),
    }
}

/// The page of `queue`.
pub(crate) fn queue_href(ctx: &Ctx, queue: &str) -> String {
    ctx.href_query("/queue", &[("name", queue)])
}

/// The page of job `id`.
pub(crate) fn job_href(ctx: &Ctx, id: durq::JobId) -> String {
    ctx.href(&format!("/jobs/{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_through_their_query() {
        for notice in [
            Notice::Retried,
            Notice::CancelRequested,
            Notice::Cancelled,
            Notice::Paused,
            Notice::Resumed,
            Notice::RetriedDead {
                retried: 3,
                skipped: 1,
            },
            Notice::LoggedIn,
            Notice::LoggedOut,
        ] {
            let query = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(notice.query())
                .finish();
            let params = Params::parse(query.as_bytes(), &NOTICE_FIELDS).expect("params");
            assert_eq!(Notice::from_params(&params).ok().flatten(), Some(notice));
        }
        let bogus = Params::parse(b"notice=<script>", &NOTICE_FIELDS).expect("params");
        assert!(Notice::from_params(&bogus).is_err());
        let bad_count = Params::parse(b"notice=retried-dead&n=x", &NOTICE_FIELDS).expect("params");
        assert!(Notice::from_params(&bad_count).is_err());
    }
}
