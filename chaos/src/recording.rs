//! A layer over the real backend that writes the history lines the checker needs:
//! every claimed job with its token, and every answer to complete, complete_batch,
//! fail and release.

use std::sync::Arc;
use std::time::Duration;

use durq::layers::{async_trait, Backend, Layer, LayeredBackend};
use durq::worker_calls::{
    ClaimRequest, ClaimedJob, Completion, Heartbeat, HeldLease, ReclaimedJob, Retry,
};
use durq::{Error, Job, JobId, JobState, LeaseToken, Result, Timestamp};

use crate::history::{now_us, Event, Log, Op};

/// The recording layer: add it to a store with `store.layer(RecordingLayer::new(log))`.
#[derive(Debug, Clone)]
pub struct RecordingLayer {
    log: Arc<Log>,
}

impl RecordingLayer {
    /// A layer writing to `log`.
    pub fn new(log: Arc<Log>) -> Self {
        RecordingLayer { log }
    }
}

impl Layer for RecordingLayer {
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(Recording {
            inner,
            log: Arc::clone(&self.log),
        })
    }
}

/// A backend seen through the [`RecordingLayer`]. It overrides only the calls it
/// records; every other call, the batched ones it does not record included, goes to
/// the backend's own implementation, so the batched versions are the ones that run
/// under faults.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Backend>,
    log: Arc<Log>,
}

impl Recording {
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
impl LayeredBackend for Recording {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        let claimed = self
            .inner
            .claim(request, now)
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

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let sent: Vec<HeldLease> = leases.clone();
        let answer = self.inner.heartbeat_batch(leases, ttl, now).await;
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

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        let sent: Vec<(JobId, LeaseToken)> = completions.iter().map(|c| (c.id, c.token)).collect();
        let t0 = now_us();
        let answer = self.inner.complete_batch(completions, now).await;
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
        now: Timestamp,
    ) -> Result<JobState> {
        let t0 = now_us();
        let answer = self.inner.fail(id, token, error, retry, now).await;
        self.outcome(t0, Op::Fail, id, token, &answer);
        answer
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let t0 = now_us();
        let answer = self.inner.release(id, token, ready_at, now).await;
        self.outcome(t0, Op::Release, id, token, &answer);
        answer
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        let reclaimed = self
            .inner
            .reclaim(limit, now)
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

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        self.inner
            .wait_for_work(queues, timeout)
            .await
            .inspect_err(|err| self.failed("wait_for_work", err))
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        self.inner
            .wait_for_ending(id, timeout)
            .await
            .inspect_err(|err| self.failed("wait_for_ending", err))
    }
}
