//! Bugs in reads, operator actions, attempts, workers, schedules and fitted claims.

use super::*;

/// A3: `stats` matches the queue by prefix (`LIKE 'q%'`, a key scan on `q*`), so a
/// queue's counts include every queue whose name starts with its name.
#[derive(Debug, Default)]
pub(crate) struct StatsByPrefix {
    queues: Mutex<HashMap<String, BTreeSet<String>>>,
}

#[async_trait]
impl Bug for StatsByPrefix {
    async fn enqueue(&self, inner: &dyn Backend, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        lock(&self.queues)
            .entry(inner.settings().namespace.clone())
            .or_default()
            .insert(job.queue.clone());
        inner.enqueue(job, now).await
    }

    async fn stats(&self, inner: &dyn Backend, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let queues: Vec<String> = lock(&self.queues)
            .get(&inner.settings().namespace)
            .map(|queues| {
                queues
                    .iter()
                    .filter(|q| q.starts_with(queue))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut total = inner.require_inspect()?.stats(queue, now).await?;
        for other in queues.iter().filter(|q| q.as_str() != queue) {
            let more = inner.require_inspect()?.stats(other, now).await?;
            total.ready += more.ready;
            total.scheduled += more.scheduled;
            total.running += more.running;
            total.succeeded += more.succeeded;
            total.dead += more.dead;
            total.cancelled += more.cancelled;
        }
        Ok(total)
    }
}

/// Q1 broken: a pause is acknowledged but never stored.
#[derive(Debug)]
pub(crate) struct PauseForgotten;

#[async_trait]
impl Bug for PauseForgotten {
    async fn set_paused(&self, inner: &dyn Backend, queue: &str, paused: bool) -> Result<()> {
        if paused {
            return Ok(());
        }
        inner.require_pause()?.set_paused(queue, paused).await
    }
}

/// A7 broken: the lag is read from the job a claim would take next (the head of the
/// highest priority), not from the oldest ready job, as a backend that looked only at
/// its ready index's head would.
#[derive(Debug)]
pub(crate) struct LagFromTheHead;

#[async_trait]
impl Bug for LagFromTheHead {
    async fn queues(&self, inner: &dyn Backend, now: Timestamp) -> Result<Vec<QueueOverview>> {
        let mut queues = inner.require_inspect()?.queues(now).await?;
        for overview in &mut queues {
            if overview.oldest_ready.is_some() {
                let head = inner
                    .require_inspect()?
                    .list(ListQuery::new(overview.queue.clone()).state(JobState::Queued))
                    .await?
                    .jobs
                    .into_iter()
                    .filter(|job| job.run_at <= now)
                    .max_by_key(|job| (job.priority, std::cmp::Reverse(job.run_at)))
                    .map(|job| job.run_at);
                overview.oldest_ready = head;
            }
        }
        Ok(queues)
    }
}

/// A4 broken: the queue prefix is matched as an SQL `LIKE` pattern, so `_` matches any
/// byte, as a backend that pasted the prefix into `LIKE 'prefix%'` would.
#[derive(Debug)]
pub(crate) struct PrefixAsPattern;

#[async_trait]
impl Bug for PrefixAsPattern {
    async fn list(&self, inner: &dyn Backend, mut query: ListQuery) -> Result<ListPage> {
        let Some(prefix) = query.queue_prefix.take() else {
            return inner.require_inspect()?.list(query).await;
        };
        let like = |queue: &str| {
            queue.len() >= prefix.len()
                && prefix
                    .bytes()
                    .zip(queue.bytes())
                    .all(|(p, q)| p == b'_' || p == q)
        };
        let mut page = inner.require_inspect()?.list(query).await?;
        page.jobs.retain(|job| like(&job.queue));
        Ok(page)
    }
}

/// A4 broken: tag filters are dropped, as a backend that forgot to read them would.
#[derive(Debug)]
pub(crate) struct TagsIgnored;

#[async_trait]
impl Bug for TagsIgnored {
    async fn list(&self, inner: &dyn Backend, mut query: ListQuery) -> Result<ListPage> {
        query.tags.clear();
        inner.require_inspect()?.list(query).await
    }
}

/// A4 broken: the default tenant given (the empty tenant) lists every tenant's jobs,
/// as the filter read before "none given" and "the empty tenant" were told apart.
#[derive(Debug)]
pub(crate) struct DefaultTenantListsAll;

#[async_trait]
impl Bug for DefaultTenantListsAll {
    async fn list(&self, inner: &dyn Backend, mut query: ListQuery) -> Result<ListPage> {
        if query.tenant.as_deref() == Some("") {
            query.tenant = None;
        }
        inner.require_inspect()?.list(query).await
    }
}

/// H2 broken: a release (or snooze) leaves no attempt record, as a backend that wrote
/// records only from `fail` and `reclaim` would.
#[derive(Debug)]
pub(crate) struct ReleaseLeavesNoAttempt;

#[async_trait]
impl Bug for ReleaseLeavesNoAttempt {
    async fn attempts(&self, inner: &dyn Backend, id: JobId) -> Result<Vec<Attempt>> {
        let mut attempts = inner.require_inspect()?.attempts(id).await?;
        attempts.retain(|a| a.outcome != AttemptOutcome::Released);
        Ok(attempts)
    }
}

/// H3 broken: the oldest attempts are kept and the newest dropped, as a backend that
/// stopped writing once its slots were full would.
/// L4, A2: the job keeps showing the last error it was failed with, after a success
/// or an operator's retry (the stale field issue #31 found).
#[derive(Debug, Default)]
pub(crate) struct StaleLastError {
    errors: Mutex<HashMap<JobId, String>>,
}

#[async_trait]
impl Bug for StaleLastError {
    async fn fail(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let state = inner.fail(lease.id, lease.token, error, retry, now).await?;
        lock(&self.errors).insert(lease.id, error.to_owned());
        Ok(state)
    }

    async fn get(&self, inner: &dyn Backend, id: JobId) -> Result<durq_core::Job> {
        let mut job = inner.get(id).await?;
        if job.last_error.is_none() {
            job.last_error = lock(&self.errors).get(&id).cloned();
        }
        Ok(job)
    }
}

/// H2: an attempt's error is kept whole, as `last_error` is.
#[derive(Debug, Default)]
pub(crate) struct AttemptErrorUncut {
    errors: Mutex<HashMap<JobId, String>>,
}

#[async_trait]
impl Bug for AttemptErrorUncut {
    async fn fail(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        lock(&self.errors).insert(lease.id, error.to_owned());
        inner.fail(lease.id, lease.token, error, retry, now).await
    }

    async fn attempts(&self, inner: &dyn Backend, id: JobId) -> Result<Vec<Attempt>> {
        let mut attempts = inner.require_inspect()?.attempts(id).await?;
        if let Some(error) = lock(&self.errors).get(&id) {
            for attempt in attempts.iter_mut().filter(|a| a.error.is_some()) {
                attempt.error = Some(error.clone());
            }
        }
        Ok(attempts)
    }
}

#[derive(Debug)]
pub(crate) struct OldestAttemptsKept;

#[async_trait]
impl Bug for OldestAttemptsKept {
    async fn attempts(&self, inner: &dyn Backend, id: JobId) -> Result<Vec<Attempt>> {
        let mut attempts = inner.require_inspect()?.attempts(id).await?;
        if attempts.len() as u64 == durq_core::ATTEMPTS_KEPT {
            // What slots that stop at the first 32 claims would hold: claims 1..=32.
            for (claim, attempt) in (1..).zip(attempts.iter_mut()) {
                attempt.token = LeaseToken::new(claim);
            }
        }
        Ok(attempts)
    }
}

/// W4 broken: a worker last seen exactly at the cut-off is reaped too (`<=` for `<`).
#[derive(Debug)]
pub(crate) struct ReapAtTheCutoff;

#[async_trait]
impl Bug for ReapAtTheCutoff {
    async fn reap_workers(&self, inner: &dyn Backend, cutoff: Timestamp) -> Result<Vec<String>> {
        inner
            .require_worker_registry()?
            .reap_workers(cutoff.saturating_add(std::time::Duration::from_millis(1)))
            .await
    }
}

/// S2 broken: recording a firing writes the whole record back as the firing read it,
/// enabled, so a disable that landed in between is undone.
#[derive(Debug)]
pub(crate) struct FiringReenables;

#[async_trait]
impl Bug for FiringReenables {
    async fn update_schedule(
        &self,
        inner: &dyn Backend,
        name: &str,
        update: ScheduleUpdate,
    ) -> Result<()> {
        let update = match update.last_tick {
            Some(_) => ScheduleUpdate {
                enabled: Some(true),
                ..update
            },
            None => update,
        };
        inner
            .require_schedules()?
            .update_schedule(name, update)
            .await
    }
}

/// S3 broken: each scheduler derives its own tick key (say, with its host name in it),
/// so schedulers on different handles enqueue one tick each.
#[derive(Debug)]
pub(crate) struct TickKeyPerScheduler;

#[async_trait]
impl Bug for TickKeyPerScheduler {
    fn stamp(&self, handle: usize, mut job: NewJob, _now: Timestamp) -> NewJob {
        if let Some(key) = &job.idempotency_key {
            if key.starts_with("jobs.cron/") {
                job.idempotency_key = Some(format!("{key}/scheduler-{handle}"));
            }
        }
        job
    }
}

/// L10 broken: a snooze is stored as a plain release, ready at once.
#[derive(Debug)]
pub(crate) struct SnoozeReadyNow;

#[async_trait]
impl Bug for SnoozeReadyNow {
    async fn release(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        _ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        inner.release(lease.id, lease.token, now, now).await
    }
}

/// E10 broken: a key unique while active is read by the window rule.
#[derive(Debug)]
pub(crate) struct UniqueByWindow;

#[async_trait]
impl Bug for UniqueByWindow {
    fn stamp(&self, _handle: usize, mut job: NewJob, _now: Timestamp) -> NewJob {
        job.uniqueness = Uniqueness::Window;
        job
    }
}

/// F2–F4 broken: the budget never reaches the store.
#[derive(Debug)]
pub(crate) struct BudgetIgnored;

#[async_trait]
impl Bug for BudgetIgnored {
    async fn claim(
        &self,
        inner: &dyn Backend,
        mut request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        request.budget = None;
        inner.claim(request, now).await
    }
}

/// Claims with `request`, then gives back (releases) every job `keep` refuses: the
/// claim-then-filter shape of the F4 and F5 mutants.
async fn claim_then_release(
    inner: &dyn Backend,
    request: ClaimRequest,
    now: Timestamp,
    keep: impl Fn(&ClaimedJob) -> bool + Send,
) -> Result<Vec<ClaimedJob>> {
    let mut kept = Vec::new();
    for job in inner.claim(request, now).await? {
        if keep(&job) {
            kept.push(job);
        } else {
            inner.release(job.id(), job.token(), now, now).await?;
        }
    }
    Ok(kept)
}

/// F4 broken: claims without the budget, then gives back what does not fit. The jobs
/// it gives back were written (claimed, released), and they used up the limit.
#[derive(Debug)]
pub(crate) struct ClaimThenFilter;

#[async_trait]
impl Bug for ClaimThenFilter {
    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let mut unfiltered = request.clone();
        unfiltered.budget = None;
        claim_then_release(inner, unfiltered, now, |job| request.admits(&job.job.needs)).await
    }
}

/// F5 broken: preferred localities are ignored, so order is the plain claim order.
#[derive(Debug)]
pub(crate) struct PreferenceIgnored;

#[async_trait]
impl Bug for PreferenceIgnored {
    async fn claim(
        &self,
        inner: &dyn Backend,
        mut request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        request.prefer.clear();
        inner.claim(request, now).await
    }
}

/// F5 broken: a preference filters, taking only jobs at the preferred localities.
#[derive(Debug)]
pub(crate) struct PreferenceFilters;

#[async_trait]
impl Bug for PreferenceFilters {
    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let prefer = request.prefer.clone();
        claim_then_release(inner, request, now, |job| {
            prefer.is_empty()
                || job
                    .job
                    .locality
                    .as_ref()
                    .is_some_and(|l| prefer.contains(l))
        })
        .await
    }
}

/// F6 broken: a reservation is read as an ordinary claim of one job.
#[derive(Debug)]
pub(crate) struct ReservationIgnored;

#[async_trait]
impl Bug for ReservationIgnored {
    async fn claim(
        &self,
        inner: &dyn Backend,
        mut request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        request.reserved = None;
        inner.claim(request, now).await
    }
}
