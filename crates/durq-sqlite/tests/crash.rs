//! Crash durability: a child process writes as fast as it can and reports each
//! acknowledged enqueue and completion on stdout; the parent kills it with SIGKILL in
//! the middle of the stream, reopens the file, and checks that the file is intact and
//! that nothing acknowledged was lost, in every `synchronous` mode.
//!
//! The test binary runs itself again as the child: `child_writer` does its work only
//! when `JOBS_SQLITE_CRASH_DB` is set, and is a no-op in a normal run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use durq_core::{ClaimRequest, JobId, JobState, NewJob, Store, StoreSettings};
use durq_sqlite::{SqliteConfig, Synchronous};

const CHILD_DB: &str = "JOBS_SQLITE_CRASH_DB";
const CHILD_SYNC: &str = "JOBS_SQLITE_CRASH_SYNC";
const QUEUE: &str = "crash";

fn settings() -> StoreSettings {
    StoreSettings::default().namespace("crash")
}

fn config(sync: &str) -> SqliteConfig {
    let synchronous = match sync {
        "durable-enqueues" => Synchronous::DurableEnqueues,
        "full" => Synchronous::Full,
        "normal" => Synchronous::Normal,
        _ => Synchronous::Off,
    };
    SqliteConfig::default().synchronous(synchronous)
}

/// Enqueues jobs of mixed sizes (some span many pages, so a kill often lands inside a
/// commit), claims and completes them, and prints `E <id>` / `C <id>` after each
/// acknowledgement. Stops on its own after a minute in case the parent is gone.
async fn write_forever(store: Store, task: usize) {
    let started = Instant::now();
    let mut n = task;
    while started.elapsed() < Duration::from_secs(60) {
        n += 7;
        let size = match n % 5 {
            0 => 256 * 1024,
            1 => 9_000,
            _ => 64,
        };
        let payload = vec![(n % 251) as u8; size];
        match store.enqueue(NewJob::new(QUEUE).payload(payload)).await {
            Ok(done) => println!("E {}", done.id),
            Err(err) => panic!("enqueue failed: {err}"),
        }
        let request = ClaimRequest::new([QUEUE], format!("t{task}"), Duration::from_secs(600));
        let claimed = match store.claim(request.limit(2)).await {
            Ok(claimed) => claimed,
            Err(err) => panic!("claim failed: {err}"),
        };
        for job in claimed {
            match store.complete(job.id(), job.token(), None).await {
                Ok(()) => println!("C {}", job.id()),
                Err(err) => panic!("complete failed: {err}"),
            }
        }
    }
}

#[test]
fn child_writer() {
    let (Ok(db), Ok(sync)) = (std::env::var(CHILD_DB), std::env::var(CHILD_SYNC)) else {
        return;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => panic!("cannot start a runtime: {err}"),
    };
    rt.block_on(async move {
        let store = match config(&sync).open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        };
        let tasks: Vec<_> = (0..4)
            .map(|t| tokio::spawn(write_forever(store.clone(), t)))
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
}

/// What the child acknowledged before it died.
#[derive(Default)]
struct Acknowledged {
    enqueued: Vec<JobId>,
    completed: Vec<JobId>,
}

/// Runs one child, kills it after `kill_after` acknowledgements, and returns every
/// acknowledgement it printed, including those still in the pipe when it died.
fn run_and_kill(db: &Path, sync: &str, kill_after: usize) -> Acknowledged {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => panic!("no current exe: {err}"),
    };
    let mut child = match Command::new(exe)
        .args([
            "--exact",
            "child_writer",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_DB, db)
        .env(CHILD_SYNC, sync)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!("cannot start the child: {err}"),
    };
    let Some(stdout) = child.stdout.take() else {
        panic!("the child has no stdout");
    };
    let mut acknowledged = Acknowledged::default();
    let mut killed = false;
    let parse = |line: &str, tag: &str| -> Option<JobId> {
        // libtest may print "test child_writer ... " on the first line.
        let rest = line.split(tag).nth(1)?;
        rest.trim().parse().ok()
    };
    for line in BufReader::new(stdout).lines().map_while(|line| line.ok()) {
        if let Some(id) = parse(&line, "E ") {
            acknowledged.enqueued.push(id);
        } else if let Some(id) = parse(&line, "C ") {
            acknowledged.completed.push(id);
        }
        let seen = acknowledged.enqueued.len() + acknowledged.completed.len();
        if !killed && seen >= kill_after {
            // SIGKILL: no destructor, no checkpoint, no flush runs in the child.
            if let Err(err) = child.kill() {
                panic!("cannot kill the child: {err}");
            }
            killed = true;
        }
    }
    let _ = child.wait();
    assert!(killed, "the child stopped before it was killed ({sync})");
    acknowledged
}

fn check_file(db: &Path, acknowledged: &Acknowledged, sync: &str, round: usize) {
    // A plain connection first: the file must be intact before the store touches it.
    let integrity: String = match rusqlite::Connection::open(db)
        .and_then(|conn| conn.query_row("PRAGMA integrity_check", [], |row| row.get(0)))
    {
        Ok(result) => result,
        Err(err) => panic!("integrity_check could not run ({sync}, round {round}): {err}"),
    };
    assert_eq!(integrity, "ok", "{sync}, round {round}");

    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => panic!("cannot start a runtime: {err}"),
    };
    rt.block_on(async {
        let store = match config(sync).open(db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("reopen failed ({sync}, round {round}): {err}"),
        };
        for id in &acknowledged.enqueued {
            if let Err(err) = store.get(*id).await {
                panic!("acknowledged enqueue {id} lost ({sync}, round {round}): {err}");
            }
        }
        for id in &acknowledged.completed {
            match store.get(*id).await {
                Ok(job) => assert_eq!(
                    job.state,
                    JobState::Succeeded,
                    "acknowledged completion of {id} lost ({sync}, round {round})"
                ),
                Err(err) => panic!("completed job {id} lost ({sync}, round {round}): {err}"),
            }
        }
    });
}

fn kill_rounds(sync: &str) {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("crash.db");
    // Several kills on one file: each round also recovers the previous round's WAL.
    for (round, kill_after) in [40usize, 250, 777].into_iter().enumerate() {
        let acknowledged = run_and_kill(&db, sync, kill_after);
        assert!(
            acknowledged.enqueued.len() + acknowledged.completed.len() >= kill_after,
            "{sync}: too few acknowledgements read"
        );
        check_file(&db, &acknowledged, sync, round);
    }
}

#[test]
fn sigkill_mid_write_loses_nothing_acknowledged_with_durable_enqueues() {
    kill_rounds("durable-enqueues");
}

#[test]
fn sigkill_mid_write_loses_nothing_acknowledged_with_synchronous_full() {
    kill_rounds("full");
}

#[test]
fn sigkill_mid_write_loses_nothing_acknowledged_with_synchronous_normal() {
    kill_rounds("normal");
}

#[test]
fn sigkill_mid_write_loses_nothing_acknowledged_with_synchronous_off() {
    kill_rounds("off");
}
