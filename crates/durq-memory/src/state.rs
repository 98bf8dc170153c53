//! One namespace's jobs and the ordered indexes over them.
//!
//! The job records are the truth; the indexes only point at them. Every code path that
//! follows an index entry tolerates a missing record (CONTRACT C7, R5) and drops the
//! entry, because `MemoryServer::vanish` deletes records behind the indexes' back.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxHashMap;
use std::time::Duration;

use durq_core::attempts::{self, LastClaim};
use durq_core::fit::NeedsPool;
use durq_core::transition::{self, Attempts, Next};
use durq_core::{
    Attempt, AttemptOutcome, Bytes, ClaimRequest, ClaimedJob, Enqueued, Error, Heartbeat, Job,
    JobId, JobIdMap, JobState, Lease, LeaseToken, ListPage, ListQuery, Needs, NewJob,
    QueueOverview, QueueStats, ReadyOrder, ReclaimedJob, Result, Retry, ScheduleUpdate,
    StoreSettings, StoredSchedule, StoredWorker, Timestamp, Uniqueness, LEASE_EXPIRED,
};

/// A job made ready to store outside the namespace's lock (see [`State::prepare`]).
pub(crate) struct Prepared {
    /// The record as it will be stored; its `seq` is drawn under the lock.
    record: Box<Record>,
    uniqueness: Uniqueness,
}

impl Prepared {
    pub(crate) fn job(&self) -> &Job {
        &self.record.job
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
}

impl Indexes {
    /// Changes the index of `queue`, made on first use: the name is copied only then.
    fn with_queue<T>(&mut self, queue: &str, change: impl FnOnce(&mut QueueIndex) -> T) -> T {
        if let Some(index) = self.queues.get_mut(queue) {
            return change(index);
        }
        let mut index = QueueIndex::default();
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
                    queue.ready.insert((job.ready_order(record.seq), id));
                } else {
                    queue.scheduled.insert((job.run_at, record.seq, id));
                }
            }),
            JobState::Running => {
                if let Some(lease) = &job.lease {
                    self.leases.insert((lease.expires_at, id));
                }
            }
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                if let Some(finished_at) = job.finished_at {
                    self.finished.insert((finished_at, id));
                }
            }
        }
    }

    /// Removes the record's index entries for its current state.
    fn remove(&mut self, record: &Record, id: JobId) {
        let job = &record.job;
        match job.state {
            JobState::Queued => {
                if let Some(queue) = self.queues.get_mut(job.queue.as_str()) {
                    // A queued job is in one of the two; most often the ready one.
                    if !queue.ready.remove(&(job.ready_order(record.seq), id)) {
                        queue.scheduled.remove(&(job.run_at, record.seq, id));
                    }
                }
            }
            JobState::Running => {
                if let Some(lease) = &job.lease {
                    self.leases.remove(&(lease.expires_at, id));
                }
            }
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                if let Some(finished_at) = job.finished_at {
                    self.finished.remove(&(finished_at, id));
                }
            }
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
    next_seq: u64,
    /// Queues no claim takes from (CONTRACT Q1).
    paused: BTreeSet<String>,
    /// Schedules by name (CONTRACT S1).
    schedules: BTreeMap<String, StoredSchedule>,
    /// Registered workers by id (CONTRACT W1).
    workers: BTreeMap<String, StoredWorker>,
    /// The needs of the jobs, equal ones shared, so a fitted claim judges each kind once.
    needs: NeedsPool,
}

/// Kinds of needs one fitted claim remembers its verdict on; past that, a job of another
/// kind is judged each time it is met.
const VERDICTS_KEPT: usize = 16;

fn lease_lost(id: JobId) -> Error {
    Error::LeaseLost { id }
}

impl State {
    /// Rule Q1. Returns whether the queue was paused before.
    pub(crate) fn set_paused(&mut self, queue: &str, paused: bool) -> bool {
        let was = self.paused.contains(queue);
        if paused {
            self.paused.insert(queue.to_owned());
        } else {
            self.paused.remove(queue);
        }
        was
    }

    pub(crate) fn paused_queues(&self) -> Vec<String> {
        self.paused.iter().cloned().collect()
    }

    /// Rule W1: the worker's record, replaced whole.
    pub(crate) fn put_worker(&mut self, id: &str, spec: &str, in_flight: u32, now: Timestamp) {
        self.workers.insert(
            id.to_owned(),
            StoredWorker {
                id: id.to_owned(),
                spec: spec.to_owned(),
                in_flight,
                last_seen: now,
            },
        );
    }

    /// Rule W2: whether the worker is registered.
    pub(crate) fn touch_worker(&mut self, id: &str, in_flight: u32, now: Timestamp) -> bool {
        match self.workers.get_mut(id) {
            Some(worker) => {
                worker.in_flight = in_flight;
                worker.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Rule W3.
    pub(crate) fn delete_worker(&mut self, id: &str) -> bool {
        self.workers.remove(id).is_some()
    }

    /// Rule W1: by id.
    pub(crate) fn workers(&self) -> Vec<StoredWorker> {
        self.workers.values().cloned().collect()
    }

    /// Rule W4: the workers last seen before `cutoff`, removed.
    pub(crate) fn reap_workers(&mut self, cutoff: Timestamp) -> Vec<String> {
        let silent: Vec<String> = self
            .workers
            .values()
            .filter(|w| w.last_seen < cutoff)
            .map(|w| w.id.clone())
            .collect();
        for id in &silent {
            self.workers.remove(id);
        }
        silent
    }

    /// Rule S1: a new schedule starts enabled at `now`; a known one keeps both.
    pub(crate) fn put_schedule(&mut self, name: &str, spec: &str, now: Timestamp) {
        self.schedules
            .entry(name.to_owned())
            .and_modify(|stored| stored.spec = spec.to_owned())
            .or_insert_with(|| StoredSchedule {
                name: name.to_owned(),
                spec: spec.to_owned(),
                enabled: true,
                last_tick: now,
            });
    }

    pub(crate) fn schedules(&self) -> Vec<StoredSchedule> {
        self.schedules.values().cloned().collect()
    }

    /// Rule S2: only what `update` sets changes; the last tick only moves forward.
    pub(crate) fn update_schedule(&mut self, name: &str, update: ScheduleUpdate) -> Result<()> {
        let stored = self
            .schedules
            .get_mut(name)
            .ok_or_else(|| Error::ScheduleNotFound {
                name: name.to_owned(),
            })?;
        if let Some(enabled) = update.enabled {
            stored.enabled = enabled;
        }
        if let Some(tick) = update.last_tick {
            stored.last_tick = stored.last_tick.max(tick);
        }
        Ok(())
    }

    pub(crate) fn delete_schedule(&mut self, name: &str) -> bool {
        self.schedules.remove(name).is_some()
    }

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

    /// [`State::transition`], with the whole record to change.
    fn transition_record<T>(
        &mut self,
        id: JobId,
        now: Timestamp,
        change: impl FnOnce(&mut Record) -> T,
    ) -> Option<T> {
        let record = self.jobs.get_mut(&id)?;
        self.idx.remove(record, id);
        let was = record.job.state;
        let result = change(record);
        if record.job.state == JobState::Queued && was != JobState::Queued {
            self.next_seq += 1;
            record.seq = self.next_seq;
        }
        self.idx.add(record, id, now);
        Some(result)
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

    pub(crate) fn check_parents<'a>(&self, jobs: impl IntoIterator<Item = &'a Job>) -> Result<()> {
        for job in jobs {
            if let Some(parent) = job.parent {
                if !self.jobs.contains_key(&parent) {
                    return Err(Error::invalid(
                        "parent",
                        format!("job {parent} does not exist"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The stored form of `new`, made before the namespace is locked: what can be done
    /// outside the lock is, so that concurrent producers wait on each other less.
    pub(crate) fn prepare(new: NewJob, now: Timestamp) -> Prepared {
        let uniqueness = new.uniqueness;
        let (job, payload) = Job::enqueued(new, JobId::mint(now), now);
        Prepared {
            record: Box::new(Record {
                job,
                payload,
                seq: 0,
                last_token: 0,
                last_worker: None,
                ended: Vec::new(),
                unreadable: false,
            }),
            uniqueness,
        }
    }

    /// Rules E1–E7: stores a prepared job, or answers the existing job of a live
    /// idempotency key (the prepared one, and its id, then go unused).
    pub(crate) fn enqueue(
        &mut self,
        prepared: Prepared,
        now: Timestamp,
        settings: &StoreSettings,
    ) -> Enqueued {
        let Prepared {
            mut record,
            uniqueness,
        } = prepared;
        let job = &mut record.job;
        let dedup_key = job
            .idempotency_key
            .as_ref()
            .map(|key| (job.tenant.clone(), key.clone()));
        if let Some(key) = &dedup_key {
            if let Some(&(id, taken_at)) = self.dedup.get(key) {
                let holds = match (self.jobs.get(&id), uniqueness) {
                    (None, _) => false,
                    (Some(_), Uniqueness::Window) => settings.dedup_active(taken_at, now),
                    (Some(record), Uniqueness::WhileActive) => record.job.state.is_active(),
                };
                if holds {
                    return Enqueued { id, created: false };
                }
            }
        }
        let id = job.id;
        job.needs = self.needs.share(std::mem::take(&mut job.needs));
        if let Some(parent) = job.parent {
            self.children.entry(parent).or_default().insert(id);
        }
        self.idx
            .with_queue(&job.queue, |queue| queue.all.insert(id));
        record.seq = self.draw_seq();
        self.idx.add(&record, id, now);
        self.jobs.insert(id, record);
        if let Some(key) = dedup_key {
            self.dedup.insert(key, (id, now));
        }
        Enqueued { id, created: true }
    }

    pub(crate) fn job(&self, id: JobId) -> Result<&Job> {
        self.jobs
            .get(&id)
            .map(|record| &record.job)
            .ok_or(Error::NotFound { id })
    }

    pub(crate) fn payload(&self, id: JobId) -> Result<Bytes> {
        self.jobs
            .get(&id)
            .map(|record| record.payload.clone())
            .ok_or(Error::NotFound { id })
    }

    pub(crate) fn children(&self, parent: JobId) -> Vec<Job> {
        self.children
            .get(&parent)
            .into_iter()
            .flatten()
            .filter_map(|id| self.jobs.get(id).map(|record| record.job.clone()))
            .collect()
    }

    /// Moves the queue's scheduled jobs that are due into its ready index.
    fn promote_due(&mut self, queue: &str, now: Timestamp) {
        let Some(index) = self.idx.queues.get_mut(queue) else {
            return;
        };
        while let Some(&(run_at, seq, id)) = index.scheduled.first() {
            if run_at > now {
                break;
            }
            index.scheduled.pop_first();
            if let Some(record) = self.jobs.get(&id) {
                index
                    .ready
                    .insert((ReadyOrder::new(record.job.priority, run_at, seq), id));
            }
        }
    }

    pub(crate) fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Vec<ClaimedJob> {
        let candidates = if request.is_fitted() {
            self.fitting_candidates(request, now)
        } else {
            self.ready_candidates(request, now)
        };
        self.lease_all(candidates, request, now)
    }

    /// The first `limit` ready jobs of the named queues in claim order (CONTRACT C3).
    fn ready_candidates(&mut self, request: &ClaimRequest, now: Timestamp) -> Vec<JobId> {
        let mut candidates: Vec<(ReadyOrder, JobId)> = Vec::new();
        for queue in &request.queues {
            if self.paused.contains(queue) {
                continue;
            }
            self.promote_due(queue, now);
            let Some(index) = self.idx.queues.get_mut(queue) else {
                continue;
            };
            // Each queue contributes at most `limit` live candidates; entries whose record
            // vanished are dropped on the way (CONTRACT C7).
            let mut taken = 0;
            let mut stale = Vec::new();
            for entry in index.ready.iter() {
                if taken == request.limit {
                    break;
                }
                if self.jobs.contains_key(&entry.1) {
                    candidates.push(*entry);
                    taken += 1;
                } else {
                    stale.push(*entry);
                }
            }
            for entry in stale {
                index.ready.remove(&entry);
            }
        }
        // The order spans all named queues and is applied before cutting to `limit` (C3).
        candidates.sort_unstable();
        candidates.dedup();
        candidates.truncate(request.limit);
        candidates.into_iter().map(|(_, id)| id).collect()
    }

    /// The first `limit` ready jobs of the named queues that the claim's budget admits,
    /// in its order (CONTRACT F2–F6): the whole ready set is filtered and ordered before
    /// the cut, and a job that does not fit is left untouched.
    fn fitting_candidates(&mut self, request: &ClaimRequest, now: Timestamp) -> Vec<JobId> {
        let mut candidates = Vec::new();
        for queue in &request.queues {
            if self.paused.contains(queue) {
                continue;
            }
            self.promote_due(queue, now);
            let Some(index) = self.idx.queues.get_mut(queue) else {
                continue;
            };
            let mut stale = Vec::new();
            // The index is in ready order, so once `limit` jobs of this queue fit, only
            // a preferred job of the same priority could still move ahead of them.
            let mut fitting = 0;
            // Jobs of one kind share their needs (`NeedsPool`): each kind is judged once.
            let mut verdicts: Vec<(&Needs, bool)> = Vec::new();
            let mut last_band = None;
            for entry in index.ready.iter() {
                let (order, id) = *entry;
                if last_band.is_some_and(|band| band != order.priority) {
                    break;
                }
                let Some(record) = self.jobs.get(&id) else {
                    stale.push(*entry);
                    continue;
                };
                let job = &record.job;
                if request.reserved.is_some_and(|reserved| reserved != id) {
                    continue;
                }
                let admitted = match verdicts
                    .iter()
                    .find(|(needs, _)| needs.is_shared_with(&job.needs))
                {
                    Some(&(_, admitted)) => admitted,
                    None => {
                        let admitted = request.admits(&job.needs);
                        if verdicts.len() < VERDICTS_KEPT {
                            verdicts.push((&job.needs, admitted));
                        }
                        admitted
                    }
                };
                if !admitted {
                    continue;
                }
                candidates.push((request.fit_order(order, job.locality.as_deref()), id));
                fitting += 1;
                if fitting >= request.limit {
                    if request.prefer.is_empty() {
                        break;
                    }
                    last_band = Some(order.priority);
                }
            }
            for entry in stale {
                index.ready.remove(&entry);
            }
        }
        candidates.sort_unstable();
        candidates.truncate(request.limit);
        candidates.into_iter().map(|(_, id)| id).collect()
    }

    fn lease_all(
        &mut self,
        candidates: Vec<JobId>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Vec<ClaimedJob> {
        let expires_at = now.saturating_add(request.lease_ttl);
        candidates
            .into_iter()
            .filter_map(|id| {
                self.transition_record(id, now, |record| {
                    if record.unreadable {
                        // What every backend does with a record it cannot decode.
                        Self::finish(&mut record.job, JobState::Dead, now);
                        record.job.last_error = Some(UNREADABLE.to_owned());
                        return None;
                    }
                    record.last_token += 1;
                    let job = &mut record.job;
                    job.state = JobState::Running;
                    job.attempts = job.attempts.saturating_add(1);
                    job.started_at = Some(now);
                    job.heartbeat_at = Some(now);
                    job.lease = Some(Lease {
                        worker: request.worker.clone(),
                        token: LeaseToken::new(record.last_token),
                        expires_at,
                    });
                    Some(ClaimedJob {
                        job: job.clone(),
                        payload: record.payload.clone(),
                    })
                })
                .flatten()
            })
            .collect()
    }

    pub(crate) fn heartbeat(
        &mut self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.check_lease(id, token)?;
        let expires_at = now.saturating_add(ttl);
        self.transition_checked(id, now, |job| {
            job.heartbeat_at = Some(now);
            if let Some(lease) = &mut job.lease {
                lease.expires_at = expires_at;
            }
            Heartbeat {
                cancel_requested: job.cancel_requested,
                expires_at,
            }
        })
    }

    fn finish(job: &mut Job, state: JobState, now: Timestamp) {
        job.state = state;
        job.lease = None;
        job.finished_at = Some(now);
    }

    /// Moves a job whose attempt ended without success where `transition` decided.
    fn apply(job: &mut Job, next: Next, now: Timestamp) {
        match next {
            Next::Queued { ready_at } => {
                job.state = JobState::Queued;
                job.lease = None;
                job.run_at = ready_at;
            }
            Next::Finished(state) => Self::finish(job, state, now),
        }
    }

    fn attempts(job: &Job) -> Attempts {
        Attempts {
            cancel_requested: job.cancel_requested,
            taken: job.attempts,
            max: job.max_attempts,
        }
    }

    pub(crate) fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.check_lease(id, token)?;
        // Moved out of the ending lease (after `transition` unindexed it), not copied.
        self.transition_record(id, now, |record| {
            let job = &mut record.job;
            record.last_worker = job.lease.take().map(|lease| lease.worker);
            Self::finish(job, JobState::Succeeded, now);
            job.result = result;
            // An earlier attempt's error is in the history, not on a succeeded job (L4).
            job.last_error = None;
        })
        .ok_or(Error::NotFound { id })
    }

    pub(crate) fn fail(
        &mut self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.check_lease(id, token)?;
        self.end_attempt(id, AttemptOutcome::Failed, Some(error), now);
        self.transition_checked(id, now, |job| {
            job.last_error = Some(error.to_owned());
            Self::apply(
                job,
                transition::after_failure(Self::attempts(job), retry),
                now,
            );
            job.state
        })
    }

    pub(crate) fn release(
        &mut self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<JobState> {
        self.check_lease(id, token)?;
        self.end_attempt(id, AttemptOutcome::Released, None, now);
        self.transition_checked(id, now, |job| {
            let next = transition::after_release(job.cancel_requested, ready_at);
            if next.state() == JobState::Queued {
                // A released attempt does not count; a cancelled one stays counted (A1).
                job.attempts = job.attempts.saturating_sub(1);
            }
            Self::apply(job, next, now);
            job.state
        })
    }

    pub(crate) fn reclaim(&mut self, limit: usize, now: Timestamp) -> Vec<ReclaimedJob> {
        let mut reclaimed = Vec::new();
        while reclaimed.len() < limit {
            let Some(&(expires_at, id)) = self.idx.leases.first() else {
                break;
            };
            // Strictly past the expiry (CONTRACT R1, R2).
            if expires_at >= now {
                break;
            }
            if !self.jobs.contains_key(&id) {
                // A vanished record: drop the entry, never requeue or recreate (R5).
                self.idx.leases.pop_first();
                continue;
            }
            self.end_attempt(id, AttemptOutcome::Expired, Some(LEASE_EXPIRED), now);
            let reclaimed_state = self.transition(id, now, |job| {
                job.last_error = Some(LEASE_EXPIRED.to_owned());
                let next = transition::after_lease_expired(Self::attempts(job), now);
                Self::apply(job, next, now);
                job.state
            });
            if let Some(state) = reclaimed_state {
                reclaimed.push(ReclaimedJob { id, state });
            }
        }
        reclaimed
    }

    /// Records how the running attempt of `id` ended, before its lease is dropped.
    fn end_attempt(
        &mut self,
        id: JobId,
        outcome: AttemptOutcome,
        error: Option<&str>,
        now: Timestamp,
    ) {
        let Some(record) = self.jobs.get_mut(&id) else {
            return;
        };
        let (Some(lease), Some(started_at)) = (&record.job.lease, record.job.started_at) else {
            return;
        };
        let attempt = Attempt::ended(
            lease.token,
            lease.worker.clone(),
            started_at,
            now,
            outcome,
            error.map(|error| durq_core::validate::truncate_attempt_error(error).to_owned()),
        );
        record.ended.push(attempt);
        let kept = usize::try_from(durq_core::ATTEMPTS_KEPT).unwrap_or(usize::MAX);
        if record.ended.len() > kept {
            record.ended.remove(0);
        }
    }

    /// CONTRACT H1–H3: the job's attempts, oldest first.
    pub(crate) fn attempt_history(&self, id: JobId) -> Result<Vec<Attempt>> {
        let record = self.jobs.get(&id).ok_or(Error::NotFound { id })?;
        let job = &record.job;
        Ok(attempts::history(
            record.ended.clone(),
            LastClaim {
                state: job.state,
                worker: job
                    .lease
                    .as_ref()
                    .map(|lease| lease.worker.clone())
                    .or_else(|| record.last_worker.clone()),
                token: LeaseToken::new(record.last_token),
                started_at: job.started_at,
                finished_at: job.finished_at,
            },
        ))
    }

    pub(crate) fn cancel(&mut self, id: JobId, now: Timestamp) -> Result<JobState> {
        let state = self.job(id)?.state;
        Ok(match state {
            JobState::Queued => self.transition_checked(id, now, |job| {
                Self::finish(job, JobState::Cancelled, now);
                job.state
            })?,
            JobState::Running => self.transition_checked(id, now, |job| {
                job.cancel_requested = true;
                job.state
            })?,
            terminal => terminal,
        })
    }

    pub(crate) fn retry(&mut self, id: JobId, now: Timestamp) -> Result<()> {
        let state = self.job(id)?.state;
        if !matches!(state, JobState::Dead | JobState::Cancelled) {
            return Err(Error::InvalidState {
                id,
                state,
                operation: "retry",
            });
        }
        self.transition_checked(id, now, |job| {
            job.state = JobState::Queued;
            job.run_at = now;
            job.attempts = 0;
            job.cancel_requested = false;
            job.finished_at = None;
            job.result = None;
            job.lease = None;
            // It starts over (CONTRACT A2): its past runs are in its attempt history.
            job.started_at = None;
            job.heartbeat_at = None;
            job.last_error = None;
        })
    }

    pub(crate) fn stats(&mut self, queue: &str, now: Timestamp) -> QueueStats {
        let mut stats = QueueStats::default();
        let Some(index) = self.idx.queues.get(queue) else {
            return stats;
        };
        for job in index
            .all
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .map(|r| &r.job)
        {
            match job.state {
                JobState::Queued if job.run_at <= now => stats.ready += 1,
                JobState::Queued => stats.scheduled += 1,
                JobState::Running => stats.running += 1,
                JobState::Succeeded => stats.succeeded += 1,
                JobState::Dead => stats.dead += 1,
                JobState::Cancelled => stats.cancelled += 1,
            }
        }
        stats
    }

    /// CONTRACT A7: every queue holding a job, by name, with its counts and the ready
    /// time of its oldest ready job.
    pub(crate) fn queues(&mut self, now: Timestamp) -> Vec<QueueOverview> {
        let mut names: Vec<String> = self.idx.queues.keys().cloned().collect();
        names.sort_unstable();
        let mut overviews = Vec::with_capacity(names.len());
        for name in names {
            let stats = self.stats(&name, now);
            if stats.total() == 0 {
                continue;
            }
            let oldest_ready = self.idx.queues.get(&name).and_then(|index| {
                index
                    .all
                    .iter()
                    .filter_map(|id| self.jobs.get(id))
                    .map(|r| &r.job)
                    .filter(|job| job.state == JobState::Queued && job.run_at <= now)
                    .map(|job| job.run_at)
                    .min()
            });
            overviews.push(QueueOverview::new(name, stats, oldest_ready));
        }
        overviews
    }

    /// CONTRACT A4: each matching queue's newest matching jobs after the cursor,
    /// merged newest first; a queue can give no more than a page, so the merge is exact.
    pub(crate) fn list(&self, query: &ListQuery) -> ListPage {
        let mut jobs: Vec<Job> = Vec::new();
        for (_, index) in self
            .idx
            .queues
            .iter()
            .filter(|(name, _)| query.matches_queue(name))
        {
            let newest_first = match query.cursor {
                Some(cursor) => index.all.range(..cursor).rev(),
                None => index.all.range(..).rev(),
            };
            jobs.extend(
                newest_first
                    .filter_map(|id| self.jobs.get(id))
                    .map(|record| &record.job)
                    .filter(|job| query.matches(job))
                    .take(query.limit)
                    .cloned(),
            );
        }
        jobs.sort_unstable_by_key(|job| std::cmp::Reverse(job.id));
        jobs.truncate(query.limit);
        let next = if jobs.len() == query.limit {
            jobs.last().map(|job| job.id)
        } else {
            None
        };
        ListPage { jobs, next }
    }

    pub(crate) fn purge(&mut self, limit: usize, cutoff: Timestamp) -> u64 {
        let mut purged = 0;
        while (purged as usize) < limit {
            let Some(&(finished_at, id)) = self.idx.finished.first() else {
                break;
            };
            if finished_at > cutoff {
                break;
            }
            self.idx.finished.pop_first();
            let Some(record) = self.jobs.remove(&id) else {
                continue;
            };
            let job = record.job;
            if let Some(index) = self.idx.queues.get_mut(&job.queue) {
                index.all.remove(&id);
            }
            if let Some(key) = job.idempotency_key {
                let key = (job.tenant, key);
                if self.dedup.get(&key).is_some_and(|(owner, _)| *owner == id) {
                    self.dedup.remove(&key);
                }
            }
            if let Some(parent) = job.parent {
                if let Some(siblings) = self.children.get_mut(&parent) {
                    siblings.remove(&id);
                }
            }
            purged += 1;
        }
        purged
    }

    pub(crate) fn vanish(&mut self, id: JobId) -> bool {
        self.jobs.remove(&id).is_some()
    }

    pub(crate) fn corrupt(&mut self, id: JobId) -> bool {
        match self.jobs.get_mut(&id) {
            Some(record) => {
                record.unreadable = true;
                true
            }
            None => false,
        }
    }
}
