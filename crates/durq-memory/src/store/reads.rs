//! Reads: get, payload, children, attempts, stats, queues and list.

use super::*;

impl State {
    pub(crate) fn job(&self, id: JobId) -> Result<&Job> {
        self.jobs
            .get(&id)
            .map(|record| &record.job)
            .ok_or(Error::NotFound { id })
    }

    pub(crate) fn payload(&self, id: JobId) -> Result<Bytes> {
        self.jobs
            .get(&id)
            .map(|record| record.payload.clone())
            .ok_or(Error::NotFound { id })
    }

    pub(crate) fn children(&self, parent: JobId) -> Vec<Job> {
        self.children
            .get(&parent)
            .into_iter()
            .flatten()
            .filter_map(|id| self.jobs.get(id).map(|record| record.job.clone()))
            .collect()
    }

    /// CONTRACT H1–H3: the job's attempts, oldest first.
    pub(crate) fn attempt_history(&self, id: JobId) -> Result<Vec<Attempt>> {
        let record = self.jobs.get(&id).ok_or(Error::NotFound { id })?;
        let job = &record.job;
        Ok(attempts::history(
            record.ended.clone(),
            LastClaim {
                state: job.state,
                worker: job
                    .lease
                    .as_ref()
                    .map(|lease| lease.worker.clone())
                    .or_else(|| record.last_worker.clone()),
                token: LeaseToken::new(record.last_token),
                started_at: job.started_at,
                finished_at: job.finished_at,
            },
        ))
    }

    pub(crate) fn stats(&mut self, queue: &str, now: Timestamp) -> QueueStats {
        let mut stats = QueueStats::default();
        let Some(index) = self.idx.queues.get(queue) else {
            return stats;
        };
        for job in index
            .all
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .map(|r| &r.job)
        {
            match job.state {
                JobState::Waiting => stats.waiting += 1,
                JobState::Queued if job.run_at <= now => stats.ready += 1,
                JobState::Queued => stats.scheduled += 1,
                JobState::Running => stats.running += 1,
                JobState::Succeeded => stats.succeeded += 1,
                JobState::Dead => stats.dead += 1,
                JobState::Cancelled => stats.cancelled += 1,
            }
        }
        stats
    }

    /// CONTRACT A7: every queue holding a job, by name, with its counts and the ready
    /// time of its oldest ready job.
    pub(crate) fn queues(&mut self, now: Timestamp) -> Vec<QueueOverview> {
        let mut names: Vec<String> = self.idx.queues.keys().cloned().collect();
        names.sort_unstable();
        let mut overviews = Vec::with_capacity(names.len());
        for name in names {
            let stats = self.stats(&name, now);
            if stats.total() == 0 {
                continue;
            }
            let oldest_ready = self.idx.queues.get(&name).and_then(|index| {
                index
                    .all
                    .iter()
                    .filter_map(|id| self.jobs.get(id))
                    .map(|r| &r.job)
                    .filter(|job| job.state == JobState::Queued && job.run_at <= now)
                    .map(|job| job.run_at)
                    .min()
            });
            overviews.push(QueueOverview::new(name, stats, oldest_ready));
        }
        overviews
    }

    /// CONTRACT A4: each matching queue's newest matching jobs after the cursor,
    /// merged newest first; a queue can give no more than a page, so the merge is exact.
    pub(crate) fn list(&self, query: &ListQuery) -> ListPage {
        let mut jobs: Vec<Job> = Vec::new();
        for (_, index) in self
            .idx
            .queues
            .iter()
            .filter(|(name, _)| query.matches_queue(name))
        {
            let newest_first = match query.cursor {
                Some(cursor) => index.all.range(..cursor).rev(),
                None => index.all.range(..).rev(),
            };
            jobs.extend(
                newest_first
                    .filter_map(|id| self.jobs.get(id))
                    .map(|record| &record.job)
                    .filter(|job| query.matches(job))
                    .take(query.limit)
                    .cloned(),
            );
        }
        jobs.sort_unstable_by_key(|job| std::cmp::Reverse(job.id));
        jobs.truncate(query.limit);
        let next = if jobs.len() == query.limit {
            jobs.last().map(|job| job.id)
        } else {
            None
        };
        ListPage { jobs, next }
    }
}
