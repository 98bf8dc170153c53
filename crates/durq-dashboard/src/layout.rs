//! The frame of every page: head, navigation, the refresh, the stylesheet, and the page
//! of a refused request.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use crate::app::Ctx;
use crate::problem::Problem;
use crate::security::CSRF_FIELD;

/// Seconds between refreshes of a live page.
pub(crate) const REFRESH_SECS: u32 = 5;

/// What a page handler renders.
pub(crate) struct View {
    pub title: String,
    /// Whether the page reloads itself every [`REFRESH_SECS`].
    pub refresh: bool,
    /// Where the reload goes, when not to the same address (a page showing what an
    /// action did reloads without the notice).
    pub refresh_to: Option<String>,
    pub body: Markup,
}

impl View {
    /// A page that reloads itself.
    pub fn live(title: impl Into<String>, body: Markup) -> Self {
        View {
            title: title.into(),
            refresh: true,
            refresh_to: None,
            body,
        }
    }

    /// A page that stays as it is (forms to fill in, confirmations).
    pub fn still(title: impl Into<String>, body: Markup) -> Self {
        View {
            title: title.into(),
            refresh: false,
            refresh_to: None,
            body,
        }
    }

    /// Reloads to `url` instead of the page's own address.
    pub fn refresh_to(mut self, url: String) -> Self {
        self.refresh_to = Some(url);
        self
    }
}

/// The answer to a page request: the page, or the problem in the same frame.
pub(crate) fn render(ctx: &Ctx, view: Result<View, Problem>) -> Response {
    match view {
        Ok(view) => html_response(StatusCode::OK, frame(ctx, &view)),
        Err(problem) => problem_response(ctx, &problem),
    }
}

/// The problem in the frame of the dashboard.
pub(crate) fn problem_response(ctx: &Ctx, problem: &Problem) -> Response {
    let view = View::still(problem.title(), problem_body(Some(ctx), problem));
    html_response(problem.status, frame(ctx, &view))
}

fn html_response(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

fn problem_body(ctx: Option<&Ctx>, problem: &Problem) -> Markup {
    html! {
        h1 { (problem.status.as_u16()) " " (problem.title()) }
        p class="problem" { (problem.detail) }
        @if let Some(ctx) = ctx {
            p {
                @if problem.login {
                    a href=(ctx.href("/login")) { "Log in" } " · "
                }
                a href=(ctx.home()) { "Back to the overview" }
            }
        }
    }
}

impl IntoResponse for Problem {
    /// The problem on a bare page (no frame: the dashboard's path is not known).
    fn into_response(self) -> Response {
        let body = html! {
            (DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { (self.title()) } }
                body { (problem_body(None, &self)) }
            }
        };
        html_response(self.status, body)
    }
}

/// The page around `view`'s body.
fn frame(ctx: &Ctx, view: &View) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if view.refresh {
                    @match &view.refresh_to {
                        Some(url) => meta http-equiv="refresh" content={ (REFRESH_SECS) "; url=" (url) };,
                        None => meta http-equiv="refresh" content=(REFRESH_SECS);,
                    }
                }
                title { (view.title) " · jobs" }
                link rel="stylesheet" href=(ctx.href("/assets/dashboard.css"));
            }
            body {
                header class="top" {
                    a class="brand" href=(ctx.home()) { "durq" }
                    nav {
                        a href=(ctx.home()) { "Overview" }
                        a href=(ctx.href("/jobs")) { "Jobs" }
                        a href=(ctx.href("/workers")) { "Workers" }
                        a href=(ctx.href("/schedules")) { "Schedules" }
                        a href=(ctx.href("/events")) { "Events" }
                        a href=(ctx.href("/metrics")) { "Metrics" }
                    }
                    div class="mode" {
                        @if ctx.app.read_only {
                            span class="badge" { "read-only" }
                        } @else if ctx.needs_login() {
                            a href=(ctx.href("/login")) { "Log in to act" }
                        } @else if ctx.app.token.is_some() {
                            form method="post" action=(ctx.href("/logout")) class="inline" {
                                (csrf_field(ctx))
                                button type="submit" class="link" { "Log out" }
                            }
                        }
                        @if view.refresh {
                            span class="muted" { " refreshes every " (REFRESH_SECS) " s" }
                        }
                    }
                }
                main { (view.body) }
            }
        }
    }
}

/// The hidden CSRF field every action form carries.
pub(crate) fn csrf_field(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name=(CSRF_FIELD) value=(ctx.app.csrf); }
}

/// A button that posts `fields` to `path`, or nothing when the request may not act.
pub(crate) fn action_button(
    ctx: &Ctx,
    path: &str,
    fields: &[(&str, &str)],
    label: &str,
    class: &str,
) -> Markup {
    if !ctx.can_act() {
        return html! {};
    }
    html! {
        form method="post" action=(ctx.href(path)) class="inline" {
            (csrf_field(ctx))
            @for (name, value) in fields {
                input type="hidden" name=(name) value=(value);
            }
            button type="submit" class=(class) { (label) }
        }
    }
}

/// `GET /assets/dashboard.css`.
pub(crate) async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLESHEET,
    )
        .into_response()
}

const STYLESHEET: &str = r#"
:root { --fg: #1f2328; --muted: #57606a; --line: #d0d7de; --bg: #f6f8fa; --accent: #1f6feb;
        --bad: #d1242f; --good: #1a7f37; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
header.top { display: flex; align-items: center; gap: 24px; padding: 10px 24px;
             background: #24292f; color: #fff; }
header.top a { color: #fff; }
header.top .brand { font-weight: 700; font-size: 16px; }
header.top nav { display: flex; gap: 16px; }
header.top .mode { margin-left: auto; display: flex; gap: 8px; align-items: center; }
header.top .muted { color: #afb8c1; }
main { padding: 16px 24px 48px; max-width: 1280px; }
h1 { font-size: 22px; margin: 8px 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--bg); font-weight: 600; white-space: nowrap; }
td.id { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.fields { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.fields dt { color: var(--muted); }
dl.fields dd { margin: 0; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 10px; overflow: auto;
      max-height: 420px; white-space: pre-wrap; word-break: break-all; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.muted { color: var(--muted); }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px;
         border: 1px solid var(--line); background: var(--bg); color: var(--fg); }
.state-queued { background: #ddf4ff; } .state-running { background: #fff8c5; }
.state-succeeded { background: #dafbe1; } .state-dead { background: #ffebe9; }
.state-cancelled { background: #eaeef2; } .paused { background: #fff1e5; }
.outcome-running { background: #fff8c5; } .outcome-succeeded { background: #dafbe1; }
.outcome-failed { background: #ffebe9; } .outcome-expired { background: #fff1e5; }
.outcome-released { background: #eaeef2; }
.tags { display: inline-flex; flex-wrap: wrap; gap: 4px; }
.tag { display: inline-block; padding: 0 6px; border-radius: 4px; border: 1px solid #54aeff;
       background: #ddf4ff; color: var(--fg); font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
       font-size: 12px; white-space: nowrap; }
a.tag:hover { text-decoration: none; border-color: var(--accent); }
td.error details summary { cursor: pointer; }
td.error details pre { margin: 6px 0 0; max-height: 240px; }
p.scope { display: flex; flex-wrap: wrap; gap: 16px; color: var(--muted); margin: 0 0 8px; }
.notice { padding: 8px 12px; border: 1px solid #54aeff; background: #ddf4ff; margin: 8px 0; }
.problem { padding: 8px 12px; border: 1px solid #ff8182; background: #ffebe9; }
form.inline { display: inline; margin: 0; }
form.filters { display: flex; gap: 12px; align-items: end; flex-wrap: wrap; margin: 8px 0 12px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
form.filters fieldset.states { display: flex; gap: 8px; border: none; padding: 0; margin: 0; }
form.filters fieldset.states legend { font-size: 12px; color: var(--muted); padding: 0; }
form.filters label.check { flex-direction: row; align-items: center; gap: 3px; font-size: 13px;
                           color: var(--fg); }
button { font: inherit; padding: 3px 12px; border-radius: 6px; border: 1px solid var(--line);
         background: var(--bg); cursor: pointer; }
button.danger { color: #fff; background: var(--bad); border-color: var(--bad); }
button.primary { color: #fff; background: var(--good); border-color: var(--good); }
button.link { border: none; background: none; color: #fff; padding: 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 16px; }
figure.chart { margin: 0; padding: 10px; border: 1px solid var(--line); background: #fff; }
figure.chart figcaption { font-weight: 600; margin-bottom: 4px; }
figure.chart .unit { font-weight: 400; color: var(--muted); }
figure.chart svg.plot { width: 100%; height: auto; display: block; }
ul.legend svg { width: 12px; height: 12px; vertical-align: -1px; }
ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 16px; padding: 0; margin: 6px 0 0; }
.actions { display: flex; gap: 8px; margin: 12px 0; }
.pager { display: flex; gap: 16px; margin: 12px 0; }
"#;
