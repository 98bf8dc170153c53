//! `GET /schedules`: the periodic jobs, with their cadence and next tick.

use axum::http::Uri;
use axum::response::Response;
use durq::{Cadence, CatchUp, ScheduleRecord};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::Params;
use crate::layout::{self, View};
use crate::pages::queue_href;
use crate::problem::Problem;

/// `GET /schedules`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    Params::query(query, &[])?;
    let schedules = ctx.app.store.schedules().await?;
    let body = html! {
        h1 { "Schedules" " " span class="muted" { (schedules.len()) } }
        (table(ctx, &schedules))
    };
    Ok(View::live("Schedules", body))
}

/// A table of `schedules`.
pub(crate) fn table(ctx: &Ctx, schedules: &[ScheduleRecord]) -> Markup {
    if schedules.is_empty() {
        return html! { p class="muted" { "No schedule is stored." } };
    }
    let now = ctx.app.store.now();
    html! {
        table id="schedules" {
            thead { tr {
                th { "Schedule" } th { "Cadence" } th { "Missed ticks" } th { "Queue" }
                th { "Enabled" } th { "Last tick" } th { "Next tick" }
            } }
            tbody {
                @for record in schedules {
                    @let s = &record.schedule;
                    tr {
                        td { (s.name) }
                        td class="mono" { (cadence(&s.cadence)) }
                        td { (catch_up(s.catch_up)) }
                        td { a href=(queue_href(ctx, &s.job.queue)) { (s.job.queue) } }
                        td { @if record.enabled { "yes" } @else { span class="badge" { "disabled" } } }
                        td title=(format::timestamp(record.last_tick)) {
                            (format::relative(now, record.last_tick))
                        }
                        td {
                            @match record.next_tick {
                                Some(next) => span title=(format::timestamp(next)) { (format::relative(now, next)) },
                                None => span class="muted" { "none" },
                            }
                        }
                    }
                }
            }
        }
    }
}

fn cadence(cadence: &Cadence) -> String {
    match cadence {
        Cadence::Cron {
            expression,
            time_zone,
        } => format!("{expression} ({time_zone})"),
        Cadence::Every(every) => format!("every {}", format::duration(*every)),
    }
}

fn catch_up(policy: CatchUp) -> String {
    match policy {
        CatchUp::Skip { grace } => format!("skip (fire if under {} late)", format::duration(grace)),
        CatchUp::Latest => "fire the latest".to_owned(),
        CatchUp::All { max } => format!("fire all (at most {max})"),
    }
}
