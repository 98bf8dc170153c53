//! Rules H1–H4: every attempt of a job, read back with it.

use std::time::Duration;

use durq_core::{
    validate, Attempt, AttemptOutcome, ClaimRequest, Clock, JobId, JobState, LeaseToken, NewJob,
    Retry, Store, ATTEMPTS_KEPT, LEASE_EXPIRED,
};

use super::support::{claim, enqueue, expect_lease_lost, expect_not_found, get, Must, TTL, WORKER};
use crate::{Harness, TestEnv};

async fn attempts(store: &Store, id: JobId, what: &str) -> Vec<Attempt> {
    store.attempts(id).await.must(what)
}

fn tokens(attempts: &[Attempt]) -> Vec<u64> {
    attempts.iter().map(|a| a.token.get()).collect()
}

/// H1: a job never claimed has no attempts; each claim begins one, listed oldest first
/// with its claim's token, its worker and its start, running with no end; `get` agrees
/// on the running attempt's lease. An unknown job is `NotFound`.
pub async fn h1_every_claim_is_an_attempt_with_its_worker_and_token(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "H1").await;
    assert!(
        attempts(&store, id, "H1: before any claim")
            .await
            .is_empty(),
        "H1: a job never claimed has no attempts"
    );
    env.clock.advance(Duration::from_millis(7));
    let first_start = env.clock.now();
    let first = store
        .claim(ClaimRequest::new(["q"], "worker-a", TTL))
        .await
        .must("H1: claim")
        .remove(0);
    let running = attempts(&store, id, "H1: while running").await;
    assert_eq!(
        running,
        vec![Attempt {
            token: first.token(),
            worker: "worker-a".into(),
            started_at: first_start,
            ended_at: None,
            outcome: AttemptOutcome::Running,
            error: None,
        }],
        "H1: the running attempt shows its token, worker and start, and no end"
    );
    store.release(id, first.token()).await.must("H1: release");
    env.clock.advance(Duration::from_millis(5));
    let second_start = env.clock.now();
    let second = store
        .claim(ClaimRequest::new(["q"], "worker-b", TTL))
        .await
        .must("H1: second claim")
        .remove(0);
    let both = attempts(&store, id, "H1: after a second claim").await;
    assert_eq!(
        tokens(&both),
        vec![first.token().get(), second.token().get()],
        "H1: attempts are listed oldest first, one per claim"
    );
    assert_eq!(
        (both[1].worker.as_str(), both[1].started_at, both[1].outcome),
        ("worker-b", second_start, AttemptOutcome::Running),
        "H1: the newest attempt is the running one"
    );
    let lease = store
        .get(id)
        .await
        .must("H1: get")
        .lease
        .expect("H1: a claimed job has a lease");
    assert_eq!(
        (lease.token, lease.worker.as_str()),
        (both[1].token, "worker-b"),
        "H1: the running attempt is the job's lease"
    );
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(store.attempts(unknown).await, unknown, "H1: unknown job");
}

/// H2: an attempt's error is kept cut at 4 KiB on a character boundary, where the job's
/// `last_error` keeps 64 KiB of the same text.
pub async fn h2_an_attempts_error_is_cut_at_4_kib(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(5), "H2").await;
    // Three-byte characters, so 4 KiB falls inside one: the cut steps back to its start.
    let error = "€".repeat(10_000);
    let held = claim(&store, &["q"], 1, "H2").await.remove(0);
    store
        .fail(id, held.token(), &error, Retry::At(env.clock.now()))
        .await
        .must("H2: fail");
    let last_error = get(&store, id, "H2").await.last_error.unwrap_or_default();
    assert_eq!(
        last_error,
        validate::truncate_error(&error),
        "H2: last_error keeps 64 KiB"
    );
    let attempts = store.attempts(id).await.must("H2: attempts");
    let recorded = attempts[0].error.clone().unwrap_or_default();
    assert_eq!(
        recorded.len(),
        validate::MAX_ATTEMPT_ERROR_BYTES / 3 * 3,
        "H2: the attempt's error is cut at 4 KiB, on a character boundary"
    );
    assert!(error.starts_with(&recorded), "H2: the cut keeps the start");
}

/// H2: each way an attempt ends is recorded with the instant of the call that ended it:
/// `fail` as failed with its error (whether the job is requeued, dies or is
/// cancelled), `release` and snooze as released, `reclaim` as expired with the
/// eviction text, `complete` as succeeded. A call with a stale token records nothing.
pub async fn h2_each_ending_is_recorded_with_its_outcome_and_error(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(10), "H2").await;
    let mut expected: Vec<(AttemptOutcome, Option<&str>)> = Vec::new();
    let mut ends = Vec::new();
    let claim_one = |what: &'static str| {
        let store = store.clone();
        async move { claim(&store, &["q"], 1, what).await.remove(0) }
    };

    let held = claim_one("H2: claim 1").await;
    env.clock.advance(Duration::from_millis(10));
    ends.push(env.clock.now());
    let retry_at = env.clock.now();
    store
        .fail(id, held.token(), "first failure", Retry::At(retry_at))
        .await
        .must("H2: fail with a retry");
    expected.push((AttemptOutcome::Failed, Some("first failure")));
    expect_lease_lost(
        store.complete(id, held.token(), None).await,
        id,
        "H2: a stale completion",
    );

    let held = claim_one("H2: claim 2").await;
    env.clock.advance(Duration::from_millis(10));
    ends.push(env.clock.now());
    store.release(id, held.token()).await.must("H2: release");
    expected.push((AttemptOutcome::Released, None));

    let held = claim_one("H2: claim 3").await;
    env.clock.advance(Duration::from_millis(10));
    ends.push(env.clock.now());
    store
        .snooze(id, held.token(), Duration::from_millis(1))
        .await
        .must("H2: snooze");
    expected.push((AttemptOutcome::Released, None));
    env.clock.advance(Duration::from_millis(1));

    let held = claim_one("H2: claim 4").await;
    env.clock.advance(TTL + Duration::from_millis(1));
    ends.push(env.clock.now());
    let reclaimed = store.reclaim(10).await.must("H2: reclaim");
    assert_eq!(reclaimed.len(), 1, "H2: the expired lease is reclaimed");
    expected.push((AttemptOutcome::Expired, Some(LEASE_EXPIRED)));
    expect_lease_lost(
        store.fail(id, held.token(), "too late", Retry::Never).await,
        id,
        "H2: the fenced holder's failure",
    );

    let held = claim_one("H2: claim 5").await;
    env.clock.advance(Duration::from_millis(10));
    ends.push(env.clock.now());
    store
        .complete(id, held.token(), None)
        .await
        .must("H2: complete");
    expected.push((AttemptOutcome::Succeeded, None));

    let history = attempts(&store, id, "H2: history").await;
    assert_eq!(
        history
            .iter()
            .map(|a| (a.outcome, a.error.as_deref()))
            .collect::<Vec<_>>(),
        expected,
        "H2: each attempt's outcome and error, oldest first"
    );
    assert_eq!(
        history.iter().map(|a| a.ended_at).collect::<Vec<_>>(),
        ends.into_iter().map(Some).collect::<Vec<_>>(),
        "H2: each attempt ends at the instant of the call that ended it"
    );
    assert_eq!(
        tokens(&history),
        vec![1, 2, 3, 4, 5],
        "H2: tokens count the claims"
    );
    assert!(
        history.iter().all(|a| a.worker == WORKER),
        "H2: every attempt names its worker"
    );

    // A failure that kills the job, and one that cancels it, are failed attempts too.
    let dies = enqueue(&store, NewJob::new("dies").max_attempts(1), "H2").await;
    let held = claim(&store, &["dies"], 1, "H2: claim the last attempt").await;
    store
        .fail(dies, held[0].token(), "fatal", Retry::At(env.clock.now()))
        .await
        .must("H2: the last attempt fails");
    let cancelled = enqueue(&store, NewJob::new("stops"), "H2").await;
    let held = claim(&store, &["stops"], 1, "H2: claim").await;
    store
        .cancel(cancelled)
        .await
        .must("H2: cancel the running job");
    store
        .fail(cancelled, held[0].token(), "stopped", Retry::Never)
        .await
        .must("H2: the cancelled job fails");
    for (job, state, error) in [
        (dies, JobState::Dead, "fatal"),
        (cancelled, JobState::Cancelled, "stopped"),
    ] {
        assert_eq!(store.get(job).await.must("H2").state, state);
        let history = attempts(&store, job, "H2").await;
        assert_eq!(
            history
                .iter()
                .map(|a| (a.outcome, a.error.as_deref()))
                .collect::<Vec<_>>(),
            vec![(AttemptOutcome::Failed, Some(error))],
            "H2: the attempt that left the job {state} is a failed one with its error"
        );
    }
}

/// H3: a job keeps its newest `ATTEMPTS_KEPT` attempts; older ones drop off, and the
/// tokens of those kept are the newest, in order. A retry (A2) keeps the history.
pub async fn h3_only_the_newest_attempts_are_kept(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(1), "H3").await;
    let claims = ATTEMPTS_KEPT + 5;
    for round in 0..claims {
        let held = claim(&store, &["q"], 1, "H3: claim").await;
        assert_eq!(held.len(), 1, "H3: the job is claimable at round {round}");
        env.clock.advance(Duration::from_millis(1));
        if round + 1 == claims {
            break;
        }
        if round % 2 == 0 {
            store.release(id, held[0].token()).await.must("H3: release");
        } else {
            // One attempt allowed: each failure kills the job, and a retry revives it,
            // keeping its history.
            store
                .fail(id, held[0].token(), &format!("round {round}"), Retry::Never)
                .await
                .must("H3: fail");
            store.retry(id).await.must("H3: retry");
        }
    }
    let history = attempts(&store, id, "H3: history").await;
    let expected: Vec<u64> = (claims - ATTEMPTS_KEPT + 1..=claims).collect();
    assert_eq!(
        tokens(&history),
        expected,
        "H3: the newest {ATTEMPTS_KEPT} attempts are kept, oldest first"
    );
    assert_eq!(
        history.last().map(|a| a.outcome),
        Some(AttemptOutcome::Running),
        "H3: the running attempt is the newest"
    );
    let failed = history
        .iter()
        .find(|a| a.outcome == AttemptOutcome::Failed)
        .expect("H3: failed attempts are kept");
    assert_eq!(
        failed.error.as_deref(),
        Some(format!("round {}", failed.token.get() - 1).as_str()),
        "H3: a kept attempt keeps its own error, not a newer one's"
    );
    assert!(
        history.iter().all(|a| a.token > LeaseToken::new(0)),
        "H3: tokens start at 1"
    );
}

/// H4: purging a job removes its attempts with it: they are `NotFound` afterwards, and
/// another job's attempts are untouched.
pub async fn h4_attempts_are_purged_with_their_job(harness: &dyn Harness) {
    const RETENTION: Duration = Duration::from_secs(60);
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.retention(RETENTION)).await;
    let done = enqueue(&store, NewJob::new("q"), "H4").await;
    let kept = enqueue(&store, NewJob::new("q"), "H4").await;
    let held = claim(&store, &["q"], 2, "H4: claim both").await;
    store
        .fail(done, held[0].token(), "once", Retry::At(env.clock.now()))
        .await
        .must("H4: fail");
    let again = claim(&store, &["q"], 1, "H4: claim again").await;
    store
        .complete(done, again[0].token(), None)
        .await
        .must("H4: complete");
    assert_eq!(
        attempts(&store, done, "H4: before the purge").await.len(),
        2,
        "H4: the finished job has both attempts"
    );
    env.clock.advance(RETENTION);
    assert_eq!(store.purge(100).await.must("H4: purge"), 1);
    expect_not_found(
        store.attempts(done).await,
        done,
        "H4: a purged job's attempts",
    );
    let others = attempts(&store, kept, "H4: the other job").await;
    assert_eq!(
        (others.len(), others[0].outcome),
        (1, AttemptOutcome::Running),
        "H4: another job's attempts are untouched"
    );
}
