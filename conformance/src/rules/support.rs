//! Helpers the scenarios share: claiming, snapshots, and checks of error kinds.
//!
//! Every helper takes a `what` naming the rule and step, so a failure message says
//! which rule broke and where.

use std::fmt::Debug;
use std::time::Duration;

use durq_core::{
    Capability, ClaimRequest, ClaimedJob, Error, Job, JobId, JobState, ListQuery, NewJob,
    QueueStats, Result, Store, Timestamp,
};

/// The lease most scenarios claim with.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// The worker most scenarios claim as.
pub(crate) const WORKER: &str = "worker-1";

/// Unwraps a store result, failing the scenario with `what` on an error.
pub(crate) trait Must<T> {
    /// The value, or a panic naming `what` and the error.
    fn must(self, what: &str) -> T;
}

impl<T> Must<T> for Option<T> {
    /// The value a scenario built itself, or a panic naming `what`.
    #[track_caller]
    fn must(self, what: &str) -> T {
        match self {
            Some(value) => value,
            None => panic!("{what}: a value the scenario made is missing"),
        }
    }
}

impl<T> Must<T> for Result<T> {
    #[track_caller]
    fn must(self, what: &str) -> T {
        match self {
            Ok(value) => value,
            Err(err) => panic!("{what}: unexpected error: {err} ({err:?})"),
        }
    }
}

/// Waits for spawned tasks, re-raising a task's panic as the scenario's own.
/// Whether the store keeps the limits that count a whole queue (`max_running`,
/// `max_starts`, fair shares); if not (a partitioned store, CONTRACT P3), says that
/// `what` does not apply.
pub(crate) fn keeps_queue_wide_limits(store: &Store, what: &str) -> bool {
    let kept = store.capabilities().queue_wide_limits;
    if !kept {
        eprintln!("{what} skipped: the store keeps per-key limits only (CONTRACT P3)");
    }
    kept
}

pub(crate) async fn join_all<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(value) => out.push(value),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => panic!("a scenario task did not finish: {err}"),
        }
    }
    out
}

/// Enqueues `job`, which must be new, and returns its id.
pub(crate) async fn enqueue(store: &Store, job: NewJob, what: &str) -> JobId {
    let answer = store.enqueue(job).await.must(what);
    assert!(
        answer.created,
        "{what}: a job without a live idempotency key must be created (created = false for {})",
        answer.id
    );
    answer.id
}

/// `get`, which must succeed.
pub(crate) async fn get(store: &Store, id: JobId, what: &str) -> Job {
    store.get(id).await.must(what)
}

/// A claim request.
pub(crate) fn request(queues: &[&str], worker: &str, ttl: Duration, limit: usize) -> ClaimRequest {
    ClaimRequest::new(queues.iter().copied(), worker, ttl).limit(limit)
}

/// Claims up to `limit` jobs from `queues` as [`WORKER`] with [`TTL`].
pub(crate) async fn claim(
    store: &Store,
    queues: &[&str],
    limit: usize,
    what: &str,
) -> Vec<ClaimedJob> {
    store
        .claim(request(queues, WORKER, TTL, limit))
        .await
        .must(what)
}

/// Claims exactly one job from `queue`, which must be `expected`.
pub(crate) async fn claim_expecting(
    store: &Store,
    queue: &str,
    expected: JobId,
    what: &str,
) -> ClaimedJob {
    let mut claimed = claim(store, &[queue], 1, what).await;
    assert_eq!(
        claimed.len(),
        1,
        "{what}: expected to claim job {expected}, the claim returned {} jobs",
        claimed.len()
    );
    let job = claimed.remove(0);
    assert_eq!(
        job.id(),
        expected,
        "{what}: the claim returned the wrong job"
    );
    job
}

/// Claims with a large limit and asserts nothing came back.
pub(crate) async fn assert_nothing_claimable(store: &Store, queues: &[&str], what: &str) {
    let claimed = claim(store, queues, 1_000, what).await;
    assert!(
        claimed.is_empty(),
        "{what}: expected nothing claimable on {queues:?}, claimed {:?}",
        ids_of(&claimed)
    );
}

/// Claims everything ready on `queues`, 100 at a time, in claim order.
pub(crate) async fn drain(store: &Store, queues: &[&str], what: &str) -> Vec<ClaimedJob> {
    let mut all = Vec::new();
    loop {
        let batch = claim(store, queues, 100, what).await;
        if batch.is_empty() {
            return all;
        }
        assert!(
            all.len() + batch.len() <= 100_000,
            "{what}: the queue never drains; jobs are handed out again and again"
        );
        all.extend(batch);
    }
}

/// The ids of claimed jobs, in order.
pub(crate) fn ids_of(claimed: &[ClaimedJob]) -> Vec<JobId> {
    claimed.iter().map(ClaimedJob::id).collect()
}

/// Every job of `queue` (in `state`, if given), newest first, read page by page.
pub(crate) async fn list_all(
    store: &Store,
    queue: &str,
    state: Option<JobState>,
    what: &str,
) -> Vec<Job> {
    let mut all: Vec<Job> = Vec::new();
    let mut cursor = None;
    loop {
        let mut query = ListQuery::new(queue).limit(1_000);
        query.states = state.into_iter().collect();
        query.cursor = cursor;
        let page = store.list(query).await.must(what);
        all.extend(page.jobs);
        match page.next {
            Some(next) => {
                assert!(
                    cursor != Some(next),
                    "{what}: list returned the same cursor twice"
                );
                cursor = Some(next);
            }
            None => return all,
        }
    }
}

/// The counts `stats` must report for `jobs` at `now`.
pub(crate) fn count(jobs: &[Job], now: Timestamp) -> QueueStats {
    let mut stats = QueueStats::default();
    for job in jobs {
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

/// `stats(queue)` must equal `expected`: a cross-check of A3 inside scenarios of other
/// rules, so a backend without [`Capability::Inspect`] has no counts to check and
/// passes it.
pub(crate) async fn assert_stats(store: &Store, queue: &str, expected: QueueStats, what: &str) {
    if !store.supports(Capability::Inspect) {
        return;
    }
    let stats = store.stats(queue).await.must(what);
    assert_eq!(stats, expected, "{what}: stats({queue:?}) is wrong");
}

/// `stats(queue)` must agree with the jobs `list` shows (CONTRACT A3); the counts, or
/// `None` on a backend without [`Capability::Inspect`], which has neither to compare.
pub(crate) async fn assert_stats_agree(
    store: &Store,
    queue: &str,
    what: &str,
) -> Option<QueueStats> {
    if !store.supports(Capability::Inspect) {
        return None;
    }
    let jobs = list_all(store, queue, None, what).await;
    let expected = count(&jobs, store.settings().now());
    assert_stats(store, queue, expected, what).await;
    Some(expected)
}

/// The result must be [`Error::NotFound`] naming `id`.
#[track_caller]
pub(crate) fn expect_not_found<T: Debug>(result: Result<T>, id: JobId, what: &str) {
    match result {
        Err(Error::NotFound { id: named }) => {
            assert_eq!(named, id, "{what}: NotFound names the wrong job")
        }
        other => panic!("{what}: expected NotFound for job {id}, got {other:?}"),
    }
}

/// The result must be [`Error::LeaseLost`] naming `id`.
#[track_caller]
pub(crate) fn expect_lease_lost<T: Debug>(result: Result<T>, id: JobId, what: &str) {
    match result {
        Err(Error::LeaseLost { id: named }) => {
            assert_eq!(named, id, "{what}: LeaseLost names the wrong job")
        }
        other => panic!("{what}: expected LeaseLost for job {id}, got {other:?}"),
    }
}

/// The result must be [`Error::InvalidInput`] naming `field`.
#[track_caller]
pub(crate) fn expect_invalid<T: Debug>(result: Result<T>, field: &str, what: &str) {
    match result {
        Err(Error::InvalidInput { field: named, .. }) => assert_eq!(
            named, field,
            "{what}: the invalid-input error names the wrong field"
        ),
        other => panic!("{what}: expected InvalidInput {{ field: {field:?} }}, got {other:?}"),
    }
}

/// The result must be [`Error::PayloadTooLarge`] for `field` of `size` bytes over `max`.
#[track_caller]
pub(crate) fn expect_too_large<T: Debug>(
    result: Result<T>,
    field: &str,
    size: usize,
    max: usize,
    what: &str,
) {
    match result {
        Err(Error::PayloadTooLarge {
            field: named,
            size: got_size,
            max: got_max,
        }) => {
            assert_eq!(
                named, field,
                "{what}: PayloadTooLarge names the wrong field"
            );
            assert_eq!(
                got_size, size,
                "{what}: PayloadTooLarge reports the wrong size"
            );
            assert_eq!(
                got_max, max,
                "{what}: PayloadTooLarge reports the wrong limit"
            );
        }
        other => panic!("{what}: expected PayloadTooLarge for {field}, got {other:?}"),
    }
}

/// The result must be [`Error::InvalidState`] about `id`, which is in `state`.
#[track_caller]
pub(crate) fn expect_invalid_state<T: Debug>(
    result: Result<T>,
    id: JobId,
    state: JobState,
    what: &str,
) {
    match result {
        Err(Error::InvalidState {
            id: named,
            state: named_state,
            ..
        }) => {
            assert_eq!(named, id, "{what}: InvalidState names the wrong job");
            assert_eq!(
                named_state, state,
                "{what}: InvalidState reports the wrong state"
            );
        }
        other => panic!("{what}: expected InvalidState ({state}) for job {id}, got {other:?}"),
    }
}

/// The stored job must be exactly `before`, field for field.
pub(crate) async fn assert_unchanged(store: &Store, before: &Job, what: &str) {
    let now = store.get(before.id).await.must(what);
    assert_eq!(&now, before, "{what}: the job changed");
}

/// Bytes holding every byte value, NUL and invalid UTF-8 included, `len` long.
pub(crate) fn binary(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// C3 as CONTRACT §8 scopes it: on a partitioned store the claim order holds within each
/// partition, so `claimed` must hold exactly the jobs of `expected`, and the jobs of
/// each partition in `expected`'s order; on any other store `claimed` is `expected`.
#[track_caller]
pub(crate) fn assert_claim_order(store: &Store, claimed: &[JobId], expected: &[JobId], what: &str) {
    let Some(partitioning) = store.capabilities().partitioning else {
        assert_eq!(claimed, expected, "{what}");
        return;
    };
    let mut got = claimed.to_vec();
    let mut want = expected.to_vec();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "{what}: the claims must hold exactly the expected jobs"
    );
    for partition in 0..partitioning.count() {
        let of = |ids: &[JobId]| -> Vec<JobId> {
            ids.iter()
                .copied()
                .filter(|id| partitioning.of(*id) == partition)
                .collect()
        };
        assert_eq!(
            of(claimed),
            of(expected),
            "{what} (within partition {partition} of {}, CONTRACT §8)",
            partitioning.count()
        );
    }
}

/// The jobs of a scenario that claims them one at a time and expects a given one each
/// time, kept in one partition of a partitioned store: each becomes a child of one
/// anchor job (queue [`Together::ANCHOR_QUEUE`]), and CONTRACT §8 places a job without an
/// idempotency key in its parent's partition. The whole claim order then applies (C3
/// holds within a partition). On any other store it changes nothing.
pub(crate) struct Together {
    anchor: Option<JobId>,
}

impl Together {
    /// The queue of the anchor job, which nothing claims.
    pub(crate) const ANCHOR_QUEUE: &'static str = "together-anchor";

    /// Enqueues the anchor on a partitioned store.
    pub(crate) async fn new(store: &Store, what: &str) -> Self {
        let anchor = match store.capabilities().partitioning {
            Some(_) => Some(enqueue(store, NewJob::new(Self::ANCHOR_QUEUE), what).await),
            None => None,
        };
        Together { anchor }
    }

    /// `job`, placed in the anchor's partition when there is one. A job that names a
    /// parent or an idempotency key keeps them: it lives with its parent (enqueue the
    /// parent through this too) or its key.
    pub(crate) fn job(&self, job: NewJob) -> NewJob {
        match self.anchor {
            Some(anchor) if job.parent.is_none() && job.idempotency_key.is_none() => {
                job.parent(anchor)
            }
            _ => job,
        }
    }

    /// [`enqueue`] of `job` placed with the others.
    pub(crate) async fn enqueue(&self, store: &Store, job: NewJob, what: &str) -> JobId {
        enqueue(store, self.job(job), what).await
    }
}
