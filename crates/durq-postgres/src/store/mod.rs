//! The `Backend` implementation: one statement per operation, at the instant the
//! `Store` handle passes down.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use durq_core::attempts::history;
use durq_core::batch::Batcher;
use durq_core::meta::encode_tags;
use durq_core::{
    async_trait, validate, Attempt, Backend, Budget, Capabilities, ClaimRequest, ClaimedJob,
    Enqueued, Error, Heartbeat, HeldLease, Job, JobId, JobState, LeaseToken, ListPage, ListQuery,
    NewJob, QueueOverview, QueueStats, ReadyOrder, ReclaimedJob, Result, Retry, ScheduleUpdate,
    StoreSettings, StoredSchedule, StoredWorker, Timestamp, LEASE_EXPIRED,
};
use durq_core::{Admin, Inspect, Pause, Schedules, WorkerRegistry};
use sqlx::postgres::{PgBindIterExt, PgRow};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::conn::{PgQuery, Shared};
use crate::pool::{PostgresConfig, PostgresPool};
use crate::row::{self, column};
use complete::{Completion, Completions, Outcome};
use enqueue::{enqueue_all, Enqueue, Enqueues};

mod admin;
mod claim;
pub(crate) mod complete;
pub(crate) mod enqueue;
mod reads;
mod schedules;
mod workers;

use self::claim::{claim_order, Unreadable};

/// The jobs of one namespace of a PostgreSQL schema: a [`durq_core::Backend`], used
/// through a [`durq_core::Store`] handle (`Store::new(store)`).
///
/// Cloning is cheap and shares everything. See the crate documentation for the
/// schema and the statements behind each operation.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    settings: StoreSettings,
    /// Per queue, the wake-up counter seen when this store last looked for work there,
    /// so a notice that arrives between an empty claim and `wait_for_work` is not lost.
    seen: Mutex<HashMap<String, u64>>,
    enqueues: Batcher<Enqueues>,
    completions: Batcher<Completions>,
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

    fn new(shared: Arc<Shared>, settings: StoreSettings) -> Self {
        PostgresBackend {
            inner: Arc::new(Inner {
                seen: Mutex::default(),
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

    fn sql(&self) -> &crate::sql::Statements {
        &self.inner.shared.sql
    }

    fn namespace(&self) -> &str {
        &self.inner.settings.namespace
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Runs the statement `build` makes, once more if its connection broke (for
    /// statements that may run twice; see `conn`), and returns its first row.
    async fn fetch_optional_again<'q>(
        &'q self,
        what: &str,
        build: impl Fn() -> PgQuery<'q>,
    ) -> Result<Option<PgRow>> {
        let rows = self.shared().fetch_all_again(what, |_| build()).await?;
        Ok(rows.into_iter().next())
    }

    /// Runs `query` once and returns its first row.
    async fn fetch_optional_once(&self, what: &str, query: PgQuery<'_>) -> Result<Option<PgRow>> {
        let rows = self.shared().fetch_all(what, query).await?;
        Ok(rows.into_iter().next())
    }

    /// Buries a job this store's claim leased and could not decode (CONTRACT C10), so
    /// it is neither handed out nor left leased to nobody.
    async fn bury(&self, job: Unreadable, now: Timestamp) -> Result<()> {
        let error = format!("corrupt record: {}", job.reason);
        // Sent again when the connection broke: the lease token fences a second run.
        self.shared()
            .fetch_all_again("bury", |_| {
                sqlx::query(self.sql().bury.sql())
                    .bind(self.namespace())
                    .bind(job.id)
                    .bind(job.token)
                    .bind(now.as_millis())
                    .bind(error.as_bytes())
            })
            .await?;
        Ok(())
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn lease_miss(&self, what: &str, id: JobId) -> Error {
        match self.state_of(what, id).await {
            Ok(Some(_)) => Error::LeaseLost { id },
            Ok(None) => Error::NotFound { id },
            Err(err) => err,
        }
    }

    /// The job's current state, or `None` if it does not exist.
    async fn state_of(&self, what: &str, id: JobId) -> Result<Option<JobState>> {
        let row = self
            .fetch_optional_again(what, || {
                sqlx::query(self.sql().exists.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
            })
            .await?;
        row.map(|row| row::state(&row, 0, &|| format!("job {id}")))
            .transpose()
    }
}

impl PostgresConfig {
    /// Connects a pool of its own, migrates the schema, and opens the backend of
    /// namespace `settings.namespace` over it: the one way to open a PostgreSQL
    /// backend with a full configuration (schema, pool size, timeouts). Namespaces
    /// that share a pool open it with [`PostgresPool::connect`] and
    /// [`PostgresPool::backend`].
    pub async fn open(self, settings: StoreSettings) -> Result<PostgresBackend> {
        PostgresPool::connect(self).await?.backend(settings)
    }
}

impl PostgresPool {
    /// The backend of namespace `settings.namespace` over this pool; wrap it in a
    /// [`durq_core::Store`] to use it. Settings the contract refuses are refused here.
    pub fn backend(&self, settings: StoreSettings) -> Result<PostgresBackend> {
        validate::validate_settings(&settings)?;
        Ok(PostgresBackend::new(Arc::clone(self.shared()), settings))
    }
}

pub(crate) fn token_param(token: LeaseToken) -> i64 {
    // Stored tokens are positive; one beyond i64 can never be current.
    i64::try_from(token.get()).unwrap_or(-1)
}

/// How many bytes of a failure's error its attempt record keeps (CONTRACT H2): the
/// text cut at 4 KiB on a character boundary, so `FAIL` cuts the bytes it already has
/// instead of receiving the text twice.
fn attempt_error_len(error: &str) -> i32 {
    let kept = durq_core::validate::truncate_attempt_error(error).len();
    i32::try_from(kept).unwrap_or(i32::MAX)
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl Backend for PostgresBackend {
    fn settings(&self) -> &StoreSettings {
        &self.inner.settings
    }

    fn capabilities(&self) -> Capabilities {
        // Tied to its runtime (the default): the pool's sockets, the batching tasks
        // and the wake-up listener are driven by the runtime the store is used on.
        Capabilities::default()
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        let shared = crate::pool::reopened(&self.inner.shared);
        Ok(Some(Arc::new(PostgresBackend::new(
            shared,
            self.inner.settings.clone(),
        ))))
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
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
        let hub = &self.inner.shared.wake.hub;
        if hub.is_active() {
            // Notices from here on may be for jobs this claim does not see.
            let counters = hub.observe(self.namespace(), &request.queues);
            let mut seen = self.seen();
            for (queue, counter) in request.queues.iter().zip(counters) {
                seen.insert(queue.clone(), counter);
            }
        }
        let expires_at = now.saturating_add(request.lease_ttl).as_millis();
        let budget = request.budget.as_ref().map(Budget::to_json);
        // Sent again when the connection broke: if the first run committed unseen,
        // its jobs wait for their lease to expire and reclaim, exactly as when the
        // caller claims again after an `Unavailable`.
        let rows = self
            .shared()
            .fetch_all_again("claim", |_| {
                if !request.is_fitted() {
                    return sqlx::query(self.sql().claim.sql())
                        .bind(self.namespace())
                        .bind(&request.queues[..])
                        .bind(now.as_millis())
                        .bind(limit_param(request.limit))
                        .bind(request.worker.as_bytes())
                        .bind(expires_at);
                }
                // A reservation needs no order; a budget alone keeps the claim order.
                if let Some(reserved) = request.reserved {
                    sqlx::query(self.sql().claim_reserved.sql())
                        .bind(self.namespace())
                        .bind(&request.queues[..])
                        .bind(now.as_millis())
                        .bind(Uuid::from(reserved))
                        .bind(request.worker.as_bytes())
                        .bind(expires_at)
                        .bind(budget.as_deref())
                } else if request.prefer.is_empty() {
                    sqlx::query(self.sql().claim_budgeted.sql())
                        .bind(self.namespace())
                        .bind(&request.queues[..])
                        .bind(now.as_millis())
                        .bind(limit_param(request.limit))
                        .bind(request.worker.as_bytes())
                        .bind(expires_at)
                        .bind(budget.as_deref())
                } else {
                    sqlx::query(self.sql().claim_preferring.sql())
                        .bind(self.namespace())
                        .bind(&request.queues[..])
                        .bind(now.as_millis())
                        .bind(limit_param(request.limit))
                        .bind(request.worker.as_bytes())
                        .bind(expires_at)
                        .bind(budget.as_deref())
                        .bind(&request.prefer[..])
                }
            })
            .await?;
        let shared = self.shared();
        let claimed = u64::try_from(rows.len()).unwrap_or(u64::MAX);
        shared.growth.passed(claimed, &shared.pool, &shared.sql);
        let (claimed, unreadable) = claim_order(rows, &request)?;
        for job in unreadable {
            self.bury(job, now).await?;
        }
        Ok(claimed)
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        let expires_at = now.saturating_add(ttl);
        // Sent again when the connection broke: a second run sets the same expiry.
        let row = self
            .fetch_optional_again("heartbeat", || {
                sqlx::query(self.sql().heartbeat.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
                    .bind(token_param(token))
                    .bind(expires_at.as_millis())
                    .bind(now.as_millis())
            })
            .await?;
        match row {
            Some(row) => Ok(Heartbeat {
                cancel_requested: column(&row, 0, &|| format!("job {id}"))?,
                expires_at,
            }),
            None => Err(self.lease_miss("heartbeat", id).await),
        }
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let expires_at = now.saturating_add(ttl);
        // Sent in id order, as completions are (see `complete::Completions::run`): two
        // statements locking some of the same rows lock them in the same order, so
        // they queue on each other instead of deadlocking.
        let mut sorted: Vec<(usize, &HeldLease)> = leases.iter().enumerate().collect();
        sorted.sort_unstable_by_key(|(_, lease)| lease.id);
        let rows = self
            .shared()
            .fetch_all_again("heartbeat_batch", |_| {
                sqlx::query(self.sql().heartbeat_batch.sql())
                    .bind(self.namespace())
                    .bind(
                        sorted
                            .iter()
                            .map(|(_, lease)| Uuid::from(lease.id))
                            .bind_iter(),
                    )
                    .bind(
                        sorted
                            .iter()
                            .map(|(_, lease)| token_param(lease.token))
                            .bind_iter(),
                    )
                    .bind(expires_at.as_millis())
                    .bind(now.as_millis())
            })
            .await?;
        let what = || "heartbeat batch row".to_owned();
        let mut answers: Vec<Option<Result<Heartbeat>>> = leases.iter().map(|_| None).collect();
        for row in &rows {
            let ord: i64 = column(row, 0, &what)?;
            // `ord` counts the sorted entries from 1.
            let Some(&(index, lease)) = usize::try_from(ord - 1)
                .ok()
                .and_then(|position| sorted.get(position))
            else {
                return Err(Error::corrupt(what(), format!("no entry {ord}")));
            };
            let extended: bool = column(row, 1, &what)?;
            let found: bool = column(row, 3, &what)?;
            let answer = match (extended, found) {
                (true, _) => Ok(Heartbeat {
                    cancel_requested: column(row, 2, &what)?,
                    expires_at,
                }),
                (false, true) => Err(Error::LeaseLost { id: lease.id }),
                (false, false) => Err(Error::NotFound { id: lease.id }),
            };
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        answers
            .into_iter()
            .zip(&leases)
            .map(|(answer, lease)| {
                answer.ok_or_else(|| {
                    Error::corrupt(
                        format!("job {}", lease.id),
                        "the heartbeat batch did not report this job",
                    )
                })
            })
            .collect()
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        let call = Completion {
            id,
            token: token_param(token),
            result,
            now,
        };
        let outcome = self.inner.completions.call(call).await?;
        match outcome {
            Outcome::Completed => Ok(()),
            Outcome::LeaseLost => Err(Error::LeaseLost { id }),
            Outcome::NotFound => Err(Error::NotFound { id }),
        }
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let retry_at = match retry {
            Retry::At(at) => Some(at.as_millis()),
            Retry::Never => None,
        };
        // Sent once: a second run after a first that committed unseen would answer
        // "lease lost" for a failure that was recorded.
        let query = sqlx::query(self.sql().fail.sql())
            .bind(self.namespace())
            .bind(Uuid::from(id))
            .bind(token_param(token))
            .bind(retry_at)
            .bind(now.as_millis())
            .bind(error.as_bytes())
            .bind(attempt_error_len(error));
        let row = self.fetch_optional_once("fail", query).await?;
        match row {
            Some(row) => row::state(&row, 0, &|| format!("job {id}")),
            None => Err(self.lease_miss("fail", id).await),
        }
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        // Sent once, as `fail` is.
        let query = sqlx::query(self.sql().release.sql())
            .bind(self.namespace())
            .bind(Uuid::from(id))
            .bind(token_param(token))
            .bind(now.as_millis())
            .bind(ready_at.as_millis());
        let row = self.fetch_optional_once("release", query).await?;
        let Some(row) = row else {
            return Err(self.lease_miss("release", id).await);
        };
        let what = || format!("job {id}");
        // A snoozed job is announced when it comes due, like any scheduled job.
        if row::state(&row, 0, &what)? == JobState::Queued && ready_at <= now {
            let queue: String = column(&row, 1, &what)?;
            self.inner
                .shared
                .wake
                .announce(self.namespace(), [queue.as_str()]);
        }
        Ok(())
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        // Sent again when the connection broke: jobs a first run reclaimed unseen are
        // queued all the same; only their wake-up is left to the next poll.
        let rows = self
            .shared()
            .fetch_all_again("reclaim", |_| {
                sqlx::query(self.sql().reclaim.sql())
                    .bind(self.namespace())
                    .bind(now.as_millis())
                    .bind(limit_param(limit))
                    .bind(LEASE_EXPIRED.as_bytes())
            })
            .await?;
        let what = || "reclaim result row".to_owned();
        let mut reclaimed = Vec::with_capacity(rows.len());
        let mut requeued: Vec<String> = Vec::new();
        for row in &rows {
            let job = ReclaimedJob {
                id: row::job_id(column(row, 0, &what)?)?,
                state: row::state(row, 1, &what)?,
            };
            if job.state == JobState::Queued {
                requeued.push(column(row, 2, &what)?);
            }
            reclaimed.push(job);
        }
        self.inner
            .shared
            .wake
            .announce(self.namespace(), requeued.iter().map(String::as_str));
        Ok(reclaimed)
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let wake = &self.inner.shared.wake;
        let hub = &wake.hub;
        // Read before the listener may start: once its LISTEN is in force it moves every
        // counter (notices sent before then are lost), so a first wait returns then and
        // the caller's next claim covers that gap.
        let before = hub.observe(self.namespace(), queues);
        wake.ensure_listening().await;
        let baseline: Vec<u64> = {
            let seen = self.seen();
            queues
                .iter()
                .zip(&before)
                .map(|(queue, was)| seen.get(queue).copied().unwrap_or(*was))
                .collect()
        };
        loop {
            let notified = hub.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let current = hub.observe(self.namespace(), queues);
            let moved = current.iter().zip(&baseline).any(|(now, was)| now > was);
            if moved || Instant::now() >= deadline {
                let mut seen = self.seen();
                for (queue, counter) in queues.iter().zip(current) {
                    seen.insert(queue.clone(), counter);
                }
                return Ok(());
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => {}
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
        // Keys this old are past their window whatever now is (see `sql::PURGE`).
        let keys_cutoff = cutoff.saturating_sub(self.inner.settings.dedup_window);
        // Deleting what is past retention twice deletes it once: sent again if the
        // connection broke (the count then misses what the first run deleted).
        let row = self
            .fetch_optional_again("purge", || {
                sqlx::query(self.sql().purge.sql())
                    .bind(self.namespace())
                    .bind(cutoff.as_millis())
                    .bind(limit_param(limit))
                    .bind(keys_cutoff.as_millis())
            })
            .await?
            .ok_or_else(|| Error::corrupt("purge", "no result row"))?;
        let jobs: i64 = column(&row, 0, &|| "purge result".to_owned())?;
        Ok(jobs.unsigned_abs())
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
