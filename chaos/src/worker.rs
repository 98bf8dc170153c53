//! The worker process: the `durq` runtime, used as any service would, over a store
//! that records what the checker needs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use durq::{Backoff, Capability, JobContext, JobError, JobId, Worker};
use serde::{Deserialize, Serialize};

use crate::history::{now_us, Event, Log};
use crate::recording::RecordingLayer;
use crate::StoreArgs;

/// The payload byte that asks a job to fail its first attempt (retryably), so every
/// run exercises retries. Written by the producer.
pub const FAIL_ONCE: &[u8] = b"fail-once";

/// The durable steps a step job runs, in order (CONTRACT D1, D2). The planned failure
/// of a job marked [`FAIL_ONCE`] comes between `work` and `finish`, so its second
/// attempt answers the first two from their saved outputs and runs only the last.
pub const STEPS: [&str; 3] = ["load", "work", "finish"];

/// Whether job `id` runs [`STEPS`] as durable steps (on a store with `Steps`): every
/// third job, by id, so the checker can tell which without reading a payload, and
/// the extra store calls (one read and three saves per run) stay a moderate load.
pub fn runs_steps(id: JobId) -> bool {
    id.as_u128() % 3 == 0
}

/// The output a step saves: the token of the run that saved it, which a later run
/// answered from it logs, so the checker can tie every replay to a save.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct StepOutput {
    /// The lease token of the run that ran the step's work.
    pub token: u64,
}

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
    // Asked once: a store either keeps steps or answers every step `Unsupported`
    // (which would fail each step job for good).
    let steps = store.supports(Capability::Steps);
    let worker = Worker::builder(store)
        .handler(
            args.store.queue.clone(),
            move |ctx: JobContext, payload: Bytes| {
                handle(Arc::clone(&handler_log), steps, ctx, payload)
            },
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
/// first attempt of the jobs the producer marked. On a store with `Steps`, every
/// third job does its work as durable steps (see [`handle_steps`]).
async fn handle(
    log: Arc<Log>,
    steps: bool,
    ctx: JobContext,
    payload: Bytes,
) -> Result<(), JobError> {
    let id = ctx.id();
    let token = ctx.lease_token().get();
    log.write(&Event::RunStart {
        t: now_us(),
        id,
        token,
        attempt: ctx.attempt(),
    });
    let pause = pause();
    let fail = payload.as_ref() == FAIL_ONCE && ctx.attempt() == 1;
    if steps && runs_steps(id) {
        return handle_steps(&log, &ctx, pause, fail).await;
    }
    if let Some(pause) = pause {
        tokio::time::sleep(pause).await;
    }
    log.write(&Event::RunEnd {
        t: now_us(),
        id,
        token,
        ok: !fail,
    });
    if fail {
        return Err(planned_failure());
    }
    Ok(())
}

/// How long a run's simulated work takes. Mostly short work; a third finishes in its
/// first poll (the runtime's inline path), one in a hundred spans several heartbeats.
fn pause() -> Option<Duration> {
    let roll: u32 = rand::random_range(0..100);
    match roll {
        0..=32 => None,
        33..=98 => Some(Duration::from_micros(rand::random_range(100..5_000))),
        _ => Some(Duration::from_millis(rand::random_range(500..2_000))),
    }
}

/// The error of a planned failure: retryable, soon.
fn planned_failure() -> JobError {
    JobError::retry_after(
        "chaos: planned failure of the first attempt",
        Duration::from_millis(50),
    )
}

/// A step job: `load` (no work), `work` (the run's simulated work), the planned
/// failure if any, then `finish`. A step that fails ends the run with its error, as a
/// handler would: retryable, or nothing recorded when the lease is lost.
async fn handle_steps(
    log: &Log,
    ctx: &JobContext,
    pause: Option<Duration>,
    fail: bool,
) -> Result<(), JobError> {
    let end = |ok: bool| {
        log.write(&Event::RunEnd {
            t: now_us(),
            id: ctx.id(),
            token: ctx.lease_token().get(),
            ok,
        });
    };
    let [load, work, finish] = STEPS;
    for (name, pause) in [(load, None), (work, pause)] {
        if let Err(err) = step(log, ctx, name, pause).await {
            end(false);
            return Err(err);
        }
    }
    if fail {
        end(false);
        return Err(planned_failure());
    }
    let finished = step(log, ctx, finish, None).await;
    end(finished.is_ok());
    finished
}

/// Runs one durable step and logs what happened to it: `step_run` when its work
/// begins (inside the closure, so only when `ctx.step` really runs it), then
/// `step_saved`, `step_replayed` (answered from a saved output, naming the run that
/// saved it) or `step_failed`.
async fn step(
    log: &Log,
    ctx: &JobContext,
    name: &str,
    pause: Option<Duration>,
) -> Result<(), JobError> {
    let id = ctx.id();
    let token = ctx.lease_token().get();
    // Whether this run's closure ran: a replayed step never calls it.
    let ran = AtomicBool::new(false);
    let answer = ctx
        .step(name, || async {
            ran.store(true, Ordering::Relaxed);
            log.write(&Event::StepRun {
                t: now_us(),
                id,
                token,
                step: name.to_owned(),
            });
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            Ok(StepOutput { token })
        })
        .await;
    let t = now_us();
    let step = name.to_owned();
    match answer {
        Ok(_) if ran.load(Ordering::Relaxed) => {
            log.write(&Event::StepSaved { t, id, token, step });
            Ok(())
        }
        Ok(output) => {
            log.write(&Event::StepReplayed {
                t,
                id,
                token,
                step,
                saved_by: output.token,
            });
            Ok(())
        }
        Err(err) => {
            log.write(&Event::StepFailed {
                t,
                id,
                token,
                step,
                err: err.to_string(),
            });
            Err(err)
        }
    }
}
