//! Rules T1 and T3 of CONTRACT §7: jobs enqueued and completed inside a transaction the
//! caller opened commit with the caller's own rows or not at all. Run through
//! [`transaction_tests!`](crate::transaction_tests) for a
//! [`TransactionHarness`].
//!
//! T2 (wake-ups on commit only) is about waiters that are not woken, which no scenario
//! can see without waiting out a timeout, and T4 (durability) about the machine
//! stopping: each SQL backend's own tests pin them.

use std::time::Duration;

use durq_core::{Bytes, Clock, JobId, JobState, NewJob};

use super::support::{
    assert_nothing_claimable, claim_expecting, drain, enqueue, expect_invalid, expect_lease_lost,
    expect_not_found, expect_too_large, get, ids_of, Must, TTL,
};
use crate::{TransactionEnv, TransactionHarness};

/// T1, T3 with G1 (decided under T3): a job enqueued in a transaction may wait for a
/// job, and a fenced completion of that job settles it inside the transaction: still
/// waiting after a rollback, released at the commit. Skips on a store without
/// dependencies.
pub async fn t3_a_fenced_completion_settles_the_jobs_waiting_for_it(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    let store = env.store(harness).await;
    if !store.capabilities().dependencies {
        eprintln!("T3 with dependencies skipped: the store does not keep dependencies");
        return;
    }
    let dependency = enqueue(&store, NewJob::new("q"), "T3: enqueue").await;
    let mut tx = env.begin(harness).await;
    let dependent = tx
        .enqueue(NewJob::new("after").after(dependency))
        .await
        .must("T3: enqueue a dependent in the transaction")
        .id;
    tx.commit().await.must("T3: commit");
    assert_eq!(
        get(&store, dependent, "T3: the dependent").await.state,
        JobState::Waiting,
        "T3: a job enqueued in a transaction waits for its dependency"
    );
    let held = claim_expecting(&store, "q", dependency, "T3: claim").await;

    let mut tx = env.begin(harness).await;
    let _receipt = tx
        .complete(dependency, held.token(), None)
        .await
        .must("T3: complete in the transaction");
    tx.rollback().await.must("T3: roll back");
    assert_eq!(
        get(&store, dependent, "T3: after the rollback").await.state,
        JobState::Waiting,
        "T3: a rolled-back completion releases nothing"
    );
    assert_nothing_claimable(&store, &["after"], "T3: still waiting").await;

    let mut tx = env.begin(harness).await;
    let _receipt = tx
        .complete(dependency, held.token(), None)
        .await
        .must("T3: complete in the transaction");
    tx.commit().await.must("T3: commit");
    claim_expecting(&store, "after", dependent, "T3: released at the commit").await;
}

/// T1: a job enqueued in a transaction exists if and only if the transaction commits,
/// and no other connection sees it before; the caller's row goes with it.
pub async fn t1_a_job_exists_only_if_its_transaction_commits(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    let store = env.store(harness).await;

    let mut tx = env.begin(harness).await;
    tx.write_row("rolled-back").await.must("T1: write a row");
    let dropped = tx
        .enqueue(NewJob::new("q").payload("dropped"))
        .await
        .must("T1: enqueue in the transaction");
    assert!(dropped.created, "T1: a new job is created");
    expect_not_found(
        store.get(dropped.id).await,
        dropped.id,
        "T1: a job of an open transaction is invisible to other connections",
    );
    tx.rollback().await.must("T1: roll back");
    expect_not_found(
        store.get(dropped.id).await,
        dropped.id,
        "T1: a rolled-back job never exists",
    );
    assert!(
        !env.row_committed(harness, "rolled-back").await,
        "T1: the rolled-back row does not exist"
    );
    assert_nothing_claimable(&store, &["q"], "T1: a rolled-back job is never claimed").await;

    let mut tx = env.begin(harness).await;
    tx.write_row("committed").await.must("T1: write a row");
    let one = tx
        .enqueue(NewJob::new("q").payload("one"))
        .await
        .must("T1: enqueue in the transaction");
    let batch = tx
        .enqueue_batch(vec![
            NewJob::new("q").payload("two"),
            NewJob::new("q").payload("three"),
        ])
        .await
        .must("T1: enqueue a batch in the transaction");
    expect_not_found(
        store.get(one.id).await,
        one.id,
        "T1: a job of an open transaction is invisible before its commit",
    );
    tx.commit().await.must("T1: commit");

    assert!(
        env.row_committed(harness, "committed").await,
        "T1: the committed row exists"
    );
    let job = get(&store, one.id, "T1: a committed job exists").await;
    assert_eq!(job.state, JobState::Queued, "T1: a committed job is queued");
    assert_eq!(
        store.payload(one.id).await.must("T1: payload"),
        Bytes::from_static(b"one"),
        "T1: a committed job keeps its payload"
    );
    let mut expected: Vec<JobId> = vec![one.id];
    expected.extend(batch.iter().map(|answer| answer.id));
    let claimed = ids_of(&drain(&store, &["q"], "T1: claim the committed jobs").await);
    assert_eq!(
        claimed, expected,
        "T1: exactly the committed jobs are claimed, in enqueue order"
    );
}

/// T1 with E2/E4: transactions enqueueing one key at once end, once all have
/// committed, with one job, every one of them answered with it.
pub async fn t1_transactions_enqueueing_one_key_make_one_job(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    const TRANSACTIONS: usize = 4;
    let store = env.store(harness).await;
    let mut tasks = Vec::with_capacity(TRANSACTIONS);
    for n in 0..TRANSACTIONS {
        // Polled together, not spawned (the harness is borrowed): each transaction has
        // its own connection, so they still meet in the database at once.
        tasks.push(async move {
            let mut tx = env.begin(harness).await;
            tx.write_row(&format!("writer-{n}"))
                .await
                .must("T1: write a row");
            let answer = tx
                .enqueue(NewJob::new("q").idempotency_key("one-key"))
                .await
                .must("T1: enqueue the shared key");
            tx.commit().await.must("T1: commit");
            answer
        });
    }
    let answers = futures::future::join_all(tasks).await;
    let first = answers[0].id;
    assert!(
        answers.iter().all(|answer| answer.id == first),
        "T1: every transaction is answered with the one job: {answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|answer| answer.created).count(),
        1,
        "T1: exactly one transaction created the job: {answers:?}"
    );
    for n in 0..TRANSACTIONS {
        assert!(
            env.row_committed(harness, &format!("writer-{n}")).await,
            "T1: every transaction committed its own row"
        );
    }
    let again = store
        .enqueue(NewJob::new("q").idempotency_key("one-key"))
        .await
        .must("T1: enqueue the key through the store");
    assert_eq!(
        (again.id, again.created),
        (first, false),
        "T1: the store answers the key with the committed job (E2)"
    );
    let claimed = ids_of(&drain(&store, &["q"], "T1: claim").await);
    assert_eq!(claimed, vec![first], "T1: the key made one job");
}

/// T1 (the same front door): bad input in a transaction is refused as the store refuses
/// it, writes nothing, and leaves the transaction usable; an invalid batch is refused
/// whole (E9); an oversized result is refused before the completion.
pub async fn t1_bad_input_writes_nothing_and_leaves_the_transaction_usable(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    let store = env.store(harness).await;
    let running = enqueue(&store, NewJob::new("work"), "T1: enqueue").await;
    let held = claim_expecting(&store, "work", running, "T1: claim").await;

    let mut tx = env.begin(harness).await;
    tx.write_row("kept").await.must("T1: write a row");
    expect_invalid(
        tx.enqueue(NewJob::new("")).await,
        "queue",
        "T1: an empty queue is refused in a transaction (E7)",
    );
    let refused = tx
        .enqueue_batch(vec![NewJob::new("q").payload("fine"), NewJob::new("")])
        .await;
    expect_invalid(
        refused,
        "queue",
        "T1: a batch with an invalid job is refused",
    );
    let limit = store.settings().max_payload_bytes;
    let oversized = Bytes::from(vec![7u8; limit + 1]);
    expect_too_large(
        tx.complete(running, held.token(), Some(oversized)).await,
        "result",
        limit + 1,
        limit,
        "T1: an oversized result is refused in a transaction",
    );
    let kept = tx
        .enqueue(NewJob::new("q").payload("kept"))
        .await
        .must("T1: the transaction is still usable after refusals");
    let _receipt = tx
        .complete(running, held.token(), Some(Bytes::from_static(b"ok")))
        .await
        .must("T1: a completion after a refused one");
    tx.commit().await.must("T1: commit");

    assert!(
        env.row_committed(harness, "kept").await,
        "T1: the caller's row committed"
    );
    let claimed = ids_of(&drain(&store, &["q"], "T1: claim").await);
    assert_eq!(
        claimed,
        vec![kept.id],
        "T1: only the valid job was written; nothing of the refused batch"
    );
    let done = get(&store, running, "T1: the completed job").await;
    assert_eq!(done.state, JobState::Succeeded, "T1: the job completed");
}

/// T3: a completion in the caller's transaction commits with the caller's row, holds
/// the job until the transaction ends, and a rollback undoes it.
pub async fn t3_a_fenced_completion_commits_with_the_callers_row(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    let store = env.store(harness).await;
    let id = enqueue(&store, NewJob::new("q"), "T3: enqueue").await;
    let held = claim_expecting(&store, "q", id, "T3: claim").await;

    let mut tx = env.begin(harness).await;
    tx.write_row("undone").await.must("T3: write a row");
    let receipt = tx
        .complete(id, held.token(), Some(Bytes::from_static(b"undone")))
        .await
        .must("T3: complete in the transaction");
    assert_eq!(
        (receipt.id(), receipt.token()),
        (id, held.token()),
        "T3: the receipt names the job and its lease"
    );
    let during = get(&store, id, "T3: the job during the transaction").await;
    assert_eq!(
        during.state,
        JobState::Running,
        "T3: until the commit, other connections see the job running"
    );
    tx.rollback().await.must("T3: roll back");
    let after = get(&store, id, "T3: the job after the rollback").await;
    assert_eq!(
        after.state,
        JobState::Running,
        "T3: a rolled-back completion leaves the job running"
    );
    assert_eq!(
        after.lease.as_ref().map(|lease| lease.token),
        Some(held.token()),
        "T3: a rolled-back completion leaves the lease as it was"
    );
    assert!(
        !env.row_committed(harness, "undone").await,
        "T3: the rolled-back row does not exist"
    );

    let mut tx = env.begin(harness).await;
    tx.write_row("result").await.must("T3: write a row");
    let _receipt = tx
        .complete(id, held.token(), Some(Bytes::from_static(b"done")))
        .await
        .must("T3: complete in the transaction");
    tx.commit().await.must("T3: commit");
    let job = get(&store, id, "T3: the completed job").await;
    assert_eq!(job.state, JobState::Succeeded, "T3: the job succeeded");
    assert_eq!(
        job.result.as_deref(),
        Some(&b"done"[..]),
        "T3: the result committed with the transaction"
    );
    assert!(job.lease.is_none(), "T3: a finished job holds no lease");
    assert!(
        env.row_committed(harness, "result").await,
        "T3: the caller's row committed with the completion"
    );
    expect_lease_lost(
        store.complete(id, held.token(), None).await,
        id,
        "T3: the lease ended with the committed completion",
    );
}

/// T3: a completion under a stale token answers `LeaseLost`, an unknown job `NotFound`,
/// and either refuses the whole transaction: nothing of it is written, the caller's
/// rows included, and the job stays with its current lease.
pub async fn t3_a_stale_lease_refuses_the_whole_transaction(
    harness: &dyn TransactionHarness,
    env: &TransactionEnv,
) {
    let store = env.store(harness).await;
    let id = enqueue(&store, NewJob::new("q"), "T3: enqueue").await;
    let first = claim_expecting(&store, "q", id, "T3: claim").await;
    env.clock.advance(TTL + Duration::from_secs(1));
    let reclaimed = store.reclaim(100).await.must("T3: reclaim");
    assert_eq!(
        reclaimed.iter().map(|job| job.id).collect::<Vec<_>>(),
        vec![id],
        "T3: the expired lease is reclaimed"
    );
    let second = claim_expecting(&store, "q", id, "T3: claim again").await;

    let mut tx = env.begin(harness).await;
    tx.write_row("stale").await.must("T3: write a row");
    let extra = tx
        .enqueue(NewJob::new("side-effects"))
        .await
        .must("T3: enqueue before the completion");
    expect_lease_lost(
        tx.complete(id, first.token(), Some(Bytes::from_static(b"stale")))
            .await,
        id,
        "T3: a stale token",
    );
    // Either answer is the contract's (see `CallerTransaction::commit`); what counts
    // is that nothing was written.
    let _ = tx.commit().await;
    assert!(
        !env.row_committed(harness, "stale").await,
        "T3: a refused completion takes the caller's row down with it"
    );
    expect_not_found(
        store.get(extra.id).await,
        extra.id,
        "T3: a refused completion takes the transaction's jobs down with it",
    );
    let job = get(&store, id, "T3: the job after the refused transaction").await;
    assert_eq!(
        (job.state, job.lease.as_ref().map(|lease| lease.token)),
        (JobState::Running, Some(second.token())),
        "T3: the job stays with its current lease"
    );

    let unknown = JobId::mint(env.clock.now());
    let mut tx = env.begin(harness).await;
    tx.write_row("unknown").await.must("T3: write a row");
    expect_not_found(
        tx.complete(unknown, second.token(), None).await,
        unknown,
        "T3: completing a job that does not exist",
    );
    let _ = tx.commit().await;
    assert!(
        !env.row_committed(harness, "unknown").await,
        "T3: a completion of an unknown job takes the caller's row down with it"
    );

    store
        .complete(id, second.token(), None)
        .await
        .must("T3: the current lease still completes");
    assert_nothing_claimable(&store, &["q"], "T3: the job ran once more, not twice").await;
}
