//! Flow control (CONTRACT K1–K4): each queue's limits, the running jobs and recent
//! starts they count, and what one claim may still take under them.
//!
//! Only queues with limits are counted: the counts are built when a queue gets its
//! limits (from the running jobs, so a limit set while jobs run counts them) and kept
//! by the index updates of every transition in and out of `running`, so a queue
//! without limits pays nothing on its claims and completions. Starts are logged only
//! for queues with a rate, by the claim that leases them.

use std::collections::VecDeque;

use durq_core::{FlowStatus, Rate, FLOW_KEYS_SHOWN};

use super::*;

/// The recent starts of a queue with a rate (K4), of the queue and of each key: the
/// claims' instants, oldest first, at most as many as the rate admits per window
/// (older ones can no longer decide anything).
#[derive(Debug, Default)]
pub(super) struct Starts {
    queue: VecDeque<Timestamp>,
    by_key: FxHashMap<String, VecDeque<Timestamp>>,
}

/// The starts of `log` inside the window of a claim at `now` (K4): a start at or
/// before `now - per` has left it. Counted, not cut at the first old entry: a clock
/// set back can leave the log out of order.
fn in_window(log: &VecDeque<Timestamp>, rate: Rate, now: Timestamp) -> u64 {
    let opens_after = rate.window_opens_after(now);
    log.iter().filter(|at| **at > opens_after).count() as u64
}

/// When `log`'s window admits a start again, if it is full at `now`.
fn frees_at(log: &VecDeque<Timestamp>, rate: Rate, now: Timestamp) -> Option<Timestamp> {
    let opens_after = rate.window_opens_after(now);
    let mut inside: Vec<Timestamp> = log.iter().copied().filter(|at| *at > opens_after).collect();
    if rate.admits(inside.len() as u64) {
        return None;
    }
    // The start whose leaving brings the count below the rate.
    inside.sort_unstable();
    let blocking = inside[inside.len() - rate.starts as usize];
    Some(rate.frees_at(blocking))
}

/// Appends a start at `now` to `log`, dropping what has left the window and what is
/// beyond the rate's count.
fn log_start(log: &mut VecDeque<Timestamp>, rate: Rate, now: Timestamp) {
    let opens_after = rate.window_opens_after(now);
    while log.front().is_some_and(|at| *at <= opens_after) {
        log.pop_front();
    }
    log.push_back(now);
    while log.len() > rate.starts as usize {
        log.pop_front();
    }
}

impl Starts {
    /// Logs the start of a job of this queue, with concurrency key `key`, at `now`.
    pub(super) fn record(&mut self, limits: &QueueLimits, key: Option<&str>, now: Timestamp) {
        if let Some(rate) = limits.max_starts {
            log_start(&mut self.queue, rate, now);
        }
        if let (Some(rate), Some(key)) = (limits.max_starts_per_key, key) {
            match self.by_key.get_mut(key) {
                Some(log) => log_start(log, rate, now),
                None => {
                    let mut log = VecDeque::new();
                    log_start(&mut log, rate, now);
                    self.by_key.insert(key.to_owned(), log);
                }
            }
        }
    }

    /// The earliest instant after `now` at which a full window of this queue, its own
    /// or a key's, admits a start again: when a claimer held back by a rate may look
    /// again. Keys whose window emptied are forgotten on the way.
    fn next_free(&mut self, limits: &QueueLimits, now: Timestamp) -> Option<Timestamp> {
        let mut next = limits
            .max_starts
            .and_then(|rate| frees_at(&self.queue, rate, now));
        if let Some(rate) = limits.max_starts_per_key {
            let opens_after = rate.window_opens_after(now);
            self.by_key
                .retain(|_, log| log.iter().any(|at| *at > opens_after));
            for log in self.by_key.values() {
                if let Some(at) = frees_at(log, rate, now) {
                    next = Some(next.map_or(at, |next| next.min(at)));
                }
            }
        }
        next
    }
}

/// The running jobs of a queue with limits: in all, and per concurrency key.
#[derive(Debug, Default)]
pub(super) struct Running {
    jobs: u64,
    by_key: FxHashMap<String, u64>,
}

impl Running {
    pub(super) fn add(&mut self, key: Option<&str>) {
        self.jobs += 1;
        if let Some(key) = key {
            match self.by_key.get_mut(key) {
                Some(count) => *count += 1,
                None => {
                    self.by_key.insert(key.to_owned(), 1);
                }
            }
        }
    }

    pub(super) fn remove(&mut self, key: Option<&str>) {
        self.jobs = self.jobs.saturating_sub(1);
        if let Some(key) = key {
            // A key that runs nothing keeps its entry, at 0, so a key that comes and
            // goes costs no allocation per job; housekeeping drops such entries.
            if let Some(count) = self.by_key.get_mut(key) {
                *count = count.saturating_sub(1);
            }
        }
    }
}

/// What one claim may still take of one queue: its limits, the jobs running and the
/// starts in the window when the claim started, and those the claim took so far (K1,
/// K2, K4 count both).
pub(super) struct Admission<'a> {
    limits: QueueLimits,
    running: Option<&'a Running>,
    starts: Option<&'a Starts>,
    /// The queue's starts inside its rate window when the claim started (K4).
    queue_starts: u64,
    /// The instant the rate windows are read at: the claim's `now`, or the machine's
    /// clock under [`crate::MemoryServer::rate_on_system_clock`].
    now: Timestamp,
    taken: u64,
    taken_by_key: FxHashMap<&'a str, u64>,
    /// No key can reach a per-key limit in this claim: the queue runs, with all the
    /// claim may take, fewer jobs than `max_running_per_key`, and no key has a rate.
    /// The claim then counts nothing per key.
    keys_free: bool,
    /// The fault of [`crate::MemoryServer::count_limits_once`]: jobs this claim took
    /// are not counted.
    forgets_own: bool,
}

impl<'a> Admission<'a> {
    /// Whether the queue admits no job at all now (K2, K4), so its candidates need no
    /// walk.
    pub(super) fn queue_full(&self) -> bool {
        let running = self.running.map_or(0, |r| r.jobs);
        !self.limits.admits_queue(running + self.taken)
            || self
                .limits
                .max_starts
                .is_some_and(|rate| !rate.admits(self.queue_starts + self.taken))
    }

    /// Whether a job with concurrency key `key` may be taken; if so, counts it.
    pub(super) fn take(&mut self, key: Option<&'a str>) -> bool {
        if self.queue_full() {
            return false;
        }
        if let Some(key) = key.filter(|_| !self.keys_free && self.limits.counts_keys()) {
            let taken = self.taken_by_key.get(key).copied().unwrap_or(0);
            if self.limits.max_running_per_key.is_some() {
                let running = self
                    .running
                    .and_then(|r| r.by_key.get(key).copied())
                    .unwrap_or(0);
                if !self.limits.admits_key(running + taken) {
                    return false;
                }
            }
            if let Some(rate) = self.limits.max_starts_per_key {
                let started = self
                    .starts
                    .and_then(|s| s.by_key.get(key))
                    .map_or(0, |log| in_window(log, rate, self.now));
                if !rate.admits(started + taken) {
                    return false;
                }
            }
            if !self.forgets_own {
                *self.taken_by_key.entry(key).or_insert(0) += 1;
            }
        }
        if !self.forgets_own {
            self.taken += 1;
        }
        true
    }
}

impl State {
    /// Rule K3: stores `queue`'s limits (unlimited ones remove them), counting its
    /// running jobs when it had none before.
    pub(crate) fn set_limits(&mut self, queue: &str, limits: QueueLimits) {
        if !self.faults.rates_keep_starts {
            self.forget_dropped_rates(queue, &limits);
        }
        self.set_fair(queue, limits.fair_shares);
        if limits.is_unlimited() {
            self.limits.remove(queue);
            self.idx.running.remove(queue);
            return;
        }
        self.limits.insert(queue.to_owned(), limits);
        if self.idx.running.contains_key(queue) {
            return;
        }
        let mut running = Running::default();
        for (_, id) in &self.idx.leases {
            if let Some(record) = self.jobs.get(id) {
                let job = &record.job;
                if job.queue == queue && job.state == JobState::Running {
                    running.add(job.concurrency_key.as_deref());
                }
            }
        }
        self.idx.running.insert(queue.to_owned(), running);
    }

    /// Forgets the starts of each rate `limits` no longer have (K4): the queue's own
    /// without `max_starts`, every key's without `max_starts_per_key`.
    fn forget_dropped_rates(&mut self, queue: &str, limits: &QueueLimits) {
        if !limits.limits_starts() {
            self.starts.remove(queue);
            return;
        }
        let Some(starts) = self.starts.get_mut(queue) else {
            return;
        };
        if limits.max_starts.is_none() {
            starts.queue.clear();
        }
        if limits.max_starts_per_key.is_none() {
            starts.by_key.clear();
        }
    }

    /// Whether a job of a queue with limits left `running` since the last call.
    pub(crate) fn take_freed_slot(&mut self) -> bool {
        std::mem::take(&mut self.idx.freed_slot)
    }

    /// Logs the starts of the jobs a claim leased, for the queues with a rate (K4).
    pub(super) fn record_starts(&mut self, claimed: &[ClaimedJob], now: Timestamp) {
        if self.limits.is_empty() {
            return;
        }
        for ClaimedJob { job, .. } in claimed {
            let Some(limits) = self.limits.get(job.queue.as_str()) else {
                continue;
            };
            if !limits.limits_starts() {
                continue;
            }
            let starts = match self.starts.get_mut(job.queue.as_str()) {
                Some(starts) => starts,
                None => self.starts.entry(job.queue.clone()).or_default(),
            };
            starts.record(limits, job.concurrency_key.as_deref(), now);
        }
    }

    /// The earliest instant after `now` at which a rate of one of `queues` admits a
    /// start it holds back now (K4): when a claimer that found nothing should look
    /// again, at the latest.
    pub(crate) fn next_rate_free(
        &mut self,
        queues: &[String],
        now: Timestamp,
    ) -> Option<Timestamp> {
        let mut next: Option<Timestamp> = None;
        for queue in queues {
            let (Some(limits), Some(starts)) = (
                self.limits.get(queue.as_str()),
                self.starts.get_mut(queue.as_str()),
            ) else {
                continue;
            };
            if let Some(at) = starts.next_free(limits, now) {
                next = Some(next.map_or(at, |next| next.min(at)));
            }
        }
        next
    }

    /// Forgets the key logs whose starts all left their window, and the running counts
    /// of keys that run nothing: a claim trims only the logs it writes to, and a job's
    /// end leaves its key's count at 0, so both are dropped here, with the housekeeping
    /// of reclaim.
    pub(super) fn forget_old_starts(&mut self, now: Timestamp) {
        for running in self.idx.running.values_mut() {
            running.by_key.retain(|_, count| *count > 0);
        }
        if self.starts.is_empty() {
            return;
        }
        let limits = &self.limits;
        for (queue, starts) in self.starts.iter_mut() {
            if let Some(rate) = limits.get(queue).and_then(|l| l.max_starts_per_key) {
                let opens_after = rate.window_opens_after(now);
                starts
                    .by_key
                    .retain(|_, log| log.iter().any(|at| *at > opens_after));
            }
        }
    }

    /// Rule K3: what `queue`'s limits hold back at `now`.
    pub(crate) fn flow_status(&self, queue: &str, now: Timestamp) -> FlowStatus {
        let running = match self.idx.running.get(queue) {
            Some(running) => running.jobs,
            // Not counted for a queue without limits: read off the leases.
            None => self
                .idx
                .leases
                .iter()
                .filter(|(_, id)| self.jobs.get(id).is_some_and(|r| r.job.queue == queue))
                .count() as u64,
        };
        let mut status = FlowStatus::new(running);
        let Some(limits) = self.limits.get(queue) else {
            return status;
        };
        if let (Some(limit), Some(running)) =
            (limits.max_running_per_key, self.idx.running.get(queue))
        {
            let mut at_limit: Vec<(String, u64)> = running
                .by_key
                .iter()
                .filter(|(_, count)| **count >= u64::from(limit))
                .map(|(key, count)| (key.clone(), *count))
                .collect();
            at_limit.sort_unstable();
            at_limit.truncate(FLOW_KEYS_SHOWN);
            status.keys_at_limit = at_limit;
        }
        if let Some(starts) = self.starts.get(queue) {
            status.next_start = limits
                .max_starts
                .and_then(|rate| frees_at(&starts.queue, rate, now));
            if let Some(rate) = limits.max_starts_per_key {
                let mut held: Vec<(String, Timestamp)> = starts
                    .by_key
                    .iter()
                    .filter_map(|(key, log)| frees_at(log, rate, now).map(|at| (key.clone(), at)))
                    .collect();
                held.sort_unstable();
                held.truncate(FLOW_KEYS_SHOWN);
                status.keys_rate_limited = held;
            }
        }
        status
    }

    /// Whether any queue has a rate (K4).
    pub(crate) fn has_rates(&self) -> bool {
        self.limits.values().any(QueueLimits::limits_starts)
    }

    /// Rule K3: every queue's limits, by name.
    pub(crate) fn limits(&self) -> Vec<(String, QueueLimits)> {
        self.limits
            .iter()
            .map(|(queue, limits)| (queue.clone(), *limits))
            .collect()
    }
}

impl<'a> Admission<'a> {
    /// What a claim of at most `claim_limit` jobs starting now may take of `queue`, or
    /// `None` when it has no limits: from the state's fields, so a claim can hold it
    /// while it walks the queue's ready index.
    pub(super) fn of(
        limits: &BTreeMap<String, QueueLimits>,
        running: &'a FxHashMap<String, Running>,
        starts: &'a FxHashMap<String, Starts>,
        faults: &Faults,
        queue: &str,
        now: Timestamp,
        claim_limit: usize,
    ) -> Option<Self> {
        if limits.is_empty() {
            return None;
        }
        let limits = *limits.get(queue)?;
        let running = running.get(queue);
        let at_most = running.map_or(0, |r| r.jobs) + claim_limit as u64;
        let keys_free = limits.max_starts_per_key.is_none()
            && limits
                .max_running_per_key
                .is_none_or(|limit| at_most < u64::from(limit));
        let starts = starts.get(queue);
        let now = if faults.rate_on_system_clock {
            durq_core::Clock::now(&durq_core::SystemClock)
        } else {
            now
        };
        let queue_starts = match (limits.max_starts, starts) {
            (Some(rate), Some(starts)) => in_window(&starts.queue, rate, now),
            _ => 0,
        };
        Some(Admission {
            limits,
            running,
            starts,
            queue_starts,
            now,
            taken: 0,
            taken_by_key: FxHashMap::default(),
            keys_free: keys_free && !faults.count_limits_once,
            forgets_own: faults.count_limits_once,
        })
    }
}

/// Faults a test may inject into the store's own logic, to show that the conformance
/// suite catches them (set through [`crate::MemoryServer`]).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// A claim counts only the jobs running before it, not those it takes itself:
    /// the limit read before the claim's writes (CONTRACT K1, K2).
    pub(crate) count_limits_once: bool,
    /// Claims read the rate windows on the machine's clock, not on the `now` they are
    /// given: a rate window on the caller's clock (CONTRACT K4).
    pub(crate) rate_on_system_clock: bool,
    /// Claims never move a fair queue's turn on, so each starts again at the same key:
    /// a rotation that restarts at the same key (CONTRACT K5).
    pub(crate) turns_restart: bool,
    /// Fitted claims (a budget, a preference, a reservation) apply no limits: a
    /// backend that enforces them only in its plain claim (CONTRACT K1, K2, K4).
    pub(crate) fitted_ignore_limits: bool,
    /// Limits without a rate keep the queue's starts, so a rate set again counts the
    /// starts taken under the old one until housekeeping forgets them (CONTRACT K4).
    pub(crate) rates_keep_starts: bool,
    /// Limits without fair shares keep the queue's turns, so fair shares set again go
    /// on from the old turn instead of the first key (CONTRACT K5).
    pub(crate) unfair_keeps_turns: bool,
    /// A preferring claim admits a limited queue's jobs in ready order and only then
    /// puts the preferred ones first, so a key's slot goes to a job the preference
    /// ranks lower (CONTRACT K1, F5).
    pub(crate) limits_before_preference: bool,
    /// A waiting job is released when the first job it waits for succeeds, not the
    /// last: a fan-in that does not wait for all (CONTRACT G1).
    pub(crate) release_on_first_dependency: bool,
    /// A dependency that ends dead or cancelled counts as met for every policy: a
    /// dependent that runs on a failed input (CONTRACT G3).
    pub(crate) ignore_dependency_failures: bool,
    /// A waiting job does not hold a key unique while active: only queued and running
    /// jobs do (CONTRACT E10, decided with G1).
    pub(crate) waiting_frees_unique_keys: bool,
    /// A release that ends a cancel-requested job cancelled leaves the jobs waiting for
    /// it waiting, as a release script without a graph tail did (CONTRACT G3).
    pub(crate) release_leaves_dependents: bool,
    /// A reopen checks the job and its generation under one hold of the lock and
    /// changes it under another, so concurrent reopens that all checked first all win
    /// (CONTRACT D4). Read only by the backend's reopen in test builds.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) reopen_checks_apart: bool,
    /// Every other event becomes visible only after the one recorded after it, as rows
    /// numbered by a sequence become visible in commit order: a reader that moved past
    /// the later one never sees the earlier (CONTRACT V4).
    pub(crate) events_out_of_order: bool,
}
