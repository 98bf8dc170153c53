//! Helpers for your own tests (feature `testing`): a store in memory with a clock your
//! test drives, assertions on what your code enqueued, and the worker you run in
//! production run one job at a time, under the real lease rules.
//!
//! ```
//! # use durq::{TypedJob, Worker, JobContext, JobError, JobOutcome};
//! # #[derive(Debug, serde::Serialize, serde::Deserialize)]
//! # struct Welcome { to: String }
//! # impl TypedJob for Welcome { const QUEUE: &'static str = "welcome"; }
//! # async fn sign_up(store: &durq::Store, to: &str) -> durq::Result<()> {
//! #     store.enqueue_typed(&Welcome { to: to.into() }).await.map(drop)
//! # }
//! # fn workers(store: durq::Store) -> durq::WorkerBuilder {
//! #     Worker::builder(store).typed_handler(|_: JobContext, _: Welcome| async { Ok::<_, JobError>(()) })
//! # }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let kit = durq::testing::TestKit::new();
//! sign_up(&kit.store(), "ada@example.com").await.unwrap(); // your code enqueues
//! kit.assert_enqueued(|job: &Welcome| job.to == "ada@example.com").await;
//! let ran = kit.run_one(workers(kit.store())).await.expect("a job was ready");
//! assert!(matches!(ran.outcome(), JobOutcome::Succeeded));
//! # }
//! ```
//!
//! Everything here is for tests: its assertions panic with a message that says what the
//! store holds instead.

use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    JobId, JobState, ListQuery, ManualClock, Store, StoreSettings, Timestamp, TypedJob,
};

use crate::worker::{JobEvent, WorkerBuilder};

/// A store in memory, in a namespace of its own, on a clock that moves only when the test
/// moves it (see the [module](self)).
#[derive(Debug, Clone)]
pub struct TestKit {
    store: Store,
    clock: ManualClock,
}

impl Default for TestKit {
    fn default() -> Self {
        TestKit::new()
    }
}

impl TestKit {
    /// A new, empty store; its clock stands at [`ManualClock::default`]'s instant.
    pub fn new() -> TestKit {
        let clock = ManualClock::default();
        let settings = StoreSettings::default().clock(Arc::new(clock.clone()));
        let store = match durq_memory::MemoryBackend::new(settings) {
            Ok(backend) => Store::new(backend),
            // The default settings are valid; a failure here is a bug of this crate.
            Err(err) => panic!("the test kit's store: {err}"),
        };
        TestKit { store, clock }
    }

    /// The store: hand it to the code under test, and to the workers you run here.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// The store's clock.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The store's current instant.
    pub fn now(&self) -> Timestamp {
        self.store.now()
    }

    /// Moves the store's clock forward: scheduled jobs, retries after a backoff and
    /// expired leases come due without the test waiting for them.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The jobs of type `J` waiting in its queue (ready or scheduled), oldest first, as
    /// `J`s. Panics if one cannot be read as a `J`.
    pub async fn enqueued<J: TypedJob>(&self) -> Vec<J> {
        self.queued_of::<J>()
            .await
            .into_iter()
            .map(|(_, job)| job)
            .collect()
    }

    /// Asserts that a job of type `J` for which `matches` holds is waiting in `J`'s
    /// queue, and returns it; panics listing the jobs that are there otherwise.
    pub async fn assert_enqueued<J, F>(&self, matches: F) -> J
    where
        J: TypedJob + std::fmt::Debug,
        F: Fn(&J) -> bool,
    {
        let queued = self.queued_of::<J>().await;
        let shown: Vec<String> = queued.iter().map(|(_, job)| format!("{job:?}")).collect();
        match queued.into_iter().find(|(_, job)| matches(job)) {
            Some((_, job)) => job,
            None => panic!(
                "no matching job of queue {:?} is waiting; waiting there: [{}]",
                J::QUEUE,
                shown.join(", ")
            ),
        }
    }

    /// Asserts that no job of type `J` for which `matches` holds waits in `J`'s queue.
    pub async fn assert_not_enqueued<J, F>(&self, matches: F)
    where
        J: TypedJob + std::fmt::Debug,
        F: Fn(&J) -> bool,
    {
        if let Some((id, job)) = self
            .queued_of::<J>()
            .await
            .into_iter()
            .find(|(_, job)| matches(job))
        {
            panic!("job {id} of queue {:?} is waiting: {job:?}", J::QUEUE);
        }
    }

    /// The waiting jobs of `J`'s queue, oldest first, with their ids.
    async fn queued_of<J: TypedJob>(&self) -> Vec<(JobId, J)> {
        let mut waiting = Vec::new();
        let mut query = ListQuery::new(J::QUEUE).states([JobState::Queued]);
        loop {
            let page = match self.store.list(query.clone()).await {
                Ok(page) => page,
                Err(err) => panic!("listing queue {:?}: {err}", J::QUEUE),
            };
            for job in page.jobs {
                match self.store.payload_json::<J>(job.id).await {
                    Ok(decoded) => waiting.push((job.id, decoded)),
                    Err(err) => panic!(
                        "job {} of queue {:?} is not a {}: {err}",
                        job.id,
                        J::QUEUE,
                        std::any::type_name::<J>()
                    ),
                }
            }
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        // Listed newest first.
        waiting.reverse();
        waiting
    }

    /// Runs the next ready job of `worker`'s queues through its handler and returns
    /// what happened once the store has recorded it; `None` if no job of its queues was
    /// ready. The worker is the one your service runs, built on [`TestKit::store`]:
    /// the job is claimed under a lease, its handler runs with the real context,
    /// timeout and cancellation, and its outcome is stored through its lease token,
    /// retries and backoff included. A failed job is queued again for later: advance
    /// the clock past its backoff to run it again.
    pub async fn run_one(&self, worker: WorkerBuilder) -> Option<JobEvent> {
        self.run(worker, 1).await.pop()
    }

    /// Runs `worker` until none of its queues holds a ready job, one job at a time,
    /// and returns what happened to each, in order (jobs its handlers enqueue run too).
    /// Jobs scheduled later, and retries waiting out their backoff, stay queued until
    /// the clock is advanced.
    pub async fn drain(&self, worker: WorkerBuilder) -> Vec<JobEvent> {
        self.run(worker, usize::MAX).await
    }

    /// Runs `worker`, one job at a time, until it has recorded `jobs` outcomes or none
    /// of its queues holds a ready or running job.
    async fn run(&self, worker: WorkerBuilder, jobs: usize) -> Vec<JobEvent> {
        /// How long a worker may leave a ready job alone before the kit gives up: a job
        /// it cannot take (its needs do not fit the worker) would otherwise wait forever.
        const PATIENCE: Duration = Duration::from_secs(30);
        let queues = worker.queue_names();
        if !self.any_ready(&queues).await {
            return Vec::new();
        }
        let (told, mut recorded) = tokio::sync::mpsc::unbounded_channel();
        let mut worker = worker.concurrency(1).claim_batch(1).on_event(move |event| {
            let _ = told.send(event.clone());
        });
        if jobs != usize::MAX {
            worker = worker.claim_limit(jobs);
        }
        let worker = match worker.build() {
            Ok(worker) => worker,
            Err(err) => panic!("the worker under test does not build: {err}"),
        };
        let running = worker.spawn();
        let mut events = Vec::new();
        while events.len() < jobs {
            match tokio::time::timeout(PATIENCE, recorded.recv()).await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break,
                Err(_) => panic!(
                    "the worker recorded no outcome in {PATIENCE:?} while its queues {queues:?} \
                     held a ready or running job (does the job fit the worker?)"
                ),
            }
            // The outcome is stored before its event: what is left is in the counts.
            if !self.any_ready(&queues).await && self.none_running(&queues).await {
                break;
            }
        }
        running.shutdown().await;
        // Outcomes recorded while the counts were read, and on the way out.
        while let Ok(event) = recorded.try_recv() {
            events.push(event);
        }
        events
    }

    async fn any_ready(&self, queues: &[String]) -> bool {
        for queue in queues {
            match self.store.stats(queue).await {
                Ok(stats) if stats.ready > 0 && !stats.paused => return true,
                Ok(_) => {}
                Err(err) => panic!("stats of queue {queue:?}: {err}"),
            }
        }
        false
    }

    async fn none_running(&self, queues: &[String]) -> bool {
        for queue in queues {
            match self.store.stats(queue).await {
                Ok(stats) if stats.running > 0 => return false,
                Ok(_) => {}
                Err(err) => panic!("stats of queue {queue:?}: {err}"),
            }
        }
        true
    }
}
