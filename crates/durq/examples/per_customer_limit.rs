//! Flow control: one invoice at a time per customer, and at most three rendering in
//! all, across every worker (CONTRACT K1–K3). `rate_limited_api` shows a rate (K4).
//!
//! ```text
//! cargo run --example per_customer_limit
//! ```
//!
//! It needs nothing installed: the queue is an SQLite file in a fresh temporary
//! directory. Two workers of eight slots each serve the queue; the limits, stored with
//! the queue, hold them to one running invoice per customer and three in all, and a
//! customer with many invoices holds back none of the others. Each handler counts the
//! invoices of its customer running with it, and the example fails if the limits were
//! ever broken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq::{JobContext, NewJob, QueueLimits, Worker};
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = durq::connect(&url).await?;

    // Limits are data: set once, for every worker of every process, and changed at
    // run time with `store.set_limits` or `durq limits set`.
    store
        .set_limits(
            "invoices",
            QueueLimits::new().max_running(3).max_running_per_key(1),
        )
        .await?;
    // ACME has six invoices to render, the others one or two each.
    let mut jobs = Vec::new();
    for (customer, invoices) in [("acme", 6), ("globex", 2), ("initech", 1), ("umbrella", 2)] {
        for n in 1..=invoices {
            jobs.push(
                NewJob::new("invoices")
                    .concurrency_key(customer)
                    .payload(format!("{customer} invoice {n}")),
            );
        }
    }
    let total = jobs.len();
    store.enqueue_batch(jobs).await?;

    // What runs now, per customer: the handlers check the limits hold.
    let running: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let (done, mut finished) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for name in ["worker-a", "worker-b"] {
        let (running, done) = (Arc::clone(&running), done.clone());
        let worker = Worker::builder(store.clone())
            .worker_id(name)
            .concurrency(8)
            .poll_interval(Duration::from_millis(10))
            .handler("invoices", move |ctx: JobContext, payload| {
                let (running, done) = (Arc::clone(&running), done.clone());
                async move {
                    let customer = ctx.job().concurrency_key.clone().unwrap_or_default();
                    let (mine, all) = {
                        let mut now = running.lock().unwrap_or_else(|p| p.into_inner());
                        *now.entry(customer.clone()).or_default() += 1;
                        (now[&customer], now.values().sum::<u32>())
                    };
                    // Rendering gives way to other tasks a few times, so the other
                    // slots claim and run meanwhile and the limits have something to
                    // hold, without waiting on the clock.
                    for _ in 0..5 {
                        tokio::task::yield_now().await;
                    }
                    running
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(customer.clone())
                        .and_modify(|n| *n -= 1);
                    let what = String::from_utf8_lossy(&payload).into_owned();
                    let _ = done.send((ctx.worker_id().to_owned(), what, mine, all));
                    Ok(())
                }
            })
            .build()?;
        workers.push(worker.spawn());
    }
    drop(done);

    let mut broken = false;
    for _ in 0..total {
        let Some((worker, what, mine, all)) = finished.recv().await else {
            break;
        };
        println!("{worker}: rendered {what} ({mine} of its customer and {all} in all running)");
        broken |= mine > 1 || all > 3;
    }
    for worker in workers {
        worker.shutdown().await;
    }
    if broken {
        return Err("a limit was broken".into());
    }
    println!("every invoice rendered, one per customer and at most three at a time");
    Ok(())
}
