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

#[path = "../common/mod.rs"]
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

mod scenarios;

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

/// Wakes the first `for_nothing` waits for work at once, for nothing; reports every
/// later wait (its number) before making it.
#[derive(Debug)]
struct WakesForNothing {
    inner: Arc<dyn Backend>,
    for_nothing: usize,
    waits: AtomicUsize,
    report: mpsc::UnboundedSender<usize>,
}

#[async_trait]
impl LayeredBackend for WakesForNothing {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> durq::Result<()> {
        let n = self.waits.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.for_nothing {
            return Ok(());
        }
        let _ = self.report.send(n);
        self.inner.wait_for_work(queues, timeout).await
    }
}

/// Wake-ups for nothing (notices for jobs another claim already took, as PostgreSQL
/// and Redis send now and then), once or twice in a row, leave the worker listening:
/// its next wait is a wait for work (after a pause of 10 ms, following two), not a
/// poll, so a job enqueued then is picked up at once rather than after the poll
/// interval (ten minutes here). A worker that polled after every such wake-up, or
/// after every two in a row, kept pickups waiting up to the poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_for_nothing_leave_the_worker_listening() {
    for for_nothing in [1, 2] {
        let Some(server) = backends::memory().await else {
            return;
        };
        let env = Env::new(server);
        let store = env.store().await;
        let (report, mut waits) = mpsc::unbounded_channel();
        let (woken, _layer) = env
            .layered(|inner| WakesForNothing {
                inner,
                for_nothing,
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
            recv(&mut waits, "a wait for work after the wake-ups for nothing").await,
            for_nothing + 1
        );
        let id = enqueue(&store, NewJob::new("q")).await;
        assert_eq!(
            recv(&mut runs, "the job enqueued while the worker waits").await,
            id,
            "after {for_nothing} wake-up(s) for nothing"
        );
        handle.shutdown().await;
    }
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
                workers_keep_a_queues_limits,
                finished_steps_do_not_run_again,
                handlers_reach_every_capability_through_their_context,
                handlers_emit_into_the_stream_and_the_worker_trims_it,
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

// The four backends, each running every scenario through `runtime_tests!`.
mod backends;
