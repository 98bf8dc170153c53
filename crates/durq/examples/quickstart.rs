//! The quickstart: 10,000 jobs through an embedded SQLite queue and a worker pool.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//!
//! It needs nothing installed: the queue is a file in a fresh temporary directory,
//! deleted at the end. Set `DURQ_URL` to try another backend (its feature enabled),
//! for example `DURQ_URL=redis://127.0.0.1:6379 cargo run --release --example
//! quickstart --features redis`.
//!
//! Two measurements:
//! 1. Throughput: 10,000 jobs enqueued in batches of 1,000 while the workers drain them.
//! 2. Pickup latency, from the enqueue call to the handler starting, with the workers
//!    idle and 1,000 jobs enqueued one at a time, as a steadily loaded service sees it.
//!    (During the 10,000-job burst the same measure is mostly time spent waiting
//!    behind other jobs, so it is reported separately as "time in queue".)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durq::{JobContext, NewJob, Store, Worker};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

const QUEUE: &str = "quickstart";
const JOBS: u64 = 10_000;
const BATCH: usize = 1_000;
const PROBES: u64 = 1_000;
const WORKERS: usize = 2;
const CONCURRENCY: usize = 128;

/// A job's payload: its number and when it was enqueued.
#[derive(Serialize, Deserialize)]
struct Task {
    n: u64,
    enqueued_us: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What the handlers record.
struct Progress {
    done: AtomicU64,
    target: AtomicU64,
    reached: Notify,
    /// Microseconds from enqueue to handler start.
    waits_us: Mutex<Histogram<u64>>,
}

impl Progress {
    fn new() -> Result<Self, hdrhistogram::CreationError> {
        Ok(Progress {
            done: AtomicU64::new(0),
            target: AtomicU64::new(0),
            reached: Notify::new(),
            // Three significant digits: enough to tell 450 µs from 451 µs.
            waits_us: Mutex::new(Histogram::new(3)?),
        })
    }

    fn record_wait(&self, waited_us: u64) {
        self.waits_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .saturating_record(waited_us);
    }

    fn expect(&self, target: u64) {
        self.waits_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reset();
        self.target.store(target, Ordering::SeqCst);
    }

    async fn wait(&self) {
        loop {
            let reached = self.reached.notified();
            if self.done.load(Ordering::SeqCst) >= self.target.load(Ordering::SeqCst) {
                return;
            }
            reached.await;
        }
    }

    fn waits(&self) -> Histogram<u64> {
        self.waits_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn percentile(waits: &Histogram<u64>, quantile: f64) -> Duration {
    Duration::from_micros(waits.value_at_quantile(quantile))
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();

    let dir = tempfile::tempdir()?;
    let url = match std::env::var("DURQ_URL") {
        Ok(url) => url,
        Err(_) => format!("sqlite://{}", dir.path().join("quickstart.db").display()),
    };
    let store: Store = durq::connect(&url).await?;
    let shown = url.split('@').next_back().unwrap_or(&url);
    println!("jobs quickstart: {shown}, {WORKERS} workers x {CONCURRENCY} concurrent handlers");

    let progress = Arc::new(Progress::new()?);
    let bar = ProgressBar::new(JOBS).with_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40.cyan/blue}] {pos:>6}/{len} {per_sec:>12} {msg}",
        )?
        .progress_chars("=> "),
    );

    let mut workers = Vec::new();
    for i in 0..WORKERS {
        let progress = progress.clone();
        let bar = bar.clone();
        let worker = Worker::builder(store.clone())
            .worker_id(format!("quickstart-{i}"))
            .concurrency(CONCURRENCY)
            .json_handler(QUEUE, move |ctx: JobContext, task: Task| {
                let progress = progress.clone();
                let bar = bar.clone();
                async move {
                    let waited = now_us().saturating_sub(task.enqueued_us);
                    progress.record_wait(waited);
                    // The "work": a checksum of the job number, returned as the result.
                    let checksum =
                        task.n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ctx.id().as_u128() as u64;
                    let done = progress.done.fetch_add(1, Ordering::SeqCst) + 1;
                    bar.inc(1);
                    if done >= progress.target.load(Ordering::SeqCst) {
                        progress.reached.notify_waiters();
                    }
                    Ok(checksum.to_string())
                }
            })
            .build()?;
        workers.push(worker.spawn());
    }

    // 1. Throughput: enqueue the burst in batches while the workers drain it.
    progress.expect(JOBS);
    let started = Instant::now();
    let mut n = 0;
    while n < JOBS {
        let batch: Vec<NewJob> = (n..(n + BATCH as u64).min(JOBS))
            .map(|n| {
                NewJob::new(QUEUE).json(&Task {
                    n,
                    enqueued_us: now_us(),
                })
            })
            .collect::<durq::Result<_>>()?;
        n += batch.len() as u64;
        store.enqueue_batch(batch).await?;
    }
    let enqueued_in = started.elapsed();
    progress.wait().await;
    let drained_in = started.elapsed();
    bar.finish_with_message("done");
    let in_queue = progress.waits();

    // 2. Pickup latency: one job at a time into idle workers.
    progress.done.store(0, Ordering::SeqCst);
    progress.expect(1);
    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    for n in 0..PROBES {
        let task = Task {
            n,
            enqueued_us: now_us(),
        };
        store.enqueue_json(QUEUE, &task).await?;
        // Let each job be picked up before the next, so none waits behind another.
        progress.target.store(n + 1, Ordering::SeqCst);
        progress.wait().await;
    }
    let pickup = progress.waits();

    for worker in workers {
        worker.shutdown().await;
    }
    let stats = store.stats(QUEUE).await?;

    println!(
        "enqueued {JOBS} jobs in {:.2} s ({:.0} jobs/s, batches of {BATCH})",
        enqueued_in.as_secs_f64(),
        JOBS as f64 / enqueued_in.as_secs_f64()
    );
    println!(
        "processed {JOBS} jobs in {:.2} s: {:.0} jobs/s (enqueue to last completion)",
        drained_in.as_secs_f64(),
        JOBS as f64 / drained_in.as_secs_f64()
    );
    println!(
        "pickup latency (enqueue -> handler start, {PROBES} jobs one at a time): p50 {}, p99 {}, max {}",
        ms(percentile(&pickup, 0.50)),
        ms(percentile(&pickup, 0.99)),
        ms(percentile(&pickup, 1.0)),
    );
    println!(
        "time in queue during the burst: p50 {}, p99 {}",
        ms(percentile(&in_queue, 0.50)),
        ms(percentile(&in_queue, 0.99)),
    );
    println!(
        "store: {} succeeded, {} queued, {} running, {} dead",
        stats.succeeded,
        stats.ready + stats.scheduled,
        stats.running,
        stats.dead
    );
    if stats.succeeded != JOBS + PROBES {
        return Err(format!("expected {} succeeded jobs", JOBS + PROBES).into());
    }
    Ok(())
}
