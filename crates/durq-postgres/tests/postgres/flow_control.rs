//! Flow control across processes' memories: each handle remembers which queues had
//! limits when it last looked, and claims a queue it believes unlimited with the plain
//! statement. These pin what keeps that memory from ever costing a limit.
//!
//! And the limited claims' transactions: a handle's claims that wait together share
//! one, each getting its own share and lease; a claim dropped inside its group gives
//! its jobs back; a job changed while a claim waits to lease it is left out.

use durq_core::QueueLimits;

use super::*;

/// A handle that read the limits before another process set them still counts them:
/// its plain claim statement refuses the now-limited queue, and the claim goes through
/// the limited path, which passes over the key at its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handle_that_saw_no_limits_counts_limits_set_elsewhere() {
    let Some(first) = backend(&unique_name("jobs_flow_a"), 2).await else {
        return;
    };
    let Some(second) = backend(&unique_name("jobs_flow_b"), 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let (worker, admin) = (open(&first, settings.clone()), open(&second, settings));

    // The worker's handle learns that no queue has limits.
    assert!(worker
        .claim(ClaimRequest::new(["q"], "w", TTL))
        .await
        .expect("claim before any limit")
        .is_empty());
    admin
        .set_limits("q", QueueLimits::new().max_running_per_key(1))
        .await
        .expect("set the limits through the other pool");
    for _ in 0..3 {
        admin
            .enqueue(NewJob::new("q").concurrency_key("customer-1"))
            .await
            .expect("enqueue");
    }
    let unkeyed = admin.enqueue(NewJob::new("q")).await.expect("enqueue").id;

    let claimed = worker
        .claim(ClaimRequest::new(["q"], "w", TTL).limit(10))
        .await
        .expect("claim with limits it had not seen");
    let keyed: Vec<_> = claimed
        .iter()
        .filter(|job| job.job.concurrency_key.as_deref() == Some("customer-1"))
        .collect();
    assert_eq!(
        keyed.len(),
        1,
        "K1: one job of the key runs, not {}",
        keyed.len()
    );
    assert!(
        claimed.iter().any(|job| job.id() == unkeyed),
        "the job without a key is not held back"
    );
    assert!(worker
        .claim(ClaimRequest::new(["q"], "w", TTL).limit(10))
        .await
        .expect("claim again")
        .is_empty());

    // The limits removed elsewhere: the worker's handle, which now believes the queue
    // limited, claims what is left (through the limited path once, then as before).
    admin
        .set_limits("q", QueueLimits::new())
        .await
        .expect("remove the limits");
    for round in 0..2 {
        let claimed = worker
            .claim(ClaimRequest::new(["q"], "w", TTL))
            .await
            .expect("claim once the limits are gone");
        assert_eq!(claimed.len(), 1, "round {round}: the key's next job starts");
    }
    clean_up(&first, &namespace).await;
}

/// A queue's pause and its limits share its row of `queue_controls`: setting or
/// removing either keeps the other, and a paused queue with limits gives nothing to
/// the limited claim either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pauses_and_limits_of_one_queue_keep_each_other() {
    let Some(pool) = backend(&unique_name("jobs_flow_pause"), 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&pool, settings);
    let limits = QueueLimits::new().max_running(5);
    let job = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;

    store.set_limits("q", limits).await.expect("set limits");
    store.pause("q").await.expect("pause");
    assert!(store
        .claim(ClaimRequest::new(["q"], "w", TTL))
        .await
        .expect("claim a paused limited queue")
        .is_empty());
    store
        .set_limits("q", QueueLimits::new())
        .await
        .expect("remove");
    assert_eq!(
        store.paused_queues().await.expect("paused"),
        ["q"],
        "still paused"
    );
    store.set_limits("q", limits).await.expect("set again");
    store.resume("q").await.expect("resume");
    assert_eq!(
        store.limits("q").await.expect("limits"),
        limits,
        "still limited"
    );
    assert!(store.paused_queues().await.expect("paused").is_empty());
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", TTL))
        .await
        .expect("claim once resumed");
    assert_eq!(claimed.iter().map(|c| c.id()).collect::<Vec<_>>(), [job]);

    // Both gone: the queue has no row left.
    store
        .set_limits("q", QueueLimits::new())
        .await
        .expect("remove");
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs.queue_controls WHERE namespace = $1")
            .bind(&namespace)
            .fetch_one(pool.pool())
            .await
            .expect("count the rows");
    assert_eq!(rows, 0, "a queue neither paused nor limited has no row");
    clean_up(&pool, &namespace).await;
}

/// A caller that stops waiting halfway through a claim or a wait on a limited queue
/// (a worker's claim loop drops its wait whenever a job finishes) leaves no transaction
/// open on the pool's connection: what runs next on it commits. Each call is cut within
/// its first 30 µs, where sqlx's `begin` has sent `BEGIN` and waits for the answer
/// (dropped there, it hands the connection back inside the transaction), 200 times on a
/// pool of one connection, and each cut is followed by an enqueue, a claim and a
/// completion that another pool must then see. With sqlx's `begin` awaited on the
/// caller's task, the enqueue after the first cut is invisible to the other pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_flow_control_calls_leave_no_transaction_open() {
    let Some(pool) = backend(&unique_name("jobs_flow_cut"), 1).await else {
        return;
    };
    let Some(observer) = backend(&unique_name("jobs_flow_seen"), 1).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let (store, watcher) = (open(&pool, settings.clone()), open(&observer, settings));
    // A rate whose one start is used up: every claim of `q` finds nothing it may
    // take, and every wait on `q` reads when the rate frees a start.
    let rate = durq_core::Rate::new(1, Duration::from_secs(3600));
    store
        .set_limits("q", QueueLimits::new().max_starts(rate))
        .await
        .expect("set limits");
    for _ in 0..2 {
        store.enqueue(NewJob::new("q")).await.expect("enqueue");
    }
    assert_eq!(
        store
            .claim(ClaimRequest::new(["q"], "w", TTL))
            .await
            .expect("claim")
            .len(),
        1
    );
    let queues = ["q".to_owned()];
    for step in 0..200u64 {
        let cut = Duration::from_micros(step % 4 * 10);
        let wait = store.wait_for_work(&queues, Duration::from_secs(5));
        let _ = tokio::time::timeout(cut, wait).await;
        let claim = store.claim(ClaimRequest::new(["q"], "w", TTL));
        let _ = tokio::time::timeout(cut, claim).await;

        let id = store
            .enqueue(NewJob::new("other"))
            .await
            .expect("enqueue")
            .id;
        let held = store
            .claim(ClaimRequest::new(["other"], "w", TTL))
            .await
            .expect("claim");
        assert_eq!(held.len(), 1, "step {step}: the job is claimed");
        store
            .complete(id, held[0].token(), None)
            .await
            .expect("complete");
        let seen = watcher.get(id).await.expect("another pool sees the job");
        assert_eq!(
            seen.state,
            JobState::Succeeded,
            "step {step}: the completion committed"
        );
    }
    clean_up(&pool, &namespace).await;
}

/// A store with `limits` on queue `q`, on a pool of its own (`connections`, named
/// `app`), and two connections outside it: one to hold the jobs' rows, one to watch
/// the server.
struct HeldRows {
    app: String,
    pool: PostgresPool,
    blocker: PgPool,
    observer: PgPool,
    clock: ManualClock,
    namespace: String,
    store: Store,
}

impl HeldRows {
    /// `None` to skip (no server).
    async fn open(prefix: &str, connections: u32, limits: QueueLimits) -> Option<Self> {
        let app = unique_name(prefix);
        let pool = backend(&app, connections).await?;
        let (blocker, observer) = (admin().await?, admin().await?);
        let clock = ManualClock::default();
        let settings = settings(&clock);
        let namespace = settings.namespace.clone();
        let store = open(&pool, settings);
        store.set_limits("q", limits).await.expect("set limits");
        Some(HeldRows {
            app,
            pool,
            blocker,
            observer,
            clock,
            namespace,
            store,
        })
    }

    /// Holds a row lock on every job of the namespace, so that a claim's lease waits
    /// at the first of them; let go by committing or rolling back.
    async fn hold(&self) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut held = self.blocker.begin().await.expect("begin the blocker");
        sqlx::query("SELECT id FROM jobs.jobs WHERE namespace = $1 FOR UPDATE")
            .bind(&self.namespace)
            .execute(&mut *held)
            .await
            .expect("lock the jobs");
        held
    }

    /// Waits, on the server's own view and without a timer, until `count` (a query of
    /// one count, `$1` bound to `bind`) reaches `want`.
    async fn until(&self, count: &'static str, bind: &str, want: i64, what: &str) {
        let reached = async {
            loop {
                let now: i64 = sqlx::query_scalar(count)
                    .bind(bind)
                    .fetch_one(&self.observer)
                    .await
                    .expect("count");
                if now == want {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), reached)
            .await
            .unwrap_or_else(|_| panic!("{what}"));
    }

    /// Waits until a session of the store's pool waits for a row lock.
    async fn until_a_lease_waits(&self) {
        self.until(
            "SELECT least(count(*), 1) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
            &self.app,
            1,
            "the claim's lease waits for the held rows",
        )
        .await;
    }

    async fn clean_up(self) {
        clean_up(&self.pool, &self.namespace).await;
    }
}

/// Limited claims of one handle that wait together are answered by one transaction,
/// and each gets what it would have got alone, one after another: its share of the
/// admitted jobs in claim order (K1 counted across all of them), leased to its own
/// worker for its own lease time.
///
/// The first claim's lease is held at a row lock while seven more queue up behind it
/// (one thread: each is polled once, in spawn order, before the lock is let go), so
/// the seven are one group, in that order. 32 jobs over 8 keys, two running per key:
/// the first claim takes jobs 0–3, the group the next 12, none more.
#[tokio::test]
async fn claims_waiting_together_get_their_own_share_and_lease() {
    let limits = QueueLimits::new().max_running_per_key(2);
    let Some(rows) = HeldRows::open("jobs_flow_group", 4, limits).await else {
        return;
    };
    let store = &rows.store;
    let mut ids = Vec::new();
    for n in 0..32 {
        let job = NewJob::new("q").concurrency_key(format!("key-{}", n % 8));
        ids.push(store.enqueue(job).await.expect("enqueue").id);
    }
    let now = rows.clock.now();
    let held = rows.hold().await;
    let claim = |n: u64| {
        let store = store.clone();
        let request =
            ClaimRequest::new(["q"], format!("worker-{n}"), TTL + Duration::from_secs(n)).limit(4);
        tokio::spawn(async move { store.claim(request).await.expect("claim") })
    };
    let first = claim(0);
    rows.until_a_lease_waits().await;
    let rest: Vec<_> = (1..8).map(claim).collect();
    tokio::task::yield_now().await;
    held.rollback().await.expect("let the rows go");

    let mut answers = vec![first.await.expect("first claim")];
    for handle in rest {
        answers.push(handle.await.expect("claim"));
    }
    for (n, answer) in answers.iter().enumerate() {
        let expected: &[JobId] = match n {
            0..=3 => &ids[n * 4..n * 4 + 4],
            _ => &[],
        };
        let got: Vec<JobId> = answer.iter().map(|job| job.id()).collect();
        assert_eq!(got, expected, "claim {n}: its share, in claim order");
        for job in answer {
            let lease = job.job.lease.as_ref().expect("a claimed job has a lease");
            assert_eq!(lease.worker, format!("worker-{n}"), "claim {n}: its worker");
            assert_eq!(
                lease.expires_at,
                now.saturating_add(TTL + Duration::from_secs(n as u64)),
                "claim {n}: its lease time"
            );
            let stored = store.get(job.id()).await.expect("get");
            assert_eq!(stored.lease, job.job.lease, "claim {n}: as stored");
        }
    }
    rows.clean_up().await;
}

/// A limited claim whose caller stops waiting after its group took it gives its jobs
/// back as soon as the group's transaction ends (L8: ready now, the attempt not
/// counted), instead of leaving them leased to nobody until the lease expires.
#[tokio::test]
async fn a_claim_dropped_inside_its_group_gives_its_jobs_back() {
    let limits = QueueLimits::new().max_running_per_key(1);
    let Some(rows) = HeldRows::open("jobs_flow_drop", 2, limits).await else {
        return;
    };
    let store = &rows.store;
    for key in ["a", "b"] {
        store
            .enqueue(NewJob::new("q").concurrency_key(key))
            .await
            .expect("enqueue");
    }
    let held = rows.hold().await;
    let dropped = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .claim(ClaimRequest::new(["q"], "gone", TTL).limit(2))
                .await
        })
    };
    rows.until_a_lease_waits().await;
    dropped.abort();
    assert!(dropped.await.is_err_and(|err| err.is_cancelled()));
    held.rollback().await.expect("let the rows go");

    // Leased by the group once the rows are free, then released: queued again, with
    // a lease token spent.
    rows.until(
        "SELECT count(*) FROM jobs.jobs
         WHERE namespace = $1 AND state = 'queued' AND lease_token > 0",
        &rows.namespace,
        2,
        "the dropped claim's jobs go back to the queue",
    )
    .await;
    let again = store
        .claim(ClaimRequest::new(["q"], "next", TTL).limit(2))
        .await
        .expect("claim again");
    assert_eq!(again.len(), 2, "both jobs are ready again");
    for job in &again {
        assert_eq!(job.job.attempts, 1, "the released attempt is not counted");
    }
    rows.clean_up().await;
}

/// A limited claim reads the ready jobs without locking them (the queue's lock keeps
/// other claims out), so a job another call changes between that read and the lease
/// must be left out by the lease itself: here a job is cancelled by a transaction the
/// lease waits for, and the claim returns the others; the cancelled job stays
/// cancelled, never running.
#[tokio::test]
async fn a_job_changed_while_a_limited_claim_waits_is_not_leased() {
    let limits = QueueLimits::new().max_running_per_key(1);
    let Some(rows) = HeldRows::open("jobs_flow_changed", 2, limits).await else {
        return;
    };
    let store = &rows.store;
    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        let job = NewJob::new("q").concurrency_key(key);
        ids.push(store.enqueue(job).await.expect("enqueue").id);
    }
    let mut held = rows.hold().await;
    let claim = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .claim(ClaimRequest::new(["q"], "w", TTL).limit(3))
                .await
                .expect("claim")
        })
    };
    rows.until_a_lease_waits().await;
    sqlx::query(
        "UPDATE jobs.jobs SET state = 'cancelled', finished_at = created_at
         WHERE namespace = $1 AND id = $2::text::uuid",
    )
    .bind(&rows.namespace)
    .bind(ids[1].to_string())
    .execute(&mut *held)
    .await
    .expect("cancel a job under the claim");
    held.commit().await.expect("commit the cancel");

    let claimed: Vec<JobId> = claim
        .await
        .expect("claim")
        .iter()
        .map(|job| job.id())
        .collect();
    assert_eq!(claimed, [ids[0], ids[2]], "the cancelled job is left out");
    let cancelled = store.get(ids[1]).await.expect("get");
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(cancelled.lease, None, "never leased");
    rows.clean_up().await;
}
