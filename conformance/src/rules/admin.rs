//! Rules A1, A2 and A6: cancel, retry, and a reopened store (counts and listing are in
//! `stats.rs`, purge in `purge.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    Bytes, Clock, Enqueued, Job, JobId, JobState, LeaseToken, NewJob, QueueStats, Retry, Store,
};
use tokio::sync::Barrier;

use super::support::{
    assert_claim_order, assert_nothing_claimable, assert_stats, assert_unchanged, binary, claim,
    claim_expecting, enqueue, expect_invalid_state, expect_lease_lost, expect_not_found, get,
    ids_of, join_all, list_all, Must, Together, TTL,
};
use crate::{Harness, TestEnv};

/// A1: `cancel` on a queued job (ready or scheduled) returns `Cancelled`; the job is
/// cancelled, finished now, and never claimed.
pub async fn a1_cancel_queued_job_is_cancelled(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let ready = enqueue(&store, NewJob::new("q"), "A1").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(30));
    let scheduled = enqueue(&store, NewJob::new("q").run_at(later), "A1").await;
    env.clock.advance(Duration::from_secs(1));
    for id in [ready, scheduled] {
        let before = get(&store, id, "A1").await;
        assert_eq!(
            store.cancel(id).await.must("A1: cancel"),
            JobState::Cancelled,
            "A1: cancel on a queued job returns cancelled"
        );
        let mut expected = before;
        expected.state = JobState::Cancelled;
        expected.finished_at = Some(env.clock.now());
        assert_eq!(
            get(&store, id, "A1").await,
            expected,
            "A1: a cancelled job is terminal, finished now, otherwise unchanged"
        );
    }
    env.clock.advance(Duration::from_secs(60));
    assert_nothing_claimable(&store, &["q"], "A1: cancelled jobs are never claimed").await;
    assert_stats(
        &store,
        "q",
        QueueStats {
            cancelled: 2,
            ..QueueStats::default()
        },
        "A1",
    )
    .await;
}

/// A1: `cancel` on a running job returns `Running`, sets `cancel_requested` (and
/// nothing else), and the holder's heartbeat reports it; a second cancel is the same.
pub async fn a1_cancel_running_job_requests_cancellation(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "A1").await;
    let held = claim_expecting(&store, "q", id, "A1").await;
    for round in 0..2 {
        assert_eq!(
            store.cancel(id).await.must("A1: cancel"),
            JobState::Running,
            "A1: cancel on a running job returns running (round {round})"
        );
        let mut expected = held.job.clone();
        expected.cancel_requested = true;
        assert_eq!(
            get(&store, id, "A1").await,
            expected,
            "A1: cancel on a running job only sets cancel_requested"
        );
    }
    let beat = store
        .heartbeat(id, held.token(), TTL)
        .await
        .must("A1: heartbeat");
    assert!(
        beat.cancel_requested,
        "A1: heartbeat reports the cancellation"
    );
}

/// A1: `cancel` on a terminal job (succeeded, dead, cancelled) changes nothing and
/// returns its state; `cancel` of an unknown job is not found.
pub async fn a1_cancel_terminal_job_changes_nothing(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A1").await;
    let done = together.enqueue(&store, NewJob::new("q"), "A1").await;
    let dead = together.enqueue(&store, NewJob::new("q"), "A1").await;
    let cancelled = together.enqueue(&store, NewJob::new("q"), "A1").await;
    let held = claim(&store, &["q"], 2, "A1").await;
    store
        .complete(done, held[0].token(), Some(Bytes::from_static(b"r")))
        .await
        .must("A1");
    store
        .fail(dead, held[1].token(), "x", Retry::Never)
        .await
        .must("A1");
    store.cancel(cancelled).await.must("A1");
    env.clock.advance(Duration::from_secs(60));
    for (id, state) in [
        (done, JobState::Succeeded),
        (dead, JobState::Dead),
        (cancelled, JobState::Cancelled),
    ] {
        let before = get(&store, id, "A1").await;
        assert_eq!(
            store.cancel(id).await.must("A1: cancel a terminal job"),
            state,
            "A1: cancel on a terminal job returns its state"
        );
        assert_unchanged(
            &store,
            &before,
            "A1: cancel on a terminal job changes nothing",
        )
        .await;
    }
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(
        store.cancel(unknown).await,
        unknown,
        "A1: cancel of an unknown job",
    );
}

/// A1 with the decision: a cancel-requested job the holder completes is `succeeded`
/// (the work is done).
pub async fn a1_cancel_requested_then_complete_is_succeeded(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "A1").await;
    let held = claim_expecting(&store, "q", id, "A1").await;
    store.cancel(id).await.must("A1: cancel");
    store
        .complete(id, held.token(), Some(Bytes::from_static(b"done")))
        .await
        .must("A1: complete after cancel");
    let job = get(&store, id, "A1").await;
    assert_eq!(job.state, JobState::Succeeded, "A1: complete wins");
    assert_eq!(job.result, Some(Bytes::from_static(b"done")));
}

/// A1 with the decision: a cancel-requested job the holder fails, even with a retry
/// time and attempts left, is `cancelled` (finished now) and never requeued.
pub async fn a1_cancel_requested_then_fail_is_cancelled(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(10), "A1").await;
    let held = claim_expecting(&store, "q", id, "A1").await;
    store.cancel(id).await.must("A1: cancel");
    env.clock.advance(Duration::from_secs(2));
    assert_eq!(
        store
            .fail(id, held.token(), "stopped", Retry::At(env.clock.now()))
            .await
            .must("A1: fail after cancel"),
        JobState::Cancelled,
        "A1: fail of a cancel-requested job reports cancelled"
    );
    let job = get(&store, id, "A1").await;
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "A1: cancelled, not requeued"
    );
    assert_eq!(job.finished_at, Some(env.clock.now()));
    assert_eq!(job.lease, None);
    env.clock.advance(Duration::from_secs(60));
    assert_nothing_claimable(&store, &["q"], "A1: never requeued").await;
}

/// A1 with the decision: a cancel-requested job the holder releases is `cancelled`
/// (finished now) and never requeued.
pub async fn a1_cancel_requested_then_release_is_cancelled(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "A1").await;
    let held = claim_expecting(&store, "q", id, "A1").await;
    store.cancel(id).await.must("A1: cancel");
    env.clock.advance(Duration::from_secs(2));
    store
        .release(id, held.token())
        .await
        .must("A1: release after cancel");
    let job = get(&store, id, "A1").await;
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "A1: release of a cancel-requested job cancels it"
    );
    assert_eq!(job.finished_at, Some(env.clock.now()));
    assert_eq!(job.lease, None);
    assert_eq!(
        job.attempts, 1,
        "A1: a released cancel-requested job keeps its attempt counted (L8 takes an attempt back only from a job that goes back to queued)"
    );
    assert_nothing_claimable(&store, &["q"], "A1: never requeued").await;
}

/// A2 with the decision: `retry` of a dead job makes it `queued`, ready now, attempts
/// 0, finished/result/lease cleared, `last_error` kept; it is claimed again with a
/// greater token.
pub async fn a2_retry_dead_job_requeues_with_attempts_reset(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(2).payload("p"), "A2").await;
    let first = claim_expecting(&store, "q", id, "A2").await;
    store
        .fail(id, first.token(), "one", Retry::At(env.clock.now()))
        .await
        .must("A2");
    let second = claim_expecting(&store, "q", id, "A2").await;
    store
        .fail(id, second.token(), "two", Retry::At(env.clock.now()))
        .await
        .must("A2");
    let dead = get(&store, id, "A2").await;
    assert_eq!(dead.state, JobState::Dead);
    env.clock.advance(Duration::from_secs(90));
    store.retry(id).await.must("A2: retry");
    let job = get(&store, id, "A2").await;
    assert_eq!(
        (
            job.state,
            job.run_at,
            job.attempts,
            job.finished_at,
            &job.result,
            &job.lease,
            job.cancel_requested
        ),
        (
            JobState::Queued,
            env.clock.now(),
            0,
            None,
            &None,
            &None,
            false
        ),
        "A2: retry queues the job ready now with attempts reset and finish cleared"
    );
    assert_eq!(
        (job.last_error.as_deref(), job.started_at, job.heartbeat_at),
        (None, None, None),
        "A2: retry starts the job over: no error, start or heartbeat of a past run"
    );
    let history = store.attempts(id).await.must("A2: attempts");
    let errors: Vec<Option<&str>> = history.iter().map(|a| a.error.as_deref()).collect();
    assert_eq!(
        errors,
        [Some("one"), Some("two")],
        "A2: the errors of the runs before the retry are in the attempt history"
    );
    assert_eq!(
        (
            job.queue.as_str(),
            job.priority,
            job.max_attempts,
            job.created_at
        ),
        (
            dead.queue.as_str(),
            dead.priority,
            dead.max_attempts,
            dead.created_at
        ),
        "A2: retry keeps the job's own fields"
    );
    let third = claim_expecting(&store, "q", id, "A2: claimable after retry").await;
    assert_eq!(third.job.attempts, 1, "A2: attempts counted from 0 again");
    assert!(
        third.token() > second.token(),
        "A2: tokens are never reused"
    );
    assert_eq!(third.payload, Bytes::from_static(b"p"));
    // With attempts reset, it gets max_attempts fresh claims.
    store
        .fail(id, third.token(), "three", Retry::At(env.clock.now()))
        .await
        .must("A2");
    assert_eq!(get(&store, id, "A2").await.state, JobState::Queued);
}

/// A2: `retry` of a cancelled job (cancelled while queued, or cancel-requested while
/// running) queues it, ready now, with `cancel_requested` cleared.
pub async fn a2_retry_cancelled_job_requeues_it(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A2").await;
    let queued = together
        .enqueue(&store, NewJob::new("q").priority(1), "A2")
        .await;
    let running = together.enqueue(&store, NewJob::new("q"), "A2").await;
    let held = claim_expecting(&store, "q", queued, "A2").await;
    let held2 = claim_expecting(&store, "q", running, "A2").await;
    store.release(queued, held.token()).await.must("A2");
    assert_eq!(store.cancel(queued).await.must("A2"), JobState::Cancelled);
    store.cancel(running).await.must("A2");
    store.release(running, held2.token()).await.must("A2");
    assert_eq!(get(&store, running, "A2").await.state, JobState::Cancelled);
    env.clock.advance(Duration::from_secs(5));
    for id in [queued, running] {
        store.retry(id).await.must("A2: retry a cancelled job");
        let job = get(&store, id, "A2").await;
        assert_eq!(
            job.state,
            JobState::Queued,
            "A2: a retried cancelled job is queued"
        );
        assert!(!job.cancel_requested, "A2: retry clears cancel_requested");
        assert_eq!(job.finished_at, None);
        assert_eq!(job.attempts, 0);
        assert_eq!(job.run_at, env.clock.now());
    }
    let claimed = claim(&store, &["q"], 10, "A2").await;
    assert_eq!(
        ids_of(&claimed),
        vec![queued, running],
        "A2: both run again"
    );
    let beat = store
        .heartbeat(running, claimed[1].token(), TTL)
        .await
        .must("A2: heartbeat");
    assert!(!beat.cancel_requested, "A2: the old cancel request is gone");
}

/// A2: `retry` of a queued, scheduled, running or succeeded job is refused with
/// `InvalidState` naming its state, and changes nothing; of an unknown job, not found.
pub async fn a2_retry_of_other_states_is_invalid_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claim below expects the first two jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A2").await;
    let done = together.enqueue(&store, NewJob::new("q"), "A2").await;
    let running = together.enqueue(&store, NewJob::new("q"), "A2").await;
    let queued = together.enqueue(&store, NewJob::new("q"), "A2").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(60));
    let scheduled = together
        .enqueue(&store, NewJob::new("q").run_at(later), "A2")
        .await;
    let held = claim(&store, &["q"], 2, "A2").await;
    store.complete(done, held[0].token(), None).await.must("A2");
    for (id, state) in [
        (queued, JobState::Queued),
        (scheduled, JobState::Queued),
        (running, JobState::Running),
        (done, JobState::Succeeded),
    ] {
        let before = get(&store, id, "A2").await;
        expect_invalid_state(
            store.retry(id).await,
            id,
            state,
            &format!("A2: retry of a {state} job"),
        );
        assert_unchanged(&store, &before, "A2: a refused retry changes nothing").await;
    }
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(
        store.retry(unknown).await,
        unknown,
        "A2: retry of an unknown job",
    );
}

/// A2: 8 retriers on four connections retry each of 6 dead jobs at once; for every
/// job exactly one retry succeeds and the rest are refused with `InvalidState`, and the
/// job is queued once.
pub async fn a2_concurrent_retries_one_succeeds(harness: &dyn Harness) {
    const JOBS: usize = 6;
    const RETRIERS: usize = 8;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..JOBS {
        ids.push(enqueue(&seed, NewJob::new("q").max_attempts(1), "A2").await);
    }
    for job in claim(&seed, &["q"], JOBS, "A2").await {
        seed.fail(job.id(), job.token(), "x", Retry::Never)
            .await
            .must("A2");
    }
    let mut stores: Vec<Store> = Vec::new();
    for _ in 0..4 {
        stores.push(env.store().await);
    }
    let barrier = Arc::new(Barrier::new(RETRIERS));
    let mut handles = Vec::new();
    for r in 0..RETRIERS {
        let store = stores[r % stores.len()].clone();
        let barrier = Arc::clone(&barrier);
        let mut order = ids.clone();
        order.rotate_left(r % JOBS);
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut won = Vec::new();
            for id in order {
                match store.retry(id).await {
                    Ok(()) => won.push(id),
                    Err(durq_core::Error::InvalidState { state, .. }) => assert_eq!(
                        state,
                        JobState::Queued,
                        "A2: a losing retry sees the job queued"
                    ),
                    Err(err) => panic!("A2: a concurrent retry failed: {err}"),
                }
            }
            won
        }));
    }
    let mut wins: HashMap<JobId, usize> = HashMap::new();
    for id in join_all(handles).await.into_iter().flatten() {
        *wins.entry(id).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(
            wins.get(id).copied().unwrap_or(0),
            1,
            "A2: exactly one of {RETRIERS} concurrent retries of job {id} must succeed"
        );
    }
    let claimed = claim(&seed, &["q"], 100, "A2: claim").await;
    let distinct: HashSet<JobId> = claimed.iter().map(|j| j.id()).collect();
    assert_eq!(claimed.len(), JOBS, "A2: each retried job is queued once");
    assert_eq!(distinct.len(), JOBS);
    for job in &claimed {
        assert_eq!(job.job.attempts, 1);
    }
}

/// A6: a new store instance over the same data (a reopen) sees every job, field,
/// payload, state, timestamp, attempt, token and lease as before; keys still
/// deduplicate, the holder's token still works, token counters and claim order carry
/// on, and a requested cancellation is still honoured.
pub async fn a6_reopened_store_sees_everything(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let first = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&first, "A6").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(3_600));
    let parent = together
        .enqueue(&first, NewJob::new("parents").payload(binary(300, 1)), "A6")
        .await;
    let queued = together
        .enqueue(
            &first,
            NewJob::new("q")
                .tenant("tenant ✓")
                .idempotency_key("key\0one")
                .payload(binary(70_000, 2))
                .priority(-4)
                .max_attempts(7)
                .parent(parent),
            "A6",
        )
        .await;
    let scheduled = together
        .enqueue(
            &first,
            NewJob::new("q").run_at(later).payload(Vec::new()),
            "A6",
        )
        .await;
    let running = together
        .enqueue(&first, NewJob::new("work").priority(3), "A6")
        .await;
    let done = together.enqueue(&first, NewJob::new("work"), "A6").await;
    let dead = together
        .enqueue(&first, NewJob::new("work").max_attempts(1), "A6")
        .await;
    let cancelled = together.enqueue(&first, NewJob::new("work"), "A6").await;
    let retrying = together
        .enqueue(&first, NewJob::new("work").max_attempts(3), "A6")
        .await;
    let fifo: Vec<JobId> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(together.enqueue(&first, NewJob::new("fifo"), "A6").await);
        }
        ids
    };
    // Running job: released once, so its token is 2.
    let h = claim_expecting(&first, "work", running, "A6").await;
    first.release(running, h.token()).await.must("A6");
    env.clock.advance(Duration::from_millis(1_500));
    let held = claim(&first, &["work"], 5, "A6").await;
    assert_eq!(
        ids_of(&held),
        vec![running, done, dead, cancelled, retrying]
    );
    first
        .complete(done, held[1].token(), Some(Bytes::from(binary(500, 3))))
        .await
        .must("A6");
    first
        .fail(dead, held[2].token(), "fatal\nerror ✗", Retry::Never)
        .await
        .must("A6");
    first.cancel(cancelled).await.must("A6");
    first.release(cancelled, held[3].token()).await.must("A6");
    first
        .fail(retrying, held[4].token(), "again", Retry::At(later))
        .await
        .must("A6");
    env.clock.advance(Duration::from_secs(2));
    first
        .heartbeat(running, held[0].token(), Duration::from_secs(50))
        .await
        .must("A6");
    first.cancel(running).await.must("A6");
    let running_token = held[0].token();
    assert_eq!(running_token, LeaseToken::new(2));

    let queues = ["parents", "q", "work", "fifo"];
    let mut jobs: HashMap<&str, Vec<Job>> = HashMap::new();
    let mut payloads: HashMap<JobId, Bytes> = HashMap::new();
    let mut stats = HashMap::new();
    for queue in queues {
        let listed = list_all(&first, queue, None, "A6").await;
        for job in &listed {
            payloads.insert(job.id, first.payload(job.id).await.must("A6"));
        }
        stats.insert(queue, first.stats(queue).await.must("A6"));
        jobs.insert(queue, listed);
    }
    let children = first.children(parent).await.must("A6");
    drop(first);

    let second = env.store().await;
    for queue in queues {
        let listed = list_all(&second, queue, None, "A6: after reopen").await;
        assert_eq!(
            listed, jobs[queue],
            "A6: after a reopen every job of {queue:?} must be as before, field for field"
        );
        for job in &listed {
            assert_eq!(
                get(&second, job.id, "A6").await,
                *job,
                "A6: get after a reopen"
            );
            assert_eq!(
                second.payload(job.id).await.must("A6"),
                payloads[&job.id],
                "A6: payload after a reopen"
            );
        }
        assert_eq!(
            second.stats(queue).await.must("A6"),
            stats[queue],
            "A6: stats after a reopen"
        );
    }
    assert_eq!(
        second.children(parent).await.must("A6"),
        children,
        "A6: children"
    );
    assert_eq!(
        second
            .enqueue(
                NewJob::new("q")
                    .tenant("tenant ✓")
                    .idempotency_key("key\0one")
            )
            .await
            .must("A6"),
        Enqueued {
            id: queued,
            created: false
        },
        "A6: a key still deduplicates after a reopen"
    );
    expect_lease_lost(
        second.heartbeat(running, LeaseToken::new(1), TTL).await,
        running,
        "A6: an old token is still stale after a reopen",
    );
    let beat = second
        .heartbeat(running, running_token, TTL)
        .await
        .must("A6: the holder's token still works after a reopen");
    assert!(
        beat.cancel_requested,
        "A6: cancel_requested survives a reopen"
    );
    assert_eq!(
        ids_of(&claim(&second, &["fifo"], 10, "A6").await),
        fifo,
        "A6: claim order survives a reopen"
    );
    env.clock.advance(Duration::from_secs(3_600));
    let order = ids_of(&claim(&second, &["q", "work"], 10, "A6").await);
    // `queued` has an idempotency key, so on a partitioned store it lives in its key's
    // partition: the order is asserted per partition there.
    assert_claim_order(
        &second,
        &order,
        &[scheduled, retrying, queued],
        "A6: queued and scheduled jobs run after a reopen, in claim order",
    );
    let retried = second.get(retrying).await.must("A6");
    assert_eq!(retried.attempts, 2, "A6: attempts carry on");
    assert_eq!(
        retried.lease.map(|l| l.token),
        Some(LeaseToken::new(2)),
        "A6: token counters carry on after a reopen"
    );
    let reclaimed = second.reclaim(10).await.must("A6: reclaim");
    assert!(
        reclaimed
            .iter()
            .any(|r| r.id == running && r.state == JobState::Cancelled),
        "A6: the cancel-requested job's expired lease is reclaimed to cancelled: {reclaimed:?}"
    );
    let newer = enqueue(&second, NewJob::new("q"), "A6").await;
    assert!(
        newer > fifo[3],
        "A6: ids minted after a reopen sort after earlier ones"
    );
}
