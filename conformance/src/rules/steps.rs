//! Rules D1–D4: durable steps, saved under a job's lease and kept across its runs, and
//! an operator's reopen of an ended job from one of them.

use std::time::Duration;

use durq_core::steps::MAX_STEPS;
use durq_core::{Bytes, Clock, Error, JobId, JobState, LeaseToken, NewJob, Retry, StepLog, Store};

use super::support::{
    claim_expecting, enqueue, expect_invalid, expect_invalid_state, expect_lease_lost,
    expect_not_found, expect_too_large, get, join_all, Must, TTL,
};
use crate::{Harness, TestEnv};

/// The queue the scenarios run their jobs in.
const QUEUE: &str = "d-steps";

fn output(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// The names of a log's steps, in save order.
fn names(log: &StepLog) -> Vec<&str> {
    log.steps.iter().map(|step| step.name.as_str()).collect()
}

/// A job of [`QUEUE`] enqueued and claimed: its id and token.
async fn running(store: &Store, what: &str) -> (JobId, LeaseToken) {
    let id = enqueue(store, NewJob::new(QUEUE), what).await;
    let claimed = claim_expecting(store, QUEUE, id, what).await;
    (id, claimed.token())
}

/// `save_step`, which must succeed.
async fn save(store: &Store, id: JobId, token: LeaseToken, name: &str, text: &str, what: &str) {
    store
        .save_step(id, token, name, output(text))
        .await
        .must(what);
}

/// D1: a running job saves a step under its lease token; the first save of a name
/// stands; a stale token, a job not running and an unknown job are refused and write
/// nothing; a bad name, an oversized output and a step past the bound are refused,
/// naming the field, and write nothing.
pub async fn d1_a_step_is_saved_under_the_lease_and_the_first_save_stands(harness: &dyn Harness) {
    let what = "D1";
    const MAX: usize = 1024;
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(MAX)).await;
    let (id, token) = running(&store, what).await;

    save(&store, id, token, "charge", "charged 42", what).await;
    store
        .save_step(id, token, "charge", output("charged twice"))
        .await
        .must(what);
    let log = store.steps(id).await.must(what);
    assert_eq!(names(&log), ["charge"], "{what}: a name is saved once");
    assert_eq!(
        log.steps[0].output,
        output("charged 42"),
        "{what}: the first save of a name stands"
    );

    // Refusals write nothing.
    expect_invalid(
        store.save_step(id, token, "", output("x")).await,
        "step",
        what,
    );
    expect_invalid(
        store.save_step(id, token, "has space", output("x")).await,
        "step",
        what,
    );
    expect_invalid(
        store
            .save_step(id, token, &"s".repeat(129), output("x"))
            .await,
        "step",
        what,
    );
    expect_too_large(
        store
            .save_step(id, token, "big", Bytes::from(vec![7u8; MAX + 1]))
            .await,
        "output",
        MAX + 1,
        MAX,
        what,
    );
    store
        .save_step(id, token, "exactly-max", Bytes::from(vec![7u8; MAX]))
        .await
        .must(what);
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(
        store.save_step(unknown, token, "x", output("x")).await,
        unknown,
        what,
    );
    expect_not_found(store.steps(unknown).await, unknown, what);

    // A run that lost its lease cannot save: the job fails, runs again under a new
    // token, and the old one is refused.
    store
        .fail(id, token, "first run failed", Retry::At(env.clock.now()))
        .await
        .must(what);
    expect_lease_lost(
        store.save_step(id, token, "late", output("x")).await,
        id,
        what,
    );
    let again = claim_expecting(&store, QUEUE, id, what).await;
    expect_lease_lost(
        store.save_step(id, token, "late", output("x")).await,
        id,
        what,
    );
    let log = store.steps(id).await.must(what);
    assert_eq!(
        names(&log),
        ["charge", "exactly-max"],
        "{what}: refused saves write nothing"
    );
    assert_eq!(
        log.steps[1].output.len(),
        MAX,
        "{what}: an output of exactly max_payload_bytes is kept whole"
    );

    // A job not running (queued, never claimed) cannot save.
    let queued = enqueue(&store, NewJob::new("d-idle"), what).await;
    expect_lease_lost(
        store
            .save_step(queued, again.token(), "x", output("x"))
            .await,
        queued,
        what,
    );
    let log = store.steps(queued).await.must(what);
    assert!(
        log.steps.is_empty(),
        "{what}: a refused save writes nothing"
    );

    // At most MAX_STEPS steps in a generation: the job saves up to the bound (two are
    // saved already), and the next one is refused naming `step`.
    let token = again.token();
    let mut saves = Vec::new();
    for n in 2..MAX_STEPS {
        let store = store.clone();
        saves.push(tokio::spawn(async move {
            store
                .save_step(id, token, &format!("s{n}"), Bytes::new())
                .await
        }));
        if saves.len() == 50 {
            for saved in join_all(std::mem::take(&mut saves)).await {
                saved.must(what);
            }
        }
    }
    for saved in join_all(saves).await {
        saved.must(what);
    }
    expect_invalid(
        store
            .save_step(id, token, "one-too-many", Bytes::new())
            .await,
        "step",
        what,
    );
    store
        .save_step(id, token, "charge", output("again"))
        .await
        .must(what);
    let log = store.steps(id).await.must(what);
    assert_eq!(
        log.steps.len(),
        MAX_STEPS,
        "{what}: a job keeps {MAX_STEPS} steps, no more"
    );
}

/// D2: `steps` answers the generation (0) and the steps in save order, each with its
/// output and `saved_at`; saving changes nothing else a reader sees; the steps outlive
/// the run that saved them: a failure, a reclaim, a release, a snooze and an
/// operator's retry keep them, and a later run reads them; a purge takes them with the
/// job.
pub async fn d2_steps_are_read_in_save_order_and_outlive_the_run(harness: &dyn Harness) {
    let what = "D2";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let (id, token) = running(&store, what).await;
    let fresh = store.steps(id).await.must(what);
    assert_eq!(
        fresh,
        StepLog::default(),
        "{what}: a job that saved nothing is at generation 0 with no steps"
    );

    let before = get(&store, id, what).await;
    let mut saved_at = Vec::new();
    // Names that do not sort in save order, so a backend that sorts by name fails.
    for (name, text) in [("zeta", "first"), ("alpha", "second"), ("mid", "third")] {
        saved_at.push(env.clock.now());
        save(&store, id, token, name, text, what).await;
        env.clock.advance(Duration::from_millis(5));
    }
    assert_eq!(
        get(&store, id, what).await,
        before,
        "{what}: saving steps changes nothing else a reader sees"
    );
    let expected = |log: &StepLog, when: &str| {
        assert_eq!(log.generation, 0, "{what}: {when}: never reopened");
        assert_eq!(
            names(log),
            ["zeta", "alpha", "mid"],
            "{what}: {when}: steps in the order saved"
        );
        let outputs: Vec<_> = log.steps.iter().map(|s| s.output.clone()).collect();
        assert_eq!(
            outputs,
            [output("first"), output("second"), output("third")],
            "{what}: {when}: each output as saved"
        );
        let times: Vec<_> = log.steps.iter().map(|s| s.saved_at).collect();
        assert_eq!(times, saved_at, "{what}: {when}: each saved_at");
    };
    expected(&store.steps(id).await.must(what), "after the saves");

    // A failure with a retry, then the next run.
    store
        .fail(id, token, "failed", Retry::At(env.clock.now()))
        .await
        .must(what);
    expected(&store.steps(id).await.must(what), "after a failure");
    let run = claim_expecting(&store, QUEUE, id, what).await;
    // A release, then a snooze.
    store.release(id, run.token()).await.must(what);
    let run = claim_expecting(&store, QUEUE, id, what).await;
    store
        .snooze(id, run.token(), Duration::ZERO)
        .await
        .must(what);
    expected(
        &store.steps(id).await.must(what),
        "after a release and a snooze",
    );
    // A reclaim of an expired lease.
    let _run = claim_expecting(&store, QUEUE, id, what).await;
    env.clock.advance(TTL + Duration::from_millis(1));
    let reclaimed = store.reclaim(10).await.must(what);
    assert_eq!(reclaimed.len(), 1, "{what}: the expired lease is reclaimed");
    expected(&store.steps(id).await.must(what), "after a reclaim");
    // Dead, then an operator's retry (A2).
    let run = claim_expecting(&store, QUEUE, id, what).await;
    store
        .fail(id, run.token(), "gave up", Retry::Never)
        .await
        .must(what);
    if store.supports(durq_core::Capability::Admin) {
        store.retry(id).await.must(what);
        expected(&store.steps(id).await.must(what), "after a retry (A2)");
        let run = claim_expecting(&store, QUEUE, id, what).await;
        save(&store, id, run.token(), "last", "fourth", what).await;
        let log = store.steps(id).await.must(what);
        assert_eq!(
            names(&log),
            ["zeta", "alpha", "mid", "last"],
            "{what}: a later run adds to the steps of the runs before it"
        );
        // Retention takes the steps with the record (A5): the job is purged whole.
        store.complete(id, run.token(), None).await.must(what);
        env.clock
            .advance(store.settings().retention + Duration::from_secs(1));
        assert_eq!(
            store.purge(100).await.must(what),
            1,
            "{what}: the job is purged"
        );
        expect_not_found(store.steps(id).await, id, what);
    } else {
        expected(&store.steps(id).await.must(what), "once dead");
    }
}

/// D3: `retry_from` reopens an ended job from a step: the steps before it stay, it and
/// the later ones go, the generation moves up by one, the job is queued as A2 queues
/// it (waiting for nothing, where dependencies are kept), and the old run's token is
/// refused. A stale generation, a job that has not
/// ended, an unsaved step and an unknown job are refused and write nothing.
pub async fn d3_retry_from_reopens_an_ended_job_from_a_step(harness: &dyn Harness) {
    let what = "D3";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let (id, token) = running(&store, what).await;
    for name in ["charge", "email", "invoice"] {
        save(&store, id, token, name, name, what).await;
    }

    // Running: not ended yet.
    expect_invalid_state(
        store.retry_from(id, "email", 0).await,
        id,
        JobState::Running,
        what,
    );
    store
        .complete(id, token, Some(output("done")))
        .await
        .must(what);
    let ended = get(&store, id, what).await;
    let steps = store.steps(id).await.must(what);

    match store.retry_from(id, "email", 1).await {
        Err(Error::StaleGeneration {
            id: named,
            expected: 1,
            current: 0,
        }) => assert_eq!(named, id, "{what}: StaleGeneration names the job"),
        other => panic!("{what}: a reopen naming generation 1 of a job at 0: {other:?}"),
    }
    expect_invalid(store.retry_from(id, "refund", 0).await, "step", what);
    expect_invalid(store.retry_from(id, "", 0).await, "step", what);
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(store.retry_from(unknown, "email", 0).await, unknown, what);
    assert_eq!(
        get(&store, id, what).await,
        ended,
        "{what}: refused reopens leave the job as it was"
    );
    assert_eq!(
        store.steps(id).await.must(what),
        steps,
        "{what}: refused reopens leave the steps as they were"
    );

    let history = if store.supports(durq_core::Capability::Inspect) {
        store.attempts(id).await.must(what)
    } else {
        Vec::new()
    };
    env.clock.advance(Duration::from_secs(1));
    let reopened_at = env.clock.now();
    store.retry_from(id, "email", 0).await.must(what);
    if store.supports(durq_core::Capability::Inspect) {
        assert_eq!(
            store.attempts(id).await.must(what),
            history,
            "{what}: a reopen keeps the attempt history, the attempt that succeeded included"
        );
    }
    let job = get(&store, id, what).await;
    assert_eq!(job.state, JobState::Queued, "{what}: the job is queued");
    assert_eq!(job.attempts, 0, "{what}: its attempts start over");
    assert_eq!(job.result, None, "{what}: its result is cleared");
    assert_eq!(job.last_error, None, "{what}: its error is cleared");
    assert_eq!(job.finished_at, None, "{what}: it is no longer finished");
    assert_eq!(job.run_at, reopened_at, "{what}: ready at the reopen");
    let log = store.steps(id).await.must(what);
    assert_eq!(log.generation, 1, "{what}: the generation moved up by one");
    assert_eq!(
        names(&log),
        ["charge"],
        "{what}: the step reopened from and those after it are gone"
    );

    // The old run's token is refused; the new run saves the cut steps again.
    expect_lease_lost(store.complete(id, token, None).await, id, what);
    expect_lease_lost(
        store.save_step(id, token, "email", output("x")).await,
        id,
        what,
    );
    let run = claim_expecting(&store, QUEUE, id, what).await;
    assert!(
        run.token() > token,
        "{what}: the run after a reopen holds a larger token"
    );
    save(&store, id, run.token(), "email", "sent again", what).await;
    store
        .fail(id, run.token(), "broke", Retry::Never)
        .await
        .must(what);

    // A dead job reopens too, at its new generation; the old generation is stale.
    match store.retry_from(id, "charge", 0).await {
        Err(Error::StaleGeneration {
            expected: 0,
            current: 1,
            ..
        }) => {}
        other => panic!("{what}: a reopen of a stale generation: {other:?}"),
    }
    store.retry_from(id, "charge", 1).await.must(what);
    let log = store.steps(id).await.must(what);
    assert_eq!(
        (log.generation, names(&log)),
        (2, Vec::<&str>::new()),
        "{what}: reopened from its first step, a job keeps none"
    );

    // A cancelled job reopens too: cancelled while running, it ends at its release
    // (A1), and a queued job is not ended.
    if store.supports(durq_core::Capability::Admin) {
        let other = enqueue(&store, NewJob::new("d-cancel"), what).await;
        let token = claim_expecting(&store, "d-cancel", other, what)
            .await
            .token();
        save(&store, other, token, "only", "x", what).await;
        store.cancel(other).await.must(what);
        store.release(other, token).await.must(what);
        assert_eq!(
            get(&store, other, what).await.state,
            JobState::Cancelled,
            "{what}: a cancel-requested job ends cancelled at its release"
        );
        store.retry_from(other, "only", 0).await.must(what);
        expect_invalid_state(
            store.retry_from(other, "only", 1).await,
            other,
            JobState::Queued,
            what,
        );
    }
    d3_a_reopened_dependent_waits_for_nothing(&env, &store, what).await;
}

/// D3, with dependencies: a job that waited for another and ran (its dependency died,
/// and it runs despite failures) is reopened queued, waiting for nothing again.
async fn d3_a_reopened_dependent_waits_for_nothing(env: &TestEnv<'_>, store: &Store, what: &str) {
    if !store.capabilities().dependencies {
        return;
    }
    let root = enqueue(store, NewJob::new("d-root"), what).await;
    let dependent = enqueue(
        store,
        NewJob::new("d-after")
            .after(root)
            .on_dependency_failure(durq_core::DependencyFailure::Run),
        what,
    )
    .await;
    let run = claim_expecting(store, "d-root", root, what).await;
    store
        .fail(root, run.token(), "root died", Retry::Never)
        .await
        .must(what);
    let run = claim_expecting(store, "d-after", dependent, what).await;
    save(store, dependent, run.token(), "cleanup", "x", what).await;
    store
        .complete(dependent, run.token(), None)
        .await
        .must(what);
    env.clock.advance(Duration::from_secs(1));
    store.retry_from(dependent, "cleanup", 0).await.must(what);
    let job = get(store, dependent, what).await;
    assert_eq!(
        (job.state, job.run_at),
        (JobState::Queued, env.clock.now()),
        "{what}: a reopened job waits for nothing, its dependency dead or not"
    );
}

/// D4: 16 reopens naming the same generation, each on a handle of its own, at once:
/// exactly one wins, the rest are `StaleGeneration` or `InvalidState`, and the job is
/// reopened once.
pub async fn d4_concurrent_reopens_have_exactly_one_winner(harness: &dyn Harness) {
    let what = "D4";
    const REOPENS: usize = 16;
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new(QUEUE), what).await;
    // Three rounds: each runs the job (its run saves `b` and `c` again, `a` stands),
    // ends it, and reopens it from `b` 16 times at once.
    for round in 0..3u64 {
        let token = claim_expecting(&store, QUEUE, id, what).await.token();
        for name in ["a", "b", "c"] {
            save(&store, id, token, name, name, what).await;
        }
        store.complete(id, token, None).await.must(what);

        let mut reopens = Vec::with_capacity(REOPENS);
        for _ in 0..REOPENS {
            let handle = env.store().await;
            reopens.push(tokio::spawn(async move {
                handle.retry_from(id, "b", round).await
            }));
        }
        let answers = join_all(reopens).await;
        let won = answers.iter().filter(|answer| answer.is_ok()).count();
        assert_eq!(
            won, 1,
            "{what}: round {round}: exactly one of {REOPENS} reopens wins: {answers:?}"
        );
        for answer in &answers {
            match answer {
                Ok(()) => {}
                Err(Error::StaleGeneration { current, .. }) => assert_eq!(
                    *current,
                    round + 1,
                    "{what}: a losing reopen sees the winner's generation"
                ),
                Err(Error::InvalidState { state, .. }) => assert_eq!(
                    *state,
                    JobState::Queued,
                    "{what}: a losing reopen sees the job queued by the winner"
                ),
                Err(other) => panic!("{what}: a losing reopen failed otherwise: {other}"),
            }
        }
        let log = store.steps(id).await.must(what);
        assert_eq!(
            (log.generation, names(&log)),
            (round + 1, vec!["a"]),
            "{what}: round {round}: the job was reopened once"
        );
        assert_eq!(
            get(&store, id, what).await.state,
            JobState::Queued,
            "{what}: round {round}: the winner queued the job"
        );
    }
}
