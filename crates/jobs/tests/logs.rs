//! What the worker logs: a blocking handler is named with its queue and job; a job
//! that just succeeded is never reported as a lost lease. The logs of every test go to
//! one buffer (a subscriber is global); each test looks only at lines naming its jobs.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use jobs::{
    async_trait, Bytes, ClaimRequest, ClaimedJob, Completion, Enqueued, Heartbeat, HeldLease, Job,
    JobContext, JobError, JobId, JobState, LeaseToken, ListPage, ListQuery, NewJob, QueueStats,
    ReclaimedJob, Retry, Store, StoreSettings, Worker,
};
use tokio::sync::Notify;

const PATIENCE: Duration = Duration::from_secs(20);

/// Every line logged by this test binary.
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("jobs=debug")
            .with_writer(|| LogWriter)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        Mutex::new(Vec::new())
    })
}

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logs()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The logged lines that name `id`.
fn lines_about(id: JobId) -> Vec<String> {
    let id = id.to_string();
    let logs = logs().lock().unwrap_or_else(|p| p.into_inner());
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|line| line.contains(&id))
        .map(str::to_owned)
        .collect()
}

fn memory_store() -> Arc<dyn Store> {
    let settings = StoreSettings::default().namespace(jobs_conformance::unique_namespace("logs"));
    Arc::new(
        jobs_memory::MemoryServer::new()
            .open(settings)
            .expect("a memory store"),
    )
}

async fn wait_until_succeeded(store: &dyn Store, id: JobId) {
    let waited = tokio::time::timeout(PATIENCE, async {
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        loop {
            ticker.tick().await;
            if store
                .get(id)
                .await
                .is_ok_and(|j| j.state == JobState::Succeeded)
            {
                return;
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "job {id} did not succeed in time");
}

/// A poll that blocks its thread past the threshold is logged once, with the job's
/// queue and id, whether it is the first poll (run in the claim loop) or a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_poll_is_logged_with_its_queue_and_job() {
    logs();
    let store = memory_store();
    let first = store
        .enqueue(NewJob::new("blocks-first").payload(&b"first"[..]))
        .await
        .expect("enqueue")
        .id;
    let later = store
        .enqueue(NewJob::new("blocks-later").payload(&b"later"[..]))
        .await
        .expect("enqueue")
        .id;
    let blocking = |ctx: JobContext, payload: Bytes| async move {
        if &payload[..] == b"later" {
            tokio::task::yield_now().await;
        }
        // The behaviour under test: a handler that keeps its thread busy past the
        // threshold before it yields (it computes, as a CPU-bound handler does).
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        let _ = ctx;
        Ok::<(), JobError>(())
    };
    let worker = Worker::builder(store.clone())
        .blocking_threshold(Duration::from_millis(1))
        .handler("blocks-first", blocking)
        .handler("blocks-later", blocking)
        .build()
        .expect("build");
    let handle = worker.spawn();
    wait_until_succeeded(store.as_ref(), first).await;
    wait_until_succeeded(store.as_ref(), later).await;
    handle.shutdown().await;

    let first_lines = lines_about(first);
    assert!(
        first_lines.iter().any(|line| line.contains("WARN")
            && line.contains("first poll blocked the claim loop")
            && line.contains("queue=blocks-first")),
        "a first poll that blocks is logged with its queue and job: {first_lines:#?}"
    );
    let later_lines = lines_about(later);
    let warnings: Vec<_> = later_lines
        .iter()
        .filter(|line| line.contains("blocked its thread") && line.contains("queue=blocks-later"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "a later poll that blocks is logged once, with its queue and job: {later_lines:#?}"
    );
}

/// Issue #11, defect 8: a heartbeat that was on its way while the job's completion was
/// being recorded answers "lease lost" about a job that has just succeeded; the worker
/// must not report that as a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_just_succeeded_is_not_reported_as_a_lost_lease() {
    logs();
    let inner = memory_store();
    let store = Arc::new(RacingStore {
        inner: inner.clone(),
        heartbeat_taken: Notify::new(),
        completion_recorded: Notify::new(),
        held_one: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        held_call: AtomicUsize::new(usize::MAX),
    });
    let racing = inner
        .enqueue(NewJob::new("race").payload(&b"racing"[..]))
        .await
        .expect("enqueue")
        .id;
    // A second job keeps running, so the keeper goes on calling the store: its next
    // call after the held one proves the held one's answer was dealt with.
    let staying = inner
        .enqueue(NewJob::new("race").payload(&b"staying"[..]))
        .await
        .expect("enqueue")
        .id;
    let release = Arc::new(Notify::new());
    let (handler_store, handler_release) = (store.clone(), release.clone());
    let worker = Worker::builder(store.clone())
        .heartbeat_interval(Duration::from_millis(10))
        .handler("race", move |_ctx: JobContext, payload: Bytes| {
            let (store, release) = (handler_store.clone(), handler_release.clone());
            async move {
                if &payload[..] == b"racing" {
                    // Return only once a heartbeat for this job is on its way.
                    store.heartbeat_taken.notified().await;
                } else {
                    release.notified().await;
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .expect("build");
    let handle = worker.spawn();
    wait_until_succeeded(inner.as_ref(), racing).await;
    let answered = tokio::time::timeout(PATIENCE, async {
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        loop {
            ticker.tick().await;
            let held = store.held_call.load(Ordering::SeqCst);
            if held != usize::MAX && store.calls.load(Ordering::SeqCst) > held + 1 {
                return;
            }
        }
    })
    .await;
    assert!(
        answered.is_ok(),
        "the test staged the race: a heartbeat crossed the completion, and the keeper went on"
    );
    release.notify_one();
    wait_until_succeeded(inner.as_ref(), staying).await;
    handle.shutdown().await;
    let lines = lines_about(racing);
    assert!(
        !lines.iter().any(|line| line.contains("lease lost")),
        "a job that succeeded was logged as a lost lease: {lines:#?}"
    );
}

/// Holds the first heartbeat that names a job until that job's completion has been
/// recorded, then lets it through: its answer is then "lease lost" for a job that
/// succeeded.
#[derive(Debug)]
struct RacingStore {
    inner: Arc<dyn Store>,
    heartbeat_taken: Notify,
    completion_recorded: Notify,
    held_one: AtomicBool,
    /// `heartbeat_batch` calls naming jobs so far, and the index of the one held.
    calls: AtomicUsize,
    held_call: AtomicUsize,
}

impl RacingStore {
    /// Holds the first heartbeat until a completion was recorded; true for that one.
    async fn hold_first(&self) -> bool {
        if self.held_one.swap(true, Ordering::SeqCst) {
            return false;
        }
        let recorded = self.completion_recorded.notified();
        self.heartbeat_taken.notify_one();
        recorded.await;
        true
    }
}

#[async_trait]
impl Store for RacingStore {
    fn settings(&self) -> &StoreSettings {
        self.inner.settings()
    }
    async fn enqueue(&self, job: NewJob) -> jobs::Result<Enqueued> {
        self.inner.enqueue(job).await
    }
    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> jobs::Result<Vec<Enqueued>> {
        self.inner.enqueue_batch(jobs).await
    }
    async fn get(&self, id: JobId) -> jobs::Result<Job> {
        self.inner.get(id).await
    }
    async fn payload(&self, id: JobId) -> jobs::Result<Bytes> {
        self.inner.payload(id).await
    }
    async fn children(&self, parent: JobId) -> jobs::Result<Vec<Job>> {
        self.inner.children(parent).await
    }
    async fn claim(&self, request: ClaimRequest) -> jobs::Result<Vec<ClaimedJob>> {
        self.inner.claim(request).await
    }
    async fn heartbeat(
        &self,
        id: JobId,
        token: LeaseToken,
        ttl: Duration,
    ) -> jobs::Result<Heartbeat> {
        self.hold_first().await;
        self.inner.heartbeat(id, token, ttl).await
    }
    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> jobs::Result<Vec<jobs::Result<Heartbeat>>> {
        if !leases.is_empty() {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hold_first().await {
                self.held_call.store(call, Ordering::SeqCst);
            }
        }
        self.inner.heartbeat_batch(leases, ttl).await
    }
    async fn complete(
        &self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> jobs::Result<()> {
        let answer = self.inner.complete(id, token, result).await;
        self.completion_recorded.notify_one();
        answer
    }
    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
    ) -> jobs::Result<Vec<jobs::Result<()>>> {
        let answer = self.inner.complete_batch(completions).await;
        self.completion_recorded.notify_one();
        answer
    }
    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> jobs::Result<JobState> {
        self.inner.fail(id, token, error, retry).await
    }
    async fn release(&self, id: JobId, token: LeaseToken) -> jobs::Result<()> {
        self.inner.release(id, token).await
    }
    async fn reclaim(&self, limit: usize) -> jobs::Result<Vec<ReclaimedJob>> {
        self.inner.reclaim(limit).await
    }
    async fn cancel(&self, id: JobId) -> jobs::Result<JobState> {
        self.inner.cancel(id).await
    }
    async fn retry(&self, id: JobId) -> jobs::Result<()> {
        self.inner.retry(id).await
    }
    async fn stats(&self, queue: &str) -> jobs::Result<QueueStats> {
        self.inner.stats(queue).await
    }
    async fn list(&self, query: ListQuery) -> jobs::Result<ListPage> {
        self.inner.list(query).await
    }
    async fn purge(&self, limit: usize) -> jobs::Result<u64> {
        self.inner.purge(limit).await
    }
    async fn wait_for_work(
        &self,
        queues: &[String],
        timeout: std::time::Duration,
    ) -> jobs::Result<()> {
        self.inner.wait_for_work(queues, timeout).await
    }
}
