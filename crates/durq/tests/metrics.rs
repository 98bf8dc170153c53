//! The runtime's metrics reach an installed recorder under their documented names.
//!
//! One test per binary: a global recorder can be installed once per process.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq::layers::MetricsLayer;
use durq::telemetry::*;
use durq::{
    Backoff, Bytes, JobContext, JobError, JobState, ManualClock, NewJob, Store, StoreSettings,
    Worker,
};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// `name{label=value,...}` of a metric key.
fn key_text(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

struct Samples(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(value);
    }
}

/// A gauge's value, as the bits of an `f64`.
#[derive(Default)]
struct GaugeValue(AtomicU64);

impl metrics::GaugeFn for GaugeValue {
    fn increment(&self, value: f64) {
        self.set(self.get() + value);
    }

    fn decrement(&self, value: f64) {
        self.set(self.get() - value);
    }

    fn set(&self, value: f64) {
        self.0
            .store(value.to_bits(), std::sync::atomic::Ordering::SeqCst);
    }
}

impl GaugeValue {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[derive(Default)]
struct TestRecorder {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<String, Arc<GaugeValue>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
}

impl Recorder for &'static TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        Counter::from_arc(counters.entry(key_text(key)).or_default().clone())
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        Gauge::from_arc(gauges.entry(key_text(key)).or_default().clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        let samples = histograms
            .entry(key_text(key))
            .or_insert_with(|| Arc::new(Samples(Mutex::new(Vec::new()))));
        Histogram::from_arc(samples.clone())
    }
}

impl TestRecorder {
    fn counter(&self, key: &str) -> u64 {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn gauge(&self, key: &str) -> Option<f64> {
        self.gauges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(|g| g.get())
    }

    fn samples(&self, key: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }
}

async fn wait_for_state(store: &Store, id: durq::JobId, state: JobState) {
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let reached = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            ticker.tick().await;
            if store.get(id).await.expect("get").state == state {
                return;
            }
        }
    })
    .await;
    assert!(reached.is_ok(), "job {id} never became {state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_metrics_are_recorded_under_their_names() {
    let recorder: &'static TestRecorder = Box::leak(Box::default());
    metrics::set_global_recorder(recorder).expect("the only recorder of this process");

    let clock = ManualClock::default();
    let settings = StoreSettings::default().clock(Arc::new(clock.clone()));
    // The layer counts what is enqueued through this handle and its clones, the
    // worker's included.
    let store =
        Store::new(durq_memory::MemoryBackend::new(settings).expect("store")).layer(MetricsLayer);

    // A paused queue the worker serves: its job stays ready, and its lag grows with the
    // clock (CONTRACT A7).
    store.pause("p").await.expect("pause");
    store.enqueue(NewJob::new("p")).await.expect("enqueue");
    let mut ids = HashMap::new();
    for what in ["ok", "permanent", "panic", "retry", "stuck"] {
        let job = NewJob::new("m").payload(what).max_attempts(2);
        ids.insert(what, store.enqueue(job).await.expect("enqueue").id);
    }
    // A duplicate by idempotency key is not a new job and is not counted.
    store
        .enqueue(NewJob::new("m").payload("ok").idempotency_key("k"))
        .await
        .expect("enqueue");
    let dup = store
        .enqueue(NewJob::new("m").payload("ok").idempotency_key("k"))
        .await
        .expect("enqueue");
    assert!(!dup.created);
    ids.insert("dedup", dup.id);
    // So is one in a batch, beside a new job that is.
    let batch = store
        .enqueue_batch(vec![
            NewJob::new("m").payload("ok"),
            NewJob::new("m").payload("ok").idempotency_key("k"),
        ])
        .await
        .expect("enqueue_batch");
    assert_eq!(
        batch.iter().map(|e| e.created).collect::<Vec<_>>(),
        [true, false]
    );
    ids.insert("batched", batch[0].id);

    let worker = Worker::builder(store.clone())
        .heartbeat_interval(Duration::from_millis(20))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_millis(100))
        .queue_gauges_interval(Duration::from_millis(20))
        .backoff(Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(10),
            jitter: 0.0,
        })
        .handler("m", |_ctx: JobContext, payload: Bytes| async move {
            match &payload[..] {
                b"permanent" => Err(JobError::permanent("no")),
                b"panic" => panic!("boom"),
                b"retry" => Err(JobError::retry("later")),
                b"stuck" => std::future::pending().await,
                _ => Ok(()),
            }
        })
        .handler("p", |_ctx: JobContext, _payload: Bytes| async { Ok(()) })
        .build()
        .expect("build");
    let handle = worker.spawn();

    wait_for_state(&store, ids["ok"], JobState::Succeeded).await;
    wait_for_state(&store, ids["dedup"], JobState::Succeeded).await;
    wait_for_state(&store, ids["batched"], JobState::Succeeded).await;
    wait_for_state(&store, ids["permanent"], JobState::Dead).await;
    // The panic and the retryable failure are retried once after the backoff, then
    // dead (max_attempts 2).
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    for _ in 0..4000 {
        ticker.tick().await;
        let panic = store.get(ids["panic"]).await.expect("get");
        let retry = store.get(ids["retry"]).await.expect("get");
        if panic.attempts == 1
            && panic.state == JobState::Queued
            && retry.attempts == 1
            && retry.state == JobState::Queued
        {
            break;
        }
    }
    clock.advance(Duration::from_secs(10));
    wait_for_state(&store, ids["panic"], JobState::Dead).await;
    wait_for_state(&store, ids["retry"], JobState::Dead).await;
    // Depth and lag as the store counts them now: the stuck job runs, the paused
    // queue's job has waited the 10 s the clock moved.
    let g = |key: String| recorder.gauge(&key);
    let expected = [
        (format!("{JOBS_QUEUE_DEPTH}{{queue=m,state=running}}"), 1.0),
        (format!("{JOBS_QUEUE_DEPTH}{{queue=m,state=ready}}"), 0.0),
        (format!("{JOBS_QUEUE_LAG}{{queue=m}}"), 0.0),
        (format!("{JOBS_QUEUE_DEPTH}{{queue=p,state=ready}}"), 1.0),
        (
            format!("{JOBS_QUEUE_DEPTH}{{queue=p,state=scheduled}}"),
            0.0,
        ),
        (format!("{JOBS_QUEUE_LAG}{{queue=p}}"), 10.0),
    ];
    let gauges_read = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            ticker.tick().await;
            if expected
                .iter()
                .all(|(key, value)| g(key.clone()) == Some(*value))
            {
                return;
            }
        }
    })
    .await;
    assert!(
        gauges_read.is_ok(),
        "queue gauges: {:?}",
        expected
            .iter()
            .map(|(key, _)| (key.clone(), g(key.clone())))
            .collect::<Vec<_>>()
    );
    handle.shutdown().await;
    assert_eq!(
        store.get(ids["stuck"]).await.expect("get").state,
        JobState::Queued
    );

    let c = |name: &str| recorder.counter(&format!("{name}{{queue=m}}"));
    assert_eq!(
        c(JOBS_ENQUEUED),
        7,
        "five jobs, the first of three with one idempotency key, and the batch's new job: \
         created jobs, not duplicates"
    );
    assert_eq!(
        c(JOBS_CLAIMED),
        9,
        "ok, dedup, batched, permanent, stuck, panic x2, retry x2"
    );
    assert_eq!(c(JOBS_SUCCEEDED), 3);
    assert_eq!(c(JOBS_FAILED), 5, "permanent, panic x2, retry x2");
    assert_eq!(c(JOBS_RETRIED), 2);
    assert_eq!(c(JOBS_DEAD), 3);
    assert_eq!(c(JOBS_PANICKED), 2);
    assert_eq!(c(JOBS_RELEASED), 1);
    assert_eq!(c(JOBS_LEASE_LOST), 0);
    assert_eq!(
        recorder
            .samples(&format!("{JOBS_PICKUP_LATENCY}{{queue=m}}"))
            .len(),
        9
    );
    let run_times = recorder.samples(&format!("{JOBS_RUN_TIME}{{queue=m}}"));
    assert_eq!(run_times.len(), 9);
    assert!(run_times.iter().all(|s| *s >= 0.0));
    // Pickup latency is on the store clock: every claim here happened at its job's
    // run_at (the retries' run_at was moved 10 s on, and so was the clock).
    let pickups = recorder.samples(&format!("{JOBS_PICKUP_LATENCY}{{queue=m}}"));
    assert!(pickups.iter().all(|s| *s == 0.0), "{pickups:?}");
}
