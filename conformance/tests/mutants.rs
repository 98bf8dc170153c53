//! The suite has teeth: each test wraps the in-memory store in a deliberately broken
//! store (a *mutant*, one bug each), runs the scenario of the rule the bug breaks, and
//! asserts that the scenario fails on the mutant and passes on the real store.
//!
//! Every mutant is one [`Mutant`]: a forwarding [`Store`] whose operations go through
//! a [`Bug`]'s hooks. A hook forwards to the real store unless the bug overrides it,
//! so each bug is written as the one operation it breaks, the way the real bug would
//! sit in a backend.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jobs_conformance::{Harness, Scenario, SCENARIOS};
use jobs_core::{
    async_trait, Bytes, ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job,
    JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueStats, ReclaimedJob, Result,
    Retry, Store, StoreSettings, Timestamp, LEASE_EXPIRED,
};
use jobs_memory::MemoryServer;

// ---------------------------------------------------------------------------------
// The forwarding wrapper.

/// One deliberate bug. Each hook receives the real store and, by default, forwards
/// to it; a bug overrides the hook of the operation it breaks.
#[async_trait]
trait Bug: Send + Sync + fmt::Debug + 'static {
    async fn enqueue(&self, inner: &dyn Store, job: NewJob) -> Result<Enqueued> {
        inner.enqueue(job).await
    }

    async fn enqueue_batch(&self, inner: &dyn Store, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        inner.enqueue_batch(jobs).await
    }

    async fn claim(&self, inner: &dyn Store, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        inner.claim(request).await
    }

    async fn heartbeat(
        &self,
        inner: &dyn Store,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Heartbeat> {
        inner.heartbeat(id, token, ttl).await
    }

    async fn complete(
        &self,
        inner: &dyn Store,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<()> {
        inner.complete(id, token, result).await
    }

    async fn reclaim(&self, inner: &dyn Store, limit: usize) -> Result<Vec<ReclaimedJob>> {
        inner.reclaim(limit).await
    }
}

/// The real store behind one bug.
#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Store>,
    bug: Arc<dyn Bug>,
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Store for Mutant {
    fn settings(&self) -> &StoreSettings {
        self.inner.settings()
    }

    fn tied_to_runtime(&self) -> bool {
        self.inner.tied_to_runtime()
    }

    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        self.bug.enqueue(&*self.inner, job).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.bug.enqueue_batch(&*self.inner, jobs).await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.inner.get(id).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.inner.payload(id).await
    }

    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        self.inner.children(parent).await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        self.bug.claim(&*self.inner, request).await
    }

    async fn heartbeat(&self, id: JobId, token: LeaseToken, ttl: Duration) -> Result<Heartbeat> {
        self.bug.heartbeat(&*self.inner, id, token, ttl).await
    }

    async fn complete(&self, id: JobId, token: LeaseToken, result: Option<Bytes>) -> Result<()> {
        self.bug.complete(&*self.inner, id, token, result).await
    }

    async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        // Through the mutant's own `complete`, so a broken complete is broken here too.
        Ok(jobs_core::complete_each(self, completions).await)
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        // Through the mutant's own `heartbeat`, so a broken heartbeat is broken here too.
        jobs_core::validate::validate_lease_ttl(ttl)?;
        Ok(jobs_core::heartbeat_each(self, leases, ttl).await)
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> Result<JobState> {
        self.inner.fail(id, token, error, retry).await
    }

    async fn release(&self, id: JobId, token: LeaseToken) -> Result<()> {
        self.inner.release(id, token).await
    }

    async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>> {
        self.bug.reclaim(&*self.inner, limit).await
    }

    async fn cancel(&self, id: JobId) -> Result<JobState> {
        self.inner.cancel(id).await
    }

    async fn retry(&self, id: JobId) -> Result<()> {
        self.inner.retry(id).await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        self.inner.stats(queue).await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.inner.list(query).await
    }

    async fn purge(&self, limit: usize) -> Result<u64> {
        self.inner.purge(limit).await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        self.inner.wait_for_work(queues, timeout).await
    }
}

/// Opens real in-memory stores, each wrapped in the harness's bug when it has one.
/// One bug instance serves every store the harness opens, as one buggy backend
/// serves every connection.
struct MemoryHarness {
    server: MemoryServer,
    bug: Option<Arc<dyn Bug>>,
}

impl MemoryHarness {
    fn real() -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: None,
        })
    }

    fn mutant(bug: impl Bug) -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: Some(Arc::new(bug)),
        })
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Arc<dyn Store>> {
        let inner: Arc<dyn Store> = Arc::new(self.server.open(settings)?);
        Ok(match &self.bug {
            Some(bug) => Arc::new(Mutant {
                inner,
                bug: Arc::clone(bug),
            }),
            None => inner,
        })
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.server.vanish(namespace, id);
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
    async fn claim(&self, inner: &dyn Store, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
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
        let mut claimed = inner.claim(request).await?;
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
    async fn claim(&self, inner: &dyn Store, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        if request.limit == 0 {
            return inner.claim(request).await;
        }
        let limit = request.limit;
        let window = ClaimRequest {
            limit: limit + 64,
            ..request
        };
        let claimed = inner.claim(window).await?;
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
                inner.release(job.id(), job.token()).await?;
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
    fn note(&self, inner: &dyn Store, queue: &str) {
        lock(&self.queues)
            .entry(inner.settings().namespace.clone())
            .or_default()
            .insert(queue.to_owned());
    }
}

#[async_trait]
impl Bug for ReclaimAtExpiry {
    async fn enqueue(&self, inner: &dyn Store, job: NewJob) -> Result<Enqueued> {
        self.note(inner, &job.queue);
        inner.enqueue(job).await
    }

    async fn enqueue_batch(&self, inner: &dyn Store, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        for job in &jobs {
            self.note(inner, &job.queue);
        }
        inner.enqueue_batch(jobs).await
    }

    async fn reclaim(&self, inner: &dyn Store, limit: usize) -> Result<Vec<ReclaimedJob>> {
        let mut reclaimed = inner.reclaim(limit).await?;
        let now = inner.settings().now();
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
                let page = inner.list(query).await?;
                for job in &page.jobs {
                    let Some(lease) = &job.lease else { continue };
                    if lease.expires_at != now || reclaimed.len() >= limit {
                        continue;
                    }
                    let state = inner
                        .fail(job.id, lease.token, LEASE_EXPIRED, Retry::At(now))
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
        inner: &dyn Store,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<()> {
        let current = match inner.get(id).await {
            Ok(job) => job.lease.map_or(token, |lease| lease.token),
            Err(_) => token,
        };
        inner.complete(id, current, result).await
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
    async fn enqueue(&self, inner: &dyn Store, job: NewJob) -> Result<Enqueued> {
        let Some(key) = job.idempotency_key.clone() else {
            return inner.enqueue(job).await;
        };
        let settings = inner.settings();
        let now = settings.now();
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
        let enqueued = inner.enqueue(job).await?;
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
        inner: &dyn Store,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Heartbeat> {
        match inner.heartbeat(id, token, ttl).await {
            Err(err) if err.is_not_found() => Ok(Heartbeat {
                cancel_requested: false,
                expires_at: inner.settings().now().saturating_add(ttl),
            }),
            other => other,
        }
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
