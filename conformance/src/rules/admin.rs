//! Rules A1–A6: operator actions, counts, listing, retention and durability.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    Bytes, Clock, Enqueued, Job, JobId, JobState, LeaseToken, ListQuery, NewJob, QueueOverview,
    QueueStats, Retry, Store,
};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, assert_stats_agree, assert_unchanged, binary, claim,
    claim_expecting, count, drain, enqueue, expect_invalid, expect_invalid_state,
    expect_lease_lost, expect_not_found, get, ids_of, join_all, list_all, Must, TTL,
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
    let done = enqueue(&store, NewJob::new("q"), "A1").await;
    let dead = enqueue(&store, NewJob::new("q"), "A1").await;
    let cancelled = enqueue(&store, NewJob::new("q"), "A1").await;
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
    let queued = enqueue(&store, NewJob::new("q").priority(1), "A2").await;
    let running = enqueue(&store, NewJob::new("q"), "A2").await;
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
    let done = enqueue(&store, NewJob::new("q"), "A2").await;
    let running = enqueue(&store, NewJob::new("q"), "A2").await;
    let queued = enqueue(&store, NewJob::new("q"), "A2").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(60));
    let scheduled = enqueue(&store, NewJob::new("q").run_at(later), "A2").await;
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

/// A3: queues whose names are prefixes of each other, or differ only past a
/// separator, are counted apart: a backend that matches keys or rows by prefix would
/// add one queue's jobs to another's.
pub async fn a3_stats_of_queues_sharing_a_prefix_are_apart(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let queues = ["a", "ab", "a.b", "a:b", "ba"];
    for (n, queue) in queues.iter().enumerate() {
        for _ in 0..=n {
            enqueue(&store, NewJob::new(*queue), "A3").await;
        }
    }
    for (n, queue) in queues.iter().enumerate() {
        assert_stats(
            &store,
            queue,
            QueueStats {
                ready: n as u64 + 1,
                ..QueueStats::default()
            },
            &format!("A3: queue {queue} counts its own jobs only"),
        )
        .await;
    }
}

/// Queue `name` as `queues` lists it now; the scenario fails if it is not listed.
async fn listed(store: &Store, name: &str) -> QueueOverview {
    let queues = store.queues().await.must("A7: queues");
    match queues.into_iter().find(|q| q.queue == name) {
        Some(found) => found,
        None => panic!("A7: queue {name} is listed"),
    }
}

/// A7: `queues` lists every queue holding a job or paused, by name, without being told
/// their names: counts as `stats` gives them, pause, and lag (the age of the oldest
/// ready job, whatever its priority); queues sharing a prefix apart; none listed for an
/// empty namespace.
pub async fn a7_queues_list_every_queue_with_counts_pause_and_lag(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert!(
        store.queues().await.must("A7: queues").is_empty(),
        "A7: an empty namespace lists no queue"
    );
    let start = env.clock.now();
    // "b": an old job at a low priority, a newer one at a high priority (claimed first).
    let oldest = enqueue(&store, NewJob::new("b").priority(-5), "A7").await;
    env.clock.advance(Duration::from_secs(2));
    let newer = enqueue(&store, NewJob::new("b").priority(7), "A7").await;
    enqueue(&store, NewJob::new("b.x"), "A7").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(100));
    enqueue(&store, NewJob::new("a").run_at(later), "A7").await;
    store.pause("c").await.must("A7: pause");
    env.clock.advance(Duration::from_secs(3));

    let queues = store.queues().await.must("A7: queues");
    let names: Vec<&str> = queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, ["a", "b", "b.x", "c"], "A7: every queue, by name");
    for overview in &queues {
        let mut stats = store.stats(&overview.queue).await.must("A7: stats");
        stats.paused = overview.queue == "c";
        assert_eq!(
            overview.stats, stats,
            "A7: {} counts as stats does",
            overview.queue
        );
    }
    let b = listed(&store, "b").await;
    assert_eq!(b.stats.ready, 2);
    assert_eq!(
        b.oldest_ready,
        Some(start),
        "A7: the oldest ready job, at any priority"
    );
    assert_eq!(b.lag, Some(Duration::from_secs(5)), "A7: its age now");
    assert_eq!(
        listed(&store, "b.x").await.lag,
        Some(Duration::from_secs(3))
    );
    let a = listed(&store, "a").await;
    assert_eq!(
        (a.stats.scheduled, a.lag),
        (1, None),
        "A7: nothing ready, no lag"
    );
    let c = listed(&store, "c").await;
    assert!(
        c.stats.paused && c.stats.total() == 0 && c.lag.is_none(),
        "A7: {c:?}"
    );
    assert!(!b.stats.paused);

    // The high-priority job is claimed first; the old one keeps the lag.
    let claimed = claim(&store, &["b"], 1, "A7").await;
    assert_eq!(claimed[0].id(), newer);
    env.clock.advance(Duration::from_secs(1));
    let b = listed(&store, "b").await;
    assert_eq!((b.stats.ready, b.stats.running), (1, 1));
    assert_eq!(b.lag, Some(Duration::from_secs(6)));
    // Once the old one is claimed too, nothing in "b" is ready: no lag.
    let claimed = claim(&store, &["b"], 1, "A7").await;
    assert_eq!(claimed[0].id(), oldest);
    let b = listed(&store, "b").await;
    assert_eq!((b.stats.ready, b.stats.running, b.lag), (0, 2, None));
    // A scheduled job that came due is ready, and its lag runs from its run time.
    env.clock.advance(Duration::from_secs(100));
    let a = listed(&store, "a").await;
    assert_eq!((a.stats.ready, a.oldest_ready), (1, Some(later)));
}

/// A3: `stats` counts jobs per state, queued split into ready and scheduled by the
/// store's clock, per queue; it agrees with the jobs `list` shows after every step;
/// an unused queue counts zero and a bad queue name is refused.
pub async fn a3_stats_count_every_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_stats(&store, "q", QueueStats::default(), "A3: an unused queue").await;
    expect_invalid(
        store.stats("bad queue").await,
        "queue",
        "A3: a bad queue name",
    );
    let later = env.clock.now().saturating_add(Duration::from_secs(100));
    let mut ids = Vec::new();
    for i in 0..12 {
        let job = if i < 3 {
            NewJob::new("q").run_at(later)
        } else {
            NewJob::new("q").max_attempts(if i == 11 { 1 } else { 5 })
        };
        ids.push(enqueue(&store, job, "A3").await);
    }
    for _ in 0..4 {
        enqueue(&store, NewJob::new("other"), "A3").await;
    }
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 9,
            scheduled: 3,
            ..QueueStats::default()
        },
        "A3: enqueued",
    )
    .await;
    let held = claim(&store, &["q"], 6, "A3").await;
    store
        .complete(held[0].id(), held[0].token(), None)
        .await
        .must("A3");
    store
        .fail(held[1].id(), held[1].token(), "x", Retry::Never)
        .await
        .must("A3");
    store
        .release(held[2].id(), held[2].token())
        .await
        .must("A3");
    store.cancel(held[3].id()).await.must("A3");
    store
        .release(held[3].id(), held[3].token())
        .await
        .must("A3");
    store
        .fail(held[4].id(), held[4].token(), "y", Retry::At(later))
        .await
        .must("A3");
    store.cancel(ids[10]).await.must("A3");
    let expected = QueueStats {
        ready: 9 - 6 + 1 - 1,
        scheduled: 3 + 1,
        running: 1,
        succeeded: 1,
        dead: 1,
        cancelled: 2,
        paused: false,
    };
    assert_stats(&store, "q", expected, "A3: every state").await;
    assert_stats_agree(&store, "q", "A3: every state").await;
    assert_stats(
        &store,
        "other",
        QueueStats {
            ready: 4,
            ..QueueStats::default()
        },
        "A3: per queue",
    )
    .await;
    // The clock moves: scheduled jobs become ready, the lease expires.
    env.clock.advance(Duration::from_secs(100));
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 3 + 4,
            scheduled: 0,
            ..expected
        },
        "A3: scheduled jobs count as ready once due",
    )
    .await;
    store.reclaim(100).await.must("A3: reclaim");
    assert_stats_agree(&store, "q", "A3: after reclaim").await;
    store.retry(held[1].id()).await.must("A3: retry");
    let after = assert_stats_agree(&store, "q", "A3: after retry").await;
    assert_eq!(after.total(), 12, "A3: every job counted once");
}

/// A4: `list` of a queue is newest first; pages of a given size join to the whole set
/// without repeats or gaps; each listed job equals `get`; other queues are not listed;
/// a bad page size or queue name is refused.
pub async fn a4_list_pages_join_to_the_whole_set_newest_first(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..25i16 {
        if i % 5 == 0 {
            env.clock.advance(Duration::from_millis(3));
        }
        ids.push(enqueue(&store, NewJob::new("q").priority(i % 3), "A4").await);
        enqueue(&store, NewJob::new("q2"), "A4").await;
    }
    let held = claim(&store, &["q"], 4, "A4").await;
    store
        .complete(held[0].id(), held[0].token(), None)
        .await
        .must("A4");
    let newest_first: Vec<JobId> = ids.iter().rev().copied().collect();
    for limit in [1, 7, 25, 1_000] {
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let mut query = ListQuery::new("q").limit(limit);
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list");
            pages += 1;
            assert!(
                page.jobs.len() <= limit,
                "A4: a page holds at most its limit"
            );
            for job in &page.jobs {
                assert_eq!(
                    job,
                    &get(&store, job.id, "A4").await,
                    "A4: list shows jobs as get does"
                );
            }
            seen.extend(page.jobs.iter().map(|j| j.id));
            if page.jobs.len() == limit {
                assert_eq!(
                    page.next,
                    page.jobs.last().map(|j| j.id),
                    "A4: a full page's cursor is its last id"
                );
            } else {
                assert_eq!(page.next, None, "A4: a page that is not full is the last");
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(pages <= 100, "A4: paging never ends");
        }
        assert_eq!(
            seen, newest_first,
            "A4: pages of {limit} must join to every job of the queue, newest first, without repeats"
        );
    }
    // The cursor is exclusive and may be any listed id.
    let page = store
        .list(ListQuery::new("q").limit(3).after(ids[10]))
        .await
        .must("A4");
    assert_eq!(
        page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[9], ids[8], ids[7]],
        "A4: a page after a cursor starts just below it"
    );
    expect_invalid(
        store.list(ListQuery::new("q").limit(0)).await,
        "limit",
        "A4: limit 0",
    );
    expect_invalid(
        store.list(ListQuery::new("q").limit(1_001)).await,
        "limit",
        "A4: limit 1001",
    );
    expect_invalid(
        store.list(ListQuery::new("no such/queue")).await,
        "queue",
        "A4: a bad queue name",
    );
    assert!(
        store
            .list(ListQuery::new("empty"))
            .await
            .must("A4")
            .jobs
            .is_empty(),
        "A4: an unused queue lists nothing"
    );
}

/// A4: `list` filtered by state shows exactly the jobs in that state, newest first,
/// across pages.
pub async fn a4_list_filters_by_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(enqueue(&store, NewJob::new("q"), "A4").await);
    }
    let held = claim(&store, &["q"], 20, "A4").await;
    for (i, job) in held.iter().enumerate() {
        match i % 4 {
            0 => store.complete(job.id(), job.token(), None).await.must("A4"),
            1 => {
                store
                    .fail(job.id(), job.token(), "x", Retry::Never)
                    .await
                    .must("A4");
            }
            2 => {
                store.cancel(job.id()).await.must("A4");
                store.release(job.id(), job.token()).await.must("A4");
            }
            _ => {}
        }
    }
    store.cancel(ids[29]).await.must("A4");
    let all = list_all(&store, "q", None, "A4").await;
    for state in JobState::ALL {
        let expected: Vec<JobId> = all
            .iter()
            .filter(|j| j.state == state)
            .map(|j| j.id)
            .collect();
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let mut query = ListQuery::new("q").state(state).limit(2);
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list by state");
            for job in &page.jobs {
                assert_eq!(
                    job.state, state,
                    "A4: a {state} page shows only {state} jobs"
                );
            }
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(
            seen, expected,
            "A4: list of {state} jobs must show exactly them, newest first"
        );
    }
    let counts = count(&all, env.clock.now());
    assert_eq!(
        (
            counts.succeeded,
            counts.dead,
            counts.cancelled,
            counts.running,
            counts.ready
        ),
        (5, 5, 6, 5, 9),
        "A4: the setup made the expected states"
    );
}

/// A4 with the decision: `next` is set whenever a page is full, so when the jobs fill
/// the pages exactly, the last page is empty with no cursor.
pub async fn a4_full_last_page_has_a_cursor_then_an_empty_page(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(enqueue(&store, NewJob::new("q"), "A4").await);
    }
    let first = store.list(ListQuery::new("q").limit(5)).await.must("A4");
    assert_eq!(first.next, Some(ids[5]), "A4: a full page has a cursor");
    let second = store
        .list(ListQuery::new("q").limit(5).after(ids[5]))
        .await
        .must("A4");
    assert_eq!(
        second.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[..5].iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        second.next,
        Some(ids[0]),
        "A4: a full last page still has a cursor"
    );
    let third = store
        .list(ListQuery::new("q").limit(5).after(ids[0]))
        .await
        .must("A4");
    assert!(
        third.jobs.is_empty(),
        "A4: the page after the oldest job is empty"
    );
    assert_eq!(third.next, None, "A4: an empty page has no cursor");
}

/// A4: while pages are read, new jobs are enqueued and other jobs change state
/// (claimed, cancelled, completed); every job that keeps its state throughout is
/// listed exactly once, no job is listed twice, and every listed job has the state
/// asked for.
pub async fn a4_jobs_keeping_state_are_never_skipped_while_paging(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..60i16 {
        // Priorities spread the claims over the whole list, not just its oldest end.
        ids.push(enqueue(&store, NewJob::new("q").priority((i * 7) % 5), "A4").await);
    }
    for filter in [Some(JobState::Queued), None] {
        let mut seen: Vec<JobId> = Vec::new();
        let mut changed: HashSet<JobId> = HashSet::new();
        let mut cursor = None;
        let mut round = 0usize;
        loop {
            let mut query = ListQuery::new("q").limit(6);
            query.states = filter.into_iter().collect();
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list");
            for job in &page.jobs {
                if let Some(state) = filter {
                    assert_eq!(
                        job.state, state,
                        "A4: a filtered page holds only that state"
                    );
                }
                assert!(
                    !seen.contains(&job.id),
                    "A4: job {} listed twice while paging",
                    job.id
                );
                seen.push(job.id);
            }
            // Change the world between pages.
            round += 1;
            for _ in 0..3 {
                enqueue(
                    &store,
                    NewJob::new("q").priority(4),
                    "A4: enqueue between pages",
                )
                .await;
            }
            for job in claim(&store, &["q"], 2, "A4: claim between pages").await {
                changed.insert(job.id());
                if round % 2 == 0 {
                    store.complete(job.id(), job.token(), None).await.must("A4");
                }
            }
            // Cancel one job already seen and one not yet seen.
            for id in [seen.first().copied(), ids.get(round * 3).copied()]
                .into_iter()
                .flatten()
            {
                if store.cancel(id).await.must("A4: cancel between pages") == JobState::Cancelled {
                    changed.insert(id);
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(round < 100, "A4: paging never ends");
        }
        let now_queued: HashSet<JobId> = list_all(&store, "q", filter, "A4")
            .await
            .iter()
            .map(|j| j.id)
            .collect();
        let seen_set: HashSet<JobId> = seen.iter().copied().collect();
        for id in &ids {
            let kept_state = !changed.contains(id) && now_queued.contains(id);
            assert!(
                !kept_state || seen_set.contains(id),
                "A4: job {id} kept its state while the pages were read, but was skipped"
            );
        }
        assert!(
            ids.iter()
                .any(|id| !changed.contains(id) && seen_set.contains(id)),
            "A4: the scenario must list some unchanged jobs"
        );
    }
}

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
    let far = env
        .clock
        .now()
        .saturating_add(Duration::from_secs(10 * 86_400));
    let queued = enqueue(&store, NewJob::new("q").priority(-1), "A5").await;
    let scheduled = enqueue(&store, NewJob::new("q").run_at(far), "A5").await;
    let running = enqueue(&store, NewJob::new("q").priority(2), "A5").await;
    let retried = enqueue(&store, NewJob::new("q").priority(1).max_attempts(1), "A5").await;
    let cancel_retried = enqueue(&store, NewJob::new("q").priority(1), "A5").await;
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

/// A6: a new store instance over the same data (a reopen) sees every job, field,
/// payload, state, timestamp, attempt, token and lease as before; keys still
/// deduplicate, the holder's token still works, token counters and claim order carry
/// on, and a requested cancellation is still honoured.
pub async fn a6_reopened_store_sees_everything(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let first = env.store().await;
    let later = env.clock.now().saturating_add(Duration::from_secs(3_600));
    let parent = enqueue(&first, NewJob::new("parents").payload(binary(300, 1)), "A6").await;
    let queued = enqueue(
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
    let scheduled = enqueue(
        &first,
        NewJob::new("q").run_at(later).payload(Vec::new()),
        "A6",
    )
    .await;
    let running = enqueue(&first, NewJob::new("work").priority(3), "A6").await;
    let done = enqueue(&first, NewJob::new("work"), "A6").await;
    let dead = enqueue(&first, NewJob::new("work").max_attempts(1), "A6").await;
    let cancelled = enqueue(&first, NewJob::new("work"), "A6").await;
    let retrying = enqueue(&first, NewJob::new("work").max_attempts(3), "A6").await;
    let fifo: Vec<JobId> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(enqueue(&first, NewJob::new("fifo"), "A6").await);
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
    assert_eq!(
        order,
        vec![scheduled, retrying, queued],
        "A6: queued and scheduled jobs run after a reopen, in claim order"
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
