//! What a handler sees (`JobContext`), what it returns (`JobOutput`, `JobError`), and the
//! type-erased form the worker keeps per queue.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering as AtomicOrdering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use durq_core::{BoxError, Enqueued, FencedCompletion, Job, JobId, LeaseToken, NewJob, Store};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::worker::{AbortOnDrop, HeldJob};

/// Why a running handler was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// An operator called `cancel` on the job; a heartbeat reported it (CONTRACT A1, L1).
    Requested,
    /// The worker no longer holds the job's lease: it expired and was reclaimed, or the
    /// job was changed under it (CONTRACT L9). Another worker may already be running it.
    LeaseLost,
    /// The worker is shutting down and the grace period ran out; the job is released
    /// (CONTRACT L8) and will run again elsewhere.
    Shutdown,
    /// The attempt ran past its timeout (the job's own, or the worker's default); the
    /// attempt fails as timed out and is retried with backoff.
    TimedOut,
}

/// The cancellation state shared by a running job, its heartbeat and the worker.
///
/// The token is made the first time someone waits on it: most handlers return
/// without ever looking, and a token costs an allocation to make and a lock to drop.
#[derive(Debug, Default)]
pub(crate) struct CancelState {
    token: OnceLock<CancellationToken>,
    reason: OnceLock<CancelReason>,
}

impl CancelState {
    /// Records `reason` (the first reason wins) and cancels the token, if it was made.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        // With the fence in `token`, one of the two sides sees the other's write: a
        // token made while this runs is cancelled by its maker or by this.
        fence(AtomicOrdering::SeqCst);
        if let Some(token) = self.token.get() {
            token.cancel();
        }
    }

    pub(crate) fn reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }

    /// Whether the job was asked to stop (or a handler cancelled the token itself).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.reason.get().is_some() || self.token.get().is_some_and(|t| t.is_cancelled())
    }

    /// The token, cancelled once the job is asked to stop; made on first use.
    pub(crate) fn token(&self) -> &CancellationToken {
        let token = self.token.get_or_init(CancellationToken::new);
        fence(AtomicOrdering::SeqCst);
        if self.reason.get().is_some() {
            token.cancel();
        }
        token
    }
}

/// Everything a handler gets besides its payload: the job as claimed, its lease token,
/// a cancellation token, and the store (to enqueue follow-up jobs).
///
/// Cheap to clone.
#[derive(Clone)]
pub struct JobContext {
    /// The job as the worker holds it: its context is its lease's.
    held: Arc<HeldJob>,
    worker: Arc<WorkerContext>,
}

/// What the contexts of one worker's jobs share.
pub(crate) struct WorkerContext {
    pub(crate) worker_id: Arc<str>,
    /// The store the worker's handlers call.
    pub(crate) store: Store,
    /// The runtime the worker was started from, where the store's connections live.
    pub(crate) store_runtime: tokio::runtime::Handle,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("id", &self.held.job.id)
            .field("queue", &self.held.job.queue)
            .field("attempt", &self.held.job.attempts)
            .field("worker", &self.worker.worker_id)
            .field("cancelled", &self.held.cancel.is_cancelled())
            .finish()
    }
}

impl JobContext {
    pub(crate) fn new(held: Arc<HeldJob>, worker: Arc<WorkerContext>) -> Self {
        JobContext { held, worker }
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.held.job.id
    }

    /// The queue the job came from.
    pub fn queue(&self) -> &str {
        &self.held.job.queue
    }

    /// Which attempt this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.held.job.attempts
    }

    /// Whether a failure now would make the job dead instead of retrying it.
    pub fn is_last_attempt(&self) -> bool {
        self.held.job.attempts >= self.held.job.max_attempts
    }

    /// The job as the claim returned it (state `running`, lease set).
    pub fn job(&self) -> &Job {
        &self.held.job
    }

    /// The fencing token of this claim. Pass it to systems that should refuse writes
    /// from a worker whose lease was taken over (it only ever grows per job).
    pub fn lease_token(&self) -> LeaseToken {
        self.held.token
    }

    /// The id of the worker running the job.
    pub fn worker_id(&self) -> &str {
        &self.worker.worker_id
    }

    /// The token that is cancelled when the handler should stop: the job was cancelled
    /// by an operator, its lease was lost, its timeout passed, or the worker's shutdown
    /// grace ran out.
    pub fn cancellation(&self) -> &CancellationToken {
        self.held.cancel.token()
    }

    /// Whether the handler has been asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.held.cancel.is_cancelled()
    }

    /// Resolves when the handler is asked to stop. Select on it around long work.
    pub async fn cancelled(&self) {
        self.held.cancel.token().cancelled().await;
    }

    /// Why the handler was asked to stop, once it was.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.held.cancel.reason()
    }

    /// The store the job came from.
    pub fn store(&self) -> &Store {
        &self.worker.store
    }

    /// Runs `work` on the runtime the worker was started from, where the store's
    /// connections live, and awaits it.
    ///
    /// Handlers may run on a runtime of the worker's own (the default for PostgreSQL
    /// and Redis, so a handler that blocks its threads cannot starve the leases), and a
    /// connection a pool opens is driven by the runtime of the task that opened it. A
    /// handler that uses a pool the rest of the application shares, such as the
    /// transaction of a fenced completion (`PostgresBackend::complete_in`), runs that
    /// part here: connections opened for it then outlive the worker's runtime instead
    /// of failing once it shut down.
    ///
    /// If the worker's runtime is gone, or `work` panics, the error says so (a
    /// panic is passed on).
    pub async fn on_store_runtime<F, T>(&self, work: F) -> Result<T, JobError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        // Aborted when the handler stops waiting, as dropping `work` in place would be.
        let mut task = AbortOnDrop(self.worker.store_runtime.spawn(work));
        match (&mut task.0).await {
            Ok(value) => Ok(value),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(JobError::retry("the worker's runtime shut down")),
        }
    }

    /// The jobs this one waited for (CONTRACT G1), in the order it named them, as
    /// stored now: each one's `result` is what its handler returned. A job runs only
    /// once they have all succeeded, unless it runs despite failures
    /// (`DependencyFailure::Run`), when a dead or cancelled one has no result. A job
    /// purged since is left out.
    ///
    /// ```no_run
    /// # use durq::{JobContext, JobError};
    /// # async fn report(ctx: JobContext) -> Result<String, JobError> {
    /// let mut lines = Vec::new();
    /// for dependency in ctx.dependencies().await? {
    ///     let result = dependency.result.unwrap_or_default();
    ///     lines.push(format!("{}: {}", dependency.queue, String::from_utf8_lossy(&result)));
    /// }
    /// Ok(lines.join("\n"))
    /// # }
    /// ```
    pub async fn dependencies(&self) -> durq_core::Result<Vec<Job>> {
        let found = self.worker.store.dependencies(&self.held.job).await?;
        Ok(found.into_iter().filter_map(|(_, job)| job).collect())
    }

    /// Runs `work` as the durable step `name` of this job (CONTRACT D1, D2), or, if a
    /// run of this job already finished that step, answers the output it saved without
    /// running `work` again.
    ///
    /// The output is stored as JSON, fenced by this run's lease token, before `step`
    /// answers: once `step` returned, a crash, a failure with a retry, a reclaim or an
    /// operator's retry of the job never runs that step again, and its next run reads
    /// the same value back. A step cut short by a crash before its save runs again, so
    /// a step's side effects should be safe to repeat or keyed (an idempotency key
    /// per job and step name, say). An operator reruns finished steps with
    /// [`Store::retry_from`](durq_core::Store::retry_from) (CONTRACT D3).
    ///
    /// Step names are `[A-Za-z0-9._:-]`, up to 128 bytes, and unique within the job:
    /// a second `step` of a name answers the first one's output. The job's steps are
    /// read once, at its first step. A failed step (`work` returns an error) saves
    /// nothing, and the error is the handler's to return.
    ///
    /// Errors: the store does not keep steps (`Unsupported`), a bad name or an output
    /// over `max_payload_bytes`, or a saved output that no longer reads as `T` are
    /// permanent; a lost lease or an unreachable store is retryable.
    ///
    /// ```no_run
    /// # use durq::{JobContext, JobError};
    /// # async fn charge(_: u64) -> Result<String, JobError> { Ok("ch_1".into()) }
    /// # async fn send_receipt(_: &str) -> Result<(), JobError> { Ok(()) }
    /// # async fn checkout(ctx: JobContext, cents: u64) -> Result<(), JobError> {
    /// // Charged once, however often the job runs after this step finished.
    /// let charge_id: String = ctx.step("charge", || charge(cents)).await?;
    /// ctx.step("receipt", || send_receipt(&charge_id)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn step<T, F, Fut>(&self, name: &str, work: F) -> Result<T, JobError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, JobError>>,
    {
        durq_core::validate::validate_step(name).map_err(step_error)?;
        let log = self.step_log().await?;
        let saved = lock_steps(log).get(name).map(|step| step.output.clone());
        if let Some(output) = saved {
            return serde_json::from_slice(&output).map_err(|err| {
                JobError::permanent(format!(
                    "step {name:?}: its saved output does not read as {}: {err}",
                    std::any::type_name::<T>()
                ))
            });
        }
        let value = work().await?;
        let output = serde_json::to_vec(&value).map_err(|err| {
            JobError::permanent(format!("step {name:?}: its output does not encode: {err}"))
        })?;
        let output = Bytes::from(output);
        let store = &self.worker.store;
        store
            .save_step(self.id(), self.held.token, name, output.clone())
            .await
            .map_err(step_error)?;
        let mut log = lock_steps(log);
        if log.get(name).is_none() {
            log.steps.push(durq_core::SavedStep {
                name: name.to_owned(),
                output,
                saved_at: store.now(),
            });
        }
        Ok(value)
    }

    /// The job's steps as this run knows them: read from the store at the first step.
    async fn step_log(&self) -> Result<&std::sync::Mutex<durq_core::StepLog>, JobError> {
        if let Some(log) = self.held.steps.get() {
            return Ok(log);
        }
        let read = self
            .worker
            .store
            .steps(self.id())
            .await
            .map_err(step_error)?;
        // Two first steps at once both read; the first read kept is as good as the other.
        Ok(self
            .held
            .steps
            .get_or_init(|| Box::new(std::sync::Mutex::new(read))))
    }

    /// Records `data`, as JSON, as the event `name` of this job in the namespace's
    /// event stream (CONTRACT V1), where a consumer following
    /// [`Store::events`](durq_core::Store::events) reads it between the job's
    /// `started` and its ending: progress, a milestone, a partial result.
    ///
    /// Fenced by this run's lease: a run that lost its lease records nothing
    /// (`LeaseLost`). The event is recorded whether or not the job records its state
    /// changes (`StoreSettings::record_events`). Names are `[A-Za-z0-9._:-]`, up to
    /// 128 bytes; the JSON at most 64 KiB.
    ///
    /// ```no_run
    /// # use durq::{JobContext, JobError};
    /// # async fn import(ctx: JobContext, rows: u64) -> Result<(), JobError> {
    /// for done in (0..=rows).step_by(1_000) {
    ///     ctx.emit("progress", &serde_json::json!({ "done": done, "of": rows }))
    ///         .await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn emit<T>(&self, name: &str, data: &T) -> durq_core::Result<()>
    where
        T: serde::Serialize + ?Sized,
    {
        let data = serde_json::to_vec(data).map_err(|err| {
            durq_core::Error::invalid("data", format!("does not encode as JSON: {err}"))
        })?;
        self.worker
            .store
            .emit(self.id(), self.held.token, name, Bytes::from(data))
            .await
    }

    /// Enqueues `job` with this job as its parent (fan-out, CONTRACT E8).
    pub async fn enqueue_child(&self, job: NewJob) -> durq_core::Result<Enqueued> {
        let enqueued = self.worker.store.enqueue(job.parent(self.id())).await?;
        Ok(enqueued)
    }
}

/// A store error met by [`JobContext::step`]: permanent where asking again cannot
/// help (no `Steps` capability, a bad name, an output too large), retryable otherwise.
fn step_error(err: durq_core::Error) -> JobError {
    let permanent = matches!(
        err,
        durq_core::Error::Unsupported { .. }
            | durq_core::Error::InvalidInput { .. }
            | durq_core::Error::PayloadTooLarge { .. }
    );
    let error = JobError::from_error(err);
    if permanent {
        error.into_permanent()
    } else {
        error
    }
}

fn lock_steps(
    log: &std::sync::Mutex<durq_core::StepLog>,
) -> std::sync::MutexGuard<'_, durq_core::StepLog> {
    // The log is only read and appended to; a panic elsewhere leaves it whole.
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// When a failed attempt should run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAdvice {
    /// After the worker's backoff delay for this attempt.
    Backoff,
    /// After this delay instead of the backoff.
    After(Duration),
    /// Never: the job goes dead now.
    Never,
    /// Not a failure: run again after this delay, the attempt not counted (L10).
    Snooze(Duration),
}

/// A handler's failure: its message (stored as the job's `last_error`) and whether the
/// job may be retried.
///
/// Any error converts into a retryable `JobError` with `?`, so handlers can use the
/// errors of the libraries they call directly. Use [`JobError::permanent`] for failures
/// that would fail again however often they were retried (bad input, a missing record).
///
/// ```
/// use durq::JobError;
/// fn check(amount: i64) -> Result<(), JobError> {
///     if amount < 0 {
///         return Err(JobError::permanent(format!("negative amount {amount}")));
///     }
///     let _parsed: u32 = "42".parse()?; // any std error converts, retryable
///     Ok(())
/// }
/// ```
pub struct JobError {
    message: String,
    pub(crate) retry: RetryAdvice,
    source: Option<BoxError>,
}

impl JobError {
    /// A failure that is retried with the worker's backoff.
    pub fn retry(message: impl Into<String>) -> Self {
        JobError {
            message: message.into(),
            retry: RetryAdvice::Backoff,
            source: None,
        }
    }

    /// A failure that is retried after `delay` (on the store's clock) instead of the
    /// worker's backoff, for example when a remote service said when to come back.
    pub fn retry_after(message: impl Into<String>, delay: Duration) -> Self {
        JobError {
            message: message.into(),
            retry: RetryAdvice::After(delay),
            source: None,
        }
    }

    /// A failure that must not be retried: the job goes dead at once (CONTRACT L7).
    pub fn permanent(message: impl Into<String>) -> Self {
        JobError {
            message: message.into(),
            retry: RetryAdvice::Never,
            source: None,
        }
    }

    /// Not a failure: "not now, run me again after `delay`" (on the store's clock). The
    /// job is handed back with [`Store::snooze`](durq_core::Store::snooze): its attempt
    /// is not counted and nothing is recorded as its `last_error` (CONTRACT L10). The
    /// message is only logged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use durq::JobError;
    /// fn poll(ready: bool) -> Result<(), JobError> {
    ///     if !ready {
    ///         return Err(JobError::snooze("the report is not ready yet", Duration::from_secs(30)));
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn snooze(message: impl Into<String>, delay: Duration) -> Self {
        JobError {
            message: message.into(),
            retry: RetryAdvice::Snooze(delay),
            source: None,
        }
    }

    /// Whether this is a [`JobError::snooze`], not a failure.
    pub fn is_snooze(&self) -> bool {
        matches!(self.retry, RetryAdvice::Snooze(_))
    }

    /// Wraps `error` as a retryable failure, keeping it as the source.
    pub fn from_error(error: impl Into<BoxError>) -> Self {
        let source = error.into();
        JobError {
            message: source.to_string(),
            retry: RetryAdvice::Backoff,
            source: Some(source),
        }
    }

    /// The same failure, but never retried.
    pub fn into_permanent(mut self) -> Self {
        self.retry = RetryAdvice::Never;
        self
    }

    /// Whether the job may run again after this failure.
    pub fn is_retryable(&self) -> bool {
        self.retry != RetryAdvice::Never
    }

    /// The message, without its sources.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error this failure wraps, if any.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// Whether this failure is the store's [`durq_core::Error::LeaseLost`], passed on by
    /// the handler (with `?` from a fenced completion, say): the worker no longer holds
    /// the lease, so it records nothing for the attempt.
    pub(crate) fn is_lease_lost(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match &self.source {
            Some(source) => Some(source.as_ref()),
            None => None,
        };
        while let Some(err) = cause {
            if err
                .downcast_ref::<durq_core::Error>()
                .is_some_and(durq_core::Error::is_lease_lost)
            {
                return true;
            }
            cause = err.source();
        }
        false
    }

    /// The text stored as `last_error`: the message followed by the chain of causes
    /// not already part of it.
    pub(crate) fn to_error_text(&self) -> String {
        let mut text = self.message.clone();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match &self.source {
            // The message of `from_error` is the source's own text; start at its cause.
            Some(source) if source.to_string() == self.message => source.source(),
            Some(source) => Some(source.as_ref()),
            None => None,
        };
        while let Some(err) = cause {
            text.push_str(": ");
            text.push_str(&err.to_string());
            cause = err.source();
        }
        text
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("message", &self.message)
            .field("retry", &self.retry)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_error_text())
    }
}

/// Any error (and `&str`/`String`) becomes a retryable failure, so `?` works in handlers.
/// `JobError` itself is not a `std::error::Error`, as with `anyhow::Error`, which is
/// what makes this blanket conversion possible.
impl<E: Into<BoxError>> From<E> for JobError {
    fn from(error: E) -> Self {
        JobError::from_error(error)
    }
}

/// What a successful handler returns; stored as the job's `result`.
pub trait JobOutput: Send {
    /// The bytes to store, or `None` for no result. An error here fails the attempt.
    fn into_result(self) -> Result<Option<Bytes>, JobError>;

    /// The receipt of a completion the handler already stored itself, inside its own
    /// transaction (CONTRACT §7, T3): the worker then stores nothing for the job.
    /// `None`, the default, for every output but [`FencedCompletion`].
    fn recorded(&self) -> Option<FencedCompletion> {
        None
    }
}

/// What the worker does with a handler's success.
#[derive(Debug)]
pub(crate) enum Success {
    /// Stores the job's completion with this result.
    Store(Option<Bytes>),
    /// Nothing: the handler completed the job in its own transaction.
    Recorded(FencedCompletion),
}

fn success<O: JobOutput>(output: O) -> Result<Success, JobError> {
    match output.recorded() {
        Some(receipt) => Ok(Success::Recorded(receipt)),
        None => Ok(Success::Store(output.into_result()?)),
    }
}

/// A handler that completed its job inside its own database transaction returns the
/// receipt (`Ok(receipt)`) once that transaction committed: the worker then records
/// nothing more for the job, and lets its lease go. See `PostgresBackend::complete_in`
/// and `SqliteTransaction::complete`.
impl JobOutput for FencedCompletion {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(None)
    }

    fn recorded(&self) -> Option<FencedCompletion> {
        Some(*self)
    }
}

impl JobOutput for () {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(None)
    }
}

impl JobOutput for Bytes {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(Some(self))
    }
}

impl JobOutput for Option<Bytes> {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(self)
    }
}

impl JobOutput for Vec<u8> {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(Some(Bytes::from(self)))
    }
}

impl JobOutput for String {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(Some(Bytes::from(self)))
    }
}

impl JobOutput for &'static str {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        Ok(Some(Bytes::from_static(self.as_bytes())))
    }
}

/// A result stored as JSON: return `Json(value)` from a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: serde::Serialize + Send> JobOutput for Json<T> {
    fn into_result(self) -> Result<Option<Bytes>, JobError> {
        let bytes = serde_json::to_vec(&self.0).map_err(|err| {
            JobError::permanent(format!("cannot encode the result as JSON: {err}"))
        })?;
        Ok(Some(Bytes::from(bytes)))
    }
}

/// The boxed future a type-erased handler returns.
pub(crate) type HandlerFuture = BoxFuture<'static, Result<Success, JobError>>;

/// A handler with its payload and output types erased, as the worker stores it.
pub(crate) trait ErasedHandler: Send + Sync {
    fn call(&self, ctx: JobContext, payload: Bytes) -> HandlerFuture;
}

/// Names a handler's argument and output types so its `ErasedHandler` impl can bound
/// them, without owning (or requiring `Send` of) any value of those types.
pub(crate) type TypeMarker<T> = PhantomData<fn() -> T>;

/// A handler over raw payload bytes.
pub(crate) struct BytesHandler<F, Fut, O> {
    pub(crate) f: F,
    pub(crate) _types: TypeMarker<(Fut, O)>,
}

impl<F, Fut, O> ErasedHandler for BytesHandler<F, Fut, O>
where
    F: Fn(JobContext, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, JobError>> + Send + 'static,
    O: JobOutput + 'static,
{
    fn call(&self, ctx: JobContext, payload: Bytes) -> HandlerFuture {
        let fut = (self.f)(ctx, payload);
        Box::pin(async move { success(fut.await?) })
    }
}

/// A handler over a JSON payload decoded into `T`.
pub(crate) struct JsonHandler<F, T, Fut, O> {
    pub(crate) f: F,
    pub(crate) _types: TypeMarker<(T, Fut, O)>,
}

impl<F, T, Fut, O> ErasedHandler for JsonHandler<F, T, Fut, O>
where
    F: Fn(JobContext, T) -> Fut + Send + Sync + 'static,
    T: serde::de::DeserializeOwned + Send + 'static,
    Fut: Future<Output = Result<O, JobError>> + Send + 'static,
    O: JobOutput + 'static,
{
    fn call(&self, ctx: JobContext, payload: Bytes) -> HandlerFuture {
        match serde_json::from_slice::<T>(&payload) {
            Ok(value) => {
                let fut = (self.f)(ctx, value);
                Box::pin(async move { success(fut.await?) })
            }
            // A payload that does not decode now never will: retrying cannot help.
            Err(err) => {
                let error = JobError::permanent(format!(
                    "payload is not a valid {}: {err}",
                    std::any::type_name::<T>()
                ));
                Box::pin(async move { Err(error) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_state_makes_its_token_only_when_asked_and_never_misses_a_cancel() {
        let state = CancelState::default();
        assert!(!state.is_cancelled());
        state.cancel(CancelReason::Requested);
        assert!(state.token.get().is_none(), "cancelling makes no token");
        assert!(state.is_cancelled());
        assert!(
            state.token().is_cancelled(),
            "a token made after the cancel is cancelled"
        );
        state.cancel(CancelReason::Shutdown);
        assert_eq!(
            state.reason(),
            Some(CancelReason::Requested),
            "the first reason wins"
        );

        // A cancel racing the token's making, on two threads, many times: the token
        // always ends cancelled.
        for _ in 0..2_000 {
            let state = Arc::new(CancelState::default());
            let cancelling = Arc::clone(&state);
            let canceller = std::thread::spawn(move || cancelling.cancel(CancelReason::LeaseLost));
            let token = state.token().clone();
            canceller.join().expect("the cancelling thread");
            assert!(
                token.is_cancelled(),
                "a cancel racing the token's making was lost"
            );
        }
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("upload failed")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn error_text_carries_the_cause_chain_once() {
        let err = JobError::from(Outer(std::io::Error::other("connection reset")));
        assert!(err.is_retryable());
        assert_eq!(err.to_error_text(), "upload failed: connection reset");
        let plain = JobError::from("boom");
        assert_eq!(plain.to_error_text(), "boom");
        let permanent = JobError::permanent("bad input");
        assert!(!permanent.is_retryable());
        assert_eq!(permanent.to_string(), "bad input");
    }

    #[test]
    fn a_fenced_completion_is_recorded_not_stored() {
        let id = JobId::mint(durq_core::Timestamp::from_millis(1));
        let receipt = FencedCompletion::new(id, LeaseToken::new(3));
        assert!(matches!(success(receipt), Ok(Success::Recorded(r)) if r == receipt));
        assert!(matches!(success(()), Ok(Success::Store(None))));
        assert!(matches!(
            success("done"),
            Ok(Success::Store(Some(bytes))) if bytes == Bytes::from_static(b"done")
        ));
    }

    #[test]
    fn only_the_stores_lease_lost_reads_as_a_lost_lease() {
        let id = JobId::mint(durq_core::Timestamp::from_millis(1));
        assert!(JobError::from(durq_core::Error::LeaseLost { id }).is_lease_lost());
        // Wrapped by the handler's own error type, found down the chain.
        #[derive(Debug)]
        struct Wrapped(durq_core::Error);
        impl fmt::Display for Wrapped {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("saving the receipt failed")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert!(JobError::from(Wrapped(durq_core::Error::LeaseLost { id })).is_lease_lost());
        assert!(!JobError::from(durq_core::Error::NotFound { id }).is_lease_lost());
        assert!(!JobError::retry("lease lost").is_lease_lost());
        assert!(!JobError::from("boom").is_lease_lost());
    }

    #[test]
    fn outputs_become_results() {
        assert_eq!(().into_result().ok(), Some(None));
        assert_eq!(
            "done".to_owned().into_result().ok(),
            Some(Some(Bytes::from_static(b"done")))
        );
        assert_eq!(
            Json(serde_json::json!({"n": 1})).into_result().ok(),
            Some(Some(Bytes::from_static(br#"{"n":1}"#)))
        );
    }
}
