//! One step of a case: the operation run on the store and on the model, and their
//! answers compared.
//!
//! [`Run::step`] only dispatches; each operation has its own function, grouped by the
//! section of the [contract](durq_core::contract) that rules it. Each returns a short
//! note of what happened (for the trace and the coverage summary), or why the store's
//! answer is not one the model allows. A step whose operation has nothing to act on
//! yet (no jobs, no claims) is skipped, and its note starts with "skipped".

mod admin;
mod claim;
mod clock;
mod enqueue;
mod lease;
mod read;
mod reclaim;

use durq_core::{Error, JobId};

use super::case::Run;
use super::model::Expect;
use super::ops::Op;

impl Run {
    /// Runs step number `step`, `op`, on the store and on the model.
    pub(super) async fn step(&mut self, step: usize, op: &Op) -> Result<String, String> {
        match op {
            Op::Enqueue(spec) => self.enqueue(spec, step).await,
            Op::EnqueueBatch(specs) => self.enqueue_batch(specs, step).await,
            Op::Claim {
                worker,
                queues,
                limit,
                ttl_ms,
            } => self.claim(*worker, *queues, *limit, *ttl_ms).await,
            Op::Heartbeat {
                claim,
                token,
                ttl_ms,
            } => self.heartbeat(*claim, *token, *ttl_ms).await,
            Op::Complete {
                claim,
                token,
                result,
            } => self.complete(*claim, *token, *result, step).await,
            Op::CompleteBatch(entries) => self.complete_batch(entries, step).await,
            Op::Fail {
                claim,
                token,
                retry_in,
            } => self.fail(*claim, *token, *retry_in, step).await,
            Op::Release { claim, token } => self.release(*claim, *token).await,
            Op::Reclaim { limit } => self.reclaim(*limit).await,
            Op::Cancel { job } => self.cancel(*job).await,
            Op::Retry { job } => self.retry(*job).await,
            Op::Purge { limit } => self.purge(*limit).await,
            Op::Get { job } => self.get(*job).await,
            Op::Children { job } => self.children(*job).await,
            Op::Stats { queue } => self.stats(*queue).await,
            Op::List { queue, state, page } => self.list(*queue, *state, *page).await,
            Op::Advance { ms } => Ok(self.advance(*ms)),
            Op::AdvanceTo { mark, offset } => Ok(self.advance_to(*mark, *offset)),
        }
    }
}

/// Whether `err` is the error the model expects, about job `id` (any job when `None`:
/// an enqueue's errors name no job of the model).
fn error_matches(err: &Error, want: Expect, id: Option<JobId>) -> bool {
    let about = |got: &JobId| id.is_none_or(|id| id == *got);
    match (err, want) {
        (Error::NotFound { id: got }, Expect::NotFound) => about(got),
        (Error::LeaseLost { id: got }, Expect::LeaseLost) => about(got),
        (Error::InvalidInput { field, .. }, Expect::Invalid(want)) => *field == want,
        (Error::InvalidState { id: got, state, .. }, Expect::InvalidState(want)) => {
            about(got) && *state == want
        }
        _ => false,
    }
}

/// Compares a store answer about job `id` with the model's, for calls that must agree
/// exactly: both succeed with answers `same` accepts, or both fail the same way.
fn agree<W: std::fmt::Debug, G: std::fmt::Debug>(
    what: &str,
    id: JobId,
    want: Result<W, Expect>,
    got: durq_core::Result<G>,
    same: impl Fn(&W, &G) -> bool,
) -> Result<String, String> {
    match (&want, &got) {
        (Ok(w), Ok(g)) if same(w, g) => Ok(format!("{g:?}")),
        (Err(w), Err(g)) if error_matches(g, *w, Some(id)) => Ok(format!("error {g}")),
        _ => Err(format!(
            "{what}: the store answered {got:?}, the model expects {want:?}"
        )),
    }
}
