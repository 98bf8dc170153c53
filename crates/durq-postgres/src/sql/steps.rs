//! Durable steps (CONTRACT D1–D4): a running job's saves, the read of a job's steps,
//! and the reopen of an ended job from one of them (migration 14).

use super::*;

/// Rule D2: the job's generation and its steps, in the order they were saved (`seq`),
/// in one statement, so one snapshot: one row per step, the step's columns NULL when
/// the job has none, no row when the job does not exist. `$1` namespace, `$2` id. Both
/// lookups are primary-key ranges; a job holds at most `MAX_STEPS` steps, so the sort
/// is of that many rows at most.
const STEPS: &str = r#"
SELECT COALESCE(j.generation, 0), s.name, s.output, s.saved_at
FROM {schema}.jobs j
LEFT JOIN {schema}.steps s ON s.namespace = $1 AND s.job = $2
WHERE j.namespace = $1 AND j.id = $2
ORDER BY s.seq
"#;

/// Rule D1 in one statement: saves `$5` as step `$4` of job `$2` if token `$3` holds
/// its lease. `$1` namespace, `$6` now, `$7` the most steps a job may hold
/// (`durq_core::steps::MAX_STEPS`).
///
/// One row: `held` (the token holds the lease), `fits` (`step_fits`, migration 14: the
/// step was saved already, or there is room for it) and `found` (the job exists), from
/// which the store answers `Ok`, `LeaseLost`, `NotFound` or too many steps. A step
/// saved already is kept by `ON CONFLICT DO NOTHING`: the first save stands.
///
/// The job's row is locked (`FOR NO KEY UPDATE`, the lock its own `UPDATE`s take), so
/// the lease cannot end while the step is written: a completion, failure or reclaim,
/// and so a reopen after it (D3), comes entirely before the save, which then finds the
/// lease gone (a lock that waited reads the row's new version), or entirely after it.
/// Without the lock, a save whose test passed could write its step after the job ended
/// and was reopened, into the next generation. Saves of one job take turns on it, and
/// `step_fits` reads with a fresh snapshot, so each one counts the steps of those
/// before it. The row itself is not written: a save changes nothing a reader of the
/// job sees (D2).
///
/// No `{relax}`, though a worker sends it: a step is saved so that it never runs again
/// (D2), which a save lost to a server crash would break; it commits as the server is
/// configured, as an enqueue does.
const SAVE_STEP: &str = r#"
WITH held AS MATERIALIZED (
    SELECT id AS held_id FROM {schema}.jobs
    WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
    FOR NO KEY UPDATE
),
room AS MATERIALIZED (
    SELECT held_id, {schema}.step_fits($1, held_id, $4, $7) AS fits FROM held
),
saved AS (
    INSERT INTO {schema}.steps (namespace, job, name, output, saved_at)
    SELECT $1, held_id, $4, $5, $6 FROM room WHERE fits
    ON CONFLICT (namespace, job, name) DO NOTHING
)
SELECT EXISTS (SELECT 1 FROM room) AS held,
       COALESCE((SELECT fits FROM room), false) AS fits,
       EXISTS (SELECT 1 FROM {schema}.jobs WHERE namespace = $1 AND id = $2) AS found
"#;

/// Rule D3, first statement of the reopen's transaction: locks job `$2`'s row and
/// reads its state and generation. `$1` namespace. `FOR UPDATE` returns the row's
/// latest version, so of concurrent reopens the ones that waited for the winner see
/// its change (queued, the next generation) and are refused (D4).
const LOCK_FOR_REOPEN: &str = r#"
SELECT state, COALESCE(generation, 0) FROM {schema}.jobs
WHERE namespace = $1 AND id = $2
FOR UPDATE
"#;

/// Rule D3, second statement, once [`LOCK_FOR_REOPEN`] found the job ended and at the
/// generation named: deletes step `$4` and every step saved after it, moves the
/// generation up by one and queues the job as [`RETRY`] does (`start_over!`), ready
/// at `$3`. `$1` namespace, `$2` id. Returns the job's queue, to announce; no row when
/// the job has no step `$4` (the transaction is then rolled back).
///
/// A succeeded job's last attempt is its own row's lease columns (H4, decided), which
/// the requeue clears: it is recorded in `attempts` first (`record_attempt!`, its slot
/// as any attempt's), so the reopen keeps the job's history, as a retry keeps a dead
/// or cancelled job's, whose last attempt was recorded when it ended. A job that
/// succeeded under an older build kept no worker and records nothing, as
/// `attempts::history` shows nothing for it.
///
/// A statement of its own, after the lock, so its snapshot is taken once the row is
/// held: it sees every step saved before the job ended, and no save comes after (a
/// save needs the job running, under the same lock). One statement with the lock
/// would read the steps in a snapshot from before a wait for the lock, and could keep
/// steps it should delete.
const REOPEN: &str = concat!(
    r#"
WITH cut AS MATERIALIZED (
    SELECT seq AS cut_seq FROM {schema}.steps
    WHERE namespace = $1 AND job = $2 AND name = $4
),
ended AS MATERIALIZED (
    SELECT id, lease_token, lease_worker, started_at, finished_at FROM {schema}.jobs
    WHERE namespace = $1 AND id = $2
      AND (state = 'succeeded' AND lease_token > 0 AND finished_at IS NOT NULL) IS TRUE
      AND EXISTS (SELECT 1 FROM cut)
),"#,
    record_attempt!("ended.finished_at", "succeeded", "NULL"),
    r#",
cut_steps AS (
    DELETE FROM {schema}.steps s USING cut
    WHERE s.namespace = $1 AND s.job = $2 AND s.seq >= cut.cut_seq
)
UPDATE {schema}.jobs SET
    "#,
    start_over!("$3"),
    r#",
    generation = COALESCE(generation, 0) + 1
WHERE namespace = $1 AND id = $2 AND EXISTS (SELECT 1 FROM cut)
RETURNING queue
"#
);

/// The statements of durable steps, rendered for one schema.
#[derive(Debug)]
pub(crate) struct StepStatements {
    /// [`STEPS`].
    pub(crate) steps: Text,
    /// [`SAVE_STEP`].
    pub(crate) save: Text,
    /// [`LOCK_FOR_REOPEN`].
    pub(crate) lock_for_reopen: Text,
    /// [`REOPEN`].
    pub(crate) reopen: Text,
}

impl StepStatements {
    pub(super) fn render(r: &impl Fn(&str) -> Text) -> Self {
        StepStatements {
            steps: r(STEPS),
            save: r(SAVE_STEP),
            lock_for_reopen: r(LOCK_FOR_REOPEN),
            reopen: r(REOPEN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// D3: a reopen queues the job exactly as an operator's retry (A2) does.
    #[test]
    fn a_reopen_queues_the_job_as_a_retry_does() {
        let start = start_over!("$3");
        assert!(RETRY.contains(start), "{RETRY}");
        assert!(REOPEN.contains(start), "{REOPEN}");
    }

    #[test]
    fn every_step_statement_is_rendered_whole() {
        for relaxed in [true, false] {
            let sql = Statements::new("\"jobs\"", relaxed);
            let steps = &sql.steps;
            for text in [
                &steps.steps,
                &steps.save,
                &steps.lock_for_reopen,
                &steps.reopen,
            ] {
                assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
                // A saved step must outlive a server crash (see `SAVE_STEP`).
                assert!(!text.0.contains("set_config"), "{}", text.0);
            }
        }
    }
}
