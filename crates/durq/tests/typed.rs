//! Typed jobs: the type names its queue once, for the producer and for the handler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durq::{JobState, NewJob, Store, StoreSettings, TypedJob, Worker};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Resize {
    width: u32,
}

impl TypedJob for Resize {
    const QUEUE: &'static str = "images.resize";
}

fn store() -> Store {
    let settings = StoreSettings::default().namespace("typed");
    match durq_memory::MemoryBackend::new(settings) {
        Ok(backend) => Store::new(backend),
        Err(err) => panic!("memory store: {err}"),
    }
}

#[tokio::test]
async fn a_typed_job_goes_to_its_queue_and_back_to_its_handler() {
    let store = store();
    let enqueued = store
        .enqueue_typed(&Resize { width: 320 })
        .await
        .expect("enqueue");
    let job = store.get(enqueued.id).await.expect("get");
    assert_eq!(job.queue, Resize::QUEUE, "the type names the queue");
    assert_eq!(
        store
            .payload_json::<serde_json::Value>(enqueued.id)
            .await
            .expect("payload"),
        serde_json::json!({ "width": 320 })
    );

    let widths = Arc::new(AtomicU64::new(0));
    let ran = Arc::new(Notify::new());
    let (seen, done) = (Arc::clone(&widths), Arc::clone(&ran));
    let worker = Worker::builder(store.clone())
        .typed_handler(move |_ctx, job: Resize| {
            let (seen, done) = (Arc::clone(&seen), Arc::clone(&done));
            async move {
                seen.fetch_add(u64::from(job.width), Ordering::SeqCst);
                done.notify_one();
                Ok(())
            }
        })
        .build()
        .expect("worker");
    let running = worker.spawn();
    tokio::time::timeout(Duration::from_secs(30), ran.notified())
        .await
        .expect("the handler ran");
    // Shutdown returns once every outcome is stored.
    running.shutdown().await;
    assert_eq!(
        store.get(enqueued.id).await.expect("get").state,
        JobState::Succeeded
    );
    assert_eq!(
        widths.load(Ordering::SeqCst),
        320,
        "the handler got the job as a Resize"
    );
}

#[test]
fn new_job_typed_and_system_time() {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let job = NewJob::typed(&Resize { width: 1 })
        .expect("encode")
        .run_at(at);
    assert_eq!(job.queue, "images.resize");
    assert_eq!(job.run_at.map(|t| t.as_millis()), Some(1_700_000_000_000));
}

/// A type that declares what every job of it is enqueued with.
#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    order: u64,
}

impl TypedJob for Invoice {
    const QUEUE: &'static str = "billing.invoices";
    const MAX_ATTEMPTS: u32 = 7;
    const PRIORITY: i16 = 3;
    const TIMEOUT: Option<Duration> = Some(Duration::from_secs(90));
    const TAGS: &'static [(&'static str, &'static str)] = &[("team", "billing")];

    fn unique_key(&self) -> Option<String> {
        Some(format!("invoice-{}", self.order))
    }
}

#[tokio::test]
async fn a_typed_job_is_stored_with_its_types_defaults_and_one_enqueue_can_change_them() {
    let store = store();
    let first = store
        .enqueue_typed(&Invoice { order: 1 })
        .await
        .expect("enqueue");
    let job = store.get(first.id).await.expect("get");
    assert_eq!(job.queue, "billing.invoices");
    assert_eq!((job.max_attempts, job.priority), (7, 3));
    assert_eq!(job.timeout, Some(Duration::from_secs(90)));
    assert_eq!(job.tags["team"], "billing");
    assert_eq!(job.idempotency_key.as_deref(), Some("invoice-1"));

    // Unique while active: the same order again answers the job already there.
    let again = store
        .enqueue_typed(&Invoice { order: 1 })
        .await
        .expect("enqueue again");
    assert_eq!((again.id, again.created), (first.id, false));
    let other = store
        .enqueue_typed(&Invoice { order: 2 })
        .await
        .expect("another order");
    assert!(other.created);

    // One enqueue overrides a default without touching the type's.
    let urgent = NewJob::typed(&Invoice { order: 3 })
        .expect("typed")
        .priority(100)
        .max_attempts(1);
    let urgent = store.enqueue(urgent).await.expect("enqueue urgent");
    let job = store.get(urgent.id).await.expect("get");
    assert_eq!((job.priority, job.max_attempts), (100, 1));
    assert_eq!(job.tags["team"], "billing", "the rest are the type's");
}
