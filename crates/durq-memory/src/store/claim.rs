//! Claim (CONTRACT C1–C10, F1–F6, Q1): ready and fitting candidates, then the leases.

use durq_core::fit::FitOrder;

use super::*;

impl State {
    /// Moves the queue's scheduled jobs that are due into its ready index.
    pub(super) fn promote_due(&mut self, queue: &str, now: Timestamp) {
        let Some(index) = self.idx.queues.get_mut(queue) else {
            return;
        };
        while let Some(&(run_at, seq, id)) = index.scheduled.first() {
            if run_at > now {
                break;
            }
            index.scheduled.pop_first();
            if let Some(record) = self.jobs.get(&id) {
                let entry = (ReadyOrder::new(record.job.priority, run_at, seq), id);
                index.ready.insert(entry);
                if let Some(keyed) = index.keyed.as_mut() {
                    keyed.insert(record.job.concurrency_key.as_deref(), entry);
                }
            }
        }
    }

    pub(crate) fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Vec<ClaimedJob> {
        let mut turns = Vec::new();
        let candidates = if request.is_fitted() {
            self.fitting_candidates(request, now)
        } else {
            self.ready_candidates(request, now, &mut turns)
        };
        if !turns.is_empty() {
            self.advance_turns(&turns, &candidates);
        }
        let claimed = self.lease_all(candidates, request, now);
        self.record_starts(&claimed, now);
        claimed
    }

    /// The first `limit` ready jobs of the named queues in claim order (CONTRACT C3)
    /// that the queues' limits admit (K1, K2, K4): a job whose key is at its limit is
    /// passed over, and a queue at its limit gives none. A queue with fair shares gives
    /// its jobs by turns of key (K5), noted in `turns`.
    pub(super) fn ready_candidates(
        &mut self,
        request: &ClaimRequest,
        now: Timestamp,
        turns: &mut Vec<durq_core::fair::Turn<JobId>>,
    ) -> Vec<JobId> {
        let mut candidates: Vec<(ReadyOrder, JobId)> = Vec::new();
        for queue in &request.queues {
            if self.paused.contains(queue) {
                continue;
            }
            self.promote_due(queue, now);
            if self.is_fair(queue) {
                self.fair_candidates(queue, request.limit, now, &mut candidates, turns);
                continue;
            }
            let mut admission = limits::Admission::of(
                &self.limits,
                &self.idx.running,
                &self.starts,
                &self.faults,
                queue,
                now,
                request.limit,
            );
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
                let Some(record) = self.jobs.get(&entry.1) else {
                    stale.push(*entry);
                    continue;
                };
                if let Some(admission) = admission.as_mut() {
                    if admission.queue_full() {
                        break;
                    }
                    if !admission.take(record.job.concurrency_key.as_deref()) {
                        continue;
                    }
                }
                candidates.push(*entry);
                taken += 1;
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
    pub(super) fn fitting_candidates(
        &mut self,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Vec<JobId> {
        let mut candidates = Vec::new();
        for queue in &request.queues {
            if self.paused.contains(queue) {
                continue;
            }
            self.promote_due(queue, now);
            let mut admission = limits::Admission::of(
                &self.limits,
                &self.idx.running,
                &self.starts,
                &self.faults,
                queue,
                now,
                request.limit,
            )
            .filter(|_| !self.faults.fitted_ignore_limits);
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
            // A preferring claim on a queue with limits admits a band's jobs in its own
            // order (F5: the preferred ones first), not in ready order (K1, K2): the
            // band's fitting jobs wait here, each with its key, until the band ends.
            let in_fit_order = !request.prefer.is_empty()
                && admission.is_some()
                && !self.faults.limits_before_preference;
            let mut band: Vec<(FitOrder, JobId, Option<&str>)> = Vec::new();
            let mut band_priority = None;
            for &(order, id) in index.ready.iter() {
                if last_band.is_some_and(|band| band != order.priority) {
                    break;
                }
                if in_fit_order && band_priority.is_some_and(|band| band != order.priority) {
                    admit_in_fit_order(
                        &mut band,
                        &mut admission,
                        &mut candidates,
                        &mut fitting,
                        request.limit,
                    );
                    if fitting >= request.limit {
                        break;
                    }
                }
                let Some(record) = self.jobs.get(&id) else {
                    stale.push((order, id));
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
                let fit_order = request.fit_order(order, job.locality.as_deref());
                let key = job.concurrency_key.as_deref();
                if in_fit_order {
                    band.push((fit_order, id, key));
                    band_priority = Some(order.priority);
                    continue;
                }
                // The queue's limits (K1, K2) after the budget: a job that does not fit
                // takes no slot of its key.
                if let Some(admission) = admission.as_mut() {
                    if admission.queue_full() {
                        break;
                    }
                    if !admission.take(key) {
                        continue;
                    }
                }
                candidates.push((fit_order, id));
                fitting += 1;
                if fitting >= request.limit {
                    if request.prefer.is_empty() {
                        break;
                    }
                    last_band = Some(order.priority);
                }
            }
            if fitting < request.limit {
                admit_in_fit_order(
                    &mut band,
                    &mut admission,
                    &mut candidates,
                    &mut fitting,
                    request.limit,
                );
            }
            for entry in stale {
                index.ready.remove(&entry);
            }
        }
        candidates.sort_unstable();
        candidates.truncate(request.limit);
        candidates.into_iter().map(|(_, id)| id).collect()
    }

    pub(super) fn lease_all(
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
}

/// Admits a band's fitting jobs of a preferring claim in the claim's own order (F5:
/// preferred jobs first, each kind in ready order) under the queue's limits (K1, K2,
/// K4), until the claim has `limit` jobs of the queue; empties `band`.
fn admit_in_fit_order<'a>(
    band: &mut Vec<(FitOrder, JobId, Option<&'a str>)>,
    admission: &mut Option<limits::Admission<'a>>,
    candidates: &mut Vec<(FitOrder, JobId)>,
    fitting: &mut usize,
    limit: usize,
) {
    band.sort_by_key(|(fit_order, _, _)| *fit_order);
    for (fit_order, id, key) in band.drain(..) {
        let Some(admission) = admission.as_mut() else {
            return;
        };
        if *fitting >= limit || admission.queue_full() {
            return;
        }
        if admission.take(key) {
            candidates.push((fit_order, id));
            *fitting += 1;
        }
    }
}
