//! Fair shares (CONTRACT K5): a queue's ready jobs taken by turns of concurrency key.
//!
//! A queue with fair shares keeps its ready jobs a second time, by priority and key
//! ([`KeyedReady`]), so a claim finds the next job of each key in one lookup, however
//! deep the backlog of the keys before it; other queues keep no such index. The key a
//! queue's claims served last at each priority is the queue's turn, kept in
//! `State::turns`.

use std::ops::Bound;

use durq_core::fair::{in_turn_places, turns_left, Turn, NO_KEY};

use super::*;

/// A fair queue's ready jobs: per priority, per key (`""` for none), in claim order.
#[derive(Debug, Default)]
pub(super) struct KeyedReady {
    bands: BTreeMap<i16, BTreeMap<String, BTreeSet<(ReadyOrder, JobId)>>>,
}

impl KeyedReady {
    pub(super) fn insert(&mut self, key: Option<&str>, entry: (ReadyOrder, JobId)) {
        let band = self.bands.entry(entry.0.priority).or_default();
        let key = key.unwrap_or(NO_KEY);
        match band.get_mut(key) {
            Some(jobs) => {
                jobs.insert(entry);
            }
            None => {
                band.insert(key.to_owned(), BTreeSet::from([entry]));
            }
        }
    }

    pub(super) fn remove(&mut self, key: Option<&str>, entry: &(ReadyOrder, JobId)) {
        let priority = entry.0.priority;
        let Some(band) = self.bands.get_mut(&priority) else {
            return;
        };
        let key = key.unwrap_or(NO_KEY);
        if let Some(jobs) = band.get_mut(key) {
            jobs.remove(entry);
            if jobs.is_empty() {
                band.remove(key);
            }
        }
        if band.is_empty() {
            self.bands.remove(&priority);
        }
    }
}

/// The keys of one priority with their ready jobs, in turn order.
type KeyRing<'a> = Box<dyn Iterator<Item = (&'a String, &'a BTreeSet<(ReadyOrder, JobId)>)> + 'a>;

impl State {
    pub(super) fn is_fair(&self, queue: &str) -> bool {
        !self.idx.fair.is_empty() && self.idx.fair.contains(queue)
    }

    /// Turns fair shares on or off for `queue` (K3, K5): on, its ready jobs are indexed
    /// by key from now on; off, that index and its turns are dropped.
    pub(super) fn set_fair(&mut self, queue: &str, fair: bool) {
        if !fair {
            if self.idx.fair.remove(queue) {
                if let Some(index) = self.idx.queues.get_mut(queue) {
                    index.keyed = None;
                }
                if !self.faults.unfair_keeps_turns {
                    self.turns.remove(queue);
                }
            }
            return;
        }
        if !self.idx.fair.insert(queue.to_owned()) {
            return;
        }
        let Some(index) = self.idx.queues.get_mut(queue) else {
            return;
        };
        let mut keyed = KeyedReady::default();
        for entry in &index.ready {
            if let Some(record) = self.jobs.get(&entry.1) {
                keyed.insert(record.job.concurrency_key.as_deref(), *entry);
            }
        }
        index.keyed = Some(keyed);
    }

    /// Up to `limit` ready jobs of fair `queue` by turns of key (K5), priorities highest
    /// first; within one, the first admitted job of each key in turn from the one
    /// after the queue's turn, round after round. Appended to `out` with the places in
    /// claim order that the queue's first jobs hold, so a claim across queues merges
    /// them as it would the queue's first jobs, in turn order; noted in `turns`.
    pub(super) fn fair_candidates(
        &mut self,
        queue: &str,
        limit: usize,
        now: Timestamp,
        out: &mut Vec<(ReadyOrder, JobId)>,
        turns: &mut Vec<Turn<JobId>>,
    ) {
        let mut admission = limits::Admission::of(
            &self.limits,
            &self.idx.running,
            &self.starts,
            &self.faults,
            queue,
            now,
            limit,
        );
        let served = self.turns.get(queue);
        let Some(keyed) = self
            .idx
            .queues
            .get(queue)
            .and_then(|index| index.keyed.as_ref())
        else {
            return;
        };
        let jobs = &self.jobs;
        // In turn order, with the key whose turn each was.
        let mut taken: Vec<(ReadyOrder, JobId)> = Vec::new();
        let mut keys_taken: Vec<&str> = Vec::new();
        let mut stale = Vec::new();
        'bands: for (&priority, keys) in keyed.bands.iter().rev() {
            if taken.len() >= limit {
                break;
            }
            // The keys in turn order: those after the turn, then from the first to it.
            let after = served.and_then(|turns| turns.get(&priority));
            let mut ring: KeyRing<'_> =
                match after {
                    Some(after) => Box::new(
                        keys.range::<str, _>((Bound::Excluded(after.as_str()), Bound::Unbounded))
                            .chain(keys.range::<str, _>((
                                Bound::Unbounded,
                                Bound::Included(after.as_str()),
                            ))),
                    ),
                    None => Box::new(keys.iter()),
                };
            // Keys that had a turn this claim and may have another, with their jobs left.
            let mut again = std::collections::VecDeque::new();
            loop {
                let (key, mut left) = match ring.next() {
                    Some((key, jobs)) => (key.as_str(), jobs.iter()),
                    None => {
                        // Round after round over the keys that still have jobs.
                        match again.pop_front() {
                            Some(next_round) => next_round,
                            None => break,
                        }
                    }
                };
                if taken.len() >= limit {
                    break 'bands;
                }
                let next = left.by_ref().find(|(_, id)| {
                    let live = jobs.contains_key(id);
                    if !live {
                        stale.push(*id);
                    }
                    live
                });
                let Some(&(order, id)) = next else {
                    continue;
                };
                if let Some(admission) = admission.as_mut() {
                    let job_key = (key != NO_KEY).then_some(key);
                    if !admission.take(job_key) {
                        if admission.queue_full() {
                            break 'bands;
                        }
                        // The key is at a limit: it has no more turns in this claim.
                        continue;
                    }
                }
                taken.push((order, id));
                keys_taken.push(key);
                again.push_back((key, left));
            }
        }
        out.extend(in_turn_places(&taken));
        for ((order, id), key) in taken.iter().zip(keys_taken) {
            turns.push(Turn {
                id: *id,
                queue: queue.to_owned(),
                priority: order.priority,
                key: key.to_owned(),
            });
        }
        self.drop_stale_turns(queue, &stale);
    }

    /// Drops the entries of vanished records a fair claim met (CONTRACT C7).
    fn drop_stale_turns(&mut self, queue: &str, stale: &[JobId]) {
        if stale.is_empty() {
            return;
        }
        let Some(index) = self.idx.queues.get_mut(queue) else {
            return;
        };
        index.ready.retain(|(_, id)| !stale.contains(id));
        if let Some(keyed) = index.keyed.as_mut() {
            for band in keyed.bands.values_mut() {
                for jobs in band.values_mut() {
                    jobs.retain(|(_, id)| !stale.contains(id));
                }
                band.retain(|_, jobs| !jobs.is_empty());
            }
            keyed.bands.retain(|_, band| !band.is_empty());
        }
    }

    /// Moves each fair queue's turn, per priority, to the key of the last job the claim
    /// keeps in turn order (K5): the next claim starts after it.
    pub(super) fn advance_turns(&mut self, turns: &[Turn<JobId>], kept: &[JobId]) {
        if self.faults.turns_restart {
            return;
        }
        for turn in turns_left(turns, kept) {
            let served = match self.turns.get_mut(turn.queue.as_str()) {
                Some(served) => served,
                None => self.turns.entry(turn.queue.clone()).or_default(),
            };
            served.insert(turn.priority, turn.key.clone());
        }
    }
}
