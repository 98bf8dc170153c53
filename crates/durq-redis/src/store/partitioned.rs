//! A partitioned namespace (CONTRACT §8): K partitions, each a slot group of its own
//! (`{namespace#p}`) holding every key the unpartitioned layout has, so a cluster
//! spreads one namespace over its masters. Each partition is served by the same code as
//! an unpartitioned namespace (a [`RedisBackend`] of its own over the shared
//! connection); this module only decides which partitions a call goes to and puts
//! their answers together.
//!
//! - A job is placed by its idempotency key (dedup and its races stay one atomic
//!   script), else by its parent (a family stays in one slot, and the parent check is
//!   the enqueue script's), else spread: single enqueues go to one partition for a run
//!   (so concurrent ones still share a script call), a batch whole to the next one, so
//!   a batch of unconstrained jobs is still one script, all or nothing. Its id is
//!   pinned to that partition, so every later call naming the id goes straight there.
//!   A keyed child whose key lands away from its parent has its parent checked before
//!   the call.
//! - A claim visits first the partitions a wake-up or the last hint points to, then
//!   looks ahead in the others with plain reads and runs its script only where a job
//!   may be, until it holds `limit` jobs; reclaim and purge sweep the partitions from a
//!   moving start. The claim order (C3) therefore holds within a partition. A store
//!   may be pinned to a subset of partitions for its claims (its workers then serve
//!   those).
//! - Stats, queues and list read every partition and merge; pause writes every
//!   partition (each claim script reads its own partition's paused set).
//! - Schedules and the worker registry are not split: they stay in the namespace's own
//!   slot, served by the store that holds this module.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Error, FlowStatus, Heartbeat, HeldLease, JobId,
    ListPage, ListQuery, NewJob, QueueLimits, QueueOverview, QueueStats, ReclaimedJob, Result,
    Timestamp, FLOW_KEYS_SHOWN,
};
use futures::future::join_all;

use super::enqueue::{invalid_parent, Prepared};
use crate::backend::{ReclaimReport, RedisBackend};
use crate::partitions;

/// The partitions of one namespace, and where the next spread job, claim and sweep
/// start.
pub(crate) struct Partitions {
    parts: Vec<RedisBackend>,
    /// The partitions this store's claims visit: every one, unless the store was pinned
    /// to a subset (`RedisConfig::claim_partitions`).
    claimed: Vec<usize>,
    /// Where jobs with neither key nor parent go.
    spread: Spread,
    next_claim: AtomicUsize,
    next_sweep: AtomicUsize,
}

impl Partitions {
    /// Over `parts`, partition `p` at index `p`.
    pub(crate) fn new(parts: Vec<RedisBackend>) -> Self {
        // Each store starts its turns at a random partition, so stores opened together
        // do not all begin with partition 0.
        let start = random_start();
        Partitions {
            claimed: (0..parts.len()).collect(),
            parts,
            spread: Spread {
                current: AtomicUsize::new(start),
                ..Spread::default()
            },
            next_claim: AtomicUsize::new(start / 3),
            next_sweep: AtomicUsize::new(start / 7),
        }
    }

    /// How many partitions there are.
    pub(crate) fn count(&self) -> usize {
        self.parts.len()
    }

    /// The partitions this store's claims visit.
    pub(crate) fn claimed(&self) -> &[usize] {
        &self.claimed
    }

    /// Pins this store's claims to `partitions` (distinct, each below the count, at
    /// least one), checked by the caller.
    pub(crate) fn claim_only(&mut self, partitions: Vec<usize>) {
        self.claimed = partitions;
    }

    /// The partition that holds job `id`.
    pub(crate) fn of(&self, id: JobId) -> &RedisBackend {
        &self.parts[partitions::of_id(id, self.parts.len())]
    }

    /// The partitions in the order a sweep visits them, from a start that moves on with
    /// every call, so concurrent claimers and sweepers spread over the partitions.
    fn rotation<'a>(&'a self, next: &AtomicUsize) -> impl Iterator<Item = &'a RedisBackend> {
        let start = next.fetch_add(1, Ordering::Relaxed);
        let count = self.parts.len();
        (0..count).map(move |i| &self.parts[(start + i) % count])
    }

    /// Where `job` must live, if anywhere: its idempotency key's partition (dedup and
    /// its races stay one atomic script), else its concurrency key's (every job of one
    /// key of a queue in one slot, so one script counts and leases them, CONTRACT P3),
    /// else its parent's (a family stays in one slot). A keyed child may so live away
    /// from its parent. The handle refuses a job with both keys first
    /// ([`Partitions::check_keys`]).
    fn placement(&self, job: &NewJob) -> Option<usize> {
        let count = self.parts.len();
        if let Some(key) = job.idempotency_key.as_deref() {
            return Some(partitions::of_key(&job.tenant, key, count));
        }
        if let Some(key) = job.concurrency_key.as_deref() {
            return Some(partitions::of_concurrency_key(&job.queue, key, count));
        }
        job.parent.map(|parent| partitions::of_id(parent, count))
    }

    /// CONTRACT P3: a job with both an idempotency key and a concurrency key would need
    /// the partitions of both; it is refused, naming `concurrency_key`.
    pub(crate) fn check_keys<'a>(&self, mut jobs: impl Iterator<Item = &'a NewJob>) -> Result<()> {
        if jobs.any(|job| job.idempotency_key.is_some() && job.concurrency_key.is_some()) {
            return Err(Error::invalid(
                "concurrency_key",
                "a partitioned namespace places a job by its idempotency key or by its \
                 concurrency key, not by both: enqueue it with one of them",
            ));
        }
        Ok(())
    }

    /// `job` with an id pinned to `partition`, noting a parent that lives elsewhere.
    fn prepare(&self, job: NewJob, partition: usize, now: Timestamp) -> Prepared {
        let count = self.parts.len();
        let parent_elsewhere = job
            .parent
            .is_some_and(|parent| partitions::of_id(parent, count) != partition);
        Prepared {
            id: partitions::pin(JobId::mint(now), partition, count),
            job,
            now,
            parent_elsewhere,
        }
    }

    pub(crate) async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        self.check_keys(std::iter::once(&job))?;
        let count = self.parts.len();
        let (partition, _spread) = match self.placement(&job) {
            Some(partition) => (partition, None),
            None => {
                let (partition, in_flight) = self.spread.next(count);
                (partition, Some(in_flight))
            }
        };
        let prepared = self.prepare(job, partition, now);
        if prepared.parent_elsewhere {
            self.check_parents(std::iter::once(&prepared)).await?;
        }
        self.parts[partition].inner.enqueues.call(prepared).await?
    }

    /// A batch's unconstrained jobs go where its first placed job goes (or to the next
    /// partition in turn), so a batch that needs one partition is one script call, all
    /// or nothing as E9 says. One that needs several is checked for missing parents
    /// first and then written one partition at a time (CONTRACT §8).
    pub(crate) async fn enqueue_batch(
        &self,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        self.check_keys(jobs.iter())?;
        let count = self.parts.len();
        let anchor = jobs
            .iter()
            .find_map(|job| self.placement(job))
            .unwrap_or_else(|| self.spread.next_run(count));
        let mut groups: BTreeMap<usize, (Vec<usize>, Vec<Prepared>)> = BTreeMap::new();
        let total = jobs.len();
        for (at, job) in jobs.into_iter().enumerate() {
            let partition = self.placement(&job).unwrap_or(anchor);
            let group = groups.entry(partition).or_default();
            group.0.push(at);
            group.1.push(self.prepare(job, partition, now));
        }
        let all = || groups.values().flat_map(|(_, prepared)| prepared);
        if groups.len() > 1 {
            self.check_parents(all()).await?;
        } else if all().any(|prepared| prepared.parent_elsewhere) {
            self.check_parents(all().filter(|prepared| prepared.parent_elsewhere))
                .await?;
        }
        let written =
            join_all(groups.iter().map(|(partition, (_, prepared))| {
                self.parts[*partition].enqueue_prepared(prepared)
            }))
            .await;
        let mut answers: Vec<Option<Enqueued>> = vec![None; total];
        for ((indexes, _), outcome) in groups.values().zip(written) {
            for (at, enqueued) in indexes.iter().zip(outcome?) {
                answers[*at] = Some(enqueued);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.ok_or_else(|| Error::corrupt("enqueue reply", "a job unanswered")))
            .collect()
    }

    /// Every parent the jobs name exists: read before writing a batch that spans
    /// partitions (each partition's script checks the parents in its own slot again)
    /// or a job whose parent lives in another partition.
    async fn check_parents<'a>(&self, jobs: impl Iterator<Item = &'a Prepared>) -> Result<()> {
        let mut by_partition: BTreeMap<usize, Vec<JobId>> = BTreeMap::new();
        for parent in jobs.filter_map(|prepared| prepared.job.parent) {
            let ids = by_partition
                .entry(partitions::of_id(parent, self.parts.len()))
                .or_default();
            if !ids.contains(&parent) {
                ids.push(parent);
            }
        }
        for (partition, ids) in by_partition {
            let exists = self.parts[partition].jobs_exist(&ids).await?;
            if let Some((parent, _)) = ids.iter().zip(exists).find(|(_, exists)| !exists) {
                return Err(invalid_parent(Some(*parent)));
            }
        }
        Ok(())
    }

    /// E8: a parent's children, oldest first. A keyed child lives in its key's
    /// partition, so every partition's children index is read.
    pub(crate) async fn children(&self, parent: JobId) -> Result<Vec<durq_core::Job>> {
        let found = join_all(self.parts.iter().map(|part| part.read_children(parent))).await;
        let mut children = Vec::new();
        for jobs in found {
            children.extend(jobs?);
        }
        children.sort_unstable_by_key(|job| job.id);
        Ok(children)
    }

    /// Leases up to `limit` jobs over the partitions (CONTRACT P2). A reservation goes
    /// to its job's partition alone.
    ///
    /// Partitions known to hold ready jobs (a wake-up named jobs there, or the last
    /// call's hint did) are visited first, one after another, each asked for all that
    /// is still wanted, so a backlog is taken a full call at a time. A claim still short
    /// then looks ahead in every other partition at once, with plain reads (a ready
    /// entry of its queues, a due scheduled one), and runs its script only where one
    /// was found: an idle poll, or the rest of a claim woken for one job, costs one
    /// round of cheap reads, not a script per partition.
    ///
    /// A partition that fails after others leased jobs ends the claim with what is
    /// held: those leases are live and must reach the caller; the failure shows again
    /// on the next call.
    pub(crate) async fn claim(
        &self,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        if let Some(reserved) = request.reserved {
            return self.of(reserved).claim_jobs(request, now).await;
        }
        let limit = request.limit;
        let (predicted, rest) = self.claim_order(&request);
        let mut claimed = Vec::new();
        let mut failure = claim_each(predicted, &request, now, &mut claimed).await;
        if failure.is_none() && claimed.len() < limit && !rest.is_empty() {
            let looks = join_all(
                rest.iter()
                    .map(|part| part.may_hold_ready(&request.queues, now)),
            )
            .await;
            // A look that failed is a partition to visit: the claim says what failed.
            let holding: Vec<&RedisBackend> = rest
                .into_iter()
                .zip(looks)
                .filter(|(_, look)| !matches!(look, Ok(false)))
                .map(|(part, _)| part)
                .collect();
            failure = claim_each(holding, &request, now, &mut claimed).await;
        }
        match failure {
            Some(err) if claimed.is_empty() => Err(err),
            _ => Ok(claimed),
        }
    }

    /// The partitions a claim visits: those whose claims hold a prediction of ready
    /// jobs for the claim's queues, then the rest; each group from a start that moves
    /// on with every claim, so claimers spread over the partitions.
    fn claim_order(&self, request: &ClaimRequest) -> (Vec<&RedisBackend>, Vec<&RedisBackend>) {
        let start = self.next_claim.fetch_add(1, Ordering::Relaxed);
        let visits = self.claimed.len();
        let rotated = (0..visits).map(|visit| &self.parts[self.claimed[(start + visit) % visits]]);
        if request.is_fitted() {
            return (Vec::new(), rotated.collect());
        }
        let queues = request.queues.join(",");
        rotated.partition(|part| part.inner.heads.predicts(&queues))
    }

    pub(crate) async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let groups = self.group(leases.iter().map(|lease| lease.id));
        let answers = join_all(groups.iter().map(|(partition, indexes)| {
            let held: Vec<HeldLease> = indexes.iter().map(|at| leases[*at]).collect();
            async move { self.parts[*partition].heartbeat_many(&held, ttl, now).await }
        }))
        .await;
        Ok(spread_back(leases.len(), &groups, answers))
    }

    pub(crate) async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        let total = completions.len();
        let groups = self.group(completions.iter().map(|completion| completion.id));
        let mut by_partition: Vec<Vec<Completion>> = vec![Vec::new(); self.parts.len()];
        for (partition, indexes) in &groups {
            by_partition[*partition] = indexes.iter().map(|at| completions[*at].clone()).collect();
        }
        let answers = join_all(groups.iter().map(|(partition, _)| {
            let entries = std::mem::take(&mut by_partition[*partition]);
            self.parts[*partition].complete_many(entries, now)
        }))
        .await;
        Ok(spread_back(total, &groups, answers))
    }

    /// The indexes of `ids` per partition, in order within each.
    fn group(&self, ids: impl Iterator<Item = JobId>) -> Vec<(usize, Vec<usize>)> {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (at, id) in ids.enumerate() {
            groups
                .entry(partitions::of_id(id, self.parts.len()))
                .or_default()
                .push(at);
        }
        groups.into_iter().collect()
    }

    /// Reclaims expired leases partition by partition from a moving start, up to
    /// `limit` in all.
    pub(crate) async fn reclaim(
        &self,
        limit: usize,
        now: Timestamp,
    ) -> Result<(Vec<ReclaimedJob>, ReclaimReport)> {
        let mut reclaimed = Vec::new();
        let mut report = ReclaimReport::default();
        for part in self.rotation(&self.next_sweep) {
            match part.reclaim_expired(limit - reclaimed.len(), now).await {
                Ok((jobs, seen)) => {
                    reclaimed.extend(jobs);
                    report.examined += seen.examined;
                }
                Err(err) if reclaimed.is_empty() => return Err(err),
                Err(_) => break,
            }
            if reclaimed.len() >= limit {
                break;
            }
        }
        Ok((reclaimed, report))
    }

    /// Purges partition by partition from a moving start, up to `limit` in all.
    pub(crate) async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        let mut purged = 0u64;
        for part in self.rotation(&self.next_sweep) {
            let left = limit.saturating_sub(usize::try_from(purged).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            purged += part.purge_finished(left, cutoff).await?;
        }
        Ok(purged)
    }

    /// A queue's counts: the sum of its partitions'.
    pub(crate) async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let counts = join_all(self.parts.iter().map(|part| part.queue_stats(queue, now))).await;
        let mut total = QueueStats::default();
        for stats in counts {
            add_stats(&mut total, &stats?);
        }
        Ok(total)
    }

    /// Every queue of every partition, counts summed, the oldest ready time the
    /// earliest; sorted by name as each partition's list is.
    pub(crate) async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        let lists = join_all(self.parts.iter().map(|part| part.queue_overviews(now))).await;
        let mut merged: BTreeMap<String, QueueOverview> = BTreeMap::new();
        for list in lists {
            for row in list? {
                match merged.get_mut(&row.queue) {
                    Some(seen) => {
                        add_stats(&mut seen.stats, &row.stats);
                        seen.oldest_ready = match (seen.oldest_ready, row.oldest_ready) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                    None => {
                        merged.insert(row.queue.clone(), row);
                    }
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// One page, newest first, from every partition's page after the same cursor.
    ///
    /// A job in the true page is within its own partition's page (fewer than `limit`
    /// jobs of any partition are newer than it), so the merge of the pages holds the
    /// true page. A partition that ended its page early (its `next` set, its page not
    /// full) has examined only down to its `next`: the merged page stops there too, and
    /// the next page starts from it.
    pub(crate) async fn list(&self, query: ListQuery) -> Result<ListPage> {
        let pages = join_all(self.parts.iter().map(|part| part.list_jobs(query.clone()))).await;
        let mut jobs = Vec::new();
        // The lowest id every partition has examined down to, when any page has a next
        // one (`next` is the last id a partition listed or examined): jobs below it may
        // be missing from some page.
        let mut frontier: Option<JobId> = None;
        for page in pages {
            let page = page?;
            if let Some(next) = page.next {
                frontier = Some(frontier.map_or(next, |seen| seen.max(next)));
            }
            jobs.extend(page.jobs);
        }
        if let Some(frontier) = frontier {
            // Every partition has examined every job at or above the frontier.
            jobs.retain(|job| job.id >= frontier);
        }
        jobs.sort_unstable_by_key(|job| std::cmp::Reverse(job.id));
        let next = if jobs.len() >= query.limit {
            jobs.truncate(query.limit);
            jobs.last().map(|job| job.id)
        } else {
            frontier
        };
        Ok(ListPage { jobs, next })
    }

    /// Q1: every partition's claims read their own paused set, so each is written.
    pub(crate) async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        for part in &self.parts {
            part.pause_queue(queue, paused).await?;
        }
        Ok(())
    }

    /// Q1: the queues paused in any partition (a pause interrupted half-way shows, and
    /// pausing again completes it).
    pub(crate) async fn paused_queues(&self) -> Result<Vec<String>> {
        let mut queues = Vec::new();
        for part in &self.parts {
            queues.extend(part.read_paused_queues().await?);
        }
        queues.sort_unstable();
        queues.dedup();
        Ok(queues)
    }

    /// K3, P3: each partition's claims read their own limits, so each is written (a
    /// change interrupted half-way reads back (`limits`) as the first partition's, and
    /// setting them again completes it). Limits that count a whole queue (`max_running`,
    /// `max_starts`, fair shares) would need every partition in one atomic step: they
    /// are refused, naming the field, and nothing is written.
    pub(crate) async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        limits.refuse_queue_wide()?;
        for part in &self.parts {
            part.put_limits(queue, limits).await?;
        }
        Ok(())
    }

    /// K3: every queue's limits, as the first partition holds them.
    pub(crate) async fn all_limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.parts[0].all_limits().await
    }

    /// K3: what `queue`'s limits hold back, over every partition: its running jobs
    /// summed, and the keys (each in one partition) merged by key. No partition has a
    /// queue rate (P3), so `next_start` stays `None`.
    pub(crate) async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        let found = join_all(
            self.parts
                .iter()
                .map(|part| part.read_flow_status(queue, now)),
        )
        .await;
        let mut status = FlowStatus::default();
        for part in found {
            let part = part?;
            status.running += part.running;
            status.keys_at_limit.extend(part.keys_at_limit);
            status.keys_rate_limited.extend(part.keys_rate_limited);
        }
        // `String`'s order is byte order, the order K3 lists keys in.
        status.keys_at_limit.sort_by(|a, b| a.0.cmp(&b.0));
        status.keys_at_limit.truncate(FLOW_KEYS_SHOWN);
        status.keys_rate_limited.sort_by(|a, b| a.0.cmp(&b.0));
        status.keys_rate_limited.truncate(FLOW_KEYS_SHOWN);
        Ok(status)
    }

    /// Whether a claim of any partition found limits on one of `queues`.
    pub(crate) fn names_limited_queue(&self, queues: &[String]) -> bool {
        self.parts
            .iter()
            .any(|part| part.names_limited_queue(queues))
    }

    /// K4: the earliest instant a rate of `queues` frees a start it holds back, over
    /// the partitions whose claims found limits on them.
    pub(crate) async fn next_rate_free(
        &self,
        queues: &[String],
        now: Timestamp,
    ) -> Result<Option<Timestamp>> {
        let limited: Vec<&RedisBackend> = self
            .parts
            .iter()
            .filter(|part| part.names_limited_queue(queues))
            .collect();
        let found = join_all(limited.iter().map(|part| part.next_rate_free(queues, now))).await;
        let mut next: Option<Timestamp> = None;
        for at in found {
            if let Some(at) = at? {
                next = Some(next.map_or(at, |next| next.min(at)));
            }
        }
        Ok(next)
    }

    /// Every key of every partition.
    pub(crate) async fn unlink(&self) -> Result<u64> {
        let mut deleted = 0;
        for part in &self.parts {
            deleted += part.unlink_namespace().await?;
        }
        Ok(deleted)
    }
}

/// Where jobs with neither key nor parent go: to one partition for a run of
/// enqueues, then to the next, so that over time every partition gets its share.
///
/// Concurrent single enqueues of a store are grouped into one script call per
/// partition (`Enqueues`), so spreading them one by one would cost a call per job (16
/// producers on 12 partitions: 0.98 script calls per job against 0.21, and 0.63 of the
/// unpartitioned throughput). A run therefore lasts while enqueues of it are in flight,
/// up to [`Spread::RUN`] jobs; an enqueue that finds none in flight starts a new run,
/// so enqueues one after another still go round the partitions one by one.
#[derive(Default)]
struct Spread {
    /// The partition of the current run (modulo the count).
    current: AtomicUsize,
    /// Jobs of the current run so far.
    run: AtomicUsize,
    /// Single enqueues sent and not answered yet.
    in_flight: Arc<AtomicUsize>,
}

/// Counts one single enqueue as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Spread {
    /// The most jobs of one run: a full group of concurrent enqueues is 512 jobs, and
    /// runs much shorter than that would split them; much longer, and a steady stream
    /// of producers would keep one partition for long.
    const RUN: usize = 64;

    /// The partition of one single enqueue, counted in flight until the returned guard
    /// is dropped.
    fn next(&self, count: usize) -> (usize, InFlight) {
        let idle = self.in_flight.fetch_add(1, Ordering::Relaxed) == 0;
        let in_flight = InFlight(Arc::clone(&self.in_flight));
        if idle || self.run.fetch_add(1, Ordering::Relaxed) >= Self::RUN {
            return (self.next_run(count), in_flight);
        }
        (self.current.load(Ordering::Relaxed) % count, in_flight)
    }

    /// Starts a new run and answers its partition: a batch, or a single enqueue that
    /// found nothing in flight or the run full.
    fn next_run(&self, count: usize) -> usize {
        self.run.store(1, Ordering::Relaxed);
        (self.current.fetch_add(1, Ordering::Relaxed) + 1) % count
    }
}

/// Puts per-partition answers back in the order of the call: `groups` names, for each
/// answer, the partition and the call's indexes it answered. A partition whose call
/// failed as a whole answers each of its entries with that error.
fn spread_back<T>(
    total: usize,
    groups: &[(usize, Vec<usize>)],
    answers: Vec<Result<Vec<Result<T>>>>,
) -> Vec<Result<T>> {
    let mut out: Vec<Option<Result<T>>> = (0..total).map(|_| None).collect();
    for ((_, indexes), answer) in groups.iter().zip(answers) {
        match answer {
            Ok(entries) => {
                let mut entries = entries.into_iter();
                for at in indexes {
                    out[*at] = Some(entries.next().unwrap_or_else(|| {
                        Err(Error::corrupt("batch reply", "an entry unanswered"))
                    }));
                }
            }
            Err(err) => {
                for at in indexes {
                    out[*at] = Some(Err(err.clone()));
                }
            }
        }
    }
    out.into_iter()
        .map(|entry| {
            entry.unwrap_or_else(|| Err(Error::corrupt("batch reply", "an entry unanswered")))
        })
        .collect()
}

fn add_stats(total: &mut QueueStats, part: &QueueStats) {
    total.ready += part.ready;
    total.scheduled += part.scheduled;
    total.running += part.running;
    total.succeeded += part.succeeded;
    total.dead += part.dead;
    total.cancelled += part.cancelled;
    total.paused |= part.paused;
}

/// Claims from `parts` one after another, each asked for what `request` still wants,
/// into `claimed`, until it holds `request.limit`; the failure that ended it, if any.
async fn claim_each(
    parts: Vec<&RedisBackend>,
    request: &ClaimRequest,
    now: Timestamp,
    claimed: &mut Vec<ClaimedJob>,
) -> Option<Error> {
    for part in parts {
        if claimed.len() >= request.limit {
            break;
        }
        let wanted = wanting(request, request.limit - claimed.len());
        match part.claim_jobs(wanted, now).await {
            Ok(jobs) => claimed.extend(jobs),
            Err(err) => return Some(err),
        }
    }
    None
}

/// `request` asking for `wanted` jobs.
fn wanting(request: &ClaimRequest, wanted: usize) -> ClaimRequest {
    let mut asked = request.clone();
    asked.limit = wanted;
    asked
}

/// A random number, from the standard library's per-process random hasher keys.
fn random_start() -> usize {
    use std::hash::{BuildHasher, Hasher};
    // Truncated on 32-bit targets: any bits do.
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as usize
}
