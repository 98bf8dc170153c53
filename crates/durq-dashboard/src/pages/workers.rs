//! `GET /workers`: the live workers, as they registered and last reported.

use axum::http::Uri;
use axum::response::Response;
use durq::WorkerInfo;
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::Params;
use crate::layout::{self, View};
use crate::pages::queue_href;
use crate::problem::Problem;

/// `GET /workers`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    Params::query(query, &[])?;
    let live = ctx.app.store.workers().await?;
    let body = html! {
        h1 { "Live workers" " " span class="muted" { (live.len()) } }
        p class="muted" {
            "Workers register when they start, report at every heartbeat, and remove their "
            "record when they stop; one silent for too long is reaped by the others."
        }
        (table(ctx, &live))
    };
    Ok(View::live("Workers", body))
}

/// A table of `live` workers.
pub(crate) fn table(ctx: &Ctx, live: &[WorkerInfo]) -> Markup {
    if live.is_empty() {
        return html! { p class="muted" { "No worker is registered." } };
    }
    let now = ctx.app.store.now();
    html! {
        table id="workers" {
            thead { tr {
                th { "Worker" } th { "Host" } th class="num" { "Pid" } th { "Queues" }
                th class="num" { "In flight" } th { "Started" } th { "Last seen" }
            } }
            tbody {
                @for w in live {
                    tr {
                        td class="mono" { (w.id) }
                        td { (w.host) }
                        td class="num" { (w.pid) }
                        td {
                            @for (i, queue) in w.queues.iter().enumerate() {
                                @if i > 0 { ", " }
                                a href=(queue_href(ctx, queue)) { (queue) }
                            }
                        }
                        td class="num" { (w.in_flight) " / " (w.concurrency) }
                        td title=(format::timestamp(w.started_at)) { (format::relative(now, w.started_at)) }
                        td title=(format::timestamp(w.last_seen)) { (format::relative(now, w.last_seen)) }
                    }
                }
            }
        }
    }
}
