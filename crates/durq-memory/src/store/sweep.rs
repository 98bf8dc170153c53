//! Housekeeping: reclaim (CONTRACT R1–R6) and purge.

use super::*;

impl State {
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
        self.forget_old_starts(now);
        reclaimed
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
            if !self.steps.is_empty() {
                self.steps.remove(&id);
            }
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
}
