//! Rules L6–L10: failures, releases, snoozes, and the fencing of a holder whose lease
//! was reclaimed.

use std::sync::Arc;
use std::time::Duration;

use durq_core::{validate, Bytes, ClaimedJob, Clock, JobId, JobState, NewJob, QueueStats, Retry};

use super::lease::assert_all_lease_lost;
use super::support::{
    assert_claim_order, assert_nothing_claimable, assert_stats, claim, claim_expecting, enqueue,
    get, ids_of, join_all, request, Must, Together, TTL,
};
use crate::{Harness, TestEnv};

/// L6: `fail` with a retry time while attempts remain requeues the job at that time,
/// keeps `last_error`, clears the lease, leaves it unfinished; not claimable before
/// the time, claimable at it, and `last_error` survives the next claim.
pub async fn l6_fail_with_retry_requeues_at_the_given_time(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "L").await;
    let id = together
        .enqueue(&store, NewJob::new("q").max_attempts(3), "L6")
        .await;
    let held = claim_expecting(&store, "q", id, "L6").await;
    let at = env.clock.now().saturating_add(Duration::from_secs(60));
    assert_eq!(
        store
            .fail(id, held.token(), "boom: it broke", Retry::At(at))
            .await
            .must("L6: fail"),
        JobState::Queued,
        "L6: fail with retry reports queued"
    );
    let mut expected = held.job.clone();
    expected.state = JobState::Queued;
    expected.run_at = at;
    expected.lease = None;
    expected.last_error = Some("boom: it broke".to_owned());
    let stored = get(&store, id, "L6").await;
    assert_eq!(
        (
            stored.state,
            stored.run_at,
            stored.attempts,
            &stored.lease,
            &stored.last_error,
            stored.finished_at
        ),
        (
            expected.state,
            expected.run_at,
            1,
            &None,
            &expected.last_error,
            None
        ),
        "L6: queued at the retry time, attempt counted, error kept, lease cleared"
    );
    assert_stats(
        &store,
        "q",
        QueueStats {
            scheduled: 1,
            ..QueueStats::default()
        },
        "L6: scheduled",
    )
    .await;
    env.clock.advance(Duration::from_millis(59_999));
    assert_nothing_claimable(&store, &["q"], "L6: before the retry time").await;
    env.clock.advance(Duration::from_millis(1));
    let again = claim_expecting(&store, "q", id, "L6: at the retry time").await;
    assert_eq!(again.job.attempts, 2);
    assert_eq!(
        again.job.last_error.as_deref(),
        Some("boom: it broke"),
        "L6: last_error is kept"
    );
    // A retry time in the past is stored as now: ready at once, and behind the jobs
    // that were ready before it (C3), not ahead of them.
    let waiting = together.enqueue(&store, NewJob::new("q"), "L6").await;
    env.clock.advance(Duration::from_secs(1));
    let now = env.clock.now();
    let past = now.saturating_sub(Duration::from_secs(3_600));
    store
        .fail(id, again.token(), "second", Retry::At(past))
        .await
        .must("L6: fail with a past time");
    assert_eq!(
        get(&store, id, "L6").await.run_at,
        now,
        "L6: a retry time in the past is stored as now"
    );
    claim_expecting(&store, "q", waiting, "L6: the job ready before goes first").await;
    let third = claim_expecting(&store, "q", id, "L6: a past retry time is ready now").await;
    assert_eq!(third.job.last_error.as_deref(), Some("second"));
}

/// L6 with the decision on `last_error`: a message over 64 KiB is cut at a character
/// boundary to at most 64 KiB (`durq_core::validate::truncate_error`).
pub async fn l6_long_error_is_cut_at_64_kib(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "L6").await;
    let held = claim_expecting(&store, "q", id, "L6").await;
    // 3-byte characters, so 64 KiB falls inside one.
    let message = "€".repeat(30_000);
    store
        .fail(id, held.token(), &message, Retry::Never)
        .await
        .must("L6: fail with a long message");
    let stored = get(&store, id, "L6").await.last_error.unwrap_or_default();
    assert_eq!(
        stored,
        validate::truncate_error(&message),
        "L6: last_error is cut at 64 KiB on a character boundary"
    );
    assert_eq!(stored.len(), 65_535, "L6: 21,845 whole 3-byte characters");
}

/// L7: `fail` on the last attempt, or with `Retry::Never`, makes the job `dead`:
/// finished now, lease cleared, error kept, never claimed again.
pub async fn l7_fail_on_last_attempt_or_no_retry_is_dead(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "L").await;
    let two = together
        .enqueue(&store, NewJob::new("q").max_attempts(2), "L7")
        .await;
    let held = claim_expecting(&store, "q", two, "L7").await;
    assert_eq!(
        store
            .fail(two, held.token(), "first", Retry::At(env.clock.now()))
            .await
            .must("L7"),
        JobState::Queued,
        "L7: attempts remain"
    );
    let held = claim_expecting(&store, "q", two, "L7").await;
    let never = together.enqueue(&store, NewJob::new("q"), "L7").await;
    let one = together
        .enqueue(&store, NewJob::new("q").max_attempts(1), "L7")
        .await;
    env.clock.advance(Duration::from_secs(3));
    let later = env.clock.now().saturating_add(Duration::from_secs(1));
    assert_eq!(
        store
            .fail(two, held.token(), "last", Retry::At(later))
            .await
            .must("L7: fail on the last attempt"),
        JobState::Dead,
        "L7: a failure on the last attempt is dead, whatever retry it asks for"
    );
    let h_never = claim_expecting(&store, "q", never, "L7").await;
    assert_eq!(
        store
            .fail(never, h_never.token(), "never", Retry::Never)
            .await
            .must("L7: fail with no retry"),
        JobState::Dead,
        "L7: Retry::Never is dead on the first attempt"
    );
    let h_one = claim_expecting(&store, "q", one, "L7").await;
    assert_eq!(
        store
            .fail(one, h_one.token(), "only", Retry::At(later))
            .await
            .must("L7: fail with max_attempts 1"),
        JobState::Dead,
        "L7: max_attempts = 1 is dead after one failure"
    );
    for (id, error) in [(two, "last"), (never, "never"), (one, "only")] {
        let job = get(&store, id, "L7").await;
        assert_eq!(job.state, JobState::Dead, "L7: dead");
        assert_eq!(job.finished_at, Some(env.clock.now()), "L7: finished now");
        assert_eq!(job.lease, None, "L7: lease cleared");
        assert_eq!(job.last_error.as_deref(), Some(error), "L7: error kept");
    }
    env.clock.advance(Duration::from_secs(10));
    assert_nothing_claimable(&store, &["q"], "L7: dead jobs are not claimed").await;
    assert_stats(
        &store,
        "q",
        QueueStats {
            dead: 3,
            ..QueueStats::default()
        },
        "L7",
    )
    .await;
}

/// L8 with the decision "release takes back the attempt": release makes the job
/// `queued`, ready now, lease cleared, `attempts - 1`; a job with one attempt can be
/// claimed and released again and again without dying.
pub async fn l8_release_takes_back_the_attempt(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(1), "L8").await;
    let mut last: Option<ClaimedJob> = None;
    for round in 0..3 {
        let held = claim_expecting(&store, "q", id, "L8").await;
        assert_eq!(
            held.job.attempts, 1,
            "L8: after {round} releases the claim is still the first attempt"
        );
        env.clock.advance(Duration::from_secs(10));
        store.release(id, held.token()).await.must("L8: release");
        let job = get(&store, id, "L8").await;
        assert_eq!(job.state, JobState::Queued, "L8: released job is queued");
        assert_eq!(job.attempts, 0, "L8: release takes back the attempt");
        assert_eq!(job.lease, None, "L8: lease cleared");
        assert_eq!(job.run_at, env.clock.now(), "L8: ready now");
        assert_eq!(job.finished_at, None);
        assert_stats(
            &store,
            "q",
            QueueStats {
                ready: 1,
                ..QueueStats::default()
            },
            "L8: ready",
        )
        .await;
        last = Some(held);
    }
    let held = claim_expecting(&store, "q", id, "L8: still claimable").await;
    assert!(last.is_some_and(|l| held.token() > l.token()));
    assert_eq!(
        store
            .fail(id, held.token(), "x", Retry::At(env.clock.now()))
            .await
            .must("L8"),
        JobState::Dead,
        "L8: the one real attempt then fails for good"
    );
}

/// L10: a snooze hands the job back until its time without using up an attempt or
/// touching `last_error`; it may snooze again and again; a past time means now; a
/// cancel-requested job ends cancelled.
pub async fn l10_snooze_waits_without_using_an_attempt(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(2), "L10").await;
    // A first attempt that failed leaves a last_error the snoozes must keep.
    let first = claim_expecting(&store, "q", id, "L10: first attempt").await;
    store
        .fail(id, first.token(), "boom", Retry::At(env.clock.now()))
        .await
        .must("L10: first attempt fails");
    for round in 0..4 {
        let held = claim_expecting(&store, "q", id, "L10: claim").await;
        assert_eq!(
            held.job.attempts, 2,
            "L10: after {round} snoozes the claim is still the second attempt"
        );
        store
            .snooze(id, held.token(), Duration::from_secs(60))
            .await
            .must("L10: snooze");
        let job = get(&store, id, "L10").await;
        assert_eq!(job.state, JobState::Queued, "L10: a snoozed job is queued");
        assert_eq!(job.attempts, 1, "L10: a snooze takes back its attempt");
        assert_eq!(
            job.last_error.as_deref(),
            Some("boom"),
            "L10: last_error kept"
        );
        assert_eq!(job.lease, None, "L10: lease cleared");
        assert_eq!(job.finished_at, None);
        assert_eq!(
            job.run_at,
            env.clock.now().saturating_add(Duration::from_secs(60)),
            "L10: ready after the delay"
        );
        assert_stats(
            &store,
            "q",
            QueueStats {
                scheduled: 1,
                ..QueueStats::default()
            },
            "L10: snoozed",
        )
        .await;
        env.clock.advance(Duration::from_millis(59_999));
        assert_nothing_claimable(&store, &["q"], "L10: not before its time").await;
        env.clock.advance(Duration::from_millis(1));
    }
    // A time already past is now.
    let held = claim_expecting(&store, "q", id, "L10: after the snoozes").await;
    let past = env.clock.now().saturating_sub(Duration::from_secs(3600));
    store
        .snooze_until(id, held.token(), past)
        .await
        .must("L10: snooze_until a past time");
    let job = get(&store, id, "L10").await;
    assert_eq!(
        job.run_at,
        env.clock.now(),
        "L10: a past time is stored as now"
    );
    // Cancelled while it runs: the snooze ends it, its attempt counted (A1).
    let held = claim_expecting(&store, "q", id, "L10: again").await;
    store.cancel(id).await.must("L10: cancel while running");
    store
        .snooze(id, held.token(), Duration::from_secs(60))
        .await
        .must("L10: snooze of a cancel-requested job");
    let job = get(&store, id, "L10").await;
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "L10: cancel wins over snooze"
    );
    assert_eq!(job.attempts, 2, "L10: the cancelled attempt stays counted");
    assert!(job.finished_at.is_some(), "L10: cancelled is terminal");
}

/// L10 with C3: a snoozed job that comes due goes behind the jobs ready before it, and
/// ahead of the jobs that became ready after it.
pub async fn l10_snoozed_job_comes_due_in_order(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let snoozed = enqueue(&store, NewJob::new("q"), "L10").await;
    let held = claim_expecting(&store, "q", snoozed, "L10").await;
    store
        .snooze(snoozed, held.token(), Duration::from_secs(10))
        .await
        .must("L10: snooze");
    let before = [
        enqueue(&store, NewJob::new("q"), "L10").await,
        enqueue(&store, NewJob::new("q"), "L10").await,
    ];
    env.clock.advance(Duration::from_secs(10));
    let after = enqueue(&store, NewJob::new("q"), "L10").await;
    let claimed = claim(&store, &["q"], 10, "L10: all due").await;
    assert_claim_order(
        &store,
        &ids_of(&claimed),
        &[before[0], before[1], snoozed, after],
        "L10: the snoozed job is ready at its time, behind the jobs ready before",
    );
}

/// L9: after a reclaim and a new claim, every call by the old holder fails with lease
/// lost and changes nothing, and the new holder's calls succeed.
pub async fn l9_old_holder_is_fenced_after_reclaim(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let old_store = env.store().await;
    let new_store = env.store().await;
    let id = enqueue(&old_store, NewJob::new("q"), "L9").await;
    let old = old_store
        .claim(request(&["q"], "old", Duration::from_secs(10), 1))
        .await
        .must("L9: claim");
    let old_token = old[0].token();
    env.clock.advance(Duration::from_millis(10_001));
    let reclaimed = new_store.reclaim(10).await.must("L9: reclaim");
    assert_eq!(reclaimed.len(), 1, "L9: the expired lease is reclaimed");
    let new = new_store
        .claim(request(&["q"], "new", TTL, 1))
        .await
        .must("L9: claim again");
    assert_eq!(new.len(), 1);
    let before = get(&new_store, id, "L9").await;
    assert_all_lease_lost(&old_store, &before, old_token, "L9: the old holder").await;
    new_store
        .heartbeat(id, new[0].token(), TTL)
        .await
        .must("L9: the new holder's heartbeat");
    new_store
        .complete(id, new[0].token(), Some(Bytes::from_static(b"new")))
        .await
        .must("L9: the new holder's complete");
    let job = get(&old_store, id, "L9").await;
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result, Some(Bytes::from_static(b"new")));
}

/// The holder's side of a head-on race with reclaim.
#[derive(Debug, Clone, Copy)]
enum HolderCall {
    Complete,
    Heartbeat,
    Release,
    Fail,
}

impl HolderCall {
    const ALL: [HolderCall; 4] = [
        HolderCall::Complete,
        HolderCall::Heartbeat,
        HolderCall::Release,
        HolderCall::Fail,
    ];

    fn name(self) -> &'static str {
        match self {
            HolderCall::Complete => "complete",
            HolderCall::Heartbeat => "heartbeat",
            HolderCall::Release => "release",
            HolderCall::Fail => "fail",
        }
    }
}

/// L9 under concurrency: 80 head-on races, one per job. Each lease is made to expire
/// alone, then its holder's call (`complete`, `heartbeat`, `release` or `fail`, in
/// turn) and a `reclaim` on another connection are started at once. Exactly one may
/// win: the holder's call succeeds and reclaim does not return the job, or reclaim
/// returns it and the holder's call fails with lease lost; the stored state agrees.
/// A backend that checks the lease, then writes without checking again, lets both
/// win.
pub async fn l9_holder_racing_reclaim_has_one_winner(harness: &dyn Harness) {
    const JOBS: u64 = 80;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let holder = env.store().await;
    let reclaimer = env.store().await;
    let t0 = env.clock.now();
    // Lease i expires at t0 + 10 s + i ms, so each step of the clock expires one more.
    let mut held = Vec::new();
    for i in 0..JOBS {
        let id = enqueue(&seed, NewJob::new("q"), "L9").await;
        let ttl = Duration::from_millis(10_000 + i);
        let claimed = seed
            .claim(request(&["q"], "holder", ttl, 1))
            .await
            .must("L9: claim");
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].id(), id);
        held.push((id, claimed[0].token()));
    }
    for (i, (id, token)) in held.into_iter().enumerate() {
        env.clock
            .set(t0.saturating_add(Duration::from_millis(10_001 + i as u64)));
        let call_kind = HolderCall::ALL[i % HolderCall::ALL.len()];
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let call = {
            let store = holder.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                match call_kind {
                    HolderCall::Complete => store.complete(id, token, None).await,
                    HolderCall::Heartbeat => store
                        .heartbeat(id, token, Duration::from_secs(600))
                        .await
                        .map(|_| ()),
                    HolderCall::Release => store.release(id, token).await,
                    HolderCall::Fail => store
                        .fail(id, token, "gave up", Retry::Never)
                        .await
                        .map(|_| ()),
                }
            })
        };
        let reclaim = {
            let store = reclaimer.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                store.reclaim(10).await
            })
        };
        let reclaimed = join_all(vec![reclaim]).await.remove(0).must("L9: reclaim");
        let holder_won = match join_all(vec![call]).await.remove(0) {
            Ok(()) => true,
            Err(durq_core::Error::LeaseLost { .. }) => false,
            Err(err) => panic!("L9: the holder's call on job {id} failed: {err}"),
        };
        let reclaimed: Vec<JobId> = reclaimed.iter().map(|r| r.id).collect();
        assert!(
            reclaimed.iter().all(|r| *r == id),
            "L9: only job {id}'s lease had expired, reclaim returned {reclaimed:?}"
        );
        assert!(
            holder_won != reclaimed.contains(&id),
            "L9: job {id}: the holder's {} {} and reclaim {} it; exactly one may win",
            call_kind.name(),
            if holder_won { "succeeded" } else { "failed" },
            if reclaimed.contains(&id) {
                "took"
            } else {
                "did not take"
            },
        );
        let job = get(&seed, id, "L9").await;
        let expected = match (holder_won, call_kind) {
            (false, _) => (JobState::Queued, Some(durq_core::LEASE_EXPIRED)),
            (true, HolderCall::Complete) => (JobState::Succeeded, None),
            (true, HolderCall::Heartbeat) => (JobState::Running, None),
            (true, HolderCall::Release) => (JobState::Queued, None),
            (true, HolderCall::Fail) => (JobState::Dead, Some("gave up")),
        };
        assert_eq!(
            (job.state, job.last_error.as_deref()),
            expected,
            "L9: job {id} must be where its winner left it ({} {})",
            call_kind.name(),
            if holder_won { "won" } else { "lost" },
        );
    }
    assert!(
        seed.reclaim(100).await.must("L9").is_empty(),
        "L9: every race was settled"
    );
}
