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
use sqlx::postgres::{PgBindIterExt, PgRow};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::backend::{PostgresBackend, PostgresConfig};
use crate::complete::{Completion, Completions, Outcome};
use crate::conn::{PgQuery, Shared};
use crate::enqueue::{enqueue_all, Enqueue, Enqueues};
use crate::row::{self, column};

/// The jobs of one namespace of a PostgreSQL schema: a [`durq_core::Backend`], used
/// through a [`durq_core::Store`] handle (`Store::new(store)`).
///
/// Cloning is cheap and shares everything. See the crate documentation for the
/// schema and the statements behind each operation.
#[derive(Clone)]
pub struct PostgresStore {
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

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.shared.schema)
            .field("namespace", &self.inner.settings.namespace)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `url`, migrates the default schema, and opens `settings.namespace`.
    ///
    /// ```no_run
    /// use durq_core::{NewJob, Store, StoreSettings};
    /// use durq_postgres::PostgresStore;
    /// # async fn example() -> durq_core::Result<()> {
    /// let store = Store::new(
    ///     PostgresStore::connect(
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
        Self::connect_with(PostgresConfig::new(url)?, settings).await
    }

    /// Connects with a full configuration (schema, pool size, timeouts).
    pub async fn connect_with(config: PostgresConfig, settings: StoreSettings) -> Result<Self> {
        PostgresBackend::connect(config).await?.store(settings)
    }

    /// Uses an existing pool with the default schema.
    pub async fn from_pool(pool: PgPool, settings: StoreSettings) -> Result<Self> {
        PostgresBackend::from_pool(pool, crate::DEFAULT_SCHEMA)
            .await?
            .store(settings)
    }

    fn new(shared: Arc<Shared>, settings: StoreSettings) -> Self {
        PostgresStore {
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

    /// Why a lease call matched no row: the job is gone, or its lease is not this one.
    /// One of `statements` for `page`: up to `limit` rows newest first, those of
    /// `tenant` and with `tags` (NULL: any), none below `lowest` (NULL: no bound). The
    /// statement is chosen by what the query names (see `sql::LIST_QUEUE`).
    async fn list_rows(
        &self,
        statements: &crate::sql::ListStatements,
        page: &ListPageQuery<'_>,
        limit: usize,
        tenant: Option<&[u8]>,
        tags: Option<&str>,
        lowest: Option<Uuid>,
    ) -> Result<Vec<PgRow>> {
        let query = page.query;
        let limit = limit_param(limit);
        let every_state = page.states.len() == JobState::ALL.len();
        match &query.queue {
            // A queue outside the prefix: nothing can match.
            Some(queue) if !query.matches_queue(queue) => Ok(Vec::new()),
            Some(queue) => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.queue.sql())
                            .bind(self.namespace())
                            .bind(queue)
                            .bind(page.states)
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
            // Every job: the newest first by primary key reads a page and no more.
            None if every_state && query.queue_prefix.is_none() => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.all.sql())
                            .bind(self.namespace())
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
            // Some states or some queues: per queue and state, an index range.
            None => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.queues.sql())
                            .bind(self.namespace())
                            .bind(query.queue_prefix.as_deref())
                            .bind(page.states)
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
        }
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

impl PostgresBackend {
    /// A store on this backend for `settings.namespace`; wrap it in a
    /// [`durq_core::Store`] to use it. Settings the contract refuses are refused here.
    pub fn store(&self, settings: StoreSettings) -> Result<PostgresStore> {
        validate::validate_settings(&settings)?;
        Ok(PostgresStore::new(Arc::clone(self.shared()), settings))
    }
}

/// Sorts claimed rows into the request's order (CONTRACT C3, F5): `UPDATE … RETURNING`
/// has none.
/// A job a claim leased but could not decode (CONTRACT C10): its row's id and lease
/// token, and why.
struct Unreadable {
    id: Uuid,
    token: i64,
    reason: String,
}

/// The claimed jobs in the claim's order, and those of its rows that did not decode.
fn claim_order(
    rows: Vec<PgRow>,
    request: &ClaimRequest,
) -> Result<(Vec<ClaimedJob>, Vec<Unreadable>)> {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    let mut placements = durq_core::fit::PlacementCache::new();
    for row in rows {
        match claimed_job(&row, request, &mut placements) {
            Ok(job) => claimed.push(job),
            Err(Error::Corrupt { what, reason }) => {
                // The id and token columns are typed by the schema: they decode.
                let id: Uuid = column(&row, 0, &|| what.clone())?;
                let token: i64 = column(&row, 12, &|| what.clone())?;
                unreadable.push(Unreadable { id, token, reason });
            }
            Err(other) => return Err(other),
        }
    }
    claimed.sort_by_key(|(order, _)| *order);
    Ok((
        claimed.into_iter().map(|(_, job)| job).collect(),
        unreadable,
    ))
}

/// One row of a claim, decoded, with its place in the claim's order.
fn claimed_job(
    row: &PgRow,
    request: &ClaimRequest,
    placements: &mut durq_core::fit::PlacementCache,
) -> Result<(durq_core::fit::FitOrder, ClaimedJob)> {
    let job = row::job_in(row, Some(placements))?;
    let seq = row::seq(row, job.id)?;
    let payload: Vec<u8> = column(row, row::CLAIM_PAYLOAD, &|| format!("job {}", job.id))?;
    let order = request.fit_order(
        ReadyOrder::new(job.priority, job.run_at, seq),
        job.locality.as_deref(),
    );
    Ok((
        order,
        ClaimedJob {
            job,
            payload: Bytes::from(payload),
        },
    ))
}

/// Adds one (state, due, total) row of [`crate::sql`]'s counts to a queue's counts:
/// queued jobs split into ready (due) and scheduled.
fn count_state(stats: &mut QueueStats, state: JobState, due: i64, total: i64) {
    let (due, total) = (due.unsigned_abs(), total.unsigned_abs());
    match state {
        JobState::Queued => {
            stats.ready = due;
            stats.scheduled = total.saturating_sub(due);
        }
        JobState::Running => stats.running = total,
        JobState::Succeeded => stats.succeeded = total,
        JobState::Dead => stats.dead = total,
        JobState::Cancelled => stats.cancelled = total,
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

/// The most rows one `list` call with a tenant or tag filter examines (see
/// `PostgresStore::list`), as many as Redis examines.
const LIST_EXAMINE_BOUND: usize = 4096;

/// What every statement of one `list` page shares.
struct ListPageQuery<'a> {
    query: &'a ListQuery,
    states: &'a [&'a str],
    cursor: Uuid,
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl Backend for PostgresStore {
    fn settings(&self) -> &StoreSettings {
        &self.inner.settings
    }

    fn capabilities(&self) -> Capabilities {
        // Tied to its runtime (the default): the pool's sockets, the batching tasks
        // and the wake-up listener are driven by the runtime the store is used on.
        Capabilities::default()
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        let shared = crate::backend::reopened(&self.inner.shared);
        Ok(Some(Arc::new(PostgresStore::new(
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
        let row = self
            .fetch_optional_again("get", || {
                sqlx::query(self.sql().get.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
            })
            .await?;
        match row {
            Some(row) => row::job(&row),
            None => Err(Error::NotFound { id }),
        }
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        let row = self
            .fetch_optional_again("payload", || {
                sqlx::query(self.sql().payload.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
            })
            .await?;
        match row {
            Some(row) => {
                let bytes: Vec<u8> = column(&row, 0, &|| format!("job {id}"))?;
                Ok(Bytes::from(bytes))
            }
            None => Err(Error::NotFound { id }),
        }
    }

    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        let rows = self
            .shared()
            .fetch_all_again("children", |_| {
                sqlx::query(self.sql().children.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(parent))
            })
            .await?;
        rows.iter().map(row::job).collect()
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        // A read: sent again if the connection broke.
        let rows = self
            .shared()
            .fetch_all_again("attempts", |_| {
                sqlx::query(self.sql().attempts.sql())
                    .bind(self.namespace())
                    .bind(Uuid::from(id))
            })
            .await?;
        // Every row repeats the job's own columns; none means no such job.
        let Some(first) = rows.first() else {
            return Err(Error::NotFound { id });
        };
        let last = row::last_claim(first, id)?;
        let ended = rows
            .iter()
            .filter_map(|row| row::attempt(row, id).transpose())
            .collect::<Result<Vec<Attempt>>>()?;
        Ok(history(ended, last))
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

    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        // The update acts on a queued or running job; otherwise the job is terminal
        // and stays as it is. A job that moves between the two statements (a
        // concurrent retry) is tried again.
        let mut attempts = 0;
        loop {
            // Cancelling twice is cancelling once: sent again if the connection broke.
            let row = self
                .fetch_optional_again("cancel", || {
                    sqlx::query(self.sql().cancel.sql())
                        .bind(self.namespace())
                        .bind(Uuid::from(id))
                        .bind(now.as_millis())
                })
                .await?;
            if let Some(row) = row {
                return row::state(&row, 0, &|| format!("job {id}"));
            }
            match self.state_of("cancel", id).await? {
                None => return Err(Error::NotFound { id }),
                Some(state) if state.is_terminal() || attempts >= 8 => return Ok(state),
                Some(_) => attempts += 1,
            }
        }
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        // Sent once: a second run after a first that committed unseen would refuse
        // the job as already queued.
        let query = sqlx::query(self.sql().retry.sql())
            .bind(self.namespace())
            .bind(Uuid::from(id))
            .bind(now.as_millis());
        let row = self.fetch_optional_once("retry", query).await?;
        if let Some(row) = row {
            let queue: String = column(&row, 0, &|| format!("job {id}"))?;
            self.inner
                .shared
                .wake
                .announce(self.namespace(), [queue.as_str()]);
            return Ok(());
        }
        match self.state_of("retry", id).await? {
            None => Err(Error::NotFound { id }),
            Some(state) => Err(Error::InvalidState {
                id,
                state,
                operation: "retry",
            }),
        }
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        // Pausing what is paused, or resuming what runs, changes nothing: sent again
        // if the connection broke.
        let sql = if paused {
            &self.sql().pause
        } else {
            &self.sql().resume
        };
        let rows = self
            .shared()
            .fetch_all_again("pause", |_| {
                sqlx::query(sql.sql()).bind(self.namespace()).bind(queue)
            })
            .await?;
        if !paused && !rows.is_empty() {
            // Claimers waiting on the queue look again.
            self.inner.shared.wake.announce(self.namespace(), [queue]);
        }
        Ok(())
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        let rows = self
            .shared()
            .fetch_all_again("paused_queues", |_| {
                sqlx::query(self.sql().paused_queues.sql()).bind(self.namespace())
            })
            .await?;
        let what = || "paused queue".to_owned();
        rows.iter().map(|row| column(row, 0, &what)).collect()
    }

    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        // Storing the same definition twice changes nothing: sent again if the
        // connection broke.
        self.shared()
            .fetch_all_again("put_schedule", |_| {
                sqlx::query(self.sql().put_schedule.sql())
                    .bind(self.namespace())
                    .bind(name)
                    .bind(spec)
                    .bind(now.as_millis())
            })
            .await
            .map(drop)
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        let rows = self
            .shared()
            .fetch_all_again("schedules", |_| {
                sqlx::query(self.sql().schedules.sql()).bind(self.namespace())
            })
            .await?;
        let what = || "schedule row".to_owned();
        rows.iter()
            .map(|row| {
                Ok(StoredSchedule {
                    name: column(row, 0, &what)?,
                    spec: column(row, 1, &what)?,
                    enabled: column(row, 2, &what)?,
                    last_tick: Timestamp::from_millis(column(row, 3, &what)?),
                })
            })
            .collect()
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        // Setting a flag, or moving the last tick forward to a given instant, twice is
        // the same as once: sent again if the connection broke.
        let rows = self
            .shared()
            .fetch_all_again("update_schedule", |_| {
                sqlx::query(self.sql().update_schedule.sql())
                    .bind(self.namespace())
                    .bind(name)
                    .bind(update.enabled)
                    .bind(update.last_tick.map(Timestamp::as_millis))
            })
            .await?;
        if rows.is_empty() {
            return Err(Error::ScheduleNotFound {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        // Sent once: a second run after a broken connection would answer `false`.
        let query = sqlx::query(self.sql().delete_schedule.sql())
            .bind(self.namespace())
            .bind(name);
        Ok(self
            .fetch_optional_once("delete_schedule", query)
            .await?
            .is_some())
    }

    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        // Storing the same record twice at the same instant is storing it once: sent
        // again if the connection broke.
        self.shared()
            .fetch_all_again("put_worker", |_| {
                sqlx::query(self.sql().put_worker.sql())
                    .bind(self.namespace())
                    .bind(id)
                    .bind(spec)
                    .bind(now.as_millis())
                    .bind(i64::from(in_flight))
            })
            .await
            .map(drop)
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        // Setting the same two values twice is setting them once, and answers the
        // same: sent again if the connection broke.
        let rows = self
            .shared()
            .fetch_all_again("touch_worker", |_| {
                sqlx::query(self.sql().touch_worker.sql())
                    .bind(self.namespace())
                    .bind(id)
                    .bind(i64::from(in_flight))
                    .bind(now.as_millis())
            })
            .await?;
        Ok(!rows.is_empty())
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        // Sent once, as `delete_schedule` is: a second run after a broken connection
        // would answer `false` for a worker the first run deleted.
        let query = sqlx::query(self.sql().delete_worker.sql())
            .bind(self.namespace())
            .bind(id);
        Ok(self
            .fetch_optional_once("delete_worker", query)
            .await?
            .is_some())
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        let rows = self
            .shared()
            .fetch_all_again("workers", |_| {
                sqlx::query(self.sql().workers.sql()).bind(self.namespace())
            })
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = column(row, 0, &|| "worker row".to_owned())?;
                let what = || format!("worker {id}");
                let in_flight: i64 = column(row, 2, &what)?;
                let in_flight = u32::try_from(in_flight)
                    .map_err(|_| Error::corrupt(what(), format!("in_flight is {in_flight}")))?;
                Ok(StoredWorker {
                    spec: column(row, 1, &what)?,
                    in_flight,
                    last_seen: Timestamp::from_millis(column(row, 3, &what)?),
                    id,
                })
            })
            .collect()
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        // Deleting the silent workers twice deletes them once: sent again if the
        // connection broke (the answer then misses the ids the first run deleted, as
        // `reclaim`'s and `purge`'s do).
        let rows = self
            .shared()
            .fetch_all_again("reap_workers", |_| {
                sqlx::query(self.sql().reap_workers.sql())
                    .bind(self.namespace())
                    .bind(cutoff.as_millis())
            })
            .await?;
        let what = || "reaped worker row".to_owned();
        let mut ids = rows
            .iter()
            .map(|row| column(row, 0, &what))
            .collect::<Result<Vec<String>>>()?;
        ids.sort_unstable();
        Ok(ids)
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let rows = self
            .shared()
            .fetch_all_again("stats", |_| {
                sqlx::query(self.sql().stats.sql())
                    .bind(self.namespace())
                    .bind(queue)
                    .bind(now.as_millis())
            })
            .await?;
        let what = || format!("stats of queue {queue}");
        let mut stats = QueueStats::default();
        for row in &rows {
            let state = row::state(row, 0, &what)?;
            let due: i64 = column(row, 1, &what)?;
            let total: i64 = column(row, 2, &what)?;
            count_state(&mut stats, state, due, total);
        }
        Ok(stats)
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        let rows = self
            .shared()
            .fetch_all_again("queues", |_| {
                sqlx::query(self.sql().queues.sql())
                    .bind(self.namespace())
                    .bind(now.as_millis())
            })
            .await?;
        let mut overviews: Vec<QueueOverview> = Vec::new();
        for row in &rows {
            let queue: String = column(row, 0, &|| "queue list row".to_owned())?;
            let what = || format!("queue {queue}");
            let state = row::state(row, 1, &what)?;
            let due: i64 = column(row, 2, &what)?;
            let total: i64 = column(row, 3, &what)?;
            let oldest: Option<i64> = column(row, 4, &what)?;
            if overviews.last().is_none_or(|last| last.queue != queue) {
                overviews.push(QueueOverview::new(
                    queue.clone(),
                    QueueStats::default(),
                    None,
                ));
            }
            let Some(overview) = overviews.last_mut() else {
                continue;
            };
            count_state(&mut overview.stats, state, due, total);
            if state == JobState::Queued {
                overview.oldest_ready = oldest.map(Timestamp::from_millis);
            }
        }
        Ok(overviews)
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        let cursor = query.cursor.map_or(Uuid::max(), Uuid::from);
        // NULL binds "every tenant" and "no tag filter" (see `sql::list_filters`).
        let tenant = (!query.tenant.is_empty()).then_some(query.tenant.as_bytes());
        let tags = encode_tags(&query.tags);
        let states: Vec<&str> = JobState::ALL
            .iter()
            .filter(|state| query.matches_state(**state))
            .map(|state| state.as_str())
            .collect();
        let page = ListPageQuery {
            query: &query,
            states: &states,
            cursor,
        };
        // A tenant or tag filter may pass over any number of rows before it fills a
        // page: the page then holds only the matches among the newest
        // `LIST_EXAMINE_BOUND` rows the other conditions select, and ends there with
        // `next` set (CONTRACT A4 lets a backend bound one call's work). The bound is
        // found by the same walk without the filters, reading ids only.
        let sql = self.sql();
        let mut lowest = None;
        if tenant.is_some() || tags.is_some() {
            let examined = self
                .list_rows(&sql.list_ids, &page, LIST_EXAMINE_BOUND, None, None, None)
                .await?;
            if let (LIST_EXAMINE_BOUND, Some(last)) = (examined.len(), examined.last()) {
                lowest = Some(column::<Uuid>(last, 0, &|| "list bound row".to_owned())?);
            }
        }
        let rows = self
            .list_rows(
                &sql.list,
                &page,
                query.limit,
                tenant,
                tags.as_deref(),
                lowest,
            )
            .await?;
        let jobs = rows.iter().map(row::job).collect::<Result<Vec<_>>>()?;
        let next = if jobs.len() == query.limit {
            jobs.last().map(|job| job.id)
        } else {
            // Ended at the bound: the next page starts below the rows examined.
            lowest.map(row::job_id).transpose()?
        };
        Ok(ListPage { jobs, next })
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
}
