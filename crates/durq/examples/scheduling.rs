//! Scheduling: a schedule that fires once per tick however many workers run it, a
//! queue paused and resumed, a job unique while it is active, and a handler that
//! snoozes.
//!
//! ```text
//! cargo run --example scheduling
//! ```
//!
//! It needs nothing installed: the queue is an SQLite file in a fresh temporary
//! directory. Time is a `ManualClock` the example moves on, so the ticks and the
//! snoozes come due at once instead of after real seconds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durq::{
    JobContext, JobError, JobState, ManualClock, NewJob, Schedule, StoreSettings, Timestamp, Worker,
};
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let settings = StoreSettings::default().clock(Arc::new(clock.clone()));
    let store = durq::connect_with(&url, settings).await?;

    // Two workers declare the same schedule, a tick every second. Each tick is one
    // job, because every worker enqueues it under the same key (CONTRACT S3).
    let heartbeat = Schedule::every(
        "heartbeat",
        Duration::from_secs(1),
        NewJob::new("heartbeat"),
    );
    let (ticked, mut ticks) = mpsc::unbounded_channel();
    let (reported, mut reports) = mpsc::unbounded_channel();
    // The report polls something slow: it snoozes twice (no attempt used up, no error
    // recorded), then finishes.
    let looks = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for name in ["worker-a", "worker-b"] {
        let (ran, looks) = (ticked.clone(), Arc::clone(&looks));
        let reports = reported.clone();
        let worker = Worker::builder(store.clone())
            .worker_id(name)
            .schedule(heartbeat.clone())
            .schedule_interval(Duration::from_millis(10))
            .poll_interval(Duration::from_millis(10))
            .handler("heartbeat", move |ctx: JobContext, _payload| {
                let ran = ran.clone();
                async move {
                    let tick = ctx.job().run_at.as_millis();
                    let _ = ran.send(format!("{}: heartbeat tick at {tick} ms", ctx.worker_id()));
                    Ok(())
                }
            })
            .handler("reports", move |ctx: JobContext, _payload| {
                let (ran, looks) = (reports.clone(), Arc::clone(&looks));
                async move {
                    if looks.fetch_add(1, Ordering::SeqCst) < 2 {
                        let _ = ran.send(format!(
                            "{}: report not ready, snoozing 30 s",
                            ctx.worker_id()
                        ));
                        return Err(JobError::snooze("not ready", Duration::from_secs(30)));
                    }
                    let _ = ran.send(format!(
                        "{}: report done (attempt {})",
                        ctx.worker_id(),
                        ctx.attempt()
                    ));
                    Ok(())
                }
            })
            .build()?;
        workers.push(worker.spawn());
    }
    drop((ticked, reported));

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
    // Each snooze waits 30 s of the store's clock: once it is stored, moving the clock
    // on makes the job due again.
    for _ in 0..2 {
        println!("{}", next(&mut reports).await);
        let mut poll = tokio::time::interval(Duration::from_millis(10));
        while store.get(first.id).await?.state != JobState::Queued {
            poll.tick().await;
        }
        clock.advance(Duration::from_secs(30));
    }
    println!("{}", next(&mut reports).await);

    // The schedule ticks from the moment the workers stored it. The clock jumped 60 s
    // in two steps: after each, the latest due tick fired once (catch-up `Latest`).
    println!("{}", next(&mut ticks).await);
    println!("{}", next(&mut ticks).await);

    // Pause the heartbeat queue: the next tick is enqueued, but nobody claims it.
    store.pause("heartbeat").await?;
    println!("heartbeat paused: {:?}", store.paused_queues().await?);
    clock.advance(Duration::from_secs(1));
    let mut poll = tokio::time::interval(Duration::from_millis(10));
    loop {
        poll.tick().await;
        let stats = store.stats("heartbeat").await?;
        if stats.ready == 1 {
            println!(
                "while paused: {} ready, paused = {}",
                stats.ready, stats.paused
            );
            break;
        }
    }
    store.resume("heartbeat").await?;
    println!("heartbeat resumed");
    println!("{}", next(&mut ticks).await);

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

/// The next line a handler sent, or a note after 30 s (real time) without one.
async fn next(lines: &mut mpsc::UnboundedReceiver<String>) -> String {
    match tokio::time::timeout(Duration::from_secs(30), lines.recv()).await {
        Ok(Some(line)) => line,
        _ => "(nothing ran within 30 s)".to_owned(),
    }
}
