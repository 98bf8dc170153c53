//! A thin producer-side handle that counts what it enqueues.

use std::collections::HashMap;
use std::sync::Arc;

use jobs_core::{Enqueued, NewJob, Result, Store};

use crate::telemetry::JOBS_ENQUEUED;

/// Enqueues jobs into a store and counts the new ones in the `jobs_enqueued` metric.
///
/// Every other operation is on the store itself ([`Client::store`]).
#[derive(Debug, Clone)]
pub struct Client {
    store: Arc<dyn Store>,
}

impl Client {
    /// A client over `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Client { store }
    }

    /// The store, for reads and operator actions.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Enqueues one job (CONTRACT E1–E7).
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        let queue = job.queue.clone();
        let enqueued = self.store.enqueue(job).await?;
        if enqueued.created {
            metrics::counter!(JOBS_ENQUEUED, "queue" => queue).increment(1);
        }
        Ok(enqueued)
    }

    /// Enqueues a job on `queue` whose payload is `value` as JSON.
    pub async fn enqueue_json<T>(&self, queue: &str, value: &T) -> Result<Enqueued>
    where
        T: serde::Serialize + ?Sized,
    {
        self.enqueue(NewJob::new(queue).json(value)?).await
    }

    /// Enqueues many jobs in one call, answered in order (CONTRACT E9): far fewer round
    /// trips (and fsyncs) than one by one. A batch holding an invalid job is refused
    /// whole and writes nothing.
    pub async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let queues: Vec<String> = jobs.iter().map(|job| job.queue.clone()).collect();
        let enqueued = self.store.enqueue_batch(jobs).await?;
        let mut created: HashMap<String, u64> = HashMap::new();
        for (queue, result) in queues.into_iter().zip(&enqueued) {
            if result.created {
                *created.entry(queue).or_default() += 1;
            }
        }
        for (queue, count) in created {
            metrics::counter!(JOBS_ENQUEUED, "queue" => queue).increment(count);
        }
        Ok(enqueued)
    }
}
