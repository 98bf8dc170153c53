//! Ad hoc throughput of the PostgreSQL store: enqueue one by one, enqueue in batches,
//! and claim + complete. Not a test: it prints jobs per second.
//!
//! ```sh
//! cargo run --release -p durq-postgres --example postgres_throughput -- [jobs] [workers]
//! ```
//!
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and a fresh
//! namespace, which it deletes afterwards.

use std::time::{Duration, Instant};

use durq_core::{ClaimRequest, NewJob, Result, Store, StoreSettings};
use durq_postgres::{PostgresConfig, PostgresPool};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let namespace = format!("bench-{}", std::process::id());
    let settings = StoreSettings::default().namespace(namespace.clone());
    let config = PostgresConfig::new(&url)?.max_connections(8);
    let backend = PostgresPool::connect(config).await?;
    let store = Store::new(backend.backend(settings)?);
    let payload = vec![b'x'; 64];

    // One enqueue per statement, from `workers` tasks.
    let single = jobs.min(20_000);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        let payload = payload.clone();
        let count = single / workers + usize::from(w < single % workers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..count {
                store
                    .enqueue(NewJob::new("single").payload(payload.clone()))
                    .await?;
            }
            Ok::<_, durq_core::Error>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| durq_core::Error::backend("join", e))??;
    }
    report("enqueue, one per call", single, started.elapsed());

    // Batches of 1,000 (one statement each), from `workers` tasks.
    let started = Instant::now();
    let batches = jobs / 1_000;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        let payload = payload.clone();
        let count = batches / workers + usize::from(w < batches % workers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..count {
                let batch = (0..1_000)
                    .map(|_| NewJob::new("batch").payload(payload.clone()))
                    .collect();
                store.enqueue_batch(batch).await?;
            }
            Ok::<_, durq_core::Error>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| durq_core::Error::backend("join", e))??;
    }
    report(
        "enqueue, batches of 1000",
        batches * 1_000,
        started.elapsed(),
    );

    // Claim up to 100 at a time and complete each job (completes are batched).
    for limit in [10usize, 100] {
        let queue = "batch";
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..workers {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut done = 0usize;
                loop {
                    let request =
                        ClaimRequest::new([queue], format!("w{w}"), Duration::from_secs(60))
                            .limit(limit);
                    let claimed = store.claim(request).await?;
                    if claimed.is_empty() {
                        return Ok::<_, durq_core::Error>(done);
                    }
                    let completes = claimed.iter().map(|job| {
                        let store = store.clone();
                        let (id, token) = (job.id(), job.token());
                        async move { store.complete(id, token, None).await }
                    });
                    for result in join_all(completes).await {
                        result?;
                        done += 1;
                    }
                    if limit == 10 && done >= batches * 1_000 / workers / 2 {
                        return Ok(done);
                    }
                }
            }));
        }
        let mut done = 0;
        for task in tasks {
            done += task
                .await
                .map_err(|e| durq_core::Error::backend("join", e))??;
        }
        report(
            &format!("claim (limit {limit}) + complete"),
            done,
            started.elapsed(),
        );
    }
    let deleted = backend.drop_namespace(&namespace).await?;
    println!("deleted the namespace's {deleted} jobs");
    Ok(())
}

async fn join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        if let Ok(value) = handle.await {
            out.push(value);
        }
    }
    out
}

fn report(what: &str, jobs: usize, took: Duration) {
    let rate = jobs as f64 / took.as_secs_f64();
    println!("{what:<32} {jobs:>8} jobs in {took:>10.2?}: {rate:>9.0} jobs/s");
}
