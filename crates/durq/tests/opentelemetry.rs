//! One OpenTelemetry trace follows a job (CONTRACT E12, feature `opentelemetry`): the
//! request span that enqueued it, the `jobs.enqueue` span, and the `job` span of each
//! attempt, exported by the SDK's in-memory exporter.
//!
//! The subscriber is process-wide (the worker's tasks run on other threads), so this
//! file holds one test.

use std::time::Duration;

use durq::{Bytes, JobContext, JobError, JobOutcome, NewJob, Store, StoreSettings, Worker};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;

const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_follows_a_job_from_its_enqueue_to_each_attempt() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("jobs-test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let server = durq_memory::MemoryServer::new();
    let settings = StoreSettings::default().namespace("otel");
    let open = || -> Store {
        Store::new(server.open(settings.clone()).expect("open"))
            .layer(durq::layers::TraceContextLayer)
    };
    let store = open();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let (event_tx, mut event_rx) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(open())
        .worker_id("otel-worker")
        .poll_interval(Duration::from_millis(10))
        .on_event(move |event| {
            let _ = event_tx.send(matches!(event.outcome(), JobOutcome::Succeeded));
        })
        .handler("traced", move |ctx: JobContext, _payload: Bytes| {
            let done_tx = done_tx.clone();
            async move {
                tracing::info!("inside the handler");
                let _ = done_tx.send(ctx.attempt());
                if ctx.attempt() == 1 {
                    Err(JobError::retry_after("once more", Duration::ZERO))
                } else {
                    Ok(())
                }
            }
        })
        .build()
        .expect("a worker");

    let request = tracing::info_span!("request");
    let id = {
        let _entered = request.enter();
        store
            .enqueue(NewJob::new("traced"))
            .await
            .expect("enqueue")
            .id
    };
    drop(request);
    let stored = store.get(id).await.expect("get");
    let traceparent = stored
        .trace_context
        .clone()
        .expect("the enqueue stamped a trace context");

    let handle = worker.spawn();
    for attempt in [1, 2] {
        let ran = tokio::time::timeout(PATIENCE, done_rx.recv()).await;
        assert_eq!(ran.ok().flatten(), Some(attempt), "attempt {attempt} ran");
    }
    let mut outcomes = Vec::new();
    while outcomes.last() != Some(&true) {
        let heard = tokio::time::timeout(PATIENCE, event_rx.recv()).await;
        outcomes.push(
            heard
                .ok()
                .flatten()
                .expect("the worker reports each outcome"),
        );
    }
    assert_eq!(outcomes, [false, true], "a failure, then the success");
    handle.shutdown().await;
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
    let request = named("request");
    let enqueue = named("jobs.enqueue");
    let attempts = named("job");
    assert_eq!(
        (request.len(), enqueue.len(), attempts.len()),
        (1, 1, 2),
        "one request, one enqueue, one span per attempt; got {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let trace_id = request[0].span_context.trace_id();
    assert_eq!(
        enqueue[0].parent_span_id,
        request[0].span_context.span_id(),
        "the enqueue span is the request's child"
    );
    assert_eq!(
        traceparent,
        format!(
            "00-{:032x}-{:016x}-01",
            trace_id,
            enqueue[0].span_context.span_id()
        ),
        "the job stores the enqueue span's traceparent"
    );
    for attempt in &attempts {
        assert_eq!(
            attempt.span_context.trace_id(),
            trace_id,
            "each attempt's span is in the request's trace"
        );
        assert_eq!(
            attempt.parent_span_id,
            enqueue[0].span_context.span_id(),
            "each attempt's span is a child of the enqueue span"
        );
        assert_ne!(attempt.parent_span_id, SpanId::INVALID);
    }
}
