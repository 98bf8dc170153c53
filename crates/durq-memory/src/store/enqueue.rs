//! Enqueue (CONTRACT E1–E12).

use super::*;

impl State {
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

    /// Rule G1: every stored job a new job names in `depends_on` exists. A batch's
    /// earlier jobs exist by the time a later one is stored.
    pub(crate) fn check_dependencies<'a>(
        &self,
        jobs: impl IntoIterator<Item = &'a Prepared>,
    ) -> Result<()> {
        for prepared in jobs {
            for dependency in &prepared.dependencies {
                if let Dependency::Job(id) = dependency {
                    if !self.jobs.contains_key(id) {
                        return Err(Error::invalid(
                            "depends_on",
                            format!("job {id} does not exist"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The stored form of `new`, made before the namespace is locked: what can be done
    /// outside the lock is, so that concurrent producers wait on each other less.
    pub(crate) fn prepare(mut new: NewJob, now: Timestamp) -> Prepared {
        let uniqueness = new.uniqueness;
        let dependencies = std::mem::take(&mut new.depends_on);
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
                waiting_for: 0,
                records_events: false,
            }),
            uniqueness,
            dependencies,
        }
    }

    /// Rules E1–E7: stores a prepared job, or answers the existing job of a live
    /// idempotency key (the prepared one, and its id, then go unused). `earlier` are
    /// the ids answered for the batch's jobs before this one (G2).
    pub(crate) fn enqueue(
        &mut self,
        prepared: Prepared,
        now: Timestamp,
        settings: &StoreSettings,
        earlier: &[JobId],
    ) -> Enqueued {
        let Prepared {
            mut record,
            uniqueness,
            dependencies,
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
                    (Some(record), Uniqueness::WhileActive) => {
                        record.job.state.is_active()
                            && !(self.faults.waiting_frees_unique_keys
                                && record.job.state == JobState::Waiting)
                    }
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
        if !dependencies.is_empty() {
            self.wait_for(&mut record, &dependencies, earlier, now);
        }
        let job = &record.job;
        self.idx
            .with_queue(&job.queue, |queue| queue.all.insert(id));
        record.seq = self.draw_seq();
        self.idx.add(&record, id, now);
        let records_events = settings.records_events();
        record.records_events = records_events;
        self.jobs.insert(id, record);
        if records_events {
            self.record_enqueue(id, now);
        }
        if let Some(key) = dedup_key {
            self.dedup.insert(key, (id, now));
        }
        Enqueued { id, created: true }
    }
}
