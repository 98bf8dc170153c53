//! Layers: a backend seen through another ([`Layer`]), and [`LayeredBackend`], which
//! forwards every call a layer does not change to the backend it wraps.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::attempts::Attempt;
use crate::error::Result;
use crate::id::JobId;
use crate::model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState,
    LeaseToken, ListPage, ListQuery, NewJob, QueueOverview, QueueStats, ReclaimedJob, Retry,
    StoreSettings,
};
use crate::schedule::{ScheduleUpdate, StoredSchedule};
use crate::time::Timestamp;
use crate::workers::StoredWorker;

use crate::backend::{Backend, Capabilities};
use crate::capability::{
    Admin, Capability, Events, FlowControl, Inspect, Pause, Schedules, Steps, WorkerRegistry,
};
use crate::events::{EventCursor, EventPage};
use crate::limits::{FlowStatus, QueueLimits};
use crate::steps::StepLog;

/// Wraps a backend in another: metrics, logging, fault injection, a tenant guard.
/// Added to a handle with [`Store::layer`](crate::Store::layer); the last layer added
/// is the outermost.
pub trait Layer {
    /// The backend `inner` seen through this layer.
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend>;
}

impl<F> Layer for F
where
    F: Fn(Arc<dyn Backend>) -> Arc<dyn Backend>,
{
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        self(inner)
    }
}

impl<L: Layer + ?Sized> Layer for Arc<L> {
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        (**self).layer(inner)
    }
}

/// A backend that wraps another and forwards every call it does not override.
///
/// One flat list of every operation, the core's and each capability's: a layer
/// overrides any of them by name. It declares the capabilities of the backend it wraps,
/// no more and no fewer, and sees every call of each ([`Backend::as_admin`] and the
/// other accessors hand out the layer itself).
///
/// Every type implementing it is a [`Backend`]; a layer writes [`inner`] and the
/// methods it changes, nothing else. Completions and heartbeats reach a layer only as
/// batches: a single `complete` or `heartbeat` arrives in [`complete_batch`] or
/// [`heartbeat_batch`] as a batch of one, so a layer that overrides those sees every
/// completion and heartbeat (the worker's batched ones included) and keeps the
/// batching of the backend beneath it:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use durq_core::{async_trait, Backend, ClaimRequest, ClaimedJob, Completion, LayeredBackend, Result, Timestamp};
///
/// /// Logs claims, counts completions, forwards everything.
/// #[derive(Debug)]
/// struct Count { inner: Arc<dyn Backend>, completed: AtomicU64 }
///
/// #[async_trait]
/// impl LayeredBackend for Count {
///     fn inner(&self) -> &dyn Backend { &*self.inner }
///
///     async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
///         println!("claim of {:?}", request.queues);
///         self.inner.claim(request, now).await
///     }
///
///     async fn complete_batch(&self, done: Vec<Completion>, now: Timestamp) -> Result<Vec<Result<()>>> {
///         self.completed.fetch_add(done.len() as u64, Ordering::Relaxed);
///         self.inner.complete_batch(done, now).await
///     }
/// }
/// ```
///
/// [`inner`]: LayeredBackend::inner
/// [`complete_batch`]: LayeredBackend::complete_batch
/// [`heartbeat_batch`]: LayeredBackend::heartbeat_batch
#[async_trait]
#[allow(missing_docs)] // Each method is the `Backend` method of the same name.
pub trait LayeredBackend: Send + Sync + fmt::Debug {
    /// The backend this layer wraps.
    fn inner(&self) -> &dyn Backend;

    fn settings(&self) -> &StoreSettings {
        self.inner().settings()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// Whether this layer hides `capability` of the backend it wraps, so that the
    /// handle answers [`Error::Unsupported`](crate::Error::Unsupported) for it: a
    /// read-only layer hides [`Capability::Admin`], say. By default a layer hides
    /// nothing.
    fn hides(&self, capability: Capability) -> bool {
        let _ = capability;
        false
    }

    /// A layer cannot be rebuilt around a reopened backend from here: by default it
    /// answers `None`, so a worker keeps its leases through this layer where the
    /// backend was opened. A [`Store`](crate::Store) reopens the backend beneath the
    /// layers it added itself and adds them again.
    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(None)
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        self.inner().enqueue(job, now).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        self.inner().enqueue_batch(jobs, now).await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.inner().get(id).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.inner().payload(id).await
    }

    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        self.inner().require_inspect()?.children(parent).await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.inner().require_inspect()?.attempts(id).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.inner().claim(request, now).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        self.inner().heartbeat_batch(leases, ttl, now).await
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        self.inner().complete_batch(completions, now).await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        self.inner().fail(id, token, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.inner().release(id, token, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        self.inner().reclaim(limit, now).await
    }

    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        self.inner().require_admin()?.cancel(id, now).await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        self.inner().require_admin()?.retry(id, now).await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        self.inner().require_inspect()?.stats(queue, now).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.inner()
            .require_pause()?
            .set_paused(queue, paused)
            .await
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        self.inner().require_pause()?.paused_queues().await
    }

    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        self.inner()
            .require_flow_control()?
            .set_limits(queue, limits)
            .await
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.inner().require_flow_control()?.limits().await
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        self.inner()
            .require_flow_control()?
            .flow_status(queue, now)
            .await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        self.inner().require_inspect()?.queues(now).await
    }

    async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.inner().require_steps()?.steps(id).await
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.inner()
            .require_steps()?
            .save_step(id, token, name, output, now)
            .await
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        self.inner()
            .require_steps()?
            .retry_from(id, step, generation, now)
            .await
    }

    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        self.inner().require_events()?.events(after, limit).await
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.inner()
            .require_events()?
            .emit(id, token, name, data, now)
            .await
    }

    async fn trim_events(&self, keep: u64) -> Result<u64> {
        self.inner().require_events()?.trim_events(keep).await
    }

    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        self.inner()
            .require_worker_registry()?
            .put_worker(id, spec, in_flight, now)
            .await
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        self.inner()
            .require_worker_registry()?
            .touch_worker(id, in_flight, now)
            .await
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        self.inner()
            .require_worker_registry()?
            .delete_worker(id)
            .await
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        self.inner().require_worker_registry()?.workers().await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        self.inner()
            .require_worker_registry()?
            .reap_workers(cutoff)
            .await
    }

    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        self.inner()
            .require_schedules()?
            .put_schedule(name, spec, now)
            .await
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        self.inner().require_schedules()?.schedules().await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        self.inner()
            .require_schedules()?
            .update_schedule(name, update)
            .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        self.inner()
            .require_schedules()?
            .delete_schedule(name)
            .await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.inner().require_inspect()?.list(query).await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        self.inner().require_admin()?.purge(limit, cutoff).await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        self.inner().wait_for_work(queues, timeout).await
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        self.inner().wait_for_ending(id, timeout).await
    }
}

/// The boxed future every [`Backend`] method returns (what `async_trait` expands to).
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

// Written without `async_trait` so a layer's call costs the layer's own future and no
// second box around it: each method hands back the future `LayeredBackend` made.
impl<L: LayeredBackend> Backend for L {
    fn settings(&self) -> &StoreSettings {
        LayeredBackend::settings(self)
    }

    fn capabilities(&self) -> Capabilities {
        LayeredBackend::capabilities(self)
    }

    fn reopen<'a, 'b>(&'a self) -> BoxFuture<'b, Result<Option<Arc<dyn Backend>>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::reopen(self)
    }

    fn enqueue<'a, 'b>(&'a self, job: NewJob, now: Timestamp) -> BoxFuture<'b, Result<Enqueued>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::enqueue(self, job, now)
    }

    fn enqueue_batch<'a, 'b>(
        &'a self,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Vec<Enqueued>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::enqueue_batch(self, jobs, now)
    }

    fn get<'a, 'b>(&'a self, id: JobId) -> BoxFuture<'b, Result<Job>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::get(self, id)
    }

    fn payload<'a, 'b>(&'a self, id: JobId) -> BoxFuture<'b, Result<Bytes>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::payload(self, id)
    }

    fn claim<'a, 'b>(
        &'a self,
        request: ClaimRequest,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Vec<ClaimedJob>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::claim(self, request, now)
    }

    fn heartbeat<'a, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Heartbeat>>
    where
        'a: 'b,
        Self: 'b,
    {
        // A batch of one: a layer sees every heartbeat in `heartbeat_batch`.
        Box::pin(async move {
            let answers =
                LayeredBackend::heartbeat_batch(self, vec![HeldLease::new(id, token)], ttl, now)
                    .await?;
            only_answer("heartbeat", answers)
        })
    }

    fn heartbeat_batch<'a, 'b>(
        &'a self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Vec<Result<Heartbeat>>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::heartbeat_batch(self, leases, ttl, now)
    }

    fn complete<'a, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        Self: 'b,
    {
        // A batch of one: a layer sees every completion in `complete_batch`.
        Box::pin(async move {
            let completion = Completion { id, token, result };
            let answers = LayeredBackend::complete_batch(self, vec![completion], now).await?;
            only_answer("complete", answers)
        })
    }

    fn complete_batch<'a, 'b>(
        &'a self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Vec<Result<()>>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::complete_batch(self, completions, now)
    }

    fn fail<'a, 'e, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        error: &'e str,
        retry: Retry,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<JobState>>
    where
        'a: 'b,
        'e: 'b,
        Self: 'b,
    {
        LayeredBackend::fail(self, id, token, error, retry, now)
    }

    fn release<'a, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::release(self, id, token, ready_at, now)
    }

    fn reclaim<'a, 'b>(
        &'a self,
        limit: usize,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<Vec<ReclaimedJob>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::reclaim(self, limit, now)
    }

    fn wait_for_work<'a, 'q, 'b>(
        &'a self,
        queues: &'q [String],
        timeout: Duration,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'q: 'b,
        Self: 'b,
    {
        LayeredBackend::wait_for_work(self, queues, timeout)
    }

    fn wait_for_ending<'a, 'b>(
        &'a self,
        id: JobId,
        timeout: Duration,
    ) -> BoxFuture<'b, Result<Option<Job>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::wait_for_ending(self, id, timeout)
    }

    fn as_inspect(&self) -> Option<&dyn Inspect> {
        if self.hides(Capability::Inspect) {
            return None;
        }
        self.inner().as_inspect().map(|_| self as &dyn Inspect)
    }

    fn as_admin(&self) -> Option<&dyn Admin> {
        if self.hides(Capability::Admin) {
            return None;
        }
        self.inner().as_admin().map(|_| self as &dyn Admin)
    }

    fn as_pause(&self) -> Option<&dyn Pause> {
        if self.hides(Capability::Pause) {
            return None;
        }
        self.inner().as_pause().map(|_| self as &dyn Pause)
    }

    fn as_schedules(&self) -> Option<&dyn Schedules> {
        if self.hides(Capability::Schedules) {
            return None;
        }
        self.inner().as_schedules().map(|_| self as &dyn Schedules)
    }

    fn as_worker_registry(&self) -> Option<&dyn WorkerRegistry> {
        if self.hides(Capability::WorkerRegistry) {
            return None;
        }
        self.inner()
            .as_worker_registry()
            .map(|_| self as &dyn WorkerRegistry)
    }

    fn as_flow_control(&self) -> Option<&dyn FlowControl> {
        if self.hides(Capability::FlowControl) {
            return None;
        }
        self.inner()
            .as_flow_control()
            .map(|_| self as &dyn FlowControl)
    }

    fn as_steps(&self) -> Option<&dyn Steps> {
        if self.hides(Capability::Steps) {
            return None;
        }
        self.inner().as_steps().map(|_| self as &dyn Steps)
    }

    fn as_events(&self) -> Option<&dyn Events> {
        if self.hides(Capability::Events) {
            return None;
        }
        self.inner().as_events().map(|_| self as &dyn Events)
    }
}

impl<L: LayeredBackend> Inspect for L {
    fn children<'a, 'b>(&'a self, parent: JobId) -> BoxFuture<'b, Result<Vec<Job>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::children(self, parent)
    }

    fn attempts<'a, 'b>(&'a self, id: JobId) -> BoxFuture<'b, Result<Vec<Attempt>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::attempts(self, id)
    }

    fn stats<'a, 'q, 'b>(
        &'a self,
        queue: &'q str,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<QueueStats>>
    where
        'a: 'b,
        'q: 'b,
        Self: 'b,
    {
        LayeredBackend::stats(self, queue, now)
    }

    fn queues<'a, 'b>(&'a self, now: Timestamp) -> BoxFuture<'b, Result<Vec<QueueOverview>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::queues(self, now)
    }

    fn list<'a, 'b>(&'a self, query: ListQuery) -> BoxFuture<'b, Result<ListPage>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::list(self, query)
    }
}

impl<L: LayeredBackend> Admin for L {
    fn cancel<'a, 'b>(&'a self, id: JobId, now: Timestamp) -> BoxFuture<'b, Result<JobState>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::cancel(self, id, now)
    }

    fn retry<'a, 'b>(&'a self, id: JobId, now: Timestamp) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::retry(self, id, now)
    }

    fn purge<'a, 'b>(&'a self, limit: usize, cutoff: Timestamp) -> BoxFuture<'b, Result<u64>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::purge(self, limit, cutoff)
    }
}

impl<L: LayeredBackend> Pause for L {
    fn set_paused<'a, 'q, 'b>(&'a self, queue: &'q str, paused: bool) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'q: 'b,
        Self: 'b,
    {
        LayeredBackend::set_paused(self, queue, paused)
    }

    fn paused_queues<'a, 'b>(&'a self) -> BoxFuture<'b, Result<Vec<String>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::paused_queues(self)
    }
}

impl<L: LayeredBackend> FlowControl for L {
    fn set_limits<'a, 'q, 'b>(
        &'a self,
        queue: &'q str,
        limits: QueueLimits,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'q: 'b,
        Self: 'b,
    {
        LayeredBackend::set_limits(self, queue, limits)
    }

    fn limits<'a, 'b>(&'a self) -> BoxFuture<'b, Result<Vec<(String, QueueLimits)>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::limits(self)
    }

    fn flow_status<'a, 'q, 'b>(
        &'a self,
        queue: &'q str,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<FlowStatus>>
    where
        'a: 'b,
        'q: 'b,
        Self: 'b,
    {
        LayeredBackend::flow_status(self, queue, now)
    }
}

impl<L: LayeredBackend> Steps for L {
    fn steps<'a, 'b>(&'a self, id: JobId) -> BoxFuture<'b, Result<StepLog>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::steps(self, id)
    }

    fn save_step<'a, 'n, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        name: &'n str,
        output: Bytes,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'n: 'b,
        Self: 'b,
    {
        LayeredBackend::save_step(self, id, token, name, output, now)
    }

    fn retry_from<'a, 's, 'b>(
        &'a self,
        id: JobId,
        step: &'s str,
        generation: u64,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        's: 'b,
        Self: 'b,
    {
        LayeredBackend::retry_from(self, id, step, generation, now)
    }
}

impl<L: LayeredBackend> Events for L {
    fn events<'a, 'b>(
        &'a self,
        after: EventCursor,
        limit: usize,
    ) -> BoxFuture<'b, Result<EventPage>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::events(self, after, limit)
    }

    fn emit<'a, 'n, 'b>(
        &'a self,
        id: JobId,
        token: LeaseToken,
        name: &'n str,
        data: Bytes,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'n: 'b,
        Self: 'b,
    {
        LayeredBackend::emit(self, id, token, name, data, now)
    }

    fn trim_events<'a, 'b>(&'a self, keep: u64) -> BoxFuture<'b, Result<u64>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::trim_events(self, keep)
    }
}

impl<L: LayeredBackend> Schedules for L {
    fn put_schedule<'a, 'n, 's, 'b>(
        &'a self,
        name: &'n str,
        spec: &'s str,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'n: 'b,
        's: 'b,
        Self: 'b,
    {
        LayeredBackend::put_schedule(self, name, spec, now)
    }

    fn schedules<'a, 'b>(&'a self) -> BoxFuture<'b, Result<Vec<StoredSchedule>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::schedules(self)
    }

    fn update_schedule<'a, 'n, 'b>(
        &'a self,
        name: &'n str,
        update: ScheduleUpdate,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'n: 'b,
        Self: 'b,
    {
        LayeredBackend::update_schedule(self, name, update)
    }

    fn delete_schedule<'a, 'n, 'b>(&'a self, name: &'n str) -> BoxFuture<'b, Result<bool>>
    where
        'a: 'b,
        'n: 'b,
        Self: 'b,
    {
        LayeredBackend::delete_schedule(self, name)
    }
}

impl<L: LayeredBackend> WorkerRegistry for L {
    fn put_worker<'a, 'i, 's, 'b>(
        &'a self,
        id: &'i str,
        spec: &'s str,
        in_flight: u32,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<()>>
    where
        'a: 'b,
        'i: 'b,
        's: 'b,
        Self: 'b,
    {
        LayeredBackend::put_worker(self, id, spec, in_flight, now)
    }

    fn touch_worker<'a, 'i, 'b>(
        &'a self,
        id: &'i str,
        in_flight: u32,
        now: Timestamp,
    ) -> BoxFuture<'b, Result<bool>>
    where
        'a: 'b,
        'i: 'b,
        Self: 'b,
    {
        LayeredBackend::touch_worker(self, id, in_flight, now)
    }

    fn delete_worker<'a, 'i, 'b>(&'a self, id: &'i str) -> BoxFuture<'b, Result<bool>>
    where
        'a: 'b,
        'i: 'b,
        Self: 'b,
    {
        LayeredBackend::delete_worker(self, id)
    }

    fn workers<'a, 'b>(&'a self) -> BoxFuture<'b, Result<Vec<StoredWorker>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::workers(self)
    }

    fn reap_workers<'a, 'b>(&'a self, cutoff: Timestamp) -> BoxFuture<'b, Result<Vec<String>>>
    where
        'a: 'b,
        Self: 'b,
    {
        LayeredBackend::reap_workers(self, cutoff)
    }
}

/// The one answer of a batch of one; a batch that answered nothing is a backend error.
fn only_answer<T>(call: &str, mut answers: Vec<Result<T>>) -> Result<T> {
    match answers.pop() {
        Some(answer) if answers.is_empty() => answer,
        _ => Err(crate::error::Error::backend(
            call,
            "a batch of one was not answered with one entry",
        )),
    }
}
