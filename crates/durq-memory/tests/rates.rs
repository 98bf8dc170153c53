//! CONTRACT K4 behaviour of the in-memory backend beyond the shared suite: how a
//! waiting claimer learns that a rate freed a start.

use std::sync::Arc;
use std::time::Duration;

use durq_core::{ClaimRequest, ManualClock, NewJob, QueueLimits, Rate, Store, StoreSettings};
use durq_memory::MemoryServer;

fn must<T>(answer: durq_core::Result<T>, what: &str) -> T {
    match answer {
        Ok(value) => value,
        Err(err) => panic!("{what}: {err}"),
    }
}

/// A claimer waiting on a queue whose rate holds its jobs back wakes when the rate
/// frees a start (1 ms after the last, here), not at the end of its minute-long wait,
/// though nothing is enqueued meanwhile.
#[tokio::test]
async fn a_wait_ends_when_a_rate_frees_a_start() {
    let clock = ManualClock::default();
    let settings = StoreSettings::default()
        .namespace("rates")
        .clock(Arc::new(clock.clone()));
    let store = Store::new(must(MemoryServer::new().open(settings), "open"));
    let one_per_ms = QueueLimits::new().max_starts(Rate::new(1, Duration::from_millis(1)));
    must(store.set_limits("rated", one_per_ms).await, "set_limits");
    for _ in 0..2 {
        must(store.enqueue(NewJob::new("rated")).await, "enqueue");
    }
    let request = ClaimRequest::new(["rated"], "w", Duration::from_secs(30)).limit(10);
    assert_eq!(must(store.claim(request.clone()).await, "claim").len(), 1);
    assert!(must(store.claim(request.clone()).await, "claim").is_empty());

    let queues = vec!["rated".to_owned()];
    let waited = tokio::time::timeout(
        Duration::from_secs(20),
        store.wait_for_work(&queues, Duration::from_secs(60)),
    )
    .await;
    match waited {
        Ok(waited) => must(waited, "wait_for_work"),
        Err(_) => panic!("the wait outlasted the rate's window by 20 s"),
    }
    clock.advance(Duration::from_millis(1));
    assert_eq!(must(store.claim(request).await, "claim").len(), 1);
}
