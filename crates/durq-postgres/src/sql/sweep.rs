//! Housekeeping: reclaim (CONTRACT R1–R6), purge, and the planner statistics of the
//! jobs table.

/// The job table's pages at its last `ANALYZE` (0 before the first) and now
/// (`statistics::look`).
pub(super) const TABLE_SIZE: &str = "SELECT c.relpages::int8, \
     pg_relation_size(c.oid) / current_setting('block_size')::int8 \
     FROM pg_class c WHERE c.oid = '{schema}.jobs'::regclass";

/// New planner statistics for the job table, once it has outgrown its old ones
/// (`statistics::look`): its size, and the columns the hot path's plans are chosen
/// by, from a sample of 3,000 rows. A full `ANALYZE` (30,000 rows, every column)
/// took about a tenth of a 200,000-job batch enqueue's time across its five runs;
/// autovacuum's next one takes the full sample anyway.
pub(super) const ANALYZE_JOBS: &str = "BEGIN; \
     SET LOCAL default_statistics_target = 10; \
     ANALYZE {schema}.jobs (namespace, id, queue, state); \
     COMMIT";

/// Rules R1–R6. `$2` now, `$3` limit, `$4` the eviction text.
///
/// The selection walks `jobs_leases` from the oldest expiry, so its cost follows the
/// number of expired leases (R6); `SKIP LOCKED` and the re-check of the locked row
/// make concurrent reclaimers take each job once (R4). Each attempt is recorded as
/// expired, with the eviction text (H2), as [`FAIL`] records its own.
pub(super) const RECLAIM: &str = concat!(
    r#"
WITH expired AS (
    SELECT id AS expired_id FROM {schema}.jobs
    WHERE namespace = $1 AND lease_expires_at < $2 AND (state = 'running') IS TRUE
    ORDER BY lease_expires_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
ended AS (
UPDATE {schema}.jobs SET
    -- Mirrors durq_core::transition::after_lease_expired.
    -- R3: cancel requested → cancelled (first, so a job both cancel-requested and on
    -- its last attempt ends cancelled, as decided under R3); last attempt → dead; R1: else
    -- queued again.
    state = CASE WHEN cancel_requested THEN 'cancelled'
                 WHEN attempts >= max_attempts THEN 'dead'
                 ELSE 'queued' END,
    -- R1: a requeued job is ready now, behind the jobs already ready (a new seq).
    run_at = CASE WHEN NOT cancel_requested AND attempts < max_attempts THEN $2 ELSE run_at END,
    seq = CASE WHEN NOT cancel_requested AND attempts < max_attempts
               THEN nextval('{schema}.seq') ELSE seq END,
    -- R3 and CONTRACT §2 (every terminal state sets finished_at): cancelled and dead
    -- are terminal, a requeued job (R1) is not.
    finished_at = CASE WHEN NOT cancel_requested AND attempts < max_attempts
                       THEN NULL ELSE $2 END,
    last_error = $4, lease_expires_at = NULL
FROM expired
WHERE namespace = $1 AND id = expired.expired_id AND {relax}
RETURNING id, state, queue, lease_token, lease_worker, started_at
),"#,
    record_attempt!("$2", "expired", "$4"),
    "SELECT id, state, queue FROM ended
"
);

/// Rule A5: deletes up to `$3` terminal jobs finished at or before `$2` (the retention
/// cutoff) with their idempotency keys, their attempts (H4) and their steps (D1–D4),
/// and up to `$3` other keys created at or before `$4`.
///
/// Only inert keys go: a key stops deduplicating once its job is gone or its window
/// has passed (see [`ENQUEUE`]). `$4` is the retention cutoff less the dedup window;
/// the cutoff is at or before now, so a key that old is past its window. Keys whose
/// job was purged go with the job; keys left behind by a vanished or replaced job go
/// at that age.
///
/// The selections are materialized: run once, whatever the join plan. As a subquery
/// on the inner side of a nested loop, a `LIMIT … FOR UPDATE SKIP LOCKED` selection
/// would run again for each outer row and, skipping the rows this statement has
/// already deleted, return new ones each time: more than `$3` deletions. Every key
/// selection skips locked rows, so two purges never wait on each other's keys (a
/// key skipped now is deleted by age later).
pub(super) const PURGE: &str = r#"
WITH old_jobs AS MATERIALIZED (
    SELECT id AS gone_id FROM {schema}.jobs
    WHERE namespace = $1 AND finished_at <= $2
      AND (state IN ('succeeded', 'dead', 'cancelled')) IS TRUE
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}.jobs j USING old_jobs g
    WHERE j.namespace = $1 AND j.id = g.gone_id
    RETURNING j.id AS gone_id, j.tenant AS gone_tenant, j.idempotency_key AS gone_key
),
-- CONTRACT H4: a job's attempts go with it (a range of the attempts' primary key).
gone_attempts AS (
    DELETE FROM {schema}.attempts a USING gone
    WHERE a.namespace = $1 AND a.job = gone.gone_id
),
-- CONTRACT D1-D4: so do its steps (a range of the steps' primary key).
gone_steps AS (
    DELETE FROM {schema}.steps s USING gone
    WHERE s.namespace = $1 AND s.job = gone.gone_id
),
own_keys AS MATERIALIZED (
    SELECT d.tenant AS t, d.key AS k FROM {schema}.dedup d
    JOIN gone ON d.namespace = $1 AND d.tenant = gone.gone_tenant
             AND d.key = gone.gone_key AND d.job_id = gone.gone_id
    FOR UPDATE OF d SKIP LOCKED
),
old_keys AS MATERIALIZED (
    -- Keys past the window; a key unique while active (E10) holds however old it is,
    -- until its job is purged (own_keys) or the key is taken over.
    SELECT tenant AS t, key AS k FROM {schema}.dedup
    WHERE namespace = $1 AND created_at <= $4 AND NOT while_active
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
keys AS (
    DELETE FROM {schema}.dedup d
    USING (SELECT t, k FROM own_keys UNION SELECT t, k FROM old_keys) x
    WHERE d.namespace = $1 AND d.tenant = x.t AND d.key = x.k
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS jobs, (SELECT count(*) FROM keys) AS keys
WHERE {relax}
"#;
