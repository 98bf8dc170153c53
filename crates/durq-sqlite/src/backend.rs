//! [`SqliteBackend`]: the `Backend` of one namespace in one file and its capability
//! traits. Writes go to the engine's writer thread, reads to its readers (`engine.rs`);
//! what each operation does to the file is in `store/`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use durq_core::ending::Armed;
use durq_core::{
    async_trait, validate, Attempt, Backend, Bytes, Capabilities, ClaimRequest, ClaimedJob,
    Completion, Enqueued, Error, FlowControl, FlowStatus, Heartbeat, HeldLease, Job, JobId,
    JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueLimits, QueueOverview, QueueStats,
    ReclaimedJob, Result, Retry, ScheduleUpdate, StepLog, StoreSettings, StoredSchedule,
    StoredWorker, Timestamp,
};
use durq_core::{
    Admin, EventCursor, EventPage, Events, Inspect, Pause, Schedules, Steps, WorkerRegistry,
};
use tokio::sync::Notify;

use crate::config::SqliteConfig;
use crate::engine::{Engine, WriteMode};
use crate::error::DbResultExt;
use crate::{store, transaction, SqliteTransaction};

/// A job store [`Backend`] in one SQLite file. Wrap it in a [`durq_core::Store`]
/// (`Store::new(backend)`) to use it: the handle validates the calls and reads the
/// clock, the backend stores.
///
/// The file is in WAL mode. All writes go through one writer thread that commits the
/// operations waiting together in one `BEGIN IMMEDIATE` transaction (group commit), where
/// one failed operation never undoes another; reads run on reader threads. Backends
/// opened on one file in one process share those threads, and any number of processes
/// may open the file at once. Several namespaces live side by side in one file
/// (CONTRACT C8).
///
/// Cloning is cheap and shares the threads.
#[derive(Clone)]
pub struct SqliteBackend {
    /// Shared with the enqueue closures sent to the writer (they read the dedup
    /// window), so an enqueue clones an `Arc`, not the namespace string.
    settings: Arc<StoreSettings>,
    ns: i64,
    notify: Arc<Notify>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.engine.path)
            .field("namespace", &self.settings.namespace)
            .field("config", &self.engine.config)
            .finish_non_exhaustive()
    }
}

impl SqliteBackend {
    /// Opens (creating if needed) the queue in the file at `path` with the default
    /// [`SqliteConfig`], applying any missing schema migrations.
    pub async fn open(path: impl AsRef<Path>, settings: StoreSettings) -> Result<SqliteBackend> {
        SqliteConfig::default().open(path, settings).await
    }

    /// What [`SqliteConfig::open`] does.
    pub(crate) async fn open_configured(
        path: &Path,
        settings: StoreSettings,
        config: SqliteConfig,
    ) -> Result<SqliteBackend> {
        validate::validate_settings(&settings)?;
        config.validate()?;
        let engine = Engine::get(path, &config).await?;
        let name = settings.namespace.clone();
        let records_events = settings.records_events();
        let ns = engine
            .write(WriteMode::DURABLE, move |tx| {
                if records_events {
                    crate::schema::ensure_event_triggers(tx.conn())
                        .db("create the event triggers")?;
                }
                store::namespace_id(tx, &name)
            })
            .await?;
        let notify = engine.wakers.for_ns(ns);
        Ok(SqliteBackend {
            settings: Arc::new(settings),
            ns,
            notify,
            engine,
        })
    }

    /// The configuration the file was opened with.
    pub fn config(&self) -> &SqliteConfig {
        &self.engine.config
    }

    /// Opens a new connection on the store's file for the caller's own transactions
    /// ([`SqliteBackend::transaction`]), set up as the store's writer connection: the same
    /// busy timeout ([`SqliteConfig::busy_timeout`]) and planner settings; the file is
    /// already in WAL mode. A connection the caller opened themselves works too.
    ///
    /// Opening blocks (it is a file open); keep the connection for many transactions.
    pub fn connection(&self) -> Result<rusqlite::Connection> {
        transaction::open_connection(&self.engine.path, &self.engine.config)
    }

    /// Begins a write transaction on `conn`, a connection to the store's file, in which
    /// the caller's own statements, enqueues and fenced completions of this store's
    /// namespace commit together or not at all (CONTRACT §7).
    ///
    /// It sets the connection's `synchronous` to what an enqueue through the store gets
    /// (`FULL` under [`Synchronous::DurableEnqueues`](crate::Synchronous::DurableEnqueues)), then begins with
    /// `BEGIN IMMEDIATE`, taking the file's write lock (waiting up to the connection's
    /// busy timeout for it). A connection on another file, on an in-memory database or
    /// already inside a transaction is refused with `InvalidInput`, writing nothing.
    /// Blocks like any rusqlite call.
    pub fn transaction<'c>(
        &self,
        conn: &'c mut rusqlite::Connection,
    ) -> Result<SqliteTransaction<'c>> {
        transaction::begin(
            transaction::Owner {
                ns: self.ns,
                settings: &self.settings,
                wakers: &self.engine.wakers,
                path: &self.engine.path,
                config: &self.engine.config,
            },
            conn,
        )
    }

    /// Deletes job `id`'s record, payload, attempts and steps while leaving its
    /// idempotency record in place, as a careless operator or a damaged backup would.
    /// For tests of CONTRACT C7 and R5; never needed in production.
    #[cfg(feature = "testing")]
    pub async fn vanish(&self, id: JobId) -> Result<()> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| store::vanish(tx, ns, id))
            .await
    }

    /// Deletes every job of this store's namespace, with its payloads, attempts, steps and
    /// idempotency records, and its pauses, schedules, workers and event stream, in one
    /// transaction;
    /// other namespaces of the file are untouched. Returns how many jobs were deleted.
    /// For tests and for retiring a namespace.
    ///
    /// The namespace's name stays registered in the file: stores still open on it keep
    /// working on the now empty namespace, and its internal id is never handed to
    /// another namespace, whose jobs those stores would otherwise see.
    pub async fn drop_namespace(&self) -> Result<u64> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::DURABLE, move |tx| store::drop_namespace(tx, ns))
            .await
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    fn capabilities(&self) -> Capabilities {
        // Every call completes on any runtime, or none: writes go to the writer thread,
        // reads to reader threads, and the answers come back on oneshot channels.
        Capabilities::default()
            .tied_to_runtime(false)
            .dependencies(true)
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::enqueue(tx, ns, &settings, job, now)
            })
            .await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let (ns, settings) = (self.ns, self.settings.clone());
        // One operation in its own savepoint: a job refused inside the transaction (an
        // unknown parent) undoes the whole batch, and only the batch.
        self.engine
            .write(WriteMode::DURABLE_ATOMIC, move |tx| {
                store::enqueue_batch(tx, ns, &settings, jobs, now)
            })
            .await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        let ns = self.ns;
        self.engine.read(move |conn| store::get(conn, ns, id)).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::payload(conn, ns, id))
            .await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::claim(tx, ns, &request, now)
            })
            .await
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::heartbeat(tx, ns, id, token, ttl, now)
            })
            .await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let ns = self.ns;
        // One write operation for every lease the worker holds, as complete_batch.
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let mut answers = Vec::with_capacity(leases.len());
                for lease in leases {
                    match store::heartbeat(tx, ns, lease.id, lease.token, ttl, now) {
                        Err(err @ (Error::Unavailable { .. } | Error::Backend { .. })) => {
                            return Err(err)
                        }
                        answer => answers.push(answer),
                    }
                }
                Ok(answers)
            })
            .await
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::complete(tx, ns, id, token, result.as_deref(), now)
            })
            .await
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        let ns = self.ns;
        // One write operation for the whole batch: one hand-off to the writer thread and
        // one reply instead of one per job. A refusal of one entry (checked before it
        // writes) is its answer; a database error fails the call, and the writer rolls
        // back what the batch wrote with its group.
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let mut answers = Vec::with_capacity(completions.len());
                let mut completer = store::Completer::new(tx)?;
                for Completion { id, token, result } in completions {
                    match completer.complete(ns, id, token, result.as_deref(), now) {
                        Err(err @ (Error::Unavailable { .. } | Error::Backend { .. })) => {
                            return Err(err)
                        }
                        answer => answers.push(answer),
                    }
                }
                Ok(answers)
            })
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
        // The handle cut the text to its limit already; the writer thread needs it owned.
        let error = error.to_owned();
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::fail(tx, ns, id, token, &error, retry, now)
            })
            .await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::release(tx, ns, id, token, ready_at, now)
            })
            .await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::reclaim(tx, ns, limit, now)
            })
            .await
    }

    /// Wakes at once when a job becomes ready through any store on this file in this
    /// process; jobs enqueued by other processes are found by polling every
    /// [`SqliteConfig::poll_interval`].
    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        let endings = &self.engine.wakers.endings;
        let _counted = endings.count_wait();
        // This process's commits signal; another process's are seen at the next poll.
        let poll = Some(self.engine.config.poll_interval);
        durq_core::ending::wait_until_ended(timeout, poll, || {
            Box::pin(async move {
                let woken = endings.next_ending();
                let job = self.get(id).await?;
                Ok(Armed { job, woken })
            })
        })
        .await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register for the wake-up before looking, so an enqueue that commits between
            // the look and the wait still wakes this waiter.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The one clock read of the backend: a wait spans real time, so each look
            // asks whether a job is ready at the instant of that look (a scheduled job
            // comes due during the wait); no `now` handed in could answer that. It only
            // decides when to wake, never what a job becomes.
            let (ns, watched, now) = (self.ns, queues.to_vec(), self.settings.now());
            let readiness = self
                .engine
                .read(move |conn| store::readiness(conn, ns, &watched, now))
                .await?;
            // A rate that holds jobs back frees a start at a known instant (K4): the
            // next look is then, not a poll later.
            let rate_frees_in = match readiness {
                store::Readiness::Ready => return Ok(()),
                store::Readiness::FreedAt(at) => Some(Duration::from_millis(
                    u64::try_from(at.as_millis().saturating_sub(now.as_millis())).unwrap_or(0),
                )),
                store::Readiness::Nothing => None,
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let mut poll_at = deadline.min(now + self.engine.config.poll_interval);
            if let Some(frees_in) = rate_frees_in {
                poll_at = poll_at.min(now + frees_in);
            }
            if tokio::time::timeout_at(poll_at, notified).await.is_ok() {
                return Ok(());
            }
        }
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

/// The stream lives in the file (`jobq_events`); the state changes are recorded by
/// triggers in the statements that make them (schema version 12), so this implements
/// only the reads, the handler's `emit` and the trim.
#[async_trait]
impl Events for SqliteBackend {
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::read_events(conn, ns, after, limit))
            .await
    }

    // Synced like an enqueue or a saved step (`WriteMode::DURABLE`): an acknowledged
    // event is one a consumer will read, power loss or not.
    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let (ns, name) = (self.ns, name.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::emit_event(tx, ns, id, token, &name, &data, now)
            })
            .await
    }

    // A housekeeping write, as `purge` is: a trim a power loss undid is done again by
    // the next one, and the events and the trim record go or stay together.
    async fn trim_events(&self, keep: u64) -> Result<u64> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::trim_events(tx, ns, keep)
            })
            .await
    }
}

#[async_trait]
impl Steps for SqliteBackend {
    async fn steps(&self, id: JobId) -> Result<StepLog> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::step_log(conn, ns, id))
            .await
    }

    // Synced like an enqueue (`WriteMode::DURABLE`), not like the worker's other calls:
    // a step is saved so that its work, often an effect outside the store, never runs
    // again (D2), and a save that a power loss undid would run it again.
    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let (ns, name) = (self.ns, name.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::save_step(tx, ns, id, token, &name, &output, now)
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
        let (ns, step) = (self.ns, step.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::retry_from(tx, ns, id, &step, generation, now)
            })
            .await
    }
}

#[async_trait]
impl FlowControl for SqliteBackend {
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        let (ns, queue) = (self.ns, queue.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::limits::set_limits(tx, ns, &queue, limits)
            })
            .await
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::limits::all_limits(conn, ns))
            .await
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        let (ns, queue) = (self.ns, queue.to_owned());
        self.engine
            .read(move |conn| store::limits::flow_status(conn, ns, &queue, now))
            .await
    }
}

#[async_trait]
impl Inspect for SqliteBackend {
    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::children(conn, ns, parent))
            .await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::attempts(conn, ns, id))
            .await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let (ns, queue) = (self.ns, queue.to_owned());
        self.engine
            .read(move |conn| store::stats(conn, ns, &queue, now))
            .await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::queues(conn, ns, now))
            .await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::list(conn, ns, &query))
            .await
    }
}

#[async_trait]
impl Admin for SqliteBackend {
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::DURABLE, move |tx| store::cancel(tx, ns, id, now))
            .await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::DURABLE, move |tx| store::retry(tx, ns, id, now))
            .await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::purge(tx, ns, limit, cutoff)
            })
            .await
    }
}

#[async_trait]
impl Pause for SqliteBackend {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        let (ns, queue) = (self.ns, queue.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::set_paused(tx, ns, &queue, paused)
            })
            .await
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::paused_queues(conn, ns))
            .await
    }
}

#[async_trait]
impl Schedules for SqliteBackend {
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        let (ns, name, spec) = (self.ns, name.to_owned(), spec.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::put_schedule(tx, ns, &name, &spec, now)
            })
            .await
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| store::schedules(conn, ns))
            .await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        let (ns, name) = (self.ns, name.to_owned());
        // A firing's update may be lost in a crash (the tick is then fired again under
        // the same key); a disable or enable must not be.
        let mode = if update.enabled.is_some() {
            WriteMode::DURABLE
        } else {
            WriteMode::WORKER
        };
        self.engine
            .write(mode, move |tx| {
                store::update_schedule(tx, ns, &name, update)
            })
            .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let (ns, name) = (self.ns, name.to_owned());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                store::delete_schedule(tx, ns, &name)
            })
            .await
    }
}

#[async_trait]
impl WorkerRegistry for SqliteBackend {
    // Worker records are a worker's own calls, not enqueues: a crash may lose the last
    // registration or heartbeat, and the worker's next one writes it again.
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        let (ns, id, spec) = (self.ns, id.to_owned(), spec.to_owned());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::put_worker(tx, ns, &id, &spec, in_flight, now)
            })
            .await
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        let (ns, id) = (self.ns, id.to_owned());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::touch_worker(tx, ns, &id, in_flight, now)
            })
            .await
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        let (ns, id) = (self.ns, id.to_owned());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::delete_worker(tx, ns, &id)
            })
            .await
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        let ns = self.ns;
        self.engine.read(move |conn| store::workers(conn, ns)).await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                store::reap_workers(tx, ns, cutoff)
            })
            .await
    }
}
