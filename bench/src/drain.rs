//! Draining a queue with no-op jobs: with the worker runtime of the `durq` crate, or with
//! a bare claim/complete loop over the `Store` handle (the floor the runtime adds to).

use std::sync::Arc;
use std::time::Duration;

use durq_core::{ClaimRequest, Retry, Store};
use tokio::task::JoinSet;

use crate::progress::{payload_index, Progress};

/// How a run drains its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The worker runtime of the `durq` crate.
    Runtime,
    /// `concurrency` tasks, each claiming up to `batch` jobs and completing them one by
    /// one: what the runtime does, without its heartbeats, retries and bookkeeping.
    Loop,
}

impl Driver {
    /// Parses `runtime` or `loop`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "runtime" => Ok(Driver::Runtime),
            "loop" => Ok(Driver::Loop),
            other => Err(format!("unknown driver {other:?} (runtime|loop)")),
        }
    }

    /// The name used in result lines.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Runtime => "runtime",
            Driver::Loop => "loop",
        }
    }

    /// The default: the runtime when it is built in.
    pub fn default_for_build() -> Self {
        if cfg!(feature = "runtime") {
            Driver::Runtime
        } else {
            Driver::Loop
        }
    }
}

/// The shape of a drain.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// The queue to drain.
    pub queue: String,
    /// Jobs run at once.
    pub concurrency: usize,
    /// Jobs one claim asks for (the loop driver; the runtime chooses its own).
    pub batch: usize,
    /// The lease of each claim.
    pub lease: Duration,
    /// Fail each job's first attempt (ready again at once), complete its second (the
    /// loop driver only).
    pub fail_first: bool,
}

/// Workers running in the background until [`Workers::stop`].
pub struct Workers {
    inner: WorkersInner,
}

enum WorkersInner {
    Loop {
        tasks: JoinSet<Result<(), String>>,
        stop: Arc<tokio::sync::Notify>,
        stopping: Arc<std::sync::atomic::AtomicBool>,
    },
    #[cfg(feature = "runtime")]
    Runtime(crate::runtime::RuntimeWorkers),
}

/// Starts workers draining `config.queue` of `store`, recording into `progress`.
pub async fn start(
    driver: Driver,
    store: Store,
    config: &DrainConfig,
    progress: Arc<Progress>,
) -> Result<Workers, String> {
    match driver {
        Driver::Loop => Ok(start_loop(store, config, progress)),
        #[cfg(feature = "runtime")]
        Driver::Runtime => Ok(Workers {
            inner: WorkersInner::Runtime(crate::runtime::start(store, config, progress).await?),
        }),
        #[cfg(not(feature = "runtime"))]
        Driver::Runtime => {
            let _ = (store, config, progress);
            Err("built without the `runtime` feature; use --driver loop".to_owned())
        }
    }
}

impl Workers {
    /// Stops the workers and waits for them, surfacing the first error any hit.
    /// Returns when every completion was stored, if the handlers could not tell (the
    /// runtime reports outcomes after its handler returns).
    pub async fn stop(self) -> Result<Option<std::time::Instant>, String> {
        match self.inner {
            WorkersInner::Loop {
                mut tasks,
                stop,
                stopping,
            } => {
                stopping.store(true, std::sync::atomic::Ordering::SeqCst);
                stop.notify_waiters();
                let mut first_error = None;
                while let Some(joined) = tasks.join_next().await {
                    let outcome = joined
                        .map_err(|e| format!("worker task: {e}"))
                        .and_then(|r| r);
                    if let Err(err) = outcome {
                        first_error.get_or_insert(err);
                    }
                }
                first_error.map_or(Ok(None), Err)
            }
            #[cfg(feature = "runtime")]
            WorkersInner::Runtime(workers) => workers.stop().await,
        }
    }
}

fn start_loop(store: Store, config: &DrainConfig, progress: Arc<Progress>) -> Workers {
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for n in 0..config.concurrency {
        let store = store.clone();
        let progress = Arc::clone(&progress);
        let stop = Arc::clone(&stop);
        let stopping = Arc::clone(&stopping);
        let config = config.clone();
        tasks.spawn(async move {
            let worker = format!("bench-loop-{n}");
            let queues = vec![config.queue.clone()];
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let request =
                    ClaimRequest::new(queues.iter().cloned(), worker.as_str(), config.lease)
                        .limit(config.batch);
                let jobs = store
                    .claim(request)
                    .await
                    .map_err(|e| format!("claim: {e}"))?;
                if jobs.is_empty() {
                    tokio::select! {
                        waited = store.wait_for_work(&queues, Duration::from_millis(100)) => {
                            waited.map_err(|e| format!("wait_for_work: {e}"))?;
                        }
                        () = stop.notified() => {}
                    }
                    continue;
                }
                for job in jobs {
                    std::hint::black_box(&job.payload);
                    if config.fail_first && job.job.attempts == 1 {
                        store
                            .fail(
                                job.id(),
                                job.token(),
                                "bench: the first attempt fails",
                                Retry::At(store.now()),
                            )
                            .await
                            .map_err(|e| format!("fail: {e}"))?;
                        continue;
                    }
                    progress.started(payload_index(&job.payload));
                    store
                        .complete(job.id(), job.token(), None)
                        .await
                        .map_err(|e| format!("complete: {e}"))?;
                    progress.done();
                }
                // The memory store's futures never wait: yield, so timers and the
                // other tasks of the runtime still get their turn.
                tokio::task::yield_now().await;
            }
            Ok(())
        });
    }
    Workers {
        inner: WorkersInner::Loop {
            tasks,
            stop,
            stopping,
        },
    }
}
