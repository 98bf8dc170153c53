//! `GET /metrics`: the queues' depth and lag in the Prometheus text format, read from
//! the store at each scrape, so the dashboard keeps no state for it.
//!
//! The names are the runtime's (`jobs::telemetry`): `jobs_queue_depth{queue,state}` for
//! every state (`ready`, `scheduled`, `running`, `succeeded`, `dead`, `cancelled`) and
//! `jobs_queue_lag_seconds{queue}`; beside them `jobs_queue_paused{queue}` and
//! `jobs_workers`, the live workers.

use std::fmt::Write as _;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use jobs::telemetry::{JOBS_QUEUE_DEPTH, JOBS_QUEUE_LAG};
use jobs::{QueueOverview, WorkerInfo};

use crate::app::Ctx;

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub(crate) async fn scrape(ctx: Ctx) -> Response {
    let store = &ctx.app.store;
    let (queues, live) = tokio::join!(store.queues(), store.workers());
    match (queues, live) {
        (Ok(queues), Ok(live)) => (
            [(header::CONTENT_TYPE, CONTENT_TYPE)],
            exposition(&queues, &live),
        )
            .into_response(),
        (Err(err), _) | (_, Err(err)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, CONTENT_TYPE)],
            format!("# the store could not be read: {err}\n"),
        )
            .into_response(),
    }
}

/// The text of one scrape.
pub(crate) fn exposition(queues: &[QueueOverview], live: &[WorkerInfo]) -> String {
    let mut out = String::with_capacity(256 + queues.len() * 400);
    let _ = writeln!(out, "# HELP {JOBS_QUEUE_DEPTH} Jobs of a queue, by state.");
    let _ = writeln!(out, "# TYPE {JOBS_QUEUE_DEPTH} gauge");
    for q in queues {
        let s = &q.stats;
        for (state, count) in [
            ("ready", s.ready),
            ("scheduled", s.scheduled),
            ("running", s.running),
            ("succeeded", s.succeeded),
            ("dead", s.dead),
            ("cancelled", s.cancelled),
        ] {
            let _ = writeln!(
                out,
                "{JOBS_QUEUE_DEPTH}{{queue=\"{}\",state=\"{state}\"}} {count}",
                label(&q.queue)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP {JOBS_QUEUE_LAG} Seconds the oldest ready job of a queue has waited; 0 when none is ready."
    );
    let _ = writeln!(out, "# TYPE {JOBS_QUEUE_LAG} gauge");
    for q in queues {
        let lag = q.lag.map_or(0.0, |lag| lag.as_secs_f64());
        let _ = writeln!(
            out,
            "{JOBS_QUEUE_LAG}{{queue=\"{}\"}} {lag}",
            label(&q.queue)
        );
    }
    let _ = writeln!(
        out,
        "# HELP jobs_queue_paused Whether a queue is paused (1) or not (0)."
    );
    let _ = writeln!(out, "# TYPE jobs_queue_paused gauge");
    for q in queues {
        let _ = writeln!(
            out,
            "jobs_queue_paused{{queue=\"{}\"}} {}",
            label(&q.queue),
            u8::from(q.stats.paused)
        );
    }
    let _ = writeln!(out, "# HELP jobs_workers Workers registered in the store.");
    let _ = writeln!(out, "# TYPE jobs_workers gauge");
    let _ = writeln!(out, "jobs_workers {}", live.len());
    out
}

/// A label value, escaped as the format asks (queue names never need it today).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
