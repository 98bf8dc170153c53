//! Jobs that wait for jobs (CONTRACT G1–G5): the edges in `jobq_dependencies`, made at
//! enqueue and settled, in the same transaction, by whatever ends a job that has them.
//! The decisions are `durq_core::graph`'s; this keeps the edges.

use durq_core::graph::{self, Dependency, Settled, Start};

use super::*;

/// The `depends_on` column: the ids, 16 bytes each, concatenated.
pub(super) fn ids_to_blob(ids: &[JobId]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_bytes()).collect()
}

/// The ids of a `depends_on` column, or what is wrong with it.
pub(super) fn ids_from_blob(bytes: &[u8]) -> std::result::Result<Vec<JobId>, String> {
    if bytes.len() % 16 != 0 {
        return Err(format!(
            "depends_on holds {} bytes, not whole ids",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(16)
        .map(|chunk| {
            let mut id = [0u8; 16];
            id.copy_from_slice(chunk);
            JobId::from_bytes(id).map_err(|err| format!("depends_on holds a bad id: {err}"))
        })
        .collect()
}

/// What the enqueue of a job with dependencies found: the ids it waits for, how it
/// starts, and which of them it must wait for (those that have not ended).
pub(super) struct Waits {
    pub(super) ids: Vec<JobId>,
    pub(super) start: Start,
    pending: Vec<JobId>,
}

/// Rules G1–G3 at the enqueue: resolves the batch's indexes with `earlier`, reads the
/// state of each dependency, and decides how the job starts. A dependency that does
/// not exist is refused, before anything is written.
pub(super) fn plan(
    conn: &Connection,
    ns: i64,
    dependencies: &[Dependency],
    earlier: &[JobId],
    policy: graph::DependencyFailure,
) -> Result<Waits> {
    let ids = graph::resolve(dependencies, earlier);
    let mut states = Vec::with_capacity(ids.len());
    for id in &ids {
        let state = job_state(conn, ns, *id)?
            .ok_or_else(|| Error::invalid("depends_on", format!("job {id} does not exist")))?;
        states.push((*id, state));
    }
    let start = graph::at_enqueue(states.iter().copied(), policy);
    let pending = states
        .iter()
        .filter(|(_, state)| !state.is_terminal())
        .map(|(id, _)| *id)
        .collect();
    Ok(Waits {
        ids,
        start,
        pending,
    })
}

/// Records that `dependent` waits for each job of `waits` that has not ended, and
/// flags those jobs, so their ending settles it.
pub(super) fn record_edges(
    conn: &Connection,
    ns: i64,
    dependent: JobId,
    waits: &Waits,
) -> Result<()> {
    if !matches!(waits.start, Start::Waiting(_)) {
        return Ok(());
    }
    let mut edge = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO jobq_dependencies (ns, dependency, dependent)
             VALUES (?1, ?2, ?3)",
        )
        .db("prepare the dependency insert")?;
    let mut flag = conn
        .prepare_cached(
            "UPDATE jobq_jobs SET has_dependents = 1
             WHERE ns = ?1 AND id = ?2 AND has_dependents IS NULL",
        )
        .db("prepare the dependents flag")?;
    for dependency in &waits.pending {
        edge.execute(params![ns, dependency.to_bytes(), dependent.to_bytes()])
            .db("record a dependency")?;
        flag.execute(params![ns, dependency.to_bytes()])
            .db("flag a job others wait for")?;
    }
    Ok(())
}

/// A job waiting for one that ended, as settling reads it: its row, its id, its state
/// code, how many jobs it still waits for, and its policy code.
type Waiting = (i64, [u8; 16], i64, Option<i64>, Option<i64>);

/// Rules G1, G3: job `id` of namespace `ns` ended in `state`; settles every job waiting
/// for it, and every job waiting for one this cancels, in turn (a worklist: a long
/// chain costs no stack). Runs in the transaction that ended the job.
pub(super) fn settle(
    tx: &WriteTx<'_>,
    ns: i64,
    id: JobId,
    state: JobState,
    now: Timestamp,
) -> Result<()> {
    let conn = tx.conn();
    let mut dependents = conn
        .prepare_cached(
            "SELECT j.job, j.id, j.state, j.waiting_for, j.dependency_policy
             FROM jobq_dependencies d JOIN jobq_jobs j ON j.ns = d.ns AND j.id = d.dependent
             WHERE d.ns = ?1 AND d.dependency = ?2",
        )
        .db("prepare the dependents read")?;
    let mut forget = conn
        .prepare_cached("DELETE FROM jobq_dependencies WHERE ns = ?1 AND dependency = ?2")
        .db("prepare the dependents delete")?;
    let mut count_down = conn
        .prepare_cached("UPDATE jobq_jobs SET waiting_for = waiting_for - 1 WHERE job = ?1")
        .db("prepare the dependency count")?;
    let mut release = conn
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = 0,
                     run_at = CASE WHEN run_at > ?2 THEN run_at ELSE ?2 END, seq = ?3,
                     waiting_for = NULL, ",
            events_stamp!("2"),
            " WHERE job = ?1"
        ))
        .db("prepare the release")?;
    let mut cancel = conn
        .prepare_cached(concat!(
            "UPDATE OR FAIL jobq_jobs SET state = 4, finished_at = ?2, last_error = ?3,
                     waiting_for = NULL, ",
            events_stamp!("2"),
            " WHERE job = ?1
                 RETURNING has_dependents"
        ))
        .db("prepare the cancellation")?;

    let mut ended = vec![(id, state)];
    while let Some((dependency, state)) = ended.pop() {
        let waiting: Vec<Waiting> = dependents
            .query_map(params![ns, dependency.to_bytes()], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            })
            .and_then(|rows| rows.collect())
            .db("read the jobs waiting for a job")?;
        forget
            .execute(params![ns, dependency.to_bytes()])
            .db("forget the settled dependencies")?;
        for (row, dependent, code, waiting_for, policy) in waiting {
            // An operator may have cancelled it already: it waits for nothing then.
            if code != WAITING {
                continue;
            }
            let policy = match policy {
                Some(1) => graph::DependencyFailure::Run,
                _ => graph::DependencyFailure::Cancel,
            };
            match graph::settle(state, policy) {
                Some(Settled::Met) if waiting_for.unwrap_or(1) <= 1 => {
                    release
                        .execute(params![row, now.as_millis(), tx.next_seq()?])
                        .db("release a waiting job")?;
                    tx.wake(ns);
                }
                Some(Settled::Met) => {
                    count_down.execute([row]).db("count a dependency met")?;
                }
                Some(Settled::Cancel) => {
                    let error = graph::failed_dependency(dependency, state);
                    let has_dependents: Option<i64> = cancel
                        .query_row(params![row, now.as_millis(), error], |found| found.get(0))
                        .db("cancel a waiting job")?;
                    tx.ended();
                    if has_dependents.is_some() {
                        let dependent = id_from_blob("dependent job", dependent)?;
                        ended.push((dependent, JobState::Cancelled));
                    }
                }
                None => {}
            }
        }
    }
    Ok(())
}
