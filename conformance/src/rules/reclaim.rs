//! Rules R1–R6: recovering jobs whose lease expired.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    Bytes, Clock, JobId, JobState, NewJob, QueueStats, ReclaimedJob, Retry, LEASE_EXPIRED,
};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, assert_stats_agree, claim, claim_expecting, enqueue,
    expect_not_found, get, ids_of, join_all, request, Must, Together, TTL,
};
use crate::{Harness, TestEnv};

/// R1: a lease is expired once `expires_at < now`; reclaim puts the job back to
/// `queued`, ready now, behind the jobs already ready (even those ready at the same
/// instant), with `last_error` = "lease expired", the lease cleared and `attempts`
/// unchanged until its next claim.
pub async fn r1_expired_lease_is_requeued_behind_ready_jobs(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "R1").await;
    let t0 = env.clock.now();
    let x = together
        .enqueue(&store, NewJob::new("q").payload("x"), "R1")
        .await;
    let held = store
        .claim(request(&["q"], "w", Duration::from_secs(10), 1))
        .await
        .must("R1: claim");
    assert_eq!(ids_of(&held), vec![x]);
    let y = together.enqueue(&store, NewJob::new("q"), "R1").await;
    let expiry_passed = t0.saturating_add(Duration::from_millis(10_001));
    let z = together
        .enqueue(&store, NewJob::new("q").run_at(expiry_passed), "R1")
        .await;
    env.clock.set(expiry_passed);
    let reclaimed = store.reclaim(100).await.must("R1: reclaim");
    assert_eq!(
        reclaimed,
        vec![ReclaimedJob {
            id: x,
            state: JobState::Queued
        }],
        "R1: the expired job is reclaimed to queued"
    );
    let job = get(&store, x, "R1").await;
    assert_eq!(job.state, JobState::Queued, "R1: queued");
    assert_eq!(job.run_at, env.clock.now(), "R1: ready now");
    assert_eq!(job.lease, None, "R1: lease cleared");
    assert_eq!(
        job.attempts, 1,
        "R1: attempts unchanged until the next claim"
    );
    assert_eq!(
        job.last_error.as_deref(),
        Some(LEASE_EXPIRED),
        "R1: last_error says the lease expired"
    );
    assert_eq!(job.finished_at, None);
    let order = claim(&store, &["q"], 10, "R1: claim").await;
    assert_eq!(
        ids_of(&order),
        vec![y, z, x],
        "R1: the reclaimed job goes behind every job already ready, even one ready at the same instant"
    );
    assert_eq!(order[2].job.attempts, 2, "R1: the next claim counts");
    assert_eq!(order[2].payload, Bytes::from_static(b"x"));
    assert!(
        store.reclaim(100).await.must("R1").is_empty(),
        "R1: a reclaimed job is reclaimed once"
    );
}

/// R1 with the decision "an expired lease is honoured until reclaimed": past its
/// expiry, the holder whose token is still current can heartbeat (and so keep the
/// job), complete, fail and release.
pub async fn r1_expired_lease_is_honoured_until_reclaimed(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "R1").await;
    let ttl = Duration::from_secs(10);
    let ids: Vec<JobId> = {
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(
                together
                    .enqueue(&store, NewJob::new("q").max_attempts(5), "R1")
                    .await,
            );
        }
        ids
    };
    let held = store
        .claim(request(&["q"], "w", ttl, 4))
        .await
        .must("R1: claim");
    assert_eq!(ids_of(&held), ids);
    env.clock.advance(Duration::from_secs(60));
    let beat = store
        .heartbeat(ids[0], held[0].token(), ttl)
        .await
        .must("R1: heartbeat on an expired but unreclaimed lease");
    assert_eq!(beat.expires_at, env.clock.now().saturating_add(ttl));
    store
        .complete(ids[1], held[1].token(), None)
        .await
        .must("R1: complete on an expired but unreclaimed lease");
    store
        .fail(ids[2], held[2].token(), "x", Retry::Never)
        .await
        .must("R1: fail on an expired but unreclaimed lease");
    store
        .release(ids[3], held[3].token())
        .await
        .must("R1: release on an expired but unreclaimed lease");
    assert!(
        store.reclaim(100).await.must("R1: reclaim").is_empty(),
        "R1: nothing left to reclaim: the heartbeat renewed the lease, the others finished"
    );
    assert_eq!(get(&store, ids[0], "R1").await.state, JobState::Running);
    assert_eq!(get(&store, ids[1], "R1").await.state, JobState::Succeeded);
    assert_eq!(get(&store, ids[2], "R1").await.state, JobState::Dead);
    assert_eq!(get(&store, ids[3], "R1").await.state, JobState::Queued);
}

/// R2: a lease whose expiry equals now is not expired; 1 ms later it is; a fresh
/// heartbeat keeps a job from being reclaimed.
pub async fn r2_lease_expiring_now_is_not_expired(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "R2").await;
    let ttl = Duration::from_secs(10);
    let a = together.enqueue(&store, NewJob::new("q"), "R2").await;
    let b = together.enqueue(&store, NewJob::new("q"), "R2").await;
    let held = store
        .claim(request(&["q"], "w", ttl, 2))
        .await
        .must("R2: claim");
    assert_eq!(ids_of(&held), vec![a, b]);
    env.clock.advance(Duration::from_secs(9));
    store
        .heartbeat(b, held[1].token(), ttl)
        .await
        .must("R2: heartbeat");
    env.clock.advance(Duration::from_secs(1));
    assert!(
        store.reclaim(100).await.must("R2: reclaim").is_empty(),
        "R2: a lease whose expiry equals now is not expired"
    );
    assert_eq!(get(&store, a, "R2").await.state, JobState::Running);
    env.clock.advance(Duration::from_millis(1));
    let reclaimed = store.reclaim(100).await.must("R2: reclaim");
    assert_eq!(
        reclaimed.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a],
        "R2: 1 ms past its expiry the lease is expired; the heartbeated job is kept"
    );
    assert_eq!(get(&store, b, "R2").await.state, JobState::Running);
}

/// R3: an expired job on its last attempt becomes `dead` (finished now, "lease
/// expired"), never requeued.
pub async fn r3_expired_last_attempt_is_dead(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(2), "R3").await;
    claim_expecting(&store, "q", id, "R3").await;
    env.clock.advance(TTL + Duration::from_millis(1));
    assert_eq!(
        store.reclaim(10).await.must("R3: reclaim"),
        vec![ReclaimedJob {
            id,
            state: JobState::Queued
        }],
        "R3: attempts remain: queued"
    );
    claim_expecting(&store, "q", id, "R3: second attempt").await;
    env.clock.advance(TTL + Duration::from_millis(1));
    assert_eq!(
        store.reclaim(10).await.must("R3: reclaim"),
        vec![ReclaimedJob {
            id,
            state: JobState::Dead
        }],
        "R3: an expired job on its last attempt is dead"
    );
    let job = get(&store, id, "R3").await;
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.finished_at, Some(env.clock.now()), "R3: finished now");
    assert_eq!(job.lease, None);
    assert_eq!(job.attempts, 2);
    assert_eq!(job.last_error.as_deref(), Some(LEASE_EXPIRED));
    assert_nothing_claimable(&store, &["q"], "R3: never requeued").await;
    assert!(store.reclaim(10).await.must("R3").is_empty());
}

/// R3: an expired job with `cancel_requested` becomes `cancelled` (finished now),
/// never requeued.
pub async fn r3_expired_cancel_requested_is_cancelled(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "R3").await;
    claim_expecting(&store, "q", id, "R3").await;
    assert_eq!(store.cancel(id).await.must("R3: cancel"), JobState::Running);
    env.clock.advance(TTL + Duration::from_millis(1));
    assert_eq!(
        store.reclaim(10).await.must("R3: reclaim"),
        vec![ReclaimedJob {
            id,
            state: JobState::Cancelled
        }],
        "R3: an expired cancel-requested job is cancelled"
    );
    let job = get(&store, id, "R3").await;
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.finished_at, Some(env.clock.now()));
    assert_eq!(job.lease, None);
    assert_nothing_claimable(&store, &["q"], "R3: never requeued").await;
}

/// R3 with the decision: a job both on its last attempt and cancel-requested ends
/// `cancelled` when reclaimed.
pub async fn r3_last_attempt_and_cancel_requested_is_cancelled(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(1), "R3").await;
    claim_expecting(&store, "q", id, "R3").await;
    store.cancel(id).await.must("R3: cancel");
    env.clock.advance(TTL + Duration::from_millis(1));
    assert_eq!(
        store.reclaim(10).await.must("R3: reclaim"),
        vec![ReclaimedJob {
            id,
            state: JobState::Cancelled
        }],
        "R3: cancel-requested wins over last attempt"
    );
    assert_eq!(get(&store, id, "R3").await.state, JobState::Cancelled);
}

/// R4: four reclaimers on their own connections recover 50 expired jobs; each job is
/// recovered exactly once (to queued, or dead for those on their last attempt).
pub async fn r4_concurrent_reclaimers_recover_each_job_once(harness: &dyn Harness) {
    const JOBS: usize = 50;
    const RECLAIMERS: usize = 4;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let mut expected = HashMap::new();
    for i in 0..JOBS {
        let last_attempt = i % 5 == 0;
        let job = NewJob::new("q").max_attempts(if last_attempt { 1 } else { 3 });
        let id = enqueue(&seed, job, "R4").await;
        expected.insert(
            id,
            if last_attempt {
                JobState::Dead
            } else {
                JobState::Queued
            },
        );
    }
    let held = claim(&seed, &["q"], JOBS, "R4: claim").await;
    assert_eq!(held.len(), JOBS);
    env.clock.advance(TTL + Duration::from_millis(1));
    let barrier = Arc::new(Barrier::new(RECLAIMERS));
    let mut handles = Vec::new();
    for r in 0..RECLAIMERS {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let got = store.reclaim(1 + r * 2).await.must("R4: reclaim");
                assert!(
                    got.len() <= 1 + r * 2,
                    "R4: reclaim returned more than its limit"
                );
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got);
            }
        }));
    }
    let mut seen: HashMap<JobId, JobState> = HashMap::new();
    for reclaimed in join_all(handles).await.into_iter().flatten() {
        if let Some(before) = seen.insert(reclaimed.id, reclaimed.state) {
            panic!(
                "R4: job {} was reclaimed twice ({before}, then {})",
                reclaimed.id, reclaimed.state
            );
        }
    }
    assert!(
        seed.reclaim(100).await.must("R4").is_empty(),
        "R4: nothing is left to reclaim"
    );
    assert_eq!(
        seen, expected,
        "R4: every expired job is reclaimed exactly once, to queued or dead"
    );
    assert_stats(
        &seed,
        "q",
        QueueStats {
            ready: 40,
            dead: 10,
            ..QueueStats::default()
        },
        "R4",
    )
    .await;
    let again = claim(&seed, &["q"], 100, "R4: claim again").await;
    assert_eq!(again.len(), 40, "R4: each requeued job is claimable once");
    let distinct: HashSet<JobId> = again.iter().map(|j| j.id()).collect();
    assert_eq!(distinct.len(), 40, "R4: no job was requeued twice");
}

/// R5: the running-index entry of a vanished record is removed by reclaim, never
/// requeued or recreated; the live expired jobs around it are reclaimed.
pub async fn r5_vanished_running_job_is_dropped_not_requeued(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(enqueue(&store, NewJob::new("q"), "R5").await);
    }
    claim(&store, &["q"], 3, "R5: claim").await;
    env.vanish(ids[1]).await;
    env.clock.advance(TTL + Duration::from_millis(1));
    let reclaimed: Vec<JobId> = store
        .reclaim(100)
        .await
        .must("R5: reclaim")
        .iter()
        .map(|r| r.id)
        .collect();
    let reclaimed: HashSet<JobId> = reclaimed.into_iter().collect();
    assert_eq!(
        reclaimed,
        HashSet::from([ids[0], ids[2]]),
        "R5: the live jobs are reclaimed, the vanished one is not"
    );
    expect_not_found(store.get(ids[1]).await, ids[1], "R5: not recreated");
    expect_not_found(store.payload(ids[1]).await, ids[1], "R5: not recreated");
    assert!(
        store.reclaim(100).await.must("R5").is_empty(),
        "R5: the vanished entry was removed, not left to trip later reclaims"
    );
    let claimed: HashSet<JobId> = ids_of(&claim(&store, &["q"], 10, "R5: claim").await)
        .into_iter()
        .collect();
    assert_eq!(
        claimed,
        HashSet::from([ids[0], ids[2]]),
        "R5: the vanished job was never requeued"
    );
    assert_stats(
        &store,
        "q",
        QueueStats {
            running: 2,
            ..QueueStats::default()
        },
        "R5: the vanished job is counted nowhere",
    )
    .await;
}

/// R6, tested by behaviour: with many live leases and few expired, reclaim returns
/// exactly the expired ones, and `limit` bounds each call (2, 2, 1, then none).
pub async fn r6_reclaim_takes_only_expired_and_limit_bounds_each_call(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    for _ in 0..60 {
        enqueue(&store, NewJob::new("live"), "R6").await;
    }
    let mut short = HashSet::new();
    let mut shorter = HashSet::new();
    for i in 0..8 {
        let id = enqueue(&store, NewJob::new("short"), "R6").await;
        let ttl = if i < 5 {
            shorter.insert(id);
            Duration::from_secs(10)
        } else {
            short.insert(id);
            Duration::from_secs(20)
        };
        let held = store
            .claim(request(&["short"], "w", ttl, 1))
            .await
            .must("R6: claim");
        assert_eq!(ids_of(&held), vec![id]);
    }
    let live = store
        .claim(request(&["live"], "w", Duration::from_secs(3_600), 60))
        .await
        .must("R6: claim the live jobs");
    assert_eq!(live.len(), 60);
    env.clock.advance(Duration::from_secs(15));

    let mut got = HashSet::new();
    for expect in [2, 2, 1, 0] {
        let batch = store.reclaim(2).await.must("R6: reclaim(2)");
        assert_eq!(
            batch.len(),
            expect,
            "R6: reclaim(2) with {} expired leases left must return {expect}",
            5 - got.len()
        );
        for r in batch {
            assert!(got.insert(r.id), "R6: job {} reclaimed twice", r.id);
        }
    }
    assert_eq!(
        got, shorter,
        "R6: reclaim returns exactly the expired jobs, none of the live ones"
    );
    env.clock.advance(Duration::from_secs(10));
    let rest: HashSet<JobId> = store
        .reclaim(100)
        .await
        .must("R6: reclaim")
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(rest, short, "R6: the later expiries, and only them");
    assert_stats(
        &store,
        "live",
        QueueStats {
            running: 60,
            ..QueueStats::default()
        },
        "R6: live leases are untouched",
    )
    .await;
    assert_stats_agree(&store, "short", "R6").await;
}
