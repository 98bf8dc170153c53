//! One namespace's jobs and the ordered indexes over them.
//!
//! The job records are the truth; the indexes only point at them. Every code path that
//! follows an index entry tolerates a missing record (CONTRACT C7, R5) and drops the
//! entry, because `MemoryServer::vanish` deletes records behind the indexes' back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use std::time::Duration;

use durq_core::attempts::{self, LastClaim};
use durq_core::fit::NeedsPool;
use durq_core::graph::Dependency;
use durq_core::transition::{self, Attempts, Next};
use tokio::sync::Notify;

use durq_core::{
    Attempt, AttemptOutcome, Bytes, ClaimRequest, ClaimedJob, Enqueued, Error, Heartbeat, Job,
    JobId, JobIdMap, JobState, Lease, LeaseToken, ListPage, ListQuery, Needs, NewJob, QueueLimits,
    QueueOverview, QueueStats, ReadyOrder, ReclaimedJob, Result, Retry, ScheduleUpdate,
    StoreSettings, StoredSchedule, StoredWorker, Timestamp, Uniqueness, LEASE_EXPIRED,
};

/// A job made ready to store outside the namespace's lock (see [`State::prepare`]).
pub(crate) struct Prepared {
    /// The record as it will be stored; its `seq` is drawn under the lock.
    record: Box<Record>,
    uniqueness: Uniqueness,
    /// The jobs it waits for as the caller named them: a batch's earlier jobs are
    /// known by index until they are stored (CONTRACT G2).
    dependencies: Vec<Dependency>,
}

impl Prepared {
    pub(crate) fn job(&self) -> &Job {
        &self.record.job
    }

    /// Whether the job waits for any job (CONTRACT G1).
    pub(crate) fn has_dependencies(&self) -> bool {
        !self.dependencies.is_empty()
    }
}

/// The error a buried unreadable record carries (CONTRACT C10).
const UNREADABLE: &str = "corrupt record: marked unreadable by a fault-injection test";

#[derive(Debug)]
struct Record {
    job: Job,
    payload: Bytes,
    /// The enqueue sequence drawn when the job last entered `queued`.
    seq: u64,
    /// The last fencing token issued for this job; the next claim issues one more.
    last_token: u64,
    /// The worker of the lease that completed the job, moved out of the lease as it
    /// ends, so a claim costs no copy of it (CONTRACT H1).
    last_worker: Option<String>,
    /// The attempts that ended other than by success, oldest first, at most
    /// `ATTEMPTS_KEPT` (CONTRACT H2, H3).
    ended: Vec<Attempt>,
    /// Set by [`crate::MemoryServer::corrupt`]: the record stands for one a backend
    /// could not read, which a claim buries instead of leasing (CONTRACT C10).
    unreadable: bool,
    /// While `waiting`: how many of the jobs it waits for have not settled it yet
    /// (CONTRACT G1).
    waiting_for: u32,
    /// Whether the job records its state changes in the event stream (CONTRACT V1):
    /// set at its enqueue by a store that records events.
    records_events: bool,
}

/// The per-queue indexes.
#[derive(Debug, Default)]
struct QueueIndex {
    /// Queued jobs whose `run_at` had come when they were indexed, in claim order.
    ready: BTreeSet<(ReadyOrder, JobId)>,
    /// Queued jobs due later, by `run_at`; promoted into `ready` when due.
    scheduled: BTreeSet<(Timestamp, u64, JobId)>,
    /// Every job of the queue, by id (creation order), for `list` and `stats`.
    all: BTreeSet<JobId>,
    /// The ready jobs again, by priority and concurrency key, for a queue with fair
    /// shares (CONTRACT K5); `None` for the others, which pay nothing for it.
    keyed: Option<fair::KeyedReady>,
}

/// The indexes over the records, apart from the records so a transition can change a
/// record and its index entries under one lookup of it.
#[derive(Debug, Default)]
struct Indexes {
    queues: FxHashMap<String, QueueIndex>,
    /// Running jobs by lease expiry, so reclaim touches only expired leases (R6).
    leases: BTreeSet<(Timestamp, JobId)>,
    /// Terminal jobs by `finished_at`, so purge touches only jobs past retention.
    finished: BTreeSet<(Timestamp, JobId)>,
    /// The running jobs of each queue that has limits (CONTRACT K1, K2).
    running: FxHashMap<String, limits::Running>,
    /// Whether a job of a queue with limits left `running`, or a waiting job became
    /// `queued`, since the last look ([`State::take_freed_slot`]): either may let a
    /// claimer that found nothing take a job now.
    freed_slot: bool,
    /// The queues with fair shares (CONTRACT K5): their indexes keep `keyed`.
    fair: BTreeSet<String>,
}

impl Indexes {
    /// Changes the index of `queue`, made on first use: the name is copied only then.
    fn with_queue<T>(&mut self, queue: &str, change: impl FnOnce(&mut QueueIndex) -> T) -> T {
        if let Some(index) = self.queues.get_mut(queue) {
            return change(index);
        }
        let mut index = QueueIndex::default();
        if !self.fair.is_empty() && self.fair.contains(queue) {
            index.keyed = Some(fair::KeyedReady::default());
        }
        let answer = change(&mut index);
        self.queues.insert(queue.to_owned(), index);
        answer
    }

    /// Adds the record's index entries for its current state.
    fn add(&mut self, record: &Record, id: JobId, now: Timestamp) {
        let job = &record.job;
        match job.state {
            JobState::Queued => self.with_queue(&job.queue, |queue| {
                if job.run_at <= now {
                    let entry = (job.ready_order(record.seq), id);
                    queue.ready.insert(entry);
                    if let Some(keyed) = queue.keyed.as_mut() {
                        keyed.insert(job.concurrency_key.as_deref(), entry);
                    }
                } else {
                    queue.scheduled.insert((job.run_at, record.seq, id));
                }
            }),
            JobState::Running => {
                if let Some(lease) = &job.lease {
                    self.leases.insert((lease.expires_at, id));
                }
                // Only queues with limits are counted: with none, not even a lookup.
                if !self.running.is_empty() {
                    if let Some(running) = self.running.get_mut(job.queue.as_str()) {
                        running.add(job.concurrency_key.as_deref());
                    }
                }
            }
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                if let Some(finished_at) = job.finished_at {
                    self.finished.insert((finished_at, id));
                }
            }
            // A waiting job is in no index but its queue's `all`: nothing takes it.
            JobState::Waiting => {}
        }
    }

    /// Removes the record's index entries for its current state.
    fn remove(&mut self, record: &Record, id: JobId) {
        let job = &record.job;
        match job.state {
            JobState::Queued => {
                if let Some(queue) = self.queues.get_mut(job.queue.as_str()) {
                    // A queued job is in one of the two; most often the ready one.
                    let entry = (job.ready_order(record.seq), id);
                    if queue.ready.remove(&entry) {
                        if let Some(keyed) = queue.keyed.as_mut() {
                            keyed.remove(job.concurrency_key.as_deref(), &entry);
                        }
                    } else {
                        queue.scheduled.remove(&(job.run_at, record.seq, id));
                    }
                }
            }
            JobState::Running => {
                if let Some(lease) = &job.lease {
                    self.leases.remove(&(lease.expires_at, id));
                }
                if !self.running.is_empty() {
                    if let Some(running) = self.running.get_mut(job.queue.as_str()) {
                        running.remove(job.concurrency_key.as_deref());
                    }
                }
            }
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                if let Some(finished_at) = job.finished_at {
                    self.finished.remove(&(finished_at, id));
                }
            }
            JobState::Waiting => {}
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Boxed: a record is several hundred bytes, which the map would otherwise move on
    /// every insert and every growth, and spread its lookups across.
    jobs: JobIdMap<Box<Record>>,
    idx: Indexes,
    /// (tenant, key) -> (job, when the key was taken).
    dedup: HashMap<(String, String), (JobId, Timestamp)>,
    children: BTreeMap<JobId, BTreeSet<JobId>>,
    /// The waiting jobs of each job that has not ended yet (CONTRACT G1): a job's entry
    /// goes when it ends and settles them. Empty unless dependencies are used, and
    /// then the only cost a job that ends pays is one lookup.
    dependents: JobIdMap<Vec<JobId>>,
    /// The durable steps of each job that saved one or was reopened (CONTRACT D1–D4),
    /// beside the records rather than in them, so a job that takes no step costs
    /// nothing, and a purge one lookup while any job has steps.
    steps: JobIdMap<durq_core::StepLog>,
    /// The event stream (CONTRACT V1–V4).
    events: events::EventLog,
    next_seq: u64,
    /// Queues no claim takes from (CONTRACT Q1).
    paused: BTreeSet<String>,
    /// Schedules by name (CONTRACT S1).
    schedules: BTreeMap<String, StoredSchedule>,
    /// Registered workers by id (CONTRACT W1).
    workers: BTreeMap<String, StoredWorker>,
    /// The needs of the jobs, equal ones shared, so a fitted claim judges each kind once.
    needs: NeedsPool,
    /// Each queue's limits on its running jobs (CONTRACT K3).
    limits: BTreeMap<String, QueueLimits>,
    /// The recent starts of each queue with a rate (CONTRACT K4).
    starts: FxHashMap<String, limits::Starts>,
    /// Per queue with fair shares and priority, the key its claims served last (K5).
    turns: FxHashMap<String, BTreeMap<i16, String>>,
    /// Faults a test injected.
    faults: limits::Faults,
    /// Whether a job ended since the lock was taken: the guard then wakes the waiters
    /// for endings as it lets go (CONTRACT O2).
    ended_any: bool,
}

/// Kinds of needs one fitted claim remembers its verdict on; past that, a job of another
/// kind is judged each time it is met.
const VERDICTS_KEPT: usize = 16;

fn lease_lost(id: JobId) -> Error {
    Error::LeaseLost { id }
}

mod admin;
mod claim;
mod enqueue;
mod events;
mod fair;
mod graph;
mod lease;
mod limits;
mod reads;
mod schedules;
mod steps;
mod sweep;
mod workers;

impl State {
    fn draw_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Applies `change` to a job, keeping the indexes in step, under one lookup of its
    /// record. A change that sends the job (back) to `queued` gets a fresh sequence
    /// number, so it queues behind the jobs already ready (CONTRACT C3).
    fn transition<T>(
        &mut self,
        id: JobId,
        now: Timestamp,
        change: impl FnOnce(&mut Job) -> T,
    ) -> Option<T> {
        self.transition_record(id, now, |record| change(&mut record.job))
    }

    /// [`State::transition`], with the whole record to change. A change that ends the
    /// job settles the jobs waiting for it (CONTRACT G1, G3), whatever made it end.
    fn transition_record<T>(
        &mut self,
        id: JobId,
        now: Timestamp,
        change: impl FnOnce(&mut Record) -> T,
    ) -> Option<T> {
        let (answer, ended) = self.transition_unsettled(id, now, change)?;
        if let Some(state) = ended {
            if !self.dependents.is_empty() {
                self.settle_dependents(id, state, now);
            }
        }
        Some(answer)
    }

    /// [`State::transition_record`] without settling the waiting jobs: answers also the
    /// state the job ended in, if the change ended it.
    fn transition_unsettled<T>(
        &mut self,
        id: JobId,
        now: Timestamp,
        change: impl FnOnce(&mut Record) -> T,
    ) -> Option<(T, Option<JobState>)> {
        let record = self.jobs.get_mut(&id)?;
        self.idx.remove(record, id);
        let was = record.job.state;
        let attempts_before = record.job.attempts;
        let result = change(record);
        if record.job.state == JobState::Queued && was != JobState::Queued {
            self.next_seq += 1;
            record.seq = self.next_seq;
        }
        if was == JobState::Running
            && record.job.state != JobState::Running
            && !self.idx.running.is_empty()
            && self.idx.running.contains_key(record.job.queue.as_str())
        {
            self.idx.freed_slot = true;
        }
        let ended =
            (!was.is_terminal() && record.job.state.is_terminal()).then_some(record.job.state);
        self.ended_any |= ended.is_some();
        self.idx.add(record, id, now);
        if record.records_events && record.job.state != was {
            self.record_change(id, was, attempts_before, now);
        }
        Some((result, ended))
    }

    /// Like [`State::transition`], for a job whose existence the caller just checked.
    fn transition_checked<T>(
        &mut self,
        id: JobId,
        now: Timestamp,
        change: impl FnOnce(&mut Job) -> T,
    ) -> Result<T> {
        self.transition(id, now, change)
            .ok_or(Error::NotFound { id })
    }

    /// The record of a running job whose lease `token` is current (CONTRACT L2, L3).
    fn check_lease(&self, id: JobId, token: LeaseToken) -> Result<()> {
        let record = self.jobs.get(&id).ok_or(Error::NotFound { id })?;
        let job = &record.job;
        let current = job.lease.as_ref().map(|lease| lease.token);
        if job.state != JobState::Running || current != Some(token) {
            return Err(lease_lost(id));
        }
        Ok(())
    }
}

/// One namespace's data and its wake-up signals.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    state: Mutex<State>,
    pub(crate) work_arrived: Notify,
    /// The signal of endings, for `wait_for_ending` (CONTRACT O2).
    pub(crate) endings: durq_core::ending::EndingSignal,
    /// Whether a queue has a rate (K4), so a wait for work looks up when a rate frees a
    /// start only then, without the lock otherwise.
    pub(crate) has_rates: std::sync::atomic::AtomicBool,
}

impl Namespace {
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        // A panic while holding the lock can only come from a bug in this crate; the
        // state is updated so that every step leaves it consistent, so keep serving.
        StateGuard {
            state: self
                .state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            namespace: self,
        }
    }

    /// Wakes every waiting claimer, and leaves a permit for a claimer that is between
    /// its empty claim and its wait, so that one does not sleep through the news.
    pub(crate) fn signal_work(&self) {
        self.work_arrived.notify_waiters();
        self.work_arrived.notify_one();
    }
}

/// The namespace's state, locked. Whatever call ended a job (a completion, a cancel, a
/// cascade of G3, a bury), the waiters for endings are woken as the lock is let go, so
/// no call site has to remember it.
pub(crate) struct StateGuard<'a> {
    state: MutexGuard<'a, State>,
    namespace: &'a Namespace,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        // Signalled while the lock is still held: a wait counts itself before it reads
        // under the lock, so either the signal sees it or its read sees the ending.
        if std::mem::take(&mut self.state.ended_any) {
            self.namespace.endings.ended();
        }
    }
}
