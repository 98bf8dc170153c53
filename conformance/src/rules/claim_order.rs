//! Rule C3: the claim order (priority, then ready time, then enqueue order), across
//! claims, handles and queues.

use std::time::Duration;

use durq_core::{Clock, JobId, JobState, NewJob, Retry, Timestamp};

use super::support::{
    assert_claim_order, claim, claim_expecting, enqueue, get, ids_of, Must, Together, TTL,
};
use crate::{Harness, TestEnv};

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
    assert_claim_order(
        &store,
        &one_by_one,
        &expected,
        "C3: jobs must be claimed by priority desc, then ready time asc, then enqueue order",
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
    assert_claim_order(
        &store,
        &ids_of(&all),
        &expected_again,
        "C3: a claim of many returns them in claim order",
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
    assert_claim_order(
        &store,
        &claimed,
        &ids,
        "C3: jobs enqueued at one instant must be claimed in enqueue order",
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
    assert_claim_order(
        &first,
        &claimed,
        &ids,
        "C3: jobs enqueued at one instant through several handles must be claimed in enqueue order",
    );
}

/// C3: the order spans every queue named in one claim, whatever order the queues are
/// named in, and is applied to the whole ready set before cutting to `limit`.
pub async fn c3_order_spans_queues_and_is_applied_before_limit(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below are cut to a limit: the jobs share one partition (CONTRACT §8).
    let together = Together::new(&store, "C3").await;
    // Many older low-priority jobs, then one urgent job last.
    let mut low = Vec::new();
    for i in 0..60 {
        let queue = if i % 2 == 0 { "a" } else { "b" };
        low.push(enqueue(&store, together.job(NewJob::new(queue)), "C3").await);
    }
    let urgent = enqueue(&store, together.job(NewJob::new("b").priority(1)), "C3").await;
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
    let late = enqueue(&store, together.job(NewJob::new("a").priority(2)), "C3").await;
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
    let together = Together::new(&store, "C3").await;
    let a = enqueue(&store, together.job(NewJob::new("q").max_attempts(1)), "C3").await;
    let b = enqueue(&store, together.job(NewJob::new("q")), "C3").await;
    let c = enqueue(&store, together.job(NewJob::new("q")), "C3").await;
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
    let d = enqueue(&store, together.job(NewJob::new("q")), "C3").await;
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
