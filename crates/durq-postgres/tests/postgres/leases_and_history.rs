use super::*;

/// CONTRACT H4, decided: a claim and a completion write no attempt row (the completion
/// keeps the worker on the job instead); `fail`, `release` and `reclaim` each write one,
/// in the transaction of the job's change of state. However often a job is claimed it
/// holds at most `ATTEMPTS_KEPT` rows, the newest; purge deletes them with the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_rows_are_written_only_when_a_lease_ends_off_the_hot_path() {
    let Some(backend) = backend("durq-postgres-attempts", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock).retention(Duration::from_secs(60));
    let ns = settings.namespace.clone();
    let store = open(&backend, settings);
    let claim_one = |queue: &'static str, ttl: Duration| {
        let store = store.clone();
        async move {
            let mut held = store
                .claim(ClaimRequest::new([queue], "w", ttl))
                .await
                .expect("claim");
            assert_eq!(held.len(), 1, "a job of {queue} is claimed");
            held.remove(0)
        }
    };

    let quick = store
        .enqueue(NewJob::new("quick"))
        .await
        .expect("enqueue")
        .id;
    let held = claim_one("quick", TTL).await;
    assert_eq!(attempt_rows(&backend, &ns).await, 0, "a claim writes none");
    clock.advance(Duration::from_millis(2));
    store
        .complete(quick, held.token(), None)
        .await
        .expect("complete");
    assert_eq!(
        attempt_rows(&backend, &ns).await,
        0,
        "a completion writes none"
    );
    let done = store.attempts(quick).await.expect("attempts");
    assert_eq!(
        done.iter()
            .map(|a| (a.worker.as_str(), a.outcome, a.ended_at))
            .collect::<Vec<_>>(),
        [("w", AttemptOutcome::Succeeded, Some(clock.now()))],
        "the job kept the worker of its last lease"
    );

    let busy = store
        .enqueue(NewJob::new("busy").max_attempts(1_000))
        .await
        .expect("enqueue")
        .id;
    let held = claim_one("busy", TTL).await;
    store
        .fail(busy, held.token(), "boom", Retry::At(clock.now()))
        .await
        .expect("fail");
    assert_eq!(attempt_rows(&backend, &ns).await, 1);
    assert_eq!(
        writers_of(&backend, &ns, busy).await,
        1,
        "fail: one statement"
    );
    let held = claim_one("busy", TTL).await;
    clock.advance(Duration::from_millis(1));
    store.release(busy, held.token()).await.expect("release");
    assert_eq!(attempt_rows(&backend, &ns).await, 2);
    assert_eq!(
        writers_of(&backend, &ns, busy).await,
        1,
        "release: one statement"
    );
    claim_one("busy", Duration::from_millis(10)).await;
    clock.advance(Duration::from_millis(11));
    assert_eq!(store.reclaim(10).await.expect("reclaim").len(), 1);
    assert_eq!(attempt_rows(&backend, &ns).await, 3);
    assert_eq!(
        writers_of(&backend, &ns, busy).await,
        1,
        "reclaim: one statement"
    );
    let expired = store.attempts(busy).await.expect("attempts");
    assert_eq!(
        expired
            .last()
            .map(|a| (a.outcome, a.error.as_deref(), a.ended_at)),
        Some((
            AttemptOutcome::Expired,
            Some(LEASE_EXPIRED),
            Some(clock.now())
        ))
    );

    // Slots wrap: the newest `ATTEMPTS_KEPT` stay, and no more rows than that.
    for _ in 0..40 {
        let held = claim_one("busy", TTL).await;
        clock.advance(Duration::from_millis(1));
        store.release(busy, held.token()).await.expect("release");
    }
    let kept = durq_core::ATTEMPTS_KEPT;
    assert_eq!(attempt_rows(&backend, &ns).await, kept as i64);
    let history = store.attempts(busy).await.expect("attempts");
    let tokens: Vec<u64> = history.iter().map(|a| a.token.get()).collect();
    assert_eq!(tokens, (43 - kept + 1..=43).collect::<Vec<u64>>());

    let held = claim_one("busy", TTL).await;
    store
        .fail(busy, held.token(), "the end", Retry::Never)
        .await
        .expect("fail");
    clock.advance(Duration::from_secs(60));
    assert_eq!(store.purge(10).await.expect("purge"), 2);
    assert_eq!(
        attempt_rows(&backend, &ns).await,
        0,
        "purge deletes the attempts with their job"
    );
    clean_up(&backend, &ns).await;
}

/// CONTRACT O2 on PostgreSQL: only the ending of a job someone waits for is announced
/// (the trigger's WHEN clause reads the row's `awaited` mark), with the payload the
/// wake hub expects; and a wait is answered by that notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_awaited_endings_are_announced() {
    let Some(backend) = backend("durq-postgres-awaited", 4).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let ns = settings.namespace.clone();
    let store = open(&backend, settings);
    let mut listener = sqlx::postgres::PgListener::connect_with(backend.pool())
        .await
        .expect("listener");
    listener
        .listen(&format!("{}.jobs_wake", backend.schema()))
        .await
        .expect("listen");

    let unawaited = store.enqueue(NewJob::new("aw")).await.expect("enqueue").id;
    let awaited = store.enqueue(NewJob::new("aw")).await.expect("enqueue").id;
    // A wait that times out at once still marks its job.
    assert!(store
        .wait(awaited, Duration::ZERO)
        .await
        .expect("wait")
        .is_none());
    let claimed = store
        .claim(ClaimRequest::new(["aw"], "w", TTL).limit(2))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let token = |id: JobId| {
        claimed
            .iter()
            .find(|c| c.id() == id)
            .map(|c| c.token())
            .expect("claimed")
    };
    store
        .complete(unawaited, token(unawaited), None)
        .await
        .expect("complete");
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.wait(awaited, Duration::from_secs(3600)).await })
    };
    store
        .complete(awaited, token(awaited), None)
        .await
        .expect("complete");
    // Notices arrive in commit order: a notice for the unawaited job would come first.
    let expected = format!("{ns}\n~{awaited}");
    loop {
        let notice = tokio::time::timeout(Duration::from_secs(30), listener.recv())
            .await
            .expect("a notice within 30 s")
            .expect("receive");
        assert_ne!(
            notice.payload(),
            format!("{ns}\n~{unawaited}"),
            "the ending of a job nobody waits for is not announced"
        );
        if notice.payload() == expected {
            break;
        }
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the wait is woken by the notice")
        .expect("join")
        .expect("wait")
        .expect("ended");
    assert_eq!(answer.state, JobState::Succeeded);
    clean_up(&backend, &ns).await;
}

/// CONTRACT O2 under a fault: a wait whose pool and listener the server kills answers
/// once the job ends. Whether the ending's notice reaches the new listener or is lost
/// while it reconnects is a race (the reconnection moves every watch for the second
/// case, so the wait reads its job again); either way the wait, which has no poll,
/// must answer well before its hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_outlives_its_listener_being_killed() {
    let app = "durq-postgres-wait-killed";
    let (Some(waiting), Some(sending), Some(admin)) = (
        backend(app, 2).await,
        backend("durq-postgres-wait-ender", 2).await,
        admin().await,
    ) else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let ns = settings.namespace.clone();
    let waiter = open(&waiting, settings.clone());
    let ender = open(&sending, settings);
    let id = ender
        .enqueue(NewJob::new("killed"))
        .await
        .expect("enqueue")
        .id;
    let claimed = ender
        .claim(ClaimRequest::new(["killed"], "w", TTL))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    let wait = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.wait(id, Duration::from_secs(3600)).await })
    };
    // Armed once the row carries the mark, which the wait writes after its listener
    // was started.
    let marked = format!(
        "SELECT coalesce(awaited, false) FROM \"{}\".jobs WHERE namespace = $1 AND id = $2",
        waiting.schema()
    );
    let mut armed = false;
    for _ in 0..10_000 {
        let awaited: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(marked.clone()))
            .bind(&ns)
            .bind(uuid::Uuid::from(id))
            .fetch_one(&admin)
            .await
            .expect("read the mark");
        if awaited {
            armed = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(armed, "the wait marks its job");
    assert!(
        terminate(&admin, app).await > 0,
        "the waiting pool's sessions"
    );
    ender
        .complete(id, claimed[0].token(), None)
        .await
        .expect("complete");
    let answer = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the wait answers after its listener came back")
        .expect("join")
        .expect("wait")
        .expect("ended");
    assert_eq!(answer.state, JobState::Succeeded);
    clean_up(&sending, &ns).await;
}

/// `wait_for_work` wakes on an enqueue made through another pool (the notice crosses
/// connections), and not only at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_for_work_wakes_on_enqueue_from_another_connection() {
    let Some(waiting) = backend("durq-postgres-wake", 2).await else {
        return;
    };
    let Some(sending) = backend("durq-postgres-wake", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let waiter_store = open(&waiting, settings.clone());
    let sender = open(&sending, settings);
    let queues = vec!["mail".to_owned()];
    // A worker's first wait starts the listener and returns at once (notices sent
    // before LISTEN are lost, so it must look); after that, waits block.
    waiter_store
        .wait_for_work(&queues, Duration::from_secs(30))
        .await
        .expect("start the listener");

    for round in 0..5 {
        // An empty claim first, as a worker does before it waits.
        let request = ClaimRequest::new(["mail"], "w", TTL).limit(10);
        assert!(waiter_store
            .claim(request.clone())
            .await
            .expect("claim")
            .is_empty());
        let waiter = {
            let store = waiter_store.clone();
            let queues = queues.clone();
            tokio::spawn(async move {
                let woke = store.wait_for_work(&queues, Duration::from_secs(300)).await;
                woke.map(|()| std::time::Instant::now())
            })
        };
        sender
            .enqueue(NewJob::new("mail").payload(vec![round]))
            .await
            .expect("enqueue");
        let acknowledged = std::time::Instant::now();
        let woke = tokio::time::timeout(Duration::from_secs(30), waiter).await;
        let Ok(Ok(Ok(woke_at))) = woke else {
            panic!("round {round}: no wake-up within 30 s of the enqueue: {woke:?}");
        };
        eprintln!(
            "round {round}: woke {:?} after the enqueue was acknowledged",
            woke_at.saturating_duration_since(acknowledged)
        );
        let claimed = waiter_store.claim(request).await.expect("claim");
        assert_eq!(
            claimed.len(),
            1,
            "round {round}: the woken worker finds the job"
        );
    }
    clean_up(&sending, &waiter_store.settings().namespace).await;
}

/// Concurrent single enqueues of one store share statements, yet each caller gets
/// its own answer: a job naming an unknown parent is refused alone, callers sharing a
/// key all get one job, and every other job is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gathered_enqueues_answer_each_caller() {
    let Some(backend) = backend("durq-postgres-enqueue", 4).await else {
        return;
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let parent = store
        .enqueue(NewJob::new("parents"))
        .await
        .expect("parent")
        .id;
    let unknown = JobId::mint(clock.now());

    let mut set = JoinSet::new();
    for n in 0..300usize {
        let store = store.clone();
        set.spawn(async move {
            let job = match n % 10 {
                0 => NewJob::new("gather").parent(unknown),
                1 => NewJob::new("gather").parent(parent),
                2 | 3 => NewJob::new("gather").idempotency_key(format!("k{}", n / 10)),
                _ => NewJob::new("gather"),
            };
            (n, store.enqueue(job).await)
        });
    }
    let answers = join(set).await;
    let mut by_key: std::collections::HashMap<usize, Vec<durq_core::Enqueued>> =
        std::collections::HashMap::new();
    for (n, answer) in answers {
        match n % 10 {
            0 => assert_eq!(
                answer.err().and_then(|e| e.invalid_field()),
                Some("parent"),
                "call {n}: an unknown parent is refused"
            ),
            2 | 3 => by_key
                .entry(n / 10)
                .or_default()
                .push(answer.expect("a keyed enqueue")),
            _ => assert!(answer.expect("a plain enqueue").created, "call {n}"),
        }
    }
    for (key, answers) in by_key {
        assert_eq!(answers[0].id, answers[1].id, "key {key}: one job");
        assert_eq!(
            answers.iter().filter(|a| a.created).count(),
            1,
            "key {key}: created once"
        );
    }
    let stats = store.stats("gather").await.expect("stats");
    // Of 300 calls: 30 refused, 30 children, 30 keys of two callers each, 180 plain.
    assert_eq!(stats.total(), 30 + 30 + 180, "{stats:?}");
    assert_eq!(store.children(parent).await.expect("children").len(), 30);
    clean_up(&backend, &store.settings().namespace).await;
}

/// Concurrent completes, gathered into batches, each get their own answer: the
/// holder's succeeds, a stale token is lease lost, an unknown id is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_completes_answer_each_caller() {
    let Some(backend) = backend("durq-postgres-complete", 4).await else {
        return;
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let jobs: Vec<NewJob> = (0..300u32)
        .map(|n| NewJob::new("batch").payload(n.to_be_bytes().to_vec()))
        .collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    let request = ClaimRequest::new(["batch"], "w", TTL).limit(300);
    let claimed = store.claim(request).await.expect("claim");
    assert_eq!(claimed.len(), 300);

    let mut set = JoinSet::new();
    for (n, job) in claimed.iter().enumerate() {
        let store = store.clone();
        let (id, token) = (job.id(), job.token());
        set.spawn(async move {
            let result = match n % 3 {
                0 => store.complete(id, token, Some(vec![n as u8].into())).await,
                1 => {
                    store
                        .complete(id, LeaseToken::new(token.get() + 1), None)
                        .await
                }
                _ => {
                    // The right call and a duplicate with the same token: one wins.
                    let (a, b) = tokio::join!(
                        store.complete(id, token, None),
                        store.complete(id, token, None)
                    );
                    assert!(
                        a.is_ok() != b.is_ok(),
                        "exactly one of two completes with one token wins: {a:?} {b:?}"
                    );
                    let loser = if a.is_ok() { b } else { a };
                    assert!(
                        matches!(&loser, Err(e) if e.is_lease_lost()),
                        "the loser is lease lost: {loser:?}"
                    );
                    Ok(())
                }
            };
            (n, id, result)
        });
    }
    let unknown = JobId::mint(clock.now());
    let unknown_answer = store.complete(unknown, LeaseToken::new(1), None).await;
    assert!(unknown_answer.is_err_and(|e| e.is_not_found()));

    for (n, id, result) in join(set).await {
        let job = store.get(id).await.expect("get");
        match n % 3 {
            0 => {
                assert!(result.is_ok(), "job {n}: {result:?}");
                assert_eq!(job.state, JobState::Succeeded);
                assert_eq!(job.result.as_deref(), Some(&[n as u8][..]));
            }
            1 => {
                assert!(result.is_err_and(|e| e.is_lease_lost()), "job {n}");
                assert_eq!(
                    job.state,
                    JobState::Running,
                    "a stale complete changes nothing"
                );
            }
            _ => assert_eq!(job.state, JobState::Succeeded),
        }
    }
    clean_up(&backend, &store.settings().namespace).await;
}

/// A row that does not decode is `Corrupt`, named by its job, and never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_rows_are_corrupt() {
    let Some(backend) = backend("durq-postgres-corrupt", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let store = open(&backend, settings.clone());
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;

    let damage = |sql: &'static str| {
        let pool = backend.pool().clone();
        let namespace = settings.namespace.clone();
        async move {
            sqlx::query(sql)
                .bind(namespace)
                .execute(&pool)
                .await
                .expect("damage the row");
        }
    };
    damage("UPDATE jobs.jobs SET attempts = -1 WHERE namespace = $1").await;
    let err = store.get(id).await.expect_err("a negative attempt count");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&id.to_string()), "{err}");

    damage("UPDATE jobs.jobs SET attempts = 0, tenant = '\\xff'::bytea WHERE namespace = $1").await;
    let err = store.get(id).await.expect_err("a tenant that is not UTF-8");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");

    damage("UPDATE jobs.jobs SET tenant = '', state = 'running' WHERE namespace = $1").await;
    let err = store
        .get(id)
        .await
        .expect_err("a running job without a lease");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let request = ClaimRequest::new(["q"], "w", TTL);
    assert!(store.claim(request).await.expect("claim").is_empty());

    // Needs and a locality that durq-core cannot read back.
    let placed = store
        .enqueue(NewJob::new("p").needs(Needs::new().amount("gpu", 1)))
        .await
        .expect("enqueue")
        .id;
    for bad in [r#"{"a":{"gpu":-1}}"#, r#"{"a":[1]}"#, r#"{"l":7}"#, "[]"] {
        let pool = backend.pool().clone();
        sqlx::query(
            "UPDATE jobs.jobs SET placement = $2::jsonb WHERE namespace = $1 AND queue = 'p'",
        )
        .bind(&settings.namespace)
        .bind(bad)
        .execute(&pool)
        .await
        .expect("damage the placement");
        let err = store.get(placed).await.expect_err(bad);
        assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err:?}");
        assert!(err.to_string().contains(&placed.to_string()), "{err}");
        let err = store
            .list(durq_core::ListQuery::new("p"))
            .await
            .expect_err(bad);
        assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err:?}");
    }

    // Tags and a trace context that durq-core cannot read back (E11, E12).
    let tagged = store
        .enqueue(NewJob::new("t").tag("k", "v"))
        .await
        .expect("enqueue")
        .id;
    let set = |column: &'static str, value: Option<&'static str>| {
        let pool = backend.pool().clone();
        let namespace = settings.namespace.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE jobs.jobs SET {column} = $2 WHERE namespace = $1 AND queue = 't'"
            )))
            .bind(namespace)
            .bind(value)
            .execute(&pool)
            .await
            .expect("damage the row");
        }
    };
    for bad in [
        "not json",
        "[1]",
        r#"{"k":1}"#,
        r#"{"bad key":"v"}"#,
        "{\"k\":\"a\\nb\"}",
    ] {
        set("tags", Some(bad)).await;
        let err = store.get(tagged).await.expect_err(bad);
        assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err:?}");
        assert!(err.to_string().contains(&tagged.to_string()), "{err}");
        let err = store.list(ListQuery::new("t")).await.expect_err(bad);
        assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err:?}");
    }
    // A tag filter does not hide tags that are not JSON: the row is listed, so its
    // decoding reports it, through every list statement.
    set("tags", Some("{not json")).await;
    for query in [
        ListQuery::all().tag("k", "v"),
        ListQuery::new("t").tag("k", "v"),
        ListQuery::all().queue_prefix("t").tag("k", "v"),
    ] {
        let err = store
            .list(query.clone())
            .await
            .expect_err("unreadable tags");
        assert!(matches!(err, Error::Corrupt { .. }), "{query:?}: {err:?}");
        assert!(err.to_string().contains(&tagged.to_string()), "{err}");
    }
    set("tags", Some(r#"{"k":"v"}"#)).await;
    assert_eq!(
        store
            .get(tagged)
            .await
            .expect("repaired")
            .tags
            .get("k")
            .map(String::as_str),
        Some("v")
    );
    set("trace_context", Some("00-not-a-traceparent")).await;
    let err = store.get(tagged).await.expect_err("a bad trace context");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    set("trace_context", None).await;

    // An attempt record that does not read back.
    let held = store
        .claim(ClaimRequest::new(["t"], "w", TTL))
        .await
        .expect("claim");
    store
        .release(tagged, held[0].token())
        .await
        .expect("release");
    assert_eq!(store.attempts(tagged).await.expect("attempts").len(), 1);
    sqlx::query("UPDATE jobs.attempts SET worker = '\\xff'::bytea WHERE namespace = $1")
        .bind(&settings.namespace)
        .execute(backend.pool())
        .await
        .expect("damage the attempt");
    let err = store
        .attempts(tagged)
        .await
        .expect_err("a worker that is not UTF-8");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&tagged.to_string()), "{err}");
    clean_up(&backend, &settings.namespace).await;
}

/// A worker's `in_flight` keeps every `u32`; a record that does not read back (a
/// negative or oversized `in_flight`, a spec that does not decode) is `Corrupt`,
/// named by its worker; `drop_namespace` deletes the namespace's workers and no
/// other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_records_keep_their_values_and_bad_ones_are_corrupt() {
    let Some(backend) = backend("durq-postgres-workers", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let (settings, other) = (settings(&clock), settings(&clock));
    let store = open(&backend, settings.clone());
    let neighbour = open(&backend, other.clone());
    let worker = WorkerInfo::new("w-1", "host", 1, vec!["q".to_owned()], 4);
    store.register_worker(&worker).await.expect("register");
    let theirs = WorkerInfo::new("w-2", "host", 2, vec!["q".to_owned()], 1);
    neighbour.register_worker(&theirs).await.expect("register");
    store
        .worker_heartbeat("w-1", u32::MAX)
        .await
        .expect("heartbeat");
    assert_eq!(
        store.worker("w-1").await.expect("worker").in_flight,
        u32::MAX
    );

    let damage = |sql: &'static str| {
        let pool = backend.pool().clone();
        let namespace = settings.namespace.clone();
        async move {
            sqlx::query(sql)
                .bind(namespace)
                .execute(&pool)
                .await
                .expect("damage the row");
        }
    };
    for bad in [
        "UPDATE jobs.workers SET in_flight = -1 WHERE namespace = $1",
        "UPDATE jobs.workers SET in_flight = 4294967296 WHERE namespace = $1",
        "UPDATE jobs.workers SET in_flight = 0, spec = '{' WHERE namespace = $1",
    ] {
        damage(bad).await;
        let err = store.workers().await.expect_err(bad);
        assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err:?}");
        assert!(err.to_string().contains("w-1"), "{bad}: {err}");
    }
    assert_eq!(neighbour.workers().await.expect("theirs").len(), 1);

    backend
        .drop_namespace(&settings.namespace)
        .await
        .expect("drop");
    assert!(store.workers().await.expect("workers").is_empty());
    assert_eq!(
        neighbour
            .workers()
            .await
            .expect("theirs")
            .iter()
            .map(|w| w.id.as_str())
            .collect::<Vec<_>>(),
        ["w-2"],
        "untouched"
    );
    clean_up(&backend, &other.namespace).await;
    assert!(neighbour.workers().await.expect("theirs").is_empty());
}

/// A server that cannot be reached is `Unavailable`, not a backend error.
#[tokio::test]
async fn unreachable_server_is_unavailable() {
    let config = PostgresConfig::new("postgres://postgres@127.0.0.1:1/test")
        .expect("url")
        .acquire_timeout(Duration::from_secs(2));
    let err = PostgresPool::connect(config)
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_retryable(), "{err:?}");
}

/// Bad configuration is refused with the field named.
#[test]
fn bad_configuration_names_the_field() {
    let field = |err: Error| err.invalid_field();
    assert_eq!(
        PostgresConfig::new("mysql://x").err().and_then(field),
        Some("url")
    );
    let config = PostgresConfig::new(DEFAULT_URL).expect("url");
    assert_eq!(
        config
            .schema("Robert'); DROP TABLE x")
            .err()
            .and_then(field),
        Some("schema")
    );
}

/// Issue #11: after the server terminated every connection of the store's pool, a
/// completion, a batch of completions and a batch of heartbeats each succeed (the
/// dead connection they draw is dropped and the statement sent again on a live one),
/// and what they did is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_survive_a_terminate_round_of_the_whole_pool() {
    let app = unique_name("jobs_round");
    let Some(backend) = backend(&app, 4).await else {
        return;
    };
    let Some(admin) = admin().await else { return };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let jobs = (0..5).map(|_| NewJob::new("round")).collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    let request = ClaimRequest::new(["round"], "w", TTL).limit(5);
    let claimed = store.claim(request).await.expect("claim");
    assert_eq!(claimed.len(), 5);

    let open = fill_pool(&backend).await;
    assert_eq!(terminate(&admin, &app).await, open as i64, "the whole pool");
    let (first, token) = (claimed[0].id(), claimed[0].token());
    store
        .complete(first, token, Some(b"done".to_vec().into()))
        .await
        .expect("a completion after a terminate round succeeds");
    let job = store.get(first).await.expect("get");
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result.as_deref(), Some(&b"done"[..]));

    let open = fill_pool(&backend).await;
    assert_eq!(terminate(&admin, &app).await, open as i64, "the whole pool");
    let batch = claimed[1..3]
        .iter()
        .map(|job| Completion::new(job.id(), job.token(), None))
        .collect();
    let answers = store
        .complete_batch(batch)
        .await
        .expect("a completion batch after a terminate round");
    for (job, answer) in claimed[1..3].iter().zip(answers) {
        assert!(answer.is_ok(), "job {}: {answer:?}", job.id());
        let job = store.get(job.id()).await.expect("get");
        assert_eq!(job.state, JobState::Succeeded);
    }
    // The completions are not done twice: a second call with the token is refused.
    let again = store.complete(first, token, None).await;
    assert!(again.is_err_and(|e| e.is_lease_lost()), "L5 still holds");

    let open = fill_pool(&backend).await;
    assert_eq!(terminate(&admin, &app).await, open as i64, "the whole pool");
    clock.advance(Duration::from_secs(5));
    let leases = claimed[3..]
        .iter()
        .map(|job| HeldLease::new(job.id(), job.token()))
        .collect();
    let answers = store
        .heartbeat_batch(leases, TTL)
        .await
        .expect("a heartbeat batch after a terminate round");
    let expires_at = clock.now().saturating_add(TTL);
    for (job, answer) in claimed[3..].iter().zip(answers) {
        let beat = answer.expect("each heartbeat of the batch");
        assert_eq!(beat.expires_at, expires_at);
        let lease = store.get(job.id()).await.expect("get").lease;
        assert_eq!(lease.map(|l| l.expires_at), Some(expires_at));
    }
    clean_up(&backend, &store.settings().namespace).await;
}

/// Issue #11: once a terminate round has been noticed, no call is handed a dead
/// connection: forty operations in a row, of every kind a worker or an operator
/// sends, succeed, and the pool holds only live connections afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_dead_connection_is_handed_out_after_a_terminate_round() {
    let app = unique_name("jobs_after_round");
    let Some(backend) = backend(&app, 4).await else {
        return;
    };
    let Some(admin) = admin().await else { return };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let parent = store.enqueue(NewJob::new("p")).await.expect("enqueue").id;
    let jobs = (0..4)
        .map(|_| NewJob::new("after").parent(parent))
        .collect();
    store.enqueue_batch(jobs).await.expect("enqueue");

    let open = fill_pool(&backend).await;
    assert_eq!(terminate(&admin, &app).await, open as i64, "the whole pool");
    // A worker's first call after the round is a claim; it meets a dead connection.
    for step in 0..40usize {
        let failed = match step % 10 {
            0 => {
                let request = ClaimRequest::new(["after"], "w", TTL).limit(1);
                match store.claim(request).await {
                    Ok(jobs) => {
                        assert_eq!(jobs.len(), 1, "step {step}");
                        let job = &jobs[0];
                        let lease = HeldLease::new(job.id(), job.token());
                        let beat = store.heartbeat(job.id(), job.token(), TTL).await.err();
                        let batch = store.heartbeat_batch(vec![lease], TTL).await;
                        assert!(
                            matches!(batch.as_deref(), Ok([Ok(_)])),
                            "step {step}: {batch:?}"
                        );
                        let done = store.complete(job.id(), job.token(), None).await.err();
                        beat.or(done)
                    }
                    Err(err) => Some(err),
                }
            }
            1 => store.get(parent).await.map(drop).err(),
            2 => store.payload(parent).await.map(drop).err(),
            3 => store.children(parent).await.map(drop).err(),
            4 => store.stats("after").await.map(drop).err(),
            5 => store
                .list(durq_core::ListQuery::new("after"))
                .await
                .map(drop)
                .err(),
            6 => store.reclaim(10).await.map(drop).err(),
            7 => store.purge(10).await.map(drop).err(),
            8 => store.enqueue(NewJob::new("other")).await.map(drop).err(),
            _ => store
                .enqueue_batch(vec![NewJob::new("other")])
                .await
                .map(drop)
                .err(),
        };
        if let Some(err) = failed {
            panic!("step {step} after the terminate round failed: {err:?}");
        }
    }
    assert_eq!(store.stats("after").await.expect("stats").succeeded, 4);
    assert_eq!(store.stats("other").await.expect("stats").ready, 8);

    // A call the store does not send twice (an enqueue: its first run may have
    // committed) may fail on the first dead connection of a round, with
    // `Unavailable`; after it, the pool checks the others before handing them out,
    // so every enqueue that follows succeeds.
    let open = fill_pool(&backend).await;
    assert_eq!(terminate(&admin, &app).await, open as i64, "the whole pool");
    match store.enqueue(NewJob::new("first")).await {
        Ok(_) => {}
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
    }
    for n in 0..10 {
        let answer = store.enqueue(NewJob::new("first")).await;
        assert!(answer.is_ok(), "enqueue {n} after the first: {answer:?}");
    }
    // The pool holds live connections only: every one of them answers.
    let open = fill_pool(&backend).await;
    let alive: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&admin)
            .await
            .expect("count sessions");
    assert_eq!(alive, open as i64);
    clean_up(&backend, &store.settings().namespace).await;
}

/// A batch of completions the server aborts to break a deadlock is sent again, and
/// answers as if it had run after the statement it deadlocked with. A transaction
/// holds one of two running jobs' rows while the batch completing both waits on it,
/// then asks for the other: if the batch had locked that one, the two deadlock and
/// the server aborts the batch (it waited first). Tried with each row first, since
/// which one the batch locks first is the plan's choice; at least one order must
/// have deadlocked (the database's deadlock counter says so), or the test proved
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completion_batch_aborted_by_a_deadlock_is_sent_again() {
    let Some(backend) = backend("durq-postgres-deadlock", 2).await else {
        return;
    };
    let Some(admin) = admin().await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let deadlocks = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&admin)
        .await
        .expect("read the deadlock counter");
        n
    };
    let mut deadlocked = false;
    for first in 0..2 {
        store
            .enqueue_batch(vec![NewJob::new("deadlock"), NewJob::new("deadlock")])
            .await
            .expect("enqueue");
        let claimed = store
            .claim(ClaimRequest::new(["deadlock"], "w", TTL).limit(2))
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 2);
        let ids = [claimed[0].id(), claimed[1].id()];
        let before = deadlocks().await;
        // A transaction of its own, on a connection of its own, holds one row.
        let mut holder = backend.pool().begin().await.expect("begin");
        // The server aborts the process whose deadlock check runs first, and each
        // checks once it has waited its own `deadlock_timeout`: the batch (1 s, the
        // default) is then always the one aborted, whatever the machine's load.
        sqlx::query("SET LOCAL deadlock_timeout = '60s'")
            .execute(&mut *holder)
            .await
            .expect("a long deadlock_timeout for the holder (the test connects as a superuser)");
        let lock = "SELECT id FROM jobs.jobs WHERE namespace = $1 AND id = $2::uuid FOR UPDATE";
        sqlx::query(lock)
            .bind(&namespace)
            .bind(ids[first].to_string())
            .execute(&mut *holder)
            .await
            .expect("lock the first row");
        let completions: Vec<Completion> = claimed
            .iter()
            .map(|job| Completion::new(job.id(), job.token(), None))
            .collect();
        let batch = {
            let store = store.clone();
            tokio::spawn(async move { store.complete_batch(completions).await })
        };
        // Until the batch waits on the held row.
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'durq-postgres-deadlock' AND wait_event_type = 'Lock'",
            )
            .fetch_one(&admin)
            .await
            .expect("read the sessions");
            if waiting > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        // Now the other row: a deadlock if the batch holds it.
        sqlx::query(lock)
            .bind(&namespace)
            .bind(ids[1 - first].to_string())
            .execute(&mut *holder)
            .await
            .expect("the holder is never the one aborted: its deadlock check comes last");
        holder.commit().await.expect("commit");
        let answers = batch.await.expect("the batch task").expect("the batch");
        assert!(
            answers.iter().all(Result::is_ok),
            "both completions succeed, deadlock or not: {answers:?}"
        );
        for id in ids {
            assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);
        }
        deadlocked |= deadlocks().await > before;
    }
    assert!(
        deadlocked,
        "in neither order did the batch deadlock: the test exercised nothing"
    );
    clean_up(&backend, &namespace).await;
}
