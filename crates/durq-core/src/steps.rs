//! Durable steps (CONTRACT D1–D4): the outputs a running job saves as it goes, kept
//! across its runs, so a run after a crash or a retry skips the steps that finished.
//!
//! A backend keeps, per job, a *generation* and the steps saved in it, in the order
//! they were saved. [`Steps::save_step`](crate::capability::Steps::save_step) adds one,
//! fenced by the lease token; [`Steps::retry_from`](crate::capability::Steps::retry_from)
//! reopens an ended job from a step, a compare-and-set on the generation, so of two
//! reopens that read the same generation exactly one wins.

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::time::Timestamp;

/// The longest step name, in bytes.
pub const MAX_STEP_BYTES: usize = 128;

/// The most steps one job may save in one generation: a job that saves more is
/// refused (`InvalidInput { field: "step" }`), so one job's steps stay one read.
pub const MAX_STEPS: usize = 1_000;

/// One saved step: its name, the output its handler stored, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedStep {
    /// The name the handler gave it, unique within the job's generation.
    pub name: String,
    /// The output, exactly as saved.
    pub output: Bytes,
    /// When it was saved (the store's clock).
    pub saved_at: Timestamp,
}

/// A job's steps as stored (CONTRACT D2): its generation and the steps saved in it,
/// oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLog {
    /// How many times the job was reopened from a step (D3); 0 for a job never
    /// reopened.
    pub generation: u64,
    /// The steps saved in this generation, in the order they were saved.
    pub steps: Vec<SavedStep>,
}

impl StepLog {
    /// The saved step named `name`, if any.
    pub fn get(&self, name: &str) -> Option<&SavedStep> {
        self.steps.iter().find(|step| step.name == name)
    }

    /// The position of step `name` in save order, if it was saved.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|step| step.name == name)
    }

    /// Rule D3 on a log already read: what `retry_from(step, generation)` leaves, or
    /// the refusal, for backends that hold the log in memory. The steps before `step`
    /// stay; `step` and every step saved after it go; the generation moves up by one.
    pub fn reopened_from(&self, id: crate::JobId, step: &str, generation: u64) -> Result<StepLog> {
        if generation != self.generation {
            return Err(Error::StaleGeneration {
                id,
                expected: generation,
                current: self.generation,
            });
        }
        let at = self.position(step).ok_or_else(|| not_saved(step))?;
        Ok(StepLog {
            generation: self.generation + 1,
            steps: self.steps[..at].to_vec(),
        })
    }
}

/// The refusal of `retry_from` naming a step the job has not saved in its generation
/// (CONTRACT D3).
pub fn not_saved(step: &str) -> Error {
    Error::invalid(
        "step",
        format!("the job has saved no step {step:?} in its current generation"),
    )
}

/// The refusal of a save past [`MAX_STEPS`] (CONTRACT D1).
pub fn too_many_steps() -> Error {
    Error::invalid(
        "step",
        format!("a job saves at most {MAX_STEPS} steps in one generation"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobId;

    fn log(generation: u64, names: &[&str]) -> StepLog {
        StepLog {
            generation,
            steps: names
                .iter()
                .enumerate()
                .map(|(i, name)| SavedStep {
                    name: (*name).to_owned(),
                    output: Bytes::from(name.to_string()),
                    saved_at: Timestamp::from_millis(i as i64),
                })
                .collect(),
        }
    }

    #[test]
    fn a_reopen_keeps_the_steps_before_the_named_one_and_moves_the_generation() {
        let id = JobId::mint(Timestamp::from_millis(1));
        let reopened = log(3, &["a", "b", "c"])
            .reopened_from(id, "b", 3)
            .expect("b was saved in generation 3");
        assert_eq!(reopened, log(4, &["a"]));
    }

    #[test]
    fn a_reopen_of_a_stale_generation_or_an_unsaved_step_is_refused() {
        let id = JobId::mint(Timestamp::from_millis(1));
        let stale = log(2, &["a"]).reopened_from(id, "a", 1).expect_err("stale");
        assert!(matches!(
            stale,
            Error::StaleGeneration {
                expected: 1,
                current: 2,
                ..
            }
        ));
        let unsaved = log(0, &["a"])
            .reopened_from(id, "z", 0)
            .expect_err("unsaved");
        assert_eq!(unsaved.invalid_field(), Some("step"));
    }
}
