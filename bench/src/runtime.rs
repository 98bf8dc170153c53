//! Draining with the worker runtime of the `durq` crate: one worker, a no-op handler.

use std::sync::Arc;
use std::time::Instant;

use durq::{JobContext, JobError, Store, Worker, WorkerHandle};

use crate::drain::DrainConfig;
use crate::progress::{payload_index, Progress};

/// A running worker.
pub struct RuntimeWorkers {
    handle: WorkerHandle,
}

/// Starts one worker over `store` at `config.concurrency`, its other settings at their
/// defaults (claim batch, heartbeats, reclaim and purge intervals).
pub async fn start(
    store: Store,
    config: &DrainConfig,
    progress: Arc<Progress>,
) -> Result<RuntimeWorkers, String> {
    let worker = Worker::builder(store)
        .concurrency(config.concurrency)
        .lease(config.lease)
        .handler(
            config.queue.clone(),
            move |_ctx: JobContext, payload: bytes::Bytes| {
                let progress = Arc::clone(&progress);
                async move {
                    progress.started(payload_index(&payload));
                    std::hint::black_box(&payload);
                    // Counted when the handler returns; the run's clock stops only once
                    // the worker has shut down, so after every completion was stored.
                    progress.done();
                    Ok::<(), JobError>(())
                }
            },
        )
        .build()
        .map_err(|e| format!("worker: {e}"))?;
    Ok(RuntimeWorkers {
        handle: worker.spawn(),
    })
}

impl RuntimeWorkers {
    /// Shuts the worker down gracefully; returns when it has, every outcome stored.
    pub async fn stop(self) -> Result<Option<Instant>, String> {
        self.handle.shutdown().await;
        Ok(Some(Instant::now()))
    }
}
