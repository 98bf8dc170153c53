//! Flow control (CONTRACT K1–K3): each queue's limits, the running jobs they count, and
//! what one claim may still take under them.
//!
//! Only queues with limits are counted: the counts are built when a queue gets its
//! limits (from the running jobs, so a limit set while jobs run counts them) and kept
//! by the index updates of every transition in and out of `running`, so a queue
//! without limits pays nothing on its claims and completions.

use super::*;

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
            if let Some(count) = self.by_key.get_mut(key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.by_key.remove(key);
                }
            }
        }
    }
}

/// What one claim may still take of one queue: its limits, the jobs running when the
/// claim started, and those the claim took so far (K1, K2 count both).
pub(super) struct Admission<'a> {
    limits: QueueLimits,
    running: Option<&'a Running>,
    taken: u64,
    taken_by_key: FxHashMap<&'a str, u64>,
    /// The fault of [`crate::MemoryServer::count_limits_once`]: jobs this claim took
    /// are not counted.
    forgets_own: bool,
}

impl<'a> Admission<'a> {
    /// Whether the queue admits no job at all now (K2), so its candidates need no walk.
    pub(super) fn queue_full(&self) -> bool {
        let running = self.running.map_or(0, |r| r.jobs);
        !self.limits.admits_queue(running + self.taken)
    }

    /// Whether a job with concurrency key `key` may be taken; if so, counts it.
    pub(super) fn take(&mut self, key: Option<&'a str>) -> bool {
        if self.queue_full() {
            return false;
        }
        if let Some(key) = key.filter(|_| self.limits.max_running_per_key.is_some()) {
            let running = self
                .running
                .and_then(|r| r.by_key.get(key).copied())
                .unwrap_or(0);
            let taken = self.taken_by_key.get(key).copied().unwrap_or(0);
            if !self.limits.admits_key(running + taken) {
                return false;
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

    /// Whether a job of a queue with limits left `running` since the last call.
    pub(crate) fn take_freed_slot(&mut self) -> bool {
        std::mem::take(&mut self.idx.freed_slot)
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
    /// What a claim starting now may take of `queue`, or `None` when it has no limits:
    /// from the state's fields, so a claim can hold it while it walks the queue's
    /// ready index.
    pub(super) fn of(
        limits: &BTreeMap<String, QueueLimits>,
        running: &'a FxHashMap<String, Running>,
        faults: &Faults,
        queue: &str,
    ) -> Option<Self> {
        if limits.is_empty() {
            return None;
        }
        let limits = *limits.get(queue)?;
        Some(Admission {
            limits,
            running: running.get(queue),
            taken: 0,
            taken_by_key: FxHashMap::default(),
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
}
