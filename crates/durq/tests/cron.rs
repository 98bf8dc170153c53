//! Three OS processes run one 1-second schedule over the same 30 ticks of a driven
//! clock, each firing at every tick as fast as it can: exactly 30 jobs come out, one
//! per tick, on SQLite, Redis and PostgreSQL (CONTRACT S3). The memory store lives in
//! one process, so there the three schedulers are three tasks on three handles.
//!
//! The test binary runs itself again as the child processes: `child_scheduler` does
//! its work only when `JOBS_CRON_CHILD_URL` is set, and is a no-op in a normal run.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use durq::{Clock, ManualClock, NewJob, Schedule, Store, StoreSettings, SystemClock, Timestamp};

const CHILD_URL: &str = "JOBS_CRON_CHILD_URL";
const CHILD_NAMESPACE: &str = "JOBS_CRON_CHILD_NAMESPACE";
const CHILD_START: &str = "JOBS_CRON_CHILD_START";
const PROCESSES: usize = 3;
const TICKS: u64 = 30;
const QUEUE: &str = "ticks";

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => panic!("cannot start a runtime: {err}"),
    }
}

fn settings(namespace: &str, clock: &ManualClock) -> StoreSettings {
    StoreSettings::default()
        .namespace(namespace)
        .clock(Arc::new(clock.clone()))
}

fn schedule() -> Schedule {
    Schedule::every("every-second", Duration::from_secs(1), NewJob::new(QUEUE))
}

/// A whole second a little ahead of now, where every scheduler starts its clock.
fn start() -> Timestamp {
    let now = SystemClock.now().as_millis();
    Timestamp::from_millis((now / 1000 + 1) * 1000)
}

fn tick(start: Timestamp, n: u64) -> Timestamp {
    start.saturating_add(Duration::from_secs(n))
}

/// One scheduler: for each of the 30 ticks, sets its clock there and fires. Returns how
/// many jobs its firings created.
async fn run_scheduler(store: &Store, clock: &ManualClock, start: Timestamp) -> usize {
    let mut created = 0;
    for n in 1..=TICKS {
        clock.set(tick(start, n));
        created += loop {
            match store.fire_schedules().await {
                Ok(fired) => break fired.len(),
                Err(err) if err.is_retryable() => continue,
                Err(err) => panic!("firing schedules failed: {err}"),
            }
        };
    }
    created
}

#[test]
fn child_scheduler() {
    let (Ok(url), Ok(namespace), Ok(start)) = (
        std::env::var(CHILD_URL),
        std::env::var(CHILD_NAMESPACE),
        std::env::var(CHILD_START),
    ) else {
        return;
    };
    let start = match start.parse() {
        Ok(ms) => Timestamp::from_millis(ms),
        Err(err) => panic!("bad start {start:?}: {err}"),
    };
    runtime().block_on(async move {
        let clock = ManualClock::new(start);
        let store = match durq::connect_with(&url, settings(&namespace, &clock)).await {
            Ok(store) => store,
            Err(err) => panic!("child: connect failed: {err}"),
        };
        // Every child is connected before any fires, so the firings overlap.
        println!("\nREADY");
        let mut go = String::new();
        if let Err(err) = std::io::stdin().read_line(&mut go) {
            panic!("child: no go signal: {err}");
        }
        let created = run_scheduler(&store, &clock, start).await;
        println!("\nCREATED {created}");
    });
}

/// Runs three child schedulers against `url`, and checks the queue: 30 jobs, one per
/// tick, each created by exactly one firing.
fn three_processes_fire_each_tick_once(url: &str, namespace: &str) {
    let rt = runtime();
    let start = start();
    let clock = ManualClock::new(start);
    let store = rt.block_on(async {
        match durq::connect_with(url, settings(namespace, &clock)).await {
            Ok(store) => store,
            Err(err) => panic!("connect failed: {err}"),
        }
    });
    if let Err(err) = rt.block_on(store.put_schedule(&schedule())) {
        panic!("put_schedule failed: {err}");
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => panic!("no current exe: {err}"),
    };
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let spawned = Command::new(&exe)
                .args([
                    "--exact",
                    "child_scheduler",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_URL, url)
                .env(CHILD_NAMESPACE, namespace)
                .env(CHILD_START, start.as_millis().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn();
            match spawned {
                Ok(child) => child,
                Err(err) => panic!("cannot start a child: {err}"),
            }
        })
        .collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|child| {
            let stdout = child.stdout.take();
            let ready = ready_tx.clone();
            std::thread::spawn(move || {
                let mut created = None;
                let Some(stdout) = stdout else {
                    return created;
                };
                for line in BufReader::new(stdout).lines().map_while(|line| line.ok()) {
                    if line.contains("READY") {
                        let _ = ready.send(());
                    }
                    if let Some(n) = line.split("CREATED ").nth(1) {
                        created = n.trim().parse::<usize>().ok();
                    }
                }
                created
            })
        })
        .collect();
    for _ in 0..PROCESSES {
        if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            panic!("a child did not connect");
        }
    }
    for child in &mut children {
        if let Some(stdin) = child.stdin.as_mut() {
            if let Err(err) = stdin.write_all(b"go\n") {
                panic!("cannot signal a child: {err}");
            }
        }
    }
    let mut created = 0;
    for (child, reader) in children.iter_mut().zip(readers) {
        match reader.join() {
            Ok(Some(n)) => created += n,
            Ok(None) => panic!("a child reported nothing"),
            Err(_) => panic!("a reader thread panicked"),
        }
        match child.wait() {
            Ok(status) => assert!(status.success(), "a child failed: {status}"),
            Err(err) => panic!("cannot wait for a child: {err}"),
        }
    }
    let jobs = rt.block_on(async {
        let mut page = durq::ListQuery::new(QUEUE);
        page.limit = 1000;
        match store.list(page).await {
            Ok(page) => page.jobs,
            Err(err) => panic!("list failed: {err}"),
        }
    });
    assert_eq!(jobs.len(), 30, "one job per tick over {TICKS} ticks");
    assert_eq!(
        created, 30,
        "the firings of three processes created 30 jobs in all"
    );
    let ticks: HashSet<Timestamp> = jobs.iter().map(|job| job.run_at).collect();
    let expected: HashSet<Timestamp> = (1..=TICKS).map(|n| tick(start, n)).collect();
    assert_eq!(ticks, expected, "each job is ready at its own tick");
}

#[test]
fn sqlite_three_processes_fire_each_tick_once() {
    if std::env::var(CHILD_URL).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let url = format!("sqlite://{}", dir.path().join("cron.db").display());
    three_processes_fire_each_tick_once(&url, "cron");
}

#[cfg(feature = "redis")]
#[test]
fn redis_three_processes_fire_each_tick_once() {
    if std::env::var(CHILD_URL).is_ok() {
        return;
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = durq_conformance::unique_namespace("cron");
    let rt = runtime();
    let reachable = rt.block_on(durq::connect(&url));
    if let Err(err) = reachable {
        durq_conformance::skip_or_fail::<()>("Redis", &url, &err);
        return;
    }
    let outcome =
        std::panic::catch_unwind(|| three_processes_fire_each_tick_once(&url, &namespace));
    if let Err(err) = rt.block_on(common::drop_redis_namespace(&url, &namespace)) {
        panic!("{err}");
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_three_processes_fire_each_tick_once() {
    if std::env::var(CHILD_URL).is_ok() {
        return;
    }
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let namespace = durq_conformance::unique_namespace("cron");
    let rt = runtime();
    let reachable = rt.block_on(durq::connect(&url));
    if let Err(err) = reachable {
        durq_conformance::skip_or_fail::<()>("PostgreSQL", &url, &err);
        return;
    }
    let outcome =
        std::panic::catch_unwind(|| three_processes_fire_each_tick_once(&url, &namespace));
    if let Err(err) = rt.block_on(common::drop_postgres_namespace(&url, &namespace)) {
        panic!("{err}");
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[cfg(feature = "memory")]
#[test]
fn memory_three_schedulers_fire_each_tick_once() {
    if std::env::var(CHILD_URL).is_ok() {
        return;
    }
    let rt = runtime();
    rt.block_on(async {
        let server = durq_memory::MemoryServer::new();
        let start = start();
        let open = |clock: &ManualClock| match server.open(settings("cron", clock)) {
            Ok(store) => Store::new(store),
            Err(err) => panic!("open failed: {err}"),
        };
        let admin = open(&ManualClock::new(start));
        if let Err(err) = admin.put_schedule(&schedule()).await {
            panic!("put_schedule failed: {err}");
        }
        let tasks: Vec<_> = (0..PROCESSES)
            .map(|_| {
                let clock = ManualClock::new(start);
                let store = open(&clock);
                tokio::spawn(async move { run_scheduler(&store, &clock, start).await })
            })
            .collect();
        let mut created = 0;
        for task in tasks {
            match task.await {
                Ok(n) => created += n,
                Err(err) => panic!("a scheduler failed: {err}"),
            }
        }
        let stats = match admin.stats(QUEUE).await {
            Ok(stats) => stats,
            Err(err) => panic!("stats failed: {err}"),
        };
        assert_eq!(stats.total(), 30, "one job per tick");
        assert_eq!(created, 30);
    });
}
