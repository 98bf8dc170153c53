//! The suite has teeth: each test wraps the in-memory store in a deliberately broken
//! layer (a *mutant*, one bug each), runs the scenario of the rule the bug breaks, and
//! asserts that the scenario fails on the mutant and passes on the real store.
//!
//! Every mutant is one [`Mutant`]: a [`LayeredBackend`] whose operations go through a
//! [`Bug`]'s hooks. A hook forwards to the real backend unless the bug overrides it,
//! so each bug is written as the one operation it breaks, the way the real bug would
//! sit in a backend.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use durq_conformance::{Harness, Scenario, SCENARIOS};
use durq_core::{
    async_trait, Attempt, AttemptOutcome, Backend, Bytes, ClaimRequest, ClaimedJob, Completion,
    Enqueued, Error, Heartbeat, HeldLease, JobId, JobState, LayeredBackend, LeaseToken, ListPage,
    ListQuery, NewJob, QueueOverview, QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate,
    Store, StoreSettings, Timestamp, Uniqueness, LEASE_EXPIRED,
};
use durq_memory::MemoryServer;

// ---------------------------------------------------------------------------------
// The forwarding layer.

/// One deliberate bug. Each hook receives the real backend and, by default, forwards
/// to it; a bug overrides the hook of the operation it breaks.
#[async_trait]
trait Bug: Send + Sync + fmt::Debug + 'static {
    /// The job as the `handle`-th store of its namespace hands it to the backend.
    fn stamp(&self, _handle: usize, job: NewJob, _now: Timestamp) -> NewJob {
        job
    }

    /// Makes a record unreadable, as the harness's `corrupt` asks.
    fn corrupt(&self, server: &MemoryServer, namespace: &str, id: JobId) -> bool {
        server.corrupt(namespace, id)
    }

    async fn enqueue(&self, inner: &dyn Backend, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        inner.enqueue(job, now).await
    }

    async fn enqueue_batch(
        &self,
        inner: &dyn Backend,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        inner.enqueue_batch(jobs, now).await
    }

    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        inner.claim(request, now).await
    }

    async fn heartbeat(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        inner.heartbeat(lease.id, lease.token, ttl, now).await
    }

    async fn complete(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        inner.complete(lease.id, lease.token, result, now).await
    }

    async fn fail(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        inner.fail(lease.id, lease.token, error, retry, now).await
    }

    async fn release(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        inner.release(lease.id, lease.token, ready_at, now).await
    }

    async fn reclaim(
        &self,
        inner: &dyn Backend,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ReclaimedJob>> {
        inner.reclaim(limit, now).await
    }

    async fn stats(&self, inner: &dyn Backend, queue: &str, now: Timestamp) -> Result<QueueStats> {
        inner.require_inspect()?.stats(queue, now).await
    }

    async fn set_paused(&self, inner: &dyn Backend, queue: &str, paused: bool) -> Result<()> {
        inner.require_pause()?.set_paused(queue, paused).await
    }

    async fn queues(&self, inner: &dyn Backend, now: Timestamp) -> Result<Vec<QueueOverview>> {
        inner.require_inspect()?.queues(now).await
    }

    async fn reap_workers(&self, inner: &dyn Backend, cutoff: Timestamp) -> Result<Vec<String>> {
        inner.require_worker_registry()?.reap_workers(cutoff).await
    }

    async fn list(&self, inner: &dyn Backend, query: ListQuery) -> Result<ListPage> {
        inner.require_inspect()?.list(query).await
    }

    async fn attempts(&self, inner: &dyn Backend, id: JobId) -> Result<Vec<Attempt>> {
        inner.require_inspect()?.attempts(id).await
    }

    async fn get(&self, inner: &dyn Backend, id: JobId) -> Result<durq_core::Job> {
        inner.get(id).await
    }

    async fn update_schedule(
        &self,
        inner: &dyn Backend,
        name: &str,
        update: ScheduleUpdate,
    ) -> Result<()> {
        inner
            .require_schedules()?
            .update_schedule(name, update)
            .await
    }
}

/// The real backend behind one bug, opened as the `handle`-th store of its namespace
/// (0 for the first), for bugs that live in one handle's state.
#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Backend>,
    bug: Arc<dyn Bug>,
    handle: usize,
}

#[async_trait]
impl LayeredBackend for Mutant {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let job = self.bug.stamp(self.handle, job, now);
        self.bug.enqueue(&*self.inner, job, now).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let jobs = jobs
            .into_iter()
            .map(|job| self.bug.stamp(self.handle, job, now))
            .collect();
        self.bug.enqueue_batch(&*self.inner, jobs, now).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.bug.claim(&*self.inner, request, now).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        // Each entry through the bug's `heartbeat` hook: single heartbeats arrive here as
        // batches of one, so a broken heartbeat is broken in both.
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            answers.push(self.bug.heartbeat(&*self.inner, lease, ttl, now).await);
        }
        Ok(answers)
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        // Each entry through the bug's `complete` hook: single completions arrive here as
        // batches of one, so a broken complete is broken in both.
        let mut answers = Vec::with_capacity(completions.len());
        for Completion { id, token, result } in completions {
            let lease = HeldLease::new(id, token);
            answers.push(self.bug.complete(&*self.inner, lease, result, now).await);
        }
        Ok(answers)
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let lease = HeldLease::new(id, token);
        self.bug.fail(&*self.inner, lease, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let lease = HeldLease::new(id, token);
        self.bug.release(&*self.inner, lease, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        self.bug.reclaim(&*self.inner, limit, now).await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        self.bug.stats(&*self.inner, queue, now).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.bug.set_paused(&*self.inner, queue, paused).await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        self.bug.queues(&*self.inner, now).await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        self.bug.reap_workers(&*self.inner, cutoff).await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.bug.list(&*self.inner, query).await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.bug.attempts(&*self.inner, id).await
    }

    async fn get(&self, id: JobId) -> Result<durq_core::Job> {
        self.bug.get(&*self.inner, id).await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        self.bug.update_schedule(&*self.inner, name, update).await
    }
}

/// Opens real in-memory stores, each wrapped in the harness's bug when it has one.
/// One bug instance serves every store the harness opens, as one buggy backend
/// serves every connection.
struct MemoryHarness {
    server: MemoryServer,
    bug: Option<Arc<dyn Bug>>,
    /// How many stores were opened per namespace.
    opened: Mutex<HashMap<String, usize>>,
}

impl MemoryHarness {
    fn real() -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: None,
            opened: Mutex::default(),
        })
    }

    fn mutant(bug: impl Bug) -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: Some(Arc::new(bug)),
            opened: Mutex::default(),
        })
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let handle = {
            let mut opened = lock(&self.opened);
            let count = opened.entry(settings.namespace.clone()).or_default();
            *count += 1;
            *count - 1
        };
        let inner: Arc<dyn Backend> = Arc::new(self.server.open(settings)?);
        Ok(match &self.bug {
            Some(bug) => Store::new(Mutant {
                inner,
                bug: Arc::clone(bug),
                handle,
            }),
            None => Store::from(inner),
        })
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.server.vanish(namespace, id);
        Ok(())
    }

    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        Ok(match &self.bug {
            Some(bug) => bug.corrupt(&self.server, namespace, id),
            None => self.server.corrupt(namespace, id),
        })
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.server.drop_namespace(namespace);
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------
// The bugs.

/// C10: a claim leases its jobs first and decodes them after, so an unreadable record
/// among them fails the whole claim and leaves the jobs it leased held by nobody until
/// their leases expire (PostgreSQL's claim before C10).
#[derive(Debug, Default)]
struct DecodeAfterLease {
    unreadable: Mutex<BTreeSet<JobId>>,
}

#[async_trait]
impl Bug for DecodeAfterLease {
    fn corrupt(&self, _server: &MemoryServer, _namespace: &str, id: JobId) -> bool {
        lock(&self.unreadable).insert(id);
        true
    }

    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let claimed = inner.claim(request, now).await?;
        let unreadable = lock(&self.unreadable);
        match claimed.iter().find(|job| unreadable.contains(&job.id())) {
            Some(job) => Err(Error::corrupt(format!("job {}", job.id()), "unreadable")),
            None => Ok(claimed),
        }
    }
}

/// C2: every other claim also hands out the job the previous claim handed out, still
/// leased to its first holder: the classic "read the head, then lease it" race.
#[derive(Debug, Default)]
struct DoubleClaim {
    calls: AtomicU64,
    /// Per namespace, the last job handed out and not yet served twice.
    last: Mutex<HashMap<String, ClaimedJob>>,
}

#[async_trait]
impl Bug for DoubleClaim {
    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let namespace = &inner.settings().namespace;
        let odd = self.calls.fetch_add(1, Ordering::Relaxed) % 2 == 1;
        // Each job is served twice at most, so a draining claimer still sees an end.
        let stale = if odd && request.limit > 0 {
            lock(&self.last).remove(namespace)
        } else {
            None
        };
        let mut request = request;
        if stale.is_some() {
            request.limit -= 1;
        }
        let mut claimed = inner.claim(request, now).await?;
        if let Some(last) = claimed.last() {
            lock(&self.last).insert(namespace.clone(), last.clone());
        }
        if let Some(stale) = stale {
            claimed.insert(0, stale);
        }
        Ok(claimed)
    }
}

/// C3: among jobs of equal priority and ready time, the newest is claimed first
/// (`ORDER BY seq DESC`). Written as a claim that leases a window of the real order,
/// keeps the jobs the broken order puts first, and releases the rest (in their real
/// order, so only the broken choice shows).
#[derive(Debug, Default)]
struct ReversedFifo;

#[async_trait]
impl Bug for ReversedFifo {
    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let limit = request.limit;
        let window = ClaimRequest {
            limit: limit + 64,
            ..request
        };
        let claimed = inner.claim(window, now).await?;
        let mut broken: Vec<usize> = (0..claimed.len()).collect();
        broken.sort_by(|&a, &b| {
            let (a, b) = (&claimed[a].job, &claimed[b].job);
            b.priority
                .cmp(&a.priority)
                .then(a.run_at.cmp(&b.run_at))
                .then(b.id.cmp(&a.id))
        });
        let keep: BTreeSet<usize> = broken.iter().take(limit).copied().collect();
        for (i, job) in claimed.iter().enumerate() {
            if !keep.contains(&i) {
                inner.release(job.id(), job.token(), now, now).await?;
            }
        }
        Ok(broken
            .into_iter()
            .take(limit)
            .map(|i| claimed[i].clone())
            .collect())
    }
}

/// R1/R2: a lease counts as expired when `expires_at <= now` instead of `< now`.
/// Written as a reclaim that, after the real one, also takes the running jobs whose
/// lease expires exactly now, exactly as reclaim would: back to `queued` (ready now,
/// "lease expired"), or `dead` on the last attempt, or `cancelled` if asked to stop.
#[derive(Debug, Default)]
struct ReclaimAtExpiry {
    /// The queues enqueued to, per namespace: where running jobs are to be found.
    queues: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl ReclaimAtExpiry {
    fn note(&self, inner: &dyn Backend, queue: &str) {
        lock(&self.queues)
            .entry(inner.settings().namespace.clone())
            .or_default()
            .insert(queue.to_owned());
    }
}

#[async_trait]
impl Bug for ReclaimAtExpiry {
    async fn enqueue(&self, inner: &dyn Backend, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        self.note(inner, &job.queue);
        inner.enqueue(job, now).await
    }

    async fn enqueue_batch(
        &self,
        inner: &dyn Backend,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            self.note(inner, &job.queue);
        }
        inner.enqueue_batch(jobs, now).await
    }

    async fn reclaim(
        &self,
        inner: &dyn Backend,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ReclaimedJob>> {
        let mut reclaimed = inner.reclaim(limit, now).await?;
        let queues: Vec<String> = lock(&self.queues)
            .get(&inner.settings().namespace)
            .map(|queues| queues.iter().cloned().collect())
            .unwrap_or_default();
        for queue in queues {
            let mut cursor = None;
            loop {
                let mut query = ListQuery::new(queue.clone())
                    .state(JobState::Running)
                    .limit(1_000);
                query.cursor = cursor;
                let page = inner.require_inspect()?.list(query).await?;
                for job in &page.jobs {
                    let Some(lease) = &job.lease else { continue };
                    if lease.expires_at != now || reclaimed.len() >= limit {
                        continue;
                    }
                    let state = inner
                        .fail(job.id, lease.token, LEASE_EXPIRED, Retry::At(now), now)
                        .await?;
                    reclaimed.push(ReclaimedJob { id: job.id, state });
                }
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        Ok(reclaimed)
    }
}

/// L2/L9: `complete` looks the job up and completes it with whatever token is current,
/// so a holder whose lease was taken over completes the new holder's run.
#[derive(Debug, Default)]
struct CompleteIgnoresToken;

#[async_trait]
impl Bug for CompleteIgnoresToken {
    async fn complete(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        let current = match inner.get(lease.id).await {
            Ok(job) => job.lease.map_or(lease.token, |lease| lease.token),
            Err(_) => lease.token,
        };
        inner.complete(lease.id, current, result, now).await
    }
}

/// Where an idempotency key lives: (namespace, tenant, key).
type KeySlot = (String, String, String);

/// E4: idempotency as check-then-set: look the key up, and if it is not there,
/// enqueue and remember it. Between the check and the set lies a round trip in which
/// concurrent enqueues of the same key all find it missing.
#[derive(Debug, Default)]
struct CheckThenSetDedup {
    /// The job each key points to, and when the key was set.
    keys: Mutex<HashMap<KeySlot, (JobId, Timestamp)>>,
}

#[async_trait]
impl Bug for CheckThenSetDedup {
    async fn enqueue(&self, inner: &dyn Backend, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let Some(key) = job.idempotency_key.clone() else {
            return inner.enqueue(job, now).await;
        };
        let settings = inner.settings();
        let slot = (settings.namespace.clone(), job.tenant.clone(), key);
        let known = lock(&self.keys).get(&slot).copied();
        if let Some((id, set_at)) = known {
            if settings.dedup_active(set_at, now) && inner.get(id).await.is_ok() {
                return Ok(Enqueued { id, created: false });
            }
        }
        // The round trip between the check and the set.
        tokio::task::yield_now().await;
        // The store's own, atomic dedup is bypassed: that is the bug.
        let mut job = job;
        job.idempotency_key = None;
        let enqueued = inner.enqueue(job, now).await?;
        lock(&self.keys).insert(slot, (enqueued.id, now));
        Ok(enqueued)
    }
}

/// L3: a heartbeat on a job whose record is gone answers with a made-up lease
/// instead of "not found", so the worker keeps working on a job nobody tracks.
#[derive(Debug, Default)]
struct HeartbeatFakesVanished;

#[async_trait]
impl Bug for HeartbeatFakesVanished {
    async fn heartbeat(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        match inner.heartbeat(lease.id, lease.token, ttl, now).await {
            Err(err) if err.is_not_found() => Ok(Heartbeat {
                cancel_requested: false,
                expires_at: now.saturating_add(ttl),
            }),
            other => other,
        }
    }
}

/// C3 (#12, behaviour 1): every store handle keeps its own enqueue sequence, so a job
/// enqueued through a second or reopened handle at the same instant and priority sorts
/// ahead of older ready jobs. Written as the order it produces: such a job becomes
/// ready a moment earlier than its real enqueue instant.
#[derive(Debug, Default)]
struct SequencePerHandle;

#[async_trait]
impl Bug for SequencePerHandle {
    fn stamp(&self, handle: usize, job: NewJob, now: Timestamp) -> NewJob {
        if handle == 0 || job.run_at.is_some() {
            return job;
        }
        job.run_at(now.saturating_sub(Duration::from_millis(1)))
    }
}

/// L9 (#12, behaviours 5 and 6): `release` and `fail` read the job, check the lease,
/// and then write without checking it again. A reclaim that lands in between takes
/// the job, and the holder's write lands on top of it: both calls succeed.
///
/// The gap is made certain rather than likely: after its check, the holder's call
/// waits until a reclaim that ran after the check has finished (the race scenario runs
/// one beside every holder call), so the bug shows on every race, not by timing.
#[derive(Debug)]
struct CheckThenWriteLease {
    /// Bumped after each reclaim returns.
    reclaims: tokio::sync::watch::Sender<u64>,
}

impl Default for CheckThenWriteLease {
    fn default() -> Self {
        CheckThenWriteLease {
            reclaims: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl CheckThenWriteLease {
    /// The check, then the gap in which a reclaim takes the job.
    async fn check(&self, inner: &dyn Backend, lease: HeldLease) -> Result<()> {
        let mut reclaimed = self.reclaims.subscribe();
        let job = inner.get(lease.id).await?;
        let current = job.lease.map(|l| l.token);
        if job.state != JobState::Running || current != Some(lease.token) {
            return Err(Error::LeaseLost { id: lease.id });
        }
        // The round trip between the read and the write, in which the reclaim lands.
        if reclaimed.changed().await.is_err() {
            panic!("the mutant's reclaim counter is gone");
        }
        Ok(())
    }
}

#[async_trait]
impl Bug for CheckThenWriteLease {
    async fn fail(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.check(inner, lease).await?;
        match inner.fail(lease.id, lease.token, error, retry, now).await {
            // The unchecked write "succeeds" whatever happened in the gap.
            Err(err) if err.is_lease_lost() => Ok(JobState::Dead),
            other => other,
        }
    }

    async fn release(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.check(inner, lease).await?;
        match inner.release(lease.id, lease.token, ready_at, now).await {
            Err(err) if err.is_lease_lost() => Ok(()),
            other => other,
        }
    }

    async fn reclaim(
        &self,
        inner: &dyn Backend,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ReclaimedJob>> {
        let reclaimed = inner.reclaim(limit, now).await;
        self.reclaims.send_modify(|count| *count += 1);
        reclaimed
    }
}

/// A3: `stats` matches the queue by prefix (`LIKE 'q%'`, a key scan on `q*`), so a
/// queue's counts include every queue whose name starts with its name.
#[derive(Debug, Default)]
struct StatsByPrefix {
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
struct PauseForgotten;

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
struct LagFromTheHead;

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
struct PrefixAsPattern;

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
struct TagsIgnored;

#[async_trait]
impl Bug for TagsIgnored {
    async fn list(&self, inner: &dyn Backend, mut query: ListQuery) -> Result<ListPage> {
        query.tags.clear();
        inner.require_inspect()?.list(query).await
    }
}

/// H2 broken: a release (or snooze) leaves no attempt record, as a backend that wrote
/// records only from `fail` and `reclaim` would.
#[derive(Debug)]
struct ReleaseLeavesNoAttempt;

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
struct StaleLastError {
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
struct AttemptErrorUncut {
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
struct OldestAttemptsKept;

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
struct ReapAtTheCutoff;

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
struct FiringReenables;

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
struct TickKeyPerScheduler;

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
struct SnoozeReadyNow;

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
struct UniqueByWindow;

#[async_trait]
impl Bug for UniqueByWindow {
    fn stamp(&self, _handle: usize, mut job: NewJob, _now: Timestamp) -> NewJob {
        job.uniqueness = Uniqueness::Window;
        job
    }
}

/// F2–F4 broken: the budget never reaches the store.
#[derive(Debug)]
struct BudgetIgnored;

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
struct ClaimThenFilter;

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
struct PreferenceIgnored;

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
struct PreferenceFilters;

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
struct ReservationIgnored;

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

// ---------------------------------------------------------------------------------
// Running scenarios.

fn scenario(name: &str) -> &'static Scenario {
    match SCENARIOS.iter().find(|s| s.name == name) {
        Some(scenario) => scenario,
        None => panic!(
            "no scenario named {name}; the suite has: {:?}",
            SCENARIOS.iter().map(|s| s.name).collect::<Vec<_>>()
        ),
    }
}

/// Runs a scenario in its own task: `true` if it passed, `false` if it panicked (the
/// way a scenario reports a broken rule).
async fn passes(harness: Arc<dyn Harness>, scenario: &'static Scenario) -> bool {
    let run = tokio::spawn(async move { (scenario.run)(&*harness).await });
    match run.await {
        Ok(()) => true,
        Err(err) if err.is_panic() => false,
        Err(err) => panic!("{} did not run to an end: {err}", scenario.name),
    }
}

/// The scenario passes on the real store (the control) and fails on the mutant.
async fn caught(mutant: impl Bug, name: &str) {
    let scenario = scenario(name);
    assert!(
        passes(MemoryHarness::real(), scenario).await,
        "control: {name} must pass on the real in-memory store"
    );
    let description = format!("{mutant:?}");
    assert!(
        !passes(MemoryHarness::mutant(mutant), scenario).await,
        "{name} passed on the mutant {description}: the rule has no teeth against this bug"
    );
}

/// M1 fails on the mutant. (M1 on the real store is the memory backend's own
/// conformance test, and `tests/model_check.rs` here.)
async fn caught_by_m1(mutant: impl Bug) {
    caught(mutant, "m1_model_check").await;
}

// ---------------------------------------------------------------------------------
// The tests: `<mutant>_is_caught_by_<rule>`.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_claim_is_caught_by_c2() {
    caught(DoubleClaim::default(), "c2_claim_once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_claim_is_caught_by_m1() {
    caught_by_m1(DoubleClaim::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reversed_fifo_is_caught_by_c3() {
    caught(ReversedFifo, "c3_fifo_at_one_instant").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reversed_fifo_is_caught_by_m1() {
    caught_by_m1(ReversedFifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reclaim_at_expiry_is_caught_by_r2() {
    caught(
        ReclaimAtExpiry::default(),
        "r2_lease_expiring_now_is_not_expired",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reclaim_at_expiry_is_caught_by_m1() {
    caught_by_m1(ReclaimAtExpiry::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_l2() {
    caught(
        CompleteIgnoresToken,
        "l2_stale_token_is_lease_lost_and_changes_nothing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_l9() {
    caught(
        CompleteIgnoresToken,
        "l9_old_holder_is_fenced_after_reclaim",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_m1() {
    caught_by_m1(CompleteIgnoresToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_then_set_dedup_is_caught_by_e4() {
    caught(
        CheckThenSetDedup::default(),
        "e4_concurrent_enqueues_of_one_key_create_one_job",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_faking_vanished_job_is_caught_by_l3() {
    caught(
        HeartbeatFakesVanished,
        "l3_calls_on_vanished_job_are_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_faking_unknown_job_is_caught_by_l3() {
    caught(
        HeartbeatFakesVanished,
        "l3_calls_on_unknown_job_are_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequence_per_handle_is_caught_by_c3() {
    caught(SequencePerHandle, "c3_fifo_holds_across_handles").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_and_fail_checking_then_writing_are_caught_by_l9() {
    caught(
        CheckThenWriteLease::default(),
        "l9_holder_racing_reclaim_has_one_winner",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_by_prefix_is_caught_by_a3() {
    caught(
        StatsByPrefix::default(),
        "a3_stats_of_queues_sharing_a_prefix_are_apart",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forgotten_pause_is_caught_by_q1() {
    caught(
        PauseForgotten,
        "q1_paused_queue_is_not_claimed_until_resumed",
    )
    .await;
    caught(
        PauseForgotten,
        "q1_a_claim_skips_paused_queues_before_its_limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaping_at_the_cutoff_is_caught_by_w4() {
    caught(
        ReapAtTheCutoff,
        "w4_silent_workers_are_reaped_and_their_jobs_left",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefix_as_pattern_is_caught_by_a4() {
    caught(
        PrefixAsPattern,
        "a4_queue_prefix_is_literal_and_case_sensitive",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_tags_are_caught_by_a4() {
    caught(TagsIgnored, "a4_list_filters_by_tenant_and_tags_exactly").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_leaving_no_attempt_is_caught_by_h2() {
    caught(
        ReleaseLeavesNoAttempt,
        "h2_each_ending_is_recorded_with_its_outcome_and_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_last_error_is_caught_by_l4_and_a2() {
    caught(
        StaleLastError::default(),
        "l4_a_succeeded_job_shows_no_error_of_an_earlier_attempt",
    )
    .await;
    caught(
        StaleLastError::default(),
        "a2_retry_dead_job_requeues_with_attempts_reset",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncut_attempt_error_is_caught_by_h2() {
    caught(
        AttemptErrorUncut::default(),
        "h2_an_attempts_error_is_cut_at_4_kib",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keeping_the_oldest_attempts_is_caught_by_h3() {
    caught(OldestAttemptsKept, "h3_only_the_newest_attempts_are_kept").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lag_from_the_head_is_caught_by_a7() {
    caught(
        LagFromTheHead,
        "a7_queues_list_every_queue_with_counts_pause_and_lag",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn firing_that_reenables_is_caught_by_s2() {
    caught(
        FiringReenables,
        "s2_a_disable_survives_a_firing_that_races_it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tick_key_per_scheduler_is_caught_by_s3() {
    caught(
        TickKeyPerScheduler,
        "s3_concurrent_schedulers_fire_each_tick_once",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snooze_ready_now_is_caught_by_l10() {
    caught(SnoozeReadyNow, "l10_snooze_waits_without_using_an_attempt").await;
    caught(SnoozeReadyNow, "l10_snoozed_job_comes_due_in_order").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_by_window_is_caught_by_e10() {
    caught(
        UniqueByWindow,
        "e10_unique_while_active_holds_until_the_job_finishes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_budget_is_caught_by_f2_f3_f4() {
    caught(BudgetIgnored, "f2_budget_amounts_filter").await;
    caught(BudgetIgnored, "f3_capabilities_match_exactly").await;
    caught(BudgetIgnored, "f4_order_then_truncate_among_fitting_jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_then_filter_is_caught_by_f4() {
    caught(ClaimThenFilter, "f4_order_then_truncate_among_fitting_jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preference_bugs_are_caught_by_f5() {
    caught(
        PreferenceIgnored,
        "f5_locality_reorders_within_a_priority_band",
    )
    .await;
    caught(
        PreferenceFilters,
        "f5_locality_reorders_within_a_priority_band",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_reservation_is_caught_by_f6() {
    caught(ReservationIgnored, "f6_reserved_claims_only_that_job").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decode_after_lease_is_caught_by_c10() {
    caught(
        DecodeAfterLease::default(),
        "c10_a_corrupt_record_is_buried_and_the_claim_goes_on",
    )
    .await;
}
