use super::*;

/// Stores opened at once with distinct configurations get distinct writer connections,
/// so their migrations really race on the new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_opens_migrate_once() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let opens = (1..=6).map(|readers| {
        let (path, settings) = (path.clone(), settings(&clock));
        tokio::spawn(async move {
            let config = SqliteConfig::default()
                .synchronous(Synchronous::Normal)
                .readers(readers);
            open(&path, settings, config).await
        })
    });
    let mut stores = Vec::new();
    for open in opens {
        match open.await {
            Ok(store) => stores.push(store),
            Err(err) => panic!("an open panicked: {err}"),
        }
    }
    assert_eq!(meta(&path, "schema_version"), vec![SCHEMA_VERSION]);
    assert_eq!(
        meta(&path, "seq").len(),
        1,
        "the seed row was inserted twice"
    );
    // Every store works, and each sees what the others wrote.
    let mut ids = Vec::new();
    for store in &stores {
        match store.enqueue(NewJob::new("q")).await {
            Ok(done) => ids.push(done.id),
            Err(err) => panic!("enqueue failed: {err}"),
        }
    }
    for store in &stores {
        for id in &ids {
            assert!(store.get(*id).await.is_ok(), "job {id} not visible");
        }
    }
    // Opening again applies nothing and keeps the data.
    drop(stores);
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    assert_eq!(meta(&path, "schema_version"), vec![SCHEMA_VERSION]);
    for id in &ids {
        assert!(store.get(*id).await.is_ok());
    }
}

#[tokio::test]
async fn a_file_from_a_newer_build_is_refused_untouched() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    drop(open(&path, settings(&clock), SqliteConfig::default()).await);
    let bumped = raw(&path).execute(
        "UPDATE jobq_meta SET value = ?1 WHERE name = 'schema_version'",
        [SCHEMA_VERSION + 1],
    );
    assert!(matches!(bumped, Ok(1)));
    let opened = SqliteBackend::open(&path, settings(&clock)).await;
    match opened {
        Ok(_) => panic!("a newer schema was accepted"),
        Err(err) => assert!(err.to_string().contains("newer"), "{err}"),
    }
    assert_eq!(meta(&path, "schema_version"), vec![SCHEMA_VERSION + 1]);
}

/// Operations that fail inside a group roll back to their own savepoint: the others of
/// the group still commit, and nothing of a failed one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_operation_does_not_undo_its_group() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let unknown = JobId::mint(Timestamp::from_millis(1));
    let mut tasks = Vec::new();
    for i in 0..300 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                // Succeeds.
                0 => store
                    .enqueue(NewJob::new("group").payload(vec![1u8; 10]))
                    .await
                    .map(|_| "enqueued"),
                // Fails before writing: no such job.
                1 => store
                    .complete(unknown, LeaseToken::new(1), None)
                    .await
                    .map(|_| "completed"),
                // Fails after writing its first job: the second names an unknown
                // parent, so the whole batch must vanish.
                _ => store
                    .enqueue_batch(vec![
                        NewJob::new("group"),
                        NewJob::new("group").parent(unknown),
                    ])
                    .await
                    .map(|_| "batch"),
            }
        }));
    }
    let mut enqueued = 0;
    for task in tasks {
        match task.await {
            Ok(Ok("enqueued")) => enqueued += 1,
            Ok(Ok(other)) => panic!("{other} should have failed"),
            Ok(Err(Error::NotFound { .. })) => {}
            Ok(Err(err)) => assert_eq!(err.invalid_field(), Some("parent"), "{err}"),
            Err(err) => panic!("a task panicked: {err}"),
        }
    }
    assert_eq!(enqueued, 100);
    let stats = match store.stats("group").await {
        Ok(stats) => stats,
        Err(err) => panic!("stats failed: {err}"),
    };
    assert_eq!(stats.total(), 100, "{stats:?}");
    assert_eq!(stats.ready, 100);
}

/// With polling made useless (one hour), only the in-process wake-up can end the wait.
#[tokio::test(flavor = "current_thread")]
async fn an_enqueue_wakes_a_waiting_claimer_at_once() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let config = SqliteConfig::default()
        .poll_interval(Duration::from_secs(3600))
        .readers(1);
    let store = open(&path, settings(&clock), config.clone()).await;
    // A second store on the same file and namespace: wake-ups cross stores too.
    let other = open(&path, settings(&clock), config).await;

    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            let queues = vec!["wake".to_owned()];
            let _ = started_tx.send(());
            if let Err(err) = store
                .wait_for_work(&queues, Duration::from_secs(3600))
                .await
            {
                panic!("wait failed: {err}");
            }
            store
                .claim(ClaimRequest::new(["wake"], "w", Duration::from_secs(30)))
                .await
        })
    };
    // On this single-threaded runtime the waiter ran up to its first await, so its
    // readiness check is queued on the only reader; once this read returns, that check
    // has run and found nothing, and the waiter is parked on the wake-up.
    let _ = started_rx.await;
    let _ = other.stats("wake").await;

    let id = match other.enqueue(NewJob::new("wake")).await {
        Ok(done) => done.id,
        Err(err) => panic!("enqueue failed: {err}"),
    };
    let claimed = match tokio::time::timeout(Duration::from_secs(60), waiter).await {
        Ok(Ok(Ok(claimed))) => claimed,
        Ok(Ok(Err(err))) => panic!("claim failed: {err}"),
        Ok(Err(err)) => panic!("the waiter panicked: {err}"),
        Err(_) => panic!("the enqueue did not wake the waiter"),
    };
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), id);
}

/// Scheduled jobs at high priorities do not hide ready jobs at lower ones, and the
/// claim order holds across bands and queues.
#[tokio::test]
async fn claims_walk_priority_bands_past_scheduled_jobs() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let later = clock.now().saturating_add(Duration::from_secs(3600));
    let mut jobs = Vec::new();
    for priority in [9i16, 5, 3] {
        for _ in 0..200 {
            jobs.push(NewJob::new("bands").priority(priority).run_at(later));
        }
    }
    if let Err(err) = store.enqueue_batch(jobs).await {
        panic!("enqueue failed: {err}");
    }
    let mut expected = Vec::new();
    for (queue, priority) in [("bands", 4i16), ("other", 4), ("bands", 0), ("other", -2)] {
        match store.enqueue(NewJob::new(queue).priority(priority)).await {
            Ok(done) => expected.push(done.id),
            Err(err) => panic!("enqueue failed: {err}"),
        }
    }
    let request = ClaimRequest::new(["bands", "other"], "w", Duration::from_secs(30)).limit(10);
    let claimed = match store.claim(request).await {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    let ids: Vec<JobId> = claimed.iter().map(|job| job.id()).collect();
    assert_eq!(ids, expected);
    // Once the clock reaches them, the scheduled ones come out highest band first.
    clock.advance(Duration::from_secs(3600));
    let request = ClaimRequest::new(["bands"], "w", Duration::from_secs(30)).limit(250);
    let claimed = match store.claim(request).await {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    let priorities: Vec<i16> = claimed.iter().map(|job| job.job.priority).collect();
    assert_eq!(priorities.len(), 250);
    assert!(priorities[..200].iter().all(|p| *p == 9));
    assert!(priorities[200..].iter().all(|p| *p == 5));
}

/// A row that cannot be read is reported as corrupt, never a panic or "not found".
#[tokio::test]
async fn unreadable_rows_are_reported_as_corrupt() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        match store
            .enqueue(NewJob::new("corrupt").payload(&b"x"[..]))
            .await
        {
            Ok(done) => ids.push(done.id),
            Err(err) => panic!("enqueue failed: {err}"),
        }
    }
    let conn = raw(&path);
    let bad_state = conn.execute(
        "UPDATE jobq_jobs SET state = 42 WHERE id = ?1",
        [ids[0].to_bytes()],
    );
    assert!(matches!(bad_state, Ok(1)));
    let no_payload = conn.execute(
        "DELETE FROM jobq_payloads WHERE job = (SELECT job FROM jobq_jobs WHERE id = ?1)",
        [ids[1].to_bytes()],
    );
    assert!(matches!(no_payload, Ok(1)));
    assert!(matches!(
        store.get(ids[0]).await,
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        store.stats("corrupt").await,
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        store.payload(ids[1]).await,
        Err(Error::Corrupt { .. })
    ));
    // The claim meets the job without a payload, buries it (CONTRACT C10) and answers
    // what is left: nothing. The row with an unknown state is in no queue.
    let request = ClaimRequest::new(["corrupt"], "w", Duration::from_secs(30));
    match store.claim(request.clone()).await {
        Ok(claimed) => assert!(claimed.is_empty(), "{claimed:?}"),
        Err(err) => panic!("claim failed: {err}"),
    }
    match store.get(ids[1]).await {
        Ok(job) => {
            assert_eq!(job.state, JobState::Dead);
            assert_eq!(job.attempts, 0, "a buried job was never leased");
            assert_eq!(
                job.last_error.as_deref(),
                Some("corrupt record: payload missing")
            );
        }
        Err(err) => panic!("{err}"),
    }
    match store.claim(request).await {
        Ok(claimed) => assert!(claimed.is_empty(), "{claimed:?}"),
        Err(err) => panic!("claim failed: {err}"),
    }
}

/// A worker record that cannot be read back (a negative or oversized `in_flight`, a
/// spec that is not text) is reported as corrupt, never a panic or a wrapped value.
#[tokio::test]
async fn unreadable_workers_are_reported_as_corrupt() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let worker = WorkerInfo::new("w-1", "host", 1, vec!["q".to_owned()], 4);
    if let Err(err) = store.register_worker(&worker).await {
        panic!("register failed: {err}");
    }
    let conn = raw(&path);
    let original: (String, i64) =
        match conn.query_row("SELECT spec, last_seen FROM jobq_workers", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        }) {
            Ok(original) => original,
            Err(err) => panic!("read the record: {err}"),
        };
    for breakage in [
        "UPDATE jobq_workers SET in_flight = -1",
        "UPDATE jobq_workers SET in_flight = 4294967296",
        "UPDATE jobq_workers SET spec = x'7b7d'",
        "UPDATE jobq_workers SET last_seen = 'soon'",
    ] {
        assert!(matches!(conn.execute(breakage, []), Ok(1)), "{breakage}");
        match store.workers().await {
            Err(Error::Corrupt { what, .. }) => assert!(what.contains("w-1"), "{what}"),
            other => panic!("{breakage}: expected Corrupt, got {other:?}"),
        }
        assert!(matches!(
            store.worker("w-1").await,
            Err(Error::Corrupt { .. })
        ));
        let repaired = conn.execute(
            "UPDATE jobq_workers SET spec = ?1, in_flight = 0, last_seen = ?2",
            rusqlite::params![original.0, original.1],
        );
        assert!(matches!(repaired, Ok(1)), "{breakage}: repair");
    }
    match store.workers().await {
        Ok(workers) => assert_eq!(workers.len(), 1),
        Err(err) => panic!("the repaired record: {err}"),
    }
}

#[tokio::test]
async fn bad_configurations_are_refused() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    for (config, field) in [
        (SqliteConfig::default().readers(0), "readers"),
        (SqliteConfig::default().max_group(0), "max_group"),
        (
            SqliteConfig::default().poll_interval(Duration::ZERO),
            "poll_interval",
        ),
    ] {
        match config.open(&path, settings(&clock)).await {
            Ok(_) => panic!("{field} was accepted"),
            Err(err) => assert_eq!(err.invalid_field(), Some(field)),
        }
    }
    let nowhere = path.join("no-such-dir").join("jobs.db");
    match SqliteBackend::open(&nowhere, settings(&clock)).await {
        Ok(_) => panic!("a file in a missing directory was opened"),
        Err(err) => assert_eq!(err.invalid_field(), Some("path"), "{err}"),
    }
    let bad_ns = settings(&clock).namespace("no spaces");
    match SqliteBackend::open(&path, bad_ns).await {
        Ok(_) => panic!("a bad namespace was accepted"),
        Err(err) => assert_eq!(err.invalid_field(), Some("namespace")),
    }
}

/// An operation that fails after it wrote, with no savepoint to return to, must not
/// leave half of itself behind: its group is rolled back whole, and the bystanders are
/// told to retry. A trigger makes the payload insert of one enqueue fail after its job
/// row was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_database_error_rolls_back_its_whole_group() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let trigger = raw(&path).execute_batch(
        "CREATE TRIGGER boom BEFORE INSERT ON jobq_payloads WHEN NEW.payload = X'626f6f6d'
         BEGIN SELECT RAISE(ABORT, 'boom'); END;",
    );
    assert!(trigger.is_ok(), "{trigger:?}");
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let payload: &'static [u8] = if i % 50 == 7 { b"boom" } else { b"fine" };
            (
                payload,
                store.enqueue(NewJob::new("late").payload(payload)).await,
            )
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        match task.await {
            Ok((b"fine", Ok(done))) => created.push(done.id),
            Ok((b"fine", Err(err))) => assert!(err.is_retryable(), "bystander: {err}"),
            Ok((_, Ok(done))) => panic!("the failing enqueue succeeded: {}", done.id),
            // Its own error, or, when another failing enqueue spoiled the group first,
            // the bystanders' retryable one.
            Ok((_, Err(err))) => assert!(
                matches!(err, Error::Backend { .. }) || err.is_retryable(),
                "{err}"
            ),
            Err(err) => panic!("a task panicked: {err}"),
        }
    }
    // Exactly the acknowledged jobs exist, each with its payload: no job row of a failed
    // enqueue survived without its payload.
    let stats = match store.stats("late").await {
        Ok(stats) => stats,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(stats.total(), created.len() as u64, "{stats:?}");
    for id in created {
        match store.payload(id).await {
            Ok(bytes) => assert_eq!(&bytes[..], b"fine"),
            Err(err) => panic!("job {id}: {err}"),
        }
    }
}

/// `drop_namespace` removes every job, payload, idempotency record, dependency edge,
/// durable step and worker of its namespace and nothing of another one in the same file; a store still open on the emptied
/// namespace keeps working on it and never sees the neighbour's jobs.
#[tokio::test]
async fn clearing_a_namespace_empties_it_and_no_other() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let backend = open_backend(&path, settings(&clock), SqliteConfig::default()).await;
    let store = Store::new(backend.clone());
    let neighbour = open(
        &path,
        settings(&clock).namespace("neighbour"),
        SqliteConfig::default(),
    )
    .await;
    let keyed = |payload: &'static [u8]| {
        NewJob::new("clear")
            .tenant("t")
            .idempotency_key("k")
            .payload(payload)
    };
    let enqueue = |store: &Store, job: NewJob| {
        let store = store.clone();
        async move {
            match store.enqueue(job).await {
                Ok(done) => done,
                Err(err) => panic!("enqueue failed: {err}"),
            }
        }
    };

    let parent = enqueue(&store, keyed(b"mine")).await.id;
    enqueue(
        &store,
        NewJob::new("clear").parent(parent).payload(&b"child"[..]),
    )
    .await;
    enqueue(&store, NewJob::new("clear").payload(&b"done"[..])).await;
    let request = ClaimRequest::new(["clear"], "w", Duration::from_secs(30)).limit(2);
    let claimed = match store.claim(request).await {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    assert_eq!(claimed.len(), 2);
    if let Err(err) = store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
    {
        panic!("complete failed: {err}");
    }
    // A job waiting for the one still running: one edge (CONTRACT G1).
    enqueue(&store, NewJob::new("after").after(claimed[1].id())).await;
    let theirs = enqueue(&neighbour, keyed(b"theirs")).await.id;
    let their_other = enqueue(&neighbour, NewJob::new("clear")).await.id;
    let their_waiting = enqueue(&neighbour, NewJob::new("after").after(their_other))
        .await
        .id;
    // A durable step of each namespace's running job (CONTRACT D1).
    let request = ClaimRequest::new(["clear"], "w", Duration::from_secs(30));
    let their_running = match neighbour.claim(request).await {
        Ok(mut claimed) => claimed.remove(0),
        Err(err) => panic!("claim failed: {err}"),
    };
    for (who, job, step) in [
        (&store, &claimed[1], "mine"),
        (&neighbour, &their_running, "theirs"),
    ] {
        if let Err(err) = who
            .save_step(job.id(), job.token(), step, b"1".to_vec().into())
            .await
        {
            panic!("save_step failed: {err}");
        }
    }
    for (who, id) in [(&store, "mine"), (&neighbour, "theirs")] {
        let worker = WorkerInfo::new(id, "host", 1, vec!["clear".to_owned()], 1);
        if let Err(err) = who.register_worker(&worker).await {
            panic!("register failed: {err}");
        }
    }

    match backend.drop_namespace().await {
        Ok(deleted) => assert_eq!(deleted, 4),
        Err(err) => panic!("clear failed: {err}"),
    }
    let mine = "(SELECT id FROM jobq_namespaces WHERE name = 'sqlite-tests')";
    assert_eq!(
        count(
            &path,
            &format!("SELECT COUNT(*) FROM jobq_jobs WHERE ns = {mine}")
        ),
        0
    );
    assert_eq!(
        count(
            &path,
            &format!("SELECT COUNT(*) FROM jobq_dedup WHERE ns = {mine}")
        ),
        0
    );
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobq_payloads"),
        3,
        "orphan payloads"
    );
    assert_eq!(
        count(
            &path,
            &format!("SELECT COUNT(*) FROM jobq_dependencies WHERE ns = {mine}")
        ),
        0,
        "the cleared namespace's dependency edges"
    );
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobq_dependencies"),
        1,
        "the neighbour's edge"
    );
    assert_eq!(count(&path, "SELECT COUNT(*) FROM jobq_dedup"), 1);
    assert_eq!(
        count(
            &path,
            &format!("SELECT COUNT(*) FROM jobq_steps WHERE ns = {mine}")
        ),
        0,
        "the cleared namespace's steps"
    );
    match neighbour.steps(their_running.id()).await {
        Ok(log) => assert_eq!(log.steps.len(), 1, "the neighbour's step"),
        Err(err) => panic!("steps failed: {err}"),
    }
    match (store.workers().await, neighbour.workers().await) {
        (Ok(mine), Ok(theirs)) => {
            assert!(mine.is_empty(), "the cleared namespace's workers: {mine:?}");
            assert_eq!(
                theirs.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
                ["theirs"]
            );
        }
        other => panic!("workers failed: {other:?}"),
    }
    match store.get(parent).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("the cleared job is still there: {other:?}"),
    }

    // The neighbour keeps its jobs and its key.
    for id in [theirs, their_other, their_waiting] {
        assert!(
            neighbour.get(id).await.is_ok(),
            "job {id} of the neighbour lost"
        );
    }
    let again = enqueue(&neighbour, keyed(b"theirs again")).await;
    assert!(!again.created && again.id == theirs, "{again:?}");

    // The emptied namespace works on, alone: its key is free again, and its new job
    // is not the neighbour's.
    let fresh = enqueue(&store, keyed(b"mine again")).await;
    assert!(fresh.created, "{fresh:?}");
    assert!(matches!(
        neighbour.get(fresh.id).await,
        Err(Error::NotFound { .. })
    ));
    match store.stats("clear").await {
        Ok(stats) => assert_eq!((stats.total(), stats.ready), (1, 1), "{stats:?}"),
        Err(err) => panic!("stats failed: {err}"),
    }
}

/// The backend takes every decision at the instant the caller hands it, never at its
/// settings' clock (which stays put here), and stores the error text it is given
/// whole: cutting it is the `Store` handle's job, done once.
#[tokio::test]
async fn the_backend_decides_at_the_instant_it_is_given() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let backend = open_backend(&path, settings(&clock), SqliteConfig::default()).await;
    assert!(!backend.capabilities().tied_to_runtime);
    let ttl = Duration::from_secs(30);
    let at = clock.now().saturating_add(Duration::from_secs(3600));

    let id = match Backend::enqueue(&backend, NewJob::new("instant"), at).await {
        Ok(done) => done.id,
        Err(err) => panic!("enqueue failed: {err}"),
    };
    let job = match backend.get(id).await {
        Ok(job) => job,
        Err(err) => panic!("get failed: {err}"),
    };
    assert_eq!((job.created_at, job.run_at), (at, at));
    // Ready at the instant given; the handle, at the clock's earlier instant, sees it
    // scheduled.
    match durq_core::Inspect::stats(&backend, "instant", at).await {
        Ok(stats) => assert_eq!(stats.ready, 1, "{stats:?}"),
        Err(err) => panic!("stats failed: {err}"),
    }
    match Store::new(backend.clone()).stats("instant").await {
        Ok(stats) => assert_eq!((stats.ready, stats.scheduled), (0, 1), "{stats:?}"),
        Err(err) => panic!("stats failed: {err}"),
    }

    let request = ClaimRequest::new(["instant"], "w", ttl);
    let claimed = match Backend::claim(&backend, request.clone(), at).await {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.started_at, Some(at));
    let token = claimed[0].token();
    let later = at.saturating_add(Duration::from_secs(10));
    let expiry = match Backend::heartbeat(&backend, id, token, ttl, later).await {
        Ok(beat) => beat.expires_at,
        Err(err) => panic!("heartbeat failed: {err}"),
    };
    assert_eq!(expiry, later.saturating_add(ttl));

    // R1: expired only strictly after the expiry, and requeued ready at that instant.
    match Backend::reclaim(&backend, 10, expiry).await {
        Ok(reclaimed) => assert!(reclaimed.is_empty(), "{reclaimed:?}"),
        Err(err) => panic!("reclaim failed: {err}"),
    }
    let past = expiry.saturating_add(Duration::from_millis(1));
    match Backend::reclaim(&backend, 10, past).await {
        Ok(reclaimed) => {
            assert_eq!(reclaimed.len(), 1);
            assert_eq!(reclaimed[0].state, JobState::Queued);
        }
        Err(err) => panic!("reclaim failed: {err}"),
    }
    match backend.get(id).await {
        Ok(job) => assert_eq!(job.run_at, past),
        Err(err) => panic!("get failed: {err}"),
    }

    let claimed = match Backend::claim(&backend, request, past).await {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    assert_eq!(claimed.len(), 1);
    let long_error = "e".repeat(durq_core::validate::MAX_ERROR_BYTES * 2);
    let failed = Backend::fail(
        &backend,
        id,
        claimed[0].token(),
        &long_error,
        Retry::Never,
        past,
    )
    .await;
    assert!(matches!(failed, Ok(JobState::Dead)), "{failed:?}");
    match backend.get(id).await {
        Ok(job) => {
            assert_eq!(job.finished_at, Some(past));
            assert_eq!(job.last_error.map(|e| e.len()), Some(long_error.len()));
        }
        Err(err) => panic!("get failed: {err}"),
    }

    // A5: the cutoff given is the line, whatever the retention setting says.
    let before = Timestamp::from_millis(past.as_millis() - 1);
    assert!(matches!(
        durq_core::Admin::purge(&backend, 10, before).await,
        Ok(0)
    ));
    assert!(matches!(
        durq_core::Admin::purge(&backend, 10, past).await,
        Ok(1)
    ));
    assert!(matches!(backend.get(id).await, Err(Error::NotFound { .. })));
}

/// A placement that cannot be read back is a corrupt record for every read that meets
/// it; a fitted claim whose scan meets it (budgeted, preferring, reserved) buries the
/// job instead of leasing it or failing (CONTRACT C10).
#[tokio::test]
async fn unreadable_placements_are_reported_as_corrupt() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let conn = raw(&path);
    let ttl = Duration::from_secs(30);
    let gpu = || NewJob::new("placed").needs(Needs::new().amount("gpu", 1));
    let bad_values = [
        rusqlite::types::Value::Text("{".to_owned()),
        rusqlite::types::Value::Text(r#"{"a":{"gpu":-1}}"#.to_owned()),
        rusqlite::types::Value::Integer(7),
        rusqlite::types::Value::Blob(vec![0xff, 0xfe]),
    ];
    for (round, bad) in bad_values.into_iter().enumerate() {
        let (victim, readable) = match (store.enqueue(gpu()).await, store.enqueue(gpu()).await) {
            (Ok(victim), Ok(readable)) => (victim.id, readable.id),
            (Err(err), _) | (_, Err(err)) => panic!("enqueue failed: {err}"),
        };
        let broken = conn.execute(
            "UPDATE jobq_jobs SET placement = ?1 WHERE id = ?2",
            rusqlite::params![bad, victim.to_bytes()],
        );
        assert!(matches!(broken, Ok(1)));
        assert!(
            matches!(store.get(victim).await, Err(Error::Corrupt { .. })),
            "get with {bad:?}"
        );
        let listed = store.list(ListQuery::new("placed")).await;
        assert!(
            matches!(listed, Err(Error::Corrupt { .. })),
            "list with {bad:?}"
        );
        // Each kind of fitted claim in turn meets the unreadable placement.
        let request = match round % 3 {
            0 => ClaimRequest::new(["placed"], "w", ttl)
                .limit(2)
                .budget(Budget::new().amount("gpu", 4)),
            1 => ClaimRequest::new(["placed"], "w", ttl)
                .limit(2)
                .prefer(["x"]),
            _ => ClaimRequest::new(["placed"], "w", ttl).reserved(victim),
        };
        let claimed = match store.claim(request.clone()).await {
            Ok(claimed) => claimed,
            Err(err) => panic!("{request:?} with {bad:?} failed: {err}"),
        };
        let ids: Vec<JobId> = claimed.iter().map(|job| job.id()).collect();
        let expected = if request.reserved.is_some() {
            Vec::new()
        } else {
            vec![readable]
        };
        assert_eq!(ids, expected, "{request:?} with {bad:?}");
        let buried = count(
            &path,
            &format!(
                "SELECT COUNT(*) FROM jobq_jobs WHERE id = x'{}' AND state = 3 AND attempts = 0
                 AND last_error LIKE 'corrupt record: placement unreadable: %'",
                victim
                    .to_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            ),
        );
        assert_eq!(buried, 1, "{request:?} with {bad:?} buried the job");
        if request.reserved.is_some() {
            // The readable job is still there for the next claim.
            let plain = ClaimRequest::new(["placed"], "w", ttl).limit(10);
            match store.claim(plain).await {
                Ok(claimed) => assert_eq!(claimed.len(), 1),
                Err(err) => panic!("{err}"),
            }
        }
    }
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobq_jobs WHERE state = 0"),
        0,
        "every readable job was claimed, every unreadable one buried"
    );
}
