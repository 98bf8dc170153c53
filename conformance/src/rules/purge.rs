//! Rule A5: purge after retention.

use std::time::Duration;

use durq_core::{Clock, JobId, JobState, NewJob, QueueStats, Retry};

use super::support::{
    assert_nothing_claimable, assert_stats, claim, claim_expecting, drain, enqueue,
    expect_not_found, get, ids_of, list_all, Must, Together,
};
use crate::{Harness, TestEnv};

/// A5 (by `purge`): a terminal job (succeeded, dead, cancelled) is deleted once
/// `finished_at <= now - retention`, not 1 ms earlier; afterwards it is not found,
/// not listed, not counted, not a child, and claim and reclaim do not trip over it.
pub async fn a5_purge_deletes_terminal_jobs_after_retention(harness: &dyn Harness) {
    const RETENTION: Duration = Duration::from_secs(3_600);
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.retention(RETENTION)).await;
    let parent = enqueue(&store, NewJob::new("parents"), "A5").await;
    let done = enqueue(&store, NewJob::new("q").parent(parent).payload("d"), "A5").await;
    let dead = enqueue(&store, NewJob::new("q").parent(parent), "A5").await;
    let cancelled = enqueue(&store, NewJob::new("q").parent(parent), "A5").await;
    let held = claim(&store, &["q"], 2, "A5").await;
    store.complete(done, held[0].token(), None).await.must("A5");
    store
        .fail(dead, held[1].token(), "x", Retry::Never)
        .await
        .must("A5");
    store.cancel(cancelled).await.must("A5");
    let gone = [done, dead, cancelled];
    env.clock.advance(RETENTION / 2);
    let young = enqueue(&store, NewJob::new("q").parent(parent), "A5").await;
    let y = claim_expecting(&store, "q", young, "A5").await;
    store.complete(young, y.token(), None).await.must("A5");
    let waiting = enqueue(&store, NewJob::new("q"), "A5").await;

    env.clock.advance(RETENTION / 2 - Duration::from_millis(1));
    assert_eq!(
        store.purge(100).await.must("A5: purge"),
        0,
        "A5: 1 ms before retention has passed nothing is deleted"
    );
    env.clock.advance(Duration::from_millis(1));
    assert_eq!(
        store.purge(100).await.must("A5: purge"),
        3,
        "A5: terminal jobs are deleted once retention has passed since finished_at"
    );
    for id in gone {
        expect_not_found(store.get(id).await, id, "A5: a purged job is not found");
        expect_not_found(
            store.payload(id).await,
            id,
            "A5: a purged job has no payload",
        );
    }
    let listed: Vec<JobId> = list_all(&store, "q", None, "A5")
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        listed,
        vec![waiting, young],
        "A5: purged jobs are not listed"
    );
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 1,
            succeeded: 1,
            ..QueueStats::default()
        },
        "A5: purged jobs are not counted",
    )
    .await;
    let children: Vec<JobId> = store
        .children(parent)
        .await
        .must("A5: children")
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(children, vec![young], "A5: purged children are not listed");
    claim_expecting(
        &store,
        "q",
        waiting,
        "A5: claim is not tripped by purged jobs",
    )
    .await;
    assert!(store.reclaim(100).await.must("A5: reclaim").is_empty());
    assert_eq!(store.purge(100).await.must("A5"), 0, "A5: purged once");
    env.clock.advance(RETENTION);
    assert_eq!(
        store.purge(100).await.must("A5"),
        1,
        "A5: the younger job in its turn"
    );
    expect_not_found(store.get(young).await, young, "A5");
    assert!(store.children(parent).await.must("A5").is_empty());
}

/// A5: retention never deletes a non-terminal job: queued for ages, scheduled far
/// ahead, running with a long-expired lease, or once terminal and then retried (its
/// old `finished_at` long past retention).
pub async fn a5_purge_never_deletes_non_terminal_jobs(harness: &dyn Harness) {
    const RETENTION: Duration = Duration::from_secs(60);
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.retention(RETENTION)).await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A5").await;
    let far = env
        .clock
        .now()
        .saturating_add(Duration::from_secs(10 * 86_400));
    let queued = together
        .enqueue(&store, NewJob::new("q").priority(-1), "A5")
        .await;
    let scheduled = together
        .enqueue(&store, NewJob::new("q").run_at(far), "A5")
        .await;
    let running = together
        .enqueue(&store, NewJob::new("q").priority(2), "A5")
        .await;
    let retried = together
        .enqueue(&store, NewJob::new("q").priority(1).max_attempts(1), "A5")
        .await;
    let cancel_retried = together
        .enqueue(&store, NewJob::new("q").priority(1), "A5")
        .await;
    let held = claim(&store, &["q"], 2, "A5").await;
    assert_eq!(ids_of(&held), vec![running, retried]);
    store
        .fail(retried, held[1].token(), "x", Retry::Never)
        .await
        .must("A5");
    store.cancel(cancel_retried).await.must("A5");
    env.clock.advance(RETENTION * 2);
    store.retry(retried).await.must("A5: retry");
    store.retry(cancel_retried).await.must("A5: retry");
    env.clock.advance(RETENTION * 100);
    assert_eq!(
        store.purge(1_000).await.must("A5: purge"),
        0,
        "A5: no non-terminal job is ever deleted by retention"
    );
    for (id, state) in [
        (queued, JobState::Queued),
        (scheduled, JobState::Queued),
        (running, JobState::Running),
        (retried, JobState::Queued),
        (cancel_retried, JobState::Queued),
    ] {
        assert_eq!(
            get(&store, id, "A5: a non-terminal job survives purge")
                .await
                .state,
            state
        );
    }
    // Once it finishes again, its new finished_at counts.
    let again = claim(&store, &["q"], 1, "A5").await;
    assert_eq!(ids_of(&again), vec![retried]);
    store
        .complete(retried, again[0].token(), None)
        .await
        .must("A5");
    env.clock.advance(RETENTION - Duration::from_millis(1));
    assert_eq!(
        store.purge(1_000).await.must("A5"),
        0,
        "A5: retention runs from the latest finish"
    );
    env.clock.advance(Duration::from_millis(1));
    assert_eq!(store.purge(1_000).await.must("A5"), 1);
    expect_not_found(store.get(retried).await, retried, "A5");
}

/// A5: `purge(limit)` deletes at most `limit` jobs per call (2, 2, 1, then 0).
pub async fn a5_purge_limit_bounds_each_call(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env
        .store_with(|s| s.retention(Duration::from_secs(1)))
        .await;
    for _ in 0..5 {
        let id = enqueue(&store, NewJob::new("q"), "A5").await;
        store.cancel(id).await.must("A5");
    }
    env.clock.advance(Duration::from_secs(1));
    for expect in [2, 2, 1, 0] {
        assert_eq!(
            store.purge(2).await.must("A5: purge(2)"),
            expect,
            "A5: purge(2) deletes at most 2 jobs per call"
        );
    }
    assert_stats(&store, "q", QueueStats::default(), "A5: all purged").await;
}

/// A5: purged jobs of every terminal state leave nothing anything trips over: no list
/// page or count shows them, claim and reclaim find nothing, and their idempotency
/// keys make new jobs (E5) that run.
pub async fn a5_purged_jobs_leave_nothing_behind(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env
        .store_with(|s| {
            s.retention(Duration::from_secs(10))
                .dedup_window(Duration::from_secs(86_400))
        })
        .await;
    let mut keyed = Vec::new();
    for i in 0..6 {
        let id = enqueue(
            &store,
            NewJob::new("q")
                .tenant("t")
                .idempotency_key(format!("k{i}")),
            "A5",
        )
        .await;
        keyed.push(id);
    }
    let held = claim(&store, &["q"], 6, "A5").await;
    for (i, job) in held.iter().enumerate() {
        match i % 3 {
            0 => store.complete(job.id(), job.token(), None).await.must("A5"),
            1 => {
                store
                    .fail(job.id(), job.token(), "x", Retry::Never)
                    .await
                    .must("A5");
            }
            _ => {
                store.cancel(job.id()).await.must("A5");
                store.release(job.id(), job.token()).await.must("A5");
            }
        }
    }
    env.clock.advance(Duration::from_secs(3_600));
    assert_eq!(store.purge(100).await.must("A5: purge"), 6);
    assert_stats(&store, "q", QueueStats::default(), "A5: nothing counted").await;
    assert!(list_all(&store, "q", None, "A5").await.is_empty());
    for state in JobState::ALL {
        assert!(
            list_all(&store, "q", Some(state), "A5").await.is_empty(),
            "A5: no {state} leftovers are listed"
        );
    }
    assert_nothing_claimable(&store, &["q"], "A5: no leftovers are claimed").await;
    assert!(store.reclaim(100).await.must("A5").is_empty());
    for (i, old) in keyed.iter().enumerate() {
        let answer = store
            .enqueue(
                NewJob::new("q")
                    .tenant("t")
                    .idempotency_key(format!("k{i}")),
            )
            .await
            .must("A5: enqueue with a purged job's key");
        assert!(
            answer.created && answer.id != *old,
            "A5/E5: the key of a purged job makes a new job"
        );
    }
    let fresh = drain(&store, &["q"], "A5").await;
    assert_eq!(fresh.len(), 6, "A5: the new jobs run");
}
