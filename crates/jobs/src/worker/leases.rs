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

use jobs_core::validate::MAX_BATCH_LEN;
use jobs_core::{HeldLease, JobId, JobIdMap, LeaseToken, Store, Timestamp};
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

/// One held lease.
struct Held {
    token: LeaseToken,
    /// The expiry the store last confirmed (claim or heartbeat), on the store's clock.
    expires_at: Timestamp,
    /// Set once the store said the lease is gone (another worker may hold the job).
    lost: bool,
    phase: Phase,
    cancel: Arc<CancelState>,
    metrics: Arc<QueueMetrics>,
    attempt: u32,
    /// The running attempt's time limit and when it is up, on the store's clock (so a
    /// driven clock drives timeouts, as it drives lease expiry and retries).
    deadline: Option<Deadline>,
    /// When the keeper told the handler its time was up (real time, as every grace).
    timed_out_at: Option<Instant>,
    /// The task running the handler: the keeper aborts it if the handler blocks its
    /// thread past its timeout and the grace.
    task: Option<AbortHandle>,
    /// The job's queue, kept only for a worker with lifecycle hooks (its events name it).
    queue: Option<Arc<str>>,
    /// When the handler started (wall clock).
    started: Option<Instant>,
    /// How long the handler ran, once it is done (or given up on).
    ran_for: Option<Duration>,
}

/// What a lifecycle event says about a job the worker let go of: kept with its lease,
/// so every path that stores an outcome finds it in one place.
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

/// A job of a claim, as [`Leases::hold_all`] takes it.
pub(crate) struct Claimed {
    pub(crate) id: JobId,
    pub(crate) token: LeaseToken,
    pub(crate) expires_at: Timestamp,
    pub(crate) cancel: Arc<CancelState>,
    pub(crate) metrics: Arc<QueueMetrics>,
    pub(crate) attempt: u32,
    /// The job's queue, for a worker with lifecycle hooks; `None` otherwise.
    pub(crate) queue: Option<Arc<str>>,
}

/// What [`Leases::start`] decided for a job about to start.
pub(crate) enum Start {
    /// Its lease holds: run it.
    Run,
    /// The store already said the lease is gone: drop the job, another worker has it.
    Lost,
    /// The lease expired before the job's turn came, and no heartbeat renewed it:
    /// hand it back (it may already have been reclaimed).
    Expired,
}

/// What the runtime holds, by job id.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<JobIdMap<Held>>,
}

impl Leases {
    fn lock(&self) -> MutexGuard<'_, JobIdMap<Held>> {
        // Every critical section is one lookup and a few field writes; a panic cannot
        // leave an entry half-changed, so a poisoned lock is still consistent.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Holds the jobs of one claim, until [`Leases::drop_job`] lets go of each; one
    /// lock for the whole claim.
    pub(crate) fn hold_all(&self, claimed: impl IntoIterator<Item = Claimed>) {
        let mut held = self.lock();
        for job in claimed {
            held.insert(
                job.id,
                Held {
                    token: job.token,
                    expires_at: job.expires_at,
                    lost: false,
                    phase: Phase::Waiting,
                    cancel: job.cancel,
                    metrics: job.metrics,
                    attempt: job.attempt,
                    deadline: None,
                    timed_out_at: None,
                    task: None,
                    queue: job.queue,
                    started: None,
                    ran_for: None,
                },
            );
        }
    }

    /// The entry of `id` if it is the lease taken under `token`: a job the worker let
    /// go and claimed again has a new entry, which calls about the old lease must not
    /// touch.
    fn entry(held: &mut JobIdMap<Held>, id: JobId, token: LeaseToken) -> Option<&mut Held> {
        held.get_mut(&id).filter(|job| job.token == token)
    }

    /// Decides whether a waiting job may start now (`now` on the store's clock), and
    /// marks it running with its deadline and time limit, started at `started`, if so.
    pub(crate) fn start(
        &self,
        id: JobId,
        token: LeaseToken,
        now: Timestamp,
        deadline: Option<Deadline>,
        started: Instant,
    ) -> Start {
        let mut held = self.lock();
        let Some(job) = Self::entry(&mut held, id, token) else {
            return Start::Lost;
        };
        if job.lost {
            return Start::Lost;
        }
        if job.expires_at <= now {
            job.phase = Phase::Reporting;
            return Start::Expired;
        }
        job.phase = Phase::Running;
        job.deadline = deadline;
        job.started = Some(started);
        Start::Run
    }

    /// Records the task a running job's handler runs in, so the keeper can stop it.
    pub(crate) fn set_task(&self, id: JobId, token: LeaseToken, task: AbortHandle) {
        if let Some(job) = Self::entry(&mut self.lock(), id, token) {
            job.task = Some(task);
        }
    }

    /// Takes a finished handler's job into reporting, the handler having run for
    /// `ran_for`. False when it is no longer the handler's to report: the keeper
    /// already failed it as timed out.
    pub(crate) fn finish(&self, id: JobId, token: LeaseToken, ran_for: Duration) -> bool {
        match Self::entry(&mut self.lock(), id, token) {
            Some(job) if job.phase == Phase::Running => {
                job.phase = Phase::Reporting;
                job.task = None;
                job.ran_for = Some(ran_for);
                true
            }
            _ => false,
        }
    }

    /// Whether the store said the job's lease is gone (or the job is no longer held),
    /// so an outcome that failed to reach the store is not worth trying again.
    pub(crate) fn is_lost(&self, id: JobId, token: LeaseToken) -> bool {
        Self::entry(&mut self.lock(), id, token).is_none_or(|job| job.lost)
    }

    /// Lets go of a job: its outcome is stored, or it can no longer be.
    pub(crate) fn drop_job(&self, id: JobId, token: LeaseToken) {
        self.drop_all([(id, token)]);
    }

    /// Lets go of many jobs under one lock (a batch of recorded completions).
    pub(crate) fn drop_all(&self, jobs: impl IntoIterator<Item = (JobId, LeaseToken)>) {
        let mut held = self.lock();
        for (id, token) in jobs {
            if Self::entry(&mut held, id, token).is_some() {
                held.remove(&id);
            }
        }
    }

    /// Lets go of a job as [`Leases::drop_job`] does, returning what its lifecycle
    /// event needs; `None` if the lease was no longer held.
    pub(crate) fn let_go(&self, id: JobId, token: LeaseToken) -> Option<LetGo> {
        let mut held = self.lock();
        Self::take(&mut held, id, token)
    }

    /// Lets go of many jobs under one lock, returning for each what its lifecycle
    /// event needs, in order.
    pub(crate) fn let_go_all(
        &self,
        jobs: impl IntoIterator<Item = (JobId, LeaseToken)>,
    ) -> Vec<Option<LetGo>> {
        let mut held = self.lock();
        jobs.into_iter()
            .map(|(id, token)| Self::take(&mut held, id, token))
            .collect()
    }

    fn take(held: &mut JobIdMap<Held>, id: JobId, token: LeaseToken) -> Option<LetGo> {
        Self::entry(held, id, token)?;
        let job = held.remove(&id)?;
        Some(LetGo {
            queue: job.queue,
            attempt: job.attempt,
            ran_for: job.ran_for,
        })
    }

    /// The cancel states of the jobs whose handlers are running.
    pub(crate) fn running(&self) -> Vec<Arc<CancelState>> {
        self.lock()
            .values()
            .filter(|job| job.phase == Phase::Running)
            .map(|job| job.cancel.clone())
            .collect()
    }

    /// How many jobs are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// The leases to extend now: every held one the store has not taken back.
    fn due(&self) -> Vec<HeldLease> {
        self.lock()
            .iter()
            .filter(|(_, job)| !job.lost)
            .map(|(id, job)| HeldLease::new(*id, job.token))
            .collect()
    }

    /// Enforces the deadlines of running jobs: a handler whose time is up (`now` on the
    /// store's clock) is told to stop ([`CancelReason::TimedOut`]); its task then gives
    /// it the cancel grace and fails the attempt. One still running a grace and a
    /// heartbeat interval after that has not let its task act, most likely because it
    /// blocks its thread: it is taken into reporting here and its task aborted
    /// (effective once it yields), and returned for the keeper to fail the attempt.
    fn enforce_deadlines(&self, now: Timestamp, overdue_after: Duration) -> Vec<Overdue> {
        let mut held = self.lock();
        let mut overdue = Vec::new();
        for (id, job) in held.iter_mut() {
            let Some(deadline) = job.deadline else {
                continue;
            };
            if job.phase != Phase::Running || job.lost || now < deadline.at {
                continue;
            }
            let Some(timed_out_at) = job.timed_out_at else {
                job.timed_out_at = Some(Instant::now());
                job.cancel.cancel(CancelReason::TimedOut);
                continue;
            };
            if timed_out_at.elapsed() >= overdue_after {
                job.phase = Phase::Reporting;
                job.ran_for = job.started.map(|started| started.elapsed());
                if let Some(task) = job.task.take() {
                    task.abort();
                }
                overdue.push(Overdue {
                    id: *id,
                    token: job.token,
                    attempt: job.attempt,
                    timeout: deadline.timeout,
                    metrics: job.metrics.clone(),
                });
            }
        }
        overdue
    }

    /// How long, on the store's clock, until the next running job's time is up.
    fn next_deadline(&self, now: Timestamp) -> Option<Duration> {
        self.lock()
            .values()
            .filter(|job| job.phase == Phase::Running && job.timed_out_at.is_none())
            .filter_map(|job| job.deadline)
            .map(|deadline| deadline.at.duration_since(now))
            .min()
    }
}

/// A running job the keeper failed as timed out.
struct Overdue {
    id: JobId,
    token: LeaseToken,
    attempt: u32,
    timeout: Duration,
    metrics: Arc<QueueMetrics>,
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
            .name("jobs-lease-keeper".to_owned())
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
    pub(crate) async fn reopen(&self, store: Store) -> jobs_core::Result<Option<Store>> {
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
                extend_all(&shared, &store.store).await;
                store.try_reopen().await;
            }
            () = tokio::time::sleep(next_deadline) => {}
            () = stop.cancelled() => return,
        }
        let now = config.store.settings().now();
        // The slot of an overdue handler is freed when its task ends; the attempt is
        // recorded now, so a hung handler does not hold its lease for good.
        for job in shared.leases.enforce_deadlines(now, overdue_after) {
            job.metrics.timed_out.increment(1);
            tracing::warn!(
                job = %job.id,
                timeout = ?job.timeout,
                "the handler did not stop after its timeout and the cancel grace; failing the attempt"
            );
            let report = timed_out_report(&shared, job.attempt, job.timeout);
            let task_shared = shared.clone();
            shared.store_runtime.spawn(async move {
                report_outcome(
                    &task_shared,
                    &task_shared.home,
                    &job.metrics,
                    job.id,
                    job.token,
                    report,
                )
                .await;
            });
        }
    }
}

/// One `heartbeat_batch` per [`MAX_BATCH_LEN`] held leases, answers applied per entry.
async fn extend_all(shared: &Shared, store: &Store) {
    let due = shared.leases.due();
    for chunk in due.chunks(MAX_BATCH_LEN) {
        let answers = store
            .heartbeat_batch(chunk.to_vec(), shared.config.lease)
            .await;
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
    leases: &[HeldLease],
    answers: Vec<jobs_core::Result<jobs_core::Heartbeat>>,
) {
    if answers.len() != leases.len() {
        shared.metrics.store_errors.increment(1);
        tracing::error!(
            entries = leases.len(),
            answers = answers.len(),
            "the store answered a different number of heartbeats than it was given"
        );
    }
    let mut held = shared.leases.lock();
    for (lease, answer) in leases.iter().zip(answers) {
        // The job may have been let go (its outcome stored) while the call was out:
        // then whatever the store answered is about a lease no longer ours.
        let Some(job) = held
            .get_mut(&lease.id)
            .filter(|job| job.token == lease.token)
        else {
            continue;
        };
        match answer {
            Ok(beat) => {
                job.expires_at = job.expires_at.max(beat.expires_at);
                if beat.cancel_requested && job.phase == Phase::Running {
                    if !job.cancel.token.is_cancelled() {
                        tracing::info!(job = %lease.id, "cancellation requested; stopping the handler");
                    }
                    job.cancel.cancel(CancelReason::Requested);
                }
            }
            Err(err) if err.is_lease_lost() || err.is_not_found() => {
                job.lost = true;
                match job.phase {
                    // The outcome call that is on its way will hear the same, and says
                    // so; a job that just succeeded is no news.
                    Phase::Reporting => {
                        tracing::debug!(job = %lease.id, "lease gone while the outcome was being recorded");
                    }
                    Phase::Waiting | Phase::Running => {
                        job.metrics.lease_lost.increment(1);
                        tracing::warn!(job = %lease.id, "lease lost; stopping the handler");
                        job.cancel.cancel(CancelReason::LeaseLost);
                    }
                }
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(job = %lease.id, error = %err, "heartbeat failed");
            }
        }
    }
}
