//! A backend written downstream of durq that implements only the core trait,
//! [`Backend`]: enqueue, claim, the lease calls, reclaim and the reads of one job. It
//! declares no [capability](durq_core::capability), so the [`Store`](durq_core::Store)
//! answers `Unsupported` for listing, operator actions, pause, schedules and the
//! worker registry, and the conformance suite runs the core rules and skips the rest,
//! saying why (`tests/conformance.rs`).
//!
//! Its storage is the in-memory backend's, reached through that backend's core alone:
//! the shape of a real downstream backend, whose methods would talk to its own
//! storage instead.

use std::time::Duration;

use durq_core::{
    async_trait, Backend, Bytes, Capabilities, ClaimRequest, ClaimedJob, Enqueued, Heartbeat, Job,
    JobId, JobState, LeaseToken, NewJob, ReclaimedJob, Result, Retry, StoreSettings, Timestamp,
};
use durq_memory::MemoryBackend;

/// A job queue with the core of the contract and nothing more.
#[derive(Debug)]
pub struct CoreBackend {
    storage: MemoryBackend,
}

impl CoreBackend {
    /// A backend over `storage`.
    pub fn new(storage: MemoryBackend) -> Self {
        CoreBackend { storage }
    }
}

#[async_trait]
impl Backend for CoreBackend {
    fn settings(&self) -> &StoreSettings {
        self.storage.settings()
    }

    fn capabilities(&self) -> Capabilities {
        self.storage.capabilities()
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        self.storage.enqueue(job, now).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        self.storage.enqueue_batch(jobs, now).await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.storage.get(id).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.storage.payload(id).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.storage.claim(request, now).await
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.storage.heartbeat(id, token, ttl, now).await
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.storage.complete(id, token, result, now).await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.storage.fail(id, token, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.storage.release(id, token, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        self.storage.reclaim(limit, now).await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        self.storage.wait_for_work(queues, timeout).await
    }
}
