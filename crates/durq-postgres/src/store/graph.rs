//! Jobs that wait for jobs (CONTRACT G1–G5): the enqueue of jobs that name
//! dependencies. The decisions are `durq_core::graph`'s. Settling, when a job ends, is
//! the `settle_dependents` trigger's (migration 12), so no statement that ends jobs
//! knows about dependencies.

use std::collections::HashMap;

use durq_core::graph::{self, DependencyFailure, Start};
use durq_core::{Enqueued, Error, JobId, JobState, NewJob, Result, StoreSettings, Timestamp};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::conn::Shared;
use crate::row::{self, column};

use super::enqueue::write_batch;

/// Whether any of `jobs` waits for a job: such a batch takes [`enqueue_graph`].
pub(crate) fn names_dependencies(jobs: &[NewJob]) -> bool {
    jobs.iter().any(|job| !job.depends_on.is_empty())
}

/// Rules G1–G3, with E1–E10 for each job: writes `jobs` on `conn`, inside a
/// transaction (or savepoint) its caller holds and commits. Answers each job's
/// enqueue and the queues that got a job ready now, to announce after the commit.
///
/// The stored jobs the batch waits for are locked first (G5); then the batch is
/// written as any batch is, every job queued; then how each new job that names
/// dependencies starts is decided here, in order, so a later job of the batch sees
/// what an earlier one became, and written for the whole batch in two statements
/// (their states, their edges): a batch costs four statements however many of its
/// jobs wait.
pub(crate) async fn enqueue_graph(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    jobs: &[NewJob],
    now: Timestamp,
) -> Result<(Vec<Enqueued>, Vec<String>)> {
    let stored: Vec<JobId> = {
        let mut ids: Vec<JobId> = jobs
            .iter()
            .flat_map(|job| &job.depends_on)
            .filter_map(|dependency| match dependency {
                graph::Dependency::Job(id) => Some(*id),
                graph::Dependency::Earlier(_) => None,
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let mut states = lock_states(shared, settings, conn, &stored).await?;
    if let Some(missing) = stored.iter().find(|id| !states.contains_key(id)) {
        return Err(Error::invalid(
            "depends_on",
            format!("job {missing} does not exist"),
        ));
    }

    // The enqueue statements bind no dependencies: they write every job queued, and
    // each one that waits is set to how it starts below.
    let answers = write_batch(shared, settings, conn, jobs, now).await?;
    let answered: Vec<JobId> = answers.iter().map(|answer| answer.id).collect();
    // What each new job waits for, a batch index resolved to the job it answered with.
    let resolved: Vec<Option<Vec<JobId>>> = jobs
        .iter()
        .zip(&answers)
        .enumerate()
        .map(|(at, (job, answer))| {
            (answer.created && !job.depends_on.is_empty())
                .then(|| graph::resolve(&job.depends_on, &answered[..at]))
        })
        .collect();
    // A batch index answered by a key names a job stored before the batch: locked too,
    // all at once, in id order.
    let created: std::collections::HashSet<JobId> = answers
        .iter()
        .filter(|answer| answer.created)
        .map(|answer| answer.id)
        .collect();
    let mut earlier_stored: Vec<JobId> = resolved
        .iter()
        .flatten()
        .flatten()
        .filter(|id| !states.contains_key(id) && !created.contains(id))
        .copied()
        .collect();
    earlier_stored.sort_unstable();
    earlier_stored.dedup();
    states.extend(lock_states(shared, settings, conn, &earlier_stored).await?);

    let mut starts = Starts::default();
    let mut ready: Vec<String> = Vec::new();
    for ((job, answer), ids) in jobs.iter().zip(&answers).zip(&resolved) {
        if !answer.created {
            continue;
        }
        let Some(ids) = ids else {
            states.insert(answer.id, JobState::Queued);
            if job.run_at.is_none_or(|at| at <= now) {
                ready.push(job.queue.clone());
            }
            continue;
        };
        let known: Vec<(JobId, JobState)> = ids
            .iter()
            .filter_map(|id| states.get(id).map(|state| (*id, *state)))
            .collect();
        let start = graph::at_enqueue(known.iter().copied(), job.on_dependency_failure);
        if let Start::Waiting(_) = start {
            for (dependency, _) in known.iter().filter(|(_, state)| !state.is_terminal()) {
                starts.edge(*dependency, answer.id);
            }
        }
        let state = starts.push(answer.id, job, ids, &start, now);
        if state == JobState::Queued && job.run_at.is_none_or(|at| at <= now) {
            ready.push(job.queue.clone());
        }
        states.insert(answer.id, state);
    }
    starts.write(shared, settings, conn).await?;
    ready.sort_unstable();
    ready.dedup();
    Ok((answers, ready))
}

/// How the new jobs of a batch that wait start, and their edges, gathered for the
/// `START_DEPENDENTS` and `RECORD_EDGES` statements (`sql/graph.rs`): one column per
/// field.
#[derive(Default)]
struct Starts {
    ids: Vec<Uuid>,
    states: Vec<&'static str>,
    depends_on: Vec<String>,
    policies: Vec<Option<i16>>,
    waiting_for: Vec<Option<i32>>,
    finished_at: Vec<Option<i64>>,
    errors: Vec<Option<Vec<u8>>>,
    dependencies: Vec<Uuid>,
    dependents: Vec<Uuid>,
}

impl Starts {
    /// Job `dependent` waits for job `dependency`.
    fn edge(&mut self, dependency: JobId, dependent: JobId) {
        self.dependencies.push(Uuid::from(dependency));
        self.dependents.push(Uuid::from(dependent));
    }

    /// The new job `id` (`job`, waiting for `ids`) starts as `start`; answers its state.
    fn push(
        &mut self,
        id: JobId,
        job: &NewJob,
        ids: &[JobId],
        start: &Start,
        now: Timestamp,
    ) -> JobState {
        let (state, waiting_for, finished_at, error) = match start {
            Start::Queued => (JobState::Queued, None, None, None),
            Start::Waiting(count) => (
                JobState::Waiting,
                Some(i32::try_from(*count).unwrap_or(i32::MAX)),
                None,
                None,
            ),
            Start::Cancelled(error) => (
                JobState::Cancelled,
                None,
                Some(now.as_millis()),
                Some(error.as_bytes().to_vec()),
            ),
        };
        self.ids.push(Uuid::from(id));
        self.states.push(state.as_str());
        self.depends_on.push(
            ids.iter()
                .map(JobId::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
        self.policies.push(match job.on_dependency_failure {
            DependencyFailure::Cancel => None,
            DependencyFailure::Run => Some(1),
        });
        self.waiting_for.push(waiting_for);
        self.finished_at.push(finished_at);
        self.errors.push(error);
        state
    }

    /// The two statements: every start, then every edge.
    async fn write(
        &self,
        shared: &Shared,
        settings: &StoreSettings,
        conn: &mut PgConnection,
    ) -> Result<()> {
        if !self.ids.is_empty() {
            sqlx::query(shared.sql.start_dependents.sql())
                .bind(&settings.namespace)
                .bind(&self.ids)
                .bind(&self.states)
                .bind(&self.depends_on)
                .bind(&self.policies)
                .bind(&self.waiting_for)
                .bind(&self.finished_at)
                .bind(&self.errors)
                .execute(&mut *conn)
                .await
                .map_err(|err| shared.error("enqueue: start the dependents", err))?;
        }
        if !self.dependencies.is_empty() {
            sqlx::query(shared.sql.record_edges.sql())
                .bind(&settings.namespace)
                .bind(&self.dependencies)
                .bind(&self.dependents)
                .execute(&mut *conn)
                .await
                .map_err(|err| shared.error("enqueue: record dependencies", err))?;
        }
        Ok(())
    }
}

/// The states of the stored jobs `ids`, their rows locked until the transaction ends
/// (G5). A job that does not exist is missing from the answer.
async fn lock_states(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    ids: &[JobId],
) -> Result<HashMap<JobId, JobState>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let uuids: Vec<Uuid> = ids.iter().map(|id| Uuid::from(*id)).collect();
    let rows = sqlx::query(shared.sql.lock_dependencies.sql())
        .bind(&settings.namespace)
        .bind(&uuids)
        .fetch_all(&mut *conn)
        .await
        .map_err(|err| shared.error("enqueue: lock the dependencies", err))?;
    let what = || "dependency row".to_owned();
    rows.iter()
        .map(|found| {
            let id = row::job_id(column(found, 0, &what)?)?;
            let text: String = column(found, 1, &what)?;
            let state = text
                .parse::<JobState>()
                .map_err(|err| Error::corrupt(format!("job {id}"), err.to_string()))?;
            Ok((id, state))
        })
        .collect()
}
