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
/// The stored jobs the batch waits for are locked first (G5); then the
/// batch is written as any batch is, every job queued, and each new job that names any is
/// set to how its dependencies start it, in order, so a later job of the batch sees
/// what an earlier one became.
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

    let mut earlier: Vec<JobId> = Vec::with_capacity(jobs.len());
    let mut ready: Vec<String> = Vec::new();
    for (job, answer) in jobs.iter().zip(&answers) {
        earlier.push(answer.id);
        if !answer.created {
            continue;
        }
        if job.depends_on.is_empty() {
            states.insert(answer.id, JobState::Queued);
            if job.run_at.is_none_or(|at| at <= now) {
                ready.push(job.queue.clone());
            }
            continue;
        }
        let ids = graph::resolve(&job.depends_on, &earlier[..earlier.len() - 1]);
        // A batch index answered by a key names a job stored before the batch.
        let unknown: Vec<JobId> = ids
            .iter()
            .filter(|id| !states.contains_key(id))
            .copied()
            .collect();
        states.extend(lock_states(shared, settings, conn, &unknown).await?);
        let known: Vec<(JobId, JobState)> = ids
            .iter()
            .filter_map(|id| states.get(id).map(|state| (*id, *state)))
            .collect();
        let start = graph::at_enqueue(known.iter().copied(), job.on_dependency_failure);
        let state = start_job(shared, settings, conn, answer.id, job, &ids, &start, now).await?;
        if let Start::Waiting(_) = start {
            let pending: Vec<Uuid> = known
                .iter()
                .filter(|(_, state)| !state.is_terminal())
                .map(|(id, _)| Uuid::from(*id))
                .collect();
            sqlx::query(shared.sql.record_edges.sql())
                .bind(&settings.namespace)
                .bind(Uuid::from(answer.id))
                .bind(&pending)
                .execute(&mut *conn)
                .await
                .map_err(|err| shared.error("enqueue: record dependencies", err))?;
        }
        if state == JobState::Queued && job.run_at.is_none_or(|at| at <= now) {
            ready.push(job.queue.clone());
        }
        states.insert(answer.id, state);
    }
    ready.sort_unstable();
    ready.dedup();
    Ok((answers, ready))
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

/// Sets the new job `id` to how its dependencies start it; answers its state.
#[allow(clippy::too_many_arguments)]
async fn start_job(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    id: JobId,
    job: &NewJob,
    ids: &[JobId],
    start: &Start,
    now: Timestamp,
) -> Result<JobState> {
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
            Some(error.as_bytes()),
        ),
    };
    let policy: Option<i16> = match job.on_dependency_failure {
        DependencyFailure::Cancel => None,
        DependencyFailure::Run => Some(1),
    };
    let uuids: Vec<Uuid> = ids.iter().map(|id| Uuid::from(*id)).collect();
    sqlx::query(shared.sql.start_dependent.sql())
        .bind(&settings.namespace)
        .bind(Uuid::from(id))
        .bind(state.as_str())
        .bind(&uuids)
        .bind(policy)
        .bind(waiting_for)
        .bind(finished_at)
        .bind(error)
        .execute(&mut *conn)
        .await
        .map_err(|err| shared.error("enqueue: start a dependent", err))?;
    Ok(state)
}
