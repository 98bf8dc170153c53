//! Recording outcomes: completions in batches from the claim loop, failures and
//! releases one by one from the jobs' tasks. An outcome the store could not take is
//! tried again, with back-off, for as long as the worker holds the job's lease (the
//! keeper goes on extending it meanwhile); it is given up only when the store says the
//! lease is gone, or refuses the call for a reason a retry cannot change.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use durq_core::{Completion, Error, JobId, JobState, Result, Retry, Store, Timestamp};
use tokio_util::sync::CancellationToken;

use super::events::{JobEvent, JobOutcome};
use super::leases::{HeldJob, LetGo};
use super::{Shared, StoreBackoff};
use crate::telemetry::QueueMetrics;

/// The call that ends a job's lease.
pub(crate) enum Report {
    Complete(Option<Bytes>),
    /// The error text and, if the job may retry, after how long (store clock).
    Fail(String, Option<Duration>),
    Release,
    /// Run again after this delay, the attempt not counted.
    Snooze(Duration),
}

/// The report for an attempt that ran past its time limit: a retryable failure.
pub(crate) fn timed_out_report(shared: &Shared, attempt: u32, timeout: Duration) -> Report {
    Report::Fail(
        format!("timed out after {timeout:?}"),
        Some(shared.config.backoff.delay(attempt)),
    )
}

/// A handler's success, waiting for the claim loop to record it.
pub(crate) struct Succeeded {
    pub(crate) held: Arc<HeldJob>,
    /// What the handler returned, stored as the job's result.
    pub(crate) result: Option<Bytes>,
}

/// Records a batch of successes with `complete_batch`, trying again what the store
/// could not take while the leases hold. Returns with `batch` empty, or early when
/// `stop` fires, leaving in `batch` what is still to record.
pub(crate) async fn record_completions(
    shared: &Shared,
    batch: &mut Vec<Succeeded>,
    stop: Option<&CancellationToken>,
) {
    let store = &shared.config.store;
    let mut delay = StoreBackoff::new();
    while !batch.is_empty() {
        let completions = batch
            .iter()
            .map(|done| Completion::new(done.held.id(), done.held.token, done.result.clone()))
            .collect();
        match store.complete_batch(completions).await {
            Ok(answers) => answer_each(shared, batch, answers),
            Err(err) if err.is_retryable() => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, jobs = batch.len(), "recording completions failed; retrying");
                batch.retain(|done| lease_holds(shared, &done.held));
            }
            Err(err) => {
                shared.metrics.store_errors.increment(1);
                tracing::error!(
                    error = %err,
                    jobs = batch.len(),
                    "could not record completions; the leases will expire and the jobs run again"
                );
                shared
                    .leases
                    .let_go_all(batch.iter().map(|done| &done.held));
                batch.clear();
                return;
            }
        }
        if batch.is_empty() || !delay.wait(stop).await {
            return;
        }
    }
}

/// Whether an outcome that did not reach the store is worth trying again: the lease is
/// still the worker's. Lets go of the job if not.
fn lease_holds(shared: &Shared, held: &Arc<HeldJob>) -> bool {
    if held.is_lost() {
        held.metrics.lease_lost.increment(1);
        tracing::warn!(job = %held.id(), "lease lost before the outcome was recorded");
        shared.leases.drop_job(held);
        false
    } else {
        true
    }
}

/// Counts and logs each answer of a `complete_batch` call, keeping in `batch` the
/// entries the store was unavailable for and whose lease still holds.
fn answer_each(shared: &Shared, batch: &mut Vec<Succeeded>, answers: Vec<Result<()>>) {
    if answers.len() != batch.len() {
        shared.metrics.store_errors.increment(1);
        tracing::error!(
            entries = batch.len(),
            answers = answers.len(),
            "the store answered a different number of completions than it was given"
        );
    }
    let mut answers = answers.into_iter();
    // Each job to let go of, and whether it succeeded (its hooks hear of it).
    let mut done_with: Vec<(Arc<HeldJob>, bool)> = Vec::with_capacity(batch.len());
    batch.retain(|done| {
        let held = &done.held;
        let mut succeeded = false;
        match answers.next() {
            Some(Ok(())) => {
                held.metrics.succeeded.increment(1);
                tracing::debug!(job = %held.id(), "job succeeded");
                succeeded = true;
            }
            Some(Err(err)) if err.is_retryable() => {
                shared.metrics.store_errors.increment(1);
                return lease_holds(shared, held);
            }
            Some(Err(err)) if err.is_lease_lost() || err.is_not_found() => {
                held.metrics.lease_lost.increment(1);
                tracing::warn!(job = %held.id(), error = %err, "lease lost before the outcome was recorded");
            }
            Some(Err(err)) => {
                shared.metrics.store_errors.increment(1);
                tracing::error!(
                    job = %held.id(),
                    error = %err,
                    "could not record the outcome; the lease will expire and the job run again"
                );
            }
            // A store that answered too few entries: try the rest again.
            None => return lease_holds(shared, held),
        }
        done_with.push((Arc::clone(held), succeeded));
        false
    });
    let let_go = shared
        .leases
        .let_go_all(done_with.iter().map(|(held, _)| held));
    if shared.config.hooks.is_empty() {
        return;
    }
    for ((held, succeeded), info) in done_with.into_iter().zip(let_go) {
        if let (true, Some(info)) = (succeeded, info) {
            emit(shared, held.id(), info, JobOutcome::Succeeded);
        }
    }
}

/// Lets go of a job whose outcome the store has acknowledged, and tells the worker's
/// lifecycle hooks what it was (`outcome` is only called when there are hooks).
pub(crate) fn stored(shared: &Shared, held: &Arc<HeldJob>, outcome: impl FnOnce() -> JobOutcome) {
    let let_go = shared.leases.let_go_all([held]);
    if shared.config.hooks.is_empty() {
        return;
    }
    if let Some(Some(info)) = let_go.into_iter().next() {
        emit(shared, held.id(), info, outcome());
    }
}

/// Calls the hooks with the event of a job the worker let go of.
fn emit(shared: &Shared, id: JobId, held: LetGo, outcome: JobOutcome) {
    // Kept for every held job once the worker has hooks.
    let Some(queue) = held.queue else {
        return;
    };
    let event = JobEvent::new(
        id,
        queue,
        held.attempt,
        shared.config.worker_id.clone(),
        held.ran_for,
        outcome,
    );
    shared.config.hooks.emit(&event);
}

/// Records one job's failure, release or (when the claim loop is gone) completion
/// through `store`, trying again while its lease holds; lets go of the job at the end.
pub(crate) async fn report_outcome(
    shared: &Shared,
    store: &Store,
    held: &Arc<HeldJob>,
    outcome: Report,
) {
    let (id, token, metrics) = (held.id(), held.token, &*held.metrics);
    let mut delay = StoreBackoff::new();
    loop {
        // The time the job was asked to run again at, for its lifecycle event.
        let mut again_at = None;
        let result = match &outcome {
            Report::Complete(result) => store
                .complete(id, token, result.clone())
                .await
                .map(|()| JobState::Succeeded),
            Report::Fail(error, retry_in) => {
                let retry = match retry_in {
                    Some(delay) => {
                        let at = store.settings().now().saturating_add(*delay);
                        again_at = Some(at);
                        Retry::At(at)
                    }
                    None => Retry::Never,
                };
                store.fail(id, token, error, retry).await
            }
            Report::Release => store.release(id, token).await.map(|()| JobState::Queued),
            Report::Snooze(delay) => {
                if !shared.config.hooks.is_empty() {
                    // The store adds the delay to its own reading of the same clock.
                    again_at = Some(store.settings().now().saturating_add(*delay));
                }
                store
                    .snooze(id, token, *delay)
                    .await
                    .map(|()| JobState::Queued)
            }
        };
        match result {
            Ok(state) => {
                count_outcome(metrics, &outcome, state);
                stored(shared, held, || {
                    let again_at = again_at.unwrap_or_else(|| store.settings().now());
                    stored_outcome(outcome, state, again_at)
                });
                return;
            }
            Err(err) if err.is_retryable() => {
                shared.metrics.store_errors.increment(1);
                tracing::warn!(error = %err, "reporting the outcome failed; retrying");
                if lease_holds(shared, held) {
                    delay.wait(None).await;
                    continue;
                }
                return;
            }
            Err(err) if err.is_lease_lost() || err.is_not_found() => {
                if matches!(outcome, Report::Release) {
                    // Handing back a job whose lease already ran out: it was reclaimed.
                    tracing::info!("the lease had already been taken back");
                } else {
                    metrics.lease_lost.increment(1);
                    tracing::warn!(error = %err, "lease lost before the outcome was recorded");
                }
            }
            Err(err) => log_refused(shared, &err),
        }
        shared.leases.drop_job(held);
        return;
    }
}

/// What the store made of a reported outcome, for the lifecycle hooks: the state `fail`
/// answered tells a retry from a death or a cancellation.
fn stored_outcome(outcome: Report, state: JobState, again_at: Timestamp) -> JobOutcome {
    match outcome {
        Report::Complete(_) => JobOutcome::Succeeded,
        Report::Fail(error, _) => match state {
            JobState::Dead => JobOutcome::Dead { error },
            JobState::Cancelled => JobOutcome::Cancelled { error },
            _ => JobOutcome::Failed {
                error,
                retry_at: again_at,
            },
        },
        Report::Release => JobOutcome::Released,
        Report::Snooze(_) => JobOutcome::Snoozed { until: again_at },
    }
}

fn log_refused(shared: &Shared, err: &Error) {
    shared.metrics.store_errors.increment(1);
    tracing::error!(
        error = %err,
        "could not record the outcome; the lease will expire and the job run again"
    );
}

fn count_outcome(metrics: &QueueMetrics, outcome: &Report, state: JobState) {
    match outcome {
        Report::Complete(_) => {
            metrics.succeeded.increment(1);
            tracing::debug!("job succeeded");
        }
        Report::Fail(error, _) => {
            metrics.failed.increment(1);
            match state {
                JobState::Dead => {
                    metrics.dead.increment(1);
                    tracing::error!(error = %error, "job failed for good (dead)");
                }
                JobState::Cancelled => {
                    metrics.cancelled.increment(1);
                    tracing::info!("job cancelled");
                }
                _ => {
                    metrics.retried.increment(1);
                    tracing::warn!(error = %error, "job failed; will retry");
                }
            }
        }
        Report::Release => {
            if state == JobState::Queued {
                metrics.released.increment(1);
                tracing::info!("job released");
            }
        }
        Report::Snooze(delay) => {
            metrics.snoozed.increment(1);
            tracing::debug!(?delay, "job snoozed");
        }
    }
}
