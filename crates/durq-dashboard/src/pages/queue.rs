//! `GET /queue?name=Q`: one queue, its counts and charts, the workers serving it, the
//! schedules feeding it, and its actions (pause or resume, retry every dead job).

use axum::http::Uri;
use axum::response::Response;
use durq::{FlowStatus, JobState, QueueLimits, QueueOverview, QueueStats, Timestamp};
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
    let flow_control = store.supports(durq::Capability::FlowControl);
    let (queues, live, schedules, flow) =
        tokio::join!(store.queues(), store.workers(), store.schedules(), async {
            match flow_control {
                true => store.flow_status(&name).await.map(Some),
                false => Ok(None),
            }
        });
    let flow = flow?;
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
        @if let Some(flow) = &flow {
            p id="queue-limits" {
                "Limits: " strong { (overview.limits) }
                " (" span class="mono" { "durq limits set" } " changes them too)"
            }
            (flow_status(flow, store.settings().now()))
            (limits_form(ctx, &name, &overview.limits))
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

/// What the queue's limits hold back now (CONTRACT K3): the keys at their running
/// limit, when the queue's rate admits its next start, and the keys at their rate.
fn flow_status(flow: &FlowStatus, now: Timestamp) -> Markup {
    let until = |at: Timestamp| format::duration(at.duration_since(now));
    html! {
        ul id="flow-status" {
            li id="keys-at-limit" {
                "Keys at their running limit: "
                @if flow.keys_at_limit.is_empty() { "none" }
                @for (n, (key, running)) in flow.keys_at_limit.iter().enumerate() {
                    @if n > 0 { ", " }
                    span class="mono" { (key) } " (" (running) " running)"
                }
            }
            li id="next-start" {
                "Next start: "
                @match flow.next_start {
                    Some(at) => { "in " (until(at)) " (the queue's rate is used up)" }
                    None => { "now (the queue's rate, if any, admits one)" }
                }
            }
            li id="keys-at-rate" {
                "Keys at their rate: "
                @if flow.keys_rate_limited.is_empty() { "none" }
                @for (n, (key, at)) in flow.keys_rate_limited.iter().enumerate() {
                    @if n > 0 { ", " }
                    span class="mono" { (key) } " (next start in " (until(*at)) ")"
                }
            }
        }
    }
}

/// The form that replaces the queue's limits (`POST /queue/limits`), filled with the
/// current ones; an empty field is no limit.
fn limits_form(ctx: &Ctx, queue: &str, limits: &QueueLimits) -> Markup {
    if !ctx.can_act() {
        return html! {};
    }
    let count = |limit: Option<u32>| limit.map(|n| n.to_string()).unwrap_or_default();
    let rate = |rate: Option<durq::Rate>| rate.map(|r| r.to_string()).unwrap_or_default();
    html! {
        form method="post" action=(ctx.href("/queue/limits")) id="limits-form" {
            (layout::csrf_field(ctx))
            input type="hidden" name="queue" value=(queue);
            label { "Most running " input type="number" min="1" name="max_running" value=(count(limits.max_running)); }
            " "
            label { "per key " input type="number" min="1" name="max_running_per_key" value=(count(limits.max_running_per_key)); }
            " "
            label { "Most starts " input type="text" size="8" placeholder="10/1s" name="max_starts" value=(rate(limits.max_starts)); }
            " "
            label { "per key " input type="text" size="8" placeholder="1/1m" name="max_starts_per_key" value=(rate(limits.max_starts_per_key)); }
            " "
            label { input type="checkbox" name="fair_shares" checked[limits.fair_shares]; " fair shares by key" }
            " "
            button type="submit" { "Save limits" }
        }
    }
}

fn counts(ctx: &Ctx, queue: &str, stats: &QueueStats) -> Markup {
    let rows = [
        ("Waiting", stats.waiting, JobState::Waiting),
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
