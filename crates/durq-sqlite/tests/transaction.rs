//! The caller's transactions (CONTRACT §7) on real SQLite files: jobs enqueued and
//! completed inside the caller's own write transaction commit with the caller's rows or
//! not at all, wake waiters only on commit, and a stale completion spoils the whole
//! transaction.
//!
//! `child_holds_an_open_transaction` does its work only when `JOBS_SQLITE_TX_CHILD_DB`
//! is set: the kill test runs this binary again as that child.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durq_core::{
    AttemptOutcome, Bytes, ClaimRequest, Clock, Error, JobId, JobState, ManualClock, NewJob,
    QueueStats, Store, StoreSettings, Timestamp,
};
use durq_sqlite::rusqlite::{self, Connection};
use durq_sqlite::{SqliteBackend, SqliteConfig};

const QUEUE: &str = "orders";
const CHILD_DB: &str = "JOBS_SQLITE_TX_CHILD_DB";
const MAX_PAYLOAD: usize = 1024;

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    backend: SqliteBackend,
    store: Store,
    clock: Arc<ManualClock>,
}

fn settings(clock: &Arc<ManualClock>) -> StoreSettings {
    StoreSettings::default()
        .namespace("transactions")
        .max_payload_bytes(MAX_PAYLOAD)
        .clock(clock.clone())
}

async fn open_store(path: &Path, clock: &Arc<ManualClock>, config: SqliteConfig) -> SqliteBackend {
    config
        .open(path, settings(clock))
        .await
        .expect("open the store")
}

/// A store on a fresh file with the `orders` table next to the queue's tables.
async fn fixture(config: SqliteConfig) -> Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("jobs.db");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = open_store(&path, &clock, config).await;
    let conn = backend.connection().expect("a connection");
    create_orders(&conn);
    Fixture {
        _dir: dir,
        path,
        store: Store::new(backend.clone()),
        backend,
        clock,
    }
}

fn create_orders(conn: &Connection) {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)",
    )
    .expect("create the orders table");
}

fn place_order(conn: &Connection, item: &str) {
    conn.execute("INSERT INTO orders (item) VALUES (?1)", [item])
        .expect("insert an order");
}

fn orders(conn: &Connection) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM orders", [], |row| row.get(0))
        .expect("count the orders")
}

fn total(stats: &QueueStats) -> u64 {
    stats.ready + stats.scheduled + stats.running + stats.succeeded + stats.dead + stats.cancelled
}

async fn assert_no_job(store: &Store, id: JobId) {
    match store.get(id).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("job {id} should not exist: {other:?}"),
    }
}

fn claim_request(ttl: Duration) -> ClaimRequest {
    ClaimRequest::new([QUEUE], "worker", ttl).limit(10)
}

/// T1, T2: a rolled-back transaction leaves no job and wakes nobody; a committed one
/// wakes the waiter at once (not at its 60 s poll) and its job is claimable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_committed_transaction_creates_its_job_and_wakes_waiters() {
    let poll = Duration::from_secs(60);
    let f = fixture(SqliteConfig::default().poll_interval(poll)).await;
    let mut conn = f.backend.connection().expect("a connection");

    let waiter = {
        let store = f.store.clone();
        tokio::spawn(async move {
            store
                .wait_for_work(&[QUEUE.to_owned()], Duration::from_secs(120))
                .await
                .expect("wait_for_work");
            Instant::now()
        })
    };
    let mut waiter = waiter;
    // Many rolled-back and dropped transactions, so that the waiter (which parks within
    // microseconds of its spawn, on another thread) is parked for most of them: a
    // wake-up sent by any of them would end its wait before the commit below.
    let mut gone = Vec::new();
    for n in 0..20 {
        let mut tx = f.backend.transaction(&mut conn).expect("begin");
        place_order(&tx, "never kept");
        let id = tx.enqueue(NewJob::new(QUEUE)).expect("enqueue").id;
        // Invisible to the store's own connections until the commit.
        assert_no_job(&f.store, id).await;
        if n % 2 == 0 {
            tx.rollback().expect("roll back");
        } else {
            drop(tx);
        }
        gone.push(id);
    }
    for id in gone {
        assert_no_job(&f.store, id).await;
    }
    assert_eq!(total(&f.store.stats(QUEUE).await.expect("stats")), 0);
    assert_eq!(orders(&conn), 0);

    let started = Instant::now();
    let committed = {
        let mut tx = f.backend.transaction(&mut conn).expect("begin");
        place_order(&tx, "committed");
        let id = tx.enqueue(NewJob::new(QUEUE)).expect("enqueue").id;
        tx.commit().expect("commit");
        id
    };
    let woken_at = tokio::time::timeout(Duration::from_secs(5), &mut waiter)
        .await
        .expect("the commit wakes the waiter")
        .expect("the waiter task");
    assert!(
        woken_at >= started,
        "a rolled-back or dropped transaction woke the waiter"
    );
    assert!(
        started.elapsed() < poll / 10,
        "woken after {:?}, by the poll rather than the commit",
        started.elapsed()
    );
    let claimed = f
        .store
        .claim(claim_request(Duration::from_secs(30)))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), committed);
    assert_eq!(orders(&conn), 1);
}

/// T1: the committed job lives its normal life, next to the business row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_job_is_claimed_and_completed_normally() {
    let f = fixture(SqliteConfig::default()).await;
    let mut conn = f.backend.connection().expect("a connection");
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "book");
    let enqueued = tx
        .enqueue(NewJob::new(QUEUE).payload("send confirmation"))
        .expect("enqueue");
    assert!(enqueued.created);
    tx.commit().expect("commit");
    // The store-wide sequence was written back with the commit: the next job enqueued
    // through the store's writer is ordered after this one (C3).
    let later = f
        .store
        .enqueue(NewJob::new(QUEUE))
        .await
        .expect("enqueue")
        .id;
    let seq_of = |id: JobId| -> i64 {
        conn.query_row(
            "SELECT seq FROM jobq_jobs WHERE id = ?1",
            [id.to_bytes().to_vec()],
            |row| row.get(0),
        )
        .expect("read a job's seq")
    };
    assert!(seq_of(enqueued.id) < seq_of(later));

    let claimed = f
        .store
        .claim(claim_request(Duration::from_secs(30)))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed[0].id(), enqueued.id);
    assert_eq!(&claimed[0].payload[..], b"send confirmation");
    f.store
        .complete(enqueued.id, claimed[0].token(), None)
        .await
        .expect("complete");
    let job = f.store.get(enqueued.id).await.expect("get");
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(orders(&conn), 1);
}

/// E11, E12, H2 through the caller's transaction: an enqueue stores its tags and trace
/// context as the store's does (and refuses bad tags, leaving the transaction usable);
/// a fenced completion ends the attempt as succeeded, with the lease's worker kept and
/// no lease shown, and writes no attempt record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_keeps_tags_trace_context_and_attempts_as_the_store_does() {
    let f = fixture(SqliteConfig::default()).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut conn = f.backend.connection().expect("a connection");
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    let refused = tx.enqueue(NewJob::new(QUEUE).tag("bad key", "v"));
    assert!(
        matches!(&refused, Err(Error::InvalidInput { field: "tags", .. })),
        "{refused:?}"
    );
    let id = tx
        .enqueue(
            NewJob::new(QUEUE)
                .tag("order", "17")
                .trace_context(traceparent),
        )
        .expect("enqueue")
        .id;
    tx.commit().expect("commit");
    let job = f.store.get(id).await.expect("get");
    assert_eq!(job.tags.get("order").map(String::as_str), Some("17"));
    assert_eq!(job.trace_context.as_deref(), Some(traceparent));

    let claimed = f
        .store
        .claim(claim_request(Duration::from_secs(30)))
        .await
        .expect("claim");
    assert_eq!(claimed[0].job.tags, job.tags);
    f.clock.advance(Duration::from_millis(9));
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    let _receipt = tx.complete(id, claimed[0].token(), None).expect("complete");
    tx.commit().expect("commit");
    let history = f.store.attempts(id).await.expect("attempts");
    assert_eq!(history.len(), 1);
    assert_eq!(
        (
            history[0].outcome,
            history[0].worker.as_str(),
            history[0].token,
            history[0].ended_at
        ),
        (
            AttemptOutcome::Succeeded,
            "worker",
            claimed[0].token(),
            Some(f.clock.now())
        )
    );
    assert_eq!(f.store.get(id).await.expect("get").lease, None);
    let records: i64 = conn
        .query_row("SELECT COUNT(*) FROM jobq_attempts", [], |row| row.get(0))
        .expect("count the attempt records");
    assert_eq!(records, 0, "a completion writes no attempt record");
}

/// T3: a completion in the caller's transaction commits with the caller's row; a stale
/// one spoils the transaction, whose row is then never committed, and leaves the job to
/// its new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_completion_commits_with_the_callers_rows_or_spoils_them() {
    let f = fixture(SqliteConfig::default()).await;
    let mut conn = f.backend.connection().expect("a connection");

    // Current lease: the receipt row and the completion commit together.
    let first = f
        .store
        .enqueue(NewJob::new(QUEUE))
        .await
        .expect("enqueue")
        .id;
    let claimed = f
        .store
        .claim(claim_request(Duration::from_secs(30)))
        .await
        .expect("claim");
    assert_eq!(claimed[0].id(), first);
    let token = claimed[0].token();
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "receipt 1");
    let receipt = tx
        .complete(first, token, Some(Bytes::from_static(b"sent")))
        .expect("complete");
    assert_eq!((receipt.id(), receipt.token()), (first, token));
    tx.commit().expect("commit");
    let job = f.store.get(first).await.expect("get");
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result.as_deref(), Some(&b"sent"[..]));
    assert_eq!(orders(&conn), 1);

    // Stale lease: reclaimed and claimed again before the old holder completes.
    let second = f
        .store
        .enqueue(NewJob::new(QUEUE))
        .await
        .expect("enqueue")
        .id;
    let old = f
        .store
        .claim(claim_request(Duration::from_secs(1)))
        .await
        .expect("claim");
    assert_eq!(old[0].id(), second);
    let old_token = old[0].token();
    f.clock.advance(Duration::from_secs(2));
    assert_eq!(f.store.reclaim(10).await.expect("reclaim").len(), 1);
    let new = f
        .store
        .claim(claim_request(Duration::from_secs(30)))
        .await
        .expect("claim again");
    assert_eq!(new[0].id(), second);
    let new_token = new[0].token();
    assert_ne!(new_token, old_token);

    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "receipt 2, stale");
    match tx.complete(second, old_token, Some(Bytes::from_static(b"stale"))) {
        Err(Error::LeaseLost { id }) => assert_eq!(id, second),
        other => panic!("a stale completion must be LeaseLost: {other:?}"),
    }
    assert!(matches!(tx.spoiled(), Some(Error::LeaseLost { .. })));
    // Spoiled: every later call answers the same error.
    assert!(matches!(
        tx.enqueue(NewJob::new(QUEUE)),
        Err(Error::LeaseLost { .. })
    ));
    match tx.commit() {
        Err(Error::LeaseLost { id }) => assert_eq!(id, second),
        other => panic!("the spoiled commit must answer LeaseLost: {other:?}"),
    }
    assert_eq!(orders(&conn), 1, "the stale holder's row was committed");
    let job = f.store.get(second).await.expect("get");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.lease.map(|lease| lease.token), Some(new_token));
    assert_eq!(total(&f.store.stats(QUEUE).await.expect("stats")), 2);
    f.store
        .complete(second, new_token, None)
        .await
        .expect("the new holder completes");
    assert_eq!(
        f.store.get(second).await.expect("get").state,
        JobState::Succeeded
    );

    // A completion of a job that does not exist spoils the transaction too.
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "receipt of nothing");
    let missing = JobId::mint(f.store.now());
    assert!(matches!(
        tx.complete(missing, new_token, None),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(tx.commit(), Err(Error::NotFound { .. })));
    assert_eq!(orders(&conn), 1);
}

/// Same front door: bad input is refused with the handle's error, writes nothing, and
/// leaves the transaction usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_is_refused_and_leaves_the_transaction_usable() {
    let f = fixture(SqliteConfig::default()).await;
    let mut conn = f.backend.connection().expect("a connection");
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "kept");
    assert!(matches!(
        tx.enqueue(NewJob::new("bad queue!")),
        Err(Error::InvalidInput { field: "queue", .. })
    ));
    assert!(matches!(
        tx.enqueue(NewJob::new(QUEUE).payload(vec![0u8; MAX_PAYLOAD + 1])),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        tx.enqueue_batch(vec![NewJob::new(QUEUE), NewJob::new("")]),
        Err(Error::InvalidInput { .. })
    ));
    let someone = JobId::mint(f.store.now());
    assert!(matches!(
        tx.complete(
            someone,
            durq_core::LeaseToken::new(1),
            Some(Bytes::from(vec![0u8; MAX_PAYLOAD + 1]))
        ),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert!(tx.spoiled().is_none(), "bad input spoiled the transaction");
    assert!(tx
        .enqueue_batch(Vec::new())
        .expect("empty batch")
        .is_empty());
    tx.commit().expect("commit");
    assert_eq!(orders(&conn), 1);
    assert_eq!(total(&f.store.stats(QUEUE).await.expect("stats")), 0);
}

/// E9 in a transaction: a batch naming a missing parent is refused whole; the caller's
/// row and a later valid batch still commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_missing_parent_is_refused_whole() {
    let f = fixture(SqliteConfig::default()).await;
    let mut conn = f.backend.connection().expect("a connection");
    let mut tx = f.backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "kept");
    let missing = JobId::mint(f.store.now());
    let refused = tx.enqueue_batch(vec![
        NewJob::new(QUEUE).idempotency_key("first-of-refused"),
        NewJob::new(QUEUE).parent(missing),
    ]);
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput {
                field: "parent",
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(tx.spoiled().is_none());
    let kept = tx
        .enqueue_batch(vec![NewJob::new(QUEUE), NewJob::new(QUEUE)])
        .expect("a valid batch");
    tx.commit().expect("commit");
    assert_eq!(orders(&conn), 1);
    // Two jobs: those of the valid batch, none of the refused one.
    assert_eq!(total(&f.store.stats(QUEUE).await.expect("stats")), 2);
    for enqueued in kept {
        f.store.get(enqueued.id).await.expect("a kept job");
    }
    // The refused batch's key was never recorded: enqueueing it creates a job.
    let again = f
        .store
        .enqueue(NewJob::new(QUEUE).idempotency_key("first-of-refused"))
        .await
        .expect("enqueue");
    assert!(again.created);
}

/// E2, E4 across transactions: 8 threads x 20 transactions over 5 keys make exactly 5
/// jobs, every answer for a key names its job, and every business row commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_share_idempotency_keys() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 20;
    const KEYS: usize = 5;
    let f = fixture(SqliteConfig::default().busy_timeout(Duration::from_secs(60))).await;
    let answers = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let backend = f.backend.clone();
                scope.spawn(move || {
                    let mut conn = backend.connection().expect("a connection");
                    let mut answers = Vec::new();
                    for round in 0..ROUNDS {
                        let key = format!("key-{}", (thread * ROUNDS + round) % KEYS);
                        let mut tx = backend.transaction(&mut conn).expect("begin");
                        place_order(&tx, &format!("{thread}/{round}"));
                        let enqueued = tx
                            .enqueue(NewJob::new(QUEUE).idempotency_key(key.clone()))
                            .expect("enqueue");
                        tx.commit().expect("commit");
                        answers.push((key, enqueued));
                    }
                    answers
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("a transaction thread"))
            .collect::<Vec<_>>()
    });
    assert_eq!(answers.len(), THREADS * ROUNDS);
    let mut by_key: HashMap<String, HashSet<JobId>> = HashMap::new();
    for (key, enqueued) in &answers {
        by_key.entry(key.clone()).or_default().insert(enqueued.id);
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, ids) in &by_key {
        assert_eq!(ids.len(), 1, "key {key} was answered with {ids:?}");
    }
    assert_eq!(answers.iter().filter(|(_, e)| e.created).count(), KEYS);
    assert_eq!(
        total(&f.store.stats(QUEUE).await.expect("stats")),
        KEYS as u64
    );
    let conn = f.backend.connection().expect("a connection");
    assert_eq!(orders(&conn), (THREADS * ROUNDS) as i64);
}

/// The child of the kill test: opens the store, writes a row and a job in a transaction
/// it never commits, says so, and waits to be killed.
#[test]
fn child_holds_an_open_transaction() {
    let Ok(db) = std::env::var(CHILD_DB) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)));
    let backend = runtime.block_on(open_store(Path::new(&db), &clock, SqliteConfig::default()));
    let mut conn = backend.connection().expect("a connection");
    let mut tx = backend.transaction(&mut conn).expect("begin");
    place_order(&tx, "never committed");
    tx.enqueue(NewJob::new(QUEUE).payload(vec![7u8; 512]))
        .expect("enqueue");
    let mut stdout = std::io::stdout();
    writeln!(stdout, "READY").expect("write");
    stdout.flush().expect("flush");
    // Killed while it waits here; should the parent die first, its end of the pipe
    // closes and so does this wait, so an orphan does not linger.
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(tx);
}

/// T4: a process killed between its business write and its commit leaves neither, and
/// the file stays sound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_before_its_commit_leaves_nothing() {
    if std::env::var(CHILD_DB).is_ok() {
        return;
    }
    let f = fixture(SqliteConfig::default()).await;
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_holds_an_open_transaction",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_DB, &f.path)
        // Held open until the kill: the child waits on it.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("the child's stdout");
    let ready = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
            // The harness prints "test <name> ... " first, on the same line.
            .any(|line| line.trim_end().ends_with("READY"))
    });
    let ready = tokio::time::timeout(Duration::from_secs(60), ready)
        .await
        .expect("the child reports READY in time")
        .expect("the reader");
    // SIGKILL on Unix: no destructor, no rollback, the transaction just stops.
    child.kill().expect("kill the child");
    child.wait().expect("reap the child");
    assert!(ready, "the child ended without saying READY");

    let Fixture {
        _dir,
        path,
        backend,
        store,
        clock,
    } = f;
    drop(store);
    drop(backend);
    let backend = open_store(&path, &clock, SqliteConfig::default()).await;
    let store = Store::new(backend.clone());
    let conn = backend.connection().expect("a connection");
    assert_eq!(orders(&conn), 0, "the killed transaction's row survived");
    assert_eq!(total(&store.stats(QUEUE).await.expect("stats")), 0);
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check");
    assert_eq!(check, "ok");
    let enqueued = store.enqueue(NewJob::new(QUEUE)).await.expect("enqueue");
    store.get(enqueued.id).await.expect("the new job");
}

/// A connection on another file (or none) is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_on_another_file_is_refused() {
    let f = fixture(SqliteConfig::default()).await;
    let other_path = f.path.with_file_name("other.db");
    let mut other = Connection::open(&other_path).expect("open another file");
    match f.backend.transaction(&mut other) {
        Err(Error::InvalidInput {
            field: "connection",
            ..
        }) => {}
        other => panic!("a connection on another file must be refused: {other:?}"),
    }
    let tables: i64 = other
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |row| row.get(0))
        .expect("count the other file's tables");
    assert_eq!(tables, 0, "something was written to the other file");
    assert!(other.is_autocommit(), "a transaction was left open");

    let mut memory = Connection::open_in_memory().expect("an in-memory database");
    assert!(matches!(
        f.backend.transaction(&mut memory),
        Err(Error::InvalidInput {
            field: "connection",
            ..
        })
    ));

    // Another store's file is another file, even with the same namespace.
    let other_store = open_store(&other_path, &f.clock, SqliteConfig::default()).await;
    let mut theirs = other_store.connection().expect("a connection");
    assert!(matches!(
        f.backend.transaction(&mut theirs),
        Err(Error::InvalidInput { .. })
    ));

    // A connection already inside a transaction is refused too, and left as it was.
    let mut busy = f.backend.connection().expect("a connection");
    busy.execute_batch("BEGIN").expect("begin");
    assert!(matches!(
        f.backend.transaction(&mut busy),
        Err(Error::InvalidInput { .. })
    ));
    busy.execute_batch("ROLLBACK").expect("rollback");

    // The store's file however it is spelled, on a connection the caller opened.
    let spelled = f
        .path
        .parent()
        .expect("a directory")
        .join(".")
        .join("jobs.db");
    let mut own = Connection::open(&spelled).expect("open the store's file");
    own.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mut tx = f
        .backend
        .transaction(&mut own)
        .expect("the store's own file");
    tx.enqueue(NewJob::new(QUEUE)).expect("enqueue");
    tx.commit().expect("commit");
    assert_eq!(total(&f.store.stats(QUEUE).await.expect("stats")), 1);
    drop::<rusqlite::Connection>(own);
}
