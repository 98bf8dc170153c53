//! Typed jobs: the type names its queue once, for the producer and for the handler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs::{JobState, NewJob, Store, StoreSettings, TypedJob, Worker};
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
    match jobs_memory::MemoryStore::new(settings) {
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
