//! Every statement the store runs, as templates over the schema name.
//!
//! The schema is chosen at run time, so the text is rendered once per backend and
//! kept; sqlx prepares each text once per connection and reuses the plan. Every
//! value is a bind parameter, and every time is the store's clock passed in as one
//! (CONTRACT §3): no statement calls `now()` to decide anything.
//!
//! Lookups of one job bind `namespace = $1 AND id = $2` and test the job's state (and
//! lease token) inside `( … ) IS TRUE`. The wrapper changes nothing for a row (the
//! columns are never NULL) but no index can serve it, so the only index matching the
//! statement is the primary key. A bare `state = 'running'` also matches
//! `jobs_listing` (which leads with `namespace` and holds `state`) and, before
//! migration 2, the partial lease index; the jobs table is rarely analyzed (a queue
//! table turns over faster than autovacuum's thresholds, and some servers run none),
//! so the planner, guessing that few jobs are running, picked a scan of every running
//! job in the namespace and every dead index entry left behind by finished ones, per
//! lookup, and a connection keeps that plan in its prepared statement. Reclaim and
//! purge wrap their state test the same way, so only their own index (ordered by
//! expiry or finish time) serves them.
//!
//! The statements of workers' calls (claim, heartbeat, complete, fail, release,
//! reclaim, purge, and a worker's own record: put, touch, delete and reap) hold `{relax}` in their `WHERE`: an always-true condition that,
//! when the workers' commits are relaxed (`Durability::DurableEnqueues`, the
//! default), turns `synchronous_commit` off for the statement's own transaction. It
//! is an uncorrelated scalar subquery, so Postgres runs it once per statement, as a
//! one-time filter evaluated before any row is read, whether or not a row matches;
//! the commit that ends the statement's implicit transaction then does not wait for
//! the WAL flush. Enqueue, cancel and retry do not hold it and commit as the server
//! is configured.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

/// The columns of a job as `get` shows it, in the order `row::job` reads them. The
/// placement is read as its text: sqlx decodes no `jsonb` into a `String`, and
/// durq-core decodes the text. The tags are stored as text already (migration 10).
macro_rules! job_columns {
    () => {
        "id, queue, tenant, idempotency_key, priority, run_at, seq, max_attempts, parent, \
         state, attempts, lease_worker, lease_token, lease_expires_at, created_at, \
         started_at, heartbeat_at, finished_at, last_error, result, cancel_requested, \
         timeout_ms, placement::text, tags, trace_context"
    };
}

/// What every claim statement ends with: it leases the rows of `cand` (running, one
/// more attempt and token, the lease) and returns them with their payloads.
macro_rules! lease_candidates {
    () => {
        concat!(
            "
UPDATE {schema}.jobs SET
    state = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
    lease_worker = $5, lease_expires_at = $6, started_at = $3, heartbeat_at = $3
FROM cand
WHERE namespace = $1 AND id = cand.cand_id AND {relax}
RETURNING ",
            job_columns!(),
            ", payload"
        )
    };
}

/// The per-queue probe's guard in the claim statements: `o.open` is false for a paused
/// queue `q.name` (CONTRACT Q1), one key lookup per queue.
macro_rules! open_queues {
    () => {
        "    CROSS JOIN LATERAL (
        SELECT NOT EXISTS (
            SELECT 1 FROM {schema}.paused_queues
            WHERE namespace = $1 AND queue = q.name
        ) AS open
    ) o
"
    };
}

/// The end of a statement that ends leases (`fail`, `release`, `reclaim`): `ended`,
/// the `UPDATE … RETURNING` of the jobs whose lease it ended (their id, last token,
/// worker and start, none of which the update changes), becomes one attempt record
/// each (CONTRACT H2), in the same statement, so the call costs no extra round trip
/// and the record commits with the change of state or not at all.
///
/// The record goes in slot `token % ATTEMPTS_KEPT` (`durq_core::attempts::slot`),
/// overwriting the attempt that many claims older (H3). A running row always has a
/// worker and a start; one edited by hand to lack them ends its lease as any other,
/// without a record.
macro_rules! record_attempt {
    ($ended_at:literal, $outcome:literal, $error:literal) => {
        concat!(
            "
recorded AS (
    INSERT INTO {schema}.attempts
        (namespace, job, slot, token, worker, started_at, ended_at, outcome, error)
    SELECT $1, ended.id, (ended.lease_token % {kept})::smallint, ended.lease_token,
           ended.lease_worker, ended.started_at, ",
            $ended_at,
            ", '",
            $outcome,
            "', ",
            $error,
            "
    FROM ended
    WHERE ended.lease_worker IS NOT NULL AND ended.started_at IS NOT NULL
    ON CONFLICT (namespace, job, slot) DO UPDATE SET
        token = excluded.token, worker = excluded.worker, started_at = excluded.started_at,
        ended_at = excluded.ended_at, outcome = excluded.outcome, error = excluded.error
)
"
        )
    };
}

/// Enqueues many jobs in one statement (CONTRACT E1–E10).
///
/// `$1` namespace, `$2` now, `$3..$11` the jobs as parallel arrays (id, queue, tenant,
/// key, payload, priority, run_at, max_attempts, parent), `$12` the dedup cutoff
/// (`now - window`: an entry created at or before it no longer deduplicates), `$13`
/// whole: when true, one unknown parent writes nothing at all (an `enqueue_batch`);
/// when false, only that job is refused (calls gathered from different callers).
/// Keys are distinct within one statement.
///
/// The statement comes in two shapes (see [`EnqueueStatements`]; jobs without a key
/// or a parent take [`INSERT`]): the plain one takes those thirteen parameters only,
/// and the full one takes the rarer fields as well
/// (`$14` timeout in milliseconds, NULL for none; `$15` whether the key is unique
/// while active, E10; `$16` the placement text, NULL for none, F1; `$17` the tags
/// text, NULL for none, E11; `$18` the trace context, NULL for none, E12).
///
/// Dedup is decided by the unique index of `dedup`: a new key inserts its row; a
/// known key takes the row lock and the `DO UPDATE` keeps the old job when it is
/// inside the window and still exists (or, for a key unique while active, when it is
/// queued or running), or points the key at the new job otherwise.
/// Either way `RETURNING` yields the job the key points to, so concurrent enqueues of
/// one key all learn the one winner. A job row is inserted only for input rows the
/// key now points to (or without a key).
const ENQUEUE: &str = r#"
WITH input AS MATERIALIZED (
    SELECT t.*, nextval('{schema}.seq') AS seq,
           (t.parent IS NULL OR EXISTS (SELECT 1 FROM {schema}.jobs p
                                        WHERE p.namespace = $1 AND p.id = t.parent)) AS parent_ok
    FROM unnest($3::uuid[], $4::text[], $5::bytea[], $6::bytea[], $7::bytea[],
                $8::int2[], $9::int8[], $10::int8[], $11::uuid[]{rare_arrays})
         WITH ORDINALITY AS t(id, queue, tenant, key, payload, priority, run_at,
                              max_attempts, parent{rare_names}, ord)
),
bad AS (
    SELECT count(*) FILTER (WHERE NOT parent_ok) AS n FROM input
),
ok AS (
    SELECT * FROM input
    WHERE parent_ok AND (NOT $13::bool OR (SELECT n FROM bad) = 0)
),
d AS (
    INSERT INTO {schema}.dedup AS d (namespace, tenant, key, job_id, created_at, while_active)
    SELECT $1, ok.tenant, ok.key, ok.id, $2, {while_active} FROM ok
    WHERE ok.key IS NOT NULL
    ORDER BY ok.tenant, ok.key
    -- The new job takes the key over when the key no longer holds, judged by the new
    -- enqueue's own rule: the window (E2, E5, E6) or the old job's activity (E10).
    ON CONFLICT (namespace, tenant, key) DO UPDATE SET
        (job_id, created_at, while_active) = (
            SELECT CASE WHEN over THEN excluded.job_id ELSE d.job_id END,
                   CASE WHEN over THEN excluded.created_at ELSE d.created_at END,
                   CASE WHEN over THEN excluded.while_active ELSE d.while_active END
            FROM (SELECT CASE WHEN excluded.while_active
                              THEN NOT {schema}.job_active(d.namespace, d.job_id)
                              ELSE d.created_at <= $12
                                   OR NOT {schema}.job_alive(d.namespace, d.job_id)
                         END AS over) taken
        )
    RETURNING d.tenant, d.key, d.job_id
),
j AS (
    INSERT INTO {schema}.jobs (namespace, id, queue, tenant, idempotency_key, priority,
                               run_at, seq, max_attempts, parent, state, created_at,
                               payload{rare_columns})
    SELECT $1, ok.id, ok.queue, ok.tenant, ok.key, ok.priority, ok.run_at, ok.seq,
           ok.max_attempts, ok.parent, 'queued', $2, ok.payload{rare_values}
    FROM ok
    WHERE ok.key IS NULL OR EXISTS (SELECT 1 FROM d WHERE d.job_id = ok.id)
    RETURNING id
)
SELECT input.ord, COALESCE(d.job_id, input.id) AS id, (j.id IS NOT NULL) AS created,
       input.parent_ok, (SELECT n FROM bad) AS bad_parents
FROM input
LEFT JOIN d ON d.tenant = input.tenant AND d.key = input.key
LEFT JOIN j ON j.id = input.id
ORDER BY input.ord
"#;

/// The job table's pages at its last `ANALYZE` (0 before the first) and now
/// (`statistics::look`).
const TABLE_SIZE: &str = "SELECT c.relpages::int8, \
     pg_relation_size(c.oid) / current_setting('block_size')::int8 \
     FROM pg_class c WHERE c.oid = '{schema}.jobs'::regclass";

/// New planner statistics for the job table, once it has outgrown its old ones
/// (`statistics::look`): its size, and the columns the hot path's plans are chosen
/// by, from a sample of 3,000 rows. A full `ANALYZE` (30,000 rows, every column)
/// took about a tenth of a 200,000-job batch enqueue's time across its five runs;
/// autovacuum's next one takes the full sample anyway.
const ANALYZE_JOBS: &str = "BEGIN; \
     SET LOCAL default_statistics_target = 10; \
     ANALYZE {schema}.jobs (namespace, id, queue, state); \
     COMMIT";

/// Enqueues jobs that name no idempotency key and no parent (CONTRACT E1, E9): every
/// one of them is a new row, so there is nothing to decide and nothing to answer but
/// the ids the store minted. One `INSERT`, no `RETURNING`: against [`ENQUEUE`], it
/// skips the materialized input, the dedup upsert and the join back, and sends no row
/// back per job.
///
/// `$1` namespace, `$2` now, `$3..$9` the jobs as parallel arrays (id, queue, tenant,
/// payload, priority, run_at, max_attempts); in the full shape, `$10..$13` the rarer
/// fields (timeout in milliseconds, placement text, tags text, trace context, NULL for
/// none). `nextval` runs in the arrays' order, as in [`ENQUEUE`], so the claim order of
/// a batch is its order (C3).
const INSERT: &str = r#"
INSERT INTO {schema}.jobs (namespace, id, queue, tenant, priority, run_at, seq,
                           max_attempts, state, created_at, payload{rare_columns})
SELECT $1, t.id, t.queue, t.tenant, t.priority, t.run_at, nextval('{schema}.seq'),
       t.max_attempts, 'queued', $2, t.payload{rare_values}
FROM unnest($3::uuid[], $4::text[], $5::bytea[], $6::bytea[], $7::int2[], $8::int8[],
            $9::int8[]{rare_arrays})
     AS t(id, queue, tenant, payload, priority, run_at, max_attempts{rare_names})
"#;

/// The shapes of the enqueue statement.
///
/// Most jobs name no key and no parent, and most carry none of the rarer fields. The
/// server's cost per statement grows with its parameters and expressions even when
/// they hold NULLs: five more arrays cost about a tenth more server time per job in the
/// benchmark's one-at-a-time enqueue. So a statement takes the leanest shape that
/// stores all of its jobs' fields, and stores them exactly as the fullest shape would
/// (NULLs, and a key judged by its window).
#[derive(Debug)]
pub(crate) struct EnqueueStatements {
    /// [`INSERT`] for jobs with no key and no parent, and none of the rarer fields.
    pub(crate) insert_plain: Text,
    /// [`INSERT`] with the rarer fields: timeout, placement, tags, trace context.
    pub(crate) insert_full: Text,
    /// [`ENQUEUE`] with thirteen parameters: keys and parents, and none of the rarer
    /// fields (nor a key unique while active).
    pub(crate) checked_plain: Text,
    /// [`ENQUEUE`] with eighteen parameters: every field.
    pub(crate) checked_full: Text,
}

impl EnqueueStatements {
    fn render(r: &impl Fn(&str) -> Text) -> Self {
        let shape = |template: &str, rare: [&str; 5]| {
            let [arrays, names, while_active, columns, values] = rare;
            r(&template
                .replace("{rare_arrays}", arrays)
                .replace("{rare_names}", names)
                .replace("{while_active}", while_active)
                .replace("{rare_columns}", columns)
                .replace("{rare_values}", values))
        };
        let plain = ["", "", "false", "", ""];
        EnqueueStatements {
            insert_plain: shape(INSERT, plain),
            insert_full: shape(
                INSERT,
                [
                    ", $10::int8[], $11::text[], $12::text[], $13::text[]",
                    ", timeout_ms, placement, tags, trace_context",
                    "",
                    ", timeout_ms, placement, tags, trace_context",
                    ", t.timeout_ms, t.placement::jsonb, t.tags, t.trace_context",
                ],
            ),
            checked_plain: shape(ENQUEUE, plain),
            checked_full: shape(
                ENQUEUE,
                [
                    ", $14::int8[], $15::bool[], $16::text[], $17::text[], $18::text[]",
                    ", timeout_ms, while_active, placement, tags, trace_context",
                    "ok.while_active",
                    ", timeout_ms, placement, tags, trace_context",
                    ", ok.timeout_ms, ok.placement::jsonb, ok.tags, ok.trace_context",
                ],
            ),
        }
    }

    /// Every shape, for the tests of the rendered text.
    #[cfg(test)]
    pub(crate) fn all(&self) -> [&Text; 4] {
        [
            &self.insert_plain,
            &self.insert_full,
            &self.checked_plain,
            &self.checked_full,
        ]
    }
}

/// Claims up to `$4` ready jobs of queues `$2` (distinct names) (CONTRACT C1–C9).
///
/// `$1` namespace, `$3` now, `$5` worker, `$6` lease expiry. For each queue, the inner
/// selection walks that queue's range of the partial index `jobs_ready` in claim order
/// (C3) and locks its first `$4` ready rows, skipping rows another claimer holds; the
/// outer one merges the queues and keeps the first `$4` overall, so the order spans
/// every queue and is applied before the limit. (A single `queue = ANY($2)` scan
/// cannot use the index order: it reads every ready row of the queues and sorts.)
/// Rows locked but not kept are free again when the statement ends. The update
/// leases the kept rows; `RETURNING` has no order, so the caller sorts.
///
/// `{fit}` is empty in the plain claim. A claim with a budget and nothing else
/// (CONTRACT F2–F4) fills it with [`FIT`], with the budget as `$7`: each probe then
/// tests the rows it walks and locks only the first `$4` that fit, so the cut still
/// comes after the filter and the order, and a job that does not fit is never locked
/// or written.
const CLAIM: &str = concat!(
    r#"
WITH cand AS (
    SELECT c.cand_id
    FROM unnest($2::text[]) AS q(name)
"#,
    open_queues!(),
    r#"    CROSS JOIN LATERAL (
        SELECT id AS cand_id, priority AS p, run_at AS r, seq AS s FROM {schema}.jobs
        WHERE o.open AND namespace = $1 AND queue = q.name AND state = 'queued'
          AND run_at <= $3{fit}
        ORDER BY priority DESC, run_at, seq
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.p DESC, c.r, c.s
    LIMIT $4
)
"#,
    lease_candidates!()
);

/// The admission test of a fitted claim (CONTRACT F2, F3), `$7` the budget
/// (`Budget::to_json`, NULL for none): the migration's `budget_admits` path, built by
/// an uncorrelated subquery, so once per statement rather than per row. A job without
/// a placement needs nothing and fits every budget without the test.
const FIT: &str = "
          AND (placement IS NULL OR placement @@ (SELECT {schema}.budget_admits($7::jsonb)))";

/// A claim preferring localities (CONTRACT F5), with or without a budget: up to `$4`
/// ready jobs of queues `$2` that pass [`FIT`], in the order of `durq_core::FitOrder`
/// (priority, then preferred locality, then ready time and sequence).
///
/// `$1` to `$7` as in [`CLAIM`] with [`FIT`]; `$8` the preferred localities (distinct,
/// at least one). No index walks the fitted order, so the statement gathers a set
/// sure to hold the answer, then sorts it.
///
/// `fitting` is the budgeted claim's probe: per queue, the first `$4` jobs that fit, in
/// claim order. A preferred job may overtake only jobs of its own priority, so only at
/// the lowest priority a probe reached, and only when the probe came back full
/// (otherwise it holds every job of the queue that fits): `edge` is that priority and
/// the `k` jobs the probe took at it, and `local` adds, per preferred locality, the
/// first `k` that fit at that priority and locality (`jobs_ready_locality`). The
/// queue's first `$4` in fitted order are then all there: the jobs above the edge
/// priority, and at it the first `k` in fitted order, whose preferred ones are each
/// among the first `k` of their locality and whose others among the first `k` of the
/// probe. `cand` sorts the union over every queue and keeps `$4`, so the cut comes
/// after the filter and the order (F4, F5); a job found twice is one row (`UNION`).
///
/// Every probe locks only rows that fit, skipping rows other claimers hold; rows
/// locked but not kept are free again when the statement ends. The probes are
/// materialized, so each runs once whatever the join plan (see [`PURGE`]).
const CLAIM_PREFERRING: &str = concat!(
    r#"
WITH fitting AS MATERIALIZED (
    SELECT q.name AS queue, c.*
    FROM unnest($2::text[]) AS q(name)
"#,
    open_queues!(),
    r#"    CROSS JOIN LATERAL (
        SELECT id AS cand_id, priority AS p, run_at AS r, seq AS s, placement ->> 'l' AS l
        FROM {schema}.jobs
        WHERE o.open AND namespace = $1 AND queue = q.name AND state = 'queued'
          AND run_at <= $3{fit}
        ORDER BY priority DESC, run_at, seq
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ) c
),
edge AS (
    SELECT f.queue, f.p, count(*) AS k
    FROM fitting f
    JOIN (
        SELECT queue, min(p) AS p FROM fitting
        GROUP BY queue
        HAVING count(*) = $4
    ) lowest ON lowest.queue = f.queue AND lowest.p = f.p
    GROUP BY f.queue, f.p
),
local AS MATERIALIZED (
    SELECT e.queue, c.*
    FROM edge e
    CROSS JOIN unnest($8::text[]) AS pl(locality)
    CROSS JOIN LATERAL (
        SELECT id AS cand_id, priority AS p, run_at AS r, seq AS s, placement ->> 'l' AS l
        FROM {schema}.jobs
        WHERE namespace = $1 AND queue = e.queue AND state = 'queued'
          AND placement ? 'l' AND placement ->> 'l' = pl.locality AND priority = e.p
          AND run_at <= $3{fit}
        ORDER BY run_at, seq
        LIMIT e.k
        FOR UPDATE SKIP LOCKED
    ) c
),
cand AS (
    SELECT c.cand_id
    FROM (SELECT * FROM fitting UNION SELECT * FROM local) c
    ORDER BY c.p DESC, (c.l = ANY($8::text[])) IS TRUE DESC, c.r, c.s
    LIMIT $4
)
"#,
    lease_candidates!()
);

/// A claim of one reserved job (CONTRACT F6): job `$4`, if it is ready in one of the
/// unpaused queues `$2` and passes [`FIT`] (`$7` the budget).
///
/// `$1`, `$3`, `$5`, `$6` as in [`CLAIM`]. The tests sit inside `( … ) IS TRUE` (see
/// the module documentation), so only the primary key serves the lookup: a reservation
/// costs one row whatever the queues hold.
const CLAIM_RESERVED: &str = concat!(
    r#"
WITH cand AS MATERIALIZED (
    SELECT id AS cand_id
    FROM {schema}.jobs
    WHERE namespace = $1 AND id = $4
      AND (state = 'queued' AND run_at <= $3 AND queue = ANY($2::text[])) IS TRUE
      -- CONTRACT Q1: nothing from a paused queue.
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.paused_queues p
          WHERE p.namespace = $1 AND p.queue = jobs.queue
      ){fit}
    FOR UPDATE SKIP LOCKED
)
"#,
    lease_candidates!()
);

/// Whether a job exists: tells "not found" from "lease lost" after a missed update.
const EXISTS: &str = "SELECT state FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

const GET: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {schema}.jobs WHERE namespace = $1 AND id = $2"
);

const PAYLOAD: &str = "SELECT payload FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

const CHILDREN: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {schema}.jobs WHERE namespace = $1 AND parent = $2 ORDER BY id"
);

/// Rules H1–H4: the job's own record of its last claim (state, worker, token, start,
/// finish) and its stored attempts, one row per attempt (the attempt columns NULL when
/// it has none), none when the job does not exist. One statement, so one snapshot:
/// the records and the job agree (`durq_core::attempts::history` joins them). Both
/// lookups are primary-key ranges.
const ATTEMPTS: &str = r#"
SELECT j.state, j.lease_worker, j.lease_token, j.started_at, j.finished_at,
       a.token, a.worker, a.started_at, a.ended_at, a.outcome, a.error
FROM {schema}.jobs j
LEFT JOIN {schema}.attempts a ON a.namespace = $1 AND a.job = $2
WHERE j.namespace = $1 AND j.id = $2
"#;

/// Rule L1. `$3` token, `$4` new expiry, `$5` now.
const HEARTBEAT: &str = r#"
UPDATE {schema}.jobs SET lease_expires_at = $4, heartbeat_at = $5
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING cancel_requested
"#;

/// Rules L4, L5 for many jobs at once: `$2` ids, `$3` tokens, `$4` results, `$5` now.
///
/// Each input row reports whether it completed its job and, when it did not, whether
/// the job exists at all (lease lost versus not found). An id appears at most once
/// per batch; the batcher holds a second call for the same id back for the next one.
///
/// `{again}` is `false` in the statement sent first. When its connection broke, the
/// store cannot know whether it committed, and sends it again with `{again}` =
/// [`COMPLETED_BEFORE`]: a job found succeeded with this token, this result and this
/// very `finished_at` (the first run's `$5`, reused) was completed by the first run,
/// and is answered as completed, not as a lost lease (L5 is about a second call).
const COMPLETE: &str = r#"
WITH input AS (
    SELECT * FROM unnest($2::uuid[], $3::int8[], $4::bytea[]) AS t(id, token, result)
),
done AS (
    -- `lease_worker` stays: with `lease_token`, `started_at` and `finished_at` it is
    -- the attempt that succeeded (CONTRACT H4), which nothing else records. An earlier
    -- attempt's error is in the attempt history, not on a succeeded job (L4).
    UPDATE {schema}.jobs j SET
        state = 'succeeded', result = input.result, finished_at = $5,
        lease_expires_at = NULL, last_error = NULL
    FROM input
    -- `j.id = ANY($2)` repeats the join as an index condition: the scan of `jobs` then
    -- reads the batch's rows only, whatever the planner believes of the table's size.
    -- Joined on `input.id` alone, a namespace whose statistics lag its growth (any new
    -- one) was hash-joined against every row of the namespace, per batch.
    WHERE j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id
      AND (j.state = 'running' AND j.lease_token = input.token) IS TRUE
    RETURNING j.id
)
SELECT input.id, (done.id IS NOT NULL OR {again}) AS completed,
       CASE WHEN done.id IS NOT NULL THEN true
            ELSE EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = input.id)
       END AS found
FROM input LEFT JOIN done ON done.id = input.id
WHERE {relax}
"#;

/// `{again}` in [`COMPLETE`] when it is sent a second time: this entry's job was
/// completed by the first run.
const COMPLETED_BEFORE: &str = "EXISTS (SELECT 1 FROM {schema}.jobs y \
     WHERE y.namespace = $1 AND y.id = input.id \
       AND (y.state = 'succeeded' AND y.lease_token = input.token AND y.finished_at = $5 \
            AND y.result IS NOT DISTINCT FROM input.result) IS TRUE)";

/// Rules L4, L5 and T3 (CONTRACT §7) for one job, inside the caller's transaction:
/// `$2` id, `$3` token, `$4` result, `$5` now.
///
/// The `UPDATE` holds the job's row until the caller's transaction ends, so no reclaim
/// takes the job back in between. When it matched no row, `fence` raises (migration
/// 8), which aborts the caller's transaction: its own writes cannot commit beside a
/// completion that did not happen. No `{relax}`: the caller's transaction keeps its
/// own `synchronous_commit`.
const COMPLETE_IN: &str = r#"
WITH done AS (
    -- `lease_worker` stays, as in [`COMPLETE`]: it names the attempt that succeeded.
    UPDATE {schema}.jobs j SET
        state = 'succeeded', result = $4, finished_at = $5,
        lease_expires_at = NULL, last_error = NULL
    WHERE j.namespace = $1 AND j.id = $2
      AND (j.state = 'running' AND j.lease_token = $3) IS TRUE
    RETURNING j.id
)
SELECT {schema}.fence(
    EXISTS (SELECT 1 FROM done),
    EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = $2),
    $2)
"#;

/// Rule L1 for many leases at once: `$2` ids, `$3` tokens (parallel, sorted by id),
/// `$4` the new expiry, `$5` now.
///
/// One row per input row, with its position: whether its lease was extended (and
/// then whether cancellation was requested) and, when it was not, whether the job
/// exists at all (lease lost versus not found, L2, L3). The join back is on id and
/// token, so of two entries for one job only the one holding its lease is extended;
/// an entry repeated whole is answered twice alike. Running it twice sets the same
/// expiry twice, so a broken connection's statement is simply sent again.
const HEARTBEAT_BATCH: &str = r#"
WITH input AS (
    SELECT * FROM unnest($2::uuid[], $3::int8[]) WITH ORDINALITY AS t(id, token, ord)
),
beat AS (
    UPDATE {schema}.jobs j SET lease_expires_at = $4, heartbeat_at = $5
    FROM input
    -- The batch's ids as an index condition, as in `COMPLETE`.
    WHERE j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id
      AND (j.state = 'running' AND j.lease_token = input.token) IS TRUE
    RETURNING j.id, j.lease_token, j.cancel_requested
)
SELECT input.ord, (beat.id IS NOT NULL) AS extended,
       COALESCE(beat.cancel_requested, false) AS cancel_requested,
       CASE WHEN beat.id IS NOT NULL THEN true
            ELSE EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = input.id)
       END AS found
FROM input LEFT JOIN beat ON beat.id = input.id AND beat.lease_token = input.token
WHERE {relax}
"#;

/// Rules L6, L7, H2 and the cancel-while-running decision.
///
/// `$3` token, `$4` retry time (NULL: never), `$5` now, `$6` error text, `$7` how many
/// of its bytes the attempt's record keeps (H2: 4 KiB, cut on a character boundary by
/// the caller, which knows the text is UTF-8; bytea's `substring` counts bytes). Every `SET`
/// expression reads the row as it was, so the requeue test is repeated rather than
/// stored: cancel requested wins, then a retry with attempts left, else dead. The
/// attempt is recorded as failed, with the error, whatever the new state
/// (`record_attempt!`). `lease_worker` is left as it was: the record reads it back
/// from `RETURNING`, which shows the row as updated, and a non-running job's lease
/// reads as none whatever the column holds.
const FAIL: &str = concat!(
    r#"
WITH ended AS (
UPDATE {schema}.jobs SET
    -- Mirrors durq_core::transition::after_failure (attempts counts the one ending).
    -- CONTRACT A1 (cancel while running): a cancel-requested job that fails ends
    -- cancelled, never requeued; L6: a retry time with attempts left requeues it;
    -- L7: the last attempt, or no retry, is dead.
    state = CASE WHEN cancel_requested THEN 'cancelled'
                 WHEN $4::int8 IS NOT NULL AND attempts < max_attempts THEN 'queued'
                 ELSE 'dead' END,
    -- L6: requeued at the retry time, behind the jobs already ready then (C3).
    run_at = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
                  THEN $4::int8 ELSE run_at END,
    seq = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
               THEN nextval('{schema}.seq') ELSE seq END,
    -- CONTRACT §2 (every terminal state sets finished_at, A5): cancelled and dead
    -- (L7) are terminal; a requeued job (L6) is not.
    finished_at = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
                       THEN NULL ELSE $5 END,
    last_error = $6, lease_expires_at = NULL
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING id, state, lease_token, lease_worker, started_at
),"#,
    record_attempt!("$5", "failed", "substring($6 FROM 1 FOR $7::int4)"),
    "SELECT state FROM ended
"
);

/// Rules L8, L10: back to `queued`, ready at `$5` (now for a release, later for a
/// snooze), behind the ready jobs, the attempt taken back and `last_error` untouched;
/// `cancelled` instead when cancellation was requested, with the attempt still counted
/// (decided under A1). `$3` token, `$4` now, `$5` ready time. The attempt is recorded
/// as released either way (H2), as [`FAIL`] records its own.
const RELEASE: &str = concat!(
    r#"
WITH ended AS (
UPDATE {schema}.jobs SET
    -- Mirrors durq_core::transition::after_release.
    -- CONTRACT A1 (cancel while running): a cancel-requested job that is released
    -- ends cancelled; otherwise L8: queued again.
    state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
    -- L8 takes the attempt back only from a job that goes back to queued (A1).
    attempts = CASE WHEN cancel_requested THEN attempts ELSE GREATEST(attempts - 1, 0) END,
    -- L8, L10: ready at $5, behind the jobs already ready (C3); a cancelled job keeps
    -- its run_at.
    run_at = CASE WHEN cancel_requested THEN run_at ELSE $5 END,
    seq = CASE WHEN cancel_requested THEN seq ELSE nextval('{schema}.seq') END,
    -- CONTRACT §2 (every terminal state sets finished_at): only the cancelled end.
    finished_at = CASE WHEN cancel_requested THEN $4 ELSE NULL END,
    lease_expires_at = NULL
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING id, state, queue, lease_token, lease_worker, started_at
),"#,
    record_attempt!("$4", "released", "NULL::bytea"),
    "SELECT state, queue FROM ended
"
);

/// Rules R1–R6. `$2` now, `$3` limit, `$4` the eviction text.
///
/// The selection walks `jobs_leases` from the oldest expiry, so its cost follows the
/// number of expired leases (R6); `SKIP LOCKED` and the re-check of the locked row
/// make concurrent reclaimers take each job once (R4). Each attempt is recorded as
/// expired, with the eviction text (H2), as [`FAIL`] records its own.
const RECLAIM: &str = concat!(
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

/// Rule A1 on a queued or running job. `$3` now.
const CANCEL: &str = r#"
UPDATE {schema}.jobs SET
    -- A1: a queued job is cancelled at once; a running one only gets
    -- cancel_requested (its holder, or reclaim, ends it).
    state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
    finished_at = CASE WHEN state = 'queued' THEN $3 ELSE finished_at END,
    cancel_requested = cancel_requested OR state = 'running'
WHERE namespace = $1 AND id = $2 AND (state IN ('queued', 'running')) IS TRUE
RETURNING state
"#;

/// Rule A2. `$3` now. The job starts over: no error, start or heartbeat of a past
/// run is left on it (they are in its attempt history).
const RETRY: &str = r#"
UPDATE {schema}.jobs SET
    state = 'queued', run_at = $3, seq = nextval('{schema}.seq'), attempts = 0,
    cancel_requested = false, finished_at = NULL, result = NULL,
    lease_worker = NULL, lease_expires_at = NULL, started_at = NULL,
    heartbeat_at = NULL, last_error = NULL
WHERE namespace = $1 AND id = $2 AND (state IN ('dead', 'cancelled')) IS TRUE
RETURNING queue
"#;

/// Sends wake-up notices, one per `$2` payload, on channel `$1`.
///
/// Its own transaction, never the one that wrote the jobs: a transaction that
/// notifies holds a database-wide lock from its commit until the commit is flushed,
/// so notifying inside every enqueue would serialize all enqueues on the disk flush.
/// A notice promises nothing durable, so this transaction does not wait for the
/// flush (`synchronous_commit` off, for this transaction only) and holds that lock
/// for microseconds.
const NOTIFY: &str = "SELECT set_config('synchronous_commit', 'off', true), \
     count(pg_notify($1, payload)) FROM unnest($2::text[]) AS p(payload)";

/// Sends wake-up notices, one per `$2` payload, on channel `$1`, inside the caller's
/// transaction (CONTRACT §7, T2): PostgreSQL delivers them when it commits, and never
/// when it rolls back. Unlike [`NOTIFY`] it leaves `synchronous_commit` alone, since
/// the transaction holds the caller's own writes.
const NOTIFY_IN: &str =
    "SELECT count(pg_notify($1, payload)) FROM unnest($2::text[]) AS p(payload)";

/// Rule A3: counts per state, queued split by `run_at <= $3`, from `jobs_listing`.
const STATS: &str = r#"
SELECT state, count(*) FILTER (WHERE run_at <= $3) AS due, count(*) AS total
FROM {schema}.jobs WHERE namespace = $1 AND queue = $2
GROUP BY state
"#;

/// Rule A7: per queue and state of namespace `$1`, the counts as [`STATS`] gives them
/// and, of the ready jobs (`run_at <= $2`), the earliest ready time; by queue name.
/// One pass over the namespace's rows of the `jobs_listing` index's leading columns.
const QUEUES: &str = r#"
SELECT queue, state, count(*) FILTER (WHERE run_at <= $2) AS due, count(*) AS total,
       min(run_at) FILTER (WHERE state = 'queued' AND run_at <= $2) AS oldest
FROM {schema}.jobs WHERE namespace = $1
GROUP BY queue, state
ORDER BY queue
"#;

/// The filters of `list` every walk applies to the rows it reaches (CONTRACT A4):
/// the tenant (`$tenant`, NULL for every tenant) and the tags (`$tags`, the filter's
/// JSON object, NULL for none), all of which a job's tags must contain (`@>`, whole
/// keys and whole values). Neither has an index (nothing on the hot path needs one,
/// and every enqueue would pay for it), so a selective one makes the walk read past
/// the rows it leaves out. A row whose stored tags do not read as JSON passes the tag
/// filter (`tags_json` is NULL, migration 10), so its decoding reports it `Corrupt`.
macro_rules! list_filters {
    ($tenant:literal, $tags:literal) => {
        concat!(
            "
      AND (",
            $tenant,
            "::bytea IS NULL OR tenant = ",
            $tenant,
            ")
      AND (",
            $tags,
            "::jsonb IS NULL
           OR (tags IS NOT NULL AND ({schema}.tags_json(tags) @> ",
            $tags,
            "::jsonb) IS NOT FALSE))"
        )
    };
}

/// Rule A4 for one queue: one page, newest first. `$2` the queue, `$3` the states to
/// list (every state when the query names none), `$4` the exclusive cursor (the
/// largest uuid for the first page), `$5` the page size, `$6` and `$7` the
/// `list_filters!`, `$8` the lowest id the page may hold (NULL: none; see
/// `PostgresStore::list` for the bound on the rows one filtered page examines). One range of `jobs_listing` (namespace, queue, state, id) per
/// state, walked newest first and cut at `$5` matches, then merged: a page costs its
/// size (and the rows the filters leave out), not its depth.
const LIST_QUEUE: &str = concat!(
    "SELECT ",
    "{columns}",
    r#" FROM unnest($3::text[]) AS s(st),
LATERAL (
    SELECT "#,
    "{columns}",
    r#" FROM {schema}.jobs
    WHERE namespace = $1 AND queue = $2 AND state = s.st AND id < $4
      AND id >= COALESCE($8::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$6", "$7"),
    r#"
    ORDER BY id DESC
    LIMIT $5
) page
ORDER BY id DESC
LIMIT $5
"#
);

/// Rule A4 across queues, for a query naming states or a queue prefix but no queue:
/// [`LIST_QUEUE`]'s walk for every queue of the namespace whose name starts with `$2`
/// (NULL: every queue), merged. `$3` to `$8` as in [`LIST_QUEUE`].
///
/// The namespace's queues come from a skip scan of `jobs_listing`: each step one
/// descent to the next queue name, so their number, not the jobs', sets its cost. The
/// prefix is compared with `starts_with`, byte for byte (no pattern, so `_` and `%`
/// are themselves), on each name found: index order follows the database's collation,
/// in which the names sharing a prefix need not be adjacent, so no range of it is
/// taken for the prefix. Per queue and state the walk stops at `$5` matches, so a page
/// reads at most queues × states × `$5` rows however deep it is.
const LIST_QUEUES: &str = concat!(
    r#"
WITH RECURSIVE queues(name) AS (
    SELECT min(queue) FROM {schema}.jobs WHERE namespace = $1
    UNION ALL
    SELECT (SELECT min(queue) FROM {schema}.jobs WHERE namespace = $1 AND queue > q.name)
    FROM queues q
    WHERE q.name IS NOT NULL
)
SELECT "#,
    "{columns}",
    r#" FROM queues q
CROSS JOIN unnest($3::text[]) AS s(st),
LATERAL (
    SELECT "#,
    "{columns}",
    r#" FROM {schema}.jobs
    WHERE namespace = $1 AND queue = q.name AND state = s.st AND id < $4
      AND id >= COALESCE($8::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$6", "$7"),
    r#"
    ORDER BY id DESC
    LIMIT $5
) page
WHERE q.name IS NOT NULL AND ($2::text IS NULL OR starts_with(q.name, $2::text))
ORDER BY id DESC
LIMIT $5
"#
);

/// Rule A4 over every job of the namespace (no queue, prefix or state named): the
/// primary key (namespace, id) walked newest first from the exclusive cursor `$2`,
/// `$3` the page size, `$4` and `$5` the `list_filters!`, `$6` the lowest id the page
/// may hold (NULL: none), as in [`LIST_QUEUE`]. Without filters a page reads its own
/// rows and no more.
const LIST_ALL: &str = concat!(
    "SELECT ",
    "{columns}",
    r#" FROM {schema}.jobs
WHERE namespace = $1 AND id < $2
  AND id >= COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$4", "$5"),
    r#"
ORDER BY id DESC
LIMIT $3
"#
);

/// Rule A5: deletes up to `$3` terminal jobs finished at or before `$2` (the retention
/// cutoff) with their idempotency keys and their attempts (H4), and up to `$3` other
/// keys created at or before `$4`.
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
const PURGE: &str = r#"
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

/// CONTRACT C10: a job its claim leased but could not decode goes to `dead` with the
/// reason, if that claim's lease (`$3`) still holds it. `$1` namespace, `$2` id, `$4`
/// now, `$5` error text.
const BURY: &str = r#"
UPDATE {schema}.jobs SET state = 'dead', lease_expires_at = NULL, finished_at = $4,
    last_error = $5
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
"#;

/// Deletes a job row behind the store's back, as a lost record would (test harnesses).
const VANISH: &str = "DELETE FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

/// Rule Q1: `$1` namespace, `$2` queue.
const PAUSE: &str = r#"
INSERT INTO {schema}.paused_queues (namespace, queue) VALUES ($1, $2)
ON CONFLICT DO NOTHING
"#;

/// Rule Q1: `$1` namespace, `$2` queue. Returns a row when the queue was paused.
const RESUME: &str = r#"
DELETE FROM {schema}.paused_queues WHERE namespace = $1 AND queue = $2
RETURNING queue
"#;

/// Rule S1: `$1` namespace, `$2` name, `$3` spec, `$4` now. A known schedule keeps
/// whether it is enabled and its last tick.
const PUT_SCHEDULE: &str = r#"
INSERT INTO {schema}.schedules (namespace, name, spec, enabled, last_tick)
VALUES ($1, $2, $3, true, $4)
ON CONFLICT (namespace, name) DO UPDATE SET spec = excluded.spec
"#;

/// Rule S1: every schedule of namespace `$1`, by name.
const SCHEDULES: &str = r#"
SELECT name, spec, enabled, last_tick FROM {schema}.schedules
WHERE namespace = $1 ORDER BY name
"#;

/// Rule S2: `$3` enabled or NULL (unchanged), `$4` a last tick or NULL; the last tick
/// only moves forward. Returns a row when the schedule exists.
const UPDATE_SCHEDULE: &str = r#"
UPDATE {schema}.schedules SET
    enabled = COALESCE($3, enabled),
    last_tick = GREATEST(last_tick, COALESCE($4, last_tick))
WHERE namespace = $1 AND name = $2
RETURNING 1
"#;

/// Rule S1. Returns a row when the schedule existed.
const DELETE_SCHEDULE: &str = r#"
DELETE FROM {schema}.schedules WHERE namespace = $1 AND name = $2
RETURNING 1
"#;

/// Rule Q1: the namespace's paused queues, by name.
const PAUSED_QUEUES: &str = r#"
SELECT queue FROM {schema}.paused_queues WHERE namespace = $1 ORDER BY queue
"#;

/// Rule W1: `$1` namespace, `$2` id, `$3` spec, `$4` now, `$5` in flight. Stores the
/// worker whole, `last_seen` now, replacing a record of that id.
const PUT_WORKER: &str = r#"
INSERT INTO {schema}.workers (namespace, id, spec, in_flight, last_seen)
SELECT $1, $2, $3, $5, $4
WHERE {relax}
ON CONFLICT (namespace, id) DO UPDATE SET
    spec = excluded.spec, in_flight = excluded.in_flight, last_seen = excluded.last_seen
"#;

/// Rule W2: `$1` namespace, `$2` id, `$3` in flight, `$4` now. Returns a row when the
/// worker is registered; creates none.
const TOUCH_WORKER: &str = r#"
UPDATE {schema}.workers SET in_flight = $3, last_seen = $4
WHERE namespace = $1 AND id = $2 AND {relax}
RETURNING 1
"#;

/// Rule W3: `$1` namespace, `$2` id. Returns a row when the worker existed.
const DELETE_WORKER: &str = r#"
DELETE FROM {schema}.workers WHERE namespace = $1 AND id = $2 AND {relax}
RETURNING 1
"#;

/// Rule W1: every worker of namespace `$1`, by id in byte order (`COLLATE "C"`, as
/// Rust sorts strings, whatever the database's collation).
const WORKERS: &str = r#"
SELECT id, spec, in_flight, last_seen FROM {schema}.workers
WHERE namespace = $1 ORDER BY id COLLATE "C"
"#;

/// Rule W4: `$1` namespace, `$2` cutoff. Deletes the workers last seen strictly before
/// the cutoff (through `workers_seen`) and returns their ids (unordered: the store
/// sorts them).
const REAP_WORKERS: &str = r#"
DELETE FROM {schema}.workers WHERE namespace = $1 AND last_seen < $2 AND {relax}
RETURNING id
"#;

/// Deletes every row of namespace `$1`, jobs, attempts, keys, pauses, schedules and
/// workers, in one transaction; returns how many jobs it deleted.
const DROP_NAMESPACE: &str = r#"
WITH keys AS (
    DELETE FROM {schema}.dedup WHERE namespace = $1
),
attempts AS (
    DELETE FROM {schema}.attempts WHERE namespace = $1
),
paused AS (
    DELETE FROM {schema}.paused_queues WHERE namespace = $1
),
schedules AS (
    DELETE FROM {schema}.schedules WHERE namespace = $1
),
workers AS (
    DELETE FROM {schema}.workers WHERE namespace = $1
),
gone AS (
    DELETE FROM {schema}.jobs WHERE namespace = $1
    RETURNING 1
)
SELECT count(*) FROM gone
"#;

/// A statement's text, rendered for one schema.
#[derive(Debug, Clone)]
pub(crate) struct Text(Arc<str>);

/// `{relax}` for relaxed workers' commits: `synchronous_commit` off until the
/// end of the current transaction (the statement's own, when it runs alone).
const RELAX: &str = "(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL";

/// `{relax}` otherwise (`Durability::Full`): the server's setting stands.
const NO_RELAX: &str = "true";

impl Text {
    fn render(template: &str, schema: &str, relax: &str, again: &str) -> Self {
        Text(Arc::from(
            template
                .replace("{fit}", FIT)
                .replace("{again}", again)
                .replace("{schema}", schema)
                .replace("{relax}", relax)
                .replace("{kept}", &durq_core::ATTEMPTS_KEPT.to_string()),
        ))
    }

    /// The text as sqlx takes it. The schema name was validated and quoted, and every
    /// value is a bind parameter, so the text is safe.
    pub(crate) fn sql(&self) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(&self.0))
    }
}

/// Every statement, rendered for one schema.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) enqueue: EnqueueStatements,
    pub(crate) claim: Text,
    /// [`CLAIM`] with [`FIT`]: a claim with a budget and nothing else.
    pub(crate) claim_budgeted: Text,
    pub(crate) claim_preferring: Text,
    pub(crate) claim_reserved: Text,
    pub(crate) exists: Text,
    pub(crate) get: Text,
    pub(crate) payload: Text,
    pub(crate) children: Text,
    pub(crate) attempts: Text,
    pub(crate) heartbeat: Text,
    pub(crate) heartbeat_batch: Text,
    pub(crate) complete: Text,
    /// `complete` sent again after its connection broke (see [`COMPLETE`]).
    pub(crate) complete_again: Text,
    /// [`COMPLETE_IN`]: one fenced completion in the caller's transaction.
    pub(crate) complete_in: Text,
    pub(crate) fail: Text,
    pub(crate) release: Text,
    pub(crate) reclaim: Text,
    pub(crate) cancel: Text,
    pub(crate) retry: Text,
    pub(crate) stats: Text,
    pub(crate) queues: Text,
    pub(crate) pause: Text,
    pub(crate) resume: Text,
    pub(crate) paused_queues: Text,
    pub(crate) put_schedule: Text,
    pub(crate) schedules: Text,
    pub(crate) update_schedule: Text,
    pub(crate) delete_schedule: Text,
    pub(crate) put_worker: Text,
    pub(crate) touch_worker: Text,
    pub(crate) delete_worker: Text,
    pub(crate) workers: Text,
    pub(crate) reap_workers: Text,
    /// The `list` statements, returning whole jobs.
    pub(crate) list: ListStatements,
    /// The same walks returning ids only: what bounds the rows a filtered page
    /// examines (see `PostgresStore::list`).
    pub(crate) list_ids: ListStatements,
    pub(crate) purge: Text,
    pub(crate) bury: Text,
    pub(crate) vanish: Text,
    pub(crate) drop_namespace: Text,
    pub(crate) notify: Text,
    /// [`NOTIFY_IN`]: notices sent inside the caller's transaction.
    pub(crate) notify_in: Text,
    /// [`TABLE_SIZE`].
    pub(crate) table_size: Text,
    /// [`ANALYZE_JOBS`].
    pub(crate) analyze_jobs: Text,
}

/// The three statements of `list` (CONTRACT A4), one per shape of query, each
/// selecting `{columns}`.
#[derive(Debug)]
pub(crate) struct ListStatements {
    /// [`LIST_QUEUE`]: a page of one queue.
    pub(crate) queue: Text,
    /// [`LIST_QUEUES`]: a page across the queues, by state or queue prefix.
    pub(crate) queues: Text,
    /// [`LIST_ALL`]: a page of every job.
    pub(crate) all: Text,
}

impl ListStatements {
    fn render(columns: &str, r: &impl Fn(&str) -> Text) -> Self {
        let with = |template: &str| r(&template.replace("{columns}", columns));
        ListStatements {
            queue: with(LIST_QUEUE),
            queues: with(LIST_QUEUES),
            all: with(LIST_ALL),
        }
    }
}

impl Statements {
    /// Renders every statement for `quoted_schema` (already a quoted identifier);
    /// with `relax_workers`, the workers' statements commit without waiting for the
    /// WAL flush.
    pub(crate) fn new(quoted_schema: &str, relax_workers: bool) -> Self {
        let relax = if relax_workers { RELAX } else { NO_RELAX };
        let r = |template: &str| Text::render(template, quoted_schema, relax, "false");
        Statements {
            enqueue: EnqueueStatements::render(&r),
            claim: r(&CLAIM.replace("{fit}", "")),
            claim_budgeted: r(CLAIM),
            claim_preferring: r(CLAIM_PREFERRING),
            claim_reserved: r(CLAIM_RESERVED),
            exists: r(EXISTS),
            get: r(GET),
            payload: r(PAYLOAD),
            children: r(CHILDREN),
            attempts: r(ATTEMPTS),
            heartbeat: r(HEARTBEAT),
            heartbeat_batch: r(HEARTBEAT_BATCH),
            complete: r(COMPLETE),
            complete_again: Text::render(COMPLETE, quoted_schema, relax, COMPLETED_BEFORE),
            complete_in: r(COMPLETE_IN),
            fail: r(FAIL),
            release: r(RELEASE),
            reclaim: r(RECLAIM),
            cancel: r(CANCEL),
            retry: r(RETRY),
            stats: r(STATS),
            queues: r(QUEUES),
            pause: r(PAUSE),
            resume: r(RESUME),
            paused_queues: r(PAUSED_QUEUES),
            put_schedule: r(PUT_SCHEDULE),
            schedules: r(SCHEDULES),
            update_schedule: r(UPDATE_SCHEDULE),
            delete_schedule: r(DELETE_SCHEDULE),
            put_worker: r(PUT_WORKER),
            touch_worker: r(TOUCH_WORKER),
            delete_worker: r(DELETE_WORKER),
            workers: r(WORKERS),
            reap_workers: r(REAP_WORKERS),
            list: ListStatements::render(job_columns!(), &r),
            list_ids: ListStatements::render("id", &r),
            purge: r(PURGE),
            bury: r(BURY),
            vanish: r(VANISH),
            drop_namespace: r(DROP_NAMESPACE),
            notify: r(NOTIFY),
            notify_in: r(NOTIFY_IN),
            table_size: r(TABLE_SIZE),
            analyze_jobs: r(ANALYZE_JOBS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What runs in the caller's transaction must leave its `synchronous_commit`
    /// alone: relaxing it there would relax the caller's own writes.
    #[test]
    fn statements_in_the_callers_transaction_never_relax_its_commit() {
        for relaxed in [true, false] {
            let sql = Statements::new("\"jobs\"", relaxed);
            for text in sql
                .enqueue
                .all()
                .into_iter()
                .chain([&sql.complete_in, &sql.notify_in])
            {
                assert!(!text.0.contains("set_config"), "{}", text.0);
                assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
            }
        }
    }

    /// CONTRACT H4, decided: the hot path (enqueue, claim, heartbeat, complete) writes
    /// no attempt and completions keep the worker; each call that ends a lease
    /// otherwise records its attempt in its own statement, in its slot.
    /// The batched lease calls name their ids as an index condition of the scan of
    /// `jobs`, not only as a join: joined alone, a namespace whose statistics lagged its
    /// growth read every one of its rows per batch (PostgreSQL's counters in the
    /// benchmark: 141 rows read through `jobs_pkey` per completed job).
    #[test]
    fn batched_lease_calls_scan_their_ids_only() {
        let sql = Statements::new("\"jobs\"", true);
        for batched in [&sql.complete, &sql.complete_again, &sql.heartbeat_batch] {
            assert!(
                batched
                    .0
                    .contains("j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id"),
                "{}",
                batched.0
            );
        }
    }

    #[test]
    fn only_leases_ending_off_the_hot_path_write_attempts() {
        let sql = Statements::new("\"jobs\"", true);
        for hot in [
            &sql.enqueue.insert_plain,
            &sql.enqueue.insert_full,
            &sql.enqueue.checked_plain,
            &sql.enqueue.checked_full,
            &sql.claim,
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
            &sql.heartbeat,
            &sql.heartbeat_batch,
            &sql.complete,
            &sql.complete_again,
            &sql.complete_in,
        ] {
            assert!(!hot.0.contains("\"jobs\".attempts"), "{}", hot.0);
            assert!(!hot.0.contains("lease_worker = NULL"), "{}", hot.0);
        }
        for ending in [&sql.fail, &sql.release, &sql.reclaim] {
            assert!(
                ending.0.contains("INSERT INTO \"jobs\".attempts"),
                "{}",
                ending.0
            );
            let slot = format!("% {})::smallint", durq_core::ATTEMPTS_KEPT);
            assert!(ending.0.contains(&slot), "{}", ending.0);
        }
        for text in [
            &sql.attempts,
            &sql.fail,
            &sql.release,
            &sql.reclaim,
            &sql.list.queue,
            &sql.list.queues,
            &sql.list.all,
            &sql.list_ids.queue,
            &sql.list_ids.queues,
            &sql.list_ids.all,
            &sql.purge,
            &sql.drop_namespace,
        ] {
            assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
        }
    }

    #[test]
    fn only_fitted_claims_test_a_budget() {
        let sql = Statements::new("\"jobs\"", true);
        assert!(!sql.claim.0.contains("placement @@"), "{}", sql.claim.0);
        for fitted in [
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
        ] {
            assert!(
                fitted
                    .0
                    .contains("placement @@ (SELECT \"jobs\".budget_admits($7::jsonb))"),
                "{}",
                fitted.0
            );
        }
        for claim in [
            &sql.claim,
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
        ] {
            assert!(!claim.0.contains('{'), "a placeholder is left: {}", claim.0);
        }
    }
}
