//! Several OS processes drain one queue from one file: every job is claimed exactly
//! once, across processes as well as inside each; a key's running limit (K1) and a
//! queue's rates (K4) hold across processes; a wait (O2) is answered when another
//! process ends its job.
//!
//! The test binary runs itself again as the child processes: the `child_*` tests do
//! their work only when `JOBS_SQLITE_CHILD_DB` is set, and are no-ops in a normal run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use durq_core::{Budget, ClaimRequest, JobId, JobState, Needs, NewJob, Store, StoreSettings};
use durq_sqlite::{SqliteConfig, Synchronous};

const CHILD_DB: &str = "JOBS_SQLITE_CHILD_DB";
const CHILD_NAME: &str = "JOBS_SQLITE_CHILD_NAME";
const QUEUES: [&str; 2] = ["mp-a", "mp-b"];
const JOBS: usize = 1500;
const CHILDREN: usize = 3;

fn settings() -> StoreSettings {
    StoreSettings::default().namespace("multiprocess")
}

fn config() -> SqliteConfig {
    // A short poll so that the parent's late enqueues reach waiting children quickly.
    SqliteConfig::default()
        .synchronous(Synchronous::Normal)
        .poll_interval(Duration::from_millis(20))
}

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

/// The queue of the parent's "all enqueued" marker, which no drainer claims from.
const DONE_QUEUE: &str = "mp-done";

/// Claims, in batches of varying size, from both queues, completing each job and
/// printing `CLAIMED <id>` once the completion is acknowledged. Stops when a claim comes
/// back empty *after* the parent's marker was seen: the marker is enqueued after every
/// job, so by then every job exists and an empty claim means all were taken.
async fn drain(store: Store, worker: String, fitted: bool) -> Vec<String> {
    let queues: Vec<String> = QUEUES.iter().map(|q| q.to_string()).collect();
    let mut lines = Vec::new();
    let mut limit = 1;
    // A bound, so a child whose parent died does not run forever.
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{worker}: still draining after five minutes"
        );
        let all_enqueued = match store.stats(DONE_QUEUE).await {
            Ok(stats) => stats.ready > 0,
            Err(err) => panic!("{worker}: stats failed: {err}"),
        };
        let mut request =
            ClaimRequest::new(queues.clone(), worker.clone(), Duration::from_secs(600))
                .limit(limit);
        if fitted {
            // A budget every job fits and a preference: the fitted claim path races the
            // plain one, in this process and the others.
            request = request
                .budget(Budget::new().amount("gpu", 2).capability("cuda"))
                .prefer(["loc-1"]);
        }
        limit = limit % 7 + 1;
        let claimed = match store.claim(request).await {
            Ok(claimed) => claimed,
            Err(err) if err.is_retryable() => continue,
            Err(err) => panic!("{worker}: claim failed: {err}"),
        };
        if claimed.is_empty() {
            if all_enqueued {
                return lines;
            }
            let _ = store
                .wait_for_work(&queues, Duration::from_millis(200))
                .await;
            continue;
        }
        for job in claimed {
            if let Err(err) = store.complete(job.id(), job.token(), None).await {
                panic!("{worker}: complete of {} failed: {err}", job.id());
            }
            let line = format!("CLAIMED {}", job.id());
            println!("{line}");
            lines.push(line);
        }
    }
}

#[test]
fn child_drainer() {
    let (Ok(db), Ok(name)) = (std::env::var(CHILD_DB), std::env::var(CHILD_NAME)) else {
        return;
    };
    runtime().block_on(async move {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("child {name}: open failed: {err}"),
        };
        println!("\nREADY");
        let tasks: Vec<_> = (0..2)
            .map(|t| tokio::spawn(drain(store.clone(), format!("{name}-t{t}"), t == 1)))
            .collect();
        for task in tasks {
            if let Err(err) = task.await {
                panic!("child {name}: a task failed: {err}");
            }
        }
    });
}

/// Reads a child's stdout on a thread of its own: sends `()` on `ready` when the child
/// says READY, and answers what follows `marker` on each line that holds it (libtest
/// may print its "test … " on the same line first).
fn read_child(
    child: &mut std::process::Child,
    marker: &'static str,
    ready: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<Vec<String>> {
    let stdout = child.stdout.take();
    std::thread::spawn(move || {
        let Some(stdout) = stdout else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(|line| line.ok()) {
            if line.contains("READY") {
                let _ = ready.send(());
            }
            if let Some(rest) = line.split(marker).nth(1) {
                found.push(rest.to_owned());
            }
        }
        found
    })
}

fn spawn_child(db: &Path, name: &str) -> std::process::Child {
    spawn_test(db, name, "child_drainer")
}

/// Runs test `test` of this binary as a child process with the child environment set.
fn spawn_test(db: &Path, name: &str, test: &str) -> std::process::Child {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => panic!("no current exe: {err}"),
    };
    let spawned = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_DB, db)
        .env(CHILD_NAME, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    match spawned {
        Ok(child) => child,
        Err(err) => panic!("cannot start child {name}: {err}"),
    }
}

#[test]
fn processes_drain_one_queue_claiming_each_job_exactly_once() {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("queue.db");
    let rt = runtime();
    let store = rt.block_on(async {
        match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        }
    });

    // Half the jobs arrive at once when every child is waiting, the rest while they and
    // the parent drain, so claims race with enqueues across processes, not only with
    // each other.
    let enqueue = |range: std::ops::Range<usize>| {
        let store = store.clone();
        async move {
            let mut ids = Vec::new();
            for chunk in range.collect::<Vec<_>>().chunks(100) {
                let jobs = chunk
                    .iter()
                    .map(|i| {
                        let needs = Needs::new().amount("gpu", (i % 3) as u64);
                        let needs = if i % 5 == 0 {
                            needs.capability("cuda")
                        } else {
                            needs
                        };
                        NewJob::new(QUEUES[i % 2])
                            .priority((i % 3) as i16)
                            .payload(format!("job {i}").into_bytes())
                            .needs(needs)
                            .locality(format!("loc-{}", i % 3))
                    })
                    .collect();
                match store.enqueue_batch(jobs).await {
                    Ok(done) => ids.extend(done.into_iter().map(|e| e.id)),
                    Err(err) => panic!("enqueue failed: {err}"),
                }
            }
            ids
        }
    };
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|n| spawn_child(&db, &format!("child{n}")))
        .collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|child| read_child(child, "CLAIMED ", ready_tx.clone()))
        .collect();
    // Every child has its store open and is waiting for work before the first job
    // exists, so all processes race for the jobs from the start.
    for _ in 0..CHILDREN {
        if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            panic!("a child did not start");
        }
    }
    let mut expected: Vec<JobId> = rt.block_on(enqueue(0..JOBS / 2));

    // The parent drains too, in-process, while it enqueues the second half.
    let parent_claims = rt.block_on(async {
        let drainer = tokio::spawn(drain(store.clone(), "parent".to_owned(), true));
        expected.extend(enqueue(JOBS / 2..JOBS).await);
        if let Err(err) = store.enqueue(NewJob::new(DONE_QUEUE)).await {
            panic!("enqueue of the marker failed: {err}");
        }
        match drainer.await {
            Ok(lines) => lines,
            Err(err) => panic!("the parent's drainer failed: {err}"),
        }
    });

    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in parent_claims {
        if let Some(id) = line.strip_prefix("CLAIMED ") {
            *seen.entry(id.to_owned()).or_default() += 1;
        }
    }
    let mut per_process = vec![seen.len()];
    for (child, reader) in children.iter_mut().zip(readers) {
        let ids = match reader.join() {
            Ok(ids) => ids,
            Err(_) => panic!("a reader thread panicked"),
        };
        per_process.push(ids.len());
        for id in ids {
            *seen.entry(id).or_default() += 1;
        }
        match child.wait() {
            Ok(status) => assert!(status.success(), "a child failed: {status}"),
            Err(err) => panic!("cannot wait for a child: {err}"),
        }
    }

    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs claimed more than once: {twice:?}");
    if seen.len() != JOBS {
        let missing: Vec<_> = expected
            .iter()
            .filter(|id| !seen.contains_key(&id.to_string()))
            .collect();
        let states: Vec<_> = rt.block_on(async {
            let mut states = Vec::new();
            for id in &missing {
                states.push(
                    store
                        .get(**id)
                        .await
                        .map(|job| (job.state, job.attempts, job.lease)),
                );
            }
            states
        });
        panic!(
            "{} of {JOBS} jobs claimed (per process {per_process:?}); missing: {states:?}",
            seen.len()
        );
    }
    for id in &expected {
        assert_eq!(
            seen.get(&id.to_string()),
            Some(&1),
            "job {id} was not claimed once"
        );
    }
    // More than one process took part, or the test proved nothing about processes.
    let active = per_process.iter().filter(|n| **n > 0).count();
    assert!(
        active >= 2,
        "only one process claimed jobs: {per_process:?}"
    );

    rt.block_on(async {
        for id in &expected {
            match store.get(*id).await {
                Ok(job) => {
                    assert_eq!(job.state, JobState::Succeeded, "job {id}");
                    assert_eq!(job.attempts, 1, "job {id} was claimed more than once");
                }
                Err(err) => panic!("job {id}: {err}"),
            }
        }
        for queue in QUEUES {
            let stats = match store.stats(queue).await {
                Ok(stats) => stats,
                Err(err) => panic!("stats failed: {err}"),
            };
            assert_eq!(
                stats.ready + stats.running + stats.scheduled,
                0,
                "{queue}: {stats:?}"
            );
        }
    });
}

const KEYS: usize = 25;

/// Child mode of the next test: open the (possibly new) file and enqueue one job per
/// shared idempotency key, printing `KEY <n> <id> <created>`.
#[test]
fn child_opener() {
    let (Ok(db), Ok(name)) = (std::env::var(CHILD_DB), std::env::var(CHILD_NAME)) else {
        return;
    };
    runtime().block_on(async move {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("child {name}: open failed: {err}"),
        };
        for n in 0..KEYS {
            let job = NewJob::new("keys")
                .tenant("shared")
                .idempotency_key(format!("key-{n}"))
                .payload(name.clone().into_bytes());
            match store.enqueue(job).await {
                Ok(done) => println!("\nKEY {n} {} {}", done.id, done.created),
                Err(err) => panic!("child {name}: enqueue failed: {err}"),
            }
        }
    });
}

/// Four processes open a file that does not exist yet at the same moment: the schema is
/// created once, and their enqueues with the same idempotency keys make one job per key,
/// whoever wins each key.
#[test]
fn processes_opening_a_new_file_at_once_migrate_once_and_share_keys() {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("fresh.db");
    let mut children: Vec<_> = (0..4)
        .map(|n| spawn_test(&db, &format!("opener{n}"), "child_opener"))
        .collect();
    let mut by_key: HashMap<String, Vec<(String, bool)>> = HashMap::new();
    for child in &mut children {
        let Some(stdout) = child.stdout.take() else {
            panic!("a child has no stdout");
        };
        for line in BufReader::new(stdout).lines().map_while(|line| line.ok()) {
            let Some(rest) = line.split("KEY ").nth(1) else {
                continue;
            };
            let parts: Vec<&str> = rest.split_whitespace().collect();
            if let [key, id, created] = parts[..] {
                by_key
                    .entry(key.to_owned())
                    .or_default()
                    .push((id.to_owned(), created == "true"));
            }
        }
        match child.wait() {
            Ok(status) => assert!(status.success(), "a child failed: {status}"),
            Err(err) => panic!("cannot wait for a child: {err}"),
        }
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, answers) in &by_key {
        assert_eq!(answers.len(), 4, "key {key}: {answers:?}");
        let first = &answers[0].0;
        assert!(
            answers.iter().all(|(id, _)| id == first),
            "key {key}: {answers:?}"
        );
        let created = answers.iter().filter(|(_, created)| *created).count();
        assert_eq!(created, 1, "key {key}: {answers:?}");
    }

    let conn = match rusqlite::Connection::open(&db) {
        Ok(conn) => conn,
        Err(err) => panic!("{err}"),
    };
    let versions: Vec<i64> = match conn
        .prepare("SELECT value FROM jobq_meta WHERE name = 'schema_version'")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
    {
        Ok(versions) => versions,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(versions, vec![durq_sqlite::SCHEMA_VERSION]);
    let rt = runtime();
    rt.block_on(async {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        };
        match store.stats("keys").await {
            Ok(stats) => assert_eq!(stats.total(), KEYS as u64, "{stats:?}"),
            Err(err) => panic!("stats failed: {err}"),
        }
    });
}

/// The body of a child test of the flow-control tests: opens the file, says READY, runs
/// `task` on two tokio tasks (workers `{name}-t0` and `{name}-t1`) and prints the lines
/// they answer once both are done. A no-op outside child mode.
fn run_child<F, Fut>(task: F)
where
    F: Fn(Store, String) -> Fut,
    Fut: std::future::Future<Output = Vec<String>> + Send + 'static,
{
    let (Ok(db), Ok(name)) = (std::env::var(CHILD_DB), std::env::var(CHILD_NAME)) else {
        return;
    };
    runtime().block_on(async move {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("child {name}: open failed: {err}"),
        };
        println!("\nREADY");
        let tasks: Vec<_> = (0..2)
            .map(|t| tokio::spawn(task(store.clone(), format!("{name}-t{t}"))))
            .collect();
        for task in tasks {
            match task.await {
                Ok(lines) => {
                    for line in lines {
                        println!("{line}");
                    }
                }
                Err(err) => panic!("child {name}: a task failed: {err}"),
            }
        }
    });
}

/// Runs [`CHILDREN`] children of test `test` on `db` at once and answers, once every
/// one exited successfully, what followed `marker` on their lines.
fn run_children(db: &Path, prefix: &str, test: &str, marker: &'static str) -> Vec<String> {
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|c| spawn_test(db, &format!("{prefix}-{c}"), test))
        .collect();
    let (ready, _started) = std::sync::mpsc::channel();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|child| read_child(child, marker, ready.clone()))
        .collect();
    for mut child in children {
        match child.wait() {
            Ok(status) => assert!(status.success(), "a child failed: {status}"),
            Err(err) => panic!("waiting for a child: {err}"),
        }
    }
    readers
        .into_iter()
        .flat_map(|reader| match reader.join() {
            Ok(lines) => lines,
            Err(_) => panic!("a child's reader panicked"),
        })
        .collect()
}

/// Opens `db`, sets `limits` on `queue` and enqueues `jobs`, answering their ids: the
/// parent's side of the flow-control tests, before the children start.
fn prepare(
    db: &Path,
    queue: &str,
    limits: durq_core::QueueLimits,
    jobs: Vec<NewJob>,
) -> Vec<JobId> {
    runtime().block_on(async {
        let store = match config().open(db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        };
        if let Err(err) = store.set_limits(queue, limits).await {
            panic!("set_limits failed: {err}");
        }
        match store.enqueue_batch(jobs).await {
            Ok(enqueued) => enqueued.into_iter().map(|e| e.id).collect(),
            Err(err) => panic!("enqueue failed: {err}"),
        }
    })
}

/// A number a child printed, or a failed test naming the line.
fn parse<T: std::str::FromStr>(text: &str, line: &str) -> T {
    match text.parse() {
        Ok(n) => n,
        Err(_) => panic!("bad number {text:?} in {line:?}"),
    }
}

/// The queue of the limits test, its keys, and how many jobs each key has.
const LIMITED_QUEUE: &str = "mp-limited";
const LIMITED_KEYS: usize = 4;
const LIMITED_PER_KEY: usize = 40;

/// Nanoseconds since the epoch on the machine's real-time clock, which every process
/// of the test reads alike: how the holds of different processes are put in one order.
fn wall_nanos() -> u128 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(since) => since.as_nanos(),
        Err(err) => panic!("clock before the epoch: {err}"),
    }
}

/// A child of the limits test: two tasks claim from the limited queue until it is
/// empty, and print `HOLD <key> <id> <from> <to>` for each job: `from` read after its
/// claim returned, `to` before its completion was sent, so the interval lies inside the
/// store's own `running` interval of the job.
#[test]
fn child_limited_claimer() {
    run_child(|store, worker| async move {
        let mut lines = Vec::new();
        let mut empty = 0;
        // Every job exists before the children start: claims that find nothing while
        // jobs run elsewhere are retried, a few dozen empty claims in a row after the
        // queue emptied end the task.
        while empty < 50 {
            let request =
                ClaimRequest::new([LIMITED_QUEUE], worker.clone(), Duration::from_secs(600))
                    .limit(3);
            let claimed = match store.claim(request).await {
                Ok(claimed) => claimed,
                Err(err) if err.is_retryable() => continue,
                Err(err) => panic!("{worker}: claim failed: {err}"),
            };
            if claimed.is_empty() {
                let stats = match store.stats(LIMITED_QUEUE).await {
                    Ok(stats) => stats,
                    Err(err) => panic!("{worker}: stats failed: {err}"),
                };
                empty = if stats.ready + stats.running == 0 {
                    empty + 1
                } else {
                    0
                };
                tokio::task::yield_now().await;
                continue;
            }
            let from = wall_nanos();
            // Hold the jobs for a read of the store, as a handler's work would, while
            // the other processes claim.
            if let Err(err) = store.stats(LIMITED_QUEUE).await {
                panic!("{worker}: stats failed: {err}");
            }
            let to = wall_nanos();
            for job in &claimed {
                let key = job.job.concurrency_key.clone().unwrap_or_default();
                lines.push(format!("HOLD {key} {} {from} {to}", job.id()));
                if let Err(err) = store.complete(job.id(), job.token(), None).await {
                    panic!("{worker}: complete failed: {err}");
                }
            }
        }
        lines
    });
}

/// CONTRACT K1 across processes: three processes (two claimers each) drain a queue of
/// 160 jobs of 4 keys limited to one running job per key. Each process prints when it
/// held each job, on the machine's clock; merged, no two holds of one key overlap, and
/// every job was held exactly once.
#[test]
fn processes_never_run_more_of_a_key_than_its_limit() {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("limited.db");
    let jobs: Vec<NewJob> = (0..LIMITED_KEYS * LIMITED_PER_KEY)
        .map(|n| NewJob::new(LIMITED_QUEUE).concurrency_key(format!("k{}", n % LIMITED_KEYS)))
        .collect();
    let ids = prepare(
        &db,
        LIMITED_QUEUE,
        durq_core::QueueLimits::new().max_running_per_key(1),
        jobs,
    );
    let mut holds: Vec<(String, String, u128, u128)> = Vec::new();
    for line in run_children(&db, "limited", "child_limited_claimer", "HOLD ") {
        let words: Vec<&str> = line.split(' ').collect();
        let [key, id, from, to] = words[..] else {
            panic!("a hold line of four words expected: {line:?}");
        };
        holds.push((
            key.to_owned(),
            id.to_owned(),
            parse(from, &line),
            parse(to, &line),
        ));
    }
    let held: std::collections::HashSet<&str> = holds.iter().map(|h| h.1.as_str()).collect();
    assert_eq!(held.len(), holds.len(), "a job was held twice");
    assert_eq!(held.len(), ids.len(), "every job was held");
    let mut by_key: HashMap<&str, Vec<(u128, u128)>> = HashMap::new();
    for (key, _, from, to) in &holds {
        by_key.entry(key.as_str()).or_default().push((*from, *to));
    }
    for (key, mut spans) in by_key {
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(
                pair[0].1 < pair[1].0,
                "K1: two jobs of key {key} were held at once across processes: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// The queue of the rates test, its keys, its jobs, and its rates' window.
const RATED_QUEUE: &str = "mp-rated";
const RATED_KEYS: usize = 4;
const RATED_JOBS: usize = 96;
const RATED_WINDOW_MS: u64 = 50;
const RATED_STARTS: usize = 8;
const RATED_STARTS_PER_KEY: usize = 3;

/// A child of the rates test: two tasks claim from the rated queue until it is empty,
/// waiting for work (which ends when a rate frees a start) whenever a claim finds
/// nothing, and print `START <key> <id> <started_at>` for each job, `started_at` the
/// instant on the store's clock its claim dated the start at.
#[test]
fn child_rated_claimer() {
    run_child(|store, worker| async move {
        let queues = vec![RATED_QUEUE.to_owned()];
        let mut lines = Vec::new();
        loop {
            let request =
                ClaimRequest::new([RATED_QUEUE], worker.clone(), Duration::from_secs(600)).limit(4);
            let claimed = match store.claim(request).await {
                Ok(claimed) => claimed,
                Err(err) if err.is_retryable() => continue,
                Err(err) => panic!("{worker}: claim failed: {err}"),
            };
            if claimed.is_empty() {
                let stats = match store.stats(RATED_QUEUE).await {
                    Ok(stats) => stats,
                    Err(err) => panic!("{worker}: stats failed: {err}"),
                };
                if stats.ready == 0 {
                    break;
                }
                if let Err(err) = store.wait_for_work(&queues, Duration::from_secs(5)).await {
                    panic!("{worker}: wait failed: {err}");
                }
                continue;
            }
            for job in &claimed {
                let key = job.job.concurrency_key.clone().unwrap_or_default();
                let at = job.job.started_at.map_or(0, |at| at.as_millis());
                lines.push(format!("START {key} {} {at}", job.id()));
                if let Err(err) = store.complete(job.id(), job.token(), None).await {
                    panic!("{worker}: complete failed: {err}");
                }
            }
        }
        lines
    });
}

/// CONTRACT K4 across processes: three processes (two claimers each) drain 96 jobs of
/// 4 keys under at most 8 starts per 50 ms and 3 per key per 50 ms, on the machine's
/// clock. Each start is printed at the instant its claim dated it; merged, no 50 ms
/// holds more starts than a rate allows, and every job started exactly once.
#[test]
fn processes_never_start_more_than_a_rate_allows() {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("rated.db");
    let window = Duration::from_millis(RATED_WINDOW_MS);
    let jobs: Vec<NewJob> = (0..RATED_JOBS)
        .map(|n| NewJob::new(RATED_QUEUE).concurrency_key(format!("k{}", n % RATED_KEYS)))
        .collect();
    let ids = prepare(
        &db,
        RATED_QUEUE,
        durq_core::QueueLimits::new()
            .max_starts(durq_core::Rate::new(RATED_STARTS as u32, window))
            .max_starts_per_key(durq_core::Rate::new(RATED_STARTS_PER_KEY as u32, window)),
        jobs,
    );
    let mut starts: Vec<(i64, String, String)> = Vec::new();
    for line in run_children(&db, "rated", "child_rated_claimer", "START ") {
        let words: Vec<&str> = line.split(' ').collect();
        let [key, id, at] = words[..] else {
            panic!("a start line of three words expected: {line:?}");
        };
        starts.push((parse(at, &line), key.to_owned(), id.to_owned()));
    }
    let started: std::collections::HashSet<&str> = starts.iter().map(|s| s.2.as_str()).collect();
    assert_eq!(started.len(), starts.len(), "a job started twice");
    assert_eq!(started.len(), ids.len(), "every job started");
    starts.sort_unstable();
    let window = RATED_WINDOW_MS as i64;
    for (n, (from, _, _)) in starts.iter().enumerate() {
        let inside: Vec<&(i64, String, String)> = starts[n..]
            .iter()
            .take_while(|(at, _, _)| *at < from + window)
            .collect();
        assert!(
            inside.len() <= RATED_STARTS,
            "K4: {} starts across processes in the {window} ms from {from}, above the \
             rate of {RATED_STARTS}",
            inside.len()
        );
        for key in 0..RATED_KEYS {
            let key = format!("k{key}");
            let of_key = inside.iter().filter(|(_, k, _)| *k == key).count();
            assert!(
                of_key <= RATED_STARTS_PER_KEY,
                "K4: {of_key} starts of {key} across processes in the {window} ms from \
                 {from}, above its rate of {RATED_STARTS_PER_KEY}"
            );
        }
    }
}

/// The queue of the wait test's job, which only the child claims.
const WAIT_QUEUE: &str = "mp-wait";

/// The child of `a_wait_is_answered_when_another_process_ends_its_job`: claims the one
/// job of [`WAIT_QUEUE`] and completes it with a result. A no-op outside child mode.
#[test]
fn child_completer() {
    let (Ok(db), Ok(name)) = (std::env::var(CHILD_DB), std::env::var(CHILD_NAME)) else {
        return;
    };
    runtime().block_on(async move {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("child {name}: open failed: {err}"),
        };
        let request = ClaimRequest::new([WAIT_QUEUE], name.clone(), Duration::from_secs(60));
        let claimed = match store.claim(request).await {
            Ok(claimed) => claimed,
            Err(err) => panic!("child {name}: claim failed: {err}"),
        };
        assert_eq!(claimed.len(), 1, "child {name}: the one job is claimed");
        let job = &claimed[0];
        if let Err(err) = store
            .complete(job.id(), job.token(), Some("done elsewhere".into()))
            .await
        {
            panic!("child {name}: complete failed: {err}");
        }
    });
}

/// CONTRACT O2 across processes: a wait in this process is answered when a child
/// process completes its job. SQLite has no notifications between processes, so the
/// wait sees the other process's commit at its next read, every `poll_interval`.
#[test]
fn a_wait_is_answered_when_another_process_ends_its_job() {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("wait.db");
    runtime().block_on(async {
        let store = match config().open(&db, settings()).await {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        };
        let id = match store.enqueue(NewJob::new(WAIT_QUEUE)).await {
            Ok(enqueued) => enqueued.id,
            Err(err) => panic!("enqueue failed: {err}"),
        };
        let waiting = {
            let store = store.clone();
            tokio::spawn(async move { store.wait(id, Duration::from_secs(3600)).await })
        };
        let mut child = spawn_test(&db, "completer", "child_completer");
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap_or_else(|err| panic!("waiting for the child: {err}"));
        match status {
            Ok(status) => assert!(status.success(), "the child failed: {status}"),
            Err(err) => panic!("waiting for the child: {err}"),
        }
        let answer = match tokio::time::timeout(Duration::from_secs(30), waiting).await {
            Ok(Ok(Ok(Some(job)))) => job,
            other => panic!("the wait did not answer the ended job: {other:?}"),
        };
        assert_eq!(answer.state, JobState::Succeeded);
        assert_eq!(answer.result.as_deref(), Some(&b"done elsewhere"[..]));
    });
}

/// The queue of the event stream test, the queue of its "all enqueued" marker, and
/// how many jobs it runs.
const EVENTS_QUEUE: &str = "mp-events";
const EVENTS_DONE_QUEUE: &str = "mp-events-done";
const EVENT_JOBS: usize = 600;

/// A writer of the event stream test: claims from [`EVENTS_QUEUE`] in batches of
/// varying size, emits one event for each job and completes it, until a claim comes
/// back empty after the marker was seen. Answers how many jobs it completed.
async fn event_writer(store: Store, worker: String) -> usize {
    let queues = vec![EVENTS_QUEUE.to_owned()];
    let mut completed = 0;
    let mut limit = 1;
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{worker}: still writing after five minutes"
        );
        let all_enqueued = match store.stats(EVENTS_DONE_QUEUE).await {
            Ok(stats) => stats.ready > 0,
            Err(err) => panic!("{worker}: stats failed: {err}"),
        };
        let request = ClaimRequest::new(queues.clone(), worker.clone(), Duration::from_secs(600))
            .limit(limit);
        limit = limit % 5 + 1;
        let claimed = match store.claim(request).await {
            Ok(claimed) => claimed,
            Err(err) if err.is_retryable() => continue,
            Err(err) => panic!("{worker}: claim failed: {err}"),
        };
        if claimed.is_empty() {
            if all_enqueued {
                return completed;
            }
            let _ = store
                .wait_for_work(&queues, Duration::from_millis(200))
                .await;
            continue;
        }
        for job in claimed {
            let data = durq_core::Bytes::from(worker.clone().into_bytes());
            if let Err(err) = store.emit(job.id(), job.token(), "progress", data).await {
                panic!("{worker}: emit for {} failed: {err}", job.id());
            }
            if let Err(err) = store.complete(job.id(), job.token(), None).await {
                panic!("{worker}: complete of {} failed: {err}", job.id());
            }
            completed += 1;
        }
    }
}

/// Opens two stores on `db` with writer connections of their own (their configurations
/// differ, so they share no engine), neither recording events: the jobs carry their
/// mark from the store that enqueued them (V1).
async fn two_writer_connections(db: &Path) -> [Store; 2] {
    let mut stores = Vec::with_capacity(2);
    for config in [config(), config().max_group(64).readers(1)] {
        match config.open(db, settings()).await {
            Ok(backend) => stores.push(Store::new(backend)),
            Err(err) => panic!("open failed: {err}"),
        }
    }
    match <[Store; 2]>::try_from(stores) {
        Ok(stores) => stores,
        Err(_) => panic!("two stores"),
    }
}

/// Runs four [`event_writer`]s, two on each of `stores`, and answers how many jobs they
/// completed in all.
async fn run_event_writers(stores: &[Store; 2], name: &str) -> usize {
    let tasks: Vec<_> = (0..4)
        .map(|t| tokio::spawn(event_writer(stores[t % 2].clone(), format!("{name}-t{t}"))))
        .collect();
    let mut completed = 0;
    for task in tasks {
        match task.await {
            Ok(n) => completed += n,
            Err(err) => panic!("{name}: a writer failed: {err}"),
        }
    }
    completed
}

/// A child of the event stream test: four writers on two connections of its own.
#[test]
fn child_event_writer() {
    let (Ok(db), Ok(name)) = (std::env::var(CHILD_DB), std::env::var(CHILD_NAME)) else {
        return;
    };
    runtime().block_on(async move {
        let stores = two_writer_connections(Path::new(&db)).await;
        println!("\nREADY");
        let completed = run_event_writers(&stores, &name).await;
        println!("\nWROTE {completed}");
    });
}

/// CONTRACT V4 across processes and connections: three child processes and the parent,
/// each with four writers on two writer connections of its own (sixteen writers on
/// eight connections), claim, emit and complete jobs that a recording store enqueues
/// meanwhile, while a reader in the parent follows the stream from `next`, a page of
/// 17 at a time. Afterwards its recorded history holds each event once, skips none (it
/// equals a whole read of the stream) and holds each job's events in the order of its
/// changes: enqueued, started, emitted, succeeded.
#[test]
fn processes_changing_jobs_while_a_reader_follows_the_stream() {
    use durq_core::{Event, EventCursor, EventKind};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => panic!("no temp dir: {err}"),
    };
    let db = dir.path().join("events.db");
    let rt = runtime();
    let producer = rt.block_on(async {
        match config()
            .open(&db, settings().record_events(1_000_000))
            .await
        {
            Ok(backend) => Store::new(backend),
            Err(err) => panic!("open failed: {err}"),
        }
    });
    let enqueue = |range: std::ops::Range<usize>| {
        let producer = producer.clone();
        async move {
            for chunk in range.collect::<Vec<_>>().chunks(25) {
                let jobs = chunk.iter().map(|_| NewJob::new(EVENTS_QUEUE)).collect();
                if let Err(err) = producer.enqueue_batch(jobs).await {
                    panic!("enqueue failed: {err}");
                }
            }
        }
    };
    rt.block_on(enqueue(0..EVENT_JOBS / 3));

    let mut children: Vec<_> = (0..CHILDREN)
        .map(|n| spawn_test(&db, &format!("events{n}"), "child_event_writer"))
        .collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let readers: Vec<_> = children
        .iter_mut()
        .map(|child| read_child(child, "WROTE ", ready_tx.clone()))
        .collect();
    for _ in 0..CHILDREN {
        if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            panic!("a child did not start");
        }
    }

    let (history, pages_while_writing, parent_completed) = rt.block_on(async {
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (store, done) = (producer.clone(), done.clone());
            tokio::spawn(async move {
                let mut history: Vec<Event> = Vec::new();
                let mut cursor = EventCursor::START;
                let mut pages_while_writing = 0usize;
                loop {
                    // Read before the final look: once every writer ended, a read
                    // that finds nothing has read the whole stream.
                    let finished = done.load(Ordering::SeqCst);
                    let page = match store.events(cursor, 17).await {
                        Ok(page) => page,
                        Err(err) => panic!("the reader failed: {err}"),
                    };
                    assert!(!page.trimmed, "nothing was trimmed");
                    if page.events.is_empty() {
                        if finished {
                            return (history, pages_while_writing);
                        }
                        tokio::task::yield_now().await;
                        continue;
                    }
                    if !finished {
                        pages_while_writing += 1;
                    }
                    cursor = page.next;
                    history.extend(page.events);
                    // Four events a job: more means events read again, and the loop
                    // would not end.
                    assert!(
                        history.len() <= 4 * EVENT_JOBS,
                        "the reader reads events again"
                    );
                }
            })
        };
        let stores = two_writer_connections(&db).await;
        let writers = {
            let stores = stores.clone();
            tokio::spawn(async move { run_event_writers(&stores, "parent").await })
        };
        enqueue(EVENT_JOBS / 3..EVENT_JOBS).await;
        // The marker through a store that does not record: it is no event.
        if let Err(err) = stores[0].enqueue(NewJob::new(EVENTS_DONE_QUEUE)).await {
            panic!("enqueue of the marker failed: {err}");
        }
        let parent_completed = match writers.await {
            Ok(n) => n,
            Err(err) => panic!("the parent's writers failed: {err}"),
        };
        let statuses = tokio::task::spawn_blocking(move || {
            children
                .iter_mut()
                .map(|child| child.wait())
                .collect::<Vec<_>>()
        })
        .await;
        for status in statuses.unwrap_or_else(|err| panic!("waiting for the children: {err}")) {
            match status {
                Ok(status) => assert!(status.success(), "a child failed: {status}"),
                Err(err) => panic!("cannot wait for a child: {err}"),
            }
        }
        done.store(true, Ordering::SeqCst);
        match reader.await {
            Ok((history, pages)) => (history, pages, parent_completed),
            Err(err) => panic!("the reader failed: {err}"),
        }
    });

    let mut per_process = vec![parent_completed];
    for reader in readers {
        let lines = match reader.join() {
            Ok(lines) => lines,
            Err(_) => panic!("a reader thread panicked"),
        };
        let completed: usize = lines
            .iter()
            .map(|line| parse::<usize>(line.trim(), line))
            .sum();
        per_process.push(completed);
    }
    assert_eq!(
        per_process.iter().sum::<usize>(),
        EVENT_JOBS,
        "every job was completed once: {per_process:?}"
    );
    assert!(
        per_process.iter().filter(|n| **n > 0).count() >= 2,
        "only one process wrote: {per_process:?}"
    );
    assert!(
        pages_while_writing > 0,
        "the reader read while the writers wrote"
    );

    // The whole stream, read afterwards.
    let whole = rt.block_on(async {
        let mut whole: Vec<Event> = Vec::new();
        let mut cursor = EventCursor::START;
        loop {
            let page = match producer.events(cursor, 1_000).await {
                Ok(page) => page,
                Err(err) => panic!("read the stream: {err}"),
            };
            if page.events.is_empty() {
                return whole;
            }
            cursor = page.next;
            whole.extend(page.events);
        }
    });
    let cursors: std::collections::HashSet<EventCursor> =
        history.iter().map(|e| e.cursor).collect();
    assert_eq!(cursors.len(), history.len(), "an event was read twice");
    assert!(
        history.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "the reader's history is out of cursor order"
    );
    assert_eq!(history.len(), whole.len(), "the reader skipped events");
    assert!(history == whole, "the reader's history is not the stream");
    let mut by_job: HashMap<JobId, Vec<(EventKind, u32)>> = HashMap::new();
    for event in &history {
        by_job
            .entry(event.job)
            .or_default()
            .push((event.kind, event.attempt));
    }
    assert_eq!(by_job.len(), EVENT_JOBS);
    for (job, events) in by_job {
        assert_eq!(
            events,
            [
                (EventKind::Enqueued, 0),
                (EventKind::Started, 1),
                (EventKind::Emitted, 1),
                (EventKind::Succeeded, 1),
            ],
            "job {job}: its events in the order of its changes"
        );
    }
}
