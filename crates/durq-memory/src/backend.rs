//! [`MemoryBackend`]: the `Backend` of one namespace and its capability traits, each
//! operation a short critical section over the namespace's state (`store/`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    async_trait, Admin, Attempt, Backend, Bytes, Capabilities, ClaimRequest, ClaimedJob,
    Completion, Enqueued, EventCursor, EventPage, Events, FlowControl, FlowStatus, Heartbeat,
    HeldLease, Inspect, Job, JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, Pause,
    QueueLimits, QueueOverview, QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate, Schedules,
    StepLog, Steps, StoreSettings, StoredSchedule, StoredWorker, Timestamp, WorkerRegistry,
};

use durq_core::ending::Armed;

use crate::store::{Namespace, Prepared, State};
use crate::MemoryServer;

/// The in-memory store.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    namespace: Arc<Namespace>,
    settings: StoreSettings,
}

impl MemoryBackend {
    pub(crate) fn on(namespace: Arc<Namespace>, settings: StoreSettings) -> Self {
        MemoryBackend {
            namespace,
            settings,
        }
    }

    /// A store with its own private data.
    pub fn new(settings: StoreSettings) -> Result<Self> {
        MemoryServer::new().open(settings)
    }

    /// Runs `end` (calls that take jobs out of `running`) under the namespace's lock,
    /// then wakes the waiting claimers if a job of a queue with limits left `running`:
    /// jobs its limits held back may be admitted now (K1, K2), and a claimer that found
    /// nothing it could take waits for exactly that.
    fn ending_leases<T>(&self, end: impl FnOnce(&mut State) -> T) -> T {
        let (answer, freed) = {
            let mut state = self.namespace.lock();
            let answer = end(&mut state);
            (answer, state.take_freed_slot())
        };
        if freed {
            self.namespace.signal_work();
        }
        answer
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    fn capabilities(&self) -> Capabilities {
        // Every call completes on any runtime: in-process state behind a lock.
        Capabilities::default()
            .tied_to_runtime(false)
            .dependencies(true)
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let prepared = State::prepare(job, now);
        let enqueued = {
            let mut state = self.namespace.lock();
            state.check_parents([prepared.job()])?;
            state.check_dependencies([&prepared])?;
            state.enqueue(prepared, now, &self.settings, &[])
        };
        if enqueued.created {
            self.namespace.signal_work();
        }
        Ok(enqueued)
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let prepared: Vec<_> = jobs
            .into_iter()
            .map(|job| State::prepare(job, now))
            .collect();
        let results: Vec<Enqueued> = {
            let mut state = self.namespace.lock();
            state.check_parents(prepared.iter().map(|p| p.job()))?;
            state.check_dependencies(&prepared)?;
            // The ids answered so far, which a later job may wait for by index (G2);
            // kept only for a batch that has dependencies.
            let graph = prepared.iter().any(Prepared::has_dependencies);
            let mut answers: Vec<Enqueued> = Vec::with_capacity(prepared.len());
            let mut ids: Vec<JobId> = Vec::new();
            for job in prepared {
                let answer = state.enqueue(job, now, &self.settings, &ids);
                if graph {
                    ids.push(answer.id);
                }
                answers.push(answer);
            }
            answers
        };
        if results.iter().any(|e| e.created) {
            self.namespace.signal_work();
        }
        Ok(results)
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.namespace.lock().job(id).cloned()
    }

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        self.namespace.lock().payload(id)
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        Ok(self.namespace.lock().claim(&request, now))
    }

    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        self.namespace.lock().heartbeat(id, token, ttl, now)
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let mut state = self.namespace.lock();
        Ok(leases
            .into_iter()
            .map(|lease| state.heartbeat(lease.id, lease.token, ttl, now))
            .collect())
    }

    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        self.ending_leases(|state| state.complete(id, token, result, now))
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        Ok(self.ending_leases(|state| {
            completions
                .into_iter()
                .map(|Completion { id, token, result }| state.complete(id, token, result, now))
                .collect()
        }))
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let state = self.ending_leases(|state| state.fail(id, token, error, retry, now))?;
        if state == JobState::Queued {
            self.namespace.signal_work();
        }
        Ok(state)
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let state = self.ending_leases(|state| state.release(id, token, ready_at, now))?;
        if state == JobState::Queued {
            self.namespace.signal_work();
        }
        Ok(())
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        let reclaimed = self.ending_leases(|state| state.reclaim(limit, now));
        if reclaimed.iter().any(|r| r.state == JobState::Queued) {
            self.namespace.signal_work();
        }
        Ok(reclaimed)
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        let endings = &self.namespace.endings;
        let namespace = &self.namespace;
        let _counted = endings.count_wait();
        // Every ending in the namespace signals, so no poll: nothing here can lose a
        // signal.
        durq_core::ending::wait_until_ended(timeout, None, || {
            Box::pin(async move {
                let woken = endings.next_ending();
                let job = namespace.lock().job(id).cloned()?;
                Ok(Armed { job, woken })
            })
        })
        .await
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        // A rate that holds jobs back frees a start at a known instant (K4): the wait
        // ends then, so the claimer neither spins nor oversleeps it.
        let mut timeout = timeout;
        if self.namespace.has_rates.load(Ordering::Relaxed) {
            let now = self.settings.now();
            if let Some(at) = self.namespace.lock().next_rate_free(queues, now) {
                let due =
                    u64::try_from(at.as_millis().saturating_sub(now.as_millis())).unwrap_or(0);
                timeout = timeout.min(Duration::from_millis(due));
            }
        }
        // Any queue's news wakes every waiter: a spurious wake-up costs one empty claim,
        // while per-queue signals would cost a map lookup on every enqueue.
        let _ = tokio::time::timeout(timeout, self.namespace.work_arrived.notified()).await;
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
impl Events for MemoryBackend {
    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        Ok(self.namespace.lock().events(after, limit))
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.namespace.lock().emit(id, token, name, data, now)
    }

    async fn trim_events(&self, keep: u64) -> Result<u64> {
        Ok(self.namespace.lock().trim_events(keep))
    }
}

#[async_trait]
impl Steps for MemoryBackend {
    async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.namespace.lock().steps(id)
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.namespace
            .lock()
            .save_step(id, token, name, output, now)
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        #[cfg(feature = "testing")]
        if self.namespace.lock().reopens_checks_apart() {
            // The mutant of D4: checked under one hold of the lock, changed under
            // another, so reopens that checked in between all win.
            let reopened = self.namespace.lock().check_reopen(id, step, generation)?;
            tokio::task::yield_now().await;
            self.namespace.lock().reopen(id, reopened, now)?;
            self.namespace.signal_work();
            return Ok(());
        }
        self.namespace
            .lock()
            .retry_from(id, step, generation, now)?;
        self.namespace.signal_work();
        Ok(())
    }
}

#[async_trait]
impl FlowControl for MemoryBackend {
    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        let has_rates = {
            let mut state = self.namespace.lock();
            state.set_limits(queue, limits);
            state.has_rates()
        };
        self.namespace.has_rates.store(has_rates, Ordering::Relaxed);
        // Jobs held back by the old limits may be admitted now.
        self.namespace.signal_work();
        Ok(())
    }

    async fn limits(&self) -> Result<Vec<(String, QueueLimits)>> {
        Ok(self.namespace.lock().limits())
    }

    async fn flow_status(&self, queue: &str, now: Timestamp) -> Result<FlowStatus> {
        Ok(self.namespace.lock().flow_status(queue, now))
    }
}

#[async_trait]
impl Inspect for MemoryBackend {
    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
        Ok(self.namespace.lock().children(parent))
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.namespace.lock().attempt_history(id)
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        Ok(self.namespace.lock().stats(queue, now))
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        Ok(self.namespace.lock().queues(now))
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        Ok(self.namespace.lock().list(&query))
    }
}

#[async_trait]
impl Admin for MemoryBackend {
    async fn cancel(&self, id: JobId, now: Timestamp) -> Result<JobState> {
        // Cancelling a job settles the jobs waiting for it, which may queue them (G3).
        self.ending_leases(|state| state.cancel(id, now))
    }

    async fn retry(&self, id: JobId, now: Timestamp) -> Result<()> {
        self.namespace.lock().retry(id, now)?;
        self.namespace.signal_work();
        Ok(())
    }

    async fn purge(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        Ok(self.namespace.lock().purge(limit, cutoff))
    }
}

#[async_trait]
impl Pause for MemoryBackend {
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        let was = self.namespace.lock().set_paused(queue, paused);
        if was && !paused {
            self.namespace.signal_work();
        }
        Ok(())
    }

    async fn paused_queues(&self) -> Result<Vec<String>> {
        Ok(self.namespace.lock().paused_queues())
    }
}

#[async_trait]
impl Schedules for MemoryBackend {
    async fn put_schedule(&self, name: &str, spec: &str, now: Timestamp) -> Result<()> {
        self.namespace.lock().put_schedule(name, spec, now);
        Ok(())
    }

    async fn schedules(&self) -> Result<Vec<StoredSchedule>> {
        Ok(self.namespace.lock().schedules())
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        self.namespace.lock().update_schedule(name, update)
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        Ok(self.namespace.lock().delete_schedule(name))
    }
}

#[async_trait]
impl WorkerRegistry for MemoryBackend {
    async fn put_worker(&self, id: &str, spec: &str, in_flight: u32, now: Timestamp) -> Result<()> {
        self.namespace.lock().put_worker(id, spec, in_flight, now);
        Ok(())
    }

    async fn touch_worker(&self, id: &str, in_flight: u32, now: Timestamp) -> Result<bool> {
        Ok(self.namespace.lock().touch_worker(id, in_flight, now))
    }

    async fn delete_worker(&self, id: &str) -> Result<bool> {
        Ok(self.namespace.lock().delete_worker(id))
    }

    async fn workers(&self) -> Result<Vec<StoredWorker>> {
        Ok(self.namespace.lock().workers())
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        Ok(self.namespace.lock().reap_workers(cutoff))
    }
}
