//! The worker registry (CONTRACT W1–W4).

use super::*;

impl State {
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
}
