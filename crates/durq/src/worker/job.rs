//! One job's life in the worker: started (its first poll inline where that pays),
//! run to its end under its timeout and cancellation, and concluded into a report.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use durq_core::Needs;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::claim_loop::COMPLETION_BATCH;
use super::events::JobOutcome;
use super::leases::{Deadline, HeldJob, Start};
use super::report::{report_outcome, stored, Report, Succeeded};
use super::Shared;
use crate::handler::{
    CancelReason, CancelState, ErasedHandler, HandlerFuture, JobContext, JobError, RetryAdvice,
    Success,
};

/// First polls of a queue's handler taking longer than this, [`SLOW_POLLS_IN_A_ROW`]
/// times in a row, move its jobs to tasks.
pub(crate) const INLINE_POLL_LIMIT: Duration = Duration::from_micros(50);
/// See [`INLINE_POLL_LIMIT`].
pub(crate) const SLOW_POLLS_IN_A_ROW: u32 = 4;

/// A queue's handler, and whether its jobs start inline (see [`start_job`]).
pub(crate) struct QueueHandler {
    /// The queue's name, shared by the lifecycle events of its jobs.
    pub(crate) name: Arc<str>,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) inline: InlinePolls,
}

/// Whether a queue's handlers get their first poll in the claim loop: yes, until
/// [`SLOW_POLLS_IN_A_ROW`] first polls in a row took over [`INLINE_POLL_LIMIT`], or
/// one blocked past the worker's blocking threshold.
///
/// A handler that computes before it first awaits would hold up the claim loop and
/// every job behind it; one slow poll is not enough to say so (the thread may just
/// have been preempted), but one that blocks is. The decision is for good: such a
/// handler stays slow.
#[derive(Debug)]
pub(crate) struct InlinePolls {
    allowed: AtomicBool,
    slow_in_a_row: AtomicU32,
}

impl InlinePolls {
    pub(crate) fn new() -> Self {
        InlinePolls {
            allowed: AtomicBool::new(true),
            slow_in_a_row: AtomicU32::new(0),
        }
    }

    pub(crate) fn allowed(&self) -> bool {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Records how long a first poll took; true if that ended inline polls.
    pub(crate) fn record(&self, took: Duration) -> bool {
        if took <= INLINE_POLL_LIMIT {
            self.slow_in_a_row.store(0, Ordering::Relaxed);
            return false;
        }
        let in_a_row = self.slow_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        in_a_row >= SLOW_POLLS_IN_A_ROW && self.end()
    }

    /// Ends inline polls at once; true if they were still allowed.
    pub(crate) fn end(&self) -> bool {
        self.allowed.swap(false, Ordering::Relaxed)
    }
}

/// Starts a claimed job's handler, unless its lease is already gone. A handler whose
/// queue runs inline is polled once right here: most short handlers finish in that
/// poll, and then the job costs no task, no wake-up and no thread hand-off. One that
/// does not finish goes on in a task of its own, as every handler of a queue whose
/// first polls proved slow does from the start.
///
/// The job is already held (see [`super::leases`]): its lease is kept from its claim,
/// whatever the jobs started before it in the same batch do to this loop.
pub(crate) fn start_job(
    shared: &Arc<Shared>,
    jobs: &mut JoinSet<()>,
    held: Arc<HeldJob>,
    payload: Bytes,
    queue: Option<&QueueHandler>,
    succeeded: &mut Vec<Succeeded>,
) {
    let config = &shared.config;
    let job = &held.job;
    let span = tracing::info_span!(
        "job",
        queue = %job.queue,
        id = %job.id,
        attempt = job.attempts,
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(traceparent) = &job.trace_context {
        // Before the span is entered: its parent is fixed once it starts.
        crate::trace_context::adopt(&span, traceparent);
    }
    let _entered = span.enter();

    let Some(queue) = queue else {
        // Only a store breaking CONTRACT C4 hands out a job of a queue not asked for;
        // give it back untouched rather than guess what to run.
        tracing::error!("claimed a job of a queue this worker does not serve; releasing it");
        spawn_report(shared, jobs, held, Report::Release, &span);
        return;
    };
    let timeout = job.timeout.or(config.timeout);
    let started = Instant::now();
    // Read for each job, not once for the claim: a job before it in the batch may have
    // blocked this loop past the lease (CONTRACT L9).
    let now = config.store.settings().now();
    let deadline = timeout.map(|timeout| Deadline {
        at: now.saturating_add(timeout),
        timeout,
    });
    match held.start(now, deadline, started) {
        Start::Run => {}
        Start::Lost => {
            // Reclaimed while it waited for its turn: another worker may run it now.
            held.metrics.lease_lost.increment(1);
            tracing::warn!("lease lost before the handler started; not starting it");
            shared.leases.drop_job(&held);
            return;
        }
        Start::Expired => {
            // No heartbeat renewed it (the store was unreachable): it may be reclaimed
            // at any moment, so it is handed back rather than started under a lease
            // that another worker may be given.
            tracing::warn!("lease expired before the handler started; releasing it");
            spawn_report(shared, jobs, held, Report::Release, &span);
            return;
        }
    }

    let slot = SlotGuard::take(shared, &job.needs);
    let begun = Begun {
        started,
        timeout,
        held: Arc::clone(&held),
    };
    let ctx = JobContext::new(held, Arc::clone(&shared.context));
    // Building the future runs the closure's synchronous part, which may panic too.
    let mut future =
        match std::panic::catch_unwind(AssertUnwindSafe(|| queue.handler.call(ctx, payload))) {
            Ok(future) => future,
            Err(panic) => {
                slot.free_inline();
                let finished = Finished::Panicked(panic_message(panic.as_ref()));
                conclude_inline(shared, jobs, begun, finished, &span, succeeded);
                return;
            }
        };
    if queue.inline.allowed() {
        // No waker to give: if the handler is not done, its task polls it again at once
        // and registers its own, so nothing it waits for can be missed.
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
        let took = begun.started.elapsed();
        if took > config.blocking_threshold {
            tracing::warn!(
                took = ?took,
                "the handler's first poll blocked the claim loop; its queue's jobs now start in tasks"
            );
            queue.inline.end();
        } else if queue.inline.record(took) {
            tracing::info!(
                "the handler's first polls are slow; its queue's jobs now start in tasks"
            );
        }
        let finished = match polled {
            Ok(Poll::Ready(result)) => Some(Finished::Returned(result)),
            // Not done: it goes on below, in a task.
            Ok(Poll::Pending) => None,
            Err(panic) => Some(Finished::Panicked(panic_message(panic.as_ref()))),
        };
        if let Some(finished) = finished {
            slot.free_inline();
            conclude_inline(shared, jobs, begun, finished, &span, succeeded);
            return;
        }
    }
    let watched = WatchedPolls {
        future,
        threshold: config.blocking_threshold,
        warned: false,
    };
    let task_shared = Arc::clone(shared);
    let cancel_grace = config.cancel_grace;
    let held = Arc::clone(&begun.held);
    let task = jobs.spawn(
        async move {
            let finished = {
                let _slot = slot;
                run_handler(watched, &begun.held.cancel, cancel_grace, begun.timeout).await
            };
            let report = match conclude(&task_shared, &begun, finished) {
                Some(Report::Complete(result)) => hand_over(&task_shared, &begun.held, result),
                other => other,
            };
            if let Some(report) = report {
                let store = &task_shared.config.store;
                report_outcome(&task_shared, store, &begun.held, report).await;
            }
        }
        .instrument(span.clone()),
    );
    held.set_task(task);
}

/// Sends a job's outcome from a task of its own.
fn spawn_report(
    shared: &Arc<Shared>,
    jobs: &mut JoinSet<()>,
    held: Arc<HeldJob>,
    report: Report,
    span: &tracing::Span,
) {
    let shared = Arc::clone(shared);
    jobs.spawn(
        async move {
            let store = &shared.config.store;
            report_outcome(&shared, store, &held, report).await;
        }
        .instrument(span.clone()),
    );
}

/// Frees the job's concurrency slot when dropped: when the handler returned, or when
/// the task is aborted.
struct SlotGuard {
    shared: Arc<Shared>,
    /// Whether to wake the claim loop: not when the claim loop frees it itself.
    wake: bool,
    /// What the job holds of the worker's capacity, when the worker counts it.
    needs: Option<Needs>,
}

impl SlotGuard {
    /// Takes a slot, and the job's needs from the worker's capacity, before the next
    /// claim is sized: the claim loop starts a claim's jobs before it claims again.
    fn take(shared: &Arc<Shared>, needs: &Needs) -> Self {
        shared.handlers_running.fetch_add(1, Ordering::AcqRel);
        let needs = shared.capacity.as_ref().map(|capacity| {
            capacity.take(needs);
            needs.clone()
        });
        SlotGuard {
            shared: Arc::clone(shared),
            wake: true,
            needs,
        }
    }

    /// Frees the slot from the claim loop, which will see it free without a wake-up.
    fn free_inline(mut self) {
        self.wake = false;
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let (Some(capacity), Some(needs)) = (&self.shared.capacity, &self.needs) {
            capacity.give_back(needs);
        }
        self.shared.handlers_running.fetch_sub(1, Ordering::AcqRel);
        if self.wake {
            self.shared.slot_freed.notify_one();
        }
    }
}

/// A job whose handler was called.
struct Begun {
    started: Instant,
    timeout: Option<Duration>,
    held: Arc<HeldJob>,
}

/// How a handler ended.
enum Finished {
    /// It returned.
    Returned(std::result::Result<Success, JobError>),
    /// It panicked, with this message.
    Panicked(String),
    /// The worker dropped it: cancelled and not done within the grace period.
    Dropped,
    /// The worker dropped it: past its time limit and the grace period.
    TimedOut(Duration),
}

/// Concludes a job that finished in its first poll: a success joins the claim loop's
/// next batch of completions (`succeeded`, while it has room; the channel otherwise),
/// any other outcome goes to a task of its own.
fn conclude_inline(
    shared: &Arc<Shared>,
    jobs: &mut JoinSet<()>,
    begun: Begun,
    finished: Finished,
    span: &tracing::Span,
    succeeded: &mut Vec<Succeeded>,
) {
    let report = match conclude(shared, &begun, finished) {
        Some(Report::Complete(result)) if succeeded.len() < COMPLETION_BATCH => {
            succeeded.push(Succeeded {
                held: begun.held,
                result,
            });
            return;
        }
        Some(Report::Complete(result)) => hand_over(shared, &begun.held, result),
        other => other,
    };
    if let Some(report) = report {
        spawn_report(shared, jobs, begun.held, report, span);
    }
}

/// Takes a finished handler's job into reporting and decides what to report: `None`
/// when there is nothing to (the lease was lost, the handler stored its completion
/// itself, or the keeper already failed the job as timed out).
fn conclude(shared: &Shared, begun: &Begun, finished: Finished) -> Option<Report> {
    let config = &shared.config;
    let held = &begun.held;
    let ran_for = begun.started.elapsed();
    // On the store's clock from the attempt's recorded start, as `attempts()` reports
    // it (CONTRACT H2), so the histogram and the history tell one story.
    let run_time = held
        .job
        .started_at
        .map_or(ran_for, |at| config.store.now().duration_since(at));
    held.metrics.run_time.record(run_time.as_secs_f64());
    if !held.finish(ran_for) {
        return None;
    }
    if let Finished::Returned(Ok(Success::Recorded(receipt))) = &finished {
        if (receipt.id(), receipt.token()) == (held.id(), held.token) {
            // Stored by the handler with its own writes (CONTRACT §7, T3): nothing is
            // left to record, and the lease is no longer worth keeping. A heartbeat may
            // have found the lease gone since: that is this completion's doing (a store
            // that had taken the lease back would have refused it), so it is checked
            // before the cancel reason.
            held.metrics.succeeded.increment(1);
            tracing::debug!("completed by the handler in its own transaction");
            stored(shared, held, || JobOutcome::Succeeded);
            return None;
        }
    }
    let reason = held.cancel.reason();
    if reason == Some(CancelReason::LeaseLost) {
        // Counted here, not when a heartbeat heard of it: a fenced success (above) may
        // be why the lease is gone.
        held.metrics.lease_lost.increment(1);
        tracing::warn!("the handler ended after its lease was lost; nothing to report");
        shared.leases.drop_job(held);
        return None;
    }
    let cancelled = reason == Some(CancelReason::Requested);
    let attempt = held.attempt();
    let report = match finished {
        // The receipt of another lease than this attempt's (its own is handled above).
        Finished::Returned(Ok(Success::Recorded(receipt))) => Report::Fail(
            format!(
                "the handler returned the receipt of job {}'s completion (lease {}), not of its own",
                receipt.id(),
                receipt.token().get()
            ),
            Some(config.backoff.delay(attempt)),
        ),
        Finished::Returned(Err(error)) if error.is_lease_lost() => {
            // The store told the handler its lease is gone (a fenced completion refused,
            // say): another worker may hold the job now, so nothing is recorded.
            tracing::warn!(
                error = %error,
                "the handler's lease was lost; recording nothing for the attempt"
            );
            shared.leases.drop_job(held);
            return None;
        }
        Finished::Returned(Ok(Success::Store(result))) => Report::Complete(result),
        Finished::Returned(Err(error)) if cancelled => {
            Report::Fail(format!("cancelled: {}", error.to_error_text()), None)
        }
        Finished::Returned(Err(error)) => {
            let retry_in = match error.retry {
                RetryAdvice::Backoff => Some(config.backoff.delay(attempt)),
                RetryAdvice::After(delay) => Some(delay),
                RetryAdvice::Never => None,
                RetryAdvice::Snooze(delay) => {
                    tracing::debug!(message = error.message(), ?delay, "job snoozed");
                    return Some(Report::Snooze(delay));
                }
            };
            let text = match (reason, begun.timeout) {
                (Some(CancelReason::TimedOut), Some(timeout)) => {
                    format!("timed out after {timeout:?}: {}", error.to_error_text())
                }
                _ => error.to_error_text(),
            };
            Report::Fail(text, retry_in)
        }
        Finished::Panicked(message) => {
            held.metrics.panicked.increment(1);
            let text = format!("handler panicked: {message}");
            if cancelled {
                Report::Fail(text, None)
            } else {
                Report::Fail(text, Some(config.backoff.delay(attempt)))
            }
        }
        Finished::TimedOut(timeout) => {
            held.metrics.timed_out.increment(1);
            super::report::timed_out_report(shared, attempt, timeout)
        }
        Finished::Dropped if cancelled => Report::Fail(
            "cancelled: the handler did not stop within the cancel grace period".to_owned(),
            None,
        ),
        Finished::Dropped => Report::Release,
    };
    Some(report)
}

/// Hands a success to the claim loop from a job's task. Successes are the common case
/// and need no answer here: the claim loop records them in batches, so a thousand short
/// jobs cost a few store calls. The lease stays held (and heartbeated) until the
/// completion is stored. Returns the report to make here if the claim loop is gone.
fn hand_over(shared: &Shared, held: &Arc<HeldJob>, result: Option<Bytes>) -> Option<Report> {
    let succeeded = Succeeded {
        held: Arc::clone(held),
        result,
    };
    match shared.completions.send(succeeded) {
        Ok(()) => None,
        // The claim loop is gone only if the worker's own task was aborted midway;
        // report this one directly rather than drop it.
        Err(mpsc::error::SendError(succeeded)) => Some(Report::Complete(succeeded.result)),
    }
}

/// Runs a handler's future to its end, catching its panics; when the job is cancelled
/// (by an operator, a lost lease, or the keeper when its time is up), gives it the
/// cancel grace period to return (none at shutdown, whose grace has already passed).
async fn run_handler(
    future: WatchedPolls,
    cancel: &CancelState,
    cancel_grace: Duration,
    timeout: Option<Duration>,
) -> Finished {
    let mut future = AssertUnwindSafe(future).catch_unwind();
    let joined = tokio::select! {
        // The handler first: most return at once, before a cancellation could matter,
        // and polling the token first would register a waiter only to drop it.
        biased;
        joined = &mut future => Some(joined),
        () = cancel.token().cancelled() => None,
    };
    let joined = match joined {
        Some(joined) => joined,
        None if cancel.reason() == Some(CancelReason::Shutdown) => return Finished::Dropped,
        None => match tokio::time::timeout(cancel_grace, &mut future).await {
            Ok(joined) => joined,
            Err(_) => {
                return match (cancel.reason(), timeout) {
                    (Some(CancelReason::TimedOut), Some(timeout)) => Finished::TimedOut(timeout),
                    _ => Finished::Dropped,
                }
            }
        },
    };
    match joined {
        Ok(result) => Finished::Returned(result),
        Err(panic) => Finished::Panicked(panic_message(panic.as_ref())),
    }
}

/// A handler's future, each poll timed: one that takes longer than the threshold
/// blocks its runtime thread (and every task queued behind it), which a user wants to
/// hear about with the job that did it. Logged once per job.
struct WatchedPolls {
    future: HandlerFuture,
    threshold: Duration,
    warned: bool,
}

impl Future for WatchedPolls {
    type Output = std::result::Result<Success, JobError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let began = Instant::now();
        let polled = self.future.as_mut().poll(cx);
        let took = began.elapsed();
        if took > self.threshold && !self.warned {
            self.warned = true;
            // The job's span (queue, id, attempt) is entered by the task.
            tracing::warn!(
                took = ?took,
                threshold = ?self.threshold,
                "a poll of the handler blocked its thread"
            );
        }
        polled
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_polls_end_after_slow_polls_in_a_row_only() {
        let fast = INLINE_POLL_LIMIT;
        let slow = INLINE_POLL_LIMIT + Duration::from_micros(1);
        let polls = InlinePolls::new();
        for _ in 0..10 {
            for _ in 1..SLOW_POLLS_IN_A_ROW {
                assert!(!polls.record(slow));
            }
            assert!(!polls.record(fast), "a fast poll breaks the streak");
            assert!(polls.allowed());
        }
        for _ in 1..SLOW_POLLS_IN_A_ROW {
            assert!(!polls.record(slow));
        }
        assert!(
            polls.record(slow),
            "the last slow poll of the streak ends inline polls"
        );
        assert!(!polls.allowed());
        assert!(!polls.record(slow), "ended once, reported once");
        assert!(!polls.record(fast));
        assert!(!polls.allowed(), "for good");
    }

    #[test]
    fn a_blocking_poll_ends_inline_polls_at_once() {
        let polls = InlinePolls::new();
        assert!(polls.end(), "the first end reports it");
        assert!(!polls.allowed());
        assert!(!polls.end(), "ended once, reported once");
    }
}
