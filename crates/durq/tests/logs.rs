//! What the worker logs: a blocking handler is named with its queue and job; a job
//! that just succeeded is never reported as a lost lease. The logs of every test go to
//! one buffer (a subscriber is global); each test looks only at lines naming its jobs.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use durq::layers::{async_trait, Backend, LayeredBackend};
use durq::worker_calls::{Completion, Heartbeat, HeldLease};
use durq::{
    Bytes, JobContext, JobError, JobId, JobState, NewJob, Store, StoreSettings, Timestamp, Worker,
};
use tokio::sync::Notify;

const PATIENCE: Duration = Duration::from_secs(20);

/// Every line logged by this test binary.
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("durq=debug")
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

fn memory_store() -> Store {
    let settings = StoreSettings::default().namespace(durq_conformance::unique_namespace("logs"));
    Store::new(
        durq_memory::MemoryServer::new()
            .open(settings)
            .expect("a memory store"),
    )
}

async fn wait_until_succeeded(store: &Store, id: JobId) {
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
    wait_until_succeeded(&store, first).await;
    wait_until_succeeded(&store, later).await;
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
    let racing_store = Arc::new(RacingStore {
        inner: inner.backend().clone(),
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
    let (handler_store, handler_release) = (racing_store.clone(), release.clone());
    let store = Store::from(racing_store.clone() as Arc<dyn Backend>);
    let worker = Worker::builder(store)
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
    wait_until_succeeded(&inner, racing).await;
    let answered = tokio::time::timeout(PATIENCE, async {
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        loop {
            ticker.tick().await;
            let held = racing_store.held_call.load(Ordering::SeqCst);
            if held != usize::MAX && racing_store.calls.load(Ordering::SeqCst) > held + 1 {
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
    wait_until_succeeded(&inner, staying).await;
    handle.shutdown().await;
    let lines = lines_about(racing);
    assert!(
        !lines.iter().any(|line| line.contains("lease lost")),
        "a job that succeeded was logged as a lost lease: {lines:#?}"
    );
}

/// Holds the first heartbeat that names a job until that job's completion has been
/// recorded, then lets it through: its answer is then "lease lost" for a job that
/// succeeded. A layer over the real backend; every call it does not hold or watch is
/// forwarded as it is.
#[derive(Debug)]
struct RacingStore {
    inner: Arc<dyn Backend>,
    heartbeat_taken: Notify,
    completion_recorded: Notify,
    held_one: AtomicBool,
    /// `heartbeat_batch` calls so far (the handle answers empty ones itself, so each
    /// names jobs), and the index of the one held.
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
impl LayeredBackend for RacingStore {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::Result<Heartbeat>>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hold_first().await {
            self.held_call.store(call, Ordering::SeqCst);
        }
        self.inner.heartbeat_batch(leases, ttl, now).await
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::Result<()>>> {
        let answer = self.inner.complete_batch(completions, now).await;
        self.completion_recorded.notify_one();
        answer
    }
}

/// Issue #30: a handler that stores its own completion in its transaction (CONTRACT §7)
/// and has not returned yet when a heartbeat of its job comes back "lease lost" (the
/// completion ended the lease) succeeded: it is logged and counted as a success, never
/// as a lost lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_success_is_not_reported_as_a_lost_lease() {
    logs();
    let dir = tempfile::tempdir().expect("temp dir");
    let settings =
        StoreSettings::default().namespace(durq_conformance::unique_namespace("logs-fenced"));
    let sqlite = durq_sqlite::SqliteBackend::open(dir.path().join("jobs.db"), settings)
        .await
        .expect("open sqlite");
    let plain = Store::new(sqlite.clone());
    let id = plain
        .enqueue(NewJob::new("fenced"))
        .await
        .expect("enqueue")
        .id;
    let heard = Arc::new(HeardLeaseLost {
        inner: plain.backend().clone(),
        lost: Notify::new(),
        answers: AtomicUsize::new(0),
    });
    let store = Store::from(heard.clone() as Arc<dyn Backend>);
    let handler_heard = heard.clone();
    let worker = Worker::builder(store)
        .heartbeat_interval(Duration::from_millis(10))
        .handler("fenced", move |ctx: JobContext, _payload: Bytes| {
            let (sqlite, heard) = (sqlite.clone(), handler_heard.clone());
            async move {
                let (id, token) = (ctx.id(), ctx.lease_token());
                let lost = heard.lost.notified();
                let receipt = tokio::task::spawn_blocking(move || {
                    let mut conn = sqlite.connection()?;
                    let mut tx = sqlite.transaction(&mut conn)?;
                    let receipt = tx.complete(id, token, None)?;
                    tx.commit()?;
                    Ok::<_, durq::Error>(receipt)
                })
                .await
                .map_err(|err| JobError::retry(err.to_string()))??;
                // Return only once a heartbeat heard that the lease is gone.
                lost.await;
                Ok(receipt)
            }
        })
        .build()
        .expect("build");
    let handle = worker.spawn();
    wait_until_succeeded(&plain, id).await;
    handle.shutdown().await;
    assert!(
        heard.answers.load(Ordering::SeqCst) > 0,
        "the test staged the race: a heartbeat answered lease lost before the handler returned"
    );
    let lines = lines_about(id);
    assert!(
        !lines.iter().any(|line| line.contains("lease lost")),
        "a job that succeeded in its own transaction was logged as a lost lease: {lines:#?}"
    );
}

/// Tells when a heartbeat of the store answered "lease lost".
#[derive(Debug)]
struct HeardLeaseLost {
    inner: Arc<dyn Backend>,
    lost: Notify,
    answers: AtomicUsize,
}

#[async_trait]
impl LayeredBackend for HeardLeaseLost {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> durq::Result<Vec<durq::Result<Heartbeat>>> {
        let answers = self.inner.heartbeat_batch(leases, ttl, now).await?;
        if answers
            .iter()
            .any(|answer| answer.as_ref().is_err_and(|err| err.is_lease_lost()))
        {
            self.answers.fetch_add(1, Ordering::SeqCst);
            self.lost.notify_waiters();
        }
        Ok(answers)
    }
}
