//! [`TracingLayer`]: one `tracing` span per store call that changes a job.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    async_trait, Backend, ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease,
    JobId, JobState, Layer, LayeredBackend, LeaseToken, NewJob, ReclaimedJob, Result, Retry,
    Timestamp,
};
use tracing::Instrument as _;

/// Wraps every store call that changes a job in a `jobs.store` span (at `DEBUG`) named
/// by its operation, with the job id or the batch size, and records a failed call's
/// error on the span's event. Reads (`get`, `list`, `stats`, …) pass through untouched.
///
/// Spans cost next to nothing while no subscriber listens at `DEBUG` for target
/// `durq::store`; add the layer with `store.layer(TracingLayer)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer;

impl Layer for TracingLayer {
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(Traced { inner })
    }
}

/// A backend seen through the [`TracingLayer`].
#[derive(Debug)]
struct Traced {
    inner: Arc<dyn Backend>,
}

/// Runs `call` inside `span`, and logs its failure there, so a subscriber sees which
/// call failed and why.
async fn within<T>(span: tracing::Span, call: impl Future<Output = Result<T>>) -> Result<T> {
    async move {
        let result = call.await;
        if let Err(err) = &result {
            tracing::debug!(target: "durq::store", error = %err, "store call failed");
        }
        result
    }
    .instrument(span)
    .await
}

/// Like [`within`] for a batch: also logs each refused entry with its job's id. The
/// ids are gathered only while a subscriber listens, so a batch costs nothing more
/// otherwise.
async fn within_batch<T>(
    span: tracing::Span,
    ids: Option<Vec<JobId>>,
    call: impl Future<Output = Result<Vec<Result<T>>>>,
) -> Result<Vec<Result<T>>> {
    async move {
        let result = call.await;
        match (&result, &ids) {
            (Err(err), _) => {
                tracing::debug!(target: "durq::store", error = %err, "store call failed");
            }
            (Ok(answers), Some(ids)) => {
                for (id, answer) in ids.iter().zip(answers) {
                    if let Err(err) = answer {
                        tracing::debug!(target: "durq::store", job = %id, error = %err, "store call failed");
                    }
                }
            }
            (Ok(_), None) => {}
        }
        result
    }
    .instrument(span)
    .await
}

/// The ids of a batch's jobs, when anyone listens for the spans.
fn ids_if_traced(ids: impl Iterator<Item = JobId>) -> Option<Vec<JobId>> {
    tracing::enabled!(target: "durq::store", tracing::Level::DEBUG).then(|| ids.collect())
}

macro_rules! span {
    ($op:literal $(, $field:ident = $value:expr)*) => {
        tracing::debug_span!(target: "durq::store", "jobs.store", op = $op $(, $field = $value)*)
    };
}

#[async_trait]
impl LayeredBackend for Traced {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let span = span!("enqueue", queue = job.queue.as_str());
        within(span, self.inner.enqueue(job, now)).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let span = span!("enqueue_batch", jobs = jobs.len());
        within(span, self.inner.enqueue_batch(jobs, now)).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        let span = span!("claim", limit = request.limit);
        within(span, self.inner.claim(request, now)).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        // A single `heartbeat` arrives as a batch of one: it gets the span of one job.
        let span = match leases.as_slice() {
            [one] => span!("heartbeat", job = tracing::field::display(one.id)),
            many => span!("heartbeat_batch", leases = many.len()),
        };
        let ids = ids_if_traced(leases.iter().map(|lease| lease.id));
        within_batch(span, ids, self.inner.heartbeat_batch(leases, ttl, now)).await
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        // A single `complete` arrives as a batch of one: it gets the span of one job.
        let span = match completions.as_slice() {
            [one] => span!("complete", job = tracing::field::display(one.id)),
            many => span!("complete_batch", jobs = many.len()),
        };
        let ids = ids_if_traced(completions.iter().map(|completion| completion.id));
        within_batch(span, ids, self.inner.complete_batch(completions, now)).await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let span = span!("fail", job = tracing::field::display(id));
        within(span, self.inner.fail(id, token, error, retry, now)).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let span = span!("release", job = tracing::field::display(id));
        within(span, self.inner.release(id, token, ready_at, now)).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        let span = span!("reclaim", limit = limit);
        within(span, self.inner.reclaim(limit, now)).await
    }

    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        let span = span!("cancel", job = tracing::field::display(id));
        within(span, async {
            self.inner.require_admin()?.cancel(id, now).await
        })
        .await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        let span = span!("retry", job = tracing::field::display(id));
        within(span, async {
            self.inner.require_admin()?.retry(id, now).await
        })
        .await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        let span = span!("purge", limit = limit);
        within(span, async {
            self.inner.require_admin()?.purge(limit, cutoff).await
        })
        .await
    }
}
