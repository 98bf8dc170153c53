//! Ad-hoc throughput of the Redis store (not a test: numbers depend on the machine).
//!
//! ```text
//! cargo run --release -p durq-redis --example redis_throughput -- [JOBS] [CONCURRENCY]
//! ```
//!
//! Measures single enqueues from concurrent tasks, batched enqueues, and claim+complete
//! by concurrent workers claiming batches, against `REDIS_URL`
//! (default `redis://127.0.0.1:6379`) in a fresh namespace it deletes afterwards.

use std::time::{Duration, Instant};

use durq_core::{ClaimRequest, NewJob, Store, StoreSettings};
use durq_redis::RedisBackend;
use futures::future::join_all;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// CPU seconds used so far by this process (user + system, from /proc).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ")".
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds the Redis server used so far (INFO cpu).
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| *name == "used_cpu_user" || *name == "used_cpu_sys")
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

struct Meter {
    wall: Instant,
    client: f64,
    server: f64,
}

impl Meter {
    async fn start(conn: &mut redis::aio::MultiplexedConnection) -> Meter {
        Meter {
            wall: Instant::now(),
            client: own_cpu(),
            server: server_cpu(conn).await,
        }
    }

    /// Wall-clock rate, and the CPU per job on each side: on a busy machine the CPU
    /// figures say more than the wall clock.
    async fn report(&self, conn: &mut redis::aio::MultiplexedConnection, what: &str, jobs: usize) {
        let wall = self.wall.elapsed().as_secs_f64();
        let client = own_cpu() - self.client;
        let server = server_cpu(conn).await - self.server;
        let per_job = |cpu: f64| cpu / jobs as f64 * 1e6;
        println!(
            "{what}: {jobs} jobs in {wall:.2} s = {:.0} jobs/s; CPU per job: redis {:.1} us, client {:.1} us => {:.0} jobs/s per core-pair",
            jobs as f64 / wall,
            per_job(server),
            per_job(client),
            jobs as f64 / (server + client).max(1e-9) * 2.0,
        );
    }
}

async fn drain(store: &Store, queue: &str, workers: usize, limit: usize) -> Res<usize> {
    let tasks = (0..workers).map(|w| {
        let store = store.clone();
        let queue = queue.to_owned();
        tokio::spawn(async move {
            let mut done = 0usize;
            loop {
                let request =
                    ClaimRequest::new([queue.as_str()], format!("w{w}"), Duration::from_secs(60))
                        .limit(limit);
                let batch = store.claim(request).await?;
                if batch.is_empty() {
                    return Ok::<usize, durq_core::Error>(done);
                }
                let completes = batch
                    .iter()
                    .map(|job| store.complete(job.id(), job.token(), None));
                for result in join_all(completes).await {
                    result?;
                }
                done += batch.len();
            }
        })
    });
    let mut total = 0;
    for task in join_all(tasks).await {
        total += task??;
    }
    Ok(total)
}

async fn run() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let jobs: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(100_000);
    let concurrency: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let namespace = format!("throughput-{}", std::process::id());
    // The backend for what only Redis has (wake-up probes), the handle for the rest.
    let redis =
        RedisBackend::connect(&url, StoreSettings::default().namespace(namespace.clone())).await?;
    let store = Store::new(redis.clone());
    let mut probe = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let payload = vec![b'x'; 64];

    // Single enqueues, `concurrency` tasks at once (the connection pipelines them).
    let single = jobs / 2;
    let meter = Meter::start(&mut probe).await;
    let tasks = (0..concurrency).map(|t| {
        let store = store.clone();
        let payload = payload.clone();
        tokio::spawn(async move {
            for _ in (t..single).step_by(concurrency) {
                store
                    .enqueue(NewJob::new("single").payload(payload.clone()))
                    .await?;
            }
            Ok::<(), durq_core::Error>(())
        })
    });
    for task in join_all(tasks).await {
        task??;
    }
    meter
        .report(
            &mut probe,
            &format!("enqueue, single x{concurrency}"),
            single,
        )
        .await;

    // Batched enqueues of 1,000.
    let meter = Meter::start(&mut probe).await;
    for chunk in 0..jobs.div_ceil(1000) {
        let n = 1000.min(jobs - chunk * 1000);
        let batch = (0..n)
            .map(|_| NewJob::new("batched").payload(payload.clone()))
            .collect();
        store.enqueue_batch(batch).await?;
    }
    meter
        .report(&mut probe, "enqueue, batches of 1000", jobs)
        .await;

    // Claim + complete: workers claim batches and complete every job (one script each).
    for (workers, limit) in [(4, 100), (8, 50)] {
        let queue = if limit == 100 { "batched" } else { "single" };
        let meter = Meter::start(&mut probe).await;
        let done = drain(&store, queue, workers, limit).await?;
        meter
            .report(
                &mut probe,
                &format!("claim(limit {limit}) + complete, {workers} workers"),
                done,
            )
            .await;
    }
    // Claim alone, then complete alone, to split the cost between the two scripts.
    let batch = (0..jobs.min(50_000))
        .map(|_| NewJob::new("split").payload(payload.clone()))
        .collect::<Vec<_>>();
    for chunk in batch.chunks(1000) {
        store.enqueue_batch(chunk.to_vec()).await?;
    }
    let meter = Meter::start(&mut probe).await;
    let mut claimed = Vec::new();
    loop {
        let request = ClaimRequest::new(["split"], "w", Duration::from_secs(600)).limit(100);
        let got = store.claim(request).await?;
        if got.is_empty() {
            break;
        }
        claimed.extend(got);
    }
    meter
        .report(
            &mut probe,
            "claim(limit 100) alone, 1 claimer",
            claimed.len(),
        )
        .await;
    let meter = Meter::start(&mut probe).await;
    for chunk in claimed.chunks(256) {
        let completes = chunk
            .iter()
            .map(|job| store.complete(job.id(), job.token(), None));
        for result in join_all(completes).await {
            result?;
        }
    }
    meter
        .report(&mut probe, "complete alone, 256 at once", claimed.len())
        .await;
    // Wake-up latency: a waiter on an idle queue, then one enqueue.
    assert!(
        redis.wake_ready(Duration::from_secs(5)).await,
        "no wake-up subscriber"
    );
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .wait_for_work(&["wake".to_owned()], Duration::from_secs(5))
                    .await
                    .map(|()| Instant::now())
            })
        };
        while redis.waiting_for_work() == 0 {
            tokio::task::yield_now().await;
        }
        let sent = Instant::now();
        store.enqueue(NewJob::new("wake")).await?;
        let woken = waiter.await??;
        latencies.push(woken.duration_since(sent));
    }
    latencies.sort();
    println!(
        "wake-up after enqueue: median {:?}, max {:?} (20 tries)",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    redis.drop_namespace().await?;
    Ok(())
}

fn main() -> Res<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}
