//! Rules O1, O2: waiting for a job's outcome with `Store::wait`.

use std::time::Duration;

use durq_core::graph::failed_dependency;
use durq_core::{Bytes, Clock, JobId, JobState, NewJob, Retry};
use futures::FutureExt;

use super::support::{claim, enqueue, expect_not_found, join_all, Must};
use crate::{Harness, TestEnv};

/// How long an O2 waiter may take to hear of an ending: far below its own timeout, far
/// above any notice's trip, and below the fallback poll of every backend that has one
/// for notices it can lose, so only a waiter the ending itself woke passes.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// A wait that never times out within the scenario.
const LONG: Duration = Duration::from_secs(3600);

/// O1: `wait` answers a job that has ended at once, as stored (a success with its
/// result, a dead job with its error, a cancelled job); a job that has not ended,
/// once its timeout has passed, with `None`; an unknown job with `NotFound`.
pub async fn o1_wait_answers_an_ended_job_as_stored(harness: &dyn Harness) {
    let what = "O1";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(store.wait(unknown, Duration::ZERO).await, unknown, what);

    // Three jobs to run, taken in whatever order the store hands them out (a
    // partitioned store keeps FIFO within a partition only, §8), and two that stay
    // queued in a queue no claim names.
    for _ in 0..3 {
        enqueue(&store, NewJob::new("o-ends"), what).await;
    }
    let cancelled = enqueue(&store, NewJob::new("o-idle"), what).await;
    let queued = enqueue(&store, NewJob::new("o-idle"), what).await;
    let claimed = claim(&store, &["o-ends"], 3, what).await;
    assert_eq!(claimed.len(), 3, "{what}: three jobs are claimed");
    let (succeeded, dead, running) = (claimed[0].id(), claimed[1].id(), claimed[2].id());
    let token = |n: usize| claimed[n].token();
    store
        .complete(succeeded, token(0), Some(Bytes::from_static(b"the output")))
        .await
        .must(what);
    store
        .fail(dead, token(1), "it broke", Retry::Never)
        .await
        .must(what);
    assert_eq!(
        store.cancel(cancelled).await.must(what),
        JobState::Cancelled,
        "{what}: a queued job is cancelled"
    );

    let answer = store.wait(succeeded, LONG).await.must(what);
    let job = answer.unwrap_or_else(|| panic!("{what}: a succeeded job is answered at once"));
    assert_eq!(job.id, succeeded, "{what}: the job waited for is answered");
    assert_eq!(job.state, JobState::Succeeded, "{what}: as stored");
    assert_eq!(
        job.result.as_deref(),
        Some(&b"the output"[..]),
        "{what}: a succeeded job is answered with its result"
    );

    let job = store
        .wait(dead, LONG)
        .await
        .must(what)
        .unwrap_or_else(|| panic!("{what}: a dead job is answered at once"));
    assert_eq!(job.state, JobState::Dead, "{what}: as stored");
    assert_eq!(
        job.last_error.as_deref(),
        Some("it broke"),
        "{what}: a dead job is answered with its error"
    );

    let job = store
        .wait(cancelled, LONG)
        .await
        .must(what)
        .unwrap_or_else(|| panic!("{what}: a cancelled job is answered at once"));
    assert_eq!(job.state, JobState::Cancelled, "{what}: as stored");

    for (id, state) in [(running, "running"), (queued, "queued")] {
        assert!(
            store.wait(id, Duration::ZERO).await.must(what).is_none(),
            "{what}: a {state} job has not ended: its wait times out with None"
        );
    }
}

/// O2: waiters are woken by the endings themselves: 16 waits, each on its own handle,
/// armed before their jobs end, are answered within 10 s of an hour's
/// timeout once other handles end those jobs in parallel (completions with results,
/// permanent failures, an operator's cancels, and where the store keeps dependencies a
/// cascade of G3), each with its own job as it ended.
pub async fn o2_waiters_are_woken_by_endings_from_other_handles(harness: &dyn Harness) {
    let what = "O2";
    const JOBS: usize = 16;
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Every fourth job waits in a queue no one claims, for an operator's cancel; the
    // others are claimed and ended by their holders.
    let mut ids = Vec::with_capacity(JOBS);
    let mut cancels = Vec::new();
    for n in 0..JOBS {
        let queue = if n % 4 == 0 { "o-cancelled" } else { "o-woken" };
        let id = enqueue(&store, NewJob::new(queue), what).await;
        if n % 4 == 0 {
            cancels.push(id);
        }
        ids.push(id);
    }
    let runs = JOBS - cancels.len();
    let claimed = claim(&store, &["o-woken"], runs, what).await;
    assert_eq!(claimed.len(), runs, "{what}: every job to run is claimed");
    // On a store that keeps dependencies, one more job waits for a job that will fail:
    // the cascade of G3 that cancels it is an ending too.
    let failing = claimed
        .iter()
        .enumerate()
        .find(|(n, _)| n % 3 == 2)
        .map(|(_, job)| job.id());
    let mut dependent = None;
    if let (true, Some(failing)) = (store.capabilities().dependencies, failing) {
        let id = enqueue(&store, NewJob::new("o-dependent").after(failing), what).await;
        ids.push(id);
        dependent = Some((id, failing));
    }

    // Each wait on a handle of its own, polled once here so that it has begun (a
    // backend that arms without I/O is armed now) before any job ends.
    let mut waits = Vec::with_capacity(JOBS);
    for &id in &ids {
        let waiter = env.store().await;
        let mut wait = Box::pin(async move { (id, waiter.wait(id, LONG).await) });
        assert!(
            (&mut wait).now_or_never().is_none(),
            "{what}: no job has ended yet, so no wait has an answer"
        );
        waits.push(tokio::spawn(wait));
    }

    let mut endings = Vec::with_capacity(JOBS);
    for (n, job) in claimed.into_iter().enumerate() {
        let ender = env.store().await;
        endings.push(tokio::spawn(async move {
            if n % 3 == 2 {
                ender
                    .fail(job.id(), job.token(), "gave up", Retry::Never)
                    .await
                    .map(|_| ())
            } else {
                let result = Bytes::from(format!("result of {}", job.id()));
                ender.complete(job.id(), job.token(), Some(result)).await
            }
        }));
    }
    for id in cancels {
        let ender = env.store().await;
        endings.push(tokio::spawn(
            async move { ender.cancel(id).await.map(|_| ()) },
        ));
    }
    for ended in join_all(endings).await {
        ended.must(what);
    }

    let answers = tokio::time::timeout(WOKEN_WITHIN, join_all(waits))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what}: the waiters were not all answered within {WOKEN_WITHIN:?} of their \
                 jobs' endings: a wait must be woken by the ending, not by its timeout"
            )
        });
    for (id, answer) in answers {
        let job = answer
            .must(what)
            .unwrap_or_else(|| panic!("{what}: job {id} ended, so its wait answers it"));
        assert_eq!(job.id, id, "{what}: each wait answers its own job");
        match job.state {
            JobState::Succeeded => assert_eq!(
                job.result.as_deref(),
                Some(format!("result of {id}").as_bytes()),
                "{what}: a success is answered with its result"
            ),
            JobState::Dead => assert_eq!(
                job.last_error.as_deref(),
                Some("gave up"),
                "{what}: a dead job is answered with its error"
            ),
            JobState::Cancelled => match dependent {
                Some((waiting, failing)) if waiting == id => assert_eq!(
                    job.last_error,
                    Some(failed_dependency(failing, JobState::Dead)),
                    "{what}: the job cancelled by the cascade says why"
                ),
                _ => assert_eq!(
                    job.last_error, None,
                    "{what}: an operator's cancel of a queued job leaves no error"
                ),
            },
            other => panic!("{what}: job {id} answered while {other}, not ended"),
        }
    }
}
