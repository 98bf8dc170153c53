//! `GET /`: every queue with its counts, lag and throughput, the charts, and the live
//! workers.

use std::time::{Duration, Instant};

use axum::http::Uri;
use axum::response::Response;
use durq::{JobState, QueueOverview, WorkerInfo};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::charts;
use crate::format;
use crate::history::{self, Sample};
use crate::input::Params;
use crate::layout::{self, action_button, View};
use crate::pages::{list_href, notice, queue_href, workers, Notice, NOTICE_FIELDS};
use crate::problem::Problem;

/// `GET /`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    let params = Params::query(query, &NOTICE_FIELDS)?;
    let done = Notice::from_params(&params)?;
    let store = &ctx.app.store;
    let (queues, live) = tokio::join!(store.queues(), store.workers());
    let (queues, live) = (queues?, live?);
    let samples = ctx.app.history.samples();
    let body = html! {
        h1 { "Queues" }
        (notice(done))
        (queue_table(ctx, &queues, &samples))
        h2 { "The last " (format::duration(ctx.app.history.window)) }
        (charts_of(&samples, None, ctx.app.history.window))
        h2 { a href=(ctx.href("/workers")) { "Live workers" } " " span class="muted" { (live.len()) } }
        (worker_summary(ctx, &live))
    };
    let view = View::live("Overview", body);
    Ok(match done {
        Some(_) => view.refresh_to(ctx.home()),
        None => view,
    })
}

/// The throughput and lag charts of every queue, or of `only`.
pub(crate) fn charts_of(samples: &[Sample], only: Option<&str>, window: Duration) -> Markup {
    let now = Instant::now();
    let window = window.as_secs_f64();
    html! {
        div class="charts" {
            (charts::line_chart("Throughput", "jobs succeeded per second",
                &history::throughput(samples, now, only), window))
            (charts::line_chart("Lag", "seconds the oldest ready job has waited",
                &history::lag(samples, now, only), window))
        }
    }
}

fn queue_table(ctx: &Ctx, queues: &[QueueOverview], samples: &[Sample]) -> Markup {
    if queues.is_empty() {
        return html! { p class="muted" { "No queue holds a job yet." } };
    }
    html! {
        table id="queues" {
            thead { tr {
                th { "Queue" } th { "" }
                th class="num" { "Waiting" } th class="num" { "Ready" } th class="num" { "Scheduled" } th class="num" { "Running" }
                th class="num" { "Succeeded" } th class="num" { "Dead" } th class="num" { "Cancelled" }
                th class="num" { "Lag" } th class="num" { "Done/s, 1 min" }
                @if ctx.can_act() { th { "" } }
            } }
            tbody {
                @for q in queues {
                    @let s = &q.stats;
                    tr data-queue=(q.queue) {
                        td { a href=(queue_href(ctx, &q.queue)) { (q.queue) } }
                        td { @if s.paused { span class="badge paused" { "paused" } } }
                        (count_cell(ctx, &q.queue, s.waiting, JobState::Waiting))
                        (count_cell(ctx, &q.queue, s.ready, JobState::Queued))
                        (count_cell(ctx, &q.queue, s.scheduled, JobState::Queued))
                        (count_cell(ctx, &q.queue, s.running, JobState::Running))
                        (count_cell(ctx, &q.queue, s.succeeded, JobState::Succeeded))
                        (count_cell(ctx, &q.queue, s.dead, JobState::Dead))
                        (count_cell(ctx, &q.queue, s.cancelled, JobState::Cancelled))
                        td class="num" { (q.lag.map_or_else(|| "–".to_owned(), format::duration)) }
                        td class="num" {
                            (history::recent_rate(samples, &q.queue, Duration::from_secs(60))
                                .map_or_else(|| "–".to_owned(), format::number))
                        }
                        @if ctx.can_act() {
                            td { (pause_button(ctx, &q.queue, s.paused)) }
                        }
                    }
                }
            }
        }
    }
}

fn count_cell(ctx: &Ctx, queue: &str, count: u64, state: JobState) -> Markup {
    html! {
        td class="num" {
            @if count == 0 { span class="muted" { "0" } }
            @else { a href=(list_href(ctx, queue, Some(state))) { (count) } }
        }
    }
}

/// The button that pauses `queue`, or resumes it when it is paused.
pub(crate) fn pause_button(ctx: &Ctx, queue: &str, paused: bool) -> Markup {
    if paused {
        action_button(
            ctx,
            "/queue/resume",
            &[("queue", queue)],
            "Resume",
            "primary",
        )
    } else {
        action_button(ctx, "/queue/pause", &[("queue", queue)], "Pause", "")
    }
}

fn worker_summary(ctx: &Ctx, live: &[WorkerInfo]) -> Markup {
    const SHOWN: usize = 10;
    html! {
        (workers::table(ctx, &live[..live.len().min(SHOWN)]))
        @if live.len() > SHOWN {
            p { a href=(ctx.href("/workers")) { "All " (live.len()) " workers" } }
        }
    }
}
