//! [`RedisBackend`]: the `Backend` of the contract over Redis, one Lua script per state
//! change, and its capability traits. The type, its public methods and its trait impls
//! live here, each a short call into `store/`, where the work is split by job; opening
//! a store is in `config.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use durq_core::batch::Batcher;
use durq_core::ending::Armed;
use durq_core::{
    async_trait, Attempt, Backend, Bytes, Capabilities, ClaimRequest, ClaimedJob, Completion,
    Enqueued, Error, Heartbeat, HeldLease, Job, JobId, JobState, LeaseToken, ListPage, ListQuery,
    NewJob, Partitioning, QueueOverview, QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate,
    StoreSettings, StoredSchedule, StoredWorker, Timestamp,
};
use durq_core::{
    Admin, EventCursor, EventPage, Events, FlowControl, FlowStatus, Inspect, Pause, QueueLimits,
    Schedules, StepLog, Steps, WorkerRegistry,
};

use crate::config::Dial;
use crate::conn::Conn;
use crate::keys::Keys;
use crate::store::enqueue::{Ctx as EnqueueCtx, Enqueues, Prepared};
use crate::store::heads::Heads;
use crate::store::lease::{self, Completions};
use crate::store::partitioned::Partitions;
use crate::wake::{self, Waker};

/// How often a wait for an ending reads its job when no announcement came (CONTRACT
/// O2): the fallback for announcements the subscriber missed while it reconnected, or
/// that a claimer which died between its claim and `settle.lua` never sent.
const ENDING_POLL: Duration = Duration::from_secs(15);

/// How long a wait for an ending waits for the subscriber to stand before its first
/// read, at most.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(5);

/// A job store's storage on Redis or Redis Cluster: a [`Backend`], used through a
/// [`durq_core::Store`] handle.
///
/// Every state change is one Lua script (EVALSHA), all keys of a namespace share the
/// hash tag `{namespace}`, and every decision takes "now" from the instant the handle
/// passes down. See `docs/redis.md` for the keys and scripts. Cloning is cheap and shares
/// the connection.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    /// How `conn` was opened, to open another for `reopen`.
    pub(crate) dial: Dial,
    pub(crate) settings: StoreSettings,
    pub(crate) keys: Keys,
    /// What this store's claims know of the head of each queue set, so each call can
    /// pass the hashes of the jobs it will lease in KEYS without reading first.
    pub(crate) heads: Arc<Heads>,
    pub(crate) waker: Waker,
    pub(crate) completions: Batcher<Completions>,
    /// Shared with `completions`: whether this store's last batch of completions had a
    /// job others wait for (see `store/lease.rs`, [`crate::store::lease::GraphHint`]).
    pub(crate) completion_graphs: crate::store::lease::GraphHint,
    pub(crate) enqueues: Batcher<Enqueues>,
    pub(crate) enqueue_ctx: EnqueueCtx,
    pub(crate) cluster: bool,
    /// The queues this handle found limits on (CONTRACT K1–K5), claimed with
    /// `claim_limited.lua` (see `store/flow.rs`).
    pub(crate) limited: crate::store::flow::LimitedQueues,
    /// Where this handle's sweep of the start logs stands (`store/flow.rs`).
    pub(crate) start_sweep: crate::store::flow::StartSweep,
    /// The partitions of a partitioned namespace (CONTRACT §8), each a store of its
    /// own over this one's connection; `None` for an unpartitioned namespace, which
    /// this store serves itself. A partitioned store serves only what is not split
    /// itself: schedules, the worker registry and the wake-up subscriber.
    pub(crate) partitions: Option<Partitions>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is not kept: it may hold a password.
        f.debug_struct("RedisBackend")
            .field("namespace", &self.inner.settings.namespace)
            .field("cluster", &self.inner.cluster)
            .field("partitions", &self.partition_count())
            .finish_non_exhaustive()
    }
}

/// What one `reclaim` did, beyond the jobs it recovered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Lease entries the scripts looked at: only entries already expired when read, so
    /// this follows the number of expired leases, not of running jobs (CONTRACT R6).
    pub examined: u64,
}

impl RedisBackend {
    /// Connects to one Redis server, e.g. `redis://127.0.0.1:6379`, or
    /// `rediss://host:6380` for TLS (feature `tls`; the server's certificate must chain
    /// to a root the system trusts, else see [`RedisConfig::tls`]). The
    /// connection reconnects by itself, within the reconnect back-off cap of 200 ms of
    /// the server answering again; a call made while it is down waits for up to 13
    /// connection attempts (1.2–2.3 s against a port that refuses), then fails with
    /// [`Error::Unavailable`] (see the crate's "Reconnecting").
    ///
    /// Settings that break the contract's limits are refused here.
    ///
    /// [`RedisConfig::tls`]: crate::RedisConfig::tls
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self> {
        crate::RedisConfig::new(url).open(settings).await
    }

    /// [`durq_core::Backend::reclaim`] at `now`, also reporting how many lease entries
    /// the scripts examined. Called on the backend directly, it takes `limit` and `now`
    /// as they are: the [`durq_core::Store`] handle is what answers a `limit` of 0
    /// without a call and reads the clock.
    pub async fn reclaim_with_report(
        &self,
        limit: usize,
        now: Timestamp,
    ) -> Result<(Vec<ReclaimedJob>, ReclaimReport)> {
        match &self.inner.partitions {
            Some(partitions) => partitions.reclaim(limit, now).await,
            None => {
                let reclaimed = self.reclaim_expired(limit, now).await?;
                // Housekeeping of flow control: its failure fails no reclaim.
                if let Err(err) = self.sweep_start_logs(now).await {
                    tracing::warn!(error = %err, "could not sweep the start logs");
                }
                Ok(reclaimed)
            }
        }
    }

    /// The store that serves calls naming job `id`: the partition holding it, or this
    /// store when the namespace is not partitioned.
    fn home(&self, id: JobId) -> &RedisBackend {
        match &self.inner.partitions {
            Some(partitions) => partitions.of(id),
            None => self,
        }
    }

    /// Deletes every key of this store's namespace (its jobs, indexes, idempotency
    /// keys and counters) and returns how many it deleted. Other namespaces are left
    /// as they are. For tests and for retiring a namespace: stop its workers and
    /// producers first, since a call racing the sweep can leave a key behind.
    ///
    /// The keys are found with `SCAN` (a page at a time, so the server is never
    /// blocked) and removed with `UNLINK`. On a cluster every key of a namespace sits
    /// in the slot of its hash tag, so the scan is sent to that slot's primary.
    pub async fn drop_namespace(&self) -> Result<u64> {
        let partitions = match &self.inner.partitions {
            Some(partitions) => partitions.unlink().await?,
            None => 0,
        };
        Ok(partitions + self.unlink_namespace().await?)
    }

    /// The event stream's calls on a store that does not declare `Events` (called on
    /// the backend directly, past [`Backend::as_events`]): `Unsupported`, as the
    /// handle answers.
    fn require_unpartitioned(&self) -> Result<()> {
        match self.inner.partitions {
            Some(_) => Err(Error::unsupported(durq_core::Capability::Events)),
            None => Ok(()),
        }
    }

    /// How many partitions the namespace is spread over: 1 unless it was created
    /// partitioned (see [`RedisConfig::partitions`](crate::RedisConfig::partitions)).
    pub fn partition_count(&self) -> usize {
        self.inner.partitions.as_ref().map_or(1, Partitions::count)
    }

    /// Resolves once the wake-up subscriber is subscribed (or after `timeout`); returns
    /// whether it is. Waiting for work works without it, by timeout.
    pub async fn wake_ready(&self, timeout: Duration) -> bool {
        self.inner.waker.subscribed(timeout).await
    }

    /// How many `wait_for_work` calls on this store are waiting now.
    pub fn waiting_for_work(&self) -> usize {
        self.inner.waker.waiting()
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn settings(&self) -> &StoreSettings {
        &self.inner.settings
    }

    // Redis connections are driven by tasks on the runtime the store was opened on: the
    // default's `tied_to_runtime` is this backend's.
    fn capabilities(&self) -> Capabilities {
        let partitioning = self
            .inner
            .partitions
            .as_ref()
            .map(|partitions| Partitioning::new(partitions.count(), crate::partitions::of_id));
        // A partitioned namespace counts a concurrency key in its one partition, and
        // no whole queue (CONTRACT P3). Dependencies are settled by the script that
        // ends a job, inside its one slot, so only an unpartitioned namespace keeps them
        // (a job and the jobs it waits for may live in different partitions).
        let whole = partitioning.is_none();
        Capabilities::default()
            .queue_wide_limits(whole)
            .dependencies(whole)
            .partitioning(partitioning)
    }

    async fn reopen(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(Some(Arc::new(self.reopened().await?)))
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        if let Some(partitions) = &self.inner.partitions {
            return partitions.enqueue(job, now).await;
        }
        let id = JobId::mint(now);
        // Concurrent enqueues of this store go to Redis together, each as called.
        self.inner
            .enqueues
            .call(Prepared {
                job,
                id,
                now,
                parent_elsewhere: false,
            })
            .await?
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.enqueue_batch(jobs, now).await,
            None => self.enqueue_many(jobs, now).await,
        }
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.home(id).read_job(id).await
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.home(id).read_payload(id).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.claim(request, now).await,
            None => self.claim_jobs(request, now).await,
        }
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.home(id)
            .heartbeat_many(&[HeldLease::new(id, token)], ttl, now)
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::corrupt("heartbeat reply", "no status")))
    }

    /// One `heartbeat.lua` call for the whole batch; the script answers each entry as
    /// `heartbeat` would.
    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.heartbeat_batch(leases, ttl, now).await,
            None => self.heartbeat_many(&leases, ttl, now).await,
        }
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.home(id)
            .inner
            .completions
            .call(lease::Completion {
                id,
                token,
                now,
                result,
            })
            .await?
    }

    /// One `complete.lua` call for the whole batch when it fits one (512 entries, 8 MiB
    /// of results); the script handles the entries in order, so a second entry for one
    /// job answers lease lost (L5). A larger batch goes through
    /// [`durq_core::complete_each`], which the grouping of concurrent completes batches
    /// anyway.
    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.complete_batch(completions, now).await,
            None => self.complete_many(completions, now).await,
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
        self.home(id).fail_job(id, token, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        self.home(id).release_job(id, token, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        Ok(self.reclaim_with_report(limit, now).await?.0)
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        let home = self.home(id);
        let waker = &self.inner.waker;
        // An announcement published before the subscription stands is lost: wait for
        // it (a server that is down fails the first read anyway).
        waker.subscribed(timeout.min(SUBSCRIBE_WAIT)).await;
        durq_core::ending::wait_until_ended(timeout, Some(ENDING_POLL), || {
            Box::pin(async move {
                let announced = waker.listen_for_endings();
                let job = home.await_job(id).await?;
                Ok(Armed::new(job, wake::ending_announced(announced, id)))
            })
        })
        .await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        let mut timeout = timeout;
        // A rate that holds jobs back frees a start at a known instant (K4): the wait
        // ends then, not a poll later. Read on the store's clock, which dates the starts.
        let limited = match &self.inner.partitions {
            Some(partitions) => partitions.names_limited_queue(queues),
            None => self.names_limited_queue(queues),
        };
        if limited {
            let now = self.inner.settings.now();
            let rate_free = match &self.inner.partitions {
                Some(partitions) => partitions.next_rate_free(queues, now).await?,
                None => self.next_rate_free(queues, now).await?,
            };
            if let Some(at) = rate_free {
                let frees_in = at.as_millis().saturating_sub(now.as_millis());
                timeout = timeout.min(Duration::from_millis(u64::try_from(frees_in).unwrap_or(0)));
            }
        }
        self.inner.waker.wait(queues, timeout).await;
        Ok(())
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

    /// On a partitioned namespace, the limits a key's jobs in one slot can keep
    /// (CONTRACT P3; docs/redis.md, "Flow control").
    fn as_flow_control(&self) -> Option<&dyn FlowControl> {
        Some(self)
    }

    /// On plain and partitioned namespaces alike: a job's steps live in its own slot,
    /// so every call is one script in the job's partition (docs/redis.md, "Durable
    /// steps").
    fn as_steps(&self) -> Option<&dyn Steps> {
        Some(self)
    }

    /// On an unpartitioned namespace only (CONTRACT §8): one stream in the namespace's
    /// slot, written by the script that makes each change. A partitioned namespace's
    /// partitions live on several servers, and one ordered stream would need a shared
    /// write per event; its stores mark no job (docs/redis.md, "Event stream").
    fn as_events(&self) -> Option<&dyn Events> {
        match self.inner.partitions {
            Some(_) => None,
            None => Some(self),
        }
    }
}

#[async_trait]
impl Events for RedisBackend {
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        self.require_unpartitioned()?;
        self.read_events(after, limit).await
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.require_unpartitioned()?;
        self.emit_event(id, token, name, data, now).await
    }

    async fn trim_events(&self, keep: u64) -> Result<u64> {
        self.require_unpartitioned()?;
        self.trim_stream(keep).await
    }
}

#[async_trait]
impl Steps for RedisBackend {
    async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.home(id).read_steps(id).await
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.home(id)
            .save_job_step(id, token, name, output, now)
            .await
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        self.home(id).reopen_job(id, step, generation, now).await
    }
}

#[async_trait]
impl FlowControl for RedisBackend {
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        match &self.inner.partitions {
            Some(partitions) => partitions.set_limits(queue, limits).await,
            None => self.put_limits(queue, limits).await,
        }
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.all_limits().await,
            None => self.all_limits().await,
        }
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        match &self.inner.partitions {
            Some(partitions) => partitions.flow_status(queue, now).await,
            None => self.read_flow_status(queue, now).await,
        }
    }
}

#[async_trait]
impl Inspect for RedisBackend {
    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.children(parent).await,
            None => self.read_children(parent).await,
        }
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.home(id).read_attempts(id).await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        match &self.inner.partitions {
            Some(partitions) => partitions.stats(queue, now).await,
            None => self.queue_stats(queue, now).await,
        }
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.queues(now).await,
            None => self.queue_overviews(now).await,
        }
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        match &self.inner.partitions {
            Some(partitions) => partitions.list(query).await,
            None => self.list_jobs(query).await,
        }
    }
}

#[async_trait]
impl Admin for RedisBackend {
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        self.home(id).cancel_job(id, now).await
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        self.home(id).retry_job(id, now).await
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        match &self.inner.partitions {
            Some(partitions) => partitions.purge(limit, cutoff).await,
            None => self.purge_finished(limit, cutoff).await,
        }
    }
}

#[async_trait]
impl Pause for RedisBackend {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        match &self.inner.partitions {
            Some(partitions) => partitions.set_paused(queue, paused).await,
            None => self.pause_queue(queue, paused).await,
        }
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        match &self.inner.partitions {
            Some(partitions) => partitions.paused_queues().await,
            None => self.read_paused_queues().await,
        }
    }
}

#[async_trait]
impl Schedules for RedisBackend {
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        self.save_schedule(name, spec, now).await
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        self.read_schedules().await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        self.change_schedule(name, update).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        self.remove_schedule(name).await
    }
}

#[async_trait]
impl WorkerRegistry for RedisBackend {
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        self.write_worker(id, spec, in_flight, now).await
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        self.touch_stored_worker(id, in_flight, now).await
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        self.remove_worker(id).await
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        self.read_workers().await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        self.reap_silent_workers(cutoff).await
    }
}
