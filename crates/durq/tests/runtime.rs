//! The worker runtime, tested on every backend.
//!
//! Each scenario is written once, as an async function over a [`Server`] (something
//! that opens stores on given settings), and instantiated per backend by
//! `runtime_tests!`. Time that the store decides (lease expiry, retry times) is driven
//! with a `ManualClock`; the runtime's own real-time intervals (heartbeat, reclaim,
//! poll) are set short, and the tests wait on observable events: handler signals on
//! channels, and the store's state polled in a loop bounded by a timeout.
//!
//! Memory and SQLite always run. Redis (`REDIS_URL`) and PostgreSQL (`DATABASE_URL`)
//! are skipped loudly when unreachable, and fail under `JOBS_REQUIRE_SERVICES=1`; what
//! a test writes on them is removed when it ends, passed or panicked.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq::layers::{async_trait, Backend, LayeredBackend};
use durq::{
    AttemptOutcome, Backoff, Budget, Bytes, CancelReason, Clock, JobContext, JobError, JobEvent,
    JobId, JobOutcome, JobState, Json, LeaseToken, ManualClock, Needs, NewJob, Schedule, Store,
    StoreSettings, Timestamp, Worker, WorkerBuilder,
};
use tokio::sync::{mpsc, oneshot, Notify};

/// How long any wait in these tests may take before the test fails. Generous: the
/// machine is shared and slow; a passing run never comes near it.
const PATIENCE: Duration = Duration::from_secs(20);
/// The lease every test worker takes.
const LEASE: Duration = Duration::from_secs(30);

/// Opens stores of one backend. Stores opened with the same namespace share data
/// (as two processes on one database do).
#[async_trait]
trait Server: Send + Sync {
    async fn open(&self, settings: StoreSettings) -> Store;

    /// Removes everything stored under `namespace`, for a server that outlives the
    /// test; `Err` says what was left behind.
    async fn teardown(&self, namespace: &str) -> Result<(), String>;
}

/// One test's world: a backend, a manual clock, and a namespace of its own.
struct Env {
    server: Arc<dyn Server>,
    clock: ManualClock,
    settings: StoreSettings,
}

impl Env {
    fn new(server: Arc<dyn Server>) -> Self {
        let clock = ManualClock::default();
        let settings = StoreSettings::default()
            .namespace(unique_namespace())
            .clock(Arc::new(clock.clone()));
        Env {
            server,
            clock,
            settings,
        }
    }

    /// A new handle on this test's data.
    async fn store(&self) -> Store {
        self.server.open(self.settings.clone()).await
    }

    /// A new handle on this test's data, through `layer`; `layer` is returned too, to
    /// read and steer.
    async fn layered<L: LayeredBackend + 'static>(
        &self,
        layer: impl FnOnce(Arc<dyn Backend>) -> L,
    ) -> (Store, Arc<L>) {
        let layer = Arc::new(layer(self.store().await.backend().clone()));
        (Store::from(layer.clone() as Arc<dyn Backend>), layer)
    }
}

/// A namespace no other test, in this process or another, uses.
fn unique_namespace() -> String {
    durq_conformance::unique_namespace("rt")
}

#[cfg(any(feature = "redis", feature = "postgres"))]
use durq_conformance::skip_or_fail;

/// A worker builder with intervals short enough for tests and no jitter.
fn test_worker(store: Store, name: &str) -> WorkerBuilder {
    Worker::builder(store)
        .worker_id(name)
        .lease(LEASE)
        .heartbeat_interval(Duration::from_millis(20))
        .poll_interval(Duration::from_millis(20))
        .reclaim_interval(Duration::from_millis(20))
        .purge_interval(Duration::from_millis(200))
        .backoff(Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(3600),
            jitter: 0.0,
        })
}

/// Polls the job until `done` holds; fails the test with the last state seen after
/// [`PATIENCE`].
async fn wait_for(
    store: &Store,
    id: JobId,
    what: &str,
    done: impl Fn(&durq::Job) -> bool,
) -> durq::Job {
    let mut last = None;
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            ticker.tick().await;
            match store.get(id).await {
                Ok(job) if done(&job) => return job,
                Ok(job) => last = Some(job),
                Err(err) => panic!("get({id}) failed while waiting for {what}: {err}"),
            }
        }
    })
    .await;
    match waited {
        Ok(job) => job,
        Err(_) => panic!("timed out waiting for {what}; last seen: {last:#?}"),
    }
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    match tokio::time::timeout(PATIENCE, rx.recv()).await {
        Ok(Some(value)) => value,
        Ok(None) => panic!("channel closed while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

async fn enqueue(store: &Store, job: NewJob) -> JobId {
    match store.enqueue(job).await {
        Ok(enqueued) => enqueued.id,
        Err(err) => panic!("enqueue failed: {err}"),
    }
}

fn build(builder: WorkerBuilder) -> Worker {
    match builder.build() {
        Ok(worker) => worker,
        Err(err) => panic!("the worker did not build: {err}"),
    }
}

/// What a handler saw: the job, its lease token and attempt.
#[derive(Debug, Clone, Copy)]
struct Seen {
    id: JobId,
    token: LeaseToken,
    attempt: u32,
}

fn seen(ctx: &JobContext) -> Seen {
    Seen {
        id: ctx.id(),
        token: ctx.lease_token(),
        attempt: ctx.attempt(),
    }
}

mod scenarios {
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
            .shutdown_grace(Duration::from_millis(300))
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

        let next = test_worker(env.store().await, "next")
            .handler("work", |_ctx, _payload| async { Ok(()) });
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
}

/// A lifecycle hook that sends every event it hears on `tx`.
fn hear(tx: mpsc::UnboundedSender<JobEvent>) -> impl Fn(&JobEvent) + Send + Sync + 'static {
    move |event| {
        let _ = tx.send(event.clone());
    }
}

/// The event is `outcome` of attempt `attempt` of job `id` of `queue`, reported by the
/// test worker `w` (or `slow`) after its handler ran.
fn assert_event(event: &JobEvent, id: JobId, queue: &str, attempt: u32, outcome: &JobOutcome) {
    assert_eq!(
        (event.id(), event.queue(), event.attempt(), event.outcome()),
        (id, queue, attempt, outcome),
        "{event:?}"
    );
    assert!(["w", "slow"].contains(&event.worker_id()), "{event:?}");
    assert!(event.ran_for().is_some(), "the handler ran: {event:?}");
}

/// The job is in `state` now.
async fn assert_state(store: &Store, id: JobId, state: JobState) {
    let job = store.get(id).await.expect("get");
    assert_eq!(job.state, state, "the outcome was stored before its event");
}

/// Enqueues one job of queue `plan` per step, in order, its payload the step's name.
async fn enqueue_plan(store: &Store, plan: &[&str]) -> Vec<JobId> {
    let mut ids = Vec::with_capacity(plan.len());
    for step in plan {
        let job = NewJob::new("plan").payload(step.as_bytes().to_vec());
        ids.push(enqueue(store, job).await);
    }
    ids
}

/// A handler for `plan` jobs: reports each run, then a `block` job blocks its thread
/// on `gate` on attempts up to `block_attempts` (after a first await, so that it
/// blocks a task's thread rather than the claim loop, when `block_attempts` is
/// `u32::MAX`; in its first poll otherwise).
fn blocking_handler(
    tx: mpsc::UnboundedSender<Seen>,
    gate: ThreadGate,
    block_attempts: u32,
) -> impl Fn(JobContext, Bytes) -> futures_boxed::Boxed + Send + Sync + 'static {
    move |ctx: JobContext, payload: Bytes| {
        let (tx, gate) = (tx.clone(), gate.clone());
        Box::pin(async move {
            if block_attempts == u32::MAX {
                tokio::task::yield_now().await;
            }
            let _ = tx.send(seen(&ctx));
            if &payload[..] == b"block" && ctx.attempt() <= block_attempts {
                gate.wait_blocking();
            }
            Ok(())
        })
    }
}

mod futures_boxed {
    /// A handler's boxed future.
    pub type Boxed = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), durq::JobError>> + Send + 'static>,
    >;
}

/// A gate that blocks threads (not tasks) until the test opens it, or until a bound in
/// real time: on a runtime that does not keep leases apart from handlers, a blocked
/// runtime thread would stall the test itself, and the test must then fail, not hang.
#[derive(Clone)]
struct ThreadGate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl ThreadGate {
    const BOUND: Duration = Duration::from_secs(15);

    fn new() -> Self {
        ThreadGate(Arc::new((Mutex::new(false), std::sync::Condvar::new())))
    }

    fn open_now() -> Self {
        let gate = Self::new();
        gate.open();
        gate
    }

    fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        changed.notify_all();
    }

    fn wait_blocking(&self) {
        let (open, changed) = &*self.0;
        let guard = open.lock().unwrap_or_else(|p| p.into_inner());
        let _ = changed.wait_timeout_while(guard, Self::BOUND, |open| !*open);
    }

    async fn wait_async(&self) {
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        while !*self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) {
            ticker.tick().await;
        }
    }
}

/// Moves the store's clock four half-leases forward (two whole leases), and after each
/// step waits until every job's stored lease runs past the new time: the worker's
/// heartbeats must reach the store while the test drives its clock.
async fn outlive_leases(env: &Env, store: &Store, ids: &[JobId]) {
    for _ in 0..4 {
        env.clock.advance(LEASE / 2);
        let now = env.clock.now();
        for id in ids {
            wait_for(store, *id, "a heartbeat past the clock's new time", |j| {
                j.lease
                    .as_ref()
                    .is_some_and(|l| l.expires_at > now.saturating_add(LEASE / 4))
            })
            .await;
        }
    }
}

/// Waits until every job of `ids` has succeeded.
async fn wait_all_succeeded(store: &Store, ids: &[JobId]) {
    for id in ids {
        wait_for(store, *id, "success", |j| j.state == JobState::Succeeded).await;
    }
}

/// Each job of `ids` ran exactly once, on attempt `attempt`.
fn assert_each_ran_once(runs: &[Seen], ids: &[JobId], attempt: u32) {
    for id in ids {
        let attempts: Vec<u32> = runs
            .iter()
            .filter(|r| r.id == *id)
            .map(|r| r.attempt)
            .collect();
        assert_eq!(
            attempts,
            vec![attempt],
            "job {id} ran once, on attempt {attempt}"
        );
    }
}

/// A layer over the real backend counting how successes and heartbeats reach it,
/// and failing them on demand; every other call is forwarded as it is.
#[derive(Debug)]
struct CountingStore {
    inner: Arc<dyn Backend>,
    batches: AtomicUsize,
    batched_entries: AtomicUsize,
    /// This many `complete_batch` calls fail as a whole, unavailable, writing nothing.
    unavailable_batches: AtomicUsize,
    /// While set, every completion fails as a whole, unavailable, writing nothing.
    completions_down: AtomicBool,
    /// While set, every heartbeat fails as a whole, unavailable, writing nothing.
    heartbeats_down: AtomicBool,
    heartbeat_batches: AtomicUsize,
}

impl CountingStore {
    fn new(inner: Arc<dyn Backend>, unavailable_batches: usize) -> Self {
        CountingStore {
            inner,
            batches: AtomicUsize::new(0),
            batched_entries: AtomicUsize::new(0),
            unavailable_batches: AtomicUsize::new(unavailable_batches),
            completions_down: AtomicBool::new(false),
            heartbeats_down: AtomicBool::new(false),
            heartbeat_batches: AtomicUsize::new(0),
        }
    }
}

/// A store whose `wait_for_work` returns at once, every time; it counts the worker's
/// waits and, at its `claims`-th claim, sends how many waits came before it.
struct AlwaysWakes {
    inner: Arc<dyn Backend>,
    claims: AtomicUsize,
    waits: AtomicUsize,
    report_at: usize,
    report: mpsc::UnboundedSender<usize>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<usize>>>,
}

impl AlwaysWakes {
    fn new(inner: Arc<dyn Backend>, report_at: usize) -> Self {
        let (report, receiver) = mpsc::unbounded_channel();
        AlwaysWakes {
            inner,
            claims: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
            report_at,
            report,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    fn take_receiver(&self) -> mpsc::UnboundedReceiver<usize> {
        match self
            .receiver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(receiver) => receiver,
            None => panic!("the report's receiver was taken already"),
        }
    }
}

impl std::fmt::Debug for AlwaysWakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlwaysWakes").finish_non_exhaustive()
    }
}

#[async_trait]
impl LayeredBackend for AlwaysWakes {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn claim(
        &self,
        request: durq::worker_calls::ClaimRequest,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::worker_calls::ClaimedJob>> {
        if self.claims.fetch_add(1, Ordering::SeqCst) + 1 == self.report_at {
            let _ = self.report.send(self.waits.load(Ordering::SeqCst));
        }
        self.inner.claim(request, now).await
    }

    async fn wait_for_work(&self, _queues: &[String], _timeout: Duration) -> durq::Result<()> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A call a worker made about its own record, once the store answered it.
#[derive(Debug)]
enum RecordCall {
    /// A registration or heartbeat, with the jobs in flight it reported.
    Reported(u32),
    /// A reap, with the workers it removed.
    Reaped(Vec<String>),
}

/// Waits for the worker to report `in_flight` jobs in its record.
async fn reported(
    calls: &mut mpsc::UnboundedReceiver<RecordCall>,
    in_flight: u32,
    what: &'static str,
) {
    loop {
        if let RecordCall::Reported(n) = recv(calls, what).await {
            if n == in_flight {
                return;
            }
        }
    }
}

/// Reports the worker-record calls that went through, so a test waits on them instead
/// of polling the store.
#[derive(Debug)]
struct RecordCalls {
    inner: Arc<dyn Backend>,
    report: mpsc::UnboundedSender<RecordCall>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<RecordCall>>>,
}

impl RecordCalls {
    fn new(inner: Arc<dyn Backend>) -> Self {
        let (report, receiver) = mpsc::unbounded_channel();
        RecordCalls {
            inner,
            report,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    fn take_receiver(&self) -> mpsc::UnboundedReceiver<RecordCall> {
        match self
            .receiver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(receiver) => receiver,
            None => panic!("the report's receiver was taken already"),
        }
    }
}

#[async_trait]
impl LayeredBackend for RecordCalls {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn put_worker(
        &self,
        id: &str,
        spec: &str,
        in_flight: u32,
        now: Timestamp,
    ) -> durq::Result<()> {
        self.inner
            .require_worker_registry()?
            .put_worker(id, spec, in_flight, now)
            .await?;
        let _ = self.report.send(RecordCall::Reported(in_flight));
        Ok(())
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> durq::Result<bool> {
        let known = self
            .inner
            .require_worker_registry()?
            .touch_worker(id, in_flight, now)
            .await?;
        if known {
            let _ = self.report.send(RecordCall::Reported(in_flight));
        }
        Ok(known)
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> durq::Result<Vec<String>> {
        let reaped = self
            .inner
            .require_worker_registry()?
            .reap_workers(cutoff)
            .await?;
        let _ = self.report.send(RecordCall::Reaped(reaped.clone()));
        Ok(reaped)
    }
}

/// Wakes the first wait for work at once, for nothing; reports every later wait
/// (its number) before making it.
#[derive(Debug)]
struct WakesOnceForNothing {
    inner: Arc<dyn Backend>,
    waits: AtomicUsize,
    report: mpsc::UnboundedSender<usize>,
}

#[async_trait]
impl LayeredBackend for WakesOnceForNothing {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> durq::Result<()> {
        let n = self.waits.fetch_add(1, Ordering::SeqCst) + 1;
        if n == 1 {
            return Ok(());
        }
        let _ = self.report.send(n);
        self.inner.wait_for_work(queues, timeout).await
    }
}

/// One wake-up for nothing (a notice for a job another claim already took, as
/// PostgreSQL and Redis send now and then) leaves the worker listening: its next wait
/// is a wait for work, not a poll, so a job enqueued then is picked up at once rather
/// than after the poll interval (ten minutes here). A worker that polled after every
/// such wake-up kept pickups waiting up to the poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_up_for_nothing_leaves_the_worker_listening() {
    let Some(server) = memory().await else {
        return;
    };
    let env = Env::new(server);
    let store = env.store().await;
    let (report, mut waits) = mpsc::unbounded_channel();
    let (woken, _layer) = env
        .layered(|inner| WakesOnceForNothing {
            inner,
            waits: AtomicUsize::new(0),
            report,
        })
        .await;
    let (ran, mut runs) = mpsc::unbounded_channel();
    let worker = test_worker(woken, "w")
        .poll_interval(Duration::from_secs(600))
        .handler("q", move |ctx: JobContext, _payload: Bytes| {
            let ran = ran.clone();
            async move {
                let _ = ran.send(ctx.id());
                Ok(())
            }
        });
    let handle = build(worker).spawn();
    assert_eq!(
        recv(&mut waits, "a wait for work after the wake-up for nothing").await,
        2
    );
    let id = enqueue(&store, NewJob::new("q")).await;
    assert_eq!(
        recv(&mut runs, "the job enqueued while the worker waits").await,
        id
    );
    handle.shutdown().await;
}

fn test_outage() -> durq::Error {
    durq::Error::Unavailable {
        message: "test: the store is down".to_owned(),
        source: None,
    }
}

#[async_trait]
impl LayeredBackend for CountingStore {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<durq::worker_calls::HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::Result<durq::worker_calls::Heartbeat>>> {
        self.heartbeat_batches.fetch_add(1, Ordering::SeqCst);
        if self.heartbeats_down.load(Ordering::SeqCst) {
            return Err(test_outage());
        }
        self.inner.heartbeat_batch(leases, ttl, now).await
    }

    async fn complete_batch(
        &self,
        completions: Vec<durq::worker_calls::Completion>,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::Result<()>>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let refuse = self
            .unavailable_batches
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refuse || self.completions_down.load(Ordering::SeqCst) {
            return Err(test_outage());
        }
        self.batched_entries
            .fetch_add(completions.len(), Ordering::SeqCst);
        self.inner.complete_batch(completions, now).await
    }
}

macro_rules! runtime_tests {
    ($backend:ident, $open:expr) => {
        mod $backend {
            use super::*;

            async fn env() -> Option<Env> {
                let server: Option<Arc<dyn Server>> = $open.await;
                server.map(Env::new)
            }

            runtime_tests!(@each
                runs_once_and_stores_result,
                failures_retry_with_backoff_then_die,
                permanent_errors_go_dead_at_once,
                snoozed_jobs_run_again_later_without_using_an_attempt,
                attempts_record_each_run_with_its_worker,
                declared_schedules_fire_once_per_tick,
                handlers_enqueue_follow_ups_through_their_context,
                capacity_bounds_what_runs_at_once,
                ready_jobs_that_do_not_fit_cost_no_spin,
                workers_record_themselves_while_they_run,
                dead_workers_jobs_are_reclaimed,
                heartbeats_keep_long_jobs,
                shutdown_releases_unfinished_jobs,
                panics_are_failed_attempts,
                cancel_stops_the_handler,
                lost_lease_cancels_the_handler,
                successes_are_recorded_in_batches,
                unavailable_completions_are_tried_again,
                slow_first_polls_move_jobs_to_tasks,
                leases_of_a_claimed_batch_are_kept_while_a_first_poll_blocks,
                a_job_whose_lease_expired_before_its_turn_is_not_started,
                outcomes_waiting_to_be_recorded_keep_their_lease,
                handlers_blocking_every_thread_cost_no_lease,
                handlers_blocking_the_workers_runtime_cost_no_lease,
                a_timed_out_handler_fails_its_attempt_and_frees_its_slot,
                a_handler_blocked_past_its_timeout_is_failed_by_the_keeper,
                heartbeats_go_out_in_one_call_per_interval,
                lifecycle_hooks_hear_every_stored_outcome,
                batched_successes_are_heard_one_by_one,
                a_panicking_hook_stops_nothing,
                refused_outcomes_are_not_heard,
            );
        }
    };
    (@each $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                if let Some(env) = env().await {
                    let server = env.server.clone();
                    let namespace = env.settings.namespace.clone();
                    common::with_teardown(
                        scenarios::$scenario(env),
                        server.teardown(&namespace),
                    )
                    .await;
                }
            }
        )*
    };
}

/// In-process: nothing outlives the test's server.
struct Memory(durq_memory::MemoryServer);

#[async_trait]
impl Server for Memory {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(self.0.open(settings).expect("open a memory store"))
    }

    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        self.0.drop_namespace(namespace);
        Ok(())
    }
}

async fn memory() -> Option<Arc<dyn Server>> {
    Some(Arc::new(Memory(durq_memory::MemoryServer::new())))
}

runtime_tests!(memory, memory());

/// A fresh file per test, in its own temporary directory, with the default
/// configuration, as the quickstart uses it. The directory goes with the server.
struct Sqlite(tempfile::TempDir);

#[async_trait]
impl Server for Sqlite {
    async fn open(&self, settings: StoreSettings) -> Store {
        let path = self.0.path().join("jobs.db");
        Store::new(
            durq_sqlite::SqliteBackend::open(path, settings)
                .await
                .expect("open an sqlite store"),
        )
    }

    async fn teardown(&self, _namespace: &str) -> Result<(), String> {
        Ok(())
    }
}

async fn sqlite() -> Option<Arc<dyn Server>> {
    Some(Arc::new(Sqlite(tempfile::tempdir().expect("a temp dir"))))
}

runtime_tests!(sqlite, sqlite());

#[cfg(feature = "redis")]
struct Redis(String);

#[cfg(feature = "redis")]
#[async_trait]
impl Server for Redis {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(
            durq::backends::redis::RedisBackend::connect(&self.0, settings)
                .await
                .expect("connect to redis"),
        )
    }

    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        common::drop_redis_namespace(&self.0, namespace).await
    }
}

#[cfg(feature = "redis")]
/// `REDIS_URL`, default `redis://127.0.0.1:6379`; skipped loudly when unreachable.
async fn redis() -> Option<Arc<dyn Server>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Connecting writes no key, so the probe leaves nothing to remove.
    let probe = StoreSettings::default().namespace(unique_namespace());
    match durq::backends::redis::RedisBackend::connect(&url, probe).await {
        Ok(_) => Some(Arc::new(Redis(url))),
        Err(err) => skip_or_fail("Redis", &url, &err),
    }
}

#[cfg(feature = "redis")]
runtime_tests!(redis, redis());

#[cfg(feature = "postgres")]
/// One small pool per test, shared by the test's stores.
struct Postgres(durq::backends::postgres::PostgresPool);

#[cfg(feature = "postgres")]
#[async_trait]
impl Server for Postgres {
    async fn open(&self, settings: StoreSettings) -> Store {
        Store::new(self.0.backend(settings).expect("a postgres store"))
    }

    /// The namespace's rows in the shared schema; the schema stays.
    async fn teardown(&self, namespace: &str) -> Result<(), String> {
        self.0
            .drop_namespace(namespace)
            .await
            .map(drop)
            .map_err(|err| format!("could not remove PostgreSQL namespace {namespace}: {err}"))
    }
}

#[cfg(feature = "postgres")]
/// `DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`; skipped loudly
/// when unreachable.
async fn postgres() -> Option<Arc<dyn Server>> {
    use durq::backends::postgres::{PostgresConfig, PostgresPool};
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let config = PostgresConfig::new(&url)
        .expect("DATABASE_URL is a postgres URL")
        .max_connections(4)
        .application_name("jobs-runtime-tests");
    match PostgresPool::connect(config).await {
        Ok(backend) => Some(Arc::new(Postgres(backend))),
        Err(err) => skip_or_fail("PostgreSQL", &url, &err),
    }
}

#[cfg(feature = "postgres")]
runtime_tests!(postgres, postgres());
