//! `GET /metrics`: the queues' depth and lag in the Prometheus (OpenMetrics) text
//! format, read from the store at each scrape, so the dashboard keeps no state for it.
//! `prometheus-client` writes the format, escaping included.
//!
//! The names are the runtime's (`durq::telemetry`): `jobs_queue_depth{queue,state}` for
//! every state (`ready`, `scheduled`, `running`, `succeeded`, `dead`, `cancelled`) and
//! `jobs_queue_lag_seconds{queue}`; beside them `jobs_queue_paused{queue}`,
//! `jobs_queue_limit{queue,limit}` (the limits a queue has on its running jobs,
//! `max_running` and `max_running_per_key`, CONTRACT K3, and `fair_shares` at 1 for a
//! queue with fair shares, K5; none for a limit not set),
//! `jobs_queue_rate_limit{queue,limit}` (its rates, `max_starts` and
//! `max_starts_per_key`, CONTRACT K4, in starts per second), for the queues with limits
//! what they hold back (`jobs_queue_keys_at_limit{queue}`, at most 100 counted, and
//! `jobs_queue_rate_wait_seconds{queue}`, K3) and `jobs_workers`, the live workers. Every series carries a `namespace` label, so the
//! dashboards of several namespaces can be scraped into one Prometheus.

use std::sync::atomic::AtomicU64;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use durq::telemetry::{JOBS_QUEUE_DEPTH, JOBS_QUEUE_LAG};
use durq::{FlowStatus, QueueOverview, Timestamp, WorkerInfo};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::app::Ctx;

/// The content type of the OpenMetrics text format, which Prometheus reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueState {
    namespace: String,
    queue: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Queue {
    namespace: String,
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLimit {
    namespace: String,
    queue: String,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Namespace {
    namespace: String,
}

/// `GET /metrics`.
pub(crate) async fn scrape(ctx: Ctx) -> Response {
    let store = &ctx.app.store;
    let (queues, live) = tokio::join!(store.queues(), store.workers());
    let namespace = &store.settings().namespace;
    let failed = |text: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text,
        )
            .into_response()
    };
    let (queues, live) = match (queues, live) {
        (Ok(queues), Ok(live)) => (queues, live),
        (Err(err), _) | (_, Err(err)) => {
            return failed(format!("# the store could not be read: {err}\n"))
        }
    };
    // What the limits hold back, read only for the queues that have some.
    let mut flows = Vec::new();
    for q in queues.iter().filter(|q| !q.limits.is_unlimited()) {
        match store.flow_status(&q.queue).await {
            Ok(flow) => flows.push((q.queue.clone(), flow)),
            Err(err) => return failed(format!("# the store could not be read: {err}\n")),
        }
    }
    match exposition(namespace, &queues, &flows, store.settings().now(), &live) {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(err) => failed(format!("# the metrics could not be written: {err}\n")),
    }
}

/// The text of one scrape.
pub(crate) fn exposition(
    namespace: &str,
    queues: &[QueueOverview],
    flows: &[(String, FlowStatus)],
    now: Timestamp,
    live: &[WorkerInfo],
) -> Result<String, std::fmt::Error> {
    let depth = Family::<QueueState, Gauge>::default();
    let lag = Family::<Queue, Gauge<f64, AtomicU64>>::default();
    let paused = Family::<Queue, Gauge>::default();
    let limits = Family::<QueueLimit, Gauge>::default();
    let rates = Family::<QueueLimit, Gauge<f64, AtomicU64>>::default();
    let keys_at_limit = Family::<Queue, Gauge>::default();
    let rate_wait = Family::<Queue, Gauge<f64, AtomicU64>>::default();
    for (queue, flow) in flows {
        let labels = Queue {
            namespace: namespace.to_owned(),
            queue: queue.clone(),
        };
        keys_at_limit
            .get_or_create(&labels)
            .set(i64::try_from(flow.keys_at_limit.len()).unwrap_or(i64::MAX));
        rate_wait.get_or_create(&labels).set(
            flow.next_start
                .map_or(0.0, |at| at.duration_since(now).as_secs_f64()),
        );
    }
    let workers = Family::<Namespace, Gauge>::default();
    for q in queues {
        let s = &q.stats;
        for (state, count) in [
            ("waiting", s.waiting),
            ("ready", s.ready),
            ("scheduled", s.scheduled),
            ("running", s.running),
            ("succeeded", s.succeeded),
            ("dead", s.dead),
            ("cancelled", s.cancelled),
        ] {
            let labels = QueueState {
                namespace: namespace.to_owned(),
                queue: q.queue.clone(),
                state,
            };
            depth
                .get_or_create(&labels)
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let queue = Queue {
            namespace: namespace.to_owned(),
            queue: q.queue.clone(),
        };
        lag.get_or_create(&queue)
            .set(q.lag.map_or(0.0, |lag| lag.as_secs_f64()));
        paused.get_or_create(&queue).set(i64::from(q.stats.paused));
        for (limit, value) in [
            ("max_running", q.limits.max_running),
            ("max_running_per_key", q.limits.max_running_per_key),
            ("fair_shares", q.limits.fair_shares.then_some(1)),
        ] {
            if let Some(value) = value {
                let labels = QueueLimit {
                    namespace: namespace.to_owned(),
                    queue: q.queue.clone(),
                    limit,
                };
                limits.get_or_create(&labels).set(i64::from(value));
            }
        }
        for (limit, rate) in [
            ("max_starts", q.limits.max_starts),
            ("max_starts_per_key", q.limits.max_starts_per_key),
        ] {
            if let Some(rate) = rate {
                let labels = QueueLimit {
                    namespace: namespace.to_owned(),
                    queue: q.queue.clone(),
                    limit,
                };
                rates
                    .get_or_create(&labels)
                    .set(f64::from(rate.starts) / rate.per.as_secs_f64());
            }
        }
    }
    workers
        .get_or_create(&Namespace {
            namespace: namespace.to_owned(),
        })
        .set(i64::try_from(live.len()).unwrap_or(i64::MAX));

    let mut registry = Registry::default();
    registry.register(JOBS_QUEUE_DEPTH, "Jobs of a queue, by state", depth);
    registry.register(
        JOBS_QUEUE_LAG,
        "Seconds the oldest ready job of a queue has waited; 0 when none is ready",
        lag,
    );
    registry.register(
        "jobs_queue_paused",
        "Whether a queue is paused (1) or not (0)",
        paused,
    );
    registry.register(
        "jobs_queue_limit",
        "A queue's limit on its running jobs, in all or per concurrency key",
        limits,
    );
    registry.register(
        "jobs_queue_rate_limit",
        "A queue's limit on its starts, in all or per concurrency key, in starts per second",
        rates,
    );
    registry.register(
        "jobs_queue_keys_at_limit",
        "Concurrency keys of a queue at their running limit (at most 100 counted)",
        keys_at_limit,
    );
    registry.register(
        "jobs_queue_rate_wait_seconds",
        "Seconds until a queue's rate admits its next start; 0 when it admits one now",
        rate_wait,
    );
    registry.register("jobs_workers", "Workers registered in the store", workers);
    let mut out = String::with_capacity(256 + queues.len() * 600);
    encode(&mut out, &registry)?;
    Ok(out)
}
