//! Flow control: an API client that must not call its provider more than five times
//! in any 200 ms, whatever the workers (CONTRACT K4).
//!
//! ```text
//! cargo run --example rate_limited_api
//! ```
//!
//! It needs nothing installed: the queue is an SQLite file in a fresh temporary
//! directory. Two workers of eight slots each serve twenty calls; the queue's rate,
//! stored with the queue, lets five start in any 200 ms window, and a worker held back
//! by it sleeps until the window frees a start instead of polling. Each call reports
//! the instant the store started it (`Job::started_at`), and the example fails if any
//! 200 ms held more than five.

use std::time::Duration;

use durq::{JobContext, NewJob, QueueLimits, Rate, Worker};
use tokio::sync::mpsc;

const CALLS: usize = 20;
const RATE: Rate = Rate::new(5, Duration::from_millis(200));

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = durq::connect(&url).await?;

    // The provider's quota, as data: every worker of every process keeps to it.
    store
        .set_limits("api-calls", QueueLimits::new().max_starts(RATE))
        .await?;
    let calls = (1..=CALLS).map(|n| NewJob::new("api-calls").payload(format!("call {n}")));
    store.enqueue_batch(calls.collect()).await?;

    let (done, mut finished) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for name in ["worker-a", "worker-b"] {
        let done = done.clone();
        let worker = Worker::builder(store.clone())
            .worker_id(name)
            .concurrency(8)
            .handler("api-calls", move |ctx: JobContext, payload| {
                let done = done.clone();
                async move {
                    let started = ctx.job().started_at.map_or(0, |at| at.as_millis());
                    let what = String::from_utf8_lossy(&payload).into_owned();
                    let _ = done.send((ctx.worker_id().to_owned(), what, started));
                    Ok(())
                }
            })
            .build()?;
        workers.push(worker.spawn());
    }
    drop(done);

    let mut starts = Vec::new();
    for _ in 0..CALLS {
        let Some((worker, what, started)) = finished.recv().await else {
            break;
        };
        let first = *starts.first().unwrap_or(&started);
        println!("{worker}: {what} started at +{} ms", started - first);
        starts.push(started);
    }
    for worker in workers {
        worker.shutdown().await;
    }
    starts.sort_unstable();
    let window = i64::try_from(RATE.per.as_millis())?;
    let busiest = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|at| **at < starts[i] + window)
                .count()
        })
        .max()
        .unwrap_or(0);
    if starts.len() != CALLS || busiest > RATE.starts as usize {
        return Err(format!(
            "{} calls started, and {busiest} in one 200 ms: the rate was broken",
            starts.len()
        )
        .into());
    }
    println!("{CALLS} calls, never more than {busiest} in any 200 ms");
    Ok(())
}
