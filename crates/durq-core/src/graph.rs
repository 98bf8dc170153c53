//! Jobs that wait for jobs (CONTRACT G1–G5): what a dependency is, what a dependent
//! does when one ends other than by success, and the decisions every backend makes
//! when a job is enqueued with dependencies and when a dependency ends, written once.
//!
//! Every backend that keeps dependencies calls [`resolve`] and [`at_enqueue`] when it
//! enqueues; `durq-memory` and `durq-sqlite` call [`settle`] when a job ends, and
//! `durq-postgres`'s `settle_dependents` trigger mirrors it in SQL (it says so). Each
//! keeps a job's edges itself, because where an edge lives is a storage choice and
//! what it means is not.

use std::fmt;

use crate::id::JobId;
use crate::state::JobState;

/// The most jobs one job may wait for (CONTRACT G1).
pub const MAX_DEPENDENCIES: usize = 256;

/// A job a new job waits for (CONTRACT G1, G2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// A job already stored.
    Job(JobId),
    /// The job at this index of the same `enqueue_batch`, which must come before the
    /// job naming it: so a batch can enqueue a whole graph at once, and no cycle can
    /// be built (CONTRACT G2).
    Earlier(usize),
}

impl From<JobId> for Dependency {
    fn from(id: JobId) -> Self {
        Dependency::Job(id)
    }
}

/// What a waiting job does when a job it waits for ends `dead` or `cancelled`
/// (CONTRACT G3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DependencyFailure {
    /// It is cancelled too, and so are the jobs waiting for it that cancel (the
    /// default): a report never runs on half its inputs.
    #[default]
    Cancel,
    /// It runs anyway once every job it waits for has ended, however each ended: a
    /// clean-up or a summary of what worked.
    Run,
}

impl DependencyFailure {
    /// The name backends store: `cancel` or `run`.
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyFailure::Cancel => "cancel",
            DependencyFailure::Run => "run",
        }
    }

    /// The policy a stored name names, `None` for any other text.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "cancel" => Some(DependencyFailure::Cancel),
            "run" => Some(DependencyFailure::Run),
            _ => None,
        }
    }
}

impl fmt::Display for DependencyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ids `dependencies` name, each once, in the order first named: an
/// [`Dependency::Earlier`] is the id at its index of `earlier` (the answers of the
/// batch's jobs before it). One that names no answer is left out; the handle refuses
/// such a batch before a backend sees it ([`crate::validate::validate_batch`]).
pub fn resolve(dependencies: &[Dependency], earlier: &[JobId]) -> Vec<JobId> {
    let mut ids: Vec<JobId> = Vec::with_capacity(dependencies.len());
    for dependency in dependencies {
        let id = match *dependency {
            Dependency::Job(id) => id,
            Dependency::Earlier(index) => match earlier.get(index) {
                Some(&id) => id,
                None => continue,
            },
        };
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// How a new job starts, given the state of each job it waits for (CONTRACT G1, G3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Every job it waits for has already settled it: it is queued as any job is.
    Queued,
    /// It waits for this many jobs that have not ended yet.
    Waiting(u32),
    /// A job it waits for has already ended other than by success and it cancels:
    /// it is stored `cancelled`, with this error.
    Cancelled(String),
}

/// How a job enqueued with dependencies starts: `dependencies` are the states of the
/// jobs it names, each once, as the enqueue read them (G1, G3).
pub fn at_enqueue(
    dependencies: impl IntoIterator<Item = (JobId, JobState)>,
    policy: DependencyFailure,
) -> Start {
    let mut waiting = 0u32;
    for (id, state) in dependencies {
        match settle(state, policy) {
            Some(Settled::Met) => {}
            Some(Settled::Cancel) => return Start::Cancelled(failed_dependency(id, state)),
            None => waiting += 1,
        }
    }
    if waiting == 0 {
        Start::Queued
    } else {
        Start::Waiting(waiting)
    }
}

/// What a job it waits for reaching `state` does to a waiting job (G1, G3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The dependency no longer holds the job back: one fewer to wait for.
    Met,
    /// The dependency failed and the job cancels.
    Cancel,
}

/// What a dependency in `state` means for a job waiting for it with `policy`; `None`
/// while the dependency has not ended (it is waiting, queued or running).
pub fn settle(state: JobState, policy: DependencyFailure) -> Option<Settled> {
    match (state, policy) {
        (JobState::Succeeded, _) => Some(Settled::Met),
        (JobState::Dead | JobState::Cancelled, DependencyFailure::Run) => Some(Settled::Met),
        (JobState::Dead | JobState::Cancelled, DependencyFailure::Cancel) => Some(Settled::Cancel),
        (JobState::Waiting | JobState::Queued | JobState::Running, _) => None,
    }
}

/// The `last_error` of a job cancelled because `dependency` ended in `state` (G3):
/// what an operator reads to see why it never ran.
pub fn failed_dependency(dependency: JobId, state: JobState) -> String {
    format!("cancelled: dependency {dependency} ended {state}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    fn id(n: i64) -> JobId {
        JobId::mint(Timestamp::from_millis(n))
    }

    #[test]
    fn a_job_starts_by_what_its_dependencies_are() {
        let (a, b) = (id(1), id(2));
        let cancel = DependencyFailure::Cancel;
        assert_eq!(at_enqueue([], cancel), Start::Queued);
        assert_eq!(
            at_enqueue([(a, JobState::Succeeded), (b, JobState::Succeeded)], cancel),
            Start::Queued
        );
        assert_eq!(
            at_enqueue([(a, JobState::Running), (b, JobState::Waiting)], cancel),
            Start::Waiting(2)
        );
        assert_eq!(
            at_enqueue([(a, JobState::Queued), (b, JobState::Dead)], cancel),
            Start::Cancelled(failed_dependency(b, JobState::Dead))
        );
        assert_eq!(
            at_enqueue(
                [(a, JobState::Queued), (b, JobState::Dead)],
                DependencyFailure::Run
            ),
            Start::Waiting(1)
        );
    }

    #[test]
    fn only_an_ended_dependency_settles_and_the_policy_says_how() {
        for state in [JobState::Waiting, JobState::Queued, JobState::Running] {
            assert_eq!(settle(state, DependencyFailure::Cancel), None);
            assert_eq!(settle(state, DependencyFailure::Run), None);
        }
        assert_eq!(
            settle(JobState::Succeeded, DependencyFailure::Cancel),
            Some(Settled::Met)
        );
        for state in [JobState::Dead, JobState::Cancelled] {
            assert_eq!(
                settle(state, DependencyFailure::Cancel),
                Some(Settled::Cancel)
            );
            assert_eq!(settle(state, DependencyFailure::Run), Some(Settled::Met));
        }
    }

    #[test]
    fn policies_round_trip_by_name() {
        for policy in [DependencyFailure::Cancel, DependencyFailure::Run] {
            assert_eq!(DependencyFailure::from_name(policy.as_str()), Some(policy));
        }
        assert_eq!(DependencyFailure::from_name("Cancel"), None);
    }
}
