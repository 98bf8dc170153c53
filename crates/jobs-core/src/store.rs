//! The `Store` trait: what a backend must implement, and nothing more.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::Result;
use crate::id::JobId;
use crate::model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState,
    LeaseToken, ListPage, ListQuery, NewJob, QueueStats, ReclaimedJob, Retry, StoreSettings,
};

/// A durable job store: the [contract](crate::contract), one method per operation.
///
/// Object-safe, so services hold an `Arc<dyn Store>` and choose the backend at run
/// time. Every method validates its input with [`crate::validate`] before writing, and
/// takes "now" from [`StoreSettings::clock`], never from the server.
///
/// Every operation but two has no default: a wrapper store must forward it, so it
/// cannot lose behaviour by accident. The two defaults, [`Store::complete_batch`] and
/// [`Store::heartbeat_batch`], are defined by `complete` and `heartbeat` and only forgo
/// a speed-up when not overridden; so does the one capability,
/// [`Store::tied_to_runtime`], whose default is the safe answer.
/// Conveniences live in [`StoreExt`].
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// The settings the store was opened with, its clock included.
    fn settings(&self) -> &StoreSettings;

    /// Whether the store's calls need the tokio runtime it was opened on to make
    /// progress: its connections' I/O is driven there (a Redis connection's driver
    /// task, a PostgreSQL pool's sockets). A store whose calls complete on any runtime,
    /// or on none (in-process state, a writer thread of its own), answers `false`.
    ///
    /// The worker runtime reads it to keep leases where handlers cannot starve them:
    /// beside a tied store's connections, or on a thread of its own for a store that
    /// is not tied. The default, `true`, is the safe answer for any store.
    fn tied_to_runtime(&self) -> bool {
        true
    }

    /// Rules E1–E7: adds a job, or returns the existing job for a live idempotency key.
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued>;

    /// Rule E9: the same as enqueueing each job in order, answered in order. A batch
    /// holding an invalid job is refused whole and writes nothing.
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>>;

    /// Rule E1: the job as stored, or [`crate::Error::NotFound`].
    async fn get(&self, id: JobId) -> Result<Job>;

    /// Rule E1: the job's payload bytes, exactly as enqueued.
    async fn payload(&self, id: JobId) -> Result<Bytes>;

    /// Rule E8: the jobs enqueued with `parent`, oldest first.
    async fn children(&self, parent: JobId) -> Result<Vec<Job>>;

    /// Rules C1–C9: leases up to `request.limit` ready jobs in claim order and returns
    /// them, with payloads, in that order.
    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedJob>>;

    /// Rule L1: extends the lease to now + `ttl`; reports a requested cancellation.
    async fn heartbeat(&self, id: JobId, token: LeaseToken, ttl: Duration) -> Result<Heartbeat>;

    /// Rule L1, one `heartbeat` per entry, all with the same `ttl`: the answer at index
    /// `i` is what `heartbeat` would have answered for `leases[i]`, and an entry that
    /// fails (a stale token, an unknown job) leaves the others alone.
    ///
    /// A worker extends every lease it holds with one call per heartbeat interval, so a
    /// backend can renew them under one lock, in one statement or in one script. The
    /// default issues the `heartbeat` calls concurrently; every backend of this
    /// workspace overrides it with one round trip.
    ///
    /// `Err` means the call failed as a whole (the store was unavailable, or `ttl` is
    /// invalid): any entry may or may not have been extended. Calling again is safe.
    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        crate::validate::validate_lease_ttl(ttl)?;
        Ok(heartbeat_each(self, leases, ttl).await)
    }

    /// Rules L4, L5: marks the job succeeded and stores `result`.
    async fn complete(&self, id: JobId, token: LeaseToken, result: Option<Bytes>) -> Result<()>;

    /// Rules L4, L5, one `complete` per entry: the answer at index `i` is what
    /// `complete` would have answered for `completions[i]`, an entry that fails (a stale
    /// token, an oversized result, a second completion of the same job later in the
    /// batch) leaves the others alone, and entries take effect in order.
    ///
    /// A worker finishing many short jobs hands them over in one call, so a backend can
    /// record them under one lock, in one transaction or in one script. The default
    /// issues the `complete` calls concurrently, which keeps a backend that groups
    /// concurrent calls grouping them; a backend that can do better overrides it.
    ///
    /// `Err` means the call failed as a whole, like a failed `complete`: any of the
    /// entries may or may not have taken effect. Calling again is safe; an entry that
    /// was recorded then answers lease lost (L5).
    async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        Ok(complete_each(self, completions).await)
    }

    /// Rules L6, L7: records `error` and requeues the job at the retry time, or makes it
    /// dead when asked to or when its attempts are used up. Returns the new state.
    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> Result<JobState>;

    /// Rule L8: gives the job back, ready now, without counting the attempt.
    async fn release(&self, id: JobId, token: LeaseToken) -> Result<()>;

    /// Rules R1–R6: recovers up to `limit` jobs whose lease expired.
    async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>>;

    /// Rule A1: cancels a queued job, asks a running one to stop, leaves a terminal one.
    /// Returns the job's state afterwards.
    async fn cancel(&self, id: JobId) -> Result<JobState>;

    /// Rule A2: queues a dead or cancelled job again with its attempts reset.
    /// Any other state is refused with [`crate::Error::InvalidState`].
    async fn retry(&self, id: JobId) -> Result<()>;

    /// Rule A3: counts of one queue's jobs per state.
    async fn stats(&self, queue: &str) -> Result<QueueStats>;

    /// Rule A4: one page of a queue's jobs, newest first.
    async fn list(&self, query: ListQuery) -> Result<ListPage>;

    /// Rule A5: deletes up to `limit` terminal jobs whose retention has passed, with
    /// their index entries. Returns how many were deleted.
    async fn purge(&self, limit: usize) -> Result<u64>;

    /// Resolves when work may have arrived on one of `queues`, or after `timeout`
    /// (real time), whichever comes first. Spurious wake-ups are allowed; a claimer
    /// calls `claim` after it either way.
    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()>;
}

/// [`Store::complete_batch`] as concurrent `complete` calls: its default, and what a
/// backend that overrides it can fall back on.
pub async fn complete_each<S: Store + ?Sized>(
    store: &S,
    completions: Vec<Completion>,
) -> Vec<Result<()>> {
    // Entries for one job are serialised (L5: the first one stands, the next is lease
    // lost), so only distinct jobs' completions run at the same time.
    let mut seen = std::collections::HashSet::with_capacity(completions.len());
    if completions.iter().all(|c| seen.insert(c.id)) {
        futures_util::future::join_all(
            completions
                .into_iter()
                .map(|c| store.complete(c.id, c.token, c.result)),
        )
        .await
    } else {
        let mut answers = Vec::with_capacity(completions.len());
        for c in completions {
            answers.push(store.complete(c.id, c.token, c.result).await);
        }
        answers
    }
}

/// [`Store::heartbeat_batch`] as concurrent `heartbeat` calls: its default, and what a
/// backend that overrides it can fall back on.
pub async fn heartbeat_each<S: Store + ?Sized>(
    store: &S,
    leases: Vec<HeldLease>,
    ttl: Duration,
) -> Vec<Result<Heartbeat>> {
    futures_util::future::join_all(
        leases
            .into_iter()
            .map(|lease| store.heartbeat(lease.id, lease.token, ttl)),
    )
    .await
}

/// Conveniences over any [`Store`], written once in terms of the trait.
#[async_trait]
pub trait StoreExt: Store {
    /// Enqueues a job on `queue` whose payload is `value` as JSON.
    async fn enqueue_json<T>(&self, queue: &str, value: &T) -> Result<Enqueued>
    where
        T: serde::Serialize + Sync + ?Sized,
    {
        let job = NewJob::new(queue).json(value)?;
        self.enqueue(job).await
    }

    /// Reads a job's payload as JSON.
    async fn payload_json<T>(&self, id: JobId) -> Result<T>
    where
        T: serde::de::DeserializeOwned,
    {
        let bytes = self.payload(id).await?;
        serde_json::from_slice(&bytes).map_err(|err| {
            crate::Error::invalid("payload", format!("not the expected JSON: {err}"))
        })
    }

    /// Claims at most one job.
    async fn claim_one(
        &self,
        queues: &[&str],
        worker: &str,
        lease_ttl: Duration,
    ) -> Result<Option<ClaimedJob>> {
        let request = ClaimRequest::new(queues.iter().copied(), worker, lease_ttl).limit(1);
        Ok(self.claim(request).await?.into_iter().next())
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Compile-time proof that the trait is object-safe and that its futures are
    /// `Send`, so `Arc<dyn Store>` can be used from any tokio task.
    #[allow(dead_code)]
    fn store_futures_are_send(store: Arc<dyn Store>) {
        fn is_send<T: Send>(_: &T) {}
        fn is_send_sync<T: Send + Sync>(_: &T) {}
        is_send_sync(&store);
        let id = JobId::mint(crate::Timestamp::from_millis(0));
        let token = LeaseToken::new(1);
        is_send(&store.enqueue(NewJob::new("q")));
        is_send(&store.claim(ClaimRequest::new(["q"], "w", Duration::from_secs(1))));
        is_send(&store.heartbeat(id, token, Duration::from_secs(1)));
        is_send(&store.complete(id, token, None));
        is_send(&store.complete_batch(vec![Completion::new(id, token, None)]));
        is_send(&store.heartbeat_batch(vec![HeldLease::new(id, token)], Duration::from_secs(1)));
        is_send(&store.fail(id, token, "boom", Retry::Never));
        is_send(&store.reclaim(10));
        is_send(&store.enqueue_json("q", &42));
        is_send(&store.claim_one(&["q"], "w", Duration::from_secs(1)));
    }
}
