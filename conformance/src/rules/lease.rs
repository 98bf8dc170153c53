//! Rules L1–L5: heartbeats and completions, fenced by the lease token (the other endings
//! are in `lease_endings.rs`).

use std::time::Duration;

use durq_core::{
    Bytes, Clock, Completion, Heartbeat, HeldLease, Job, JobId, JobState, LeaseToken, NewJob,
    QueueStats, Retry, Store,
};

use super::support::{
    assert_nothing_claimable, assert_stats, assert_unchanged, binary, claim_expecting, enqueue,
    expect_invalid, expect_lease_lost, expect_not_found, expect_too_large, get, Must, TTL,
};
use crate::{Harness, TestEnv};

/// Every lease call with `token`, each of which must fail with lease lost and leave
/// the job exactly as `before`.
pub(super) async fn assert_all_lease_lost(
    store: &Store,
    before: &Job,
    token: LeaseToken,
    what: &str,
) {
    let id = before.id;
    expect_lease_lost(
        store.heartbeat(id, token, TTL).await,
        id,
        &format!("{what}: heartbeat"),
    );
    assert_unchanged(store, before, &format!("{what}: heartbeat")).await;
    expect_lease_lost(
        store
            .complete(id, token, Some(Bytes::from_static(b"r")))
            .await,
        id,
        &format!("{what}: complete"),
    );
    assert_unchanged(store, before, &format!("{what}: complete")).await;
    for retry in [Retry::Never, Retry::At(store.settings().now())] {
        expect_lease_lost(
            store.fail(id, token, "stale", retry).await,
            id,
            &format!("{what}: fail"),
        );
        assert_unchanged(store, before, &format!("{what}: fail")).await;
    }
    expect_lease_lost(
        store.release(id, token).await,
        id,
        &format!("{what}: release"),
    );
    assert_unchanged(store, before, &format!("{what}: release")).await;
    expect_lease_lost(
        store.snooze(id, token, Duration::from_secs(5)).await,
        id,
        &format!("{what}: snooze"),
    );
    assert_unchanged(store, before, &format!("{what}: snooze")).await;
}

/// Every lease call on `id`, each of which must fail with not found.
async fn assert_all_not_found(store: &Store, id: JobId, token: LeaseToken, what: &str) {
    expect_not_found(
        store.heartbeat(id, token, TTL).await,
        id,
        &format!("{what}: heartbeat"),
    );
    expect_not_found(
        store.complete(id, token, None).await,
        id,
        &format!("{what}: complete"),
    );
    expect_not_found(
        store.fail(id, token, "x", Retry::Never).await,
        id,
        &format!("{what}: fail"),
    );
    expect_not_found(
        store
            .fail(id, token, "x", Retry::At(store.settings().now()))
            .await,
        id,
        &format!("{what}: fail with retry"),
    );
    expect_not_found(
        store.release(id, token).await,
        id,
        &format!("{what}: release"),
    );
    expect_not_found(
        store.snooze(id, token, Duration::from_secs(5)).await,
        id,
        &format!("{what}: snooze"),
    );
    expect_not_found(
        store.get(id).await,
        id,
        &format!("{what}: nothing was created"),
    );
    expect_not_found(
        store.payload(id).await,
        id,
        &format!("{what}: no payload was created"),
    );
}

/// L1: the holder's heartbeat moves the expiry to now + ttl (later or earlier) and
/// `heartbeat_at` to now, keeps token, worker, attempts and `started_at`, and reports
/// whether cancellation was requested; the extended lease survives past the old
/// expiry.
pub async fn l1_heartbeat_extends_the_lease(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "L1").await;
    let held = claim_expecting(&store, "q", id, "L1").await;
    let claimed_at = env.clock.now();
    env.clock.advance(Duration::from_secs(20));
    let now = env.clock.now();
    let beat = store
        .heartbeat(id, held.token(), Duration::from_secs(60))
        .await
        .must("L1: heartbeat");
    assert_eq!(
        beat,
        Heartbeat {
            cancel_requested: false,
            expires_at: now.saturating_add(Duration::from_secs(60)),
        },
        "L1: heartbeat reports the new expiry, now + ttl, and no cancellation"
    );
    let mut expected = held.job.clone();
    expected.heartbeat_at = Some(now);
    if let Some(lease) = expected.lease.as_mut() {
        lease.expires_at = beat.expires_at;
    }
    assert_eq!(
        get(&store, id, "L1").await,
        expected,
        "L1: heartbeat moves the expiry and heartbeat_at, nothing else"
    );
    assert_eq!(expected.started_at, Some(claimed_at));

    // Past the first lease's expiry, inside the extended one: not reclaimed.
    env.clock.advance(Duration::from_secs(59));
    assert!(
        store.reclaim(100).await.must("L1: reclaim").is_empty(),
        "L1: an extended lease is not reclaimed at its old expiry"
    );
    // A shorter ttl moves the expiry earlier: to now + ttl, exactly.
    let beat = store
        .heartbeat(id, held.token(), Duration::from_millis(5))
        .await
        .must("L1: short heartbeat");
    assert_eq!(
        beat.expires_at,
        env.clock.now().saturating_add(Duration::from_millis(5)),
        "L1: the expiry is now + ttl even when that is earlier"
    );
    store.cancel(id).await.must("L1: cancel");
    let beat = store
        .heartbeat(id, held.token(), TTL)
        .await
        .must("L1: heartbeat after cancel");
    assert!(
        beat.cancel_requested,
        "L1: heartbeat must report a requested cancellation"
    );
    expect_invalid(
        store.heartbeat(id, held.token(), Duration::ZERO).await,
        "lease_ttl",
        "L1: a zero ttl",
    );
}

/// L2: after a job is claimed again, every call with the old token fails with lease
/// lost and changes nothing, field for field; so does a forged token above the
/// current one; the current holder is unaffected.
pub async fn l2_stale_token_is_lease_lost_and_changes_nothing(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").payload("p"), "L2").await;
    let first = claim_expecting(&store, "q", id, "L2").await;
    store
        .fail(id, first.token(), "again", Retry::At(env.clock.now()))
        .await
        .must("L2: fail");
    env.clock.advance(Duration::from_secs(1));
    let second = claim_expecting(&store, "q", id, "L2: claim again").await;
    let before = get(&store, id, "L2").await;
    env.clock.advance(Duration::from_secs(1));
    assert_all_lease_lost(&store, &before, first.token(), "L2: the old token").await;
    let forged = LeaseToken::new(second.token().get() + 1);
    assert_all_lease_lost(&store, &before, forged, "L2: a token above the current one").await;
    assert_all_lease_lost(&store, &before, LeaseToken::new(0), "L2: token 0").await;
    assert_eq!(
        store.payload(id).await.must("L2"),
        Bytes::from_static(b"p"),
        "L2: the payload is unchanged"
    );
    store
        .heartbeat(id, second.token(), TTL)
        .await
        .must("L2: the holder's heartbeat");
    store
        .complete(id, second.token(), None)
        .await
        .must("L2: the holder's complete");
}

/// L2: lease calls on a job that exists but is not running (queued, scheduled,
/// succeeded, dead, cancelled) fail with lease lost and change nothing.
pub async fn l2_calls_on_a_job_not_running_are_lease_lost(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let queued = enqueue(&store, NewJob::new("q").priority(1), "L2").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(60));
    let scheduled = enqueue(&store, NewJob::new("later").run_at(later), "L2").await;
    let cancelled = enqueue(&store, NewJob::new("q"), "L2").await;
    store.cancel(cancelled).await.must("L2: cancel");
    let done = enqueue(&store, NewJob::new("done"), "L2").await;
    let dead = enqueue(&store, NewJob::new("dead"), "L2").await;
    let d = claim_expecting(&store, "done", done, "L2").await;
    store.complete(done, d.token(), None).await.must("L2");
    let x = claim_expecting(&store, "dead", dead, "L2").await;
    store
        .fail(dead, x.token(), "x", Retry::Never)
        .await
        .must("L2");
    env.clock.advance(Duration::from_secs(1));
    for (id, token) in [
        (queued, LeaseToken::new(1)),
        (scheduled, LeaseToken::new(1)),
        (cancelled, LeaseToken::new(1)),
        (done, d.token()),
        (dead, x.token()),
    ] {
        let before = get(&store, id, "L2").await;
        let what = format!("L2: a {} job", before.state);
        assert_all_lease_lost(&store, &before, token, &what).await;
    }
    let first = claim_expecting(&store, "q", queued, "L2: still claimable").await;
    assert_eq!(
        first.token(),
        LeaseToken::new(1),
        "L2: the refused calls used no token"
    );
}

/// L3 with the decision "not found": lease calls on a job that never existed fail
/// with not found and create nothing.
pub async fn l3_calls_on_unknown_job_are_not_found(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let unknown = JobId::mint(env.clock.now());
    assert_all_not_found(&store, unknown, LeaseToken::new(1), "L3: an unknown job").await;
    assert_stats(
        &store,
        "q",
        QueueStats::default(),
        "L3: nothing was created",
    )
    .await;
}

/// L3 with the decision "not found": lease calls on a running job whose record vanished
/// fail with not found and recreate nothing; reclaim does not bring it back either.
pub async fn l3_calls_on_vanished_job_are_not_found(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "L3").await;
    let held = claim_expecting(&store, "q", id, "L3").await;
    env.vanish(id).await;
    assert_all_not_found(&store, id, held.token(), "L3: a vanished job").await;
    env.clock.advance(TTL + Duration::from_secs(1));
    store.reclaim(100).await.must("L3: reclaim");
    assert_all_not_found(&store, id, held.token(), "L3: after reclaim").await;
    assert_nothing_claimable(&store, &["q"], "L3: nothing was recreated").await;
}

/// L4: `complete` makes the job `succeeded`, stores the result bytes exactly (binary,
/// empty, or none), clears the lease and sets `finished_at` to now; the job is not
/// claimable again.
pub async fn l4_complete_stores_result_and_finishes(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let results: Vec<Option<Bytes>> = vec![
        Some(Bytes::from(binary(1_000, 9))),
        None,
        Some(Bytes::new()),
        Some(Bytes::from_static(b"\0")),
    ];
    for result in results {
        let id = enqueue(&store, NewJob::new("q"), "L4").await;
        let held = claim_expecting(&store, "q", id, "L4").await;
        env.clock.advance(Duration::from_secs(5));
        store
            .complete(id, held.token(), result.clone())
            .await
            .must("L4: complete");
        let mut expected = held.job.clone();
        expected.state = JobState::Succeeded;
        expected.result = result.clone();
        expected.lease = None;
        expected.finished_at = Some(env.clock.now());
        assert_eq!(
            get(&store, id, "L4").await,
            expected,
            "L4: complete makes the job succeeded with result {result:?}, lease cleared, finished now"
        );
        assert_nothing_claimable(&store, &["q"], "L4: a succeeded job").await;
    }
}

/// L4: a job that succeeds after failed attempts shows no error: `last_error` is
/// cleared by the completion, and the earlier attempts' errors are in its history (H2).
pub async fn l4_a_succeeded_job_shows_no_error_of_an_earlier_attempt(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(5), "L4").await;
    for error in ["first", "second"] {
        let held = claim_expecting(&store, "q", id, "L4").await;
        store
            .fail(id, held.token(), error, Retry::At(env.clock.now()))
            .await
            .must("L4: fail with a retry");
        assert_eq!(
            get(&store, id, "L4").await.last_error.as_deref(),
            Some(error),
            "L4: a job waiting to run again shows the error that sent it back (L6)"
        );
    }
    let held = claim_expecting(&store, "q", id, "L4").await;
    store
        .complete(id, held.token(), None)
        .await
        .must("L4: complete");
    let job = get(&store, id, "L4").await;
    assert_eq!(
        (job.state, job.last_error.as_deref()),
        (JobState::Succeeded, None),
        "L4: a succeeded job shows no error of an earlier attempt"
    );
    let errors: Vec<Option<String>> = store
        .attempts(id)
        .await
        .must("L4: attempts")
        .into_iter()
        .map(|a| a.error)
        .collect();
    assert_eq!(
        errors,
        [Some("first".to_owned()), Some("second".to_owned()), None],
        "L4: the earlier attempts' errors are in the history"
    );

    // The error of an expired lease, then a release (which takes its attempt back)
    // before the run that succeeds: still no error shown on the succeeded job.
    let other = enqueue(&store, NewJob::new("q").max_attempts(5), "L4").await;
    claim_expecting(&store, "q", other, "L4").await;
    env.clock.advance(TTL + Duration::from_secs(1));
    assert_eq!(store.reclaim(100).await.must("L4: reclaim").len(), 1);
    let held = claim_expecting(&store, "q", other, "L4").await;
    store.release(other, held.token()).await.must("L4: release");
    let held = claim_expecting(&store, "q", other, "L4").await;
    store
        .complete(other, held.token(), None)
        .await
        .must("L4: complete");
    let job = get(&store, other, "L4").await;
    assert_eq!(
        (job.state, job.last_error.as_deref()),
        (JobState::Succeeded, None),
        "L4: a job reclaimed, then released, then completed shows no error"
    );
}

/// L4: a result over `max_payload_bytes` is refused as too large and nothing changes;
/// a result of exactly the limit is stored.
pub async fn l4_oversized_result_is_refused_and_changes_nothing(harness: &dyn Harness) {
    const MAX: usize = 2_048;
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(MAX)).await;
    let id = enqueue(&store, NewJob::new("q"), "L4").await;
    let held = claim_expecting(&store, "q", id, "L4").await;
    let before = get(&store, id, "L4").await;
    expect_too_large(
        store
            .complete(id, held.token(), Some(Bytes::from(binary(MAX + 1, 0))))
            .await,
        "result",
        MAX + 1,
        MAX,
        "L4: a result one byte over the limit",
    );
    assert_unchanged(&store, &before, "L4: a refused result changes nothing").await;
    let exact = Bytes::from(binary(MAX, 0));
    store
        .complete(id, held.token(), Some(exact.clone()))
        .await
        .must("L4: a result of exactly the limit");
    assert_eq!(get(&store, id, "L4").await.result, Some(exact));
}

/// L4 through `complete_batch`: every entry completes its job exactly as `complete`
/// would (state, result, lease cleared, `finished_at` now), answered in order.
pub async fn l4_complete_batch_completes_each_entry(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let results: Vec<Option<Bytes>> = vec![
        Some(Bytes::from(binary(1_000, 3))),
        None,
        Some(Bytes::new()),
    ];
    let mut held = Vec::new();
    for _ in &results {
        let id = enqueue(&store, NewJob::new("q"), "L4 batch").await;
        held.push(claim_expecting(&store, "q", id, "L4 batch").await);
    }
    env.clock.advance(Duration::from_secs(5));
    let completions = held
        .iter()
        .zip(&results)
        .map(|(job, result)| Completion::new(job.id(), job.token(), result.clone()))
        .collect();
    let answers = store
        .complete_batch(completions)
        .await
        .must("L4: complete_batch");
    assert_eq!(answers.len(), results.len(), "L4: one answer per entry");
    for ((job, result), answer) in held.iter().zip(&results).zip(answers) {
        answer.must("L4: each entry of complete_batch");
        let mut expected = job.job.clone();
        expected.state = JobState::Succeeded;
        expected.result = result.clone();
        expected.lease = None;
        expected.finished_at = Some(env.clock.now());
        assert_eq!(
            get(&store, job.id(), "L4 batch").await,
            expected,
            "L4: complete_batch completes each job as complete would"
        );
    }
    assert_nothing_claimable(&store, &["q"], "L4: jobs completed in a batch").await;
    assert!(
        store
            .complete_batch(Vec::new())
            .await
            .must("L4: an empty complete_batch")
            .is_empty(),
        "L4: an empty complete_batch answers nothing"
    );
}

/// L2–L5 through `complete_batch`: an entry with a stale token is lease lost, one for an
/// unknown job not found, an oversized result too large, a second entry for a job
/// already completed earlier in the batch lease lost; none of them stops the others,
/// and the jobs they name are left as they were.
pub async fn l5_complete_batch_answers_each_entry_alone(harness: &dyn Harness) {
    const MAX: usize = 2_048;
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(MAX)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let id = enqueue(&store, NewJob::new("q"), "L5 batch").await;
        held.push(claim_expecting(&store, "q", id, "L5 batch").await);
    }
    let (done, oversized, released, after) = (&held[0], &held[1], &held[2], &held[3]);
    store
        .release(released.id(), released.token())
        .await
        .must("L5: release");
    let oversized_before = get(&store, oversized.id(), "L5 batch").await;
    let released_before = get(&store, released.id(), "L5 batch").await;
    let unknown = JobId::mint(env.clock.now());
    env.clock.advance(Duration::from_secs(5));
    let first = Bytes::from_static(b"first");
    let answers = store
        .complete_batch(vec![
            Completion::new(done.id(), done.token(), Some(first.clone())),
            Completion::new(
                oversized.id(),
                oversized.token(),
                Some(Bytes::from(binary(MAX + 1, 0))),
            ),
            Completion::new(released.id(), released.token(), None),
            Completion::new(unknown, LeaseToken::new(1), None),
            Completion::new(done.id(), done.token(), Some(Bytes::from_static(b"second"))),
            Completion::new(after.id(), after.token(), None),
        ])
        .await
        .must("L5: complete_batch");
    let mut answers = answers.into_iter();
    let mut next = || {
        answers
            .next()
            .expect("L5: complete_batch answers every entry")
    };
    next().must("L5: the first entry");
    expect_too_large(
        next(),
        "result",
        MAX + 1,
        MAX,
        "L5: an oversized result in a batch",
    );
    expect_lease_lost(next(), released.id(), "L5: a stale token in a batch");
    expect_not_found(next(), unknown, "L5: an unknown job in a batch");
    expect_lease_lost(
        next(),
        done.id(),
        "L5: a second completion in the same batch",
    );
    next().must("L5: an entry after refused ones");
    let stored = get(&store, done.id(), "L5 batch").await;
    assert_eq!(
        (stored.state, stored.result),
        (JobState::Succeeded, Some(first)),
        "L5: the first completion in the batch stands"
    );
    assert_unchanged(
        &store,
        &oversized_before,
        "L5: a refused result changes nothing",
    )
    .await;
    assert_unchanged(
        &store,
        &released_before,
        "L5: a stale token changes nothing",
    )
    .await;
    assert_eq!(
        get(&store, after.id(), "L5 batch").await.state,
        JobState::Succeeded,
        "L5: entries after refused ones complete"
    );
    store
        .complete(oversized.id(), oversized.token(), None)
        .await
        .must("L5: the job whose result was refused still holds its lease");
}

/// L5: a second `complete` with the same token fails with lease lost, and the first
/// outcome stands (result, `finished_at`); so do later heartbeats, failures, releases.
pub async fn l5_second_complete_is_lease_lost(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "L5").await;
    let held = claim_expecting(&store, "q", id, "L5").await;
    store
        .complete(id, held.token(), Some(Bytes::from_static(b"first")))
        .await
        .must("L5: complete");
    let before = get(&store, id, "L5").await;
    env.clock.advance(Duration::from_secs(10));
    expect_lease_lost(
        store
            .complete(id, held.token(), Some(Bytes::from_static(b"second")))
            .await,
        id,
        "L5: a second complete",
    );
    assert_unchanged(&store, &before, "L5: the first outcome stands").await;
    assert_all_lease_lost(&store, &before, held.token(), "L5: calls after complete").await;
}

/// L1 through `heartbeat_batch`: every entry extends its lease to now + ttl and answers
/// as `heartbeat` would (new expiry, cancel requested), in order; an empty batch
/// answers nothing; an invalid ttl fails the whole call.
pub async fn l1_heartbeat_batch_extends_each_lease(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let id = enqueue(&store, NewJob::new("q"), "L1 batch").await;
        held.push(claim_expecting(&store, "q", id, "L1 batch").await);
    }
    let cancelled = held[1].id();
    store
        .cancel(cancelled)
        .await
        .must("L1: cancel a running job");
    env.clock.advance(Duration::from_secs(7));
    let ttl = Duration::from_secs(45);
    let leases = held
        .iter()
        .map(|job| HeldLease::new(job.id(), job.token()))
        .collect();
    let answers = store
        .heartbeat_batch(leases, ttl)
        .await
        .must("L1: heartbeat_batch");
    assert_eq!(answers.len(), held.len(), "L1: one answer per entry");
    let expires_at = env.clock.now().saturating_add(ttl);
    for (job, answer) in held.iter().zip(answers) {
        let beat = answer.must("L1: each entry of heartbeat_batch");
        assert_eq!(
            beat,
            Heartbeat {
                cancel_requested: job.id() == cancelled,
                expires_at,
            },
            "L1: heartbeat_batch answers each entry as heartbeat would"
        );
        let stored = get(&store, job.id(), "L1 batch").await;
        assert_eq!(
            stored
                .lease
                .as_ref()
                .map(|lease| (lease.token, lease.expires_at)),
            Some((job.token(), expires_at)),
            "L1: heartbeat_batch extends each lease to now + ttl"
        );
        assert_eq!(
            stored.heartbeat_at,
            Some(env.clock.now()),
            "L1: heartbeat_batch records the heartbeat time"
        );
    }
    assert!(
        store
            .heartbeat_batch(Vec::new(), ttl)
            .await
            .must("L1: an empty heartbeat_batch")
            .is_empty(),
        "L1: an empty heartbeat_batch answers nothing"
    );
    let before = get(&store, held[0].id(), "L1 batch").await;
    expect_invalid(
        store
            .heartbeat_batch(
                vec![HeldLease::new(held[0].id(), held[0].token())],
                Duration::ZERO,
            )
            .await,
        "lease_ttl",
        "L1: heartbeat_batch with a zero ttl",
    );
    assert_unchanged(&store, &before, "L1: heartbeat_batch with a zero ttl").await;
}

/// L1–L3 through `heartbeat_batch`: an entry with a stale token is lease lost, one for
/// an unknown job not found, one for a finished job lease lost; none of them stops the
/// entries after it, and the jobs they name are left as they were.
pub async fn l1_heartbeat_batch_answers_each_entry_alone(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let id = enqueue(&store, NewJob::new("q"), "L1 batch").await;
        held.push(claim_expecting(&store, "q", id, "L1 batch").await);
    }
    let (first, released, completed, last) = (&held[0], &held[1], &held[2], &held[3]);
    store
        .release(released.id(), released.token())
        .await
        .must("L1: release");
    store
        .complete(completed.id(), completed.token(), None)
        .await
        .must("L1: complete");
    let released_before = get(&store, released.id(), "L1 batch").await;
    let completed_before = get(&store, completed.id(), "L1 batch").await;
    let unknown = JobId::mint(env.clock.now());
    env.clock.advance(Duration::from_secs(3));
    let answers = store
        .heartbeat_batch(
            vec![
                HeldLease::new(first.id(), first.token()),
                HeldLease::new(released.id(), released.token()),
                HeldLease::new(unknown, LeaseToken::new(1)),
                HeldLease::new(completed.id(), completed.token()),
                HeldLease::new(last.id(), last.token()),
            ],
            TTL,
        )
        .await
        .must("L1: heartbeat_batch");
    assert_eq!(answers.len(), 5, "L1: heartbeat_batch answers every entry");
    let mut answers = answers.into_iter();
    let expires_at = env.clock.now().saturating_add(TTL);
    let first_answer = answers.next().expect("five answers");
    assert_eq!(
        first_answer.must("L1: the first entry").expires_at,
        expires_at,
        "L1: a good entry before bad ones is extended"
    );
    expect_lease_lost(
        answers.next().expect("five answers"),
        released.id(),
        "L1: a released job's token in a batch",
    );
    expect_not_found(
        answers.next().expect("five answers"),
        unknown,
        "L1: an unknown job in a batch",
    );
    expect_lease_lost(
        answers.next().expect("five answers"),
        completed.id(),
        "L1: a completed job's token in a batch",
    );
    assert_eq!(
        answers
            .next()
            .expect("five answers")
            .must("L1: the last entry")
            .expires_at,
        expires_at,
        "L1: a good entry after bad ones is extended"
    );
    assert_unchanged(&store, &released_before, "L1: a stale entry in a batch").await;
    assert_unchanged(&store, &completed_before, "L1: a finished entry in a batch").await;
}
