//! Rules G1–G5: jobs that wait for jobs. Each scenario skips, saying so, on a store
//! whose `Capabilities::dependencies` is false, after checking that such a store
//! refuses a job with dependencies and writes nothing.

use std::sync::Arc;
use std::time::Duration;

use durq_core::graph::{failed_dependency, Dependency, DependencyFailure};
use durq_core::{Clock, JobId, JobState, NewJob, QueueStats, Retry, Store};
use tokio::sync::Barrier;

use super::support::{
    assert_nothing_claimable, assert_stats, claim, claim_expecting, enqueue, expect_invalid, get,
    ids_of, join_all, list_all, Must, TTL,
};
use crate::{Harness, TestEnv};

/// Whether the store keeps dependencies. One that does not must refuse a job that has
/// some, naming `depends_on`, and write nothing: the scenario then skips.
async fn keeps_dependencies(store: &Store, what: &str) -> bool {
    if store.capabilities().dependencies {
        return true;
    }
    let dependency = enqueue(store, NewJob::new("g-refused"), what).await;
    expect_invalid(
        store
            .enqueue(NewJob::new("g-refused").after(dependency))
            .await,
        "depends_on",
        what,
    );
    let listed = list_all(store, "g-refused", None, what).await;
    assert_eq!(
        listed.len(),
        1,
        "{what}: a refused job with dependencies must write nothing"
    );
    eprintln!("{what} skipped: the store does not keep dependencies (Capabilities::dependencies)");
    false
}

/// Claims `id`, which must be the one job ready on `queue`, and completes it.
async fn run_to_success(store: &Store, queue: &str, id: JobId, what: &str) {
    let claimed = claim_expecting(store, queue, id, what).await;
    store.complete(id, claimed.token(), None).await.must(what);
}

/// G1: a job waits, unclaimable and shown `waiting`, until every job it waits for has
/// succeeded; then it is queued, ready now. A dependency that has already succeeded is
/// met from the start, and a job named twice is waited for once.
pub async fn g1_a_job_waits_until_every_dependency_succeeded(harness: &dyn Harness) {
    let what = "G1";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let first = enqueue(&store, NewJob::new("g-deps"), what).await;
    let second = enqueue(&store, NewJob::new("g-deps"), what).await;
    let fan_in = enqueue(
        &store,
        NewJob::new("g-fan-in")
            .after(first)
            .after(second)
            .after(first),
        what,
    )
    .await;
    let waiting = get(&store, fan_in, what).await;
    assert_eq!(
        (waiting.state, waiting.depends_on.clone()),
        (JobState::Waiting, vec![first, second]),
        "{what}: a job with dependencies waits, and shows each dependency once, in order"
    );
    assert_eq!(
        waiting.on_dependency_failure,
        DependencyFailure::Cancel,
        "{what}: the default policy is cancel"
    );
    assert_stats(
        &store,
        "g-fan-in",
        QueueStats {
            waiting: 1,
            ..QueueStats::default()
        },
        what,
    )
    .await;
    let listed = list_all(&store, "g-fan-in", Some(JobState::Waiting), what).await;
    assert_eq!(
        listed.iter().map(|job| job.id).collect::<Vec<_>>(),
        vec![fan_in],
        "{what}: list filters by waiting"
    );
    assert_nothing_claimable(&store, &["g-fan-in"], "G1: a waiting job is not claimed").await;

    env.clock.advance(Duration::from_secs(1));
    let claimed = claim(&store, &["g-deps"], 1, what).await;
    assert_eq!(
        ids_of(&claimed),
        vec![first],
        "{what}: the first dependency runs first"
    );
    store
        .complete(first, claimed[0].token(), None)
        .await
        .must(what);
    assert_eq!(
        get(&store, fan_in, what).await.state,
        JobState::Waiting,
        "{what}: one dependency of two succeeded: the job still waits"
    );
    assert_nothing_claimable(&store, &["g-fan-in"], "G1: still waiting").await;

    env.clock.advance(Duration::from_secs(1));
    run_to_success(&store, "g-deps", second, what).await;
    let released = get(&store, fan_in, what).await;
    assert_eq!(
        (released.state, released.run_at),
        (JobState::Queued, env.clock.now()),
        "{what}: the last dependency's success queues the job, ready at that instant"
    );
    assert_stats(
        &store,
        "g-fan-in",
        QueueStats {
            ready: 1,
            ..QueueStats::default()
        },
        what,
    )
    .await;
    claim_expecting(&store, "g-fan-in", fan_in, what).await;

    // A dependency that already succeeded holds nothing back.
    let after_done = enqueue(&store, NewJob::new("g-late").after(first), what).await;
    assert_eq!(
        get(&store, after_done, what).await.state,
        JobState::Queued,
        "{what}: a job whose dependencies all succeeded already is queued at once"
    );
    claim_expecting(&store, "g-late", after_done, what).await;
}

/// G1: a dependency that does not exist is refused, naming `depends_on`, and nothing is
/// written: not the job, not the rest of its batch.
pub async fn g1_an_unknown_dependency_is_refused_and_writes_nothing(harness: &dyn Harness) {
    let what = "G1";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let never_stored = JobId::mint(env.clock.now());
    expect_invalid(
        store
            .enqueue(NewJob::new("g-unknown").after(never_stored))
            .await,
        "depends_on",
        what,
    );
    expect_invalid(
        store
            .enqueue_batch(vec![
                NewJob::new("g-unknown"),
                NewJob::new("g-unknown").after(Dependency::Earlier(0)),
                NewJob::new("g-unknown").after(never_stored),
            ])
            .await,
        "depends_on",
        what,
    );
    // One more than a job may wait for.
    let stored = enqueue(&store, NewJob::new("g-many"), what).await;
    let mut too_many = NewJob::new("g-unknown");
    for _ in 0..=durq_core::graph::MAX_DEPENDENCIES {
        too_many = too_many.after(stored);
    }
    expect_invalid(store.enqueue(too_many).await, "depends_on", what);
    assert!(
        list_all(&store, "g-unknown", None, what).await.is_empty(),
        "{what}: a refused enqueue or batch writes nothing"
    );
}

/// G1 (decided): a released job is ready at the instant it was released, so it queues
/// behind the jobs that were ready before it, at the same priority (C3).
pub async fn g1_a_released_job_queues_behind_the_ready_jobs(harness: &dyn Harness) {
    let what = "G1";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let dependency = enqueue(&store, NewJob::new("g-dep"), what).await;
    let dependent = enqueue(&store, NewJob::new("g-order").after(dependency), what).await;
    let ready_first = enqueue(&store, NewJob::new("g-order"), what).await;
    // Same instant for everything: only the order of becoming ready tells them apart.
    run_to_success(&store, "g-dep", dependency, what).await;
    let ready_after = enqueue(&store, NewJob::new("g-order"), what).await;
    let claimed = claim(&store, &["g-order"], 10, what).await;
    assert_eq!(
        ids_of(&claimed),
        vec![ready_first, dependent, ready_after],
        "{what}: a released job queues behind the jobs ready before it, ahead of later ones"
    );
}

/// G2: a batch enqueues a whole graph (charge, then an e-mail and an invoice, then a
/// report waiting for both), which runs in its order. A job naming itself or a later
/// job, or a batch index outside a batch, is refused and writes nothing; an earlier
/// job answered by its key is waited for as the job the key names.
pub async fn g2_a_batch_enqueues_a_graph_at_once(harness: &dyn Harness) {
    let what = "G2";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let answers = store
        .enqueue_batch(vec![
            NewJob::new("g-charge"),
            NewJob::new("g-notify").after(Dependency::Earlier(0)),
            NewJob::new("g-notify").after(Dependency::Earlier(0)),
            NewJob::new("g-report")
                .after(Dependency::Earlier(1))
                .after(Dependency::Earlier(2)),
        ])
        .await
        .must(what);
    let ids: Vec<JobId> = answers.iter().map(|answer| answer.id).collect();
    let (charge, email, invoice, report) = (ids[0], ids[1], ids[2], ids[3]);
    let states = |jobs: Vec<durq_core::Job>| jobs.iter().map(|j| j.state).collect::<Vec<_>>();
    let mut read = Vec::new();
    for id in &ids {
        read.push(get(&store, *id, what).await);
    }
    assert_eq!(
        states(read.clone()),
        vec![
            JobState::Queued,
            JobState::Waiting,
            JobState::Waiting,
            JobState::Waiting
        ],
        "{what}: the batch's graph is stored whole: its root queued, the rest waiting"
    );
    assert_eq!(
        read[3].depends_on,
        vec![email, invoice],
        "{what}: a batch index is stored as the id of the job it named"
    );
    run_to_success(&store, "g-charge", charge, what).await;
    let notified = claim(&store, &["g-notify"], 10, what).await;
    assert_eq!(
        ids_of(&notified),
        vec![email, invoice],
        "{what}: the fan-out runs once its root succeeded"
    );
    assert_nothing_claimable(&store, &["g-report"], "G2: the fan-in waits for both").await;
    for job in &notified {
        store.complete(job.id(), job.token(), None).await.must(what);
    }
    claim_expecting(&store, "g-report", report, what).await;

    // Cycles cannot be built: no forward or self reference, no index outside a batch.
    for batch in [
        vec![
            NewJob::new("g-cycle").after(Dependency::Earlier(1)),
            NewJob::new("g-cycle"),
        ],
        vec![NewJob::new("g-cycle").after(Dependency::Earlier(0))],
    ] {
        expect_invalid(store.enqueue_batch(batch).await, "depends_on", what);
    }
    expect_invalid(
        store
            .enqueue(NewJob::new("g-cycle").after(Dependency::Earlier(0)))
            .await,
        "depends_on",
        what,
    );
    assert!(
        list_all(&store, "g-cycle", None, what).await.is_empty(),
        "{what}: a refused graph writes nothing"
    );

    // An earlier job answered by its key is the job the key names.
    let keyed = enqueue(&store, NewJob::new("g-keyed").idempotency_key("k"), what).await;
    let answers = store
        .enqueue_batch(vec![
            NewJob::new("g-keyed").idempotency_key("k"),
            NewJob::new("g-keyed-after").after(Dependency::Earlier(0)),
        ])
        .await
        .must(what);
    assert_eq!(
        (answers[0].id, answers[0].created),
        (keyed, false),
        "{what}: the key answers its job"
    );
    let after = get(&store, answers[1].id, what).await;
    assert_eq!(
        (after.state, after.depends_on),
        (JobState::Waiting, vec![keyed]),
        "{what}: a job waiting for a deduplicated earlier job waits for the job its key names"
    );
}

/// G3: a dependency that ends dead cancels the jobs waiting for it (the default), and
/// the jobs waiting for those in turn, each naming why; a job with `run` counts it as
/// met. A dependency already failed when a job is enqueued settles it at once.
pub async fn g3_a_failed_dependency_cancels_its_dependents_in_turn(harness: &dyn Harness) {
    let what = "G3";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let root = enqueue(&store, NewJob::new("g-root"), what).await;
    let child = enqueue(&store, NewJob::new("g-child").after(root), what).await;
    let grandchild = enqueue(&store, NewJob::new("g-grandchild").after(child), what).await;
    let cleanup = enqueue(
        &store,
        NewJob::new("g-cleanup")
            .after(root)
            .on_dependency_failure(DependencyFailure::Run),
        what,
    )
    .await;
    env.clock.advance(Duration::from_secs(1));
    let claimed = claim_expecting(&store, "g-root", root, what).await;
    let state = store
        .fail(root, claimed.token(), "card declined", Retry::Never)
        .await
        .must(what);
    assert_eq!(state, JobState::Dead, "{what}: the root is dead");
    let now = env.clock.now();
    let child_job = get(&store, child, what).await;
    assert_eq!(
        (
            child_job.state,
            child_job.finished_at,
            child_job.last_error.as_deref()
        ),
        (
            JobState::Cancelled,
            Some(now),
            Some(failed_dependency(root, JobState::Dead).as_str())
        ),
        "{what}: a dependent that cancels is cancelled in the same step, naming why"
    );
    let grandchild_job = get(&store, grandchild, what).await;
    assert_eq!(
        (grandchild_job.state, grandchild_job.last_error.as_deref()),
        (
            JobState::Cancelled,
            Some(failed_dependency(child, JobState::Cancelled).as_str())
        ),
        "{what}: the cancellation goes on to the jobs waiting for the cancelled one"
    );
    assert_eq!(
        get(&store, cleanup, what).await.state,
        JobState::Queued,
        "{what}: a job with `run` counts the failed dependency as met"
    );
    claim_expecting(&store, "g-cleanup", cleanup, what).await;
    assert_nothing_claimable(
        &store,
        &["g-child", "g-grandchild"],
        "G3: cancelled dependents never run",
    )
    .await;

    // At the enqueue: a dependency already dead settles the new job at once.
    let late = enqueue(&store, NewJob::new("g-late").after(root), what).await;
    let late_job = get(&store, late, what).await;
    assert_eq!(
        (late_job.state, late_job.finished_at, late_job.last_error),
        (
            JobState::Cancelled,
            Some(now),
            Some(failed_dependency(root, JobState::Dead))
        ),
        "{what}: a job waiting for a dead job is cancelled at its enqueue"
    );
    let late_run = enqueue(
        &store,
        NewJob::new("g-late")
            .after(root)
            .on_dependency_failure(DependencyFailure::Run),
        what,
    )
    .await;
    assert_eq!(
        get(&store, late_run, what).await.state,
        JobState::Queued,
        "{what}: with `run`, a dead dependency is met at the enqueue too"
    );
}

/// G3: a dependency an operator cancels while it runs ends `cancelled` when its holder
/// gives it back, whichever call that is: released, it settles the jobs waiting for
/// it exactly as a failure does (the release ends it, so the release settles).
pub async fn g3_a_dependency_cancelled_while_running_settles_at_its_release(harness: &dyn Harness) {
    let what = "G3";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let root = enqueue(&store, NewJob::new("g-held"), what).await;
    let child = enqueue(&store, NewJob::new("g-held-child").after(root), what).await;
    let claimed = claim_expecting(&store, "g-held", root, what).await;
    assert_eq!(
        store.cancel(root).await.must(what),
        JobState::Running,
        "{what}: a running job is asked to stop"
    );
    store.release(root, claimed.token()).await.must(what);
    assert_eq!(
        get(&store, root, what).await.state,
        JobState::Cancelled,
        "{what}: a released cancel-requested job ends cancelled (A1)"
    );
    let child_job = get(&store, child, what).await;
    assert_eq!(
        (child_job.state, child_job.last_error),
        (
            JobState::Cancelled,
            Some(failed_dependency(root, JobState::Cancelled))
        ),
        "{what}: the release that ended it settled the job waiting for it"
    );
}

/// G4: an operator's cancel of a waiting job cancels it and settles the jobs waiting
/// for it; the success of what it waited for does not bring it back, and a retry
/// queues it waiting for nothing.
pub async fn g4_cancelling_a_waiting_job_settles_its_dependents(harness: &dyn Harness) {
    let what = "G4";
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let dependency = enqueue(&store, NewJob::new("g-dep"), what).await;
    let waiting = enqueue(&store, NewJob::new("g-waiting").after(dependency), what).await;
    let behind = enqueue(&store, NewJob::new("g-behind").after(waiting), what).await;
    env.clock.advance(Duration::from_secs(1));
    assert_eq!(
        store.cancel(waiting).await.must(what),
        JobState::Cancelled,
        "{what}: cancel of a waiting job answers cancelled"
    );
    let cancelled = get(&store, waiting, what).await;
    assert_eq!(
        (cancelled.state, cancelled.finished_at),
        (JobState::Cancelled, Some(env.clock.now())),
        "{what}: a cancelled waiting job is terminal, finished now"
    );
    assert_eq!(
        get(&store, behind, what).await.state,
        JobState::Cancelled,
        "{what}: the jobs waiting for a cancelled job are settled (G3)"
    );
    run_to_success(&store, "g-dep", dependency, what).await;
    assert_eq!(
        get(&store, waiting, what).await.state,
        JobState::Cancelled,
        "{what}: the success of what a cancelled job waited for does not bring it back"
    );
    assert_nothing_claimable(&store, &["g-waiting", "g-behind"], "G4").await;
    store.retry(behind).await.must(what);
    assert_eq!(
        get(&store, behind, what).await.state,
        JobState::Queued,
        "{what}: a retried job waits for nothing"
    );
    claim_expecting(&store, "g-behind", behind, what).await;
    // Reclaim and purge leave a waiting job alone.
    let holder = enqueue(&store, NewJob::new("g-holder"), what).await;
    let still = enqueue(&store, NewJob::new("g-still").after(holder), what).await;
    env.clock.advance(Duration::from_secs(400 * 24 * 3600));
    store.reclaim(1_000).await.must(what);
    store.purge(1_000).await.must(what);
    assert_eq!(
        get(&store, still, what).await.state,
        JobState::Waiting,
        "{what}: reclaim and retention never touch a waiting job"
    );
}

/// G5: the jobs a fan-in waits for, completed at once from several handles, release it
/// exactly once, after the last; jobs enqueued to wait for a job while it completes all
/// end up released. A claimer races the completions, and what it took is checked
/// against the states read after.
pub async fn g5_concurrent_endings_never_lose_a_release(harness: &dyn Harness) {
    let what = "G5";
    const FAN: usize = 16;
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let mut dependencies = Vec::with_capacity(FAN);
    for _ in 0..FAN {
        dependencies.push(enqueue(&store, NewJob::new("g-fan"), what).await);
    }
    let mut fan_in = NewJob::new("g-fan-in");
    for id in &dependencies {
        fan_in = fan_in.after(*id);
    }
    let fan_in = enqueue(&store, fan_in, what).await;
    let claimed = claim(&store, &["g-fan"], FAN, what).await;
    assert_eq!(claimed.len(), FAN, "{what}: every dependency is claimed");

    let barrier = Arc::new(Barrier::new(FAN + 1));
    let mut tasks = Vec::new();
    for job in claimed {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.complete(job.id(), job.token(), None).await.must(what);
        }));
    }
    // The claimer: it takes the fan-in as soon as it is released.
    let claimer = {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            let mut taken = Vec::new();
            for _ in 0..100_000 {
                let got = store
                    .claim(super::support::request(&["g-fan-in"], "g5", TTL, 10))
                    .await
                    .must(what);
                if !got.is_empty() {
                    taken.extend(ids_of(&got));
                    break;
                }
                tokio::task::yield_now().await;
            }
            taken
        })
    };
    join_all(tasks).await;
    let taken = join_all(vec![claimer]).await.remove(0);
    assert_eq!(
        taken,
        vec![fan_in],
        "{what}: the fan-in is released once and taken once"
    );
    for id in &dependencies {
        assert_eq!(
            get(&store, *id, what).await.state,
            JobState::Succeeded,
            "{what}: the fan-in was taken, so every dependency had succeeded"
        );
    }
    assert_nothing_claimable(&store, &["g-fan-in"], "G5: released exactly once").await;

    // Enqueues racing the end of what they wait for.
    let dependency = enqueue(&store, NewJob::new("g-race"), what).await;
    let lease = claim_expecting(&store, "g-race", dependency, what).await;
    let barrier = Arc::new(Barrier::new(FAN + 1));
    let mut enqueues = Vec::new();
    for _ in 0..FAN {
        let store = env.store().await;
        let barrier = Arc::clone(&barrier);
        enqueues.push(tokio::spawn(async move {
            barrier.wait().await;
            enqueue(&store, NewJob::new("g-raced").after(dependency), what).await
        }));
    }
    let completer = env.store().await;
    barrier.wait().await;
    completer
        .complete(dependency, lease.token(), None)
        .await
        .must(what);
    let raced = join_all(enqueues).await;
    for id in &raced {
        assert_eq!(
            get(&store, *id, what).await.state,
            JobState::Queued,
            "{what}: a job enqueued while its dependency ended waits for nothing ended"
        );
    }
    let drained = claim(&store, &["g-raced"], 100, what).await;
    assert_eq!(
        drained.len(),
        FAN,
        "{what}: every raced job is claimable once"
    );
}

/// E10 with G1 (decided under E10): a waiting job is active, so it holds a key unique
/// while active until it ends; once a failed dependency cancels it (G3) the key is
/// free and the next enqueue makes a new job.
pub async fn e10_a_waiting_job_holds_its_unique_key(harness: &dyn Harness) {
    let what = "E10 with G1";
    let env = TestEnv::new(harness);
    // A window of zero: the key holds by the job's state alone.
    let store = env
        .store_with(|settings| settings.dedup_window(Duration::ZERO))
        .await;
    if !keeps_dependencies(&store, what).await {
        return;
    }
    let dependency = enqueue(&store, NewJob::new("e10-deps"), what).await;
    let unique = || NewJob::new("e10-waits").unique_while_active("report");
    let waiting = store.enqueue(unique().after(dependency)).await.must(what);
    assert!(waiting.created, "{what}: the first enqueue makes the job");
    assert_eq!(
        get(&store, waiting.id, what).await.state,
        JobState::Waiting,
        "{what}: it waits"
    );
    let again = store.enqueue(unique()).await.must(what);
    assert_eq!(
        (again.id, again.created),
        (waiting.id, false),
        "{what}: a waiting job holds its key"
    );

    let held = claim_expecting(&store, "e10-deps", dependency, what).await;
    store
        .fail(dependency, held.token(), "boom", Retry::Never)
        .await
        .must(what);
    assert_eq!(
        get(&store, waiting.id, what).await.state,
        JobState::Cancelled,
        "{what}: its dependency died, so it is cancelled"
    );
    let after = store.enqueue(unique()).await.must(what);
    assert!(
        after.created && after.id != waiting.id,
        "{what}: a cancelled job frees its key"
    );
}
