//! Rules C1–C9: claim.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq_core::{
    Bytes, Clock, JobId, JobState, Lease, LeaseToken, NewJob, QueueStats, Retry, Store, Timestamp,
};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, assert_stats_agree, assert_unchanged, claim,
    claim_expecting, drain, enqueue, expect_invalid, expect_not_found, get, ids_of, join_all,
    list_all, request, Must, TTL, WORKER,
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

/// C3: claim order is priority descending, then the time the job became ready
/// ascending (a scheduled job's `run_at`, not its enqueue time), then enqueue order;
/// claims of one job at a time and of all at once give that same order.
pub async fn c3_claim_order_priority_then_ready_time_then_fifo(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let t0 = env.clock.now();
    let at = |secs: i64| Timestamp::from_millis(t0.as_millis() + secs * 1_000);
    // (priority, ready at) in enqueue order; the clock moves between some enqueues.
    let plan: Vec<(i16, Option<Timestamp>, u64)> = vec![
        (0, Some(at(10)), 0), // scheduled: ready at t0+10
        (0, None, 0),         // ready at t0
        (0, None, 0),         // ready at t0, after the previous one
        (5, None, 0),         // higher priority
        (-3, None, 0),        // lower priority
        (i16::MAX, Some(at(30)), 0),
        (i16::MIN, None, 0),
        (0, Some(at(-60)), 0), // ready a minute before t0
        (5, Some(at(-1)), 0),
        (0, None, 5),         // enqueued at t0+5, ready then
        (0, Some(at(10)), 0), // same ready time as the first, enqueued later
        (-3, None, 0),
        (0, None, 20), // enqueued at t0+25, after the t0+10 jobs became ready
        (5, None, 0),
    ];
    let mut expected: Vec<(i16, Timestamp, usize, JobId)> = Vec::new();
    let mut again = Vec::new();
    for (index, (priority, run_at, advance)) in plan.iter().enumerate() {
        env.clock.advance(Duration::from_secs(*advance));
        let now = env.clock.now();
        let mut job = NewJob::new("order").priority(*priority);
        if let Some(run_at) = run_at {
            job = job.run_at(*run_at);
        }
        let id = enqueue(&store, job, "C3").await;
        expected.push((*priority, run_at.unwrap_or(now), index, id));
        again.push((*priority, run_at.unwrap_or(now)));
    }
    env.clock.set(at(40));
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let expected: Vec<JobId> = expected.iter().map(|e| e.3).collect();

    let mut one_by_one = Vec::new();
    loop {
        let batch = claim(&store, &["order"], 1, "C3: claim one").await;
        match batch.as_slice() {
            [] => break,
            [job] => {
                one_by_one.push(job.id());
                store
                    .complete(job.id(), job.token(), None)
                    .await
                    .must("C3: complete");
            }
            more => panic!("C3: a claim of limit 1 returned {} jobs", more.len()),
        }
    }
    assert_eq!(
        one_by_one, expected,
        "C3: jobs must be claimed by priority desc, then ready time asc, then enqueue order"
    );

    // The same jobs once more, claimed in one call.
    let mut ids_again = Vec::new();
    for (index, (priority, run_at)) in again.iter().enumerate() {
        let id = enqueue(
            &store,
            NewJob::new("order-2").priority(*priority).run_at(*run_at),
            "C3",
        )
        .await;
        ids_again.push((*priority, *run_at, index, id));
    }
    ids_again.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let expected_again: Vec<JobId> = ids_again.iter().map(|e| e.3).collect();
    let all = claim(&store, &["order-2"], 100, "C3: claim all").await;
    assert_eq!(
        ids_of(&all),
        expected_again,
        "C3: a claim of many returns them in claim order"
    );
}

/// C3: 300 jobs enqueued one after another at one clock instant are claimed first in,
/// first out, across claims of varying limits.
pub async fn c3_fifo_at_one_instant(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..300 {
        ids.push(enqueue(&store, NewJob::new("fifo").payload(format!("{i}")), "C3").await);
    }
    let mut claimed = Vec::new();
    let mut limit = 1;
    loop {
        let batch = claim(&store, &["fifo"], limit, "C3: claim").await;
        if batch.is_empty() {
            break;
        }
        assert!(
            batch.len() == limit || claimed.len() + batch.len() == ids.len(),
            "C3: a claim with {limit} of {} jobs ready returned {}",
            ids.len() - claimed.len(),
            batch.len()
        );
        claimed.extend(ids_of(&batch));
        limit = limit % 13 + 1;
    }
    assert_eq!(
        claimed, ids,
        "C3: jobs enqueued at one instant must be claimed in enqueue order"
    );
}

/// C3 across handles: the enqueue sequence belongs to the store, not to a handle, so
/// jobs enqueued at one instant through a first handle, a second one and a reopened
/// one are claimed in enqueue order.
pub async fn c3_fifo_holds_across_handles(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let first = env.store().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(enqueue(&first, NewJob::new("fifo").payload(format!("a{i}")), "C3").await);
    }
    let second = env.store().await;
    for i in 0..3 {
        ids.push(enqueue(&second, NewJob::new("fifo").payload(format!("b{i}")), "C3").await);
    }
    ids.push(enqueue(&first, NewJob::new("fifo").payload("a3"), "C3").await);
    drop(second);
    let reopened = env.store().await;
    ids.push(enqueue(&reopened, NewJob::new("fifo").payload("c0"), "C3").await);
    let claimed = ids_of(&claim(&first, &["fifo"], 100, "C3: claim").await);
    assert_eq!(
        claimed, ids,
        "C3: jobs enqueued at one instant through several handles must be claimed in enqueue order"
    );
}

/// C3: the order spans every queue named in one claim, whatever order the queues are
/// named in, and is applied to the whole ready set before cutting to `limit`.
pub async fn c3_order_spans_queues_and_is_applied_before_limit(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Many older low-priority jobs, then one urgent job last.
    let mut low = Vec::new();
    for i in 0..60 {
        let queue = if i % 2 == 0 { "a" } else { "b" };
        low.push(enqueue(&store, NewJob::new(queue), "C3").await);
    }
    let urgent = enqueue(&store, NewJob::new("b").priority(1), "C3").await;
    let head = claim(&store, &["a", "b"], 1, "C3: claim one").await;
    assert_eq!(
        ids_of(&head),
        vec![urgent],
        "C3: the order applies to the whole ready set: the one higher-priority job comes first"
    );
    // FIFO across queues, whatever order they are named in.
    let two = claim(&store, &["b", "a"], 2, "C3: claim two").await;
    assert_eq!(
        ids_of(&two),
        low[..2].to_vec(),
        "C3: the order spans the queues of one claim (FIFO across a and b)"
    );
    let five = claim(&store, &["a", "b", "c"], 5, "C3: claim five").await;
    assert_eq!(ids_of(&five), low[2..7].to_vec(), "C3: order across queues");
    // A late urgent job on one queue overtakes earlier jobs of another.
    let late = enqueue(&store, NewJob::new("a").priority(2), "C3").await;
    let next = claim(&store, &["b", "a"], 3, "C3: claim three").await;
    assert_eq!(
        ids_of(&next),
        vec![late, low[7], low[8]],
        "C3: the claim is cut to its limit after ordering every named queue"
    );
}

/// C3 with the decision on `seq`: a job requeued by release, failure with retry or
/// operator retry goes behind every job already ready at the same instant and
/// priority; reclaim is checked by R1.
pub async fn c3_requeued_job_goes_behind_ready_jobs(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let a = enqueue(&store, NewJob::new("q").max_attempts(1), "C3").await;
    let b = enqueue(&store, NewJob::new("q"), "C3").await;
    let c = enqueue(&store, NewJob::new("q"), "C3").await;
    let now = env.clock.now();

    let held = claim_expecting(&store, "q", a, "C3: claim a").await;
    store.release(a, held.token()).await.must("C3: release a");
    let claimed = claim(&store, &["q"], 3, "C3: after release").await;
    assert_eq!(
        ids_of(&claimed),
        vec![b, c, a],
        "C3: a released job goes behind the jobs already ready"
    );
    // b: fail with a retry at now; c: release; a: fail for good, then operator retry.
    let token = |i: usize| claimed[i].token();
    store
        .fail(b, token(0), "later", Retry::At(now))
        .await
        .must("C3: fail b with retry now");
    store.release(c, token(1)).await.must("C3: release c");
    assert_eq!(
        store
            .fail(a, token(2), "done", Retry::Never)
            .await
            .must("C3: fail a"),
        JobState::Dead
    );
    let d = enqueue(&store, NewJob::new("q"), "C3").await;
    store.retry(a).await.must("C3: retry a");
    let order = ids_of(&claim(&store, &["q"], 4, "C3: after requeues").await);
    assert_eq!(
        order,
        vec![b, c, d, a],
        "C3: each return to queued (fail with retry, release, enqueue, operator retry) draws a new place at the back, in the order they happened"
    );
}

/// C3 with the decision "run_at moves": release, reclaim and operator retry set
/// `run_at` to now; failure with `Retry::At(t)` sets it to `t`; `get` shows it.
pub async fn c3_run_at_moves_on_every_return_to_queued(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").max_attempts(3), "C3").await;
    let step = Duration::from_secs(100);

    env.clock.advance(step);
    let held = claim_expecting(&store, "q", id, "C3").await;
    env.clock.advance(step);
    store.release(id, held.token()).await.must("C3: release");
    assert_eq!(
        get(&store, id, "C3").await.run_at,
        env.clock.now(),
        "C3: release sets run_at to now"
    );

    let held = claim_expecting(&store, "q", id, "C3").await;
    let retry_at = env.clock.now().saturating_add(step * 3);
    store
        .fail(id, held.token(), "boom", Retry::At(retry_at))
        .await
        .must("C3: fail");
    assert_eq!(
        get(&store, id, "C3").await.run_at,
        retry_at,
        "C3: fail with Retry::At(t) sets run_at to t"
    );

    env.clock.advance(step * 3);
    claim_expecting(&store, "q", id, "C3").await;
    env.clock.advance(TTL + Duration::from_millis(1));
    let reclaimed = store.reclaim(10).await.must("C3: reclaim");
    assert_eq!(reclaimed.len(), 1);
    assert_eq!(
        get(&store, id, "C3").await.run_at,
        env.clock.now(),
        "C3: reclaim sets run_at to now"
    );

    let held = claim_expecting(&store, "q", id, "C3").await;
    store
        .fail(id, held.token(), "last", Retry::Never)
        .await
        .must("C3: fail for good");
    env.clock.advance(step);
    store.retry(id).await.must("C3: operator retry");
    assert_eq!(
        get(&store, id, "C3").await.run_at,
        env.clock.now(),
        "C3: operator retry sets run_at to now"
    );
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

/// C7: index entries whose records vanished are skipped and removed; the live jobs
/// behind them are claimed in the same call (vanished entries do not use up the
/// limit); no blank or partial record appears; `get`/`payload` of the vanished ids stay
/// not found.
pub async fn c7_vanished_records_are_skipped_and_live_jobs_claimed(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let gone_first = enqueue(&store, NewJob::new("q").priority(5), "C7").await;
    let gone_second = enqueue(&store, NewJob::new("q"), "C7").await;
    let live_a = enqueue(&store, NewJob::new("q").payload("a"), "C7").await;
    let gone_third = enqueue(&store, NewJob::new("q"), "C7").await;
    let live_b = enqueue(&store, NewJob::new("q").payload("b"), "C7").await;
    let live_c = enqueue(&store, NewJob::new("q").payload("c"), "C7").await;
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
    let later = env.clock.now().saturating_add(Duration::from_secs(5));
    let ready = enqueue(&store, NewJob::new("q").priority(9), "C9").await;
    let scheduled = enqueue(&store, NewJob::new("q").run_at(later).priority(9), "C9").await;
    let released = enqueue(&store, NewJob::new("q").priority(8), "C9").await;
    let reclaimed = enqueue(&store, NewJob::new("q").priority(8), "C9").await;
    let keep = enqueue(&store, NewJob::new("q"), "C9").await;
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
    let first = enqueue(&store, NewJob::new("q").payload("a"), "C10").await;
    let unreadable = enqueue(&store, NewJob::new("q"), "C10").await;
    let last = enqueue(&store, NewJob::new("q").payload("c"), "C10").await;
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
