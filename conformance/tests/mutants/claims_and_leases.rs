//! Bugs in enqueue, claim, lease and reclaim.

use super::*;

/// C10: a claim leases its jobs first and decodes them after, so an unreadable record
/// among them fails the whole claim and leaves the jobs it leased held by nobody until
/// their leases expire (PostgreSQL's claim before C10).
#[derive(Debug, Default)]
pub(crate) struct DecodeAfterLease {
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
pub(crate) struct DoubleClaim {
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
pub(crate) struct ReversedFifo;

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
pub(crate) struct ReclaimAtExpiry {
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
pub(crate) struct CompleteIgnoresToken;

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
pub(crate) struct CheckThenSetDedup {
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
pub(crate) struct HeartbeatFakesVanished;

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
pub(crate) struct SequencePerHandle;

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
pub(crate) struct CheckThenWriteLease {
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

/// The partitioning the partition mutants declare: four partitions by the id's low
/// bits, which the in-memory store draws at random.
fn by_low_bits(id: JobId, count: usize) -> usize {
    (id.as_u128() % count as u128) as usize
}

fn four_partitions() -> Option<Partitioning> {
    Some(Partitioning::new(4, by_low_bits))
}

/// P1: a partitioned store that places every job by its id alone, never beside its
/// parent: a family ends up spread over partitions.
#[derive(Debug)]
pub(crate) struct PlacementIgnoresParents;

impl Bug for PlacementIgnoresParents {
    fn partitioning(&self) -> Option<Partitioning> {
        four_partitions()
    }
}

/// P3: a partitioned store with flow control that places a job with a concurrency key
/// by its id alone, so one key's jobs end up in several partitions, where no one script
/// can count them.
#[derive(Debug)]
pub(crate) struct PlacementIgnoresConcurrencyKeys;

impl Bug for PlacementIgnoresConcurrencyKeys {
    fn partitioning(&self) -> Option<Partitioning> {
        four_partitions()
    }
}

/// P2: a partitioned store whose claim answers from the first partition it finds ready
/// jobs in and stops there, short of its limit while other partitions hold ready jobs.
/// Written as a claim that puts back what the real one took from other partitions.
#[derive(Debug)]
pub(crate) struct ClaimStopsAtOnePartition;

#[async_trait]
impl Bug for ClaimStopsAtOnePartition {
    fn partitioning(&self) -> Option<Partitioning> {
        four_partitions()
    }

    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        let claimed = inner.claim(request, now).await?;
        let Some(home) = claimed.first().map(|job| by_low_bits(job.id(), 4)) else {
            return Ok(claimed);
        };
        let mut kept = Vec::new();
        for job in claimed {
            if by_low_bits(job.id(), 4) == home {
                kept.push(job);
            } else {
                inner.release(job.id(), job.token(), now, now).await?;
            }
        }
        Ok(kept)
    }
}

/// Another bug on a store that declares four partitions: a bug of the claim order is
/// still caught when the suite asserts the order per partition.
#[derive(Debug)]
pub(crate) struct Partitioned<B>(pub(crate) B);

#[async_trait]
impl<B: Bug> Bug for Partitioned<B> {
    fn partitioning(&self) -> Option<Partitioning> {
        four_partitions()
    }

    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        self.0.claim(inner, request, now).await
    }
}

/// K1, K2: a claim that reads the limits' counts once, before its own writes: it counts
/// the jobs running when it starts but not those it takes, so one claim takes several
/// jobs of a key at its limit of one. The store's own claim with the fault injected
/// (`MemoryServer::count_limits_once`), as the bug would sit in a backend.
#[derive(Debug)]
pub(crate) struct CountsLimitsBeforeItsWrites;

impl Bug for CountsLimitsBeforeItsWrites {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.count_limits_once(namespace, true);
    }
}

/// K4: a claim that reads the rate windows on the machine's clock instead of the `now`
/// it is given, so the starts the store logged fall outside every window it reads.
/// The store's own claim with the fault injected
/// (`MemoryServer::rate_on_system_clock`), as the bug would sit in a backend.
#[derive(Debug)]
pub(crate) struct RateWindowOnTheCallersClock;

impl Bug for RateWindowOnTheCallersClock {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.rate_on_system_clock(namespace, true);
    }
}

/// K5: a fair claim that never moves the queue's turn on, so every claim starts at the
/// same key. The store's own claim with the fault injected
/// (`MemoryServer::turns_restart`), as the bug would sit in a backend.
#[derive(Debug)]
pub(crate) struct TurnsRestartAtTheSameKey;

impl Bug for TurnsRestartAtTheSameKey {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.turns_restart(namespace, true);
    }
}

/// K1, K2, K4: a backend that enforces the limits in its plain claim only, so a claim
/// with a budget, a preference or a reservation takes what they hold back. The store's
/// own fitted claim with the fault injected (`MemoryServer::fitted_claims_ignore_limits`).
#[derive(Debug)]
pub(crate) struct FittedClaimsIgnoreLimits;

impl Bug for FittedClaimsIgnoreLimits {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.fitted_claims_ignore_limits(namespace, true);
    }
}

/// K4: a backend whose limits without a rate leave the queue's start logs to
/// housekeeping, so a rate taken away and set again within its window still counts the
/// old starts. The store's own `set_limits` with the fault injected
/// (`MemoryServer::rates_keep_starts`).
#[derive(Debug)]
pub(crate) struct RemovedRatesKeepTheirStarts;

impl Bug for RemovedRatesKeepTheirStarts {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.rates_keep_starts(namespace, true);
    }
}

/// K5: a backend that never deletes a fair queue's turns, so fair shares taken away
/// and set again go on from the old turn. The store's own `set_limits` with the fault
/// injected (`MemoryServer::unfair_keeps_turns`).
#[derive(Debug)]
pub(crate) struct UnfairLimitsKeepTheTurns;

impl Bug for UnfairLimitsKeepTheTurns {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.unfair_keeps_turns(namespace, true);
    }
}

/// K1, F5: a preferring claim that admits a limited queue's jobs in ready order and
/// only then puts the preferred ones first, so a key's slot goes to a job the
/// preference ranks lower. The store's own fitted claim with the fault injected
/// (`MemoryServer::limits_before_preference`).
#[derive(Debug)]
pub(crate) struct LimitsBeforePreference;

impl Bug for LimitsBeforePreference {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.limits_before_preference(namespace, true);
    }
}

/// K3: a backend that stores limits but never removes them: setting unlimited limits
/// is ignored, so the old limits keep holding jobs back.
#[derive(Debug)]
pub(crate) struct UnlimitedLimitsAreIgnored;

#[async_trait]
impl Bug for UnlimitedLimitsAreIgnored {
    async fn set_limits(
        &self,
        inner: &dyn Backend,
        queue: &str,
        limits: QueueLimits,
    ) -> Result<()> {
        if limits.is_unlimited() {
            return Ok(());
        }
        inner
            .require_flow_control()?
            .set_limits(queue, limits)
            .await
    }
}
