use super::*;

/// Every job runs exactly once, its result is stored, with two workers (on two
/// store handles) competing for the jobs.
pub async fn runs_once_and_stores_result(env: Env) {
    let store = env.store().await;
    let mut ids = Vec::new();
    for n in 0..40u32 {
        let job = NewJob::new("math").json(&n).expect("encode");
        ids.push(enqueue(&store, job).await);
    }
    let runs: Arc<Mutex<HashMap<JobId, u32>>> = Arc::default();
    let mut handles = Vec::new();
    for name in ["w1", "w2"] {
        let runs = runs.clone();
        let worker = test_worker(env.store().await, name)
            .concurrency(4)
            .claim_batch(3)
            .json_handler("math", move |ctx: JobContext, n: u32| {
                let runs = runs.clone();
                async move {
                    *runs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(ctx.id())
                        .or_default() += 1;
                    Ok(Json(n * 2))
                }
            });
        handles.push(build(worker).spawn());
    }
    for (n, id) in ids.iter().enumerate() {
        let job = wait_for(&store, *id, "success", |j| j.state == JobState::Succeeded).await;
        assert_eq!(job.attempts, 1);
        assert!(job.lease.is_none());
        assert!(job.finished_at.is_some());
        let expected = serde_json::to_vec(&(n as u32 * 2)).expect("encode");
        assert_eq!(
            job.result.as_deref(),
            Some(&expected[..]),
            "result of job {n}"
        );
    }
    for handle in handles {
        handle.shutdown().await;
    }
    let runs = runs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(runs.len(), ids.len(), "every job ran");
    assert!(runs.values().all(|&n| n == 1), "a job ran twice: {runs:?}");
    let stats = store.stats("math").await.expect("stats");
    assert_eq!(stats.succeeded, 40);
    assert_eq!(stats.total(), 40);
}

/// A failing job is retried at `now + backoff(attempt)` on the store's clock, and is
/// dead after `max_attempts`.
pub async fn failures_retry_with_backoff_then_die(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w").handler(
        "flaky",
        move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(ctx.attempt());
                Err::<(), _>(JobError::retry(format!("boom {}", ctx.attempt())))
            }
        },
    );
    let handle = build(worker).spawn();
    let id = enqueue(&store, NewJob::new("flaky").max_attempts(3)).await;

    // Backoff: 10 s, then 20 s (no jitter), from the failure's instant.
    for (attempt, delay) in [(1u32, 10u64), (2, 20)] {
        assert_eq!(recv(&mut rx, "an attempt").await, attempt);
        let job = wait_for(&store, id, "the retry", |j| {
            j.state == JobState::Queued && j.attempts == attempt
        })
        .await;
        assert_eq!(
            job.run_at,
            env.clock.now().saturating_add(Duration::from_secs(delay)),
            "retry {attempt} is scheduled by the backoff on the store clock"
        );
        assert_eq!(job.last_error.as_deref(), Some(&*format!("boom {attempt}")));
        env.clock.advance(Duration::from_secs(delay));
    }
    assert_eq!(recv(&mut rx, "the last attempt").await, 3);
    let job = wait_for(&store, id, "death", |j| j.state == JobState::Dead).await;
    assert_eq!(job.attempts, 3);
    assert_eq!(job.last_error.as_deref(), Some("boom 3"));
    assert!(job.finished_at.is_some());
    handle.shutdown().await;
    assert!(rx.try_recv().is_err(), "a dead job ran again");
}

/// Each run of a job through the runtime is one attempt in its history (CONTRACT
/// H1, H2), with the worker's id and each run's outcome: a failure with its error, a
/// snooze as released, and the success; the run-time histogram reads the same
/// records' clock.
pub async fn attempts_record_each_run_with_its_worker(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runs = Arc::new(AtomicUsize::new(0));
    let worker = test_worker(env.store().await, "w-attempts")
        .backoff(Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(5),
            jitter: 0.0,
        })
        .handler("tries", move |_ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            let runs = runs.clone();
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(run);
                match run {
                    0 => Err(JobError::retry("first run fails")),
                    1 => Err(JobError::snooze("not yet", Duration::from_secs(5))),
                    _ => Ok(()),
                }
            }
        });
    let handle = build(worker).spawn();
    let id = enqueue(&store, NewJob::new("tries")).await;
    for run in 0..2 {
        assert_eq!(recv(&mut rx, "a run").await, run);
        wait_for(&store, id, "the job back in its queue", |j| {
            j.state == JobState::Queued && j.started_at.is_some()
        })
        .await;
        // The next claim's instant is later, so each attempt has its own start.
        env.clock.advance(Duration::from_secs(5));
    }
    assert_eq!(recv(&mut rx, "the last run").await, 2);
    wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    handle.shutdown().await;
    let attempts = store.attempts(id).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (
                a.token.get(),
                a.worker.as_str(),
                a.outcome,
                a.error.as_deref()
            ))
            .collect::<Vec<_>>(),
        vec![
            (
                1,
                "w-attempts",
                AttemptOutcome::Failed,
                Some("first run fails")
            ),
            (2, "w-attempts", AttemptOutcome::Released, None),
            (3, "w-attempts", AttemptOutcome::Succeeded, None),
        ],
        "each run is an attempt with its worker, outcome and error"
    );
    assert!(
        attempts
            .windows(2)
            .all(|w| w[0].started_at < w[1].started_at),
        "each attempt starts at its own claim"
    );
    assert!(
        attempts.iter().all(|a| a.ended_at >= Some(a.started_at)),
        "every attempt ended after it started"
    );
}

/// A handler that snoozes runs again after the delay (store clock) as the same
/// attempt: snoozes use up no attempts and record no error (CONTRACT L10).
pub async fn snoozed_jobs_run_again_later_without_using_an_attempt(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let looks = Arc::new(AtomicUsize::new(0));
    let worker = test_worker(env.store().await, "w").handler(
        "poll",
        move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            let looks = looks.clone();
            async move {
                let _ = tx.send(ctx.attempt());
                // Not ready the first three times it looks.
                if looks.fetch_add(1, Ordering::SeqCst) < 3 {
                    return Err(JobError::snooze("not ready", Duration::from_secs(30)));
                }
                Ok(())
            }
        },
    );
    let handle = build(worker).spawn();
    let start = env.clock.now();
    let id = enqueue(&store, NewJob::new("poll").max_attempts(1)).await;
    for look in 1..=3u64 {
        assert_eq!(recv(&mut rx, "a look").await, 1, "a snooze is no attempt");
        let job = wait_for(&store, id, "the snooze", |j| {
            j.state == JobState::Queued && j.attempts == 0
        })
        .await;
        assert_eq!(
            job.run_at,
            env.clock.now().saturating_add(Duration::from_secs(30)),
            "look {look} snoozed 30 s on the store clock"
        );
        assert_eq!(job.last_error, None, "a snooze records no error");
        env.clock.advance(Duration::from_secs(30));
    }
    assert_eq!(recv(&mut rx, "the last look").await, 1);
    let job = wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    assert_eq!(
        job.attempts, 1,
        "one attempt of one allowed, after three snoozes"
    );
    assert_eq!(
        job.run_at,
        start.saturating_add(Duration::from_secs(90)),
        "the job ran at its third snooze's time"
    );
    handle.shutdown().await;
}

/// A schedule declared on two workers is stored when they start and fired by both
/// at every interval: each tick (store clock) runs once, and a disable stops it
/// (CONTRACT S1–S3).
pub async fn declared_schedules_fire_once_per_tick(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let beat = Schedule::every("beat", Duration::from_secs(10), NewJob::new("beat"));
    let mut handles = Vec::new();
    for name in ["w1", "w2"] {
        let tx = tx.clone();
        let worker = test_worker(env.store().await, name)
            .schedule(beat.clone())
            .schedule_interval(Duration::from_millis(10))
            .handler("beat", move |ctx: JobContext, _payload: Bytes| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(ctx.job().run_at);
                    Ok(())
                }
            });
        handles.push(build(worker).spawn());
    }
    // Both workers store the schedule; the first put decides its last tick.
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let listed = tokio::time::timeout(PATIENCE, async {
        loop {
            ticker.tick().await;
            if let Ok(records) = store.schedules().await {
                if let Some(record) = records.into_iter().next() {
                    return record;
                }
            }
        }
    })
    .await;
    let Ok(record) = listed else {
        panic!("the declared schedule was never stored");
    };
    let Some(first) = record.next_tick else {
        panic!("an interval always has a next tick");
    };
    env.clock.set(first);
    assert_eq!(recv(&mut rx, "the first tick").await, first);
    let second = first.saturating_add(Duration::from_secs(10));
    env.clock.set(second);
    assert_eq!(recv(&mut rx, "the second tick").await, second);
    // Both jobs stored as succeeded before the clock jumps past their leases.
    let done = tokio::time::timeout(PATIENCE, async {
        loop {
            ticker.tick().await;
            if store.stats("beat").await.is_ok_and(|s| s.succeeded == 2) {
                return;
            }
        }
    })
    .await;
    assert!(done.is_ok(), "the two ticks' jobs never both succeeded");
    store.disable_schedule("beat").await.expect("disable");
    env.clock.advance(Duration::from_secs(60));
    for handle in handles {
        handle.shutdown().await;
    }
    assert!(
        rx.try_recv().is_err(),
        "a tick ran twice, or ran after the disable"
    );
    let stats = store.stats("beat").await.expect("stats");
    assert_eq!(stats.succeeded, 2, "two ticks, two jobs");
}

/// A handler enqueues a follow-up job through its context's store (on a store tied
/// to its runtime, that call is made on the store's runtime, not the handlers');
/// the follow-up runs, as the parent's child.
pub async fn handlers_enqueue_follow_ups_through_their_context(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w")
        .handler("parent", |ctx: JobContext, _payload: Bytes| async move {
            ctx.store()
                .enqueue(NewJob::new("child").parent(ctx.id()))
                .await
                .map_err(durq::JobError::from_error)?;
            Ok(())
        })
        .handler("child", move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(ctx.job().parent);
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    let parent = enqueue(&store, NewJob::new("parent")).await;
    assert_eq!(recv(&mut rx, "the follow-up").await, Some(parent));
    wait_for(&store, parent, "the parent's success", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    handle.shutdown().await;
    let children = store.children(parent).await.expect("children");
    assert_eq!(children.len(), 1, "one follow-up");
    assert_eq!(children[0].state, JobState::Succeeded);
}

/// A store that says it is tied to its runtime and cannot be reopened: the worker then
/// gives its handlers the store through the layer that hops each call to the store's
/// runtime (`worker/on_store.rs`), whatever the backend beneath.
#[derive(Debug)]
struct TiedWithoutReopen(Arc<dyn Backend>);

#[durq::layers::async_trait]
impl LayeredBackend for TiedWithoutReopen {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }

    fn capabilities(&self) -> durq::layers::Capabilities {
        self.0.capabilities().tied_to_runtime(true)
    }
}

/// A handler's store declares every capability the worker's store declares, and each
/// works from the handler, when the handler reaches it through the layer that hops
/// each call to the store's runtime (a store tied to its runtime that cannot open
/// connections for the handlers' own). That layer must forward every capability:
/// flow control once was not, so a child with a concurrency key was refused and
/// `limits` answered `Unsupported`.
pub async fn handlers_reach_every_capability_through_their_context(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (tied, _) = env.layered(TiedWithoutReopen).await;
    let worker =
        test_worker(tied, "w").handler("parent", move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            async move {
                let supported: Vec<(durq::Capability, bool)> = durq::Capability::ALL
                    .iter()
                    .map(|&capability| (capability, ctx.store().supports(capability)))
                    .collect();
                let keyed = if ctx.store().supports(durq::Capability::FlowControl) {
                    let limits = durq::QueueLimits::new().max_running_per_key(1);
                    ctx.store()
                        .set_limits("keyed-child", limits)
                        .await
                        .map_err(JobError::from_error)?;
                    let child = NewJob::new("keyed-child").concurrency_key("k");
                    ctx.enqueue_child(child)
                        .await
                        .map_err(JobError::from_error)?;
                    let read = ctx
                        .store()
                        .limits("keyed-child")
                        .await
                        .map_err(JobError::from_error)?;
                    let status = ctx
                        .store()
                        .flow_status("keyed-child")
                        .await
                        .map_err(JobError::from_error)?;
                    Some((read, status.running))
                } else {
                    None
                };
                let _ = tx.send((supported, keyed));
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    let parent = enqueue(&store, NewJob::new("parent")).await;
    let (supported, keyed) = recv(&mut rx, "the handler's report").await;
    let expected: Vec<(durq::Capability, bool)> = durq::Capability::ALL
        .iter()
        .map(|&capability| (capability, store.supports(capability)))
        .collect();
    assert_eq!(
        supported, expected,
        "the handler's store declares what the worker's does"
    );
    if let Some((limits, running)) = keyed {
        assert_eq!(
            limits,
            durq::QueueLimits::new().max_running_per_key(1),
            "the handler read back the limits it set"
        );
        assert_eq!(running, 0, "no child runs: no worker serves its queue");
        let children = store.children(parent).await.expect("children");
        assert_eq!(children.len(), 1, "the keyed child was enqueued");
        assert_eq!(children[0].concurrency_key.as_deref(), Some("k"));
    }
    handle.shutdown().await;
}

/// A worker with a capacity runs only what fits what is free: two one-GPU jobs at
/// a time on two GPUs (the slots would allow eight), a third once one ends, never
/// a job that needs more than it has or a capability it lacks; those stay queued
/// and untouched (CONTRACT F2–F4).
pub async fn capacity_bounds_what_runs_at_once(env: Env) {
    let store = env.store().await;
    let (started, mut starts) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let in_use = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (gate, in_use, most) = (gate.clone(), in_use.clone(), most.clone());
        move |ctx: JobContext, _payload: Bytes| {
            let (started, gate, in_use, most) =
                (started.clone(), gate.clone(), in_use.clone(), most.clone());
            async move {
                let gpus = ctx.job().needs.amounts().get("gpu").copied().unwrap_or(0) as usize;
                let now = in_use.fetch_add(gpus, Ordering::SeqCst) + gpus;
                most.fetch_max(now, Ordering::SeqCst);
                let _ = started.send(ctx.id());
                if let Ok(permit) = gate.acquire().await {
                    permit.forget();
                }
                in_use.fetch_sub(gpus, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let one_gpu = || NewJob::new("gpu").needs(Needs::new().amount("gpu", 1).capability("cuda"));
    let mut small = Vec::new();
    for _ in 0..4 {
        small.push(enqueue(&store, one_gpu()).await);
    }
    let too_big = enqueue(
        &store,
        NewJob::new("gpu").needs(Needs::new().amount("gpu", 3)),
    )
    .await;
    let fpga = enqueue(
        &store,
        NewJob::new("gpu").needs(Needs::new().capability("fpga")),
    )
    .await;
    let worker = test_worker(env.store().await, "w")
        .concurrency(8)
        .capacity(Budget::new().amount("gpu", 2).capability("cuda"))
        .handler("gpu", handler);
    let handle = build(worker).spawn();

    let mut ran = vec![
        recv(&mut starts, "the first GPU job").await,
        recv(&mut starts, "the second GPU job").await,
    ];
    assert_eq!(ran, small[..2], "the first two fit, in claim order");
    for id in &small[2..] {
        let job = store.get(*id).await.expect("get");
        assert_eq!(
            job.state,
            JobState::Queued,
            "no GPU is free for the third job"
        );
    }
    for _ in 0..2 {
        gate.add_permits(1);
        ran.push(recv(&mut starts, "a GPU job once a GPU is free").await);
    }
    gate.add_permits(2);
    for id in &small {
        wait_for(&store, *id, "success", |j| j.state == JobState::Succeeded).await;
    }
    handle.shutdown().await;
    ran.sort();
    assert_eq!(ran, small, "every one-GPU job ran once");
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "at most two GPUs were in use at once"
    );
    for id in [too_big, fpga] {
        let job = store.get(id).await.expect("get");
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Queued, 0),
            "a job that never fits stays queued, untouched"
        );
    }
}

/// A running worker records itself (CONTRACT W1–W4): its queues, concurrency, host
/// and process, with its jobs in flight renewed at every heartbeat; it reaps the
/// records of workers silent past `worker_silence` (a minute by default here), not
/// its own; and its record is gone once it has shut down.
pub async fn workers_record_themselves_while_they_run(env: Env) {
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q")).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler_gate = gate.clone();
    let (reports, record_calls) = env.layered(RecordCalls::new).await;
    let mut record_calls = record_calls.take_receiver();
    let worker = test_worker(reports, "recorded").concurrency(3).handler(
        "q",
        move |_ctx: JobContext, _payload: Bytes| {
            let gate = handler_gate.clone();
            async move {
                let _permit = gate.acquire().await;
                Ok(())
            }
        },
    );
    let handle = build(worker).spawn();
    reported(&mut record_calls, 1, "a report of the running job").await;
    let running = store.worker("recorded").await.expect("the worker's record");
    assert_eq!(running.in_flight, 1);
    assert_eq!(running.queues, ["q"]);
    assert_eq!(running.concurrency, 3);
    assert_eq!(running.pid, std::process::id());
    assert!(!running.host.is_empty());
    gate.add_permits(1);
    wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    reported(&mut record_calls, 0, "a report once the job is done").await;
    let idle = store.worker("recorded").await.expect("the worker's record");
    assert!(idle.last_seen >= running.last_seen);

    let ghost = durq::WorkerInfo::new("ghost", "gone.example", 1, vec!["q".into()], 1);
    store.register_worker(&ghost).await.expect("register");
    env.clock.advance(Duration::from_secs(61));
    let mut reaped_itself = false;
    loop {
        if let RecordCall::Reaped(mut ids) = recv(&mut record_calls, "a reap").await {
            // The clock jumped past the running worker's last renewal too, if that
            // renewal came before the jump: it may reap itself (W4 by the store's
            // clock), and its next beat, finding its record gone, registers it again
            // (awaited below).
            let before = ids.len();
            ids.retain(|id| id != "recorded");
            reaped_itself |= ids.len() < before;
            if !ids.is_empty() {
                assert_eq!(ids, ["ghost"], "only the silent worker is reaped");
                break;
            }
        }
    }
    if reaped_itself {
        reported(
            &mut record_calls,
            0,
            "its registration after reaping itself",
        )
        .await;
    }
    assert!(matches!(
        store.worker("ghost").await,
        Err(durq::Error::WorkerNotFound { .. })
    ));
    store
        .worker("recorded")
        .await
        .expect("a worker keeps its own record");
    handle.shutdown().await;
    assert!(
        matches!(
            store.worker("recorded").await,
            Err(durq::Error::WorkerNotFound { .. })
        ),
        "a stopped worker's record is gone"
    );
}

/// A worker facing ready jobs it cannot take (none fits its capacity) does not
/// spin on the store's wake-ups. The store here wakes every wait at once, as
/// SQLite's does while any job is ready (the contract allows spurious wake-ups):
/// once two wake-ups in a row led to empty claims, the worker's next wait is a
/// plain poll, so it waits for work before at most five of eight claims. A
/// spinning worker waits before every claim.
pub async fn ready_jobs_that_do_not_fit_cost_no_spin(env: Env) {
    const CLAIMS: usize = 8;
    let store = env.store().await;
    let unfit = enqueue(
        &store,
        NewJob::new("gpu").needs(Needs::new().amount("gpu", 1)),
    )
    .await;
    let (woken, wakes) = env.layered(|inner| AlwaysWakes::new(inner, CLAIMS)).await;
    let worker = test_worker(woken, "w")
        .capacity(Budget::new().amount("gpu", 0))
        .handler("gpu", |_ctx: JobContext, _payload: Bytes| async { Ok(()) });
    let handle = build(worker).spawn();
    let waits = recv(&mut wakes.take_receiver(), "the worker's claims").await;
    handle.shutdown().await;
    assert!(
        waits <= CLAIMS / 2 + 1,
        "{waits} waits for work before {CLAIMS} claims: the worker spins on wake-ups \
         for a job it cannot take"
    );
    let job = store.get(unfit).await.expect("get");
    assert_eq!((job.state, job.attempts), (JobState::Queued, 0));
}

/// A permanent error, and a payload a typed handler cannot decode, go dead at once
/// whatever attempts are left.
pub async fn permanent_errors_go_dead_at_once(env: Env) {
    let store = env.store().await;
    let worker = test_worker(env.store().await, "w")
        .handler("strict", |_ctx, _payload| async {
            Err::<(), _>(JobError::permanent("invalid invoice"))
        })
        .json_handler("typed", |_ctx, n: u64| async move { Ok(Json(n)) });
    let handle = build(worker).spawn();
    let strict = enqueue(&store, NewJob::new("strict").max_attempts(5)).await;
    let garbage = enqueue(
        &store,
        NewJob::new("typed").payload("not json").max_attempts(5),
    )
    .await;
    let job = wait_for(&store, strict, "death", |j| j.state == JobState::Dead).await;
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error.as_deref(), Some("invalid invoice"));
    let job = wait_for(&store, garbage, "death", |j| j.state == JobState::Dead).await;
    assert_eq!(job.attempts, 1);
    assert!(
        job.last_error
            .as_deref()
            .is_some_and(|e| e.contains("payload is not a valid u64")),
        "{:?}",
        job.last_error
    );
    handle.shutdown().await;
}

/// A worker that dies mid-job (no release) loses the job once its lease runs out:
/// another worker reclaims and runs it, and the dead worker's late calls are refused.
pub async fn dead_workers_jobs_are_reclaimed(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let doomed = test_worker(env.store().await, "doomed").handler(
        "work",
        move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(seen(&ctx));
                std::future::pending::<()>().await;
                Ok(())
            }
        },
    );
    let doomed = build(doomed).spawn();
    let id = enqueue(&store, NewJob::new("work")).await;
    let first = recv(&mut rx, "the first run").await;
    assert_eq!(first.id, id);
    doomed.abort();
    let _ = tokio::time::timeout(PATIENCE, doomed.join()).await;
    let job = store.get(id).await.expect("get");
    assert_eq!(
        job.state,
        JobState::Running,
        "a crashed worker releases nothing"
    );
    assert_eq!(job.lease.as_ref().map(|l| l.token), Some(first.token));

    let (tx, mut rx) = mpsc::unbounded_channel();
    let survivor = test_worker(env.store().await, "survivor").handler(
        "work",
        move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(seen(&ctx));
                Ok("second time lucky")
            }
        },
    );
    let survivor = build(survivor).spawn();
    // Expiry is strict (R1): one millisecond past the lease.
    env.clock.advance(LEASE + Duration::from_millis(1));
    let second = recv(&mut rx, "the rerun").await;
    assert_eq!(second.id, id);
    assert_eq!(second.attempt, 2);
    assert!(second.token > first.token);
    let job = wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    assert_eq!(job.result.as_deref(), Some(&b"second time lucky"[..]));
    assert_eq!(job.attempts, 2);

    let late = store.complete(id, first.token, None).await;
    assert!(late.as_ref().is_err_and(|e| e.is_lease_lost()), "{late:?}");
    let late = store
        .fail(id, first.token, "late", durq::worker_calls::Retry::Never)
        .await;
    assert!(late.as_ref().is_err_and(|e| e.is_lease_lost()), "{late:?}");
    assert_eq!(
        store.get(id).await.expect("get").state,
        JobState::Succeeded,
        "the late calls changed nothing"
    );
    survivor.shutdown().await;
}

/// Heartbeats keep a job that runs far longer than its lease: the clock moves well
/// past the original expiry and nothing reclaims it.
pub async fn heartbeats_keep_long_jobs(env: Env) {
    let store = env.store().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let finish = Arc::new(Notify::new());
    let finish_in_handler = finish.clone();
    let worker = test_worker(env.store().await, "w").handler(
        "long",
        move |ctx: JobContext, _payload: Bytes| {
            let tx = tx.clone();
            let finish = finish_in_handler.clone();
            async move {
                let _ = tx.send(seen(&ctx));
                finish.notified().await;
                Ok(())
            }
        },
    );
    let handle = build(worker).spawn();
    let id = enqueue(&store, NewJob::new("long")).await;
    let first = recv(&mut rx, "the run").await;
    let original_expiry = store
        .get(id)
        .await
        .expect("get")
        .lease
        .map(|l| l.expires_at)
        .expect("a lease");

    // Five steps of two thirds of the lease: 100 s in all, over three leases.
    for _ in 0..5 {
        env.clock.advance(LEASE * 2 / 3);
        let now = env.clock.now();
        let job = wait_for(&store, id, "a heartbeat", |j| j.heartbeat_at == Some(now)).await;
        assert_eq!(
            job.lease.as_ref().map(|l| l.expires_at),
            Some(now.saturating_add(LEASE))
        );
    }
    assert!(env.clock.now() > original_expiry);
    let reclaimed = store.reclaim(100).await.expect("reclaim");
    assert!(
        reclaimed.is_empty(),
        "reclaimed a heartbeating job: {reclaimed:?}"
    );
    let job = store.get(id).await.expect("get");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.attempts, 1);
    assert_eq!(job.lease.map(|l| l.token), Some(first.token));

    finish.notify_one();
    let job = wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    assert_eq!(job.attempts, 1);
    assert!(rx.try_recv().is_err(), "the job ran twice");
    handle.shutdown().await;
}
