//! An ad-hoc throughput measurement, not a test: enqueue, then claim + complete, with a
//! few concurrent tokio tasks, in each durability mode.
//!
//! ```text
//! cargo run --release -p durq-sqlite --example sqlite_throughput -- [jobs] [tasks] [claim-batch] [enqueue-batch] [durable-enqueues|full|normal]
//! ```
//!
//! With an enqueue batch of 1 each task enqueues one job at a time; with more it uses
//! `enqueue_batch`. Claimed jobs of one claim are completed concurrently.

use std::time::{Duration, Instant};

use durq_core::{ClaimRequest, NewJob, Store, StoreSettings};
use durq_sqlite::{SqliteConfig, Synchronous};

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> durq_core::Result<()> {
    let jobs = arg(1, 20_000);
    let tasks = arg(2, 2);
    let batch = arg(3, 1);
    let enqueue_batch = arg(4, 1).max(1);
    let modes = match std::env::args().nth(5).as_deref() {
        Some("full") => vec![Synchronous::Full],
        Some("normal") => vec![Synchronous::Normal],
        Some("durable-enqueues") => vec![Synchronous::DurableEnqueues],
        _ => vec![
            Synchronous::DurableEnqueues,
            Synchronous::Full,
            Synchronous::Normal,
        ],
    };
    println!("{jobs} jobs, {tasks} tasks, claim batch {batch}, enqueue batch {enqueue_batch}");
    for synchronous in modes {
        let dir = tempfile::tempdir().map_err(|e| durq_core::Error::backend("tempdir", e))?;
        let path = dir.path().join("bench.db");
        let config = SqliteConfig::default().synchronous(synchronous);
        let store = Store::new(config.open(&path, StoreSettings::default()).await?);

        let (started, cpu0) = (Instant::now(), cpu_seconds());
        let per_task = jobs / tasks;
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let store = store.clone();
            handles.push(tokio::spawn(async move {
                let mut left = per_task;
                while left > 0 {
                    let n = left.min(enqueue_batch);
                    left -= n;
                    if n == 1 {
                        store
                            .enqueue(NewJob::new("bench").payload(&b"{}"[..]))
                            .await?;
                    } else {
                        let jobs = (0..n)
                            .map(|_| NewJob::new("bench").payload(&b"{}"[..]))
                            .collect();
                        store.enqueue_batch(jobs).await?;
                    }
                }
                Ok::<_, durq_core::Error>(())
            }));
        }
        for handle in handles {
            handle
                .await
                .map_err(|e| durq_core::Error::backend("join", e))??;
        }
        let enqueue = started.elapsed();
        let cpu1 = cpu_seconds();

        let started = Instant::now();
        let mut handles = Vec::new();
        for t in 0..tasks {
            let store = store.clone();
            handles.push(tokio::spawn(async move {
                let mut done = 0usize;
                loop {
                    let request =
                        ClaimRequest::new(["bench"], format!("w{t}"), Duration::from_secs(60))
                            .limit(batch);
                    let claimed = store.claim(request).await?;
                    if claimed.is_empty() {
                        return Ok::<_, durq_core::Error>(done);
                    }
                    // Completions of one batch go out together, so they share a commit.
                    let completions = claimed
                        .iter()
                        .map(|job| store.complete(job.id(), job.token(), None));
                    for result in futures::future::join_all(completions).await {
                        result?;
                    }
                    done += claimed.len();
                }
            }));
        }
        let mut done = 0;
        for handle in handles {
            done += handle
                .await
                .map_err(|e| durq_core::Error::backend("join", e))??;
        }
        let drain = started.elapsed();
        let cpu2 = cpu_seconds();
        let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
        let micros = |n: usize, cpu: f64| cpu * 1e6 / n.max(1) as f64;
        println!(
            "{synchronous:?}: enqueue {:.0} jobs/s ({:.1} us CPU/job); claim+complete {:.0} jobs/s ({:.1} us CPU/job) ({done} jobs)",
            rate(per_task * tasks, enqueue),
            micros(per_task * tasks, cpu1 - cpu0),
            rate(done, drain),
            micros(done, cpu2 - cpu1),
        );
    }
    Ok(())
}

/// User + system CPU time of this process so far (Linux `/proc/self/stat`; 0 elsewhere),
/// so results mean something on a machine shared with other work.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
