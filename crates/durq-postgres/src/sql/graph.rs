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

/// The jobs of a batch as their dependencies start them (G1, G3), all in one
/// statement: per job, `$2` its id, `$3` its state, `$4` the ids it waits for, joined
/// by commas (a ragged array cannot be unnested), `$5` the policy (1 for `run`, NULL
/// for cancel), `$6` how many it waits for (NULL unless waiting), `$7` finished_at and
/// `$8` last_error (NULL unless cancelled at once). `$1` namespace.
pub(super) const START_DEPENDENTS: &str = r#"
UPDATE {schema}.jobs AS j SET
    state = s.state, depends_on = string_to_array(s.depends_on, ',')::uuid[],
    dependency_policy = s.policy, waiting_for = s.waiting_for,
    finished_at = s.finished_at, last_error = s.last_error
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::smallint[], $6::integer[],
            $7::bigint[], $8::bytea[])
    AS s(id, state, depends_on, policy, waiting_for, finished_at, last_error)
WHERE j.namespace = $1 AND j.id = s.id
"#;

/// Records each edge `$2[i]` → `$3[i]` (job `$3[i]` waits for job `$2[i]`) and flags
/// the jobs waited for, so the trigger of their ending settles the jobs waiting. `$1`
/// namespace. One statement for a whole batch.
pub(super) const RECORD_EDGES: &str = r#"
WITH edges AS (
    INSERT INTO {schema}.dependencies (namespace, dependency, dependent)
    SELECT $1, dependency, dependent FROM unnest($2::uuid[], $3::uuid[]) AS d(dependency, dependent)
    ON CONFLICT DO NOTHING
)
UPDATE {schema}.jobs SET has_dependents = true
WHERE namespace = $1 AND id = ANY($2::uuid[]) AND has_dependents IS NOT TRUE
"#;
