use super::*;

/// Many enqueues of one key at once, from 16 stores over 4 pools of 4 connections, must agree
/// on one job: once for a fresh key, once for a key whose job vanished, once for a
/// key whose window has passed. The last two are where a snapshot-bound "is the job
/// still there" check would let a second racer replace the first one's new job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedup_race_across_connections_creates_one_job() {
    let mut backends = Vec::new();
    for _ in 0..4 {
        let Some(backend) = backend("durq-postgres-dedup-race", 4).await else {
            return;
        };
        backends.push(backend);
    }
    let clock = ManualClock::default();
    let settings = settings(&clock).dedup_window(Duration::from_secs(60));
    // Sixteen stores (each with its own queue of calls) over the four pools: sixteen
    // statements on the key at once, on sixteen connections.
    let stores: Vec<Store> = backends
        .iter()
        .cycle()
        .take(16)
        .map(|b| open(b, settings.clone()))
        .collect();

    let race = |round: &'static str| {
        let stores = stores.clone();
        async move {
            let mut set = JoinSet::new();
            for n in 0..32 {
                let store = stores[n % stores.len()].clone();
                set.spawn(async move {
                    let job = NewJob::new("race")
                        .tenant("t\0with nul")
                        .idempotency_key("the-key")
                        .payload(format!("racer {n}").into_bytes());
                    store.enqueue(job).await
                });
            }
            let answers: Vec<_> = join(set)
                .await
                .into_iter()
                .map(|answer| match answer {
                    Ok(answer) => answer,
                    Err(err) => panic!("{round}: enqueue failed: {err:?}"),
                })
                .collect();
            let ids: HashSet<JobId> = answers.iter().map(|a| a.id).collect();
            assert_eq!(ids.len(), 1, "{round}: racers got different ids: {ids:?}");
            let created = answers.iter().filter(|a| a.created).count();
            (answers[0].id, created)
        }
    };

    let (first, created) = race("fresh key").await;
    assert_eq!(created, 1, "fresh key: exactly one racer creates the job");
    let stats = stores[0].stats("race").await.expect("stats");
    assert_eq!(stats.total(), 1, "fresh key: exactly one job exists");

    backends[0]
        .vanish(&settings.namespace, first)
        .await
        .expect("vanish");
    let (second, created) = race("vanished job").await;
    assert_ne!(
        second, first,
        "vanished job: the key must point to a new job"
    );
    assert_eq!(
        created, 1,
        "vanished job: exactly one racer creates the job"
    );
    assert_eq!(stores[1].stats("race").await.expect("stats").total(), 1);

    clock.advance(Duration::from_secs(60));
    let (third, created) = race("window passed").await;
    assert_ne!(
        third, second,
        "window passed: the key must point to a new job"
    );
    assert_eq!(
        created, 1,
        "window passed: exactly one racer creates the job"
    );
    assert_eq!(stores[2].stats("race").await.expect("stats").total(), 2);

    // Exactly the two live jobs are claimable, once each.
    let request = ClaimRequest::new(["race"], "w", TTL).limit(10);
    let claimed = stores[3].claim(request).await.expect("claim");
    let claimed: HashSet<JobId> = claimed.iter().map(|c| c.id()).collect();
    assert_eq!(claimed, HashSet::from([second, third]));
    clean_up(&backends[0], &settings.namespace).await;
}

/// Killing every server connection of the store while calls are in flight: the calls
/// cut off fail with `Unavailable` and nothing else (or succeed, sent again by the
/// store), the pool and the wake-up listener reconnect, and every enqueue and
/// complete that was acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_side_connection_kill_is_unavailable_and_loses_nothing() {
    let app = unique_name("jobs_kill");
    let Some(backend) = backend(&app, 4).await else {
        return;
    };
    let admin = match PgPoolOptions::new()
        .max_connections(1)
        .connect(&url())
        .await
    {
        Ok(pool) => pool,
        Err(err) => panic!("admin connection: {err}"),
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));

    // A waiter, so the listener connection is among those killed.
    store
        .wait_for_work(&["idle".to_owned()], Duration::ZERO)
        .await
        .expect("start the listener");

    let enqueued = Arc::new(Mutex::new(Vec::<JobId>::new()));
    let completed = Arc::new(Mutex::new(Vec::<JobId>::new()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let unavailable = Arc::new(AtomicU64::new(0));
    let successes = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Notify::new());
    let stop = Arc::new(AtomicU64::new(0));

    let mut workers = JoinSet::new();
    for w in 0..8 {
        let store = store.clone();
        let (enqueued, completed, failures) = (
            Arc::clone(&enqueued),
            Arc::clone(&completed),
            Arc::clone(&failures),
        );
        let (unavailable, successes, progress, stop) = (
            Arc::clone(&unavailable),
            Arc::clone(&successes),
            Arc::clone(&progress),
            Arc::clone(&stop),
        );
        workers.spawn(async move {
            let record = |result: Result<(), Error>| match result {
                Ok(()) => {
                    successes.fetch_add(1, Ordering::SeqCst);
                    progress.notify_waiters();
                }
                Err(err) if err.is_retryable() => {
                    if unavailable.fetch_add(1, Ordering::SeqCst) == 0 {
                        eprintln!("first call cut off: {err}");
                    }
                }
                Err(err) => failures
                    .lock()
                    .expect("lock")
                    .push(format!("{err} ({err:?})")),
            };
            while stop.load(Ordering::SeqCst) == 0 {
                let job = NewJob::new("kill").payload(format!("w{w}").into_bytes());
                match store.enqueue(job).await {
                    Ok(answer) => {
                        enqueued.lock().expect("lock").push(answer.id);
                        record(Ok(()));
                    }
                    Err(err) => record(Err(err)),
                }
                let request = ClaimRequest::new(["kill"], format!("w{w}"), TTL).limit(2);
                match store.claim(request).await {
                    Ok(jobs) => {
                        record(Ok(()));
                        for job in jobs {
                            match store.complete(job.id(), job.token(), None).await {
                                Ok(()) => {
                                    completed.lock().expect("lock").push(job.id());
                                    record(Ok(()));
                                }
                                Err(err) => record(Err(err)),
                            }
                        }
                    }
                    Err(err) => record(Err(err)),
                }
            }
        });
    }

    let wait_for = |target: u64| {
        let (successes, progress) = (Arc::clone(&successes), Arc::clone(&progress));
        async move {
            loop {
                let notified = progress.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if successes.load(Ordering::SeqCst) >= target {
                    return;
                }
                notified.await;
            }
        }
    };
    let guard = Duration::from_secs(60);
    for round in 1..=5u64 {
        if tokio::time::timeout(guard, wait_for(round * 150))
            .await
            .is_err()
        {
            panic!("round {round}: the store made no progress after a kill");
        }
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .expect("terminate backends");
        assert!(
            killed > 0,
            "round {round}: no connection of the store to kill"
        );
    }
    // Work goes on after the last kill: the pool has reconnected.
    if tokio::time::timeout(guard, wait_for(6 * 150 + 200))
        .await
        .is_err()
    {
        panic!("the store made no progress after the last kill");
    }
    stop.store(1, Ordering::SeqCst);
    join(workers).await;
    eprintln!(
        "{} calls succeeded, {} were cut off (Unavailable)",
        successes.load(Ordering::SeqCst),
        unavailable.load(Ordering::SeqCst)
    );

    let failures = failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "calls cut off by a kill must fail with Unavailable only: {failures:#?}"
    );
    // No count of interrupted calls is asserted: claims and completions that meet a
    // killed connection are sent again by the store and succeed (issue #11), so a
    // round may leave no error behind; only enqueues still report `Unavailable`.

    // Every acknowledged write is there.
    let enqueued = enqueued.lock().expect("lock").clone();
    let completed: HashSet<JobId> = completed.lock().expect("lock").iter().copied().collect();
    assert!(!completed.is_empty());
    for id in &enqueued {
        let job = store.get(*id).await.expect("an acknowledged enqueue");
        if completed.contains(id) {
            assert_eq!(
                job.state,
                JobState::Succeeded,
                "acknowledged complete of {id}"
            );
        }
    }

    // Later calls succeed, and wake-ups still arrive: the listener reconnected too.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_for_work(&["after".to_owned()], Duration::from_secs(120))
                .await
        })
    };
    let mut sent = 0;
    let woke = loop {
        store
            .enqueue(NewJob::new("after"))
            .await
            .expect("enqueue after the kills");
        sent += 1;
        if waiter.is_finished() || sent >= 50 {
            break tokio::time::timeout(guard, waiter).await;
        }
        tokio::task::yield_now().await;
    };
    assert!(
        matches!(woke, Ok(Ok(Ok(())))),
        "wait_for_work did not wake after the kills: {woke:?}"
    );
    clean_up(&backend, &store.settings().namespace).await;
}

/// Many processes connecting at once to a schema that does not exist yet: every one
/// succeeds, and the schema ends at the latest version, migrated once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_connects_migrate_a_fresh_schema_once() {
    let schema = unique_name("jobs_migrate");
    let Some(admin) = admin().await else {
        return;
    };
    let mut set = JoinSet::new();
    for _ in 0..12 {
        let config = PostgresConfig::new(&url())
            .expect("url")
            .schema(schema.clone())
            .expect("schema")
            .max_connections(1);
        set.spawn(PostgresPool::connect(config));
    }
    let backends: Vec<PostgresPool> = join(set)
        .await
        .into_iter()
        .map(|b| b.expect("every concurrent connect succeeds"))
        .collect();
    let applied: Vec<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM \"{schema}\".migrations ORDER BY version"
    )))
    .fetch_all(&admin)
    .await
    .expect("read migrations");
    assert_eq!(
        applied,
        (1..=LATEST_VERSION).collect::<Vec<i32>>(),
        "each migration is applied exactly once"
    );
    for backend in &backends {
        assert_eq!(
            backend.schema_version().await.expect("version"),
            LATEST_VERSION
        );
    }

    // Migrations 2 onwards are safe to run again on a migrated schema with jobs (with
    // tags and a recorded attempt, a concurrency key, a saved step, a paused queue, a
    // queue with limits, and a worker) in it: forget that they ran, connect, and they
    // run once more.
    let clock = ManualClock::default();
    let store = open(&backends[0], settings(&clock));
    let needs = Needs::new().amount("gpu", 2).capability("fpga");
    let queued = store
        .enqueue(
            NewJob::new("q")
                .timeout(Duration::from_millis(1500))
                .needs(needs.clone())
                .locality("rack-1")
                .tag("k", "v"),
        )
        .await
        .expect("enqueue")
        .id;
    let released = store.enqueue(NewJob::new("r")).await.expect("enqueue").id;
    let held = store
        .claim(ClaimRequest::new(["r"], "w", TTL))
        .await
        .expect("claim");
    store
        .release(released, held[0].token())
        .await
        .expect("release");
    store.pause("held").await.expect("pause");
    let limits = durq_core::QueueLimits::new()
        .max_running_per_key(2)
        .fair_shares(true);
    store.set_limits("keyed", limits).await.expect("set limits");
    let keyed = store
        .enqueue(NewJob::new("keyed").concurrency_key("customer-7"))
        .await
        .expect("enqueue")
        .id;
    let worker = WorkerInfo::new("w-1", "host", 7, vec!["q".to_owned()], 3);
    store.register_worker(&worker).await.expect("register");
    let stepped = store.enqueue(NewJob::new("s")).await.expect("enqueue").id;
    let running = store
        .claim(ClaimRequest::new(["s"], "w", TTL))
        .await
        .expect("claim");
    store
        .save_step(
            stepped,
            running[0].token(),
            "a",
            durq_core::Bytes::from_static(b"1"),
        )
        .await
        .expect("save a step");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM \"{schema}\".migrations WHERE version >= 2"
    )))
    .execute(&admin)
    .await
    .expect("forget migrations 2 onwards");
    let config = PostgresConfig::new(&url())
        .expect("url")
        .schema(schema.clone())
        .expect("schema")
        .max_connections(1);
    let again = PostgresPool::connect(config).await.expect("migrate again");
    assert_eq!(
        again.schema_version().await.expect("version"),
        LATEST_VERSION
    );
    assert_eq!(
        store.paused_queues().await.expect("paused"),
        vec!["held".to_owned()],
        "kept"
    );
    let workers = store.workers().await.expect("workers");
    assert_eq!(
        workers.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        ["w-1"],
        "kept"
    );
    assert_eq!(store.limits("keyed").await.expect("limits"), limits, "kept");
    assert_eq!(
        store
            .get(keyed)
            .await
            .expect("get")
            .concurrency_key
            .as_deref(),
        Some("customer-7"),
        "kept"
    );
    let log = store.steps(stepped).await.expect("steps");
    assert_eq!(
        (
            log.generation,
            log.steps
                .iter()
                .map(|step| step.name.as_str())
                .collect::<Vec<_>>()
        ),
        (0, vec!["a"]),
        "kept"
    );
    let job = store.get(queued).await.expect("get");
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.timeout, Some(Duration::from_millis(1500)), "kept");
    assert_eq!(
        (job.needs, job.locality.as_deref()),
        (needs, Some("rack-1")),
        "kept"
    );
    assert_eq!(job.tags.get("k").map(String::as_str), Some("v"), "kept");
    let attempts = store.attempts(released).await.expect("attempts");
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        [AttemptOutcome::Released],
        "kept"
    );
    let locality: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pg_get_indexdef('\"{schema}\".jobs_ready_locality'::regclass)"
    )))
    .fetch_one(&admin)
    .await
    .expect("read the locality index");
    assert!(
        locality.ends_with("WHERE ((state = 'queued'::text) AND (placement ? 'l'::text))"),
        "{locality}"
    );
    let leases: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pg_get_indexdef('\"{schema}\".jobs_leases'::regclass)"
    )))
    .fetch_one(&admin)
    .await
    .expect("read the lease index");
    assert!(
        leases.ends_with("WHERE (lease_expires_at IS NOT NULL)"),
        "{leases}"
    );

    // The stores of the fresh schema work, and another schema's data is apart.
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let store = open(&backends[0], settings.clone());
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    assert_eq!(
        open(&backends[5], settings.clone())
            .get(id)
            .await
            .expect("get")
            .id,
        id
    );
    if let Some(default_schema) = backend("durq-postgres-migrate", 1).await {
        let other = open(&default_schema, settings);
        assert!(other.get(id).await.is_err_and(|e| e.is_not_found()));
    }

    drop(backends);
    drop_schema(&admin, &schema).await;
}

/// A schema an older build left at version 6, with jobs in it, takes migrations 7 to
/// 10: its jobs read back needing nothing and fit every budget, new jobs keep their
/// needs and locality, and workers register in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_7_upgrades_a_schema_with_jobs() {
    let schema = unique_name("jobs_upgrade");
    let Some(admin) = admin().await else {
        return;
    };
    let config = || schema_config(&schema);
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let before = PostgresPool::connect(config()).await.expect("migrate");
    let old = open(&before, settings.clone());
    let mut old_jobs = Vec::new();
    for priority in [0, 5] {
        let job = NewJob::new("q").priority(priority);
        old_jobs.push(old.enqueue(job).await.expect("enqueue").id);
    }
    drop(old);
    drop(before);
    // What migrations 7 to 10 add, taken away again: the schema as version 6 left it.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE \"{schema}\".attempts;
         DROP FUNCTION \"{schema}\".tags_json(text);
         ALTER TABLE \"{schema}\".jobs DROP COLUMN tags, DROP COLUMN trace_context;
         DROP TABLE \"{schema}\".workers;
         DROP INDEX \"{schema}\".jobs_ready_locality;
         DROP FUNCTION \"{schema}\".budget_admits(jsonb);
         DROP FUNCTION \"{schema}\".fence(boolean, boolean, uuid);
         ALTER TABLE \"{schema}\".jobs DROP COLUMN placement;
         DELETE FROM \"{schema}\".migrations WHERE version >= 7;"
    )))
    .execute(&admin)
    .await
    .expect("back to version 6");

    let upgraded = PostgresPool::connect(config()).await.expect("upgrade");
    assert_eq!(
        upgraded.schema_version().await.expect("version"),
        LATEST_VERSION
    );
    let store = open(&upgraded, settings);
    assert!(store.workers().await.expect("workers").is_empty());
    let worker = WorkerInfo::new("w", "host", 1, vec!["q".to_owned()], 1);
    store.register_worker(&worker).await.expect("register");
    assert_eq!(store.worker("w").await.expect("worker").concurrency, 1);
    for id in &old_jobs {
        let job = store.get(*id).await.expect("get");
        assert_eq!((job.needs, job.locality), (Needs::new(), None), "old job");
    }
    let big = store
        .enqueue(
            NewJob::new("q")
                .priority(9)
                .needs(Needs::new().amount("gpu", 4).capability("fpga"))
                .locality("here"),
        )
        .await
        .expect("enqueue")
        .id;
    let small = ClaimRequest::new(["q"], "w", TTL)
        .limit(10)
        .budget(Budget::new().amount("gpu", 1))
        .prefer(["here"]);
    let claimed: Vec<JobId> = store
        .claim(small)
        .await
        .expect("claim")
        .iter()
        .map(|job| job.id())
        .collect();
    assert_eq!(
        claimed,
        vec![old_jobs[1], old_jobs[0]],
        "old jobs fit every budget"
    );
    let fitting = ClaimRequest::new(["q"], "w", TTL)
        .budget(Budget::new().amount("gpu", 4).capability("fpga"));
    let claimed = store.claim(fitting).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), big);
    assert_eq!(claimed[0].job.locality.as_deref(), Some("here"));

    drop(store);
    drop(upgraded);
    drop_schema(&admin, &schema).await;
}

/// A schema an older build left at version 9, with jobs queued, running and done in
/// it, takes migration 10 in place: its jobs read back without tags or trace context,
/// a lease taken before the upgrade is the running attempt and its failure is recorded
/// after it, a job the older build completed (clearing the worker, as it did) shows no
/// attempt rather than a wrong one, and new jobs carry tags the list filters by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_10_upgrades_a_schema_with_jobs_in_flight() {
    let Some(admin) = admin().await else {
        return;
    };
    let JobsInFlight {
        schema,
        clock,
        settings,
        queued,
        running,
        done,
        started,
        running_token,
        ..
    } = JobsInFlight::new("jobs_upgrade10").await;
    // The schema as a build of version 9 left it: without migration 10, and with the
    // worker of the completed job cleared, as that build's completions did.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE \"{schema}\".attempts;
         DROP FUNCTION \"{schema}\".tags_json(text);
         ALTER TABLE \"{schema}\".jobs DROP COLUMN tags, DROP COLUMN trace_context;
         UPDATE \"{schema}\".jobs SET lease_worker = NULL WHERE state = 'succeeded';
         DELETE FROM \"{schema}\".migrations WHERE version >= 10;"
    )))
    .execute(&admin)
    .await
    .expect("back to version 9");

    let upgraded = PostgresPool::connect(schema_config(&schema))
        .await
        .expect("upgrade");
    assert_eq!(
        upgraded.schema_version().await.expect("version"),
        LATEST_VERSION
    );
    let store = open(&upgraded, settings);
    for id in [queued, running, done] {
        let job = store.get(id).await.expect("get");
        assert!(
            job.tags.is_empty() && job.trace_context.is_none(),
            "{job:?}"
        );
    }
    assert!(store.attempts(queued).await.expect("attempts").is_empty());
    assert!(
        store.attempts(done).await.expect("attempts").is_empty(),
        "no worker was kept, so no succeeded attempt is made up"
    );
    let attempts = store.attempts(running).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.worker.as_str(), a.started_at, a.outcome))
            .collect::<Vec<_>>(),
        [("w-old", started, AttemptOutcome::Running)]
    );
    clock.advance(Duration::from_millis(3));
    store
        .fail(running, running_token, "after the upgrade", Retry::Never)
        .await
        .expect("the lease of before the upgrade still holds");
    let attempts = store.attempts(running).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.outcome, a.error.as_deref(), a.ended_at))
            .collect::<Vec<_>>(),
        [(
            AttemptOutcome::Failed,
            Some("after the upgrade"),
            Some(clock.now())
        )]
    );
    let tagged = store
        .enqueue(NewJob::new("q").tag("k", "v"))
        .await
        .expect("enqueue")
        .id;
    let listed = store
        .list(ListQuery::all().tag("k", "v"))
        .await
        .expect("list");
    assert_eq!(
        listed.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [tagged]
    );

    drop(store);
    drop(upgraded);
    drop_schema(&admin, &schema).await;
}

/// A plain claim of one queue is planned once per connection and limit, not at every
/// run: after the server's five custom plans, it keeps the generic one. (Its limit is
/// written into its text; with the limit a parameter, every claim was planned again,
/// which cost about as much as running it.) The claims still take the jobs in order.
#[tokio::test]
async fn a_one_queue_claim_keeps_its_generic_plan() {
    let Some(backend) = backend("generic-plan", 1).await else {
        return;
    };
    let clock = ManualClock::new(durq_core::Timestamp::from_millis(1_000_000));
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let jobs: Vec<_> = (0..4 * 12).map(|_| NewJob::new("plan")).collect();
    let ids: Vec<JobId> = store
        .enqueue_batch(jobs)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|enqueued| enqueued.id)
        .collect();
    let mut claimed = Vec::new();
    for _ in 0..12 {
        let request = ClaimRequest::new(["plan"], "w", TTL).limit(4);
        let jobs = store.claim(request).await.expect("claim");
        assert_eq!(jobs.len(), 4);
        claimed.extend(jobs.into_iter().map(|job| job.job.id));
    }
    assert_eq!(claimed, ids, "the claims took the jobs in enqueue order");
    // The pool has one connection: the one the claims ran on. New statistics (the
    // table's first `ANALYZE`) make the server plan again, and may restart its counts.
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements
         WHERE statement LIKE '%LIMIT 4%FOR UPDATE SKIP LOCKED%'",
    )
    .fetch_one(backend.pool())
    .await
    .expect("the claim is a prepared statement of the connection");
    assert!(
        generic >= 1 && custom <= 5,
        "generic plans {generic}, custom plans {custom}"
    );
    clean_up(&backend, &namespace).await;
}
