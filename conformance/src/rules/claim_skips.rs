//! Rules C7–C10: what a claim never hands out: vanished records, another namespace's
//! jobs, cancelled jobs, and records it cannot read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{Bytes, Clock, JobId, JobState, LeaseToken, NewJob, QueueStats};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, assert_stats_agree, claim, claim_expecting, drain,
    enqueue, expect_not_found, get, ids_of, join_all, list_all, request, Must, Together, TTL,
};
use crate::{Harness, TestEnv};

/// C7: index entries whose records vanished are skipped and removed; the live jobs
/// behind them are claimed in the same call (vanished entries do not use up the
/// limit); no blank or partial record appears; `get`/`payload` of the vanished ids stay
/// not found.
pub async fn c7_vanished_records_are_skipped_and_live_jobs_claimed(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "C7").await;
    let gone_first = together
        .enqueue(&store, NewJob::new("q").priority(5), "C7")
        .await;
    let gone_second = together.enqueue(&store, NewJob::new("q"), "C7").await;
    let live_a = together
        .enqueue(&store, NewJob::new("q").payload("a"), "C7")
        .await;
    let gone_third = together.enqueue(&store, NewJob::new("q"), "C7").await;
    let live_b = together
        .enqueue(&store, NewJob::new("q").payload("b"), "C7")
        .await;
    let live_c = together
        .enqueue(&store, NewJob::new("q").payload("c"), "C7")
        .await;
    let gone = [gone_first, gone_second, gone_third];
    for id in gone {
        env.vanish(id).await;
    }
    let first = claim(&store, &["q"], 1, "C7: claim one").await;
    assert_eq!(
        ids_of(&first),
        vec![live_a],
        "C7: vanished entries ahead of a live job are skipped, the live job is claimed"
    );
    assert_eq!(first[0].payload, Bytes::from_static(b"a"));
    let rest = claim(&store, &["q"], 2, "C7: claim two").await;
    assert_eq!(
        ids_of(&rest),
        vec![live_b, live_c],
        "C7: vanished entries do not use up the claim's limit"
    );
    assert_nothing_claimable(&store, &["q"], "C7: drained").await;
    for id in gone {
        expect_not_found(store.get(id).await, id, "C7: get of a vanished job");
        expect_not_found(store.payload(id).await, id, "C7: payload of a vanished job");
    }
    let listed: Vec<JobId> = list_all(&store, "q", None, "C7")
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        listed,
        vec![live_c, live_b, live_a],
        "C7: no blank record of a vanished job is listed"
    );
    assert_stats(
        &store,
        "q",
        QueueStats {
            running: 3,
            ..QueueStats::default()
        },
        "C7: only the live jobs count",
    )
    .await;
}

/// C7: a queue holding only entries of vanished records (ready and scheduled) drains
/// to an empty claim, creates nothing, and serves a new job afterwards.
pub async fn c7_queue_of_only_vanished_entries_drains_to_empty(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let later = env.clock.now().saturating_add(Duration::from_secs(5));
    let mut gone = Vec::new();
    for i in 0..6 {
        let job = if i % 2 == 0 {
            NewJob::new("q")
        } else {
            NewJob::new("q").run_at(later)
        };
        gone.push(enqueue(&store, job, "C7").await);
    }
    for id in &gone {
        env.vanish(*id).await;
    }
    assert_nothing_claimable(&store, &["q"], "C7: only vanished ready entries").await;
    env.clock.advance(Duration::from_secs(5));
    assert_nothing_claimable(&store, &["q"], "C7: only vanished entries, all due").await;
    for id in &gone {
        expect_not_found(store.get(*id).await, *id, "C7: no record is recreated");
    }
    assert!(
        list_all(&store, "q", None, "C7").await.is_empty(),
        "C7: nothing is listed"
    );
    assert_stats(&store, "q", QueueStats::default(), "C7: nothing counts").await;
    let fresh = enqueue(&store, NewJob::new("q"), "C7").await;
    claim_expecting(&store, "q", fresh, "C7: a new job is served").await;
}

/// C8: two stores with different namespaces on one server never see each other's
/// jobs, keys, counts, leases or retention, even when one namespace is a prefix of
/// the other.
pub async fn c8_namespaces_are_isolated(harness: &dyn Harness) {
    let one = TestEnv::new(harness);
    let mut two = TestEnv::new(harness);
    // A namespace that extends the first one: naive key prefixes would overlap.
    two.settings.namespace = format!("{}:q", one.settings.namespace);
    two.clock.set(one.clock.now());
    let s1 = one.store().await;
    let s2 = two.store().await;
    let a = enqueue(
        &s1,
        NewJob::new("q")
            .tenant("t")
            .idempotency_key("k")
            .payload("one"),
        "C8",
    )
    .await;
    let b = s2
        .enqueue(
            NewJob::new("q")
                .tenant("t")
                .idempotency_key("k")
                .payload("two"),
        )
        .await
        .must("C8: enqueue in the second namespace");
    assert!(
        b.created && b.id != a,
        "C8: the same key in another namespace is another job"
    );
    expect_not_found(s2.get(a).await, a, "C8: get across namespaces");
    expect_not_found(s2.payload(a).await, a, "C8: payload across namespaces");
    expect_not_found(s1.get(b.id).await, b.id, "C8: get across namespaces");
    let only_one = QueueStats {
        ready: 1,
        ..QueueStats::default()
    };
    assert_stats(&s1, "q", only_one, "C8: counts stay per namespace").await;
    assert_stats(&s2, "q", only_one, "C8: counts stay per namespace").await;
    let listed = list_all(&s2, "q", None, "C8").await;
    assert_eq!(listed.len(), 1, "C8: list stays per namespace");
    assert_eq!(listed[0].id, b.id);

    let held = claim(&s2, &["q"], 10, "C8: claim").await;
    assert_eq!(ids_of(&held), vec![b.id], "C8: claims stay per namespace");
    expect_not_found(
        s1.complete(b.id, held[0].token(), None).await,
        b.id,
        "C8: a lease call across namespaces",
    );
    let held_one = claim(&s1, &["q"], 10, "C8: claim").await;
    assert_eq!(ids_of(&held_one), vec![a]);
    assert_eq!(held_one[0].payload, Bytes::from_static(b"one"));

    // Leases expire in both; each reclaim takes only its own.
    one.clock.advance(TTL + Duration::from_millis(1));
    two.clock.advance(TTL + Duration::from_millis(1));
    let r2 = s2.reclaim(100).await.must("C8: reclaim");
    assert_eq!(
        r2.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![b.id],
        "C8: reclaim stays per namespace"
    );
    assert_eq!(
        get(&s1, a, "C8").await.state,
        JobState::Running,
        "C8: another namespace's reclaim leaves this job running"
    );
    s1.complete(a, held_one[0].token(), None)
        .await
        .must("C8: complete");

    // Retention: the second namespace's purge leaves the first's terminal job.
    let long = Duration::from_secs(30 * 86_400);
    one.clock.advance(long);
    two.clock.advance(long);
    assert_eq!(
        s2.purge(100).await.must("C8: purge"),
        0,
        "C8: nothing of its own to purge"
    );
    get(&s1, a, "C8: purge stays per namespace").await;
    assert_eq!(s1.purge(100).await.must("C8: purge"), 1);

    let third = TestEnv::new(harness);
    let mut shorter = TestEnv::new(harness);
    shorter.settings.namespace = format!("{}x", third.settings.namespace);
    let s3 = third.store().await;
    let s4 = shorter.store().await;
    enqueue(&s4, NewJob::new("q"), "C8").await;
    assert_stats(
        &s3,
        "q",
        QueueStats::default(),
        "C8: a namespace that is a prefix of another",
    )
    .await;
    assert_nothing_claimable(&s3, &["q"], "C8: prefix namespaces").await;
}

/// C9: cancelled jobs are never claimed: cancelled while ready, while scheduled, or
/// while running (and then released or reclaimed).
pub async fn c9_cancelled_jobs_are_never_claimed(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "C9").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(5));
    let ready = together
        .enqueue(&store, NewJob::new("q").priority(9), "C9")
        .await;
    let scheduled = together
        .enqueue(&store, NewJob::new("q").run_at(later).priority(9), "C9")
        .await;
    let released = together
        .enqueue(&store, NewJob::new("q").priority(8), "C9")
        .await;
    let reclaimed = together
        .enqueue(&store, NewJob::new("q").priority(8), "C9")
        .await;
    let keep = together.enqueue(&store, NewJob::new("q"), "C9").await;
    for id in [ready, scheduled] {
        assert_eq!(
            store.cancel(id).await.must("C9: cancel"),
            JobState::Cancelled
        );
    }
    let held = claim(&store, &["q"], 2, "C9: claim").await;
    assert_eq!(
        ids_of(&held),
        vec![released, reclaimed],
        "C9: cancelled jobs are skipped"
    );
    for job in &held {
        assert_eq!(store.cancel(job.id()).await.must("C9"), JobState::Running);
    }
    store
        .release(released, held[0].token())
        .await
        .must("C9: release after cancel");
    env.clock.advance(Duration::from_secs(60));
    store.reclaim(10).await.must("C9: reclaim");
    let claimed = drain(&store, &["q"], "C9: drain").await;
    assert_eq!(
        ids_of(&claimed),
        vec![keep],
        "C9: no cancelled job is ever claimed"
    );
    for id in [ready, scheduled, released, reclaimed] {
        assert_eq!(
            get(&store, id, "C9").await.state,
            JobState::Cancelled,
            "C9: the job stays cancelled"
        );
    }
    assert_stats_agree(&store, "q", "C9").await;
}

/// C9 under concurrency: one canceller cancels 60 ready jobs while three claimers on
/// their own connections drain the queue. Each job ends exactly one way: cancelled
/// (cancel said `Cancelled`, and no claimer got it) or claimed once with
/// cancellation requested (cancel said `Running`, and the holder's heartbeat reports
/// it).
pub async fn c9_cancel_racing_claim_has_one_winner(harness: &dyn Harness) {
    const JOBS: usize = 60;
    const CLAIMERS: usize = 3;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..JOBS {
        ids.push(enqueue(&seed, NewJob::new("q"), "C9").await);
    }
    let barrier = Arc::new(Barrier::new(CLAIMERS + 1));
    let mut claimers = Vec::new();
    for c in 0..CLAIMERS {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        claimers.push(tokio::spawn(async move {
            let worker = format!("claimer-{c}");
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let batch = store
                    .claim(request(&["q"], &worker, TTL, 3))
                    .await
                    .must("C9: claim");
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.iter().map(|job| (job.id(), job.token())));
            }
        }));
    }
    let canceller = {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        // Newest first, so the canceller and the claimers meet in the middle.
        let order: Vec<JobId> = ids.iter().rev().copied().collect();
        tokio::spawn(async move {
            barrier.wait().await;
            let mut answers = HashMap::new();
            for id in order {
                answers.insert(id, store.cancel(id).await.must("C9: cancel"));
            }
            answers
        })
    };
    let mut claimed: HashMap<JobId, LeaseToken> = HashMap::new();
    for (id, token) in join_all(claimers).await.into_iter().flatten() {
        assert!(
            claimed.insert(id, token).is_none(),
            "C9: job {id} was claimed twice"
        );
    }
    let answers = join_all(vec![canceller]).await.remove(0);
    for id in &ids {
        let job = get(&seed, *id, "C9").await;
        match (answers[id], claimed.get(id)) {
            (JobState::Cancelled, None) => assert_eq!(
                job.state,
                JobState::Cancelled,
                "C9: a job whose cancel won stays cancelled"
            ),
            (JobState::Cancelled, Some(_)) => panic!(
                "C9: job {id} was claimed although its cancel reported it cancelled"
            ),
            (JobState::Running, Some(token)) => {
                assert!(
                    job.state == JobState::Running && job.cancel_requested,
                    "C9: a job claimed before its cancel runs with cancellation requested, got {job:?}"
                );
                let beat = seed
                    .heartbeat(*id, *token, TTL)
                    .await
                    .must("C9: the holder's heartbeat");
                assert!(beat.cancel_requested, "C9: the holder learns of the cancel");
            }
            (state, holder) => panic!(
                "C9: cancel of job {id} answered {state} with holder {holder:?}: each job must be either cancelled unclaimed or claimed and cancel-requested"
            ),
        }
    }
    assert_nothing_claimable(&seed, &["q"], "C9: nothing left").await;
}

/// C10: a claim that meets a record it cannot read buries that job (`dead`, its error
/// saying why) and goes on with the jobs behind it: the claim answers the readable
/// jobs, no job is left leased to nobody, and the buried job is never handed out.
pub async fn c10_a_corrupt_record_is_buried_and_the_claim_goes_on(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "C10").await;
    let first = together
        .enqueue(&store, NewJob::new("q").payload("a"), "C10")
        .await;
    let unreadable = together.enqueue(&store, NewJob::new("q"), "C10").await;
    let last = together
        .enqueue(&store, NewJob::new("q").payload("c"), "C10")
        .await;
    if !env.corrupt(unreadable).await {
        eprintln!("C10 skipped: this harness cannot make a stored record unreadable");
        return;
    }
    // A backend may fill a claim's limit before it finds out a record is unreadable, so
    // the readable jobs may take more than one claim; none of them may fail.
    let mut claimed = Vec::new();
    for round in 0..3 {
        let got = claim(&store, &["q"], 10, &format!("C10: claim {round}")).await;
        if got.is_empty() {
            break;
        }
        claimed.extend(got);
    }
    assert_eq!(
        ids_of(&claimed),
        vec![first, last],
        "C10: the readable jobs are claimed, in order, and the unreadable one is not"
    );
    assert_eq!(claimed[1].payload, Bytes::from_static(b"c"));
    assert_nothing_claimable(&store, &["q"], "C10: the buried job is never claimed").await;
    assert_stats(
        &store,
        "q",
        QueueStats {
            running: 2,
            dead: 1,
            ..QueueStats::default()
        },
        "C10: the unreadable job counts dead, not running or ready",
    )
    .await;
    // Reading the buried job back may fail on the field that is unreadable; if it
    // reads, it is dead, leased to nobody, and says why.
    match store.get(unreadable).await {
        Err(durq_core::Error::Corrupt { .. }) => {}
        Ok(job) => {
            assert_eq!(
                job.state,
                JobState::Dead,
                "C10: the unreadable job is buried"
            );
            assert!(job.lease.is_none(), "C10: a buried job holds no lease");
            let error = job.last_error.unwrap_or_default();
            assert!(
                error.starts_with("corrupt record"),
                "C10: the buried job's error says why: {error:?}"
            );
        }
        Err(other) => panic!("C10: get of the buried job failed with {other:?}"),
    }
    // Nothing expires into a second run: past every lease, reclaim takes back the two
    // claimed jobs and nothing else.
    env.clock.advance(TTL + Duration::from_secs(1));
    let reclaimed = store.reclaim(10).await.must("C10: reclaim");
    let mut back: Vec<JobId> = reclaimed.iter().map(|r| r.id).collect();
    back.sort_unstable();
    let mut expected = vec![first, last];
    expected.sort_unstable();
    assert_eq!(back, expected, "C10: only the claimed jobs were leased");
}
