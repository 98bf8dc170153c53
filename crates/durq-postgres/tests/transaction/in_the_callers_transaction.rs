use super::*;

/// Notices are delivered in commit order, so with a rolled-back transaction's notice
/// (if it sent one) ahead of a committed one's, the first notice received tells: it
/// must be the committed one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_sends_no_wake_up_and_a_committed_one_does() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let mut listener = PgListener::connect(&url()).await.expect("listener");
    listener
        .listen(&format!("{DEFAULT_SCHEMA}.jobs_wake"))
        .await
        .expect("listen");

    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.pg.enqueue_in(&mut tx, NewJob::new("rolled-back"))
        .await
        .expect("enqueue in the transaction");
    tx.rollback().await.expect("rollback");

    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.pg.enqueue_in(&mut tx, NewJob::new("committed"))
        .await
        .expect("enqueue in the transaction");
    // A scheduled job is not ready: it announces nothing, at commit or otherwise.
    f.pg.enqueue_in(
        &mut tx,
        NewJob::new("scheduled").delay(Duration::from_secs(60)),
    )
    .await
    .expect("enqueue a scheduled job");
    tx.commit().await.expect("commit");

    let namespace = f.namespace();
    let notice = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let notice = listener.recv().await.expect("a notice");
            // Other tests share the channel; only this namespace's notices count.
            if notice.payload().starts_with(&format!("{namespace}\n")) {
                return notice.payload().to_owned();
            }
        }
    })
    .await
    .expect("the committed transaction's notice arrives");
    assert_eq!(notice, format!("{namespace}\ncommitted"));
    assert_eq!(
        f.jobs_in("rolled-back").await,
        0,
        "a rolled-back job exists"
    );
    assert_eq!(f.jobs_in("committed").await, 1);
    f.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_job_wakes_a_waiting_worker_and_is_claimable() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let queues = vec!["wake".to_owned()];
    // The first wait returns when the listener starts (notices before it are lost);
    // after it, only a notice ends a wait before its deadline.
    f.store
        .wait_for_work(&queues, Duration::from_secs(5))
        .await
        .expect("first wait");
    let waiter = {
        let store = f.store.clone();
        let queues = queues.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            store
                .wait_for_work(&queues, Duration::from_secs(600))
                .await
                .expect("wait");
            started.elapsed()
        })
    };
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    let enqueued =
        f.pg.enqueue_in(&mut tx, NewJob::new("wake").payload("order 1"))
            .await
            .expect("enqueue in the transaction");
    assert!(enqueued.created);
    tx.commit().await.expect("commit");
    let waited = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter is woken long before its deadline")
        .expect("waiter task");
    assert!(waited < Duration::from_secs(600));

    let claimed = f
        .store
        .claim(ClaimRequest::new(["wake"], "w", TTL))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), enqueued.id);
    assert_eq!(&claimed[0].payload[..], b"order 1");
    assert_eq!(f.rows().await, 1);
    f.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_exists_only_if_its_transaction_commits() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    // Rolled back explicitly, and dropped without a commit.
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    let rolled =
        f.pg.enqueue_in(&mut tx, NewJob::new("orders"))
            .await
            .expect("enqueue");
    tx.rollback().await.expect("rollback");
    {
        let mut tx = f.pg.pool().begin().await.expect("begin");
        f.insert_row(&mut tx, 2).await.expect("business row");
        f.pg.enqueue_batch_in(&mut tx, vec![NewJob::new("orders"), NewJob::new("orders")])
            .await
            .expect("enqueue a batch");
    }
    assert!(matches!(
        f.store.get(rolled.id).await,
        Err(Error::NotFound { .. })
    ));

    // Until it commits, nobody else sees the job, and no claim takes it.
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 3).await.expect("business row");
    let kept =
        f.pg.enqueue_in(&mut tx, NewJob::new("orders").payload("order 3"))
            .await
            .expect("enqueue");
    assert!(matches!(
        f.store.get(kept.id).await,
        Err(Error::NotFound { .. })
    ));
    let before_commit = f
        .store
        .claim(ClaimRequest::new(["orders"], "w", TTL))
        .await
        .expect("claim");
    assert!(before_commit.is_empty(), "claimed an uncommitted job");
    tx.commit().await.expect("commit");

    assert_eq!(f.rows().await, 1, "only the committed business row is kept");
    assert_eq!(
        f.jobs_in("orders").await,
        1,
        "only the committed job is kept"
    );
    let job = f.store.get(kept.id).await.expect("the committed job");
    assert_eq!(job.state, JobState::Queued);
    let claimed = f
        .store
        .claim(ClaimRequest::new(["orders"], "w", TTL))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    f.store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .expect("complete");
    f.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_completion_commits_with_the_business_write() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let job = f.enqueue_and_claim("w", TTL).await;

    // Rolled back: neither the row nor the completion.
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 7).await.expect("business row");
    let _rolled_back =
        f.pg.complete_in(
            &mut tx,
            job.id(),
            job.token(),
            Some(Bytes::from_static(b"r")),
        )
        .await
        .expect("complete in the transaction");
    tx.rollback().await.expect("rollback");
    assert_eq!(f.rows().await, 0);
    assert_eq!(
        f.store.get(job.id()).await.expect("get").state,
        JobState::Running
    );

    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 7).await.expect("business row");
    let receipt =
        f.pg.complete_in(
            &mut tx,
            job.id(),
            job.token(),
            Some(Bytes::from_static(b"done")),
        )
        .await
        .expect("complete in the transaction");
    assert_eq!((receipt.id(), receipt.token()), (job.id(), job.token()));
    // Until the commit, the job is running for everyone else.
    assert_eq!(
        f.store.get(job.id()).await.expect("get").state,
        JobState::Running
    );
    tx.commit().await.expect("commit");

    let done = f.store.get(job.id()).await.expect("get");
    assert_eq!(done.state, JobState::Succeeded);
    assert_eq!(done.result.as_deref(), Some(&b"done"[..]));
    assert!(done.lease.is_none());
    assert_eq!(f.rows().await, 1);
    // A second completion, in a transaction or not, is lease lost (L5).
    assert!(matches!(
        f.store.complete(job.id(), job.token(), None).await,
        Err(Error::LeaseLost { .. })
    ));
    f.clean_up().await;
}

/// Tags and a trace context enqueued in the caller's transaction (E11, E12) read back
/// like any others, and a job completed in it (T3) keeps the worker of its lease, so its
/// attempt that succeeded is read back with it (H4), as a completion outside does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_trace_context_and_the_succeeded_attempt_go_through_the_callers_transaction() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    let single =
        f.pg.enqueue_in(
            &mut tx,
            NewJob::new("work")
                .tag("order", "1")
                .trace_context(traceparent),
        )
        .await
        .expect("enqueue")
        .id;
    let batch =
        f.pg.enqueue_batch_in(
            &mut tx,
            vec![NewJob::new("work").tag("order", "2"), NewJob::new("work")],
        )
        .await
        .expect("enqueue a batch");
    tx.commit().await.expect("commit");

    let job = f.store.get(single).await.expect("get");
    assert_eq!(job.tags.get("order").map(String::as_str), Some("1"));
    assert_eq!(job.trace_context.as_deref(), Some(traceparent));
    let tagged = f.store.get(batch[0].id).await.expect("get");
    assert_eq!(tagged.tags.get("order").map(String::as_str), Some("2"));
    assert_eq!(tagged.trace_context, None);
    let plain = f.store.get(batch[1].id).await.expect("get");
    assert!(plain.tags.is_empty());
    let listed = f
        .store
        .list(ListQuery::all().tag("order", "2"))
        .await
        .expect("list");
    assert_eq!(
        listed.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        [batch[0].id]
    );

    let claimed = f
        .store
        .claim(ClaimRequest::new(["work"], "w-tx", TTL).limit(3))
        .await
        .expect("claim");
    let held = claimed
        .iter()
        .find(|c| c.id() == single)
        .expect("the traced job is claimed");
    assert_eq!(held.job.trace_context.as_deref(), Some(traceparent));
    let started_at = f.clock.now();
    f.clock.advance(Duration::from_millis(5));
    let mut tx = f.pg.pool().begin().await.expect("begin");
    let receipt =
        f.pg.complete_in(&mut tx, single, held.token(), None)
            .await
            .expect("complete in the transaction");
    assert_eq!(receipt.id(), single);
    tx.commit().await.expect("commit");
    let attempts = f.store.attempts(single).await.expect("attempts");
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let done = &attempts[0];
    assert_eq!(
        (
            done.worker.as_str(),
            done.token,
            done.started_at,
            done.ended_at,
            done.outcome
        ),
        (
            "w-tx",
            held.token(),
            started_at,
            Some(f.clock.now()),
            AttemptOutcome::Succeeded
        )
    );
    assert!(f.store.get(single).await.expect("get").lease.is_none());
    for job in claimed.iter().filter(|c| c.id() != single) {
        f.store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
    }
    f.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lease_refuses_the_whole_transaction() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let old = f.enqueue_and_claim("old", Duration::from_secs(1)).await;
    f.clock.advance(Duration::from_secs(2));
    assert_eq!(f.store.reclaim(10).await.expect("reclaim").len(), 1);
    let new = f
        .store
        .claim(ClaimRequest::new(["work"], "new", TTL))
        .await
        .expect("claim")
        .remove(0);
    assert_eq!(new.id(), old.id());

    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    let stale =
        f.pg.complete_in(
            &mut tx,
            old.id(),
            old.token(),
            Some(Bytes::from_static(b"stale")),
        )
        .await;
    assert!(
        matches!(stale, Err(Error::LeaseLost { id }) if id == old.id()),
        "{stale:?}"
    );
    // The transaction is aborted: it takes no more statements, and its commit writes
    // nothing of it.
    assert!(f.insert_row(&mut tx, 2).await.is_err());
    let _ = tx.commit().await;
    assert_eq!(
        f.rows().await,
        0,
        "the stale worker's business row was written"
    );

    let job = f.store.get(old.id()).await.expect("get");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.lease.as_ref().map(|l| l.worker.as_str()), Some("new"));
    assert!(job.result.is_none());
    // The refused completion ended no attempt: the old one expired, the new one runs.
    let attempts = f.store.attempts(old.id()).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.worker.as_str(), a.outcome))
            .collect::<Vec<_>>(),
        [
            ("old", AttemptOutcome::Expired),
            ("new", AttemptOutcome::Running)
        ]
    );

    // An unknown job: not found, and the transaction is refused the same way.
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 3).await.expect("business row");
    let missing = JobId::mint(f.store.now());
    let unknown = f.pg.complete_in(&mut tx, missing, old.token(), None).await;
    assert!(
        matches!(unknown, Err(Error::NotFound { .. })),
        "{unknown:?}"
    );
    let _ = tx.commit().await;
    assert_eq!(f.rows().await, 0);

    // The new holder completes as usual.
    f.store
        .complete(new.id(), new.token(), None)
        .await
        .expect("the new holder completes");
    f.clean_up().await;
}

/// The completion holds the job's row until the transaction ends: a reclaim that
/// comes after the lease expired, while the transaction is open, does not take the
/// job back, and once the transaction commits the job is succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_cannot_take_back_a_job_completed_in_an_open_transaction() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let job = f.enqueue_and_claim("w", Duration::from_secs(1)).await;
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    let _receipt =
        f.pg.complete_in(&mut tx, job.id(), job.token(), None)
            .await
            .expect("complete in the transaction");
    f.clock.advance(Duration::from_secs(5));
    let reclaim = {
        let store = f.store.clone();
        tokio::spawn(async move { store.reclaim(10).await })
    };
    tx.commit().await.expect("commit");
    let reclaimed = reclaim.await.expect("reclaim task").expect("reclaim");
    assert!(
        reclaimed.iter().all(|r| r.id != job.id()),
        "a job completed in an open transaction was reclaimed: {reclaimed:?}"
    );
    assert_eq!(
        f.store.get(job.id()).await.expect("get").state,
        JobState::Succeeded
    );
    assert_eq!(f.rows().await, 1);
    f.clean_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_writes_nothing_and_leaves_the_transaction_usable() {
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let job = f.enqueue_and_claim("w", TTL).await;
    let mut tx = f.pg.pool().begin().await.expect("begin");
    let bad_queue = f.pg.enqueue_in(&mut tx, NewJob::new("no spaces")).await;
    assert!(
        matches!(bad_queue, Err(Error::InvalidInput { field: "queue", .. })),
        "{bad_queue:?}"
    );
    let too_big = vec![0u8; f.store.settings().max_payload_bytes + 1];
    let oversized =
        f.pg.enqueue_in(&mut tx, NewJob::new("orders").payload(too_big.clone()))
            .await;
    assert!(
        matches!(oversized, Err(Error::PayloadTooLarge { .. })),
        "{oversized:?}"
    );
    let big_result =
        f.pg.complete_in(&mut tx, job.id(), job.token(), Some(Bytes::from(too_big)))
            .await;
    assert!(
        matches!(big_result, Err(Error::PayloadTooLarge { .. })),
        "{big_result:?}"
    );
    // E9: one invalid job refuses the batch whole; so does a parent that does not
    // exist, found by the server.
    let invalid_batch =
        f.pg.enqueue_batch_in(&mut tx, vec![NewJob::new("orders"), NewJob::new("")])
            .await;
    assert!(
        matches!(invalid_batch, Err(Error::InvalidInput { .. })),
        "{invalid_batch:?}"
    );
    let orphan =
        f.pg.enqueue_batch_in(
            &mut tx,
            vec![
                NewJob::new("orders"),
                NewJob::new("orders").parent(JobId::mint(f.store.now())),
            ],
        )
        .await;
    assert!(
        matches!(
            orphan,
            Err(Error::InvalidInput {
                field: "parent",
                ..
            })
        ),
        "{orphan:?}"
    );
    let lone_orphan =
        f.pg.enqueue_in(
            &mut tx,
            NewJob::new("orders").parent(JobId::mint(f.store.now())),
        )
        .await;
    assert!(
        matches!(
            lone_orphan,
            Err(Error::InvalidInput {
                field: "parent",
                ..
            })
        ),
        "{lone_orphan:?}"
    );
    // The transaction is still usable, and commits what the caller wrote.
    f.insert_row(&mut tx, 1)
        .await
        .expect("the transaction still works");
    assert!(f
        .pg
        .enqueue_batch_in(&mut tx, Vec::new())
        .await
        .expect("an empty batch")
        .is_empty());
    tx.commit().await.expect("commit");
    assert_eq!(f.rows().await, 1);
    assert_eq!(
        f.jobs_in("orders").await,
        0,
        "a refused enqueue wrote a job"
    );
    assert_eq!(
        f.store.get(job.id()).await.expect("get").state,
        JobState::Running
    );
    f.clean_up().await;
}

/// Transactions enqueueing shared keys, some rolled back, from many tasks over many
/// connections: once all have ended, each key has one job, every committed
/// transaction was answered with it, and every committed business row is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transactions_with_shared_keys_make_one_job_per_key() {
    let Some(f) = Fixture::new(12).await else {
        return;
    };
    let f = Arc::new(f);
    const TASKS: i64 = 12;
    const ROUNDS: i64 = 8;
    const KEYS: i64 = 4;
    let mut set = JoinSet::new();
    for task in 0..TASKS {
        let f = Arc::clone(&f);
        set.spawn(async move {
            let mut committed = Vec::new();
            for round in 0..ROUNDS {
                let n = task * ROUNDS + round;
                let key = format!("key-{}", n % KEYS);
                let mut tx = f.pg.pool().begin().await.expect("begin");
                f.insert_row(&mut tx, n).await.expect("business row");
                let enqueued =
                    f.pg.enqueue_in(&mut tx, NewJob::new("shared").idempotency_key(key.clone()))
                        .await
                        .expect("enqueue in the transaction");
                if n % 3 == 0 {
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.commit().await.expect("commit");
                    committed.push((key, enqueued.id));
                }
            }
            committed
        });
    }
    let mut answers: HashMap<String, Vec<JobId>> = HashMap::new();
    let mut commits = 0;
    while let Some(done) = set.join_next().await {
        for (key, id) in done.expect("task") {
            commits += 1;
            answers.entry(key).or_default().push(id);
        }
    }
    assert_eq!(answers.len(), KEYS as usize);
    for (key, ids) in &answers {
        let first = ids[0];
        assert!(
            ids.iter().all(|id| *id == first),
            "committed transactions for {key} were answered with different jobs: {ids:?}"
        );
        let job = f.store.get(first).await.expect("the key's job exists");
        assert_eq!(job.idempotency_key.as_deref(), Some(key.as_str()));
    }
    assert_eq!(f.jobs_in("shared").await, KEYS as u64, "one job per key");
    assert_eq!(f.rows().await, commits);
    let f = Arc::into_inner(f).expect("the tasks are done");
    f.clean_up().await;
}

/// Runs only as the child of `a_process_killed_before_its_commit_leaves_neither`:
/// writes a business row and enqueues a job in one transaction, says so, and waits to
/// be killed before it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_an_open_transaction() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let Some((namespace, table)) = spec.split_once('\n') else {
        panic!("bad {CHILD}: {spec:?}");
    };
    let backend = backend(2).await.expect("the parent reached the server");
    let pg = backend
        .backend(StoreSettings::default().namespace(namespace))
        .expect("valid settings");
    let mut tx = pg.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (id, note) VALUES (1, 'never committed')"
    )))
    .execute(&mut *tx)
    .await
    .expect("business row");
    pg.enqueue_in(&mut tx, NewJob::new("killed"))
        .await
        .expect("enqueue in the transaction");
    println!("READY");
    use std::io::Write;
    std::io::stdout().flush().expect("flush");
    // Killed while it waits here; should the parent die first, its end of the pipe
    // closes and so does this wait, so an orphan does not linger.
    let _ = tokio::task::spawn_blocking(|| {
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
    })
    .await;
    drop(tx);
    panic!("the parent went away before killing this child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_before_its_commit_leaves_neither() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let Some(f) = Fixture::new(4).await else {
        return;
    };
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "in_the_callers_transaction::child_holds_an_open_transaction",
            "--nocapture",
        ])
        .env(CHILD, format!("{}\n{}", f.namespace(), f.table))
        // Held open until the kill: the child waits on it.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().expect("child stdout");
    let ready = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.trim() == "READY")
    })
    .await
    .expect("read the child");
    assert!(ready, "the child never reached its open transaction");
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    assert!(!status.success());

    assert_eq!(
        f.rows().await,
        0,
        "the killed process's business row is there"
    );
    assert_eq!(
        f.jobs_in("killed").await,
        0,
        "the killed process's job is there"
    );
    // The table and the queue work on.
    let mut tx = f.pg.pool().begin().await.expect("begin");
    f.insert_row(&mut tx, 1).await.expect("business row");
    f.pg.enqueue_in(&mut tx, NewJob::new("killed"))
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(f.rows().await, 1);
    assert_eq!(f.jobs_in("killed").await, 1);
    f.clean_up().await;
}
