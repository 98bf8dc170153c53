//! The worker process: the `durq` runtime, used as any service would, over a store
//! that records what the checker needs.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use durq::{Backoff, JobContext, JobError, Worker};

use crate::history::{now_us, Event, Log};
use crate::recording::RecordingLayer;
use crate::StoreArgs;

/// The payload byte that asks a job to fail its first attempt (retryably), so every
/// run exercises retries. Written by the producer.
pub const FAIL_ONCE: &[u8] = b"fail-once";

/// Arguments of `durq-chaos worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Handlers running at once.
    #[arg(long, default_value_t = 12)]
    concurrency: usize,
    /// The most jobs per claim.
    #[arg(long, default_value_t = 16)]
    claim_batch: usize,
    /// The lease, in milliseconds.
    #[arg(long, default_value_t = 3_000)]
    lease_ms: u64,
    /// The heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// The reclaim interval, in milliseconds.
    #[arg(long, default_value_t = 500)]
    reclaim_ms: u64,
}

/// Runs the worker until standard input closes, then shuts it down gracefully.
pub async fn run(args: WorkerArgs) -> Result<(), String> {
    let log = Arc::new(
        Log::create(&args.store.run_dir, "worker")
            .map_err(|err| format!("cannot create the history file: {err}"))?,
    );
    let store = crate::patiently("opening the store", || crate::open_store(&args.store))
        .await
        .layer(RecordingLayer::new(Arc::clone(&log)));
    let handler_log = Arc::clone(&log);
    let worker = Worker::builder(store)
        .handler(
            args.store.queue.clone(),
            move |ctx: JobContext, payload: Bytes| handle(Arc::clone(&handler_log), ctx, payload),
        )
        .concurrency(args.concurrency)
        .claim_batch(args.claim_batch)
        .lease(Duration::from_millis(args.lease_ms))
        .heartbeat_interval(Duration::from_millis(args.heartbeat_ms))
        .reclaim_interval(Duration::from_millis(args.reclaim_ms))
        .poll_interval(Duration::from_millis(250))
        // Planned failures come back quickly, so the drain does not wait on backoff.
        .backoff(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.2,
        })
        .shutdown_grace(Duration::from_secs(10))
        .build()
        .map_err(|err| format!("cannot build the worker: {err}"))?;
    let handle = worker.spawn();
    crate::stdin_closed().await;
    handle.shutdown().await;
    Ok(())
}

/// The handler: logs its start and end, does a little async work, and fails the
/// first attempt of the jobs the producer marked.
async fn handle(log: Arc<Log>, ctx: JobContext, payload: Bytes) -> Result<(), JobError> {
    let id = ctx.id();
    let token = ctx.lease_token().get();
    log.write(&Event::RunStart {
        t: now_us(),
        id,
        token,
        attempt: ctx.attempt(),
    });
    // Mostly short work; a third finishes in its first poll (the runtime's inline
    // path), one in a hundred spans several heartbeats.
    let roll: u32 = rand::random_range(0..100);
    let pause = match roll {
        0..=32 => None,
        33..=98 => Some(Duration::from_micros(rand::random_range(100..5_000))),
        _ => Some(Duration::from_millis(rand::random_range(500..2_000))),
    };
    if let Some(pause) = pause {
        tokio::time::sleep(pause).await;
    }
    let fail = payload.as_ref() == FAIL_ONCE && ctx.attempt() == 1;
    log.write(&Event::RunEnd {
        t: now_us(),
        id,
        token,
        ok: !fail,
    });
    if fail {
        return Err(JobError::retry_after(
            "chaos: planned failure of the first attempt",
            Duration::from_millis(50),
        ));
    }
    Ok(())
}
