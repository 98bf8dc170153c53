//! The actions: `POST` forms that change the store (retry, cancel, pause, resume,
//! retry every dead job of a queue, set a queue's limits) and the login that opens them
//! to a browser.
//!
//! Every action passes the same gate before its input is even parsed: a read-only
//! dashboard answers 403; a dashboard with a token answers 401 without it; a request a
//! browser says came from another site, or a form without this dashboard's CSRF token,
//! gets 403. Then every field is parsed and checked (400 when one is wrong), and only
//! then is the store called. A refused request writes nothing.

use axum::extract::Path;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::Uri;
use axum::response::{IntoResponse, Redirect, Response};
use durq::{JobId, JobState, ListQuery};
use maud::html;

use crate::app::Ctx;
use crate::input::{self, Params};
use crate::layout::{self, csrf_field, View};
use crate::pages::{job_href, queue_href, Notice};
use crate::problem::Problem;
use crate::security::{self, Auth, CSRF_FIELD, LOGIN_COOKIE};

/// The most dead jobs one "retry every dead job" retries; a larger queue takes more
/// presses.
pub(crate) const MAX_RETRY_ALL: usize = 100_000;

/// Checks that the request may act and came from the dashboard's own form, then
/// parses its body, which may hold only `fields` (and the CSRF token).
fn gate(ctx: &Ctx, headers: &HeaderMap, body: &[u8], fields: &[&str]) -> Result<Params, Problem> {
    if ctx.app.read_only {
        return Err(Problem::forbidden(
            "This dashboard is read-only: it takes no action.",
        ));
    }
    if matches!(ctx.auth, Auth::Bearer | Auth::WrongBearer) {
        // Throttled before the token counts, so a refused guess and a right one look
        // the same while guessing is throttled.
        ctx.check_throttle()?;
    }
    if ctx.auth == Auth::WrongBearer {
        ctx.count_failure();
    }
    if !ctx.auth.allowed() {
        return Err(Problem::needs_login());
    }
    security::check_same_origin(headers)?;
    let form = parse_form(headers, body, fields)?;
    // A bearer token is not sent by a browser on its own, so it needs no CSRF token.
    if ctx.auth != Auth::Bearer {
        security::check_csrf(&form, &ctx.app.csrf)?;
    }
    Ok(form)
}

/// The urlencoded body, with only `fields` and the CSRF token in it.
fn parse_form(headers: &HeaderMap, body: &[u8], fields: &[&str]) -> Result<Params, Problem> {
    let urlencoded = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|mime| {
            mime.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !urlencoded && !body.is_empty() {
        return Err(Problem::new(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "an action takes an application/x-www-form-urlencoded form",
        ));
    }
    let mut allowed = vec![CSRF_FIELD];
    allowed.extend_from_slice(fields);
    Params::parse(body, &allowed)
}

/// 303 to `path` with `notice`.
fn see_other(path: String, notice: Notice) -> Response {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(notice.query())
        .finish();
    let sep = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{path}{sep}{query}")).into_response()
}

fn answer(ctx: &Ctx, result: Result<Response, Problem>) -> Response {
    result.unwrap_or_else(|problem| layout::problem_response(ctx, &problem))
}

/// `POST /jobs/{id}/retry`: queues a dead or cancelled job again (CONTRACT A2).
pub(crate) async fn retry(
    ctx: Ctx,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = async {
        gate(&ctx, &headers, &body, &[])?;
        let id = input::job_id(&id)?;
        ctx.app.store.retry(id).await?;
        Ok(see_other(job_href(&ctx, id), Notice::Retried))
    };
    answer(&ctx, result.await)
}

/// The form fields of a reopen.
const REOPEN_FIELDS: [&str; 3] = ["csrf", "step", "generation"];

/// `POST /jobs/{id}/retry-from` with `step` and `generation`: reopens an ended job
/// from one of its durable steps (CONTRACT D3). The generation is the one the page
/// showed, so a reopen made from a page read before another reopen is refused (D4)
/// and writes nothing.
pub(crate) async fn retry_from(
    ctx: Ctx,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = async {
        let form = gate(&ctx, &headers, &body, &REOPEN_FIELDS)?;
        let id = input::job_id(&id)?;
        let step = form.require("step")?;
        let generation: u64 = form
            .require("generation")?
            .parse()
            .map_err(|_| Problem::bad_request("generation must be a count"))?;
        ctx.app.store.retry_from(id, step, generation).await?;
        Ok(see_other(job_href(&ctx, id), Notice::Reopened))
    };
    answer(&ctx, result.await)
}

/// `POST /jobs/{id}/cancel`: cancels a queued job, asks a running one to stop
/// (CONTRACT A1).
pub(crate) async fn cancel(
    ctx: Ctx,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = async {
        gate(&ctx, &headers, &body, &[])?;
        let id: JobId = input::job_id(&id)?;
        let notice = match ctx.app.store.cancel(id).await? {
            JobState::Running => Notice::CancelRequested,
            _ => Notice::Cancelled,
        };
        Ok(see_other(job_href(&ctx, id), notice))
    };
    answer(&ctx, result.await)
}

/// `POST /queue/pause` with `queue`: no claim takes its jobs until it is resumed
/// (CONTRACT Q1).
pub(crate) async fn pause(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    set_paused(ctx, headers, body, true).await
}

/// `POST /queue/resume` with `queue`.
pub(crate) async fn resume(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    set_paused(ctx, headers, body, false).await
}

async fn set_paused(
    ctx: Ctx,
    headers: HeaderMap,
    body: axum::body::Bytes,
    paused: bool,
) -> Response {
    let result = async {
        let form = gate(&ctx, &headers, &body, &["queue"])?;
        let queue = input::queue(form.require("queue")?)?;
        if paused {
            ctx.app.store.pause(&queue).await?;
        } else {
            ctx.app.store.resume(&queue).await?;
        }
        let notice = if paused {
            Notice::Paused
        } else {
            Notice::Resumed
        };
        Ok(see_other(queue_href(&ctx, &queue), notice))
    };
    answer(&ctx, result.await)
}

/// The fields of the limits form (`POST /queue/limits`).
pub(crate) const LIMITS_FIELDS: [&str; 6] = [
    "queue",
    "max_running",
    "max_running_per_key",
    "max_starts",
    "max_starts_per_key",
    "fair_shares",
];

/// `POST /queue/limits` with `queue` and the limits (CONTRACT K3): each field empty or
/// absent for none, the counts at least 1, the rates `STARTS/PERIOD` (`10/1s`),
/// `fair_shares` present for fair shares. Replaces the queue's limits; all empty
/// removes them.
pub(crate) async fn set_limits(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let result = async {
        let form = gate(&ctx, &headers, &body, &LIMITS_FIELDS)?;
        let queue = input::queue(form.require("queue")?)?;
        let limits = input::limits(&form)?;
        ctx.app.store.set_limits(&queue, limits).await?;
        Ok(see_other(queue_href(&ctx, &queue), Notice::LimitsSet))
    };
    answer(&ctx, result.await)
}

/// `GET /queue/retry-dead?name=Q`: asks to confirm retrying every dead job of `Q`.
pub(crate) async fn confirm_retry_dead(ctx: Ctx, uri: Uri) -> Response {
    let view = async {
        if ctx.app.read_only {
            return Err(Problem::forbidden(
                "This dashboard is read-only: it takes no action.",
            ));
        }
        if !ctx.auth.allowed() {
            return Err(Problem::needs_login());
        }
        let params = Params::query(uri.query(), &["name"])?;
        let queue = input::queue(params.require("name")?)?;
        let dead = ctx.app.store.stats(&queue).await?.dead;
        let body = html! {
            h1 { "Retry every dead job of " span class="mono" { (queue) } "?" }
            @if dead == 0 {
                p { "The queue holds no dead job." }
                p { a href=(queue_href(&ctx, &queue)) { "Back to the queue" } }
            } @else {
                p {
                    "The queue holds " strong id="dead-count" { (dead) } " dead jobs. Each is "
                    "queued again with its attempts reset; workers serving the queue run them "
                    "at once."
                }
                form method="post" action=(ctx.href("/queue/retry-dead")) {
                    (csrf_field(&ctx))
                    input type="hidden" name="queue" value=(queue);
                    input type="hidden" name="confirm" value="yes";
                    div class="actions" {
                        button type="submit" class="danger" { "Retry " (dead) " dead jobs" }
                        a href=(queue_href(&ctx, &queue)) { "Cancel" }
                    }
                }
            }
        };
        Ok(View::still(format!("Retry the dead jobs of {queue}"), body))
    };
    layout::render(&ctx, view.await)
}

/// `POST /queue/retry-dead` with `queue` and `confirm=yes`: retries every dead job of
/// the queue (up to [`MAX_RETRY_ALL`]).
pub(crate) async fn retry_dead(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let result = async {
        let form = gate(&ctx, &headers, &body, &["queue", "confirm"])?;
        let queue = input::queue(form.require("queue")?)?;
        if form.get("confirm") != Some("yes") {
            return Err(Problem::bad_request(
                "retrying every dead job needs confirm=yes (the confirmation page sends it)",
            ));
        }
        let (retried, skipped) = retry_every_dead(&ctx.app.store, &queue).await?;
        Ok(see_other(
            queue_href(&ctx, &queue),
            Notice::RetriedDead { retried, skipped },
        ))
    };
    answer(&ctx, result.await)
}

/// Retries the dead jobs of `queue` as they stood when the call began: the ids are
/// read first, so a job that dies again meanwhile is not retried twice. A job no
/// longer dead (retried by someone else, purged) is skipped.
async fn retry_every_dead(store: &durq::Store, queue: &str) -> Result<(u64, u64), Problem> {
    let mut ids = Vec::new();
    let mut cursor = None;
    loop {
        let mut page = ListQuery::new(queue)
            .state(JobState::Dead)
            .limit(input::MAX_PAGE);
        page.cursor = cursor;
        let page = store.list(page).await?;
        ids.extend(page.jobs.iter().map(|job| job.id));
        match page.next {
            Some(next) if ids.len() < MAX_RETRY_ALL => cursor = Some(next),
            _ => break,
        }
    }
    ids.truncate(MAX_RETRY_ALL);
    let (mut retried, mut skipped) = (0, 0);
    for id in ids {
        match store.retry(id).await {
            Ok(()) => retried += 1,
            Err(durq::Error::InvalidState { .. } | durq::Error::NotFound { .. }) => skipped += 1,
            Err(err) => {
                let mut problem = Problem::from(err);
                problem.detail = format!(
                    "{} (after retrying {retried} and skipping {skipped})",
                    problem.detail
                );
                return Err(problem);
            }
        }
    }
    Ok((retried, skipped))
}

/// `GET /login`: the form that gives a browser the token.
pub(crate) async fn login_page(ctx: Ctx, uri: Uri) -> Response {
    let view = async {
        Params::query(uri.query(), &[])?;
        let body = if ctx.app.read_only {
            html! { h1 { "Log in" } p { "This dashboard is read-only: there is nothing to log in for." } }
        } else if ctx.app.token.is_none() {
            html! { h1 { "Log in" } p { "This dashboard needs no token: its actions are open." } }
        } else {
            html! {
                h1 { "Log in" }
                @if ctx.auth.allowed() { p { "This browser is logged in already." } }
                p { "The dashboard's actions need its token. This browser keeps it in a cookie "
                    "for this dashboard only, until you log out or close the browser." }
                form method="post" action=(ctx.href("/login")) {
                    (csrf_field(&ctx))
                    label { "Token " input type="password" name="token" autocomplete="current-password" autofocus; }
                    " " button type="submit" class="primary" { "Log in" }
                }
            }
        };
        Ok(View::still("Log in", body))
    };
    layout::render(&ctx, view.await)
}

/// `POST /login` with `token`: sets the login cookie when the token is right.
pub(crate) async fn login(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let result = async {
        let Some(expected) = ctx.app.token.as_deref().filter(|_| !ctx.app.read_only) else {
            return Err(Problem::forbidden("This dashboard takes no token."));
        };
        security::check_same_origin(&headers)?;
        let form = parse_form(&headers, &body, &["token"])?;
        security::check_csrf(&form, &ctx.app.csrf)?;
        let given = form.require("token")?;
        ctx.check_throttle()?;
        if !security::constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            ctx.count_failure();
            return Err(Problem {
                login: true,
                ..Problem::forbidden("That is not the dashboard's token.")
            });
        }
        let cookie = format!(
            "{LOGIN_COOKIE}={}; Path={}; HttpOnly; SameSite=Strict{}",
            security::cookie_value(expected),
            ctx.home(),
            secure(&ctx)
        );
        with_cookie(see_other(ctx.home(), Notice::LoggedIn), &cookie)
    };
    answer(&ctx, result.await)
}

/// `POST /logout`: forgets the login cookie.
pub(crate) async fn logout(ctx: Ctx, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let result = async {
        security::check_same_origin(&headers)?;
        let form = parse_form(&headers, &body, &[])?;
        security::check_csrf(&form, &ctx.app.csrf)?;
        let cookie = format!(
            "{LOGIN_COOKIE}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0{}",
            ctx.home(),
            secure(&ctx)
        );
        with_cookie(see_other(ctx.home(), Notice::LoggedOut), &cookie)
    };
    answer(&ctx, result.await)
}

/// The cookie attribute that keeps the login cookie to HTTPS, when the dashboard is
/// told it is served over TLS.
fn secure(ctx: &Ctx) -> &'static str {
    if ctx.app.secure_cookie {
        "; Secure"
    } else {
        ""
    }
}

fn with_cookie(mut response: Response, cookie: &str) -> Result<Response, Problem> {
    let value = HeaderValue::from_str(cookie)
        .map_err(|_| Problem::bad_request("the dashboard's path cannot be put in a cookie"))?;
    response.headers_mut().append(header::SET_COOKIE, value);
    Ok(response)
}
