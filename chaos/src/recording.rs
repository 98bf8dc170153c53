//! A `Store` that forwards every call to the real one and writes the history lines
//! the checker needs: every claimed job with its token, and every answer to
//! complete, complete_batch, fail and release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use jobs::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Error, Heartbeat, HeldLease, Job, JobId,
    JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueStats, ReclaimedJob, Result, Retry,
    Store, StoreSettings,
};

use crate::history::{now_us, Event, Log, Op};

/// The recording wrapper. Every method of the trait is forwarded explicitly, the two
/// with defaults (`complete_batch`, `heartbeat_batch`) included, so the backend's
/// batched versions are the ones that run under faults.
#[derive(Debug)]
pub struct Recording {
    inner: Arc<dyn Store>,
    log: Arc<Log>,
}

impl Recording {
    /// Wraps `inner`, writing to `log`.
    pub fn new(inner: Arc<dyn Store>, log: Arc<Log>) -> Self {
        Recording { inner, log }
    }

    fn failed(&self, op: &str, err: &Error) {
        self.log.write(&Event::CallFailed {
            t: now_us(),
            op: op.to_owned(),
            err: err.to_string(),
        });
    }

    fn outcome<T>(&self, t0: u64, op: Op, id: JobId, token: LeaseToken, answer: &Result<T>) {
        self.log.write(&Event::Outcome {
            t0,
            t: now_us(),
            op,
            id,
            token: token.get(),
            ok: answer.is_ok(),
            lease_lost: answer.as_ref().is_err_and(Error::is_lease_lost),
            err: answer.as_ref().err().map(ToString::to_string),
        });
    }
}

#[async_trait]
impl Store for Recording {
    fn settings(&self) -> &StoreSettings {
        self.inner.settings()
    }

    fn tied_to_runtime(&self) -> bool {
        self.inner.tied_to_runtime()
    }

    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        self.inner.enqueue(job).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.inner.enqueue_batch(jobs).await
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
        let claimed = self
            .inner
            .claim(request)
            .await
            .inspect_err(|err| self.failed("claim", err))?;
        let t = now_us();
        for job in &claimed {
            self.log.write(&Event::Claim {
                t,
                id: job.id(),
                token: job.token().get(),
            });
        }
        Ok(claimed)
    }

    async fn heartbeat(&self, id: JobId, token: LeaseToken, ttl: Duration) -> Result<Heartbeat> {
        let answer = self.inner.heartbeat(id, token, ttl).await;
        if let Err(err) = &answer {
            self.log.write(&Event::HeartbeatRefused {
                t: now_us(),
                id: Some(id),
                token: token.get(),
                err: err.to_string(),
            });
        }
        answer
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let sent: Vec<HeldLease> = leases.clone();
        let answer = self.inner.heartbeat_batch(leases, ttl).await;
        let t = now_us();
        match &answer {
            Ok(answers) => {
                for (lease, entry) in sent.iter().zip(answers) {
                    if let Err(err) = entry {
                        self.log.write(&Event::HeartbeatRefused {
                            t,
                            id: Some(lease.id),
                            token: lease.token.get(),
                            err: err.to_string(),
                        });
                    }
                }
            }
            Err(err) => self.log.write(&Event::HeartbeatRefused {
                t,
                id: None,
                token: 0,
                err: err.to_string(),
            }),
        }
        answer
    }

    async fn complete(&self, id: JobId, token: LeaseToken, result: Option<Bytes>) -> Result<()> {
        let t0 = now_us();
        let answer = self.inner.complete(id, token, result).await;
        self.outcome(t0, Op::Complete, id, token, &answer);
        answer
    }

    async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        let sent: Vec<(JobId, LeaseToken)> = completions.iter().map(|c| (c.id, c.token)).collect();
        let t0 = now_us();
        let answer = self.inner.complete_batch(completions).await;
        match &answer {
            Ok(answers) => {
                for ((id, token), entry) in sent.iter().zip(answers) {
                    self.outcome(t0, Op::Complete, *id, *token, entry);
                }
            }
            Err(err) => {
                // The call failed as a whole: each entry may or may not have taken
                // effect, which is exactly what a refused entry with this error means
                // to the checker (not accepted as far as anyone was told).
                let t = now_us();
                for (id, token) in &sent {
                    self.log.write(&Event::Outcome {
                        t0,
                        t,
                        op: Op::Complete,
                        id: *id,
                        token: token.get(),
                        ok: false,
                        lease_lost: false,
                        err: Some(format!("the whole batch failed: {err}")),
                    });
                }
            }
        }
        answer
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> Result<JobState> {
        let t0 = now_us();
        let answer = self.inner.fail(id, token, error, retry).await;
        self.outcome(t0, Op::Fail, id, token, &answer);
        answer
    }

    async fn release(&self, id: JobId, token: LeaseToken) -> Result<()> {
        let t0 = now_us();
        let answer = self.inner.release(id, token).await;
        self.outcome(t0, Op::Release, id, token, &answer);
        answer
    }

    async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>> {
        let reclaimed = self
            .inner
            .reclaim(limit)
            .await
            .inspect_err(|err| self.failed("reclaim", err))?;
        let t = now_us();
        for job in &reclaimed {
            self.log.write(&Event::Reclaimed {
                t,
                id: job.id,
                state: job.state.to_string(),
            });
        }
        Ok(reclaimed)
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
        self.inner
            .wait_for_work(queues, timeout)
            .await
            .inspect_err(|err| self.failed("wait_for_work", err))
    }
}
