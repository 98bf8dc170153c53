//! The whole suite on a layer over the memory store: a layer costs its own code only.
//! The layer is the one issue #30 asks to be short: it logs every claim and counts
//! every completion, batched ones included, in 15 lines after `cargo fmt`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durq_conformance::HarnessExt;
use durq_core::{async_trait, Backend, ClaimRequest, ClaimedJob, Completion, LayeredBackend};
use durq_core::{ManualClock, NewJob, Result, Store, StoreSettings, Timestamp};

// The layer: from here to the end of its impl, 15 lines.
#[derive(Debug)]
struct Audit(Arc<dyn Backend>, AtomicU64);
#[async_trait]
impl LayeredBackend for Audit {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }
    async fn claim(&self, r: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.0.claim(r, now).await.inspect(|j| eprintln!("{j:?}"))
    }
    async fn complete_batch(&self, c: Vec<Completion>, t: Timestamp) -> Result<Vec<Result<()>>> {
        self.1.fetch_add(c.len() as u64, Ordering::Relaxed);
        self.0.complete_batch(c, t).await
    }
}

async fn harness() -> Option<impl durq_conformance::Harness> {
    let audit = |inner| Arc::new(Audit(inner, AtomicU64::new(0))) as Arc<dyn Backend>;
    Some(durq_memory::MemoryServer::new().layered(audit))
}
durq_conformance::conformance_tests!(harness);

/// Issue #30's trap: a layer that counted completions in `complete` missed the worker's,
/// which come in batches. A layer sees completions only in `complete_batch` now, a
/// single `complete` as a batch of one, so its count is every completion stored.
#[tokio::test]
async fn a_layer_counts_single_and_batched_completions_alike() {
    let clock = ManualClock::default();
    let settings = StoreSettings::default()
        .namespace(durq_conformance::unique_namespace("audit"))
        .clock(Arc::new(clock.clone()));
    let server = durq_memory::MemoryServer::new();
    let audit = Arc::new(Audit(
        Arc::new(server.open(settings).expect("open")),
        AtomicU64::new(0),
    ));
    let store = Store::from(Arc::clone(&audit) as Arc<dyn Backend>);
    for _ in 0..5 {
        store.enqueue(NewJob::new("q")).await.expect("enqueue");
    }
    let request = ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(5);
    let claimed = store.claim(request).await.expect("claim");
    assert_eq!(claimed.len(), 5);
    let (first, rest) = claimed.split_first().expect("five jobs");
    store
        .complete(first.id(), first.token(), None)
        .await
        .expect("a single completion");
    let batch = rest
        .iter()
        .map(|job| Completion::new(job.id(), job.token(), None))
        .collect();
    let answers = store.complete_batch(batch).await.expect("a batch");
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        audit.1.load(Ordering::Relaxed),
        5,
        "the layer saw the single completion and the four batched ones"
    );
    assert_eq!(store.stats("q").await.expect("stats").succeeded, 5);
}
