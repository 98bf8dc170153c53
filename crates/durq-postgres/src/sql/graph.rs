//! Jobs that wait for jobs (CONTRACT G1–G5): the statements of an enqueue that names
//! dependencies. What ends a job settles its dependents in the `settle_dependents`
//! trigger of migration 12, not here.

/// The state of each stored job in `$2`, with its row locked, so a dependency cannot
/// end between this read and the commit of the edges recorded on it (G5). `$1`
/// namespace. Ordered by id, so enqueues locking the same jobs take their locks in one
/// order.
///
/// `FOR NO KEY UPDATE`, not `FOR SHARE`, though the read only needs the job not to
/// end: the enqueue then flags the job (`has_dependents`, [`RECORD_EDGES`]), and two
/// enqueues holding share locks on one job would each wait for the other to flag it
/// (the conformance scenario of G5 met exactly that deadlock). Enqueues of jobs that
/// wait for one job take turns on its row instead.
pub(super) const LOCK_DEPENDENCIES: &str = r#"
SELECT id, state FROM {schema}.jobs
WHERE namespace = $1 AND id = ANY($2::uuid[])
ORDER BY id
FOR NO KEY UPDATE
"#;

/// A job as its dependencies start it (G1, G3): `$1` namespace, `$2` id, `$3` state,
/// `$4` the ids it waits for, `$5` the policy (1 for `run`, NULL for cancel), `$6`
/// how many it waits for (NULL unless waiting), `$7` finished_at and `$8` last_error
/// (NULL unless cancelled at once).
pub(super) const START_DEPENDENT: &str = r#"
UPDATE {schema}.jobs SET
    state = $3, depends_on = $4::uuid[], dependency_policy = $5, waiting_for = $6,
    finished_at = $7, last_error = $8
WHERE namespace = $1 AND id = $2
"#;

/// Records that job `$2` waits for each job of `$3` and flags them, so the trigger of
/// their ending settles it. `$1` namespace.
pub(super) const RECORD_EDGES: &str = r#"
WITH edges AS (
    INSERT INTO {schema}.dependencies (namespace, dependency, dependent)
    SELECT $1, dependency, $2 FROM unnest($3::uuid[]) AS d(dependency)
    ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET has_dependents = true
WHERE namespace = $1 AND id = ANY($3::uuid[]) AND has_dependents IS NOT TRUE
"#;
