//! Jobs that wait for jobs (CONTRACT G1–G5): the edges from each job to the jobs
//! waiting for it, and what happens to those when it ends. The decisions are
//! `durq_core::graph`'s; this keeps the edges.

use durq_core::graph::{self, Settled, Start};

use super::*;

impl State {
    /// Rules G1, G3: makes a new job wait for `dependencies` (`earlier` resolves the
    /// batch's indexes), or queues or cancels it at once when they already decide it.
    /// Every dependency a batch names by id was checked to exist
    /// ([`State::check_dependencies`]); one that vanished since is not waited for.
    pub(super) fn wait_for(
        &mut self,
        record: &mut Record,
        dependencies: &[Dependency],
        earlier: &[JobId],
        now: Timestamp,
    ) {
        let ids = graph::resolve(dependencies, earlier);
        let states: Vec<(JobId, JobState)> = ids
            .iter()
            .filter_map(|id| self.jobs.get(id).map(|found| (*id, found.job.state)))
            .collect();
        let job = &mut record.job;
        match graph::at_enqueue(states.iter().copied(), job.on_dependency_failure) {
            Start::Queued => {}
            Start::Waiting(count) => {
                job.state = JobState::Waiting;
                record.waiting_for = count;
                for (dependency, state) in &states {
                    if !state.is_terminal() {
                        self.dependents.entry(*dependency).or_default().push(job.id);
                    }
                }
            }
            Start::Cancelled(error) => {
                Self::finish(job, JobState::Cancelled, now);
                job.last_error = Some(error);
            }
        }
        job.depends_on = ids;
    }

    /// Rules G1, G3: `id` ended in `state`; settles every job waiting for it, and every
    /// job waiting for one this cancels, in turn (a worklist, so a long chain costs no
    /// stack).
    pub(super) fn settle_dependents(&mut self, id: JobId, state: JobState, now: Timestamp) {
        let mut ended = vec![(id, state)];
        while let Some((dependency, state)) = ended.pop() {
            let Some(waiting) = self.dependents.remove(&dependency) else {
                continue;
            };
            for dependent in waiting {
                let Some(record) = self.jobs.get(&dependent) else {
                    continue;
                };
                // An operator may have cancelled it already: it waits for nothing then.
                if record.job.state != JobState::Waiting {
                    continue;
                }
                let policy = record.job.on_dependency_failure;
                let settled = match graph::settle(state, policy) {
                    Some(Settled::Cancel) if self.faults.ignore_dependency_failures => {
                        Some(Settled::Met)
                    }
                    settled => settled,
                };
                match settled {
                    Some(Settled::Met) => {
                        if self.faults.release_on_first_dependency {
                            self.release_waiting(dependent, now);
                            continue;
                        }
                        let released = self.transition_unsettled(dependent, now, |record| {
                            record.waiting_for = record.waiting_for.saturating_sub(1);
                            record.waiting_for == 0
                        });
                        if released.is_some_and(|(released, _)| released) {
                            self.release_waiting(dependent, now);
                        }
                    }
                    Some(Settled::Cancel) => {
                        self.transition_unsettled(dependent, now, |record| {
                            Self::finish(&mut record.job, JobState::Cancelled, now);
                            record.job.last_error =
                                Some(graph::failed_dependency(dependency, state));
                        });
                        ended.push((dependent, JobState::Cancelled));
                    }
                    None => {}
                }
            }
        }
    }

    /// A waiting job whose every dependency is met becomes `queued`, ready now (or at
    /// its own `run_at`, if later), behind the jobs already ready (G1).
    fn release_waiting(&mut self, id: JobId, now: Timestamp) {
        self.transition_unsettled(id, now, |record| {
            record.waiting_for = 0;
            record.job.state = JobState::Queued;
            record.job.run_at = record.job.run_at.max(now);
        });
        self.idx.freed_slot = true;
    }
}
