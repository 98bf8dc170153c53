//! The front door: [`Store`], the one handle users and the worker runtime hold.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::{Backend, Capabilities};
use crate::capability::Capability;
use crate::error::{Error, Result};
use crate::events::{EventCursor, EventPage};
use crate::id::JobId;
use crate::layer::Layer;
use crate::limits::{FlowStatus, QueueLimits};
use crate::model::{
    ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job, JobState,
    LeaseToken, ListPage, ListQuery, NewJob, QueueOverview, QueueStats, ReclaimedJob, Retry,
    StoreSettings, TypedJob,
};
use crate::schedule::{Schedule, ScheduleRecord, ScheduleUpdate, StoredSchedule};
use crate::steps::StepLog;
use crate::time::Timestamp;
use crate::transaction;
use crate::validate;
use crate::workers::WorkerInfo;

/// A durable job store: the [contract](crate::contract), one method per operation,
/// over any [`Backend`].
///
/// Cheap to clone (one `Arc`), and every clone shares the backend. Every method
/// validates its input with [`crate::validate`] before the backend sees it, so bad input
/// gets the same [`Error::InvalidInput`] or [`Error::PayloadTooLarge`] on every backend
/// and writes nothing; reads "now" once from the backend's
/// [`StoreSettings::clock`], never from a server; and answers calls that have nothing
/// to do (a claim of zero jobs, an empty batch) without a round trip.
///
/// ```
/// # async fn demo(store: durq_core::Store) -> durq_core::Result<()> {
/// use std::time::Duration;
/// use durq_core::{ClaimRequest, NewJob};
///
/// let enqueued = store.enqueue(NewJob::new("emails").payload("hello")).await?;
/// let claimed = store
///     .claim(ClaimRequest::new(["emails"], "worker-1", Duration::from_secs(30)))
///     .await?;
/// for job in claimed {
///     store.complete(job.id(), job.token(), None).await?;
/// }
/// # let _ = enqueued;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Store {
    /// The backend with every layer around it: what each call goes to.
    backend: Arc<dyn Backend>,
    /// How `backend` was built, for [`Store::reopen`].
    stack: Arc<Stack>,
}

/// The backend a handle was made on and the layers [`Store::layer`] added around it,
/// innermost first.
struct Stack {
    base: Arc<dyn Backend>,
    layers: Vec<Arc<dyn Layer + Send + Sync>>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Store").field(&self.backend).finish()
    }
}

impl<B: Backend + 'static> From<B> for Store {
    fn from(backend: B) -> Self {
        Store::new(backend)
    }
}

impl From<Arc<dyn Backend>> for Store {
    fn from(backend: Arc<dyn Backend>) -> Self {
        Store {
            stack: Arc::new(Stack {
                base: Arc::clone(&backend),
                layers: Vec::new(),
            }),
            backend,
        }
    }
}

impl Store {
    /// A handle on `backend`.
    pub fn new(backend: impl Backend + 'static) -> Self {
        Store::from(Arc::new(backend) as Arc<dyn Backend>)
    }

    /// This handle with `layer` wrapped around its backend: every call made through
    /// the returned handle passes through the layer, after validation. Clones made
    /// before keep their layers.
    pub fn layer(self, layer: impl Layer + Send + Sync + 'static) -> Self {
        let backend = layer.layer(self.backend);
        let mut layers = self.stack.layers.clone();
        layers.push(Arc::new(layer));
        Store {
            backend,
            stack: Arc::new(Stack {
                base: Arc::clone(&self.stack.base),
                layers,
            }),
        }
    }

    /// The same store opened again over connections of its own, opened from the
    /// runtime this is called on, with this handle's layers around it (see
    /// [`Backend::reopen`]); `None` when its backend cannot be reopened, or needs no
    /// particular runtime and serves this one as it is.
    pub async fn reopen(&self) -> Result<Option<Store>> {
        let Some(base) = self.stack.base.reopen().await? else {
            return Ok(None);
        };
        let mut store = Store::from(base);
        for layer in &self.stack.layers {
            store = store.layer(Arc::clone(layer));
        }
        Ok(Some(store))
    }

    /// The backend behind the handle, with its layers. Its calls skip the handle's
    /// validation and clock read, so it is for tests only (feature `testing`): a
    /// layer is added with [`Store::layer`], not by wrapping this.
    #[cfg(feature = "testing")]
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The settings the backend was opened with, its clock included.
    pub fn settings(&self) -> &StoreSettings {
        self.backend.settings()
    }

    /// What the backend can do.
    pub fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// Whether the backend declares `capability`: when it does not, the operations of
    /// that capability answer [`Error::Unsupported`].
    pub fn supports(&self, capability: Capability) -> bool {
        self.backend.supports(capability)
    }

    /// The current instant on the store's clock.
    pub fn now(&self) -> Timestamp {
        self.backend.settings().now()
    }

    /// Rules E1–E7: adds a job, or returns the existing job for a live idempotency key.
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        let (job, now) = transaction::prepare_enqueue(self.settings(), job)?;
        if self.backend.as_flow_control().is_none() {
            validate::refuse_concurrency_keys([&job])?;
        }
        // Read the capability only for a job that needs it: plain enqueues pay nothing.
        if !job.depends_on.is_empty() && !self.backend.capabilities().dependencies {
            validate::refuse_dependencies([&job])?;
        }
        self.backend.enqueue(job, now).await
    }

    /// Enqueues `job` on its type's queue, as JSON (see [`TypedJob`]).
    pub async fn enqueue_typed<J: TypedJob>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue(NewJob::typed(job)?).await
    }

    /// Rule E9: the same as enqueueing each job in order, answered in order, in far
    /// fewer round trips (and fsyncs). A batch holding an invalid job is refused whole
    /// and writes nothing.
    pub async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        let (jobs, now) = transaction::prepare_batch(self.settings(), jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        if self.backend.as_flow_control().is_none() {
            validate::refuse_concurrency_keys(&jobs)?;
        }
        if jobs.iter().any(|job| !job.depends_on.is_empty())
            && !self.backend.capabilities().dependencies
        {
            validate::refuse_dependencies(&jobs)?;
        }
        self.backend.enqueue_batch(jobs, now).await
    }

    /// Enqueues a job on `queue` whose payload is `value` as JSON.
    pub async fn enqueue_json<T>(&self, queue: &str, value: &T) -> Result<Enqueued>
    where
        T: serde::Serialize + ?Sized,
    {
        let job = NewJob::new(queue).json(value)?;
        self.enqueue(job).await
    }

    /// Rule E1: the job as stored, or [`Error::NotFound`].
    pub async fn get(&self, id: JobId) -> Result<Job> {
        self.backend.get(id).await
    }

    /// Rule E1: the job's payload bytes, exactly as enqueued.
    pub async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.backend.payload(id).await
    }

    /// Reads a job's payload as JSON.
    pub async fn payload_json<T>(&self, id: JobId) -> Result<T>
    where
        T: serde::de::DeserializeOwned,
    {
        let bytes = self.payload(id).await?;
        serde_json::from_slice(&bytes)
            .map_err(|err| Error::invalid("payload", format!("not the expected JSON: {err}")))
    }

    /// Rules O1, O2: waits until job `id` has ended and returns it as stored then
    /// (`succeeded` with its `result`, `dead` or `cancelled` with its `last_error`),
    /// or `None` when `timeout` (real time) passes first. A job that has already ended
    /// is returned at once; an unknown job is [`Error::NotFound`]. The backend wakes
    /// the wait when the job ends, from any handle or process, instead of polling.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use durq_core::{Store, NewJob, Result, JobState};
    /// # async fn example(store: Store) -> Result<()> {
    /// let id = store.enqueue(NewJob::new("reports")).await?.id;
    /// // ... a worker runs it ...
    /// match store.wait(id, Duration::from_secs(30)).await? {
    ///     Some(job) if job.state == JobState::Succeeded => println!("{:?}", job.result),
    ///     Some(job) => println!("ended {}: {:?}", job.state, job.last_error),
    ///     None => println!("still running after 30 s"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        self.backend.wait_for_ending(id, timeout).await
    }

    /// Rules G1, G4: the jobs `job` waits (or waited) for, in the order it named them,
    /// each as stored now, or `None` for one purged since: what an operator reads to see
    /// why a job waits, and a handler to read what its dependencies returned.
    pub async fn dependencies(&self, job: &Job) -> Result<Vec<(JobId, Option<Job>)>> {
        let mut found = Vec::with_capacity(job.depends_on.len());
        for &id in &job.depends_on {
            match self.backend.get(id).await {
                Ok(dependency) => found.push((id, Some(dependency))),
                Err(Error::NotFound { .. }) => found.push((id, None)),
                Err(err) => return Err(err),
            }
        }
        Ok(found)
    }

    /// Rule E8: the jobs enqueued with `parent`, oldest first.
    pub async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        self.backend.require_inspect()?.children(parent).await
    }

    /// Rules C1–C9, F1–F6: leases up to `request.limit` ready jobs in claim order and
    /// returns them, with payloads, in that order; with a budget, only jobs it admits,
    /// and with preferred localities, those first within each priority. A request
    /// naming one queue twice is refused.
    pub async fn claim(&self, mut request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        validate::validate_claim(&request)?;
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        if request.reserved.is_some() {
            // A reservation names one job; backends may rely on a limit of one.
            request.limit = 1;
        }
        // Order among preferred localities does not matter, only membership.
        let mut seen = std::collections::HashSet::with_capacity(request.prefer.len());
        request
            .prefer
            .retain(|locality| seen.insert(locality.clone()));
        self.backend.claim(request, self.now()).await
    }

    /// Claims at most one job.
    pub async fn claim_one(
        &self,
        queues: &[&str],
        worker: &str,
        lease_ttl: Duration,
    ) -> Result<Option<ClaimedJob>> {
        let request = ClaimRequest::new(queues.iter().copied(), worker, lease_ttl).limit(1);
        Ok(self.claim(request).await?.into_iter().next())
    }

    /// Rule L1: extends the lease to now + `ttl`; reports a requested cancellation.
    pub async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Heartbeat> {
        validate::validate_lease_ttl(ttl)?;
        self.backend.heartbeat(id, token, ttl, self.now()).await
    }

    /// Rule L1, one `heartbeat` per entry, all with the same `ttl`: the answer at index
    /// `i` is what `heartbeat` would have answered for `leases[i]`, and an entry that
    /// fails (a stale token, an unknown job) leaves the others alone. Every backend of
    /// this workspace renews them in one round trip.
    ///
    /// `Err` means the call failed as a whole (the store was unavailable, or `ttl` is
    /// invalid): any entry may or may not have been extended. Calling again is safe.
    pub async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        validate::validate_lease_ttl(ttl)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.backend.heartbeat_batch(leases, ttl, self.now()).await
    }

    /// Rules L4, L5: marks the job succeeded and stores `result`.
    pub async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<()> {
        let now = transaction::prepare_complete(self.settings(), result.as_ref())?;
        self.backend.complete(id, token, result, now).await
    }

    /// Rules L4, L5, one `complete` per entry: the answer at index `i` is what
    /// `complete` would have answered for `completions[i]`, an entry that fails (a stale
    /// token, an oversized result, a second completion of the same job later in the
    /// batch) leaves the others alone, and entries take effect in order.
    ///
    /// `Err` means the call failed as a whole, like a failed `complete`: any of the
    /// entries may or may not have taken effect. Calling again is safe; an entry that
    /// was recorded then answers lease lost (L5).
    pub async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let settings = self.settings();
        let refused: Vec<Option<Error>> = completions
            .iter()
            .map(|c| match &c.result {
                Some(bytes) => validate::validate_size("result", bytes.len(), settings).err(),
                None => None,
            })
            .collect();
        if refused.iter().all(Option::is_none) {
            return self.backend.complete_batch(completions, self.now()).await;
        }
        // Oversized results are answered here; the rest go to the backend in order.
        let valid: Vec<Completion> = completions
            .into_iter()
            .zip(&refused)
            .filter(|(_, refused)| refused.is_none())
            .map(|(completion, _)| completion)
            .collect();
        let mut answers = if valid.is_empty() {
            Vec::new()
        } else {
            self.backend.complete_batch(valid, self.now()).await?
        }
        .into_iter();
        let mut merged = Vec::with_capacity(refused.len());
        for refusal in refused {
            merged.push(match refusal {
                Some(err) => Err(err),
                None => answers.next().unwrap_or_else(|| {
                    Err(Error::Backend {
                        message: "the backend answered fewer completions than it was given"
                            .to_owned(),
                        source: None,
                    })
                }),
            });
        }
        Ok(merged)
    }

    /// Rules L6, L7: records `error` (cut to [`validate::MAX_ERROR_BYTES`]) and requeues
    /// the job at the retry time (now, if that time has passed), or makes it dead when
    /// asked to or when its attempts are used up. Returns the new state.
    pub async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> Result<JobState> {
        let now = self.now();
        let retry = match retry {
            Retry::At(at) => Retry::At(at.max(now)),
            Retry::Never => Retry::Never,
        };
        self.backend
            .fail(id, token, validate::truncate_error(error), retry, now)
            .await
    }

    /// Rule L8: gives the job back, ready now, without counting the attempt.
    pub async fn release(&self, id: JobId, token: LeaseToken) -> Result<()> {
        let now = self.now();
        self.backend.release(id, token, now, now).await
    }

    /// Rule L10: gives the job back to run again after `delay`, without counting the
    /// attempt and without recording a failure: "not now, later". A snoozed job is
    /// `scheduled` until then (`queued` at once for a zero delay).
    pub async fn snooze(&self, id: JobId, token: LeaseToken, delay: Duration) -> Result<()> {
        let now = self.now();
        self.backend
            .release(id, token, now.saturating_add(delay), now)
            .await
    }

    /// Rule L10: [`Store::snooze`] until `at`; a time already past means now.
    pub async fn snooze_until(&self, id: JobId, token: LeaseToken, at: Timestamp) -> Result<()> {
        let now = self.now();
        self.backend.release(id, token, at.max(now), now).await
    }

    /// Rules R1–R6: recovers up to `limit` jobs whose lease expired.
    pub async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.backend.reclaim(limit, self.now()).await
    }

    /// Rule A1: cancels a queued job, asks a running one to stop, leaves a terminal one.
    /// Returns the job's state afterwards.
    pub async fn cancel(&self, id: JobId) -> Result<JobState> {
        self.backend.require_admin()?.cancel(id, self.now()).await
    }

    /// Rule A2: queues a dead or cancelled job again with its attempts reset.
    /// Any other state is refused with [`Error::InvalidState`].
    pub async fn retry(&self, id: JobId) -> Result<()> {
        self.backend.require_admin()?.retry(id, self.now()).await
    }

    /// Rule D2: the job's generation and the steps it saved in it, oldest first.
    /// A job that saved none answers its generation and no steps; an unknown job is
    /// [`Error::NotFound`].
    pub async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.backend.require_steps()?.steps(id).await
    }

    /// Rule D1: saves `output` as step `name` of the job running under `token`, so a
    /// later run of the job finds it (the worker's `ctx.step` calls this). The first
    /// save of a name stands; saving it again changes nothing. A token that no longer
    /// holds the lease is [`Error::LeaseLost`] and writes nothing. A name outside
    /// `[A-Za-z0-9._:-]{1,128}`, or an output over `max_payload_bytes`, is refused
    /// before the backend is called.
    pub async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
    ) -> Result<()> {
        validate::validate_step(name)?;
        validate::validate_size("output", output.len(), self.backend.settings())?;
        self.backend
            .require_steps()?
            .save_step(id, token, name, output, self.now())
            .await
    }

    /// Rule D3: reopens an ended job (succeeded, dead or cancelled) from step `step`:
    /// the steps saved before it are kept, `step` and every step after it run again.
    /// `generation` is the one the caller read ([`Store::steps`]): of two reopens that
    /// read the same generation exactly one wins (D4), the other is
    /// [`Error::StaleGeneration`]. The job is queued as [`Store::retry`] queues it.
    pub async fn retry_from(&self, id: JobId, step: &str, generation: u64) -> Result<()> {
        validate::validate_step(step)?;
        self.backend
            .require_steps()?
            .retry_from(id, step, generation, self.now())
            .await
    }

    /// Rule V2: up to `limit` (1..=1,000) events of the namespace's stream after
    /// `after` ([`EventCursor::START`](crate::EventCursor::START) for the oldest kept),
    /// oldest first, and the cursor to read on from. A consumer that saves `next` and
    /// reads from it after a restart sees each later event once, in order; `trimmed`
    /// says events it had not read were trimmed away first (V3).
    pub async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        validate::validate_events_limit(limit)?;
        self.backend.require_events()?.events(after, limit).await
    }

    /// Rule V1: records an `emitted` event `name` with `data` for the job running under
    /// `token` (the worker's `ctx.emit` calls this). A token that no longer holds the
    /// lease is [`Error::LeaseLost`] and writes nothing. A name outside
    /// `[A-Za-z0-9._:-]{1,128}`, or data over 64 KiB, is refused before the backend is
    /// called.
    pub async fn emit(&self, id: JobId, token: LeaseToken, name: &str, data: Bytes) -> Result<()> {
        validate::validate_event(name, data.len())?;
        self.backend
            .require_events()?
            .emit(id, token, name, data, self.now())
            .await
    }

    /// Rule V3: deletes every event of the namespace but the newest `keep` (at least
    /// 1); answers how many it deleted. The worker's purge
    /// loop calls it with its store's
    /// [`StoreSettings::record_events`](crate::StoreSettings::record_events) bound.
    pub async fn trim_events(&self, keep: u64) -> Result<u64> {
        validate::validate_events_kept(keep)?;
        self.backend.require_events()?.trim_events(keep).await
    }

    /// Rule A3: counts of one queue's jobs per state, and whether it is paused (Q1).
    pub async fn stats(&self, queue: &str) -> Result<QueueStats> {
        validate::validate_queue(queue)?;
        let inspect = self.backend.require_inspect()?;
        let (stats, paused) =
            futures_util::future::join(inspect.stats(queue, self.now()), self.paused()).await;
        let paused = paused?;
        Ok(QueueStats {
            paused: paused.binary_search_by(|p| p.as_str().cmp(queue)).is_ok(),
            ..stats?
        })
    }

    /// Rule A7: every queue of the namespace that holds a job or is paused, sorted by
    /// name, without naming them first: each with its counts per state (as
    /// [`Store::stats`]), whether it is paused, its lag, how long its oldest ready
    /// job has waited at the instant of the call, and its limits (K3).
    pub async fn queues(&self) -> Result<Vec<QueueOverview>> {
        let now = self.now();
        let inspect = self.backend.require_inspect()?;
        let limits = async {
            match self.backend.as_flow_control() {
                Some(flow_control) => flow_control.limits().await,
                None => Ok(Vec::new()),
            }
        };
        let (queues, paused, limits) =
            futures_util::future::join3(inspect.queues(now), self.paused(), limits).await;
        let (mut queues, paused, limits) = (queues?, paused?, limits?);
        for overview in &mut queues {
            overview.stats.paused = paused
                .binary_search_by(|p| p.as_str().cmp(&overview.queue))
                .is_ok();
            overview.lag = overview.oldest_ready.map(|ready| now.duration_since(ready));
            if let Ok(at) = limits.binary_search_by(|(name, _)| name.as_str().cmp(&overview.queue))
            {
                overview.limits = limits[at].1;
            }
        }
        for name in paused {
            if queues.binary_search_by(|q| q.queue.cmp(&name)).is_err() {
                let stats = QueueStats {
                    paused: true,
                    ..QueueStats::default()
                };
                queues.push(QueueOverview::new(name, stats, None));
            }
        }
        queues.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(queues)
    }

    /// Rule W1: records `worker` as running, replacing any record of its id whole:
    /// its `started_at` and `last_seen` become now, its `in_flight` is as given.
    pub async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        worker.validate()?;
        let now = self.now();
        let record = WorkerInfo {
            started_at: now,
            last_seen: now,
            ..worker.clone()
        };
        let spec = record.to_spec()?;
        self.backend
            .require_worker_registry()?
            .put_worker(&worker.id, &spec, worker.in_flight, now)
            .await
    }

    /// Rule W2: the worker reports it is alive, running `in_flight` jobs: its
    /// `last_seen` becomes now. An unknown worker is [`Error::WorkerNotFound`] (it was
    /// reaped, or never registered: register again).
    pub async fn worker_heartbeat(&self, id: &str, in_flight: u32) -> Result<()> {
        validate::validate_worker(id)?;
        if self
            .backend
            .require_worker_registry()?
            .touch_worker(id, in_flight, self.now())
            .await?
        {
            Ok(())
        } else {
            Err(Error::WorkerNotFound { id: id.to_owned() })
        }
    }

    /// Rule W3: removes worker `id`'s record, as a worker does when it shuts down;
    /// whether it was registered.
    pub async fn deregister_worker(&self, id: &str) -> Result<bool> {
        validate::validate_worker(id)?;
        self.backend
            .require_worker_registry()?
            .delete_worker(id)
            .await
    }

    /// Rule W1: every registered worker of the namespace, sorted by id.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let stored = self.backend.require_worker_registry()?.workers().await?;
        stored.iter().map(WorkerInfo::from_stored).collect()
    }

    /// Rule W1: worker `id`, or [`Error::WorkerNotFound`].
    pub async fn worker(&self, id: &str) -> Result<WorkerInfo> {
        validate::validate_worker(id)?;
        let stored = self.backend.require_worker_registry()?.workers().await?;
        match stored.iter().find(|w| w.id == id) {
            Some(found) => WorkerInfo::from_stored(found),
            None => Err(Error::WorkerNotFound { id: id.to_owned() }),
        }
    }

    /// Rule W4: removes the workers not heard of for longer than `silent_for`
    /// (`last_seen < now - silent_for`), and returns their ids, sorted. Their leases
    /// are left alone: `reclaim` takes their jobs back once the leases expire.
    pub async fn reap_workers(&self, silent_for: Duration) -> Result<Vec<String>> {
        let cutoff = self.now().saturating_sub(silent_for);
        self.backend
            .require_worker_registry()?
            .reap_workers(cutoff)
            .await
    }

    /// Rule Q1: pauses `queue` for every worker of every process: no claim takes its
    /// jobs until [`Store::resume`]. Enqueues still land, and running jobs finish. A
    /// queue needs no jobs to be paused, and pausing a paused queue changes nothing.
    pub async fn pause(&self, queue: &str) -> Result<()> {
        validate::validate_queue(queue)?;
        self.backend.require_pause()?.set_paused(queue, true).await
    }

    /// Rule Q1: lets claims take `queue`'s jobs again, in the order they had.
    pub async fn resume(&self, queue: &str) -> Result<()> {
        validate::validate_queue(queue)?;
        self.backend.require_pause()?.set_paused(queue, false).await
    }

    /// The paused queues, or none on a backend that cannot pause queues: what
    /// [`Store::stats`] and [`Store::queues`] mark as paused.
    async fn paused(&self) -> Result<Vec<String>> {
        match self.backend.as_pause() {
            Some(pause) => pause.paused_queues().await,
            None => Ok(Vec::new()),
        }
    }

    /// Rule Q1: the paused queues, sorted by name.
    pub async fn paused_queues(&self) -> Result<Vec<String>> {
        self.backend.require_pause()?.paused_queues().await
    }

    /// Rule K3: sets `queue`'s limits on its running jobs, for every worker of every
    /// process, from the next claim on: at most [`QueueLimits::max_running`] of its
    /// jobs at once (K2), and at most [`QueueLimits::max_running_per_key`] of one
    /// concurrency key (K1). Unlimited limits remove the queue's. A queue needs no jobs
    /// to have limits; a limit of 0 is refused (pause the queue instead).
    ///
    /// ```no_run
    /// # async fn demo(store: durq_core::Store) -> durq_core::Result<()> {
    /// use durq_core::{NewJob, QueueLimits};
    /// store
    ///     .set_limits("invoices", QueueLimits::new().max_running_per_key(1))
    ///     .await?;
    /// store
    ///     .enqueue(NewJob::new("invoices").concurrency_key("customer-42"))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        validate::validate_queue(queue)?;
        limits.validate()?;
        let flow = self.backend.require_flow_control()?;
        if !self.backend.capabilities().queue_wide_limits {
            limits.refuse_queue_wide()?;
        }
        flow.set_limits(queue, limits).await
    }

    /// Rule K3: `queue`'s limits, unlimited when it has none.
    pub async fn limits(&self, queue: &str) -> Result<QueueLimits> {
        validate::validate_queue(queue)?;
        let all = self.backend.require_flow_control()?.limits().await?;
        Ok(all
            .into_iter()
            .find_map(|(name, limits)| (name == queue).then_some(limits))
            .unwrap_or_default())
    }

    /// Rule K3: the limits of every queue that has some, sorted by queue name.
    pub async fn all_limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        self.backend.require_flow_control()?.limits().await
    }

    /// Rule K3: what `queue`'s limits hold back now: its running jobs, the concurrency
    /// keys at their running limit, and when its rates admit a start again.
    pub async fn flow_status(&self, queue: &str) -> Result<FlowStatus> {
        validate::validate_queue(queue)?;
        self.backend
            .require_flow_control()?
            .flow_status(queue, self.now())
            .await
    }

    /// Rule S1: stores `schedule`, replacing the definition of one of the same name
    /// but keeping whether it is enabled and its last tick. A new schedule is enabled
    /// and fires from now on.
    pub async fn put_schedule(&self, schedule: &Schedule) -> Result<()> {
        schedule.validate()?;
        validate::validate_new_job(&schedule.job, self.settings())?;
        let spec = schedule.to_spec()?;
        self.backend
            .require_schedules()?
            .put_schedule(&schedule.name, &spec, self.now())
            .await
    }

    /// Rule S1: every schedule, by name, with whether it is enabled, its last tick and
    /// its next one.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        self.backend
            .require_schedules()?
            .schedules()
            .await?
            .into_iter()
            .map(|stored| {
                let schedule = Schedule::from_spec(&stored.name, &stored.spec)?;
                let next_tick = schedule.next_after(stored.last_tick)?;
                Ok(ScheduleRecord {
                    schedule,
                    enabled: stored.enabled,
                    last_tick: stored.last_tick,
                    next_tick,
                })
            })
            .collect()
    }

    /// Rule S2: lets schedulers fire schedule `name` again, from its next tick after
    /// now (the ticks missed while disabled follow its catch-up policy).
    pub async fn enable_schedule(&self, name: &str) -> Result<()> {
        self.set_schedule_enabled(name, true).await
    }

    /// Rule S2: stops schedulers from firing schedule `name`; a firing racing the
    /// disable never enables it again.
    pub async fn disable_schedule(&self, name: &str) -> Result<()> {
        self.set_schedule_enabled(name, false).await
    }

    async fn set_schedule_enabled(&self, name: &str, enabled: bool) -> Result<()> {
        validate::validate_name("schedule name", name, 128)?;
        let update = ScheduleUpdate {
            enabled: Some(enabled),
            last_tick: None,
        };
        self.backend
            .require_schedules()?
            .update_schedule(name, update)
            .await
    }

    /// Rule S1: deletes schedule `name`; whether it existed.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        validate::validate_name("schedule name", name, 128)?;
        self.backend
            .require_schedules()?
            .delete_schedule(name)
            .await
    }

    /// Rule S3: one pass of a scheduler. For each enabled schedule, enqueues the job of
    /// each due tick (per its catch-up policy) with the tick's idempotency key, then
    /// moves its last tick forward. Any number of schedulers may run passes at once, in
    /// any number of processes: each tick is enqueued once. Returns the jobs this pass
    /// created, by schedule.
    ///
    /// A tick is enqueued once while its key deduplicates: a pass that read a
    /// schedule, then stalled longer than the store's dedup window before enqueueing,
    /// could enqueue a tick again.
    ///
    /// One schedule that cannot fire (its stored definition is unreadable, its job no
    /// longer valid under the store's settings, a call failed) does not hold up the
    /// others: the pass fires them all, then returns the first error.
    pub async fn fire_schedules(&self) -> Result<Vec<(String, JobId)>> {
        let now = self.now();
        let mut fired = Vec::new();
        let mut first_error = None;
        for stored in self.backend.require_schedules()?.schedules().await? {
            if !stored.enabled {
                continue;
            }
            if let Err(err) = self.fire_one(&stored, now, &mut fired).await {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(fired),
        }
    }

    async fn fire_one(
        &self,
        stored: &StoredSchedule,
        now: Timestamp,
        fired: &mut Vec<(String, JobId)>,
    ) -> Result<()> {
        let schedule = Schedule::from_spec(&stored.name, &stored.spec)?;
        let Some(due) = schedule.due(stored.last_tick, now)? else {
            return Ok(());
        };
        let jobs: Vec<NewJob> = due.fire.iter().map(|&t| schedule.tick_job(t)).collect();
        if !jobs.is_empty() {
            validate::validate_batch(&jobs, self.settings())?;
            for enqueued in self.backend.enqueue_batch(jobs, now).await? {
                if enqueued.created {
                    fired.push((schedule.name.clone(), enqueued.id));
                }
            }
        }
        let update = ScheduleUpdate {
            enabled: None,
            last_tick: Some(due.latest),
        };
        match self
            .backend
            .require_schedules()?
            .update_schedule(&schedule.name, update)
            .await
        {
            // Deleted while this pass ran: its ticks were enqueued as it stood.
            Err(Error::ScheduleNotFound { .. }) => Ok(()),
            other => other,
        }
    }

    /// Rules H1–H4: every attempt of job `id`, oldest first, the running one included:
    /// who ran it, when, how it ended and with what error. At most
    /// [`ATTEMPTS_KEPT`](crate::ATTEMPTS_KEPT), the newest.
    pub async fn attempts(&self, id: JobId) -> Result<Vec<crate::Attempt>> {
        self.backend.require_inspect()?.attempts(id).await
    }

    /// Rule A4: one page of the jobs `query` matches, newest first: by queue (or every
    /// queue), queue prefix, states, tenant and tags.
    pub async fn list(&self, query: ListQuery) -> Result<ListPage> {
        validate::validate_list(&query)?;
        self.backend.require_inspect()?.list(query).await
    }

    /// Rule A5: deletes up to `limit` terminal jobs whose retention has passed, with
    /// their index entries. Returns how many were deleted.
    pub async fn purge(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let cutoff = self.settings().retention_cutoff(self.now());
        self.backend.require_admin()?.purge(limit, cutoff).await
    }

    /// Resolves when work may have arrived on one of `queues`, or after `timeout`
    /// (real time), whichever comes first. Spurious wake-ups are allowed; a claimer
    /// calls `claim` after it either way.
    pub async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        validate::validate_queues(queues)?;
        self.backend.wait_for_work(queues, timeout).await
    }
}

/// A relative delay becomes an absolute `run_at` on the store's clock.
#[cfg(test)]
mod tests {
    use super::*;

    /// Compile-time proof that the handle's futures are `Send`, so a `Store` can be
    /// used from any tokio task.
    #[allow(dead_code)]
    fn store_futures_are_send(store: Store) {
        fn is_send<T: Send>(_: &T) {}
        fn is_send_sync<T: Send + Sync>(_: &T) {}
        is_send_sync(&store);
        let id = JobId::mint(Timestamp::from_millis(0));
        let token = LeaseToken::new(1);
        is_send(&store.enqueue(NewJob::new("q")));
        is_send(&store.claim(ClaimRequest::new(["q"], "w", Duration::from_secs(1))));
        is_send(&store.heartbeat(id, token, Duration::from_secs(1)));
        is_send(&store.complete(id, token, None));
        is_send(&store.complete_batch(vec![Completion::new(id, token, None)]));
        is_send(&store.heartbeat_batch(vec![HeldLease::new(id, token)], Duration::from_secs(1)));
        is_send(&store.fail(id, token, "boom", Retry::Never));
        is_send(&store.reclaim(10));
        is_send(&store.enqueue_json("q", &42));
        is_send(&store.claim_one(&["q"], "w", Duration::from_secs(1)));
    }
}
