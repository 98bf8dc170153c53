//! Rules P1 and P2: where a partitioned store keeps its jobs, and the claim order
//! within a partition (CONTRACT §8). Both run on a store that declares
//! `Capabilities::partitioning` and pass, saying so, on any other.

use durq_core::{JobId, NewJob, Partitioning, Store};

use super::support::{assert_claim_order, claim, enqueue, ids_of, Must};
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
