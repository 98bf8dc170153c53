//! [`PostgresBackend`]: the `Backend` of one namespace of a PostgreSQL schema and its
//! capability traits. The type, its public methods and its trait impls live here, each
//! a short call into `store/`, where each operation runs its statement, split by job;
//! opening a backend is in `config.rs` and `pool.rs`, the calls inside the caller's
//! transaction in `transaction.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use durq_core::batch::Batcher;
use durq_core::{
    async_trait, Attempt, Backend, Capabilities, ClaimRequest, ClaimedJob, Enqueued, Heartbeat,
    HeldLease, Job, JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueOverview,
    QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate, StoreSettings, StoredSchedule,
    StoredWorker, Timestamp,
};
use durq_core::{
    Admin, EventCursor, EventPage, Events, FlowControl, FlowStatus, Inspect, Pause, QueueLimits,
    Schedules, StepLog, Steps, WorkerRegistry,
};
use sqlx::PgPool;

use crate::config::PostgresConfig;
use crate::conn::Shared;
use crate::pool::PostgresPool;
use crate::store::enqueue::{enqueue_all, Enqueue, Enqueues};
use crate::store::lease::Completions;
use crate::store::limits::{self, LimitedClaims, LimitedQueues};
use crate::store::{admin, claim, events, lease, reads, schedules, steps, sweep, workers};

/// The jobs of one namespace of a PostgreSQL schema: a [`durq_core::Backend`], used
/// through a [`durq_core::Store`] handle (`Store::new(store)`).
///
/// Cloning is cheap and shares everything. See the crate documentation for the
/// schema and the statements behind each operation.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) settings: StoreSettings,
    /// Per queue, the wake-up counter seen when this store last looked for work there,
    /// so a notice that arrives between an empty claim and `wait_for_work` is not lost.
    pub(crate) seen: Mutex<HashMap<String, u64>>,
    pub(crate) enqueues: Batcher<Enqueues>,
    pub(crate) completions: Batcher<Completions>,
    /// Which queues had limits when this handle last looked (CONTRACT K1–K5).
    pub(crate) limited: LimitedQueues,
    /// This handle's limited claims, answered together ([`LimitedClaims`]).
    pub(crate) limited_claims: Batcher<LimitedClaims>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("schema", &self.inner.shared.schema)
            .field("namespace", &self.inner.settings.namespace)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects to `url`, migrates the default schema, and opens `settings.namespace`.
    ///
    /// ```no_run
    /// use durq_core::{NewJob, Store, StoreSettings};
    /// use durq_postgres::PostgresBackend;
    /// # async fn example() -> durq_core::Result<()> {
    /// let store = Store::new(
    ///     PostgresBackend::connect(
    ///         "postgres://postgres@127.0.0.1:5432/app",
    ///         StoreSettings::default().namespace("billing"),
    ///     )
    ///     .await?,
    /// );
    /// let job = store.enqueue(NewJob::new("invoices").payload(&b"{}"[..])).await?;
    /// # let _ = job;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self> {
        PostgresConfig::new(url)?.open(settings).await
    }

    /// Uses an existing pool with the default schema.
    pub async fn from_pool(pool: PgPool, settings: StoreSettings) -> Result<Self> {
        PostgresPool::from_pool(pool, crate::DEFAULT_SCHEMA)
            .await?
            .backend(settings)
    }

    pub(crate) fn new(shared: Arc<Shared>, settings: StoreSettings) -> Self {
        PostgresBackend {
            inner: Arc::new_cyclic(|inner| Inner {
                seen: Mutex::default(),
                limited: LimitedQueues::default(),
                limited_claims: Batcher::new(LimitedClaims::new(inner.clone())),
                enqueues: Batcher::new(Enqueues {
                    shared: Arc::clone(&shared),
                    settings: settings.clone(),
                }),
                completions: Batcher::new(Completions {
                    shared: Arc::clone(&shared),
                    settings: settings.clone(),
                }),
                shared,
                settings,
            }),
        }
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.shared.pool
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn settings(&self) -> &StoreSettings {
        &self.inner.settings
    }

    fn capabilities(&self) -> Capabilities {
        // Tied to its runtime (the default): the pool's sockets, the batching tasks
        // and the wake-up listener are driven by the runtime the store is used on.
        Capabilities::default().dependencies(true)
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        let shared = crate::pool::reopened(&self.inner.shared);
        Ok(Some(Arc::new(PostgresBackend::new(
            shared,
            self.inner.settings.clone(),
        ))))
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        if !job.depends_on.is_empty() {
            // A job that waits for jobs locks them and writes its edges in a
            // transaction of its own, which a gathered statement has no room for.
            let mut answers =
                enqueue_all(&self.inner.shared, &self.inner.settings, &[job], now).await?;
            return answers
                .pop()
                .ok_or_else(|| durq_core::Error::corrupt("enqueue", "missing answer"));
        }
        self.inner.enqueues.call(Enqueue { job, now }).await?
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        enqueue_all(&self.inner.shared, &self.inner.settings, &jobs, now).await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        reads::get(self, id).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        reads::payload(self, id).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        claim::claim(self, request, now).await
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        lease::heartbeat(self, id, token, ttl, now).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        lease::heartbeat_batch(self, leases, ttl, now).await
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        lease::complete(self, id, token, result, now).await
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        lease::fail(self, id, token, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        lease::release(self, id, token, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        sweep::reclaim(self, limit, now).await
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        reads::wait_for_ending(self, id, timeout).await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        claim::wait_for_work(self, queues, timeout).await
    }

    fn as_inspect(&self) -> Option<&dyn Inspect> {
        Some(self)
    }

    fn as_admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn as_pause(&self) -> Option<&dyn Pause> {
        Some(self)
    }

    fn as_schedules(&self) -> Option<&dyn Schedules> {
        Some(self)
    }

    fn as_worker_registry(&self) -> Option<&dyn WorkerRegistry> {
        Some(self)
    }

    fn as_flow_control(&self) -> Option<&dyn FlowControl> {
        Some(self)
    }

    fn as_steps(&self) -> Option<&dyn Steps> {
        Some(self)
    }

    fn as_events(&self) -> Option<&dyn Events> {
        Some(self)
    }
}

#[async_trait]
impl Events for PostgresBackend {
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        events::events(self, after, limit).await
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        events::emit(self, id, token, name, data, now).await
    }

    async fn trim_events(&self, keep: u64) -> Result<u64> {
        events::trim_events(self, keep).await
    }
}

#[async_trait]
impl Steps for PostgresBackend {
    async fn steps(&self, id: JobId) -> Result<StepLog> {
        steps::steps(self, id).await
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        steps::save_step(self, id, token, name, output, now).await
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        steps::retry_from(self, id, step, generation, now).await
    }
}

#[async_trait]
impl FlowControl for PostgresBackend {
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        limits::set_limits(self, queue, limits).await
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        limits::all_limits(self).await
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        limits::flow_status(self, queue, now).await
    }
}

#[async_trait]
impl Inspect for PostgresBackend {
    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        reads::children(self, parent).await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        reads::attempts(self, id).await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        reads::stats(self, queue, now).await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        reads::queues(self, now).await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        reads::list(self, query).await
    }
}

#[async_trait]
impl Admin for PostgresBackend {
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        admin::cancel(self, id, now).await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        admin::retry(self, id, now).await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        sweep::purge(self, limit, cutoff).await
    }
}

#[async_trait]
impl Pause for PostgresBackend {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        admin::set_paused(self, queue, paused).await
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        admin::paused_queues(self).await
    }
}

#[async_trait]
impl Schedules for PostgresBackend {
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        schedules::put_schedule(self, name, spec, now).await
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        schedules::schedules(self).await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        schedules::update_schedule(self, name, update).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        schedules::delete_schedule(self, name).await
    }
}

#[async_trait]
impl WorkerRegistry for PostgresBackend {
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        workers::put_worker(self, id, spec, in_flight, now).await
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        workers::touch_worker(self, id, in_flight, now).await
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        workers::delete_worker(self, id).await
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        workers::workers(self).await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        workers::reap_workers(self, cutoff).await
    }
}
