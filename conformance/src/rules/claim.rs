//! Rules C1, C2 and C4–C6: what a claim takes and how it leaves the job (the order is in
//! `claim_order.rs`, what it never hands out in `claim_skips.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq_core::{
    Bytes, Clock, JobId, JobState, Lease, LeaseToken, NewJob, QueueStats, Retry, Store, Timestamp,
};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, assert_unchanged, claim, claim_expecting, enqueue,
    expect_invalid, get, join_all, request, Must, TTL, WORKER,
};
use crate::{Harness, TestEnv};

/// C1: a claim with nothing ready (empty queue, only scheduled jobs, unknown queue) is
/// an empty result, not an error; `limit = 0` claims nothing even with jobs ready.
pub async fn c1_nothing_ready_is_an_empty_claim(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_nothing_claimable(&store, &["empty"], "C1: an empty queue").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(60));
    enqueue(&store, NewJob::new("later").run_at(later), "C1").await;
    assert_nothing_claimable(&store, &["later", "never-used"], "C1: only scheduled jobs").await;
    let ready = enqueue(&store, NewJob::new("ready"), "C1").await;
    let before = get(&store, ready, "C1").await;
    let none = claim(&store, &["ready"], 0, "C1: limit 0").await;
    assert!(none.is_empty(), "C1: limit = 0 must claim nothing");
    assert_unchanged(&store, &before, "C1: limit = 0 must leave the job queued").await;
    claim_expecting(&store, "ready", ready, "C1: the job is still claimable").await;
}

/// C1: an empty queue list, or one naming a queue twice, is refused naming `queues`;
/// bad queue names, an empty
/// worker, a zero lease and a limit over 10,000 are refused naming their field; a
/// refused claim takes nothing.
pub async fn c1_invalid_claim_arguments_are_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q"), "C1").await;
    let before = get(&store, id, "C1").await;
    let cases = [
        ("queues", request(&[], WORKER, TTL, 1)),
        ("queue", request(&["q", "bad queue"], WORKER, TTL, 1)),
        ("queue", request(&["q", ""], WORKER, TTL, 1)),
        ("queues", request(&["q", "other", "q"], WORKER, TTL, 2)),
        ("worker", request(&["q"], "", TTL, 1)),
        ("worker", request(&["q"], &"w".repeat(257), TTL, 1)),
        ("lease_ttl", request(&["q"], WORKER, Duration::ZERO, 1)),
        ("limit", request(&["q"], WORKER, TTL, 10_001)),
    ];
    for (field, req) in cases {
        let what = format!("C1: claim with a bad {field} ({req:?})");
        expect_invalid(store.claim(req).await, field, &what);
        assert_unchanged(&store, &before, &what).await;
    }
    claim_expecting(&store, "q", id, "C1: the job is still claimable").await;
}

/// C1 for `wait_for_work`: the queues a claimer waits on are checked as a claim's are
/// (none, a bad name, a name given twice: refused, naming the field); a valid wait
/// returns by its timeout at the latest.
pub async fn c1_wait_for_work_refuses_what_claim_refuses(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let short = Duration::from_millis(1);
    let cases: [(&str, Vec<String>); 3] = [
        ("queues", Vec::new()),
        ("queue", vec!["q".to_owned(), "bad queue".to_owned()]),
        ("queues", vec!["q".to_owned(), "q".to_owned()]),
    ];
    for (field, queues) in cases {
        expect_invalid(
            store.wait_for_work(&queues, short).await,
            field,
            &format!("C1: wait_for_work on {queues:?}"),
        );
    }
    store
        .wait_for_work(&["q".to_owned()], short)
        .await
        .must("C1: a valid wait returns by its timeout");
}

/// C2: 8 claimers on their own connections drain 200 jobs; each job is claimed exactly
/// once, never by two claimers, and each holder's `complete` succeeds.
pub async fn c2_claim_once(harness: &dyn Harness) {
    const JOBS: usize = 200;
    const CLAIMERS: usize = 8;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let mut all = HashSet::new();
    for i in 0..JOBS {
        all.insert(enqueue(&seed, NewJob::new("race").payload(format!("{i}")), "C2").await);
    }
    let claimed: Arc<Mutex<HashMap<JobId, String>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let mut handles = Vec::new();
    for c in 0..CLAIMERS {
        let store = env.store().await;
        let claimed = Arc::clone(&claimed);
        let barrier = Arc::clone(&barrier);
        handles.push(tokio::spawn(async move {
            let worker = format!("claimer-{c}");
            let limit = 1 + c % 3;
            barrier.wait().await;
            let mut mine = 0usize;
            loop {
                let batch = store
                    .claim(request(&["race"], &worker, TTL, limit))
                    .await
                    .must("C2: claim");
                assert!(
                    batch.len() <= limit,
                    "C2: a claim returned more than its limit"
                );
                if batch.is_empty() {
                    return mine;
                }
                for job in batch {
                    {
                        let mut seen = claimed.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(other) = seen.insert(job.id(), worker.clone()) {
                            panic!(
                                "C2: job {} was handed to {other} and again to {worker}",
                                job.id()
                            );
                        }
                    }
                    assert_eq!(job.job.state, JobState::Running, "C2: a claimed job runs");
                    assert_eq!(job.job.attempts, 1, "C2: a job claimed once has 1 attempt");
                    store
                        .complete(job.id(), job.token(), None)
                        .await
                        .must("C2: the holder's complete");
                    mine += 1;
                }
            }
        }));
    }
    let counts = join_all(handles).await;
    let total: usize = counts.iter().sum();
    let claimed: HashSet<JobId> = claimed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .keys()
        .copied()
        .collect();
    assert_eq!(
        total, JOBS,
        "C2: {JOBS} jobs must be claimed {JOBS} times in all"
    );
    assert_eq!(claimed, all, "C2: every job must be claimed");
    assert_nothing_claimable(&seed, &["race"], "C2: drained").await;
    assert_stats(
        &seed,
        "race",
        QueueStats {
            succeeded: JOBS as u64,
            ..QueueStats::default()
        },
        "C2: every job succeeded once",
    )
    .await;
}

/// C2 with requeues: 8 claimers on 100 jobs, each job released by its first holder and
/// completed by its second. No job is ever held by two claimers at once, tokens of a
/// job strictly increase, and every holder's call succeeds.
pub async fn c2_claim_once_with_releases(harness: &dyn Harness) {
    const JOBS: usize = 100;
    const CLAIMERS: usize = 8;
    #[derive(Default)]
    struct Ledger {
        held: HashSet<JobId>,
        tokens: HashMap<JobId, Vec<LeaseToken>>,
    }
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    for _ in 0..JOBS {
        enqueue(&seed, NewJob::new("race"), "C2").await;
    }
    let ledger: Arc<Mutex<Ledger>> = Arc::default();

    /// Takes one claimed job: records it, then releases it on its first claim and
    /// completes it on its second. Returns false when nothing was claimed.
    async fn step(store: &Store, ledger: &Mutex<Ledger>, worker: &str) -> bool {
        let batch = store
            .claim(request(&["race"], worker, TTL, 2))
            .await
            .must("C2: claim");
        if batch.is_empty() {
            return false;
        }
        for job in batch {
            let id = job.id();
            let claims = {
                let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
                assert!(
                    ledger.held.insert(id),
                    "C2: job {id} was handed to {worker} while another claimer held it"
                );
                let tokens = ledger.tokens.entry(id).or_default();
                if let Some(last) = tokens.last() {
                    assert!(
                        job.token() > *last,
                        "C2: job {id} was claimed again with token {} not above {last}",
                        job.token()
                    );
                }
                tokens.push(job.token());
                tokens.len()
            };
            // Leave the ledger before the call that gives the job up, so the ledger's
            // holding intervals lie inside the store's.
            ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .held
                .remove(&id);
            if claims == 1 {
                store
                    .release(id, job.token())
                    .await
                    .must("C2: the holder's release");
            } else {
                store
                    .complete(id, job.token(), None)
                    .await
                    .must("C2: the holder's complete");
            }
        }
        true
    }

    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let mut handles = Vec::new();
    for c in 0..CLAIMERS {
        let store = env.store().await;
        let ledger = Arc::clone(&ledger);
        let barrier = Arc::clone(&barrier);
        handles.push(tokio::spawn(async move {
            let worker = format!("claimer-{c}");
            barrier.wait().await;
            while step(&store, &ledger, &worker).await {}
        }));
    }
    join_all(handles).await;
    // A job released after every claimer saw an empty queue is still waiting.
    while step(&seed, &ledger, "finisher").await {}

    {
        let ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(ledger.tokens.len(), JOBS, "C2: every job was claimed");
        for (id, tokens) in &ledger.tokens {
            assert_eq!(
                tokens.len(),
                2,
                "C2: job {id} must be claimed exactly twice (once, released, once more)"
            );
        }
    }
    assert_stats(
        &seed,
        "race",
        QueueStats {
            succeeded: JOBS as u64,
            ..QueueStats::default()
        },
        "C2: all done",
    )
    .await;
}

/// C4: a claim on some queues never returns a job of another queue, even one whose
/// name shares a prefix, differs in case, or joins two names with a separator.
pub async fn c4_claim_never_crosses_queues(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let queues = ["a", "A", "ab", "a.b", "a:b", "a-b", "a_b", "b", "a:"];
    let mut by_queue: HashMap<&str, Vec<JobId>> = HashMap::new();
    for round in 0..3i16 {
        for queue in queues {
            let id = enqueue(&store, NewJob::new(queue).priority(round), "C4").await;
            by_queue.entry(queue).or_default().push(id);
        }
    }
    for queue in queues {
        let claimed = claim(&store, &[queue], 100, "C4: claim").await;
        let got: HashSet<JobId> = claimed.iter().map(|j| j.id()).collect();
        let want: HashSet<JobId> = by_queue[queue].iter().copied().collect();
        assert_eq!(
            got, want,
            "C4: a claim on {queue:?} must return exactly that queue's jobs"
        );
        for job in &claimed {
            assert_eq!(job.job.queue, queue, "C4: claimed job's queue");
        }
        for other in queues.iter().filter(|q| **q != queue) {
            let stats = store.stats(other).await.must("C4: stats");
            assert_eq!(
                stats.running, 0,
                "C4: claiming {queue:?} must not touch {other:?}"
            );
        }
        // Put them back out of the way.
        for job in claimed {
            store
                .complete(job.id(), job.token(), None)
                .await
                .must("C4: complete");
        }
    }
}

/// C5: a job whose `run_at` is in the future is not claimed until the clock reaches it
/// (ready when `run_at <= now`): not 1 ms before, yes at that instant.
pub async fn c5_future_run_at_is_not_claimed_early(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let at = env.clock.now().saturating_add(Duration::from_secs(10));
    let id = enqueue(&store, NewJob::new("q").run_at(at), "C5").await;
    assert_nothing_claimable(&store, &["q"], "C5: scheduled").await;
    assert_stats(
        &store,
        "q",
        QueueStats {
            scheduled: 1,
            ..QueueStats::default()
        },
        "C5: scheduled",
    )
    .await;
    env.clock.advance(Duration::from_millis(9_999));
    assert_nothing_claimable(&store, &["q"], "C5: 1 ms before run_at").await;
    env.clock.advance(Duration::from_millis(1));
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 1,
            ..QueueStats::default()
        },
        "C5: ready at run_at",
    )
    .await;
    claim_expecting(
        &store,
        "q",
        id,
        "C5: claimable when the clock reaches run_at",
    )
    .await;
    let past = enqueue(
        &store,
        NewJob::new("q").run_at(Timestamp::from_millis(0)),
        "C5",
    )
    .await;
    claim_expecting(&store, "q", past, "C5: a run_at in the past is ready now").await;
}

/// C5 with a relative delay: `NewJob::delay` counts from the enqueue, on the store's
/// clock, and is stored as `run_at`; the job is not claimed a millisecond early.
pub async fn c5_delay_counts_from_the_enqueue(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    env.clock.advance(Duration::from_secs(5));
    let enqueued_at = env.clock.now();
    let id = enqueue(
        &store,
        NewJob::new("later").delay(Duration::from_secs(90)),
        "C5",
    )
    .await;
    let due = enqueued_at.saturating_add(Duration::from_secs(90));
    assert_eq!(
        get(&store, id, "C5").await.run_at,
        due,
        "C5: a delay is stored as run_at = enqueue time + delay"
    );
    env.clock.set(due.saturating_sub(Duration::from_millis(1)));
    assert_nothing_claimable(
        &store,
        &["later"],
        "C5: a millisecond before the delay ends",
    )
    .await;
    env.clock.set(due);
    claim_expecting(&store, "later", id, "C5: when the delay ends").await;
}

/// C6: a claimed job is `running` with `attempts + 1`, `started_at` = `heartbeat_at` =
/// now, lease (worker, fresh token, now + ttl), the payload handed out, every other
/// field untouched; `get` shows exactly the returned job.
pub async fn c6_claim_sets_running_lease_and_persists_it(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(
        &store,
        NewJob::new("q")
            .payload(&b"\0payload"[..])
            .tenant("t")
            .idempotency_key("k")
            .priority(3)
            .max_attempts(4),
        "C6",
    )
    .await;
    let before = get(&store, id, "C6").await;
    env.clock.advance(Duration::from_secs(7));
    let now = env.clock.now();
    let ttl = Duration::from_millis(12_345);
    let claimed = store
        .claim(request(&["q"], "worker-ä", ttl, 1))
        .await
        .must("C6: claim");
    assert_eq!(claimed.len(), 1, "C6: one job claimed");
    let claimed = &claimed[0];
    let mut expected = before.clone();
    expected.state = JobState::Running;
    expected.attempts = 1;
    expected.started_at = Some(now);
    expected.heartbeat_at = Some(now);
    expected.lease = Some(Lease {
        worker: "worker-ä".to_owned(),
        token: claimed.token(),
        expires_at: now.saturating_add(ttl),
    });
    assert_eq!(
        claimed.job, expected,
        "C6: the claim must return the job running, attempts + 1, started and leased now"
    );
    assert_eq!(
        claimed.payload,
        Bytes::from_static(b"\0payload"),
        "C6: the claim hands out the payload"
    );
    assert_eq!(
        get(&store, id, "C6").await,
        expected,
        "C6: get must show the claim as persisted"
    );

    // A second claim after a failure: attempts 2, a greater token, new times.
    store
        .fail(id, claimed.token(), "boom", Retry::At(now))
        .await
        .must("C6: fail");
    env.clock.advance(Duration::from_secs(3));
    let second = claim_expecting(&store, "q", id, "C6: claim again").await;
    assert_eq!(second.job.attempts, 2, "C6: every claim adds an attempt");
    assert!(
        second.token() > claimed.token(),
        "C6: a new claim's token must exceed every earlier token"
    );
    assert_eq!(second.job.started_at, Some(env.clock.now()));
    assert_eq!(second.job.heartbeat_at, Some(env.clock.now()));
    assert_eq!(get(&store, id, "C6").await, second.job);
}

/// C6 with the decision "the token is a per-job counter": the first claim gets token
/// 1 and every later claim one more, through release, failure, reclaim and operator
/// retry (which does not reset it); tokens of other jobs do not interfere.
pub async fn c6_token_is_a_per_job_counter(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(3), "C6").await;
    let other = enqueue(&store, NewJob::new("other"), "C6").await;
    let mut expect = 1;
    let mut next = |what: &str, held: &durq_core::ClaimedJob| {
        assert_eq!(
            held.token(),
            LeaseToken::new(expect),
            "C6: claim #{expect} of a job must carry token {expect} ({what})"
        );
        expect += 1;
    };
    let held = claim_expecting(&store, "q", id, "C6").await;
    next("first claim", &held);
    let o = claim_expecting(&store, "other", other, "C6").await;
    assert_eq!(o.token(), LeaseToken::new(1), "C6: tokens are per job");
    store.release(id, held.token()).await.must("C6: release");
    let held = claim_expecting(&store, "q", id, "C6").await;
    next("after release", &held);
    store
        .fail(id, held.token(), "x", Retry::At(env.clock.now()))
        .await
        .must("C6: fail");
    let held = claim_expecting(&store, "q", id, "C6").await;
    next("after fail with retry", &held);
    env.clock.advance(TTL + Duration::from_millis(1));
    store.reclaim(10).await.must("C6: reclaim");
    let held = claim_expecting(&store, "q", id, "C6").await;
    next("after reclaim", &held);
    store
        .fail(id, held.token(), "x", Retry::Never)
        .await
        .must("C6: fail for good");
    store.retry(id).await.must("C6: operator retry");
    let held = claim_expecting(&store, "q", id, "C6").await;
    next("after operator retry", &held);
    assert_eq!(
        held.job.attempts, 1,
        "C6: operator retry reset attempts, the claim counted one"
    );
}
