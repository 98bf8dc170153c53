//! A layer that makes every call to a store tied to its runtime on that runtime.
//!
//! A store tied to its runtime may open a connection from whichever task calls it (a
//! PostgreSQL pool does), and that connection is then driven by that task's runtime.
//! Opened from the handlers' runtime, which handlers that block their threads can
//! stall, it would later stall whatever call the pool hands it to, the lease keeper's
//! heartbeats included (seen once in CI). So the worker's claim loop, its reports and
//! its handlers (through `JobContext::store`) reach such a store through this layer,
//! which sends each call to the store's runtime as a task of its own and awaits it.
//! A store that needs no runtime is used as it is.
//!
//! It implements [`Backend`] and each capability trait itself rather than
//! `LayeredBackend`, which would forward whatever it forgets on the caller's runtime:
//! here an operation added to any of those traits fails to build until it hops too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use durq_core::{
    async_trait, Admin, Attempt, Backend, Capabilities, ClaimRequest, ClaimedJob, Completion,
    Enqueued, Error, EventCursor, EventPage, Events, FlowControl, FlowStatus, Heartbeat, HeldLease,
    Inspect, Job, JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, Pause, QueueLimits,
    QueueOverview, QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate, Schedules, StepLog,
    Steps, Store, StoreSettings, StoredSchedule, StoredWorker, Timestamp, WorkerRegistry,
};
use tokio::runtime::Handle;

use super::AbortOnDrop;

/// `store`, reached from anywhere on the runtime it is tied to (see the module's
/// header); `store` itself when it needs no runtime.
pub(crate) fn on_store_runtime(store: Store, runtime: Handle) -> Store {
    if !store.capabilities().tied_to_runtime {
        return store;
    }
    store.layer(move |inner: Arc<dyn Backend>| -> Arc<dyn Backend> {
        Arc::new(OnStoreRuntime {
            inner,
            runtime: runtime.clone(),
        })
    })
}

#[derive(Debug)]
struct OnStoreRuntime {
    inner: Arc<dyn Backend>,
    runtime: Handle,
}

impl OnStoreRuntime {
    async fn hop<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnOnce(Arc<dyn Backend>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        // Aborted when the caller stops waiting (a `select!` took another branch), as
        // dropping the call in place would have cancelled it.
        let mut task = AbortOnDrop(self.runtime.spawn(call(Arc::clone(&self.inner))));
        match (&mut task.0).await {
            Ok(answer) => answer,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(Error::Unavailable {
                message: "the store's runtime shut down".to_owned(),
                source: None,
            }),
        }
    }
}

#[async_trait]
impl Backend for OnStoreRuntime {
    fn settings(&self) -> &StoreSettings {
        self.inner.settings()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        // Rebuilt by the `Store` that added this layer, around the reopened backend.
        Ok(None)
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        self.hop(move |b| async move { b.enqueue(job, now).await })
            .await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        self.hop(move |b| async move { b.enqueue_batch(jobs, now).await })
            .await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.hop(move |b| async move { b.get(id).await }).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.hop(move |b| async move { b.payload(id).await }).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.hop(move |b| async move { b.claim(request, now).await })
            .await
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.hop(move |b| async move { b.heartbeat(id, token, ttl, now).await })
            .await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        self.hop(move |b| async move { b.heartbeat_batch(leases, ttl, now).await })
            .await
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.hop(move |b| async move { b.complete(id, token, result, now).await })
            .await
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        self.hop(move |b| async move { b.complete_batch(completions, now).await })
            .await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let error = error.to_owned();
        self.hop(move |b| async move { b.fail(id, token, &error, retry, now).await })
            .await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.hop(move |b| async move { b.release(id, token, ready_at, now).await })
            .await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        self.hop(move |b| async move { b.reclaim(limit, now).await })
            .await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        let queues = queues.to_vec();
        self.hop(move |b| async move { b.wait_for_work(&queues, timeout).await })
            .await
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        self.hop(move |b| async move { b.wait_for_ending(id, timeout).await })
            .await
    }

    fn as_inspect(&self) -> Option<&dyn Inspect> {
        self.inner.as_inspect().map(|_| self as &dyn Inspect)
    }

    fn as_admin(&self) -> Option<&dyn Admin> {
        self.inner.as_admin().map(|_| self as &dyn Admin)
    }

    fn as_pause(&self) -> Option<&dyn Pause> {
        self.inner.as_pause().map(|_| self as &dyn Pause)
    }

    fn as_schedules(&self) -> Option<&dyn Schedules> {
        self.inner.as_schedules().map(|_| self as &dyn Schedules)
    }

    fn as_worker_registry(&self) -> Option<&dyn WorkerRegistry> {
        self.inner
            .as_worker_registry()
            .map(|_| self as &dyn WorkerRegistry)
    }

    fn as_steps(&self) -> Option<&dyn Steps> {
        self.inner.as_steps().map(|_| self as &dyn Steps)
    }

    fn as_events(&self) -> Option<&dyn Events> {
        self.inner.as_events().map(|_| self as &dyn Events)
    }

    fn as_flow_control(&self) -> Option<&dyn FlowControl> {
        self.inner
            .as_flow_control()
            .map(|_| self as &dyn FlowControl)
    }
}

#[async_trait]
impl FlowControl for OnStoreRuntime {
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        let queue = queue.to_owned();
        self.hop(move |b| async move { b.require_flow_control()?.set_limits(&queue, limits).await })
            .await
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.hop(move |b| async move { b.require_flow_control()?.limits().await })
            .await
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        let queue = queue.to_owned();
        self.hop(move |b| async move { b.require_flow_control()?.flow_status(&queue, now).await })
            .await
    }
}

#[async_trait]
impl Steps for OnStoreRuntime {
    async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.hop(move |b| async move { b.require_steps()?.steps(id).await })
            .await
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let name = name.to_owned();
        self.hop(move |b| async move {
            b.require_steps()?
                .save_step(id, token, &name, output, now)
                .await
        })
        .await
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        let step = step.to_owned();
        self.hop(move |b| async move {
            b.require_steps()?
                .retry_from(id, &step, generation, now)
                .await
        })
        .await
    }
}

#[async_trait]
impl Events for OnStoreRuntime {
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        self.hop(move |b| async move { b.require_events()?.events(after, limit).await })
            .await
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let name = name.to_owned();
        self.hop(
            move |b| async move { b.require_events()?.emit(id, token, &name, data, now).await },
        )
        .await
    }

    async fn trim_events(&self, keep: u64) -> Result<u64> {
        self.hop(move |b| async move { b.require_events()?.trim_events(keep).await })
            .await
    }
}

#[async_trait]
impl Inspect for OnStoreRuntime {
    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        self.hop(move |b| async move { b.require_inspect()?.children(parent).await })
            .await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.hop(move |b| async move { b.require_inspect()?.attempts(id).await })
            .await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let queue = queue.to_owned();
        self.hop(move |b| async move { b.require_inspect()?.stats(&queue, now).await })
            .await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        self.hop(move |b| async move { b.require_inspect()?.queues(now).await })
            .await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.hop(move |b| async move { b.require_inspect()?.list(query).await })
            .await
    }
}

#[async_trait]
impl Admin for OnStoreRuntime {
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        self.hop(move |b| async move { b.require_admin()?.cancel(id, now).await })
            .await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        self.hop(move |b| async move { b.require_admin()?.retry(id, now).await })
            .await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        self.hop(move |b| async move { b.require_admin()?.purge(limit, cutoff).await })
            .await
    }
}

#[async_trait]
impl Pause for OnStoreRuntime {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        let queue = queue.to_owned();
        self.hop(move |b| async move { b.require_pause()?.set_paused(&queue, paused).await })
            .await
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        self.hop(move |b| async move { b.require_pause()?.paused_queues().await })
            .await
    }
}

#[async_trait]
impl Schedules for OnStoreRuntime {
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        let (name, spec) = (name.to_owned(), spec.to_owned());
        self.hop(
            move |b| async move { b.require_schedules()?.put_schedule(&name, &spec, now).await },
        )
        .await
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        self.hop(move |b| async move { b.require_schedules()?.schedules().await })
            .await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        let name = name.to_owned();
        self.hop(
            move |b| async move { b.require_schedules()?.update_schedule(&name, update).await },
        )
        .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        self.hop(move |b| async move { b.require_schedules()?.delete_schedule(&name).await })
            .await
    }
}

#[async_trait]
impl WorkerRegistry for OnStoreRuntime {
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        let (id, spec) = (id.to_owned(), spec.to_owned());
        self.hop(move |b| async move {
            b.require_worker_registry()?
                .put_worker(&id, &spec, in_flight, now)
                .await
        })
        .await
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        let id = id.to_owned();
        self.hop(move |b| async move {
            b.require_worker_registry()?
                .touch_worker(&id, in_flight, now)
                .await
        })
        .await
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        let id = id.to_owned();
        self.hop(move |b| async move { b.require_worker_registry()?.delete_worker(&id).await })
            .await
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        self.hop(move |b| async move { b.require_worker_registry()?.workers().await })
            .await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        self.hop(move |b| async move { b.require_worker_registry()?.reap_workers(cutoff).await })
            .await
    }
}
