//! Claim (CONTRACT C1–C10, F1–F6, Q1): plain, budgeted, preferring and reserved claims,
//! and the burial of a row a claim could not decode.

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
///
/// `{queues}` is [`EVERY_QUEUE`] and `{probe_limit}` is `$4`, except in the plain
/// claim of one queue with a small limit (see [`ONE_QUEUE`]).
pub(super) const CLAIM: &str = concat!(
    r#"
WITH cand AS (
    SELECT c.cand_id
    FROM {queues}
"#,
    open_queues!(),
    r#"    CROSS JOIN LATERAL (
        SELECT id AS cand_id, priority AS p, run_at AS r, seq AS s FROM {schema}.jobs
        WHERE o.open AND namespace = $1 AND queue = q.name AND state = 'queued'
          AND run_at <= $3{fit}
        ORDER BY priority DESC, run_at, seq
        LIMIT {probe_limit}
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.p DESC, c.r, c.s
    LIMIT $4
)
"#,
    lease_candidates!()
);

/// `{queues}` in [`CLAIM`]: each queue of `$2`.
pub(super) const EVERY_QUEUE: &str = "unnest($2::text[]) AS q(name)";

/// `{queues}` in [`CLAIM`] for a claim of one queue: the one element of `$2`, as a
/// row the planner knows to be one.
///
/// With it, and the limit `$4` written into the probe as `{probe_limit}`, the server
/// plans the claim once per connection instead of at every run. A prepared statement
/// gets the plan made once for any parameters (the generic plan) only when that plan
/// is estimated no dearer than those made for the actual ones, and the generic plan
/// must guess what a parameter stands for: `unnest` of an array parameter as ten
/// queues, a `LIMIT $4` as a tenth of the table. With both guesses, every claim was
/// planned again, which cost as much as running it (0.4 ms of a 0.85 ms claim of 8
/// jobs, by `EXPLAIN ANALYZE`). With neither, the generic plan is the custom one and
/// the server keeps it after five runs (`pg_prepared_statements`). The outer
/// `LIMIT $4` stays a parameter, so every rendering binds the same parameters.
pub(super) const ONE_QUEUE: &str = "(SELECT ($2::text[])[1] AS name) AS q";

/// How many limits have a plain one-queue claim of their own ([`ONE_QUEUE`]): every
/// limit a worker of up to 32 jobs at once asks for, and no more, so that with the
/// other statements they fit in sqlx's cache of 100 prepared statements per
/// connection.
pub(super) const LIMITS_WRITTEN_OUT: usize = 32;

/// The admission test of a fitted claim (CONTRACT F2, F3), `$7` the budget
/// (`Budget::to_json`, NULL for none): the migration's `budget_admits` path, built by
/// an uncorrelated subquery, so once per statement rather than per row. A job without
/// a placement needs nothing and fits every budget without the test.
pub(super) const FIT: &str = "
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
pub(super) const CLAIM_PREFERRING: &str = concat!(
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
pub(super) const CLAIM_RESERVED: &str = concat!(
    r#"
WITH cand AS MATERIALIZED (
    SELECT id AS cand_id
    FROM {schema}.jobs
    WHERE namespace = $1 AND id = $4
      AND (state = 'queued' AND run_at <= $3 AND queue = ANY($2::text[])) IS TRUE
      -- CONTRACT Q1: nothing from a paused queue; K1-K5: a limited one counts.
      AND ("#,
    controls!("jobs.queue"),
    r#"){fit}
    FOR UPDATE SKIP LOCKED
)
"#,
    lease_candidates!()
);

/// CONTRACT C10: a job its claim leased but could not decode goes to `dead` with the
/// reason, if that claim's lease (`$3`) still holds it. `$1` namespace, `$2` id, `$4`
/// now, `$5` error text.
pub(super) const BURY: &str = r#"
UPDATE {schema}.jobs SET state = 'dead', lease_expires_at = NULL, finished_at = $4,
    last_error = $5
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
"#;
