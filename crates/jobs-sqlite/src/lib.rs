#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod config;
mod engine;
mod error;
mod ops;
mod schema;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jobs_core::{
    async_trait, validate, Bytes, ClaimRequest, ClaimedJob, Completion, Enqueued, Error, Heartbeat,
    HeldLease, Job, JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueStats,
    ReclaimedJob, Result, Retry, Store, StoreSettings,
};
use tokio::sync::Notify;

pub use config::{SqliteConfig, Synchronous};

use engine::{Engine, WriteMode};

/// The schema version this build creates and migrates files to.
pub const SCHEMA_VERSION: i64 = schema::SCHEMA_VERSION;

/// A [`Store`] in one SQLite file.
///
/// The file is in WAL mode. All writes go through one writer thread that commits the
/// operations waiting together in one `BEGIN IMMEDIATE` transaction (group commit), where
/// one failed operation never undoes another; reads run on reader threads. Stores opened
/// on one file in one
/// process share those threads, and any number of processes may open the file at once.
/// Several namespaces live side by side in one file (CONTRACT C8).
///
/// Cloning is cheap and shares the threads.
#[derive(Clone)]
pub struct SqliteStore {
    /// Shared with the closures sent to the threads, so an operation clones an `Arc`,
    /// not the namespace string.
    settings: Arc<StoreSettings>,
    ns: i64,
    notify: Arc<Notify>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.engine.path)
            .field("namespace", &self.settings.namespace)
            .field("config", &self.engine.config)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the queue in the file at `path` with the default
    /// [`SqliteConfig`], applying any missing schema migrations.
    pub async fn open(path: impl AsRef<Path>, settings: StoreSettings) -> Result<SqliteStore> {
        Self::open_with(path, settings, SqliteConfig::default()).await
    }

    /// Opens the queue in the file at `path` with `config`.
    pub async fn open_with(
        path: impl AsRef<Path>,
        settings: StoreSettings,
        config: SqliteConfig,
    ) -> Result<SqliteStore> {
        validate::validate_settings(&settings)?;
        config.validate()?;
        let engine = Engine::get(path.as_ref(), &config).await?;
        let name = settings.namespace.clone();
        let ns = engine
            .write(WriteMode::DURABLE, move |tx| ops::namespace_id(tx, &name))
            .await?;
        let notify = engine.wakers.for_ns(ns);
        Ok(SqliteStore {
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

    /// Deletes job `id`'s record and payload while leaving its idempotency record in
    /// place, as a careless operator or a damaged backup would. For tests of CONTRACT
    /// C7 and R5; never needed in production.
    pub async fn vanish(&self, id: JobId) -> Result<()> {
        let ns = self.ns;
        self.engine
            .write(WriteMode::WORKER, move |tx| ops::vanish(tx, ns, id))
            .await
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    fn tied_to_runtime(&self) -> bool {
        // Every call completes on any runtime: writes go to the writer thread, reads to threads of their own.
        false
    }

    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        validate::validate_new_job(&job, &self.settings)?;
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                let now = settings.now();
                ops::enqueue(tx, ns, &settings, &job, now)
            })
            .await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        validate::validate_batch(&jobs, &self.settings)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        // One operation in its own savepoint: a job refused inside the transaction (an
        // unknown parent) undoes the whole batch, and only the batch.
        self.engine
            .write(WriteMode::DURABLE_ATOMIC, move |tx| {
                let now = settings.now();
                jobs.iter()
                    .map(|job| ops::enqueue(tx, ns, &settings, job, now))
                    .collect()
            })
            .await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        let ns = self.ns;
        self.engine.read(move |conn| ops::get(conn, ns, id)).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        let ns = self.ns;
        self.engine
            .read(move |conn| ops::payload(conn, ns, id))
            .await
    }

    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        let ns = self.ns;
        self.engine
            .read(move |conn| ops::children(conn, ns, parent))
            .await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        validate::validate_claim(&request)?;
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::claim(tx, ns, &request, now)
            })
            .await
    }

    async fn heartbeat(&self, id: JobId, token: LeaseToken, ttl: Duration) -> Result<Heartbeat> {
        validate::validate_lease_ttl(ttl)?;
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::heartbeat(tx, ns, id, token, ttl, now)
            })
            .await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        validate::validate_lease_ttl(ttl)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        // One write operation for every lease the worker holds, as complete_batch.
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                let mut answers = Vec::with_capacity(leases.len());
                for lease in leases {
                    match ops::heartbeat(tx, ns, lease.id, lease.token, ttl, now) {
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

    async fn complete(&self, id: JobId, token: LeaseToken, result: Option<Bytes>) -> Result<()> {
        if let Some(result) = &result {
            validate::validate_size("result", result.len(), &self.settings)?;
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::complete(tx, ns, id, token, result.as_deref(), now)
            })
            .await
    }

    async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        let (ns, settings) = (self.ns, self.settings.clone());
        // One write operation for the whole batch: one hand-off to the writer thread and
        // one reply instead of one per job. A refusal of one entry (checked before it
        // writes) is its answer; a database error fails the call, and the writer rolls
        // back what the batch wrote with its group.
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                let mut answers = Vec::with_capacity(completions.len());
                for Completion { id, token, result } in completions {
                    let answer = match &result {
                        Some(bytes) => validate::validate_size("result", bytes.len(), &settings),
                        None => Ok(()),
                    }
                    .and_then(|()| ops::complete(tx, ns, id, token, result.as_deref(), now));
                    match answer {
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
    ) -> Result<JobState> {
        let error = validate::truncate_error(error).to_owned();
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::fail(tx, ns, id, token, &error, retry, now)
            })
            .await
    }

    async fn release(&self, id: JobId, token: LeaseToken) -> Result<()> {
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::release(tx, ns, id, token, now)
            })
            .await
    }

    async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::reclaim(tx, ns, limit, now)
            })
            .await
    }

    async fn cancel(&self, id: JobId) -> Result<JobState> {
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                let now = settings.now();
                ops::cancel(tx, ns, id, now)
            })
            .await
    }

    async fn retry(&self, id: JobId) -> Result<()> {
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::DURABLE, move |tx| {
                let now = settings.now();
                ops::retry(tx, ns, id, now)
            })
            .await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        validate::validate_queue(queue)?;
        let (ns, settings, queue) = (self.ns, self.settings.clone(), queue.to_owned());
        self.engine
            .read(move |conn| ops::stats(conn, ns, &queue, settings.now()))
            .await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        validate::validate_list(&query)?;
        let ns = self.ns;
        self.engine
            .read(move |conn| ops::list(conn, ns, &query))
            .await
    }

    async fn purge(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let (ns, settings) = (self.ns, self.settings.clone());
        self.engine
            .write(WriteMode::WORKER, move |tx| {
                let now = settings.now();
                ops::purge(tx, ns, &settings, limit, now)
            })
            .await
    }

    /// Wakes at once when a job becomes ready through any store on this file in this
    /// process; jobs enqueued by other processes are found by polling every
    /// [`SqliteConfig::poll_interval`].
    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        if queues.is_empty() {
            return Err(jobs_core::Error::invalid(
                "queues",
                "name at least one queue",
            ));
        }
        queues
            .iter()
            .try_for_each(|q| validate::validate_queue(q))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register for the wake-up before looking, so an enqueue that commits between
            // the look and the wait still wakes this waiter.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (ns, settings, watched) = (self.ns, self.settings.clone(), queues.to_vec());
            let ready = self
                .engine
                .read(move |conn| ops::has_ready(conn, ns, &watched, settings.now()))
                .await?;
            if ready {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let poll_at = deadline.min(now + self.engine.config.poll_interval);
            if tokio::time::timeout_at(poll_at, notified).await.is_ok() {
                return Ok(());
            }
        }
    }
}
