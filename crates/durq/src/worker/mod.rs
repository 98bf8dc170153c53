//! The worker runtime: claims jobs, runs their handlers, keeps their leases alive from
//! claim until their outcome is stored, reports every outcome through the lease token,
//! and shuts down without losing work.
//!
//! - [`builder`]: the configuration, checked once.
//! - [`claim_loop`]: claiming, starting jobs, recording successes, shutdown.
//! - [`job`]: one job's life, from start to its report.
//! - [`report`]: recording outcomes, retried while the lease holds.
//! - [`leases`]: the leases held, and the keeper that extends them.
//! - [`events`]: the lifecycle hooks, told of each outcome once it is stored.
//! - [`maintenance`]: reclaim, purge and schedules.
//!
//! Threads: handlers (and the claim loop, which polls their first steps) run on a
//! runtime of their own; the keeper, reclaim and purge run on the runtime the worker was
//! started from, where the store's connections live. A handler that blocks its thread
//! then slows other handlers, never the calls that keep leases.

mod builder;
mod capacity;
mod claim_loop;
mod events;
mod job;
mod leases;
mod maintenance;
mod on_store;
mod report;

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use durq_core::{Capability, Store};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use builder::{
    WorkerBuilder, DEFAULT_BLOCKING_THRESHOLD, DEFAULT_CONCURRENCY, DEFAULT_LEASE, DEFAULT_TIMEOUT,
};
pub use events::{JobEvent, JobOutcome};

use builder::{Config, HandlerRuntime};
pub(crate) use leases::HeldJob;
use leases::Leases;
use report::Succeeded;

use crate::telemetry::WorkerMetrics;

/// A pool of handlers over one store: claims jobs from its queues, runs them, keeps
/// their leases alive, retries failures with backoff, and shuts down gracefully.
///
/// ```no_run
/// # async fn demo(store: durq::Store) -> durq::Result<()> {
/// use durq::{JobContext, JobError, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
///
/// let worker = Worker::builder(store)
///     .json_handler("emails", |ctx: JobContext, email: Email| async move {
///         if email.to.is_empty() {
///             return Err(JobError::permanent("no recipient"));
///         }
///         tracing::info!(attempt = ctx.attempt(), "sending to {}", email.to);
///         Ok(())
///     })
///     .concurrency(32)
///     .build()?;
/// let handle = worker.shutdown_handle();
/// // ... later, from anywhere: handle.shutdown();
/// worker.run().await;
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    config: Config,
    shutdown: CancellationToken,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.config.worker_id)
            .field("queues", &self.config.queue_names)
            .field("concurrency", &self.config.concurrency)
            .finish_non_exhaustive()
    }
}

/// Asks a running [`Worker`] to shut down. Cheap to clone; any clone works.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    token: CancellationToken,
}

impl ShutdownHandle {
    /// Starts a graceful shutdown: the worker stops claiming, waits for running
    /// handlers up to its grace period, releases what is left, and returns.
    pub fn shutdown(&self) {
        self.token.cancel();
    }

    /// Whether shutdown was asked for.
    pub fn is_shutting_down(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// A worker running on its own task, from [`Worker::spawn`].
///
/// Dropping the handle leaves the worker running; call [`WorkerHandle::shutdown`].
#[derive(Debug)]
pub struct WorkerHandle {
    shutdown: ShutdownHandle,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerHandle {
    /// Shuts the worker down gracefully and waits until it has.
    pub async fn shutdown(self) {
        self.shutdown.shutdown();
        self.join().await;
    }

    /// Waits for the worker to stop (after a shutdown from any [`ShutdownHandle`]).
    pub async fn join(self) {
        if let Err(err) = self.task.await {
            if err.is_panic() {
                tracing::error!("the worker task panicked: {err}");
            }
        }
    }

    /// A handle that starts the shutdown without waiting.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Stops the worker at once, as a crash would: nothing is completed or released,
    /// and its jobs come back only when their leases expire and are reclaimed.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the worker has stopped.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// What the worker's tasks share.
struct Shared {
    config: Config,
    metrics: WorkerMetrics,
    /// Every job the worker holds a lease on, from claim until its outcome is stored.
    leases: Leases,
    /// Successes on their way to the store, recorded in batches by the claim loop.
    completions: mpsc::UnboundedSender<Succeeded>,
    /// Handlers running now: what the concurrency limit counts.
    handlers_running: AtomicUsize,
    /// Woken when a handler returns and its slot is free.
    slot_freed: Notify,
    /// Woken when a reclaim put jobs back, so an idle worker claims them at once.
    reclaimed: Notify,
    /// What the worker offers and how much of it is free, if it counts.
    capacity: Option<capacity::Capacity>,
    /// The runtime the worker was started from, where the store's connections live:
    /// outcomes the keeper records are sent from there.
    store_runtime: tokio::runtime::Handle,
    /// The store as the worker was given it, for the calls made from `store_runtime`
    /// (housekeeping, outcomes the keeper records, the worker's deregistration), which
    /// handlers blocking their own runtime must not hold up. `config.store` is the
    /// handlers' and the claim loop's (see [`Placement`]).
    home: Store,
    /// What every job's [`JobContext`](crate::JobContext) shares.
    context: Arc<crate::handler::WorkerContext>,
}

/// The wait after a store call failed, before the next try: 100 ms doubling to 1 s, a
/// little jitter so workers that lost the store together do not retry in step, and
/// cut short by `stop`. The cap bounds how long a worker whose store came back keeps
/// waiting (a call per second per worker costs a down server nothing). Used by the claim loop (claims, waits) and by outcomes that did
/// not reach the store; it resets once a call went through.
pub(crate) struct StoreBackoff {
    failures: u32,
}

impl StoreBackoff {
    const DELAYS: durq_core::Backoff = durq_core::Backoff {
        initial: std::time::Duration::from_millis(100),
        max: std::time::Duration::from_secs(1),
        jitter: 0.2,
    };

    pub(crate) fn new() -> Self {
        StoreBackoff { failures: 0 }
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Waits the next delay, unless `stop` comes first; false if it did.
    pub(crate) async fn wait(&mut self, stop: Option<&CancellationToken>) -> bool {
        self.failures = self.failures.saturating_add(1);
        let delay = Self::DELAYS.delay(self.failures);
        match stop {
            Some(stop) => tokio::select! {
                () = tokio::time::sleep(delay) => true,
                () = stop.cancelled() => false,
            },
            None => {
                tokio::time::sleep(delay).await;
                true
            }
        }
    }
}

/// The runtime handlers run on: the worker's own, shut down (without waiting for
/// handlers stuck in a blocking call) when the worker stops, or the caller's.
enum HandlerThreads {
    Own(Option<tokio::runtime::Runtime>),
    Shared(tokio::runtime::Handle),
}

impl HandlerThreads {
    fn start(runtime: &HandlerRuntime) -> std::io::Result<Self> {
        Ok(match runtime {
            HandlerRuntime::Own(threads) => HandlerThreads::Own(Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(*threads)
                    .thread_name("durq-handler")
                    .enable_all()
                    .build()?,
            )),
            HandlerRuntime::Shared(handle) => HandlerThreads::Shared(handle.clone()),
            HandlerRuntime::Auto(threads) => {
                return Self::start(&HandlerRuntime::Own(*threads));
            }
        })
    }

    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        match self {
            HandlerThreads::Own(runtime) => runtime.as_ref().map(tokio::runtime::Runtime::handle),
            HandlerThreads::Shared(handle) => Some(handle),
        }
    }
}

impl Drop for HandlerThreads {
    fn drop(&mut self) {
        if let HandlerThreads::Own(runtime) = self {
            if let Some(runtime) = runtime.take() {
                // Dropping a runtime waits for its threads, which an async context must
                // not do; a handler blocked in a system call would hold the worker too.
                runtime.shutdown_background();
            }
        }
    }
}

/// Aborts the task when dropped: the claim loop must not outlive an aborted worker,
/// and work sent to another runtime must not outlive the caller that awaits it.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Worker {
    /// Starts configuring a worker over `store`.
    pub fn builder(store: Store) -> WorkerBuilder {
        WorkerBuilder::new(store)
    }

    /// The id recorded in this worker's leases.
    pub fn worker_id(&self) -> &str {
        &self.config.worker_id
    }

    /// A handle to shut the worker down from elsewhere.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            token: self.shutdown.clone(),
        }
    }

    /// Runs the worker on a new tokio task.
    pub fn spawn(self) -> WorkerHandle {
        let shutdown = self.shutdown_handle();
        let task = tokio::spawn(self.run());
        WorkerHandle { shutdown, task }
    }

    /// Runs until `signal` resolves (for example `tokio::signal::ctrl_c()`), then shuts
    /// down gracefully. A shutdown through a [`ShutdownHandle`] also ends it.
    pub async fn run_until<S>(self, signal: S)
    where
        S: Future<Output = ()>,
    {
        let shutdown = self.shutdown.clone();
        let run = self.run();
        tokio::pin!(run);
        tokio::pin!(signal);
        tokio::select! {
            () = &mut run => return,
            () = &mut signal => shutdown.cancel(),
        }
        run.await;
    }

    /// Runs until a [`ShutdownHandle`] asks it to stop, then shuts down gracefully:
    /// stops claiming, waits up to the grace period for running handlers, releases the
    /// jobs of those still running (CONTRACT L8), and returns.
    ///
    /// Store errors never end the loop: they are logged, counted, and retried with a
    /// backoff, since a worker outliving a database restart is what users want.
    pub async fn run(self) {
        let span = tracing::info_span!("worker", worker = %self.config.worker_id);
        self.run_placed().instrument(span).await;
    }

    /// [`Worker::run`], in the worker's span.
    async fn run_placed(self) {
        let Worker {
            mut config,
            shutdown,
        } = self;
        let store_runtime = tokio::runtime::Handle::current();
        // The keeper extends every lease from a thread of its own, where nothing the
        // handlers do can hold it up.
        let keeper_thread = match leases::KeeperThread::start() {
            Ok(thread) => thread,
            Err(err) => {
                tracing::error!(error = %err, "cannot start the lease keeper's thread; the worker does not run");
                return;
            }
        };
        let placement = Placement::choose(&config, &keeper_thread, &store_runtime).await;
        let Some(placement) = placement else {
            return;
        };
        let home = std::mem::replace(&mut config.store, placement.store.clone());
        let metrics = WorkerMetrics::new(&config.queue_names);
        let (completions, completed) = mpsc::unbounded_channel();
        let capacity = config.capacity.clone().map(capacity::Capacity::new);
        let context = Arc::new(crate::handler::WorkerContext {
            worker_id: config.worker_id.clone(),
            store: config.store.clone(),
            store_runtime: store_runtime.clone(),
        });
        let shared = Arc::new(Shared {
            context,
            capacity,
            config,
            metrics,
            leases: Leases::default(),
            completions,
            handlers_running: AtomicUsize::new(0),
            slot_freed: Notify::new(),
            reclaimed: Notify::new(),
            store_runtime,
            home,
        });
        run_worker(shared, completed, shutdown, placement, keeper_thread).await;
    }
}

/// Where the worker's parts run, and over which connections.
///
/// | store | handlers and the claim loop | lease keeper |
/// |---|---|---|
/// | needs no runtime (memory, SQLite) | the worker's runtime, the store as is | its own thread, the store as is |
/// | tied to its runtime (Redis, PostgreSQL) | a runtime of their own, over connections reopened there | its own thread, over connections reopened there |
///
/// Each of the three places then calls a store whose connections it drives itself: no
/// call hops between threads, and handlers that block their threads stall neither the
/// keeper nor the rest of the program. A tied store that cannot be reopened (a layer
/// built outside [`Store::layer`]), or not yet (its server is down as the worker
/// starts), is reached from the other two places by a hop to the worker's runtime,
/// where it was opened (see `on_store`); the keeper reopens it as soon as it can.
struct Placement {
    /// Where handlers and the claim loop run.
    handlers: HandlerThreads,
    /// The store they call.
    store: Store,
    /// The store the keeper extends leases through.
    keeper: leases::KeeperStore,
}

impl Placement {
    /// `None` if a runtime for the handlers could not be started.
    async fn choose(
        config: &Config,
        keeper_thread: &leases::KeeperThread,
        store_runtime: &tokio::runtime::Handle,
    ) -> Option<Placement> {
        let store = &config.store;
        let tied = store.capabilities().tied_to_runtime;
        let handler_runtime = match &config.handler_runtime {
            HandlerRuntime::Auto(_) if !tied => HandlerRuntime::Shared(store_runtime.clone()),
            HandlerRuntime::Auto(threads) => HandlerRuntime::Own(*threads),
            other => other.clone(),
        };
        let handlers = match HandlerThreads::start(&handler_runtime) {
            Ok(handlers) => handlers,
            Err(err) => {
                tracing::error!(error = %err, "cannot start the handlers' runtime; the worker does not run");
                return None;
            }
        };
        if !tied {
            return Some(Placement {
                handlers,
                store: store.clone(),
                keeper: leases::KeeperStore::own(store.clone()),
            });
        }
        let hopping = || on_store::on_store_runtime(store.clone(), store_runtime.clone());
        // Connections opened from the keeper's thread are driven by its runtime alone.
        let keeper = match keeper_thread.reopen(store.clone()).await {
            Ok(Some(own)) => leases::KeeperStore::own(own),
            Ok(None) => leases::KeeperStore::borrowed(hopping(), None),
            Err(err) => {
                tracing::warn!(error = %err, "the lease keeper cannot open connections of its own yet; it reaches the store through the worker's runtime until it can");
                leases::KeeperStore::borrowed(hopping(), Some(store.clone()))
            }
        };
        let handler_store = match handlers.handle() {
            Some(handle) if same_runtime(handle, store_runtime) => store.clone(),
            Some(handle) => match reopen_on(handle, store.clone()).await {
                Ok(Some(own)) => own,
                Ok(None) => hopping(),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot open connections for the handlers' runtime; its calls go through the worker's runtime");
                    hopping()
                }
            },
            None => return None,
        };
        Some(Placement {
            handlers,
            store: handler_store,
            keeper,
        })
    }
}

/// `store` reopened from a task on `runtime` (see [`Store::reopen`]).
async fn reopen_on(
    runtime: &tokio::runtime::Handle,
    store: Store,
) -> durq_core::Result<Option<Store>> {
    let mut reopening = AbortOnDrop(runtime.spawn(async move { store.reopen().await }));
    (&mut reopening.0).await.unwrap_or_else(|_| {
        Err(durq_core::Error::Unavailable {
            message: "the runtime opening the store's connections shut down".to_owned(),
            source: None,
        })
    })
}

/// Whether two handles drive the same runtime.
fn same_runtime(a: &tokio::runtime::Handle, b: &tokio::runtime::Handle) -> bool {
    a.id() == b.id()
}

async fn run_worker(
    shared: Arc<Shared>,
    completed: mpsc::UnboundedReceiver<Succeeded>,
    shutdown: CancellationToken,
    placement: Placement,
    keeper_thread: leases::KeeperThread,
) {
    let config = &shared.config;
    let Placement {
        handlers, keeper, ..
    } = placement;
    let Some(handle) = handlers.handle() else {
        return;
    };
    // The keeper outlives the claim loop: it stops only once every outcome is stored.
    let stop_keeper = CancellationToken::new();
    // The keeper's thread outlives nothing of the worker's: an aborted worker (a crash,
    // as `WorkerHandle::abort` plays it) must leave its leases to expire.
    let _stop_keeper_if_dropped = stop_keeper.clone().drop_guard();
    let mut background = JoinSet::new();
    let keeper = leases::keep_leases(shared.clone(), keeper, stop_keeper.clone())
        .instrument(tracing::Span::current());
    let keeper_done = keeper_thread.run(keeper);
    if let Some(interval) = config.reclaim_interval {
        background.spawn(maintenance::reclaim_loop(
            shared.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    // What the backend does not declare is left undone: a core-only backend keeps no
    // worker registry, purges nothing and stores no schedules (`build` refused any).
    let supports = |capability| config.store.supports(capability);
    if let Some(interval) = config
        .purge_interval
        .filter(|_| supports(Capability::Admin))
    {
        background.spawn(maintenance::purge_loop(
            shared.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    if supports(Capability::WorkerRegistry) {
        background.spawn(maintenance::worker_record_loop(
            shared.clone(),
            shutdown.clone(),
        ));
    }
    if let Some(interval) = config
        .queue_gauges_interval
        .filter(|_| supports(Capability::Inspect))
    {
        background.spawn(maintenance::queue_gauges_loop(
            shared.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    if (config.schedule_interval.is_some() || !config.schedules.is_empty())
        && supports(Capability::Schedules)
    {
        background.spawn(maintenance::schedule_loop(
            shared.clone(),
            config.schedules.clone(),
            config.schedule_interval,
            shutdown.clone(),
        ));
    }
    tracing::info!(
        queues = ?config.queue_names,
        concurrency = config.concurrency,
        "worker started"
    );
    let mut claim_loop = AbortOnDrop(
        handle.spawn(
            claim_loop::run_loop(shared.clone(), completed, shutdown)
                .instrument(tracing::Span::current()),
        ),
    );
    if let Err(err) = (&mut claim_loop.0).await {
        if err.is_panic() {
            tracing::error!("the claim loop panicked: {err}");
        }
    }
    stop_keeper.cancel();
    // The thread ends with its runtime once the keeper has returned.
    let _ = keeper_done.await;
    // Reclaim and purge are aborted where they wait; a call already running ends first,
    // so nothing of this worker is still at work once `run` returns.
    background.shutdown().await;
    // Last, once nothing can register it again: this worker is gone (CONTRACT W3).
    if !supports(Capability::WorkerRegistry) {
        // Nothing was registered.
    } else if let Err(err) = shared.home.deregister_worker(&config.worker_id).await {
        tracing::warn!(error = %err, "removing the worker's record failed; it will be reaped");
    }
    drop(handlers);
    tracing::info!("worker stopped");
}
