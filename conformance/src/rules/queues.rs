//! Rule Q1: paused queues.

use durq_core::{JobState, NewJob, QueueStats};

use super::support::{
    assert_claim_order, assert_nothing_claimable, assert_stats, claim, enqueue, expect_invalid,
    get, ids_of, Must, Together,
};
use crate::{unique_namespace, Harness, TestEnv};

/// Q1: a pause set through one handle holds for every other handle of the namespace
/// (and for no other namespace); enqueues still land, a running job still finishes,
/// stats say paused; after `resume` the jobs are claimed in their order.
pub async fn q1_paused_queue_is_not_claimed_until_resumed(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let operator = env.store().await;
    let worker = env.store().await;
    let running = enqueue(&worker, NewJob::new("a"), "Q1").await;
    let held = claim(&worker, &["a"], 1, "Q1: before the pause").await;
    assert_eq!(ids_of(&held), vec![running]);
    let queued = [
        enqueue(&worker, NewJob::new("a"), "Q1").await,
        enqueue(&worker, NewJob::new("a").priority(5), "Q1").await,
    ];
    let open = enqueue(&worker, NewJob::new("b"), "Q1").await;

    expect_invalid(
        operator.pause("no queue!").await,
        "queue",
        "Q1: a bad queue name",
    );
    operator.pause("a").await.must("Q1: pause");
    assert_eq!(
        worker.paused_queues().await.must("Q1"),
        vec!["a".to_owned()],
        "Q1: every handle sees the pause"
    );
    assert_stats(
        &worker,
        "a",
        QueueStats {
            ready: 2,
            running: 1,
            paused: true,
            ..QueueStats::default()
        },
        "Q1: a paused queue's stats",
    )
    .await;
    let claimed = claim(&worker, &["a", "b"], 10, "Q1: paused and open").await;
    assert_eq!(
        ids_of(&claimed),
        vec![open],
        "Q1: a claim takes nothing from a paused queue"
    );
    let late = enqueue(&worker, NewJob::new("a"), "Q1: enqueue while paused").await;
    assert_eq!(get(&worker, late, "Q1").await.state, JobState::Queued);
    assert_nothing_claimable(&worker, &["a"], "Q1: paused").await;
    worker
        .complete(held[0].id(), held[0].token(), None)
        .await
        .must("Q1: a running job of a paused queue finishes");

    // Pausing twice, or resuming an open queue, changes nothing.
    operator.pause("a").await.must("Q1: pause again");
    operator.resume("b").await.must("Q1: resume an open queue");
    assert_eq!(
        worker.paused_queues().await.must("Q1"),
        vec!["a".to_owned()]
    );
    // Another namespace's queue of the same name is not paused.
    let elsewhere = env
        .store_with(|settings| settings.namespace(unique_namespace("t")))
        .await;
    let other = enqueue(&elsewhere, NewJob::new("a"), "Q1").await;
    assert_eq!(
        ids_of(&claim(&elsewhere, &["a"], 10, "Q1: other namespace").await),
        vec![other],
        "Q1: pauses are per namespace"
    );
    assert!(elsewhere.paused_queues().await.must("Q1").is_empty());

    worker.resume("a").await.must("Q1: resume");
    assert!(operator.paused_queues().await.must("Q1").is_empty());
    assert!(!operator.stats("a").await.must("Q1").paused);
    let claimed = claim(&operator, &["a"], 10, "Q1: after resume").await;
    assert_claim_order(
        &operator,
        &ids_of(&claimed),
        &[queued[1], queued[0], late],
        "Q1: after resume the jobs are claimed in their order",
    );
}

/// Q1 with C3: the paused queues are left out before the limit is applied, so a claim
/// over paused and open queues fills its limit from the open ones.
pub async fn q1_a_claim_skips_paused_queues_before_its_limit(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "Q1").await;
    for _ in 0..3 {
        together
            .enqueue(&store, NewJob::new("urgent").priority(10), "Q1")
            .await;
    }
    let open: Vec<_> = [
        together.enqueue(&store, NewJob::new("normal"), "Q1").await,
        together.enqueue(&store, NewJob::new("normal"), "Q1").await,
        together.enqueue(&store, NewJob::new("normal"), "Q1").await,
    ]
    .into();
    store.pause("urgent").await.must("Q1: pause");
    let claimed = claim(&store, &["urgent", "normal"], 2, "Q1").await;
    assert_eq!(
        ids_of(&claimed),
        open[..2].to_vec(),
        "Q1: the limit counts only jobs of open queues"
    );
    let everything_paused = claim(&store, &["urgent"], 5, "Q1").await;
    assert!(everything_paused.is_empty(), "Q1: only paused queues named");
}
