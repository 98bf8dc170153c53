//! Rules P1–P3: where a partitioned store keeps its jobs, the claim order within a
//! partition, and the limits a key keeps in its partition (CONTRACT §8). They run on a
//! store that declares `Capabilities::partitioning` and pass, saying so, on any other.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use durq_core::{JobId, NewJob, Partitioning, QueueLimits, Rate, Store};

use super::support::{
    assert_claim_order, assert_nothing_claimable, claim, enqueue, expect_invalid, ids_of, Must,
};
use crate::{Harness, TestEnv};

/// The store's partitioning, or `None` after saying the scenario does not apply.
fn partitioning(store: &Store, rule: &str) -> Option<Partitioning> {
    let partitioning = store.capabilities().partitioning;
    if partitioning.is_none() {
        eprintln!("{rule} skipped: the store is not partitioned");
    }
    partitioning
}

/// P1: the jobs of one idempotency key share its partition, a job without a key lives
/// with its parent, and jobs with neither reach every partition.
pub async fn p1_jobs_live_with_their_key_or_parent_and_others_spread(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let Some(partitioning) = partitioning(&store, "P1") else {
        return;
    };
    let count = partitioning.count();
    let mut spread = vec![0usize; count];
    let mut parents = Vec::new();
    for _ in 0..count * 4 {
        let id = enqueue(&store, NewJob::new("spread"), "P1").await;
        assert!(partitioning.of(id) < count, "P1: a partition of {count}");
        spread[partitioning.of(id)] += 1;
        parents.push(id);
    }
    assert!(
        spread.iter().all(|n| *n > 0),
        "P1: jobs enqueued one at a time with neither key nor parent reach every partition: {spread:?}"
    );
    for (n, parent) in parents.iter().enumerate().take(count * 2) {
        let child = enqueue(&store, NewJob::new("children").parent(*parent), "P1").await;
        assert_eq!(
            partitioning.of(child),
            partitioning.of(*parent),
            "P1: a job without a key lives in its parent's partition (child {n})"
        );
        // A key decides: the same key with and without a parent is one job.
        let key = format!("key-{n}");
        let keyed = store
            .enqueue(NewJob::new("keyed").parent(*parent).idempotency_key(&key))
            .await
            .must("P1: keyed child");
        let again = store
            .enqueue(NewJob::new("keyed").idempotency_key(&key))
            .await
            .must("P1: the key again");
        assert_eq!(
            (again.id, again.created),
            (keyed.id, false),
            "P1: every job of one key lives in the key's partition, so E2 holds"
        );
    }
    let children: Vec<JobId> = store
        .children(parents[0])
        .await
        .must("P1: children")
        .iter()
        .map(|job| job.id)
        .collect();
    assert_eq!(children.len(), 2, "P1: E8 across partitions: {children:?}");
}

/// P2: claims of a few jobs at a time return, per partition, that partition's jobs in
/// claim order, and as many jobs as are ready up to the limit.
pub async fn p2_claims_keep_the_order_within_each_partition(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let Some(partitioning) = partitioning(&store, "P2") else {
        return;
    };
    let jobs = partitioning.count() * 6;
    let mut expected: Vec<(i16, usize, JobId)> = Vec::new();
    for n in 0..jobs {
        // Priorities from three bands, in an order unrelated to enqueue order.
        let priority = [2, 0, 1][n % 3];
        let id = enqueue(&store, NewJob::new("p2").priority(priority), "P2").await;
        expected.push((priority, n, id));
    }
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let expected: Vec<JobId> = expected.iter().map(|e| e.2).collect();
    let mut claimed = Vec::new();
    for limit in [1, 5, 2, 7].into_iter().cycle() {
        let ready = jobs - claimed.len();
        if ready == 0 {
            break;
        }
        let batch = ids_of(&claim(&store, &["p2"], limit, "P2: claim").await);
        assert_eq!(
            batch.len(),
            limit.min(ready),
            "P2: a claim of {limit} with {ready} ready returns min(limit, ready) jobs, from every partition"
        );
        claimed.extend(batch);
    }
    assert_claim_order(
        &store,
        &claimed,
        &expected,
        "P2: each partition's jobs are claimed by priority, then enqueue order",
    );
}

/// P3: on a partitioned store with flow control, every job of one (queue, concurrency
/// key) lives in one partition, so a key's limits hold as written (K1, K4 per key)
/// while its queue is spread over several partitions; a job with both an idempotency
/// key and a concurrency key is refused, writing nothing; and a store that counts only
/// per key refuses the limits that count a whole queue, naming them, writing nothing.
pub async fn p3_a_keys_jobs_share_a_partition_and_keep_its_limits(harness: &dyn Harness) {
    const KEYS: usize = 12;
    const PER_KEY: usize = 4;
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let Some(partitioning) = partitioning(&store, "P3") else {
        return;
    };
    let per = Duration::from_secs(60);
    let limits = QueueLimits::new()
        .max_running_per_key(1)
        .max_starts_per_key(Rate::new(2, per));
    store.set_limits("q", limits).await.must("P3: set_limits");
    let jobs: Vec<NewJob> = (0..KEYS * PER_KEY)
        .map(|n| NewJob::new("q").concurrency_key(format!("key-{:02}", n % KEYS)))
        .collect();
    let enqueued = store.enqueue_batch(jobs).await.must("P3: enqueue");
    let mut home: HashMap<usize, usize> = HashMap::new();
    let mut key_of: HashMap<JobId, usize> = HashMap::new();
    for (n, answer) in enqueued.iter().enumerate() {
        let key = n % KEYS;
        let partition = partitioning.of(answer.id);
        assert_eq!(
            *home.entry(key).or_insert(partition),
            partition,
            "P3: every job of key-{key:02} lives in one partition"
        );
        key_of.insert(answer.id, key);
    }
    let used: HashSet<usize> = home.values().copied().collect();
    assert!(
        used.len() > 1,
        "P3: {KEYS} keys spread their queue over several partitions, not one ({used:?})"
    );

    // Two rounds: a claim of every partition starts one job of each key (K1), and once
    // they end, one more (the rate's second start, K4).
    for round in 1..=2 {
        let claimed = claim(&store, &["q"], 1_000, "P3: a claim of every key").await;
        let keys: HashSet<usize> = claimed.iter().map(|job| key_of[&job.id()]).collect();
        assert_eq!(
            (claimed.len(), keys.len()),
            (KEYS, KEYS),
            "P3: round {round} starts exactly one job of each key, in whichever partition"
        );
        let status = store.flow_status("q").await.must("P3: flow_status");
        assert_eq!(status.running, KEYS as u64, "P3: running jobs summed");
        let expected: Vec<(String, u64)> =
            (0..KEYS).map(|key| (format!("key-{key:02}"), 1)).collect();
        assert_eq!(
            status.keys_at_limit, expected,
            "P3: every key at its limit, by key, over the partitions"
        );
        for job in &claimed {
            store
                .complete(job.id(), job.token(), None)
                .await
                .must("P3: complete");
        }
    }
    assert_nothing_claimable(&store, &["q"], "P3: each key's rate is used up").await;
    let status = store.flow_status("q").await.must("P3: flow_status");
    assert_eq!(
        status.keys_rate_limited.len(),
        KEYS,
        "P3: every key's rate shows, over the partitions"
    );
    env.clock.advance(per);
    let claimed = claim(&store, &["q"], 1_000, "P3: a claim once the windows pass").await;
    assert_eq!(claimed.len(), KEYS, "P3: one more start of each key");

    expect_invalid(
        store
            .enqueue(
                NewJob::new("q")
                    .idempotency_key("both")
                    .concurrency_key("key-00"),
            )
            .await,
        "concurrency_key",
        "P3: a job with both keys",
    );
    assert!(
        store
            .enqueue(NewJob::new("q").idempotency_key("both"))
            .await
            .must("P3: the key alone")
            .created,
        "P3: the refused job wrote nothing under its idempotency key"
    );
    if store.capabilities().queue_wide_limits {
        return;
    }
    for (field, queue_wide) in [
        ("max_running", QueueLimits::new().max_running(5)),
        (
            "max_starts",
            QueueLimits::new().max_starts(Rate::new(5, per)),
        ),
        ("fair_shares", QueueLimits::new().fair_shares(true)),
    ] {
        expect_invalid(
            store.set_limits("r", queue_wide).await,
            field,
            "P3: a limit on a whole queue",
        );
    }
    assert_eq!(
        store.all_limits().await.must("P3: all_limits"),
        vec![("q".to_owned(), limits)],
        "P3: refused limits write nothing"
    );
}
