//! `GET /queue?name=Q`: one queue, its counts and charts, the workers serving it, the
//! schedules feeding it, and its actions (pause or resume, retry every dead job).

use axum::http::Uri;
use axum::response::Response;
use durq::{JobState, QueueOverview, QueueStats};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::{self, Params};
use crate::layout::{self, View};
use crate::pages::overview::{charts_of, pause_button};
use crate::pages::{list_href, notice, queue_href, schedules, workers, Notice, NOTICE_FIELDS};
use crate::problem::Problem;

/// `GET /queue?name=Q`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    let mut fields = vec!["name"];
    fields.extend(NOTICE_FIELDS);
    let params = Params::query(query, &fields)?;
    let name = input::queue(params.require("name")?)?;
    let done = Notice::from_params(&params)?;
    let store = &ctx.app.store;
    let (queues, live, schedules) =
        tokio::join!(store.queues(), store.workers(), store.schedules());
    let overview = match queues?.into_iter().find(|q| q.queue == name) {
        Some(overview) => overview,
        // No job and not paused: its counts are all zero.
        None => QueueOverview::new(name.clone(), store.stats(&name).await?, None),
    };
    let serving: Vec<_> = live?
        .into_iter()
        .filter(|w| w.queues.contains(&name))
        .collect();
    let feeding: Vec<_> = schedules?
        .into_iter()
        .filter(|s| s.schedule.job.queue == name)
        .collect();
    let stats = &overview.stats;
    let samples = ctx.app.history.samples();
    let body = html! {
        h1 {
            "Queue " span class="mono" { (name) } " "
            @if stats.paused { span class="badge paused" id="queue-paused" { "paused" } }
        }
        (notice(done))
        (counts(ctx, &name, stats))
        p {
            "Lag: " strong { (overview.lag.map_or_else(|| "none (no job is ready)".to_owned(), format::duration)) }
        }
        @if store.supports(durq::Capability::FlowControl) {
            p id="queue-limits" {
                "Limits: " strong { (overview.limits) }
                " (" span class="mono" { "durq limits set" } " changes them)"
            }
        }
        div class="actions" {
            (pause_button(ctx, &name, stats.paused))
            @if ctx.can_act() && stats.dead > 0 {
                a href=(ctx.href_query("/queue/retry-dead", &[("name", &name)])) {
                    "Retry all " (stats.dead) " dead jobs…"
                }
            }
            a href=(list_href(ctx, &name, None)) { "All its jobs" }
        }
        (charts_of(&samples, Some(&name), ctx.app.history.window))
        h2 { "Workers serving it" }
        (workers::table(ctx, &serving))
        h2 { "Schedules feeding it" }
        (schedules::table(ctx, &feeding))
    };
    let view = View::live(format!("Queue {name}"), body);
    Ok(match done {
        Some(_) => view.refresh_to(queue_href(ctx, &name)),
        None => view,
    })
}

fn counts(ctx: &Ctx, queue: &str, stats: &QueueStats) -> Markup {
    let rows = [
        ("Ready", stats.ready, JobState::Queued),
        ("Scheduled", stats.scheduled, JobState::Queued),
        ("Running", stats.running, JobState::Running),
        ("Succeeded", stats.succeeded, JobState::Succeeded),
        ("Dead", stats.dead, JobState::Dead),
        ("Cancelled", stats.cancelled, JobState::Cancelled),
    ];
    html! {
        table id="counts" {
            thead { tr { @for (label, _, _) in rows { th class="num" { (label) } } } }
            tbody { tr {
                @for (label, count, state) in rows {
                    td class="num" data-count=(label.to_ascii_lowercase()) {
                        a href=(list_href(ctx, queue, Some(state))) { (count) }
                    }
                }
            } }
        }
    }
}
