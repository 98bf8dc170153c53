//! What handlers record while a run drains: when the first job started, how many are
//! done, when the last one finished, and when each job's handler started.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Shared by every handler of one run.
#[derive(Debug)]
pub struct Progress {
    target: u64,
    base: Instant,
    first_start: OnceLock<Instant>,
    completed: AtomicU64,
    last_done: Mutex<Option<Instant>>,
    all_done: Notify,
    /// Handler start of job `i`, in nanoseconds after `base` plus one (0: not yet).
    starts: Vec<AtomicU64>,
}

impl Progress {
    /// Progress towards `target` jobs; `track_starts` keeps each job's start time (for
    /// the latency workload), indexed by the number in its payload.
    pub fn new(target: u64, track_starts: bool) -> Self {
        let slots = if track_starts { target as usize } else { 0 };
        Progress {
            target,
            base: Instant::now(),
            first_start: OnceLock::new(),
            completed: AtomicU64::new(0),
            last_done: Mutex::new(None),
            all_done: Notify::new(),
            starts: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Called when a handler starts job number `index` (from its payload).
    pub fn started(&self, index: Option<u64>) {
        let now = Instant::now();
        let _ = self.first_start.set(now);
        if let Some(slot) = index.and_then(|i| self.starts.get(i as usize)) {
            let nanos = now.duration_since(self.base).as_nanos() as u64;
            slot.store(nanos + 1, Ordering::Relaxed);
        }
    }

    /// Called when a job's completion is stored; the last one wakes [`Self::wait`].
    pub fn done(&self) {
        let count = self.completed.fetch_add(1, Ordering::AcqRel) + 1;
        if count == self.target {
            let mut last = self.last_done.lock().unwrap_or_else(|p| p.into_inner());
            *last = Some(Instant::now());
            drop(last);
            self.all_done.notify_waiters();
            self.all_done.notify_one();
        }
    }

    /// How many jobs are done.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Whether every job is done.
    pub fn finished(&self) -> bool {
        self.completed() >= self.target
    }

    /// Resolves when every job is done (`true`), or once `deadline` has passed since the
    /// first job started (`false`); fails when no job finished for `stall`.
    pub async fn wait(&self, stall: Duration, deadline: Option<Duration>) -> Result<bool, String> {
        let mut seen = self.completed();
        let mut last_change = Instant::now();
        loop {
            if self.finished() {
                return Ok(true);
            }
            if let (Some(deadline), Some(first)) = (deadline, self.first_start.get()) {
                if first.elapsed() >= deadline {
                    return Ok(false);
                }
            }
            let _ =
                tokio::time::timeout(Duration::from_millis(250), self.all_done.notified()).await;
            let now_seen = self.completed();
            if now_seen != seen {
                seen = now_seen;
                last_change = Instant::now();
            } else if last_change.elapsed() >= stall && !self.finished() {
                return Err(format!(
                    "stalled: {seen} of {} jobs done, none for {:?}",
                    self.target, stall
                ));
            }
        }
    }

    /// When the first handler started.
    pub fn first_start(&self) -> Option<Instant> {
        self.first_start.get().copied()
    }

    /// The time from the first handler start to the last completion stored: the last
    /// [`Self::done`], or `stored_by` when the workers stored completions after it.
    pub fn span(&self, stored_by: Option<Instant>) -> Option<Duration> {
        let first = *self.first_start.get()?;
        let last = (*self.last_done.lock().unwrap_or_else(|p| p.into_inner()))?;
        let last = stored_by.map_or(last, |stored| stored.max(last));
        Some(last.saturating_duration_since(first))
    }

    /// When job `index`'s handler started, if it did.
    pub fn start_of(&self, index: usize) -> Option<Instant> {
        let nanos = self.starts.get(index)?.load(Ordering::Relaxed);
        (nanos > 0).then(|| self.base + Duration::from_nanos(nanos - 1))
    }
}

/// The job number a benchmark payload carries (its decimal digits).
pub fn payload_index(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload).ok()?.trim().parse().ok()
}
