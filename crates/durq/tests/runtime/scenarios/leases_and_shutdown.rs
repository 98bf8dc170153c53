use super::*;

/// Shutdown stops claiming, lets a handler that finishes within the grace period
/// complete, releases the one that does not, and the released job runs on the next
/// worker.
pub async fn shutdown_releases_unfinished_jobs(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let finish_quick = Arc::new(Notify::new());
    let finish = finish_quick.clone();
    let worker = test_worker(env.store().await, "leaving")
        .concurrency(2)
        // Long enough for the quick job's completion to reach the store on a loaded
        // machine (300 ms let a PostgreSQL completion miss it once under `.ci/run`); the
        // stuck job holds the worker for all of it.
        .shutdown_grace(Duration::from_secs(2))
        .handler("work", move |ctx: JobContext, payload: Bytes| {
            let tx = tx.clone();
            let finish = finish.clone();
            async move {
                let _ = tx.send(ctx.id());
                if payload == "quick" {
                    finish.notified().await;
                } else {
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    let quick = enqueue(&store, NewJob::new("work").payload("quick")).await;
    let stuck = enqueue(&store, NewJob::new("work").payload("stuck")).await;
    let mut started = [
        recv(&mut rx, "a start").await,
        recv(&mut rx, "a start").await,
    ];
    started.sort();
    let mut expected = [quick, stuck];
    expected.sort();
    assert_eq!(started, expected);

    handle.shutdown_handle().shutdown();
    let late = enqueue(&store, NewJob::new("work").payload("late")).await;
    finish_quick.notify_one();
    tokio::time::timeout(PATIENCE, handle.join())
        .await
        .expect("the worker stops after its grace period");

    let job = store.get(quick).await.expect("get");
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "finished within the grace period"
    );
    let job = store.get(stuck).await.expect("get");
    assert_eq!(
        job.state,
        JobState::Queued,
        "released at the end of the grace"
    );
    assert_eq!(job.attempts, 0, "a release does not count the attempt");
    assert!(job.lease.is_none());
    let job = store.get(late).await.expect("get");
    assert_eq!(
        job.state,
        JobState::Queued,
        "nothing is claimed during shutdown"
    );
    assert_eq!(job.attempts, 0);
    assert!(rx.try_recv().is_err());

    let next =
        test_worker(env.store().await, "next").handler("work", |_ctx, _payload| async { Ok(()) });
    let next = build(next).spawn();
    for id in [stuck, late] {
        let job = wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
        assert_eq!(job.attempts, 1);
        assert_eq!(job.lease, None);
    }
    next.shutdown().await;
}

/// A panicking handler is a failed attempt (retried with backoff); the worker,
/// with a single slot, goes on to run the next job.
pub async fn panics_are_failed_attempts(env: Env) {
    let store = env.store().await;
    let worker = test_worker(env.store().await, "w").concurrency(1).handler(
        "work",
        |ctx: JobContext, payload: Bytes| async move {
            if payload == "panic" && ctx.attempt() == 1 {
                panic!("kaboom on attempt {}", ctx.attempt());
            }
            Ok(())
        },
    );
    let handle = build(worker).spawn();
    let panics = enqueue(&store, NewJob::new("work").payload("panic")).await;
    let calm = enqueue(&store, NewJob::new("work").payload("calm")).await;
    wait_for(&store, calm, "the next job", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    let job = wait_for(&store, panics, "the failure", |j| {
        j.state == JobState::Queued && j.attempts == 1
    })
    .await;
    assert_eq!(
        job.last_error.as_deref(),
        Some("handler panicked: kaboom on attempt 1")
    );
    assert_eq!(
        job.run_at,
        env.clock.now().saturating_add(Duration::from_secs(10))
    );
    env.clock.advance(Duration::from_secs(10));
    let job = wait_for(&store, panics, "the retry", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    assert_eq!(job.attempts, 2);
    handle.shutdown().await;
}

/// Cancelling a running job cancels the handler's token; the handler stops and the
/// job ends cancelled. A handler that ignores the token is dropped after the cancel
/// grace period.
pub async fn cancel_stops_the_handler(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stopped_tx, mut stopped_rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .cancel_grace(Duration::from_millis(100))
        .handler("work", move |ctx: JobContext, payload: Bytes| {
            let tx = tx.clone();
            let stopped_tx = stopped_tx.clone();
            async move {
                let _ = tx.send(ctx.id());
                if payload == "stubborn" {
                    std::future::pending::<()>().await;
                }
                ctx.cancelled().await;
                let _ = stopped_tx.send((ctx.id(), ctx.cancel_reason()));
                Err::<(), _>(JobError::retry("stopped on request"))
            }
        });
    let handle = build(worker).spawn();
    let polite = enqueue(&store, NewJob::new("work").payload("polite")).await;
    let stubborn = enqueue(&store, NewJob::new("work").payload("stubborn")).await;
    recv(&mut rx, "a start").await;
    recv(&mut rx, "a start").await;

    for id in [polite, stubborn] {
        let state = store.cancel(id).await.expect("cancel");
        assert_eq!(state, JobState::Running);
    }
    let (id, reason) = recv(&mut stopped_rx, "the handler to stop").await;
    assert_eq!(id, polite);
    assert_eq!(reason, Some(CancelReason::Requested));
    let job = wait_for(&store, polite, "cancellation", |j| {
        j.state == JobState::Cancelled
    })
    .await;
    assert_eq!(
        job.last_error.as_deref(),
        Some("cancelled: stopped on request")
    );
    let job = wait_for(&store, stubborn, "cancellation", |j| {
        j.state == JobState::Cancelled
    })
    .await;
    assert!(job
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("did not stop")));
    handle.shutdown().await;
    assert!(stopped_rx.try_recv().is_err());
}

/// When the lease is taken over (expired, reclaimed, claimed by another), the next
/// heartbeat cancels the handler, and the worker leaves the new holder's job alone.
pub async fn lost_lease_cancels_the_handler(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (lost_tx, mut lost_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let worker = test_worker(env.store().await, "slow")
        .concurrency(1)
        .disable_reclaim()
        .handler("work", move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            let lost_tx = lost_tx.clone();
            let release_rx = release_rx.clone();
            async move {
                let _ = tx.send(seen(&ctx));
                ctx.cancelled().await;
                let _ = lost_tx.send(ctx.cancel_reason());
                // Keep the only slot busy until the test has looked.
                if let Some(rx) = release_rx.lock().await.take() {
                    let _ = rx.await;
                }
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    let id = enqueue(&store, NewJob::new("work")).await;
    let first = recv(&mut rx, "the run").await;

    // A heartbeat landing between the clock's move and the reclaim still extends
    // the expired lease (its token is current), so move past that one too.
    let mut reclaimed = Vec::new();
    for _ in 0..100 {
        env.clock.advance(LEASE + Duration::from_millis(1));
        reclaimed = store.reclaim(10).await.expect("reclaim");
        if !reclaimed.is_empty() {
            break;
        }
    }
    assert_eq!(reclaimed.len(), 1);
    let thief = store
        .claim(durq::worker_calls::ClaimRequest::new(
            ["work"],
            "thief",
            LEASE,
        ))
        .await
        .expect("claim");
    assert_eq!(thief.len(), 1, "the reclaimed job is claimable");
    let token = thief[0].token();
    assert!(token > first.token);

    let reason = recv(&mut lost_rx, "the handler to be cancelled").await;
    assert_eq!(reason, Some(CancelReason::LeaseLost));
    let _ = release_tx.send(());
    // Shutdown waits for the handler to return and the worker to act on it.
    handle.shutdown().await;
    let job = store.get(id).await.expect("get");
    assert_eq!(
        job.state,
        JobState::Running,
        "the old holder changed nothing"
    );
    assert_eq!(job.lease.map(|l| l.token), Some(token));
    store
        .complete(id, token, None)
        .await
        .expect("the new holder completes");
}

/// Successes reach the store through `complete_batch`, many per call, and every
/// one is recorded by the time shutdown returns.
pub async fn successes_are_recorded_in_batches(env: Env) {
    const JOBS: usize = 300;
    let store = env.store().await;
    let jobs: Vec<NewJob> = (0..JOBS).map(|_| NewJob::new("quick")).collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(counted, "w").concurrency(32).handler(
        "quick",
        move |_ctx: JobContext, _payload: Bytes| {
            let _ = tx.send(());
            async { Ok::<(), JobError>(()) }
        },
    );
    let handle = build(worker).spawn();
    for _ in 0..JOBS {
        recv(&mut rx, "every handler to run").await;
    }
    handle.shutdown().await;
    let stats = store.stats("quick").await.expect("stats");
    assert_eq!(
        stats.succeeded, JOBS as u64,
        "every success was recorded by shutdown"
    );
    assert_eq!(stats.total(), JOBS as u64);
    assert_eq!(counting.batched_entries.load(Ordering::SeqCst), JOBS);
    let batches = counting.batches.load(Ordering::SeqCst);
    assert!(
        batches * 4 <= JOBS,
        "{JOBS} successes took {batches} complete_batch calls: they were not batched"
    );
}

/// A `complete_batch` that fails as a whole with the store unavailable is tried
/// again after a back-off, and every success is recorded once.
pub async fn unavailable_completions_are_tried_again(env: Env) {
    const JOBS: usize = 20;
    let store = env.store().await;
    let jobs: Vec<NewJob> = (0..JOBS).map(|_| NewJob::new("quick")).collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 2)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(counted, "w").concurrency(JOBS).handler(
        "quick",
        move |_ctx: JobContext, _payload: Bytes| {
            let _ = tx.send(());
            async { Ok::<(), JobError>(()) }
        },
    );
    let handle = build(worker).spawn();
    for _ in 0..JOBS {
        recv(&mut rx, "every handler to run").await;
    }
    handle.shutdown().await;
    let stats = store.stats("quick").await.expect("stats");
    assert_eq!(
        stats.succeeded, JOBS as u64,
        "recorded after the store came back"
    );
    assert_eq!(stats.total(), JOBS as u64, "no job lost or added");
    assert_eq!(counting.unavailable_batches.load(Ordering::SeqCst), 0);
    assert!(
        counting.batches.load(Ordering::SeqCst) >= 3,
        "two refused calls, then one that took"
    );
}

/// A handler's first poll runs in the worker's own task; once first polls of a
/// queue were slow four times in a row (a handler computing before it awaits), its
/// jobs start in tasks of their own. (That fast polls break a streak is a unit test
/// of the runtime: here, a fast poll preempted on a busy machine looks slow.)
pub async fn slow_first_polls_move_jobs_to_tasks(env: Env) {
    let store = env.store().await;
    // One job at a time, in this order.
    let plan = [
        "probe", "probe", "spin", "spin", "spin", "spin", "probe", "probe",
    ];
    for step in plan {
        enqueue(
            &store,
            NewJob::new("mixed").payload(step.as_bytes().to_vec()),
        )
        .await;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w").concurrency(1).handler(
        "mixed",
        move |_ctx: JobContext, payload: Bytes| {
            let tx = tx.clone();
            async move {
                // The future's first poll: inline, or in a task of its own.
                let task = tokio::task::try_id();
                if &payload[..] == b"spin" {
                    // Computes before its first await, as a CPU-bound handler does.
                    let start = std::time::Instant::now();
                    while start.elapsed() < Duration::from_millis(2) {
                        std::hint::spin_loop();
                    }
                } else {
                    let _ = tx.send(task);
                }
                Ok::<(), JobError>(())
            }
        },
    );
    let handle = build(worker).spawn();
    let mut probes = Vec::new();
    for _ in 0..4 {
        probes.push(recv(&mut rx, "a probe job").await);
    }
    handle.shutdown().await;
    let worker_task = probes[0].expect("handlers run in tokio tasks");
    assert_eq!(
        probes[1],
        Some(worker_task),
        "fast first polls run inline, in the worker's task: {probes:?}"
    );
    let (third, fourth) = (probes[2], probes[3]);
    assert!(
        third.is_some() && third != Some(worker_task),
        "after four slow first polls in a row, a job starts in a task of its own"
    );
    assert!(
        fourth.is_some() && fourth != third && fourth != Some(worker_task),
        "and so does every later one, each in its own task"
    );
    let stats = store.stats("mixed").await.expect("stats");
    assert_eq!(stats.succeeded, plan.len() as u64);
}

/// Issue #11, defect 1: the jobs of one claim are held from the claim on. The first
/// job's first poll blocks the claim loop (it runs inline), so the others wait for
/// their turn; meanwhile their leases are extended, nothing is reclaimed, and each
/// job runs once, on its first attempt.
pub async fn leases_of_a_claimed_batch_are_kept_while_a_first_poll_blocks(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["block", "a", "b"]).await;
    let gate = ThreadGate::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .concurrency(3)
        .claim_batch(3)
        .disable_reclaim()
        .handler("plan", blocking_handler(tx, gate.clone(), 1));
    let handle = build(worker).spawn();
    let first = recv(&mut rx, "the blocking handler to start").await;
    assert_eq!(first.id, ids[0], "the jobs run in claim order");
    outlive_leases(&env, &store, &ids).await;
    assert!(
        store.reclaim(10).await.expect("reclaim").is_empty(),
        "no lease of the batch expired while its first job blocked the claim loop"
    );
    gate.open();
    let mut runs = vec![first];
    for _ in 1..ids.len() {
        runs.push(recv(&mut rx, "the other handlers").await);
    }
    wait_all_succeeded(&store, &ids).await;
    handle.shutdown().await;
    assert_each_ran_once(&runs, &ids, 1);
}

/// Issue #11, defect 1: a job whose lease ran out (no heartbeat could reach the store)
/// and was reclaimed while it waited for its turn is not started under that lease:
/// it is handed back, and runs once, under its next claim.
pub async fn a_job_whose_lease_expired_before_its_turn_is_not_started(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["block", "a", "b"]).await;
    let gate = ThreadGate::new();
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    counting.heartbeats_down.store(true, Ordering::SeqCst);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(counted, "w")
        .concurrency(3)
        .claim_batch(3)
        .disable_reclaim()
        .handler("plan", blocking_handler(tx, gate.clone(), 1));
    let handle = build(worker).spawn();
    let first = recv(&mut rx, "the blocking handler to start").await;
    env.clock.advance(LEASE + Duration::from_millis(1));
    let reclaimed = store.reclaim(10).await.expect("reclaim");
    assert_eq!(reclaimed.len(), 3, "every lease of the claim expired");
    counting.heartbeats_down.store(false, Ordering::SeqCst);
    gate.open();
    let mut runs = vec![first];
    // The blocked job runs again too: its lease was reclaimed under it.
    for _ in 0..ids.len() {
        runs.push(recv(&mut rx, "the jobs' runs").await);
    }
    wait_all_succeeded(&store, &ids).await;
    handle.shutdown().await;
    for id in &ids[1..] {
        let attempts: Vec<u32> = runs
            .iter()
            .filter(|r| r.id == *id)
            .map(|r| r.attempt)
            .collect();
        assert_eq!(
            attempts,
            vec![2],
            "a job whose lease was reclaimed before its turn runs once, on its next claim"
        );
    }
}

/// Issue #11, defect 2: a success the store cannot take yet keeps its lease (the
/// keeper extends it) and is tried again until the store takes it, however long
/// that is; the job is not reclaimed and does not run again.
pub async fn outcomes_waiting_to_be_recorded_keep_their_lease(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["quick"]).await;
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    counting.completions_down.store(true, Ordering::SeqCst);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(counted, "w")
        .concurrency(1)
        .disable_reclaim()
        .handler("plan", blocking_handler(tx, ThreadGate::open_now(), 0));
    let handle = build(worker).spawn();
    let run = recv(&mut rx, "the handler").await;
    outlive_leases(&env, &store, &ids).await;
    assert!(
        store.reclaim(10).await.expect("reclaim").is_empty(),
        "a success waiting to be recorded keeps its lease"
    );
    counting.completions_down.store(false, Ordering::SeqCst);
    let job = wait_for(&store, ids[0], "success", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    handle.shutdown().await;
    assert_eq!(job.attempts, 1);
    assert!(rx.try_recv().is_err(), "the job ran once");
    assert_eq!(run.attempt, 1);
}

/// Issue #11, defect 4: handlers that block their threads (here, every thread of
/// the handlers' runtime, past several leases) do not cost any job its lease: each
/// runs once, on its first attempt.
pub async fn handlers_blocking_every_thread_cost_no_lease(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["block", "block", "block", "block"]).await;
    let gate = ThreadGate::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .concurrency(4)
        .handler_threads(2)
        .disable_reclaim()
        .handler("plan", blocking_handler(tx, gate.clone(), u32::MAX));
    let handle = build(worker).spawn();
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(recv(&mut rx, "two handlers to block both threads").await);
    }
    outlive_leases(&env, &store, &ids).await;
    assert!(
        store.reclaim(10).await.expect("reclaim").is_empty(),
        "no lease expired while handlers blocked every handler thread"
    );
    gate.open();
    for _ in 2..ids.len() {
        runs.push(recv(&mut rx, "the other handlers").await);
    }
    wait_all_succeeded(&store, &ids).await;
    handle.shutdown().await;
    assert_each_ran_once(&runs, &ids, 1);
}

/// Issue #11, defect 4, with the worker's default placement: the worker runs on a
/// runtime of two threads and its handlers block both (a store that needs no
/// runtime runs handlers there, and keeps leases from a thread of its own; one tied
/// to its runtime runs handlers elsewhere). No lease is lost; each job runs once.
pub async fn handlers_blocking_the_workers_runtime_cost_no_lease(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["block", "block"]).await;
    let gate = ThreadGate::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = build(
        test_worker(env.store().await, "w")
            .concurrency(2)
            .disable_reclaim()
            .handler("plan", blocking_handler(tx, gate.clone(), u32::MAX)),
    );
    let stop = worker.shutdown_handle();
    let workers_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the worker");
    let running = workers_runtime.spawn(worker.run());
    let mut runs = Vec::new();
    for _ in 0..ids.len() {
        runs.push(recv(&mut rx, "both handlers to block").await);
    }
    outlive_leases(&env, &store, &ids).await;
    assert!(
        store.reclaim(10).await.expect("reclaim").is_empty(),
        "no lease expired while handlers blocked the worker's runtime"
    );
    gate.open();
    wait_all_succeeded(&store, &ids).await;
    stop.shutdown();
    running.await.expect("the worker's task ends");
    workers_runtime.shutdown_background();
    assert_each_ran_once(&runs, &ids, 1);
}

/// A handler past its timeout (the job's own, overriding the worker's; on the
/// store's clock) is cancelled, given the cancel grace, and dropped: the attempt
/// fails as timed out and is retried with backoff, and its slot runs the next job.
pub async fn a_timed_out_handler_fails_its_attempt_and_frees_its_slot(env: Env) {
    let store = env.store().await;
    let hung = enqueue(&store, NewJob::new("hang").timeout(Duration::from_secs(60))).await;
    let quick = enqueue(&store, NewJob::new("hang").payload(&b"quick"[..])).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .concurrency(1)
        .timeout(Duration::from_secs(3600))
        .cancel_grace(Duration::from_millis(30))
        .disable_reclaim()
        .handler("hang", move |ctx: JobContext, payload: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(seen(&ctx));
                if payload.is_empty() {
                    // Ignores its cancellation, as a hung handler does.
                    std::future::pending::<()>().await;
                }
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    let first = recv(&mut rx, "the hung handler").await;
    assert_eq!(first.id, hung);
    env.clock.advance(Duration::from_secs(59));
    assert_eq!(
        store.get(quick).await.expect("get").state,
        JobState::Queued,
        "before its timeout the hung handler holds the only slot"
    );
    env.clock.advance(Duration::from_secs(1));
    let job = wait_for(&store, hung, "the timed out attempt", |j| {
        j.state == JobState::Queued && j.attempts == 1
    })
    .await;
    assert_eq!(
        job.last_error.as_deref(),
        Some("timed out after 60s"),
        "the attempt failed as timed out"
    );
    assert!(
        job.run_at >= env.clock.now().saturating_add(Duration::from_secs(10)),
        "and is retried with the worker's backoff"
    );
    wait_for(&store, quick, "the next job in the freed slot", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    handle.shutdown().await;
}

/// A handler that blocks its thread past its timeout cannot be cancelled: the
/// keeper fails its attempt as timed out all the same, and when the handler
/// returns at last, its result is not recorded.
pub async fn a_handler_blocked_past_its_timeout_is_failed_by_the_keeper(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["block"]).await;
    let gate = ThreadGate::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .concurrency(1)
        .timeout(Duration::from_secs(60))
        .cancel_grace(Duration::from_millis(30))
        .disable_reclaim()
        .handler("plan", blocking_handler(tx, gate.clone(), 1));
    let handle = build(worker).spawn();
    recv(&mut rx, "the blocking handler").await;
    env.clock.advance(Duration::from_secs(60));
    let job = wait_for(&store, ids[0], "the attempt failed by the keeper", |j| {
        j.state == JobState::Queued
    })
    .await;
    assert_eq!(job.last_error.as_deref(), Some("timed out after 60s"));
    gate.open();
    handle.shutdown().await;
    let job = store.get(ids[0]).await.expect("get");
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Queued, 1),
        "the handler's late success was not recorded"
    );
}

/// Every lease the worker holds is extended with one `heartbeat_batch` call per
/// interval, not one call per job.
pub async fn heartbeats_go_out_in_one_call_per_interval(env: Env) {
    let store = env.store().await;
    let ids = enqueue_plan(&store, &["wait"; 8]).await;
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    let gate = ThreadGate::new();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let handler_gate = gate.clone();
    let worker = test_worker(counted, "w")
        .concurrency(8)
        .disable_reclaim()
        .handler("plan", move |ctx: JobContext, _payload: Bytes| {
            let (tx, gate) = (tx.clone(), handler_gate.clone());
            async move {
                let _ = tx.send(seen(&ctx));
                gate.wait_async().await;
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    for _ in 0..ids.len() {
        recv(&mut rx, "every handler").await;
    }
    let before = counting.heartbeat_batches.load(Ordering::SeqCst);
    outlive_leases(&env, &store, &ids).await;
    let calls = counting.heartbeat_batches.load(Ordering::SeqCst) - before;
    handle.shutdown_handle().shutdown();
    gate.open();
    handle.join().await;
    assert!(calls >= 1, "the leases were extended by heartbeat_batch");
    // Four lease-halves passed, each seen by at least one call for all eight jobs;
    // one call per job would be 32 or more.
    assert!(
        calls < 8 * 4,
        "{calls} heartbeat_batch calls for 8 jobs over 4 waits: not batched"
    );
}
