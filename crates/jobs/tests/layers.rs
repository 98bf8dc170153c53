//! The layers the facade ships: what they record, through a real store.

use std::io::Write;
use std::sync::{Arc, Mutex};

use jobs::layers::{MetricsLayer, TracingLayer};
use jobs::{LeaseToken, NewJob, Store, StoreSettings};

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
    match jobs_memory::MemoryStore::new(StoreSettings::default()) {
        Ok(backend) => Store::new(backend),
        Err(err) => panic!("memory store: {err}"),
    }
}

#[tokio::test]
async fn the_tracing_layer_names_each_call_and_its_failure() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("jobs::store=debug")
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
