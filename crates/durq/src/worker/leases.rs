//! The leases a worker holds, and the keeper that extends them.
//!
//! A job's lease is the worker's from its claim until its outcome is stored: while it
//! waits for its handler to start, while the handler runs, and while its completion,
//! failure or release is on the way to the store (retried through an outage). Every
//! such job is in [`Leases`], and the keeper extends all of them with one
//! `heartbeat_batch` call per interval. The keeper runs on a thread of its own, over a
//! store that needs no runtime or over connections it opened there, so handlers that
//! block their threads cannot starve it.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use durq_core::validate::MAX_BATCH_LEN;
use durq_core::{HeldLease, Job, JobId, JobIdMap, LeaseToken, Store, Timestamp};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::report::{report_outcome, timed_out_report};
use super::Shared;
use crate::handler::{CancelReason, CancelState};
use crate::telemetry::QueueMetrics;

/// Where a held job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Claimed; its handler has not started.
    Waiting,
    /// Its handler is running.
    Running,
    /// Its handler is done (or given up on); the outcome is on the way to the store.
    Reporting,
}

/// A job the worker holds a lease on, from its claim until its outcome is stored:
/// what its handler's [`JobContext`](crate::JobContext) shows, and the lease's state.
///
/// The job's own code (its start, its end, its report) moves it along through this
/// shared value, with no lookup; the worker's table ([`Leases`]) holds it too, for the
/// keeper to walk, and is touched once when a claim's jobs are taken and once when a
/// batch of outcomes is stored.
pub(crate) struct HeldJob {
    /// The job as claimed: state `running`, its lease set.
    pub(crate) job: Job,
    pub(crate) token: LeaseToken,
    pub(crate) cancel: CancelState,
    pub(crate) metrics: Arc<QueueMetrics>,
    /// The job's queue as the worker names it, kept only for a worker with lifecycle
    /// hooks (its events name it).
    pub(crate) queue: Option<Arc<str>>,
    /// The job's durable steps as this run knows them, read at its first `ctx.step`
    /// (CONTRACT D2); boxed, so a job that takes no step pays a word for it.
    pub(crate) steps: std::sync::OnceLock<Box<Mutex<durq_core::StepLog>>>,
    lease: Mutex<LeaseState>,
}

/// The changing part of a held job.
struct LeaseState {
    /// The expiry the store last confirmed (claim or heartbeat), on the store's clock.
    expires_at: Timestamp,
    /// Set once the store said the lease is gone (another worker may hold the job).
    lost: bool,
    /// Set once the worker let go of the job: its outcome is stored, or can no longer be.
    let_go: bool,
    phase: Phase,
    /// The running attempt's time limit and when it is up, on the store's clock (so a
    /// driven clock drives timeouts, as it drives lease expiry and retries).
    deadline: Option<Deadline>,
    /// When the keeper told the handler its time was up (real time, as every grace).
    timed_out_at: Option<Instant>,
    /// The task running the handler: the keeper aborts it if the handler blocks its
    /// thread past its timeout and the grace.
    task: Option<AbortHandle>,
    /// When the handler started (wall clock).
    started: Option<Instant>,
    /// How long the handler ran, once it is done (or given up on).
    ran_for: Option<Duration>,
}

impl HeldJob {
    /// A job just claimed, its lease held until `expires_at` (store clock).
    pub(crate) fn new(
        job: Job,
        token: LeaseToken,
        expires_at: Timestamp,
        metrics: Arc<QueueMetrics>,
        queue: Option<Arc<str>>,
    ) -> Self {
        HeldJob {
            job,
            token,
            cancel: CancelState::default(),
            metrics,
            queue,
            steps: std::sync::OnceLock::new(),
            lease: Mutex::new(LeaseState {
                expires_at,
                lost: false,
                let_go: false,
                phase: Phase::Waiting,
                deadline: None,
                timed_out_at: None,
                task: None,
                started: None,
                ran_for: None,
            }),
        }
    }

    pub(crate) fn id(&self) -> JobId {
        self.job.id
    }

    pub(crate) fn attempt(&self) -> u32 {
        self.job.attempts
    }

    fn state(&self) -> MutexGuard<'_, LeaseState> {
        // Every critical section is a few field reads and writes; a panic cannot leave
        // the state half-changed, so a poisoned lock is still consistent.
        self.lease
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Decides whether the waiting job may start now (`now` on the store's clock), and
    /// marks it running with its deadline, started at `started`, if so.
    pub(crate) fn start(
        &self,
        now: Timestamp,
        deadline: Option<Deadline>,
        started: Instant,
    ) -> Start {
        let mut state = self.state();
        if state.lost || state.let_go {
            return Start::Lost;
        }
        if state.expires_at <= now {
            state.phase = Phase::Reporting;
            return Start::Expired;
        }
        state.phase = Phase::Running;
        state.deadline = deadline;
        state.started = Some(started);
        Start::Run
    }

    /// Records the task the handler runs in, so the keeper can stop it.
    pub(crate) fn set_task(&self, task: AbortHandle) {
        self.state().task = Some(task);
    }

    /// Takes the finished handler's job into reporting, the handler having run for
    /// `ran_for`. False when it is no longer the handler's to report: the keeper
    /// already failed it as timed out.
    pub(crate) fn finish(&self, ran_for: Duration) -> bool {
        let mut state = self.state();
        if state.phase != Phase::Running {
            return false;
        }
        state.phase = Phase::Reporting;
        state.task = None;
        state.ran_for = Some(ran_for);
        true
    }

    /// Whether the store said the lease is gone (or the worker let go of the job), so
    /// an outcome that failed to reach the store is not worth trying again.
    pub(crate) fn is_lost(&self) -> bool {
        let state = self.state();
        state.lost || state.let_go
    }

    /// What the job's lifecycle event says of it.
    fn let_go_info(&self, ran_for: Option<Duration>) -> LetGo {
        LetGo {
            queue: self.queue.clone(),
            attempt: self.attempt(),
            ran_for,
        }
    }
}

/// What a lifecycle event says about a job the worker let go of.
pub(crate) struct LetGo {
    /// `None` unless the worker has hooks.
    pub(crate) queue: Option<Arc<str>>,
    pub(crate) attempt: u32,
    pub(crate) ran_for: Option<Duration>,
}

/// A running attempt's time limit, and when it is up on the store's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) at: Timestamp,
    pub(crate) timeout: Duration,
}

/// What [`HeldJob::start`] decided for a job about to start.
pub(crate) enum Start {
    /// Its lease holds: run it.
    Run,
    /// The store already said the lease is gone: drop the job, another worker has it.
    Lost,
    /// The lease expired before the job's turn came, and no heartbeat renewed it:
    /// hand it back (it may already have been reclaimed).
    Expired,
}

/// Every job the worker holds, by id.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<JobIdMap<Arc<HeldJob>>>,
}

impl Leases {
    fn lock(&self) -> MutexGuard<'_, JobIdMap<Arc<HeldJob>>> {
        // Every critical section is a few map operations; a panic cannot leave the map
        // half-changed, so a poisoned lock is still consistent.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Holds the jobs of one claim until they are let go of; one lock for the claim.
    pub(crate) fn hold_all<'a>(&self, claimed: impl IntoIterator<Item = &'a Arc<HeldJob>>) {
        let mut held = self.lock();
        for job in claimed {
            held.insert(job.id(), Arc::clone(job));
        }
    }

    /// Lets go of a job: its outcome is stored, or it can no longer be.
    pub(crate) fn drop_job(&self, job: &Arc<HeldJob>) {
        self.let_go_all([job]);
    }

    /// Lets go of many jobs under one lock (a batch of recorded completions), returning
    /// for each what its lifecycle event needs, in order; `None` for a job no longer
    /// held.
    pub(crate) fn let_go_all<'a>(
        &self,
        jobs: impl IntoIterator<Item = &'a Arc<HeldJob>>,
    ) -> Vec<Option<LetGo>> {
        let mut held = self.lock();
        jobs.into_iter()
            .map(|job| {
                // A job the worker let go of and claimed again has a new entry, which
                // this old one must not remove.
                let current = held.get(&job.id()).is_some_and(|h| Arc::ptr_eq(h, job));
                let mut state = job.state();
                if !current || state.let_go {
                    return None;
                }
                held.remove(&job.id());
                state.let_go = true;
                Some(job.let_go_info(state.ran_for))
            })
            .collect()
    }

    /// The jobs whose handlers are running.
    pub(crate) fn running(&self) -> Vec<Arc<HeldJob>> {
        self.lock()
            .values()
            .filter(|job| job.state().phase == Phase::Running)
            .cloned()
            .collect()
    }

    /// How many jobs are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The leases to extend now: every held one the store has not taken back.
    fn due(&self) -> Vec<Arc<HeldJob>> {
        self.lock()
            .values()
            .filter(|job| !job.state().lost)
            .cloned()
            .collect()
    }

    /// Enforces the deadlines of running jobs: a handler whose time is up (`now` on the
    /// store's clock) is told to stop ([`CancelReason::TimedOut`]); its task then gives
    /// it the cancel grace and fails the attempt. One still running a grace and a
    /// heartbeat interval after that has not let its task act, most likely because it
    /// blocks its thread: it is taken into reporting here and its task aborted
    /// (effective once it yields), and returned for the keeper to fail the attempt.
    fn enforce_deadlines(&self, now: Timestamp, overdue_after: Duration) -> Vec<Overdue> {
        let held = self.lock();
        let mut overdue = Vec::new();
        for job in held.values() {
            let mut state = job.state();
            let Some(deadline) = state.deadline else {
                continue;
            };
            if state.phase != Phase::Running || state.lost || now < deadline.at {
                continue;
            }
            let Some(timed_out_at) = state.timed_out_at else {
                state.timed_out_at = Some(Instant::now());
                job.cancel.cancel(CancelReason::TimedOut);
                continue;
            };
            if timed_out_at.elapsed() >= overdue_after {
                state.phase = Phase::Reporting;
                state.ran_for = state.started.map(|started| started.elapsed());
                if let Some(task) = state.task.take() {
                    task.abort();
                }
                overdue.push(Overdue {
                    job: Arc::clone(job),
                    timeout: deadline.timeout,
                });
            }
        }
        overdue
    }

    /// How long, on the store's clock, until the next running job's time is up.
    fn next_deadline(&self, now: Timestamp) -> Option<Duration> {
        self.lock()
            .values()
            .filter_map(|job| {
                let state = job.state();
                let waiting = state.phase == Phase::Running && state.timed_out_at.is_none();
                waiting.then_some(state.deadline).flatten()
            })
            .map(|deadline| deadline.at.duration_since(now))
            .min()
    }
}

/// A running job the keeper failed as timed out.
struct Overdue {
    job: Arc<HeldJob>,
    timeout: Duration,
}

/// The store the keeper extends leases through.
pub(crate) struct KeeperStore {
    store: Store,
    /// While `store` reaches a tied store through the worker's runtime because the
    /// keeper could not yet open connections of its own: the store to reopen on the
    /// keeper's thread once its server answers.
    reopen: Option<Store>,
}

impl KeeperStore {
    /// A store that serves the keeper's thread as it is: one that needs no runtime, or
    /// one reopened there.
    pub(crate) fn own(store: Store) -> Self {
        KeeperStore {
            store,
            reopen: None,
        }
    }

    /// A store reached through another runtime, and what to reopen, if anything.
    pub(crate) fn borrowed(store: Store, reopen: Option<Store>) -> Self {
        KeeperStore { store, reopen }
    }

    /// Opens the keeper's own connections if they are still to be opened.
    async fn try_reopen(&mut self) {
        let Some(tied) = &self.reopen else {
            return;
        };
        match tied.reopen().await {
            Ok(Some(own)) => {
                tracing::info!("the lease keeper now has connections of its own");
                self.store = own;
                self.reopen = None;
            }
            Ok(None) => self.reopen = None,
            Err(err) => {
                tracing::debug!(error = %err, "the lease keeper still cannot open its own connections")
            }
        }
    }
}

/// The keeper's thread, with a runtime of its own: nothing that runs on the worker's
/// runtime, not even every thread of it blocked by handlers, can delay a heartbeat made
/// from here over connections opened here.
pub(crate) struct KeeperThread {
    runtime: tokio::runtime::Handle,
    /// Dropped to end the thread.
    stop: Option<oneshot::Sender<()>>,
    /// Resolves once the thread's runtime is gone.
    done: oneshot::Receiver<()>,
}

impl KeeperThread {
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let (finished, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("durq-lease-keeper".to_owned())
            .spawn(move || {
                // Runs every task spawned on the runtime until told to stop, then drops
                // them (the keeper has returned by then) with the runtime.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                drop(runtime);
                let _ = finished.send(());
            })?;
        Ok(KeeperThread {
            runtime: handle,
            stop: Some(stop),
            done,
        })
    }

    /// `store` reopened on this thread (see `Store::reopen`).
    pub(crate) async fn reopen(&self, store: Store) -> durq_core::Result<Option<Store>> {
        super::reopen_on(&self.runtime, store).await
    }

    /// Runs `keeper` on this thread; the answer resolves once it has returned and the
    /// thread's runtime is gone.
    pub(crate) fn run<F>(mut self, keeper: F) -> oneshot::Receiver<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.take();
        self.runtime.spawn(async move {
            keeper.await;
            drop(stop);
        });
        self.done
    }
}

/// Extends every held lease once per heartbeat interval until `stop`, and enforces
/// the running jobs' deadlines: at each tick, and when the next one is up.
pub(crate) async fn keep_leases(
    shared: Arc<Shared>,
    mut store: KeeperStore,
    stop: CancellationToken,
) {
    let config = &shared.config;
    let mut ticker = tokio::time::interval(config.heartbeat);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate; a job just claimed has a fresh lease.
    ticker.tick().await;
    // A handler that ignored its timeout for the cancel grace has had its task's own
    // chance to fail the attempt; one heartbeat interval more and it is the keeper's.
    let overdue_after = config.cancel_grace + config.heartbeat;
    loop {
        // On the system clock the store's time runs with real time, so the wait ends
        // when the deadline is up; a driven clock is looked at on every tick anyway.
        let next_deadline = shared
            .leases
            .next_deadline(config.store.settings().now())
            .unwrap_or(config.heartbeat);
        tokio::select! {
            _ = ticker.tick() => {
                // A heartbeat that hangs (a stalled connection) must not hold up the
                // worker's shutdown: once told to stop, no lease is left to keep.
                let extend = async {
                    extend_all(&shared, &store.store).await;
                    store.try_reopen().await;
                };
                tokio::select! {
                    () = extend => {}
                    () = stop.cancelled() => return,
                }
            }
            () = tokio::time::sleep(next_deadline) => {}
            () = stop.cancelled() => return,
        }
        let now = config.store.settings().now();
        // The slot of an overdue handler is freed when its task ends; the attempt is
        // recorded now, so a hung handler does not hold its lease for good.
        for Overdue { job, timeout } in shared.leases.enforce_deadlines(now, overdue_after) {
            job.metrics.timed_out.increment(1);
            tracing::warn!(
                job = %job.id(),
                timeout = ?timeout,
                "the handler did not stop after its timeout and the cancel grace; failing the attempt"
            );
            let report = timed_out_report(&shared, job.attempt(), timeout);
            let task_shared = shared.clone();
            shared.store_runtime.spawn(async move {
                report_outcome(&task_shared, &task_shared.home, &job, report).await;
            });
        }
    }
}

/// One `heartbeat_batch` per [`MAX_BATCH_LEN`] held leases, answers applied per entry.
async fn extend_all(shared: &Shared, store: &Store) {
    let due = shared.leases.due();
    for chunk in due.chunks(MAX_BATCH_LEN) {
        let leases = chunk
            .iter()
            .map(|job| HeldLease::new(job.id(), job.token))
            .collect();
        let answers = store.heartbeat_batch(leases, shared.config.lease).await;
        match answers {
            Ok(answers) => apply(shared, chunk, answers),
            Err(err) => {
                // The leases still run until their expiry; the next tick tries again.
                shared.metrics.store_errors.increment(1);
                tracing::warn!(jobs = chunk.len(), error = %err, "heartbeat failed");
            }
        }
    }
}

fn apply(
    shared: &Shared,
    jobs: &[Arc<HeldJob>],
    answers: Vec<durq_core::Result<durq_core::Heartbeat>>,
) {
    if answers.len() != jobs.len() {
        shared.metrics.store_errors.increment(1);
        tracing::error!(
            entries = jobs.len(),
            answers = answers.len(),
            "the store answered a different number of heartbeats than it was given"
        );
    }
    for (job, answer) in jobs.iter().zip(answers) {
        let mut state = job.state();
        // The job may have been let go (its outcome stored) while the call was out:
        // then whatever the store answered is about a lease no longer ours.
        if state.let_go {
            continue;
        }
        let id = job.id();
        match answer {
            Ok(beat) => {
                state.expires_at = state.expires_at.max(beat.expires_at);
                if beat.cancel_requested && state.phase == Phase::Running {
                    if !job.cancel.is_cancelled() {
                        tracing::info!(job = %id, "cancellation requested; stopping the handler");
                    }
                    job.cancel.cancel(CancelReason::Requested);
                }
            }
            Err(err) if err.is_lease_lost() || err.is_not_found() => {
                state.lost = true;
                match state.phase {
                    // The outcome call that is on its way will hear the same, and says
                    // so; a job that just succeeded is no news.
                    Phase::Reporting => {
                        tracing::debug!(job = %id, "lease gone while the outcome was being recorded");
                    }
                    // Counted and logged once the handler has ended (or once the job
                    // would have started): a handler that stored its own completion in
                    // its transaction (CONTRACT §7) before this heartbeat landed
                    // succeeded, and its lease is gone because of that.
                    Phase::Waiting | Phase::Running => {
                        tracing::debug!(job = %id, "the store says the lease is gone; stopping the handler");
                        job.cancel.cancel(CancelReason::LeaseLost);
                    }
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(job = %id, error = %err, "heartbeat failed");
            }
        }
    }
}
