//! The reference model of rule M1: the [contract](durq_core::contract), its decided
//! choices included, written as plain data, with no storage, no concurrency and no
//! cleverness, so it can be read against the document line by line.
//!
//! Jobs are named by their index in order of creation ("model ids"); the runner maps
//! store ids onto them. Where the contract leaves a choice to the store (which jobs a
//! limited `reclaim` or `purge` takes, how jobs reclaimed together are ordered among
//! themselves), the model checks that the store's choice is one of the allowed ones and
//! then adopts it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use durq_core::{Job, JobId, JobState, QueueStats, ReadyOrder, Retry, Timestamp, LEASE_EXPIRED};

/// What the contract says a failing call must report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// `Error::NotFound`.
    NotFound,
    /// `Error::LeaseLost`.
    LeaseLost,
    /// `Error::InvalidInput` naming this field.
    Invalid(&'static str),
    /// `Error::InvalidState` reporting this state.
    InvalidState(JobState),
}

/// A new job as the model sees it: the queue by index, the parent by model id.
#[derive(Debug, Clone)]
pub(crate) struct NewModelJob {
    pub queue: usize,
    pub tenant: String,
    pub key: Option<String>,
    pub priority: i16,
    pub run_at: Option<Timestamp>,
    pub max_attempts: u32,
    pub parent: Option<usize>,
    pub payload: Vec<u8>,
}

/// The lease of a running model job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelLease {
    pub worker: String,
    pub token: u64,
    pub expires_at: Timestamp,
}

/// One job of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelJob {
    /// False once `purge` deleted it.
    pub present: bool,
    pub queue: usize,
    pub tenant: String,
    pub key: Option<String>,
    pub priority: i16,
    pub run_at: Timestamp,
    pub max_attempts: u32,
    pub parent: Option<usize>,
    pub payload: Vec<u8>,
    pub state: JobState,
    pub attempts: u32,
    /// Claims ever made: the last fencing token issued (C6, decided: a per-job counter).
    pub claims: u64,
    pub lease: Option<ModelLease>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub heartbeat_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub last_error: Option<String>,
    pub result: Option<Vec<u8>>,
    pub cancel_requested: bool,
    /// The sequence drawn when the job last entered `queued`. Jobs reclaimed by one
    /// call share one value: their order among themselves is the store's choice.
    pub seq: u64,
}

impl ModelJob {
    fn ready(&self, now: Timestamp) -> bool {
        self.present && self.state == JobState::Queued && self.run_at <= now
    }

    fn order(&self) -> ReadyOrder {
        ReadyOrder::new(self.priority, self.run_at, self.seq)
    }

    fn finish(&mut self, state: JobState, now: Timestamp) {
        self.state = state;
        self.lease = None;
        self.finished_at = Some(now);
    }
}

/// The whole store as the contract describes it.
#[derive(Debug)]
pub(crate) struct Model {
    /// The store's clock; the runner copies the manual clock here before every step.
    pub now: Timestamp,
    dedup_window: Duration,
    retention: Duration,
    pub jobs: Vec<ModelJob>,
    seq: u64,
    /// (tenant, key) → the job the key points to.
    keys: HashMap<(String, String), usize>,
}

impl Model {
    pub(crate) fn new(now: Timestamp, dedup_window: Duration, retention: Duration) -> Self {
        Model {
            now,
            dedup_window,
            retention,
            jobs: Vec::new(),
            seq: 0,
            keys: HashMap::new(),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The job `idx` if it exists and was not purged.
    fn live(&self, idx: usize) -> Result<&ModelJob, Expect> {
        match self.jobs.get(idx) {
            Some(job) if job.present => Ok(job),
            _ => Err(Expect::NotFound),
        }
    }

    fn live_mut(&mut self, idx: usize) -> Result<&mut ModelJob, Expect> {
        match self.jobs.get_mut(idx) {
            Some(job) if job.present => Ok(job),
            _ => Err(Expect::NotFound),
        }
    }

    /// The job `idx` when `token` is its current lease (CONTRACT "Lease", L2, L3).
    fn held(&mut self, idx: usize, token: u64) -> Result<&mut ModelJob, Expect> {
        let job = self.live_mut(idx)?;
        match &job.lease {
            Some(lease) if job.state == JobState::Running && lease.token == token => Ok(job),
            _ => Err(Expect::LeaseLost),
        }
    }

    /// What `validate_new_job` refuses, before anything else is looked at.
    fn static_check(new: &NewModelJob) -> Result<(), Expect> {
        if new.max_attempts == 0 {
            return Err(Expect::Invalid("max_attempts"));
        }
        Ok(())
    }

    fn parent_check(&self, new: &NewModelJob) -> Result<(), Expect> {
        match new.parent {
            Some(parent) if self.live(parent).is_err() => Err(Expect::Invalid("parent")),
            _ => Ok(()),
        }
    }

    /// E1, E2, E5, E6, E7: the id (model index) and whether it was created.
    pub(crate) fn enqueue(&mut self, new: &NewModelJob) -> Result<(usize, bool), Expect> {
        Self::static_check(new)?;
        self.parent_check(new)?;
        Ok(self.insert(new))
    }

    /// E9: one by one, after every job of the batch passed validation.
    pub(crate) fn enqueue_batch(
        &mut self,
        batch: &[NewModelJob],
    ) -> Result<Vec<(usize, bool)>, Expect> {
        batch.iter().try_for_each(Self::static_check)?;
        batch.iter().try_for_each(|new| self.parent_check(new))?;
        Ok(batch.iter().map(|new| self.insert(new)).collect())
    }

    fn insert(&mut self, new: &NewModelJob) -> (usize, bool) {
        let now = self.now;
        if let Some(key) = &new.key {
            let slot = (new.tenant.clone(), key.clone());
            if let Some(&first) = self.keys.get(&slot) {
                let job = &self.jobs[first];
                // E6, decided: the window is half-open, [created_at, created_at + window).
                if job.present && now < job.created_at.saturating_add(self.dedup_window) {
                    return (first, false);
                }
            }
        }
        let idx = self.jobs.len();
        let seq = self.next_seq();
        self.jobs.push(ModelJob {
            present: true,
            queue: new.queue,
            tenant: new.tenant.clone(),
            key: new.key.clone(),
            priority: new.priority,
            run_at: new.run_at.unwrap_or(now),
            max_attempts: new.max_attempts,
            parent: new.parent,
            payload: new.payload.clone(),
            state: JobState::Queued,
            attempts: 0,
            claims: 0,
            lease: None,
            created_at: now,
            started_at: None,
            heartbeat_at: None,
            finished_at: None,
            last_error: None,
            result: None,
            cancel_requested: false,
            seq,
        });
        if let Some(key) = &new.key {
            self.keys.insert((new.tenant.clone(), key.clone()), idx);
        }
        (idx, true)
    }

    /// The ready jobs of `queues`, in claim order (C3, C4, C5, C9).
    pub(crate) fn ready_in(&self, queues: &[usize]) -> Vec<usize> {
        let mut ready: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.jobs[i].ready(self.now) && queues.contains(&self.jobs[i].queue))
            .collect();
        ready.sort_by_key(|&i| self.jobs[i].order());
        ready
    }

    /// C1–C6, C9: checks that `claimed` (model ids, in the order the store returned
    /// them) is what the contract allows, then applies the claim. `partition` tells
    /// which partition holds a job (CONTRACT §8: on a partitioned store the order holds
    /// within each partition; one partition for any other store).
    pub(crate) fn claim(
        &mut self,
        queues: &[usize],
        worker: &str,
        ttl: Duration,
        limit: usize,
        claimed: &[usize],
        partition: impl Fn(usize) -> usize,
    ) -> Result<(), String> {
        let mut remaining = self.ready_in(queues);
        let expected = limit.min(remaining.len());
        if claimed.len() != expected {
            return Err(format!(
                "claim returned {} jobs {claimed:?}; {expected} expected from the ready set {remaining:?} (limit {limit})",
                claimed.len()
            ));
        }
        for (pos, &idx) in claimed.iter().enumerate() {
            let Some(at) = remaining.iter().position(|&r| r == idx) else {
                let job = self.jobs.get(idx);
                return Err(format!(
                    "claim returned #{idx} at position {pos}, which is not ready in these queues: {}",
                    job.map_or("unknown".to_owned(), |j| format!(
                        "state {}, queue {}, run_at {:?}",
                        j.state, j.queue, j.run_at
                    ))
                ));
            };
            // Jobs with an equal ReadyOrder (reclaimed by one call) may come in any order.
            // The first ready job of the claimed job's own partition is the one to beat.
            let Some(&head) = remaining.iter().find(|&&r| partition(r) == partition(idx)) else {
                return Err(format!(
                    "claim order: #{idx} is not in the ready set {remaining:?}"
                ));
            };
            let first = self.jobs[head].order();
            if self.jobs[idx].order() != first {
                return Err(format!(
                    "claim order: #{idx} ({:?}) returned at position {pos}, but #{head} ({first:?}) comes first in its partition; ready set in order: {remaining:?}",
                    self.jobs[idx].order(),
                ));
            }
            remaining.remove(at);
        }
        let now = self.now;
        for &idx in claimed {
            let job = &mut self.jobs[idx];
            job.state = JobState::Running;
            job.attempts += 1;
            job.claims += 1;
            job.lease = Some(ModelLease {
                worker: worker.to_owned(),
                token: job.claims,
                expires_at: now.saturating_add(ttl),
            });
            job.started_at = Some(now);
            job.heartbeat_at = Some(now);
        }
        Ok(())
    }

    /// L1: whether cancellation was requested, and the new expiry.
    pub(crate) fn heartbeat(
        &mut self,
        idx: usize,
        token: u64,
        ttl: Duration,
    ) -> Result<(bool, Timestamp), Expect> {
        let now = self.now;
        let job = self.held(idx, token)?;
        let expires_at = now.saturating_add(ttl);
        if let Some(lease) = &mut job.lease {
            lease.expires_at = expires_at;
        }
        job.heartbeat_at = Some(now);
        Ok((job.cancel_requested, expires_at))
    }

    /// L4, L5; A1, decided: complete wins over a requested cancel.
    pub(crate) fn complete(
        &mut self,
        idx: usize,
        token: u64,
        result: Option<Vec<u8>>,
    ) -> Result<(), Expect> {
        let now = self.now;
        let job = self.held(idx, token)?;
        job.finish(JobState::Succeeded, now);
        job.result = result;
        // L4: an earlier attempt's error is in the history, not on a succeeded job.
        job.last_error = None;
        Ok(())
    }

    /// L6, L7; A1, decided: a cancel-requested job that fails is cancelled.
    pub(crate) fn fail(
        &mut self,
        idx: usize,
        token: u64,
        error: &str,
        retry: Retry,
    ) -> Result<JobState, Expect> {
        let now = self.now;
        let job = self.held(idx, token)?;
        job.last_error = Some(error.to_owned());
        let state = if job.cancel_requested {
            job.finish(JobState::Cancelled, now);
            JobState::Cancelled
        } else {
            match retry {
                Retry::At(at) if job.attempts < job.max_attempts => {
                    job.state = JobState::Queued;
                    job.lease = None;
                    // L6, decided: a retry time in the past is stored as now.
                    job.run_at = at.max(now);
                    JobState::Queued
                }
                _ => {
                    job.finish(JobState::Dead, now);
                    JobState::Dead
                }
            }
        };
        if state == JobState::Queued {
            let seq = self.next_seq();
            self.jobs[idx].seq = seq;
        }
        Ok(state)
    }

    /// L8, decided: the attempt is taken back; A1: a cancel-requested job is cancelled.
    pub(crate) fn release(&mut self, idx: usize, token: u64) -> Result<(), Expect> {
        let now = self.now;
        let job = self.held(idx, token)?;
        if job.cancel_requested {
            // Decided under A1: the attempt stays counted, since the job does not go back
            // to `queued`.
            job.finish(JobState::Cancelled, now);
            return Ok(());
        }
        job.state = JobState::Queued;
        job.lease = None;
        job.attempts -= 1;
        job.run_at = now;
        let seq = self.next_seq();
        self.jobs[idx].seq = seq;
        Ok(())
    }

    /// The running jobs whose lease expired (R1: strictly before now).
    pub(crate) fn expired(&self) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                job.present
                    && job.state == JobState::Running
                    && job.lease.as_ref().is_some_and(|l| l.expires_at < self.now)
            })
            .collect()
    }

    /// Where reclaim must send job `idx` (R1, R3; decided under R3: cancel wins over dead).
    fn reclaim_target(&self, idx: usize) -> JobState {
        let job = &self.jobs[idx];
        if job.cancel_requested {
            JobState::Cancelled
        } else if job.attempts >= job.max_attempts {
            JobState::Dead
        } else {
            JobState::Queued
        }
    }

    /// R1–R3: checks the store's reclaim result, then applies it.
    pub(crate) fn reclaim(
        &mut self,
        limit: usize,
        reclaimed: &[(usize, JobState)],
    ) -> Result<(), String> {
        let expired = self.expired();
        let expected = limit.min(expired.len());
        if reclaimed.len() != expected {
            return Err(format!(
                "reclaim({limit}) recovered {} jobs {reclaimed:?}; {expected} expected of the expired {expired:?}",
                reclaimed.len()
            ));
        }
        for (pos, &(idx, state)) in reclaimed.iter().enumerate() {
            if !expired.contains(&idx) || reclaimed[..pos].iter().any(|&(i, _)| i == idx) {
                return Err(format!(
                    "reclaim recovered #{idx}, which is not (or no longer) expired; expired: {expired:?}"
                ));
            }
            let want = self.reclaim_target(idx);
            if state != want {
                return Err(format!(
                    "reclaim sent #{idx} to {state}; the contract says {want}"
                ));
            }
        }
        let now = self.now;
        // One sequence for the whole call: their order among themselves is the store's.
        let seq = self.next_seq();
        for &(idx, state) in reclaimed {
            let job = &mut self.jobs[idx];
            job.last_error = Some(LEASE_EXPIRED.to_owned());
            if state == JobState::Queued {
                job.state = JobState::Queued;
                job.lease = None;
                job.run_at = now;
                job.seq = seq;
            } else {
                job.finish(state, now);
            }
        }
        Ok(())
    }

    /// A1: the state afterwards.
    pub(crate) fn cancel(&mut self, idx: usize) -> Result<JobState, Expect> {
        let now = self.now;
        let job = self.live_mut(idx)?;
        match job.state {
            JobState::Queued => job.finish(JobState::Cancelled, now),
            JobState::Running => job.cancel_requested = true,
            _ => {}
        }
        Ok(job.state)
    }

    /// A2, with what it decides operator retry resets and keeps.
    pub(crate) fn retry(&mut self, idx: usize) -> Result<(), Expect> {
        let now = self.now;
        let job = self.live_mut(idx)?;
        if !matches!(job.state, JobState::Dead | JobState::Cancelled) {
            return Err(Expect::InvalidState(job.state));
        }
        job.state = JobState::Queued;
        job.run_at = now;
        job.attempts = 0;
        job.cancel_requested = false;
        job.finished_at = None;
        job.result = None;
        job.lease = None;
        // A2: it starts over.
        job.started_at = None;
        job.heartbeat_at = None;
        job.last_error = None;
        let seq = self.next_seq();
        self.jobs[idx].seq = seq;
        Ok(())
    }

    /// A5: the jobs `purge` may delete now.
    pub(crate) fn purgeable(&self) -> Vec<usize> {
        let cutoff = self.now.saturating_sub(self.retention);
        (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                job.present
                    && job.state.is_terminal()
                    && job.finished_at.is_some_and(|at| at <= cutoff)
            })
            .collect()
    }

    /// A5: checks which jobs a `purge(limit)` that reported `count` deleted, then
    /// applies it. `deleted` are the purgeable jobs `get` no longer finds.
    pub(crate) fn purge(
        &mut self,
        limit: usize,
        count: u64,
        deleted: &[usize],
    ) -> Result<(), String> {
        let purgeable = self.purgeable();
        let expected = limit.min(purgeable.len());
        if count != expected as u64 || deleted.len() != expected {
            return Err(format!(
                "purge({limit}) reported {count} and deleted {deleted:?}; {expected} of the purgeable {purgeable:?} expected"
            ));
        }
        for &idx in deleted {
            self.jobs[idx].present = false;
        }
        Ok(())
    }

    /// E8: the live children of a live job, oldest first.
    pub(crate) fn children(&self, parent: usize) -> Result<Vec<usize>, Expect> {
        self.live(parent)?;
        Ok((0..self.jobs.len())
            .filter(|&i| self.jobs[i].present && self.jobs[i].parent == Some(parent))
            .collect())
    }

    /// A3.
    pub(crate) fn stats(&self, queue: usize) -> QueueStats {
        let mut stats = QueueStats::default();
        for job in self.jobs.iter().filter(|j| j.present && j.queue == queue) {
            let count = match job.state {
                JobState::Waiting => &mut stats.waiting,
                JobState::Queued if job.run_at <= self.now => &mut stats.ready,
                JobState::Queued => &mut stats.scheduled,
                JobState::Running => &mut stats.running,
                JobState::Succeeded => &mut stats.succeeded,
                JobState::Dead => &mut stats.dead,
                JobState::Cancelled => &mut stats.cancelled,
            };
            *count += 1;
        }
        stats
    }

    /// A4: the live jobs of `queue` (in `state`), newest first.
    pub(crate) fn list(&self, queue: usize, state: Option<JobState>) -> Vec<usize> {
        (0..self.jobs.len())
            .rev()
            .filter(|&i| {
                let job = &self.jobs[i];
                job.present && job.queue == queue && state.is_none_or(|s| job.state == s)
            })
            .collect()
    }

    /// Compares a job as the store shows it with the model, field by field. `ids`
    /// maps model ids to store ids; `queues` names the queues.
    pub(crate) fn check_job(
        &self,
        idx: usize,
        got: &Job,
        ids: &[JobId],
        queues: &[&str],
    ) -> Result<(), String> {
        let want = &self.jobs[idx];
        let mut diff = String::new();
        let mut field = |name: &str, ok: bool, got: String, want: String| {
            if !ok {
                let _ = write!(diff, "\n    {name}: store {got}, model {want}");
            }
        };
        macro_rules! same {
            ($name:literal, $got:expr, $want:expr) => {
                field(
                    $name,
                    $got == $want,
                    format!("{:?}", $got),
                    format!("{:?}", $want),
                )
            };
        }
        same!("id", got.id, ids[idx]);
        same!("queue", got.queue.as_str(), queues[want.queue]);
        same!("tenant", got.tenant.as_str(), want.tenant.as_str());
        same!("idempotency_key", got.idempotency_key, want.key);
        same!("priority", got.priority, want.priority);
        same!("run_at", got.run_at, want.run_at);
        same!("max_attempts", got.max_attempts, want.max_attempts);
        same!("parent", got.parent, want.parent.map(|p| ids[p]));
        same!("state", got.state, want.state);
        same!("attempts", got.attempts, want.attempts);
        let lease = got.lease.as_ref().map(|l| ModelLease {
            worker: l.worker.clone(),
            token: l.token.get(),
            expires_at: l.expires_at,
        });
        same!("lease", lease, want.lease);
        same!("created_at", got.created_at, want.created_at);
        // Started and heartbeat times are pinned while running (C6, L1) and before the
        // first claim; what they show after the job left `running` is not written down.
        if want.claims == 0 || want.state == JobState::Running {
            same!("started_at", got.started_at, want.started_at);
            same!("heartbeat_at", got.heartbeat_at, want.heartbeat_at);
        }
        same!("finished_at", got.finished_at, want.finished_at);
        same!("last_error", got.last_error, want.last_error);
        same!("result", got.result.as_deref(), want.result.as_deref());
        // A finished job's flag is history nobody reads; a live job's flag is behaviour.
        if !want.state.is_terminal() {
            same!(
                "cancel_requested",
                got.cancel_requested,
                want.cancel_requested
            );
        }
        if diff.is_empty() {
            Ok(())
        } else {
            Err(format!("job #{idx} differs from the model:{diff}"))
        }
    }
}
