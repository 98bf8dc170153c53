use super::*;

/// Lifecycle hooks hear each outcome once the store has it, with the job's id,
/// queue, attempt and worker: a success recorded in a batch, one recorded by the
/// handler itself (a returned `FencedCompletion`), a permanent failure (dead), a
/// failure retried past its backoff and then dead on its last attempt, a snooze, a
/// cancellation by an operator while running, and a release at shutdown. Each
/// event arrives on the hook's channel without polling the store, and the store
/// already shows the outcome when it does. Two hooks both hear everything.
pub async fn lifecycle_hooks_hear_every_stored_outcome(env: Env) {
    let store = env.store().await;
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let (tx, mut events) = mpsc::unbounded_channel();
    let second_hook = Arc::new(AtomicUsize::new(0));
    let snoozed_once = Arc::new(AtomicBool::new(false));
    let counted = second_hook.clone();
    let worker = test_worker(env.store().await, "w")
        .shutdown_grace(Duration::from_millis(100))
        .on_event(hear(tx))
        .on_event(move |_event| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .handler("life", move |ctx: JobContext, payload: Bytes| {
            let started_tx = started_tx.clone();
            let snoozed_once = snoozed_once.clone();
            async move {
                let _ = started_tx.send(ctx.id());
                match &payload[..] {
                    b"ok" => Ok(()),
                    b"bad" => Err(JobError::permanent("invalid invoice")),
                    b"flaky" => Err(JobError::retry(format!("boom {}", ctx.attempt()))),
                    b"poll" if !snoozed_once.swap(true, Ordering::SeqCst) => {
                        Err(JobError::snooze("not ready", Duration::from_secs(30)))
                    }
                    b"poll" => Ok(()),
                    b"cancel-me" => {
                        ctx.cancelled().await;
                        Err(JobError::retry("stopped on request"))
                    }
                    // Ignores every cancellation: dropped at shutdown, and released.
                    _ => std::future::pending().await,
                }
            }
        })
        .handler("fenced", |ctx: JobContext, _payload: Bytes| async move {
            // Stored by the handler itself, as a transaction of its own would.
            ctx.store()
                .complete(ctx.id(), ctx.lease_token(), None)
                .await
                .map_err(JobError::from_error)?;
            // The next heartbeat finds the lease gone (the job has succeeded) and
            // cancels the handler: the receipt still says the job succeeded.
            ctx.cancelled().await;
            assert_eq!(ctx.cancel_reason(), Some(CancelReason::LeaseLost));
            Ok(durq::FencedCompletion::new(ctx.id(), ctx.lease_token()))
        });
    let handle = build(worker).spawn();
    let mut heard = 0;

    let ok = enqueue(&store, NewJob::new("life").payload("ok")).await;
    let event = recv(&mut events, "the success's event").await;
    heard += 1;
    assert_event(&event, ok, "life", 1, &JobOutcome::Succeeded);
    assert!(event.is_final());
    assert_state(&store, ok, JobState::Succeeded).await;

    // Completed by its handler, which returns its receipt only after a heartbeat
    // found the lease gone (as one may, between a transaction's commit and the
    // handler's return).
    let fenced = enqueue(&store, NewJob::new("fenced")).await;
    let event = recv(&mut events, "the fenced completion's event").await;
    heard += 1;
    assert_event(&event, fenced, "fenced", 1, &JobOutcome::Succeeded);
    assert_state(&store, fenced, JobState::Succeeded).await;

    let bad = enqueue(&store, NewJob::new("life").payload("bad").max_attempts(5)).await;
    let event = recv(&mut events, "the dead job's event").await;
    heard += 1;
    let dead = JobOutcome::Dead {
        error: "invalid invoice".to_owned(),
    };
    assert_event(&event, bad, "life", 1, &dead);
    assert!(event.is_final());
    assert_state(&store, bad, JobState::Dead).await;

    // Backoff 10 s (no jitter) from the failure's instant on the store clock.
    let flaky = enqueue(&store, NewJob::new("life").payload("flaky").max_attempts(2)).await;
    let event = recv(&mut events, "the failure's event").await;
    heard += 1;
    let retry_at = env.clock.now().saturating_add(Duration::from_secs(10));
    let failed = JobOutcome::Failed {
        error: "boom 1".to_owned(),
        retry_at,
    };
    assert_event(&event, flaky, "life", 1, &failed);
    assert!(!event.is_final());
    let job = store.get(flaky).await.expect("get");
    assert_eq!(
        (job.state, job.attempts, job.run_at),
        (JobState::Queued, 1, retry_at),
        "the retry was stored before its event"
    );
    assert!(
        events.try_recv().is_err(),
        "the retry does not run before its time"
    );
    env.clock.advance(Duration::from_secs(10));
    let event = recv(&mut events, "the last attempt's event").await;
    heard += 1;
    let dead = JobOutcome::Dead {
        error: "boom 2".to_owned(),
    };
    assert_event(&event, flaky, "life", 2, &dead);
    assert_state(&store, flaky, JobState::Dead).await;

    let poll = enqueue(&store, NewJob::new("life").payload("poll").max_attempts(1)).await;
    let event = recv(&mut events, "the snooze's event").await;
    heard += 1;
    let until = env.clock.now().saturating_add(Duration::from_secs(30));
    assert_event(&event, poll, "life", 1, &JobOutcome::Snoozed { until });
    let job = store.get(poll).await.expect("get");
    assert_eq!(
        (job.state, job.attempts, job.run_at),
        (JobState::Queued, 0, until)
    );
    env.clock.advance(Duration::from_secs(30));
    let event = recv(&mut events, "the snoozed job's success").await;
    heard += 1;
    assert_event(&event, poll, "life", 1, &JobOutcome::Succeeded);

    let cancelled = enqueue(&store, NewJob::new("life").payload("cancel-me")).await;
    while recv(&mut started_rx, "the cancellable job to start").await != cancelled {}
    assert_eq!(
        store.cancel(cancelled).await.expect("cancel"),
        JobState::Running
    );
    let event = recv(&mut events, "the cancellation's event").await;
    heard += 1;
    let outcome = JobOutcome::Cancelled {
        error: "cancelled: stopped on request".to_owned(),
    };
    assert_event(&event, cancelled, "life", 1, &outcome);
    assert!(event.is_final());
    assert_state(&store, cancelled, JobState::Cancelled).await;

    let stuck = enqueue(&store, NewJob::new("life").payload("stuck")).await;
    while recv(&mut started_rx, "the stuck job to start").await != stuck {}
    assert!(events.try_recv().is_err(), "a running job has no event");
    handle.shutdown().await;
    let event = match events.try_recv() {
        Ok(event) => event,
        Err(err) => panic!("no release event by the end of shutdown: {err}"),
    };
    heard += 1;
    assert_event(&event, stuck, "life", 1, &JobOutcome::Released);
    assert_state(&store, stuck, JobState::Queued).await;
    assert!(events.try_recv().is_err(), "one event per stored outcome");
    assert_eq!(
        second_hook.load(Ordering::SeqCst),
        heard,
        "every hook hears every event"
    );
}

/// Successes recorded in batches by the claim loop are heard one event per job,
/// once their batch is stored.
pub async fn batched_successes_are_heard_one_by_one(env: Env) {
    const JOBS: usize = 120;
    let store = env.store().await;
    let jobs: Vec<NewJob> = (0..JOBS).map(|_| NewJob::new("quick")).collect();
    let ids: Vec<JobId> = store
        .enqueue_batch(jobs)
        .await
        .expect("enqueue")
        .into_iter()
        .map(|enqueued| enqueued.id)
        .collect();
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let worker = test_worker(counted, "w")
        .concurrency(32)
        .on_event(hear(tx))
        .handler("quick", |_ctx: JobContext, _payload: Bytes| async {
            Ok::<(), JobError>(())
        });
    let handle = build(worker).spawn();
    let mut heard = std::collections::HashSet::new();
    for _ in 0..JOBS {
        let event = recv(&mut events, "a success's event").await;
        assert_eq!(event.outcome(), &JobOutcome::Succeeded);
        assert_eq!(event.attempt(), 1);
        assert!(heard.insert(event.id()), "two events for {}", event.id());
        let job = store.get(event.id()).await.expect("get");
        assert_eq!(
            job.state,
            JobState::Succeeded,
            "the event came after the batch was stored"
        );
    }
    handle.shutdown().await;
    assert!(events.try_recv().is_err(), "one event per job");
    assert_eq!(heard, ids.into_iter().collect(), "every job was heard");
    assert!(counting.batches.load(Ordering::SeqCst) * 4 <= JOBS);
}

/// A hook that panics is logged and skipped: the worker goes on (later jobs run and
/// are recorded, their successes recorded by the claim loop that called the hook),
/// and the other hooks still hear every event.
pub async fn a_panicking_hook_stops_nothing(env: Env) {
    let store = env.store().await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let panics = Arc::new(AtomicUsize::new(0));
    let panicked = panics.clone();
    let worker = test_worker(env.store().await, "w")
        .on_event(move |_event| {
            panicked.fetch_add(1, Ordering::SeqCst);
            panic!("a broken hook");
        })
        .on_event(hear(tx))
        .handler("work", |_ctx: JobContext, payload: Bytes| async move {
            if payload == "bad" {
                return Err(JobError::permanent("invalid"));
            }
            Ok(())
        });
    let handle = build(worker).spawn();
    for (n, payload) in ["ok", "bad", "ok", "ok"].into_iter().enumerate() {
        let id = enqueue(&store, NewJob::new("work").payload(payload)).await;
        let event = recv(&mut events, "the next job's event").await;
        let outcome = match payload {
            "bad" => JobOutcome::Dead {
                error: "invalid".to_owned(),
            },
            _ => JobOutcome::Succeeded,
        };
        assert_event(&event, id, "work", 1, &outcome);
        assert_eq!(panics.load(Ordering::SeqCst), n + 1, "the broken hook ran");
    }
    handle.shutdown().await;
}

/// An outcome the store refuses (the lease was taken over, and the worker did not
/// hear of it: its heartbeats were failing) is not heard of: a hook never reports
/// what another worker's job became.
pub async fn refused_outcomes_are_not_heard(env: Env) {
    let store = env.store().await;
    let (counted, counting) = env.layered(|inner| CountingStore::new(inner, 0)).await;
    counting.heartbeats_down.store(true, Ordering::SeqCst);
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let release_rx = Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let (tx, mut events) = mpsc::unbounded_channel();
    // One slot, busy while the test steals the job: the worker cannot claim it back.
    let worker = test_worker(counted, "slow")
        .concurrency(1)
        .disable_reclaim()
        .on_event(hear(tx))
        .handler("work", move |ctx: JobContext, payload: Bytes| {
            let started_tx = started_tx.clone();
            let release_rx = release_rx.clone();
            async move {
                let _ = started_tx.send(seen(&ctx));
                if payload == "ok" {
                    return Ok(());
                }
                if let Some(rx) = release_rx.lock().await.take() {
                    let _ = rx.await;
                }
                Err(JobError::permanent("too late"))
            }
        });
    let handle = build(worker).spawn();
    let id = enqueue(&store, NewJob::new("work")).await;
    let first = recv(&mut started_rx, "the run").await;
    env.clock.advance(LEASE + Duration::from_millis(1));
    assert_eq!(store.reclaim(10).await.expect("reclaim").len(), 1);
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
    let _ = release_tx.send(());
    // A later job's event: the worker and its hook are still at work. Heartbeats
    // stay down, so nothing but the refused failure tells the worker of the theft.
    let later = enqueue(&store, NewJob::new("work").payload("ok")).await;
    let event = recv(&mut events, "the later job's event").await;
    assert_event(&event, later, "work", 1, &JobOutcome::Succeeded);
    handle.shutdown().await;
    assert!(
        events.try_recv().is_err(),
        "no event for the refused failure"
    );
    let job = store.get(id).await.expect("get");
    assert_eq!(
        (job.state, job.lease.map(|l| l.token)),
        (JobState::Running, Some(token)),
        "the old holder's failure was refused"
    );
    assert_eq!(
        job.last_error.as_deref(),
        Some("lease expired"),
        "set by the reclaim"
    );
    store
        .complete(id, token, None)
        .await
        .expect("the new holder completes");
}
