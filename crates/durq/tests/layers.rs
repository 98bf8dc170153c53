//! The layers the facade ships: what they record, through a real store.

use std::io::Write;
use std::sync::{Arc, Mutex};

use durq::layers::{MetricsLayer, TracingLayer};
use durq::{LeaseToken, NewJob, Store, StoreSettings};

/// Everything the subscriber wrote, shared with the writer it hands out.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn memory_store() -> Store {
    match durq_memory::MemoryBackend::new(StoreSettings::default()) {
        Ok(backend) => Store::new(backend),
        Err(err) => panic!("memory store: {err}"),
    }
}

#[tokio::test]
async fn the_tracing_layer_names_each_call_and_its_failure() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("durq::store=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Layers stack: metrics inside, tracing outside.
    let store = memory_store().layer(MetricsLayer).layer(TracingLayer);
    let id = store
        .enqueue(NewJob::new("traced"))
        .await
        .expect("enqueue")
        .id;
    let stale = store.complete(id, LeaseToken::new(99), None).await;
    assert!(
        stale.is_err_and(|e| e.is_lease_lost()),
        "the job is not running"
    );
    // A read passes through untouched and opens no span.
    store.get(id).await.expect("get");

    let logged = captured.text();
    assert!(
        logged.contains("jobs.store{op=\"complete\"") && logged.contains(&id.to_string()),
        "the failed complete is logged in its span, with the job id:\n{logged}"
    );
    assert!(
        logged.contains("store call failed") && logged.contains("lease lost"),
        "the failure and its reason are logged:\n{logged}"
    );
    assert!(
        !logged.contains("op=\"get\""),
        "reads open no span:\n{logged}"
    );
}

/// A backend that can be reopened: the memory store behind a wrapper that counts its
/// reopenings, each a new wrapper over the same namespace.
#[derive(Debug)]
struct Reopenable {
    inner: Arc<dyn durq_core::Backend>,
    reopened: Arc<std::sync::atomic::AtomicUsize>,
}

#[durq_core::async_trait]
impl durq_core::LayeredBackend for Reopenable {
    fn inner(&self) -> &dyn durq_core::Backend {
        &*self.inner
    }

    async fn reopen(&self) -> durq::Result<Option<Arc<dyn durq_core::Backend>>> {
        self.reopened
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Some(Arc::new(Reopenable {
            inner: Arc::clone(&self.inner),
            reopened: Arc::clone(&self.reopened),
        })))
    }
}

/// Counts the enqueues it sees.
#[derive(Debug)]
struct CountEnqueues {
    inner: Arc<dyn durq_core::Backend>,
    seen: Arc<std::sync::atomic::AtomicUsize>,
}

#[durq_core::async_trait]
impl durq_core::LayeredBackend for CountEnqueues {
    fn inner(&self) -> &dyn durq_core::Backend {
        &*self.inner
    }

    async fn enqueue(&self, job: NewJob, now: durq::Timestamp) -> durq::Result<durq::Enqueued> {
        self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.enqueue(job, now).await
    }
}

#[tokio::test]
async fn a_reopened_store_keeps_the_layers_its_handle_added() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let reopened = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let base = Reopenable {
        inner: Arc::clone(memory_store().backend()),
        reopened: Arc::clone(&reopened),
    };
    let counting = Arc::clone(&seen);
    let store = Store::new(base).layer(move |inner| {
        Arc::new(CountEnqueues {
            inner,
            seen: Arc::clone(&counting),
        }) as Arc<dyn durq_core::Backend>
    });
    let again = store
        .reopen()
        .await
        .expect("reopen")
        .expect("the base reopens");
    assert_eq!(
        reopened.load(Ordering::SeqCst),
        1,
        "the base was reopened once"
    );
    let id = again.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the layer was added again");
    // The same namespace: the first handle sees the job.
    assert_eq!(store.get(id).await.expect("get").queue, "q");

    // A store that needs no runtime is not reopened: it serves any runtime as it is.
    assert!(memory_store().reopen().await.expect("reopen").is_none());
    // Nor is a layer built outside `Store::layer`, which cannot be rebuilt.
    let opaque = Store::from(store.backend().clone());
    assert!(opaque.reopen().await.expect("reopen").is_none());
}
