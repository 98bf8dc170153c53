//! The invariants of M1, checked on the whole store after every step, whatever the
//! step was: the store must still look exactly like the model.
//!
//! The step itself compared only the answer of its call; a wrong write the answer does
//! not show (another job changed, an index left behind, a count off by one) is caught
//! here, at the step that made it.

use std::collections::HashMap;

use durq_core::{JobState, ListQuery};

use super::{Run, QUEUES};

/// A page large enough to hold every job a case creates, so one call lists a queue.
const WHOLE_QUEUE: usize = 1_000;

impl Run {
    /// Checks every invariant; `to_get` are the jobs also read back one by one.
    ///
    /// Stops at the first that does not hold, and says which and how.
    pub(super) async fn check_invariants(&self, to_get: &[usize]) -> Result<(), String> {
        self.check_found_by_get(to_get).await?;
        for (q, name) in QUEUES.iter().enumerate() {
            self.check_listing(q, name).await?;
            self.check_states_partition(q, name).await?;
            self.check_stats(q, name).await?;
        }
        Ok(())
    }

    /// Every job is found by get, as the model has it, until purge removes it.
    async fn check_found_by_get(&self, to_get: &[usize]) -> Result<(), String> {
        for &idx in to_get {
            let want = &self.model.jobs[idx];
            let got = self.store.get(self.ids[idx]).await;
            match got {
                Ok(job) if want.present => self.model.check_job(idx, &job, &self.ids, &QUEUES)?,
                Err(err) if want.present => {
                    return Err(format!("get #{idx} failed: {err}"));
                }
                Err(err) if err.is_not_found() => {}
                other => return Err(format!("#{idx} was purged, yet get answered {other:?}")),
            }
        }
        Ok(())
    }

    /// The queue, listed whole, holds exactly the model's jobs, newest first, each
    /// equal to the model's field by field.
    async fn check_listing(&self, q: usize, name: &str) -> Result<(), String> {
        let all = self
            .store
            .list(ListQuery::new(name).limit(WHOLE_QUEUE))
            .await
            .map_err(|err| format!("list {name} failed: {err}"))?;
        let mut listed = Vec::with_capacity(all.jobs.len());
        for job in &all.jobs {
            let idx = self.model_id(job.id, "list")?;
            self.model
                .check_job(idx, job, &self.ids, &QUEUES)
                .map_err(|diff| format!("as listed: {diff}"))?;
            listed.push(idx);
        }
        let want = self.model.list(q, None);
        if listed != want || all.next.is_some() {
            return Err(format!(
                "list {name}: the store lists {listed:?} (next {:?}), the model {want:?}",
                all.next
            ));
        }
        Ok(())
    }

    /// Each job is in exactly one state: the per-state listings partition the queue,
    /// each as the model has it.
    async fn check_states_partition(&self, q: usize, name: &str) -> Result<(), String> {
        let mut seen: HashMap<usize, JobState> = HashMap::new();
        for state in JobState::ALL {
            let page = self
                .store
                .list(ListQuery::new(name).state(state).limit(WHOLE_QUEUE))
                .await
                .map_err(|err| format!("list {name} {state} failed: {err}"))?;
            let mut listed = Vec::with_capacity(page.jobs.len());
            for job in &page.jobs {
                let idx = self.model_id(job.id, "list")?;
                if let Some(other) = seen.insert(idx, state) {
                    return Err(format!("#{idx} is listed both as {other} and as {state}"));
                }
                if job.state != state {
                    return Err(format!(
                        "list of {state} jobs shows #{idx} as {}",
                        job.state
                    ));
                }
                listed.push(idx);
            }
            let want = self.model.list(q, Some(state));
            if listed != want {
                return Err(format!(
                    "list {name} {state}: the store lists {listed:?}, the model {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// The counts agree with the model's. This is also where "no running job is
    /// claimable" is checked: the ready count holds only queued jobs.
    async fn check_stats(&self, q: usize, name: &str) -> Result<(), String> {
        let stats = self
            .store
            .stats(name)
            .await
            .map_err(|err| format!("stats {name} failed: {err}"))?;
        let want = self.model.stats(q);
        if stats != want {
            return Err(format!(
                "stats {name}: the store counts {stats:?}, the model {want:?}"
            ));
        }
        Ok(())
    }
}
