//! The test kit (`durq::testing`), used as an application's own tests would use it.

use std::time::Duration;

use durq::testing::TestKit;
use durq::{JobContext, JobError, JobOutcome, JobState, TypedJob, Worker, WorkerBuilder};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    to: String,
}

impl TypedJob for Welcome {
    const QUEUE: &'static str = "welcome";
}

#[derive(Debug, Serialize, Deserialize)]
struct Audit {
    of: String,
}

impl TypedJob for Audit {
    const QUEUE: &'static str = "audit";
}

/// The application's code under test: signing up enqueues a welcome.
async fn sign_up(store: &durq::Store, to: &str) -> durq::Result<()> {
    store.enqueue_typed(&Welcome { to: to.into() }).await?;
    Ok(())
}

/// The application's workers: a welcome fails for an address without `@`, succeeds
/// otherwise and enqueues an audit; audits succeed.
fn workers(store: durq::Store) -> WorkerBuilder {
    Worker::builder(store)
        .typed_handler(|ctx: JobContext, welcome: Welcome| async move {
            if !welcome.to.contains('@') {
                return Err(JobError::retry(format!("no @ in {}", welcome.to)));
            }
            ctx.store().enqueue_typed(&Audit { of: welcome.to }).await?;
            Ok(())
        })
        .typed_handler(|_ctx: JobContext, _audit: Audit| async { Ok::<_, JobError>(()) })
}

/// The five lines a user's test needs: the store, the code under test, the assertion,
/// the job run through its handler, the outcome.
#[tokio::test]
async fn a_users_test_asserts_an_enqueue_and_runs_the_job_in_five_lines() {
    let kit = TestKit::new();
    sign_up(&kit.store(), "ada@example.com")
        .await
        .expect("sign up");
    kit.assert_enqueued(|job: &Welcome| job.to == "ada@example.com")
        .await;
    let ran = kit.run_one(workers(kit.store())).await.expect("a job ran");
    assert!(matches!(ran.outcome(), JobOutcome::Succeeded), "{ran:?}");
}

#[tokio::test]
async fn enqueued_jobs_are_read_back_as_their_type_and_matched() {
    let kit = TestKit::new();
    for to in ["a@x", "b@x"] {
        sign_up(&kit.store(), to).await.expect("sign up");
    }
    let waiting: Vec<String> = kit
        .enqueued::<Welcome>()
        .await
        .into_iter()
        .map(|w| w.to)
        .collect();
    assert_eq!(waiting, ["a@x", "b@x"], "oldest first");
    kit.assert_not_enqueued(|job: &Welcome| job.to == "c@x")
        .await;
    assert!(kit.enqueued::<Audit>().await.is_empty());

    let missing = tokio::spawn(async move {
        kit.assert_enqueued(|job: &Welcome| job.to == "c@x").await;
    })
    .await
    .expect_err("a missing job fails the assertion");
    let message = missing
        .into_panic()
        .downcast::<String>()
        .map(|m| *m)
        .unwrap_or_default();
    assert!(
        message.contains("a@x") && message.contains("b@x"),
        "the failure lists what is waiting: {message}"
    );
}

#[tokio::test]
async fn a_failed_job_is_retried_once_the_driven_clock_passes_its_backoff() {
    let kit = TestKit::new();
    sign_up(&kit.store(), "nobody").await.expect("sign up");
    let first = kit.run_one(workers(kit.store())).await.expect("it ran");
    let JobOutcome::Failed { retry_at, .. } = first.outcome() else {
        panic!("the first attempt fails: {first:?}");
    };
    assert_eq!(first.attempt(), 1);
    // Not yet due: nothing runs.
    assert!(kit.run_one(workers(kit.store())).await.is_none());
    kit.advance(retry_at.duration_since(kit.now()) + Duration::from_millis(1));
    let second = kit
        .run_one(workers(kit.store()))
        .await
        .expect("it ran again");
    assert_eq!(
        second.attempt(),
        2,
        "under the real lease rules: a new claim"
    );
    assert_eq!(second.id(), first.id());
}

#[tokio::test]
async fn drain_runs_every_ready_job_and_the_jobs_they_enqueue() {
    let kit = TestKit::new();
    for to in ["a@x", "b@x", "nobody"] {
        sign_up(&kit.store(), to).await.expect("sign up");
    }
    let events = kit.drain(workers(kit.store())).await;
    let succeeded = events
        .iter()
        .filter(|e| matches!(e.outcome(), JobOutcome::Succeeded))
        .count();
    // Two welcomes and their two audits succeed; one welcome fails and waits out its
    // backoff.
    assert_eq!((events.len(), succeeded), (5, 4), "{events:?}");
    let stats = kit.store().stats(Welcome::QUEUE).await.expect("stats");
    assert_eq!((stats.succeeded, stats.scheduled), (2, 1));
    let failed = events
        .iter()
        .find(|e| matches!(e.outcome(), JobOutcome::Failed { .. }))
        .expect("the failure");
    let job = kit.store().get(failed.id()).await.expect("get");
    assert_eq!(job.state, JobState::Queued);
    // Nothing is ready now: draining again runs nothing.
    assert!(kit.drain(workers(kit.store())).await.is_empty());
}

#[tokio::test]
async fn run_one_runs_exactly_one_job_however_many_are_ready() {
    let kit = TestKit::new();
    for to in ["a@x", "b@x", "c@x"] {
        sign_up(&kit.store(), to).await.expect("sign up");
    }
    for round in 1..=3u64 {
        let ran = kit.run_one(workers(kit.store())).await.expect("a job ran");
        assert!(matches!(ran.outcome(), JobOutcome::Succeeded), "{ran:?}");
        let welcomes = kit.store().stats(Welcome::QUEUE).await.expect("stats");
        let audits = kit.store().stats(Audit::QUEUE).await.expect("stats");
        // Oldest first: each round runs the next welcome, or the audit it enqueued.
        assert_eq!(
            welcomes.succeeded + audits.succeeded,
            round,
            "one job per run: {welcomes:?} {audits:?}"
        );
        assert_eq!(welcomes.running + audits.running, 0, "nothing left running");
    }
}
