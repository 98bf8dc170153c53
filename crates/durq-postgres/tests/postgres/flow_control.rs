//! Flow control across processes' memories: each handle remembers which queues had
//! limits when it last looked, and claims a queue it believes unlimited with the plain
//! statement. These pin what keeps that memory from ever costing a limit.

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
