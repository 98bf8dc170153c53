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
