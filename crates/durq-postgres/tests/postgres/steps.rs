//! Durable steps on PostgreSQL (CONTRACT D1–D4, migration 14): reopens racing across
//! pools, saves racing for the last places and for the job's row, what purge and
//! `drop_namespace` leave of the steps table, and the upgrade of a schema at version 13.

use super::*;
use durq_core::{Bytes, StepLog};

/// The step rows of `namespace` in the default schema, as (job, name), read from the
/// table itself.
async fn step_rows(backend: &PostgresPool, namespace: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT job::text, name FROM jobs.steps WHERE namespace = $1 ORDER BY job, seq")
        .bind(namespace)
        .fetch_all(backend.pool())
        .await
        .expect("read the step rows")
}

fn names(log: &StepLog) -> Vec<&str> {
    log.steps.iter().map(|step| step.name.as_str()).collect()
}

/// A job of queue `queue`, claimed, that saved `steps` (each output `out-` and its
/// name); answers its id and lease token.
async fn job_with_steps(store: &Store, queue: &'static str, steps: &[&str]) -> (JobId, LeaseToken) {
    let id = store.enqueue(NewJob::new(queue)).await.expect("enqueue").id;
    let held = store
        .claim(ClaimRequest::new([queue], "w", TTL))
        .await
        .expect("claim");
    assert_eq!(held.len(), 1, "the job of {queue} is claimed");
    let token = held[0].token();
    for name in steps {
        store
            .save_step(id, token, name, Bytes::from(format!("out-{name}")))
            .await
            .expect("save a step");
    }
    (id, token)
}

/// CONTRACT D4 across processes: 16 handles, each on a pool (and so a connection) of
/// its own, reopen one succeeded job at the same generation at once. The row lock lets
/// exactly one through; each of the others reads the job after it, queued, and is
/// refused as not ended. The job is queued once, its generation one more and its steps
/// cut once; the run from before the reopen can no longer save.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_sixteen_reopens_across_pools_exactly_one_wins() {
    const HANDLES: usize = 16;
    let Some(first) = backend("durq-postgres-steps-reopen", 1).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&first, settings.clone());
    let (id, old_token) = job_with_steps(&store, "reopen", &["a", "b", "c"]).await;
    store.complete(id, old_token, None).await.expect("complete");
    let history = store.attempts(id).await.expect("attempts");
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        [AttemptOutcome::Succeeded]
    );
    clock.advance(Duration::from_millis(5));

    let mut pools = vec![first];
    for _ in 1..HANDLES {
        let Some(pool) = backend("durq-postgres-steps-reopen", 1).await else {
            return;
        };
        pools.push(pool);
    }
    let start = Arc::new(tokio::sync::Barrier::new(HANDLES));
    let mut set = JoinSet::new();
    for pool in &pools {
        let handle = open(pool, settings.clone());
        let start = Arc::clone(&start);
        set.spawn(async move {
            // Each connection is open and the statements prepared before the race.
            let seen = handle.steps(id).await.expect("read the steps");
            assert_eq!(seen.generation, 0);
            start.wait().await;
            handle.retry_from(id, "b", 0).await
        });
    }
    let answers = join(set).await;
    let mut told: Vec<String> = answers
        .iter()
        .map(|answer| match answer {
            Ok(()) => "reopened".to_owned(),
            Err(Error::InvalidState {
                state, operation, ..
            }) => format!("{operation}: {state}"),
            Err(other) => format!("{other}"),
        })
        .collect();
    told.sort();
    let mut expected = vec!["retry_from: queued".to_owned(); HANDLES - 1];
    expected.insert(0, "reopened".to_owned());
    assert_eq!(told, expected, "{answers:?}");

    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]), "cut once");
    let job = store.get(id).await.expect("get");
    assert_eq!(
        (
            job.state,
            job.attempts,
            job.run_at,
            job.finished_at,
            job.result
        ),
        (JobState::Queued, 0, clock.now(), None, None),
        "queued as a retry queues it"
    );
    assert_eq!(
        store.attempts(id).await.expect("attempts"),
        history,
        "the attempt that succeeded is kept (recorded once)"
    );
    assert!(
        store
            .save_step(id, old_token, "late", Bytes::from_static(b"x"))
            .await
            .is_err_and(|err| matches!(err, Error::LeaseLost { .. })),
        "the run from before the reopen cannot save"
    );
    let claimed = store
        .claim(ClaimRequest::new(["reopen"], "w", TTL).limit(10))
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|job| job.id()).collect::<Vec<_>>(),
        [id],
        "queued once"
    );
    assert!(claimed[0].token().get() > old_token.get());
    store
        .save_step(id, claimed[0].token(), "b", Bytes::from_static(b"again"))
        .await
        .expect("the new run saves");
    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a", "b"]));
    assert_eq!(log.steps[1].output, Bytes::from_static(b"again"));

    drop(store);
    clean_up(&pools[0], &namespace).await;
}

/// CONTRACT A5 with D1–D4: purge deletes a purged job's step rows in its statement,
/// and only that job's; `drop_namespace` deletes every step row of the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_the_steps_of_the_jobs_it_deletes() {
    let Some(backend) = backend("durq-postgres-steps-purge", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock).retention(Duration::from_secs(60));
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let (done, token) = job_with_steps(&store, "purged", &["a", "b"]).await;
    store.complete(done, token, None).await.expect("complete");
    let (running, _) = job_with_steps(&store, "kept", &["x"]).await;
    assert_eq!(step_rows(&backend, &namespace).await.len(), 3);

    clock.advance(Duration::from_secs(60));
    assert_eq!(store.purge(10).await.expect("purge"), 1);
    assert_eq!(
        step_rows(&backend, &namespace).await,
        [(running.to_string(), "x".to_owned())],
        "the purged job's steps went with it, and only those"
    );
    assert!(store.steps(done).await.is_err_and(|e| e.is_not_found()));

    clean_up(&backend, &namespace).await;
    assert!(
        step_rows(&backend, &namespace).await.is_empty(),
        "drop_namespace deletes the namespace's steps"
    );
}

/// CONTRACT D1: the first save of a name stands, a stale token is `LeaseLost`, an
/// unknown job `NotFound`. And the limit of `MAX_STEPS` holds when saves race for the
/// last places: each save takes the job's row lock and counts with a fresh snapshot,
/// so of 20 saves for the last 10 places exactly 10 are stored, whatever the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn saves_racing_for_the_last_places_store_exactly_as_many() {
    const RACERS: usize = 20;
    const FREE: usize = 10;
    let Some(backend) = backend("durq-postgres-steps-limit", RACERS as u32).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let (id, token) = job_with_steps(&store, "limit", &["first"]).await;

    store
        .save_step(id, token, "first", Bytes::from_static(b"second"))
        .await
        .expect("saving a name again succeeds");
    let log = store.steps(id).await.expect("steps");
    assert_eq!(
        log.steps[0].output,
        Bytes::from("out-first"),
        "the first stands"
    );
    let stale = LeaseToken::new(token.get() + 1);
    assert!(store
        .save_step(id, stale, "s", Bytes::new())
        .await
        .is_err_and(|e| matches!(e, Error::LeaseLost { .. })));
    let unknown = JobId::mint(clock.now());
    assert!(store
        .save_step(unknown, token, "s", Bytes::new())
        .await
        .is_err_and(|e| e.is_not_found()));

    // The places before the last ten, filled at once.
    let filled = durq_core::steps::MAX_STEPS - FREE - 1;
    sqlx::query(
        "INSERT INTO jobs.steps (namespace, job, name, output, saved_at)
         SELECT $1, $2::text::uuid, 'filled-' || g, '\\x'::bytea, 0
         FROM generate_series(1, $3::int) g",
    )
    .bind(&namespace)
    .bind(id.to_string())
    .bind(i32::try_from(filled).expect("fits"))
    .execute(backend.pool())
    .await
    .expect("fill the steps");

    let start = Arc::new(tokio::sync::Barrier::new(RACERS));
    let mut set = JoinSet::new();
    for racer in 0..RACERS {
        let store = store.clone();
        let start = Arc::clone(&start);
        set.spawn(async move {
            start.wait().await;
            store
                .save_step(id, token, &format!("racer-{racer}"), Bytes::new())
                .await
        });
    }
    let answers = join(set).await;
    let stored = answers.iter().filter(|answer| answer.is_ok()).count();
    let refused = answers
        .iter()
        .filter(|answer| {
            answer
                .as_ref()
                .is_err_and(|err| err.invalid_field() == Some("step"))
        })
        .count();
    assert_eq!((stored, refused), (FREE, RACERS - FREE), "{answers:?}");
    let log = store.steps(id).await.expect("steps");
    assert_eq!(log.steps.len(), durq_core::steps::MAX_STEPS);
    store
        .save_step(id, token, "first", Bytes::new())
        .await
        .expect("a full job still takes a name it saved: the save changes nothing");

    clean_up(&backend, &namespace).await;
}

/// CONTRACT D1 against an ending in flight: a save that waits for the row lock of a
/// completion (in the caller's transaction, T3) finds the lease gone once the
/// completion commits, and stores nothing. A save whose test ran before the wait would
/// have written its step into a job that had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_save_that_waited_for_a_completion_finds_the_lease_gone() {
    const APP: &str = "durq-postgres-steps-fence";
    let (Some(backend), Some(admin)) = (backend(APP, 2).await, admin().await) else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings.clone());
    let (id, token) = job_with_steps(&store, "fence", &["a"]).await;

    let mut holder = backend.pool().begin().await.expect("begin");
    let _completed = backend
        .backend(settings)
        .expect("backend")
        .complete_in(&mut holder, id, token, None)
        .await
        .expect("complete in the transaction");
    let save = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .save_step(id, token, "late", Bytes::from_static(b"x"))
                .await
        })
    };
    until_waiting_for_a_lock(&admin, APP).await;
    holder.commit().await.expect("commit the completion");
    let answer = save.await.expect("the save's task");
    assert!(matches!(answer, Err(Error::LeaseLost { .. })), "{answer:?}");
    let log = store.steps(id).await.expect("steps");
    assert_eq!(names(&log), ["a"]);

    clean_up(&backend, &namespace).await;
}

/// CONTRACT D3: a reopen that waited for the job's row reads the steps as they are
/// once it holds it, not as they were when it started: here a transaction holding the
/// row commits one more step (written by hand, as a save committed at that moment
/// would be), and the reopen from `b` cuts it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopen_that_waited_for_the_row_cuts_the_steps_committed_meanwhile() {
    const APP: &str = "durq-postgres-steps-reopen-wait";
    let (Some(backend), Some(admin)) = (backend(APP, 2).await, admin().await) else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let (id, token) = job_with_steps(&store, "wait", &["a", "b"]).await;
    store.complete(id, token, None).await.expect("complete");

    let mut holder = backend.pool().begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM jobs.jobs WHERE namespace = $1 AND id = $2::text::uuid FOR UPDATE")
        .bind(&namespace)
        .bind(id.to_string())
        .execute(&mut *holder)
        .await
        .expect("hold the job's row");
    let reopen = {
        let store = store.clone();
        tokio::spawn(async move { store.retry_from(id, "b", 0).await })
    };
    until_waiting_for_a_lock(&admin, APP).await;
    sqlx::query(
        "INSERT INTO jobs.steps (namespace, job, name, output, saved_at)
         VALUES ($1, $2::text::uuid, 'c', '\\x'::bytea, 0)",
    )
    .bind(&namespace)
    .bind(id.to_string())
    .execute(&mut *holder)
    .await
    .expect("one more step");
    holder.commit().await.expect("commit");
    reopen
        .await
        .expect("the reopen's task")
        .expect("the reopen");
    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]));

    clean_up(&backend, &namespace).await;
}

/// A schema an older build left at version 13, with jobs queued, running and done in
/// it, takes migration 14 in place: every job reads back at generation 0 with no
/// steps, a lease taken before the upgrade saves steps after it, and the job reopens
/// from one, its succeeded attempt recorded (the outcome check now admits it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_14_upgrades_a_schema_with_jobs_in_flight() {
    let Some(admin) = admin().await else {
        return;
    };
    let JobsInFlight {
        schema,
        settings,
        queued,
        running,
        done,
        running_token,
        ..
    } = JobsInFlight::new("jobs_upgrade14").await;
    // The schema as a build of version 13 left it.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP FUNCTION \"{schema}\".step_fits(text, uuid, text, bigint);
         DROP TABLE \"{schema}\".steps;
         ALTER TABLE \"{schema}\".attempts DROP CONSTRAINT attempts_outcome_check;
         ALTER TABLE \"{schema}\".attempts ADD CONSTRAINT attempts_outcome_check
             CHECK (outcome IN ('failed', 'released', 'expired'));
         ALTER TABLE \"{schema}\".jobs DROP COLUMN generation;
         DELETE FROM \"{schema}\".migrations WHERE version >= 14;"
    )))
    .execute(&admin)
    .await
    .expect("back to version 13");

    let upgraded = PostgresPool::connect(schema_config(&schema))
        .await
        .expect("upgrade");
    assert_eq!(
        upgraded.schema_version().await.expect("version"),
        LATEST_VERSION
    );
    let store = open(&upgraded, settings);
    for id in [queued, running, done] {
        assert_eq!(
            store.steps(id).await.expect("steps"),
            StepLog::default(),
            "generation 0, no steps"
        );
    }
    assert!(
        store
            .retry_from(done, "a", 0)
            .await
            .is_err_and(|e| e.invalid_field() == Some("step")),
        "no step was saved before the upgrade"
    );
    let token = running_token;
    store
        .save_step(running, token, "a", Bytes::from_static(b"1"))
        .await
        .expect("the lease of before the upgrade saves");
    store
        .save_step(running, token, "b", Bytes::from_static(b"2"))
        .await
        .expect("save");
    store
        .complete(running, token, None)
        .await
        .expect("complete");
    store
        .retry_from(running, "b", 0)
        .await
        .expect("reopen from b");
    let log = store.steps(running).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]));
    assert_eq!(
        store.get(running).await.expect("get").state,
        JobState::Queued
    );
    assert_eq!(
        store
            .attempts(running)
            .await
            .expect("attempts")
            .iter()
            .map(|a| (a.worker.as_str(), a.outcome))
            .collect::<Vec<_>>(),
        [("w-old", AttemptOutcome::Succeeded)],
        "the attempt that succeeded is recorded under the widened check"
    );

    drop(store);
    drop(upgraded);
    drop_schema(&admin, &schema).await;
}
