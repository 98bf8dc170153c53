//! Scheduling: a schedule that fires once per tick however many workers run it, a
//! queue paused and resumed, a job unique while it is active, and a handler that
//! snoozes.
//!
//! ```text
//! cargo run --example scheduling
//! ```
//!
//! It needs nothing installed: the queue is an SQLite file in a fresh temporary
//! directory. It runs for about five seconds of real time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs::{JobContext, JobError, NewJob, Schedule, Worker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = jobs::connect(&url).await?;

    // Two workers declare the same schedule: a tick every second. Each tick is one
    // job, because every worker enqueues it under the same key (CONTRACT S3).
    let heartbeat = Schedule::every(
        "heartbeat",
        Duration::from_secs(1),
        NewJob::new("heartbeat"),
    );
    // The report polls something slow: it snoozes twice (no attempt used up, no error
    // recorded), then finishes.
    let looks = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for name in ["worker-a", "worker-b"] {
        let looks = Arc::clone(&looks);
        let worker = Worker::builder(store.clone())
            .worker_id(name)
            .schedule(heartbeat.clone())
            .schedule_interval(Duration::from_millis(100))
            .handler("heartbeat", move |ctx: JobContext, _payload| async move {
                println!(
                    "{}: heartbeat tick at {} ms",
                    ctx.worker_id(),
                    ctx.job().run_at.as_millis()
                );
                Ok(())
            })
            .handler("reports", move |ctx: JobContext, _payload| {
                let looks = Arc::clone(&looks);
                async move {
                    if looks.fetch_add(1, Ordering::SeqCst) < 2 {
                        println!("{}: report not ready, snoozing 300 ms", ctx.worker_id());
                        return Err(JobError::snooze("not ready", Duration::from_millis(300)));
                    }
                    println!(
                        "{}: report done (attempt {})",
                        ctx.worker_id(),
                        ctx.attempt()
                    );
                    Ok(())
                }
            })
            .build()?;
        workers.push(worker.spawn());
    }

    // Unique while active: a second enqueue returns the job still waiting or running.
    let first = store
        .enqueue(NewJob::new("reports").unique_while_active("daily"))
        .await?;
    let second = store
        .enqueue(NewJob::new("reports").unique_while_active("daily"))
        .await?;
    println!(
        "unique while active: second enqueue created a job: {}, same job: {}",
        second.created,
        second.id == first.id
    );

    // Pause the heartbeat queue for a second and a half: ticks still land (they are
    // enqueued), but nobody claims them until the resume.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.pause("heartbeat").await?;
    println!("heartbeat paused: {:?}", store.paused_queues().await?);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = store.stats("heartbeat").await?;
    println!(
        "while paused: {} ready, paused = {}",
        stats.ready, stats.paused
    );
    store.resume("heartbeat").await?;
    println!("heartbeat resumed");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    for record in store.schedules().await? {
        println!(
            "schedule {}: enabled {}, last tick {} ms, next tick {:?}",
            record.schedule.name,
            record.enabled,
            record.last_tick.as_millis(),
            record.next_tick.map(|t| t.as_millis())
        );
    }
    for worker in workers {
        worker.shutdown().await;
    }
    let report = store.get(first.id).await?;
    println!(
        "report: {} after {} attempt(s), last error {:?}",
        report.state, report.attempts, report.last_error
    );
    Ok(())
}
