//! The server's instructions per job of each hot path, counted by callgrind: steadier
//! than any CPU time on a shared machine (docs/redis.md, "The floor per job").
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/vg/cg.out.%p \
//!     redis-server --port 6392 --save '' --appendonly no &
//! VG_PID=<its pid> REDIS_URL=redis://127.0.0.1:6392 \
//!     cargo run --release -p durq-redis --example phases -- [JOBS] [CLAIM LIMIT]
//! ```
//!
//! Runs fixed phases in a fresh namespace (enqueue in batches of 1,000, claims of the
//! limit, one completion batch per claim, single enqueues from 16 producers), zeroing
//! the counters before each (`callgrind_control -z`) and dumping them after (`-d`, into
//! /tmp/vg), and prints each phase's instructions per job. Without `VG_PID` it only
//! prints the times. It deletes its keys at the end.
use std::time::Duration;

use durq_core::{ClaimRequest, Completion, NewJob, Store, StoreSettings};
use durq_redis::RedisBackend;
use futures::future::join_all;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn cg(cmd: &str) -> Option<u64> {
    let pid = std::env::var("VG_PID").ok()?;
    let _ = std::process::Command::new("callgrind_control")
        .args([cmd, &pid])
        .output();
    if cmd != "-d" {
        return None;
    }
    std::thread::sleep(Duration::from_millis(700));
    let mut newest = None;
    for e in std::fs::read_dir("/tmp/vg").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("cg.out.{pid}.")) {
            let m = e.metadata().ok()?.modified().ok()?;
            if newest.as_ref().is_none_or(|(t, _)| m > *t) {
                newest = Some((m, e.path()));
            }
        }
    }
    let text = std::fs::read_to_string(newest?.1).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary: "))
        .and_then(|v| v.trim().parse().ok())
}

fn report(what: &str, jobs: usize, t: std::time::Instant) {
    let ir = cg("-d");
    println!(
        "{what:24} jobs={jobs:6} ms={:8.1} Ir/job={}",
        t.elapsed().as_secs_f64() * 1e3,
        ir.map_or("-".into(), |ir| format!("{}", ir / jobs.max(1) as u64))
    );
    cg("-z");
}

#[tokio::main]
async fn main() -> Res<()> {
    let jobs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(5000);
    let limit: usize = std::env::args()
        .nth(2)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(32);
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let namespace = format!("phases-{}", std::process::id());
    let redis =
        RedisBackend::connect(&url, StoreSettings::default().namespace(namespace.clone())).await?;
    let store = Store::new(redis.clone());
    let payload = |i: usize| NewJob::new("bench").payload(i.to_string().into_bytes());

    cg("-z");
    let t = std::time::Instant::now();
    for chunk in 0..jobs.div_ceil(1000) {
        let n = 1000.min(jobs - chunk * 1000);
        let batch = (0..n).map(|i| payload(chunk * 1000 + i)).collect();
        store.enqueue_batch(batch).await?;
    }
    report("enqueue-batch 1000", jobs, t);

    let t = std::time::Instant::now();
    let mut claims = Vec::new();
    let mut n = 0;
    loop {
        let request = ClaimRequest::new(["bench"], "w", Duration::from_secs(600)).limit(limit);
        let got = store.claim(request).await?;
        if got.is_empty() {
            break;
        }
        n += got.len();
        claims.push(got);
    }
    report(&format!("claim {limit}"), n, t);

    let t = std::time::Instant::now();
    for batch in &claims {
        let completions = batch
            .iter()
            .map(|j| Completion::new(j.id(), j.token(), None))
            .collect();
        for r in store.complete_batch(completions).await? {
            r?;
        }
    }
    report(&format!("complete_batch {limit}"), n, t);

    let t = std::time::Instant::now();
    let tasks = (0..16).map(|p| {
        let store = store.clone();
        tokio::spawn(async move {
            for i in (p..jobs).step_by(16) {
                store
                    .enqueue(NewJob::new("single").payload(i.to_string().into_bytes()))
                    .await?;
            }
            Ok::<(), durq_core::Error>(())
        })
    });
    for t in join_all(tasks).await {
        t??;
    }
    report("enqueue-one x16", jobs, t);

    // Cleanup.
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let pattern = format!("jobs:{{{namespace}}}:*");
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(())
}
