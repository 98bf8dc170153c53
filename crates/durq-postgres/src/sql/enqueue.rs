//! Enqueue (CONTRACT E1–E12): the statement shapes of `EnqueueStatements`, and the
//! notices that wake claimers.

use super::*;

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
/// text, NULL for none, E11; `$18` the trace context, NULL for none, E12; `$19` the
/// concurrency key's bytes, NULL for none, K1).
///
/// Dedup is decided by the unique index of `dedup`: a new key inserts its row; a
/// known key takes the row lock and the `DO UPDATE` keeps the old job when it is
/// inside the window and still exists (or, for a key unique while active, when it is
/// queued or running), or points the key at the new job otherwise.
/// Either way `RETURNING` yields the job the key points to, so concurrent enqueues of
/// one key all learn the one winner. A job row is inserted only for input rows the
/// key now points to (or without a key).
pub(super) const ENQUEUE: &str = r#"
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
                               payload{rare_columns}{mark_column})
    SELECT $1, ok.id, ok.queue, ok.tenant, ok.key, ok.priority, ok.run_at, ok.seq,
           ok.max_attempts, ok.parent, 'queued', $2, ok.payload{rare_values}{mark_value}
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

/// Enqueues jobs that name no idempotency key and no parent (CONTRACT E1, E9): every
/// one of them is a new row, so there is nothing to decide and nothing to answer but
/// the ids the store minted. One `INSERT`, no `RETURNING`: against [`ENQUEUE`], it
/// skips the materialized input, the dedup upsert and the join back, and sends no row
/// back per job.
///
/// `$1` namespace, `$2` now, `$3..$9` the jobs as parallel arrays (id, queue, tenant,
/// payload, priority, run_at, max_attempts); in the full shape, `$10..$14` the rarer
/// fields (timeout in milliseconds, placement text, tags text, trace context,
/// concurrency key, NULL for none). `nextval` runs in the arrays' order, as in [`ENQUEUE`], so the claim order of
/// a batch is its order (C3).
pub(super) const INSERT: &str = r#"
INSERT INTO {schema}.jobs (namespace, id, queue, tenant, priority, run_at, seq,
                           max_attempts, state, created_at, payload{rare_columns}{mark_column})
SELECT $1, t.id, t.queue, t.tenant, t.priority, t.run_at, nextval('{schema}.seq'),
       t.max_attempts, 'queued', $2, t.payload{rare_values}{mark_value}
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
///
/// The shapes are rendered twice (see `Statements::enqueue_for`): as they always were,
/// for a store that does not record events, and with the job's event mark
/// (`records_events = true`, a constant, no parameter; migration 15) for one that
/// does (CONTRACT V1). A store that does not record sends the very text it sent before
/// the event stream existed: no parameter, no expression, no byte more per row.
#[derive(Debug)]
pub(crate) struct EnqueueStatements {
    /// [`INSERT`] for jobs with no key and no parent, and none of the rarer fields.
    pub(crate) insert_plain: Text,
    /// [`INSERT`] with the rarer fields: timeout, placement, tags, trace context,
    /// concurrency key.
    pub(crate) insert_full: Text,
    /// [`ENQUEUE`] with thirteen parameters: keys and parents, and none of the rarer
    /// fields (nor a key unique while active).
    pub(crate) checked_plain: Text,
    /// [`ENQUEUE`] with eighteen parameters: every field.
    pub(crate) checked_full: Text,
}

/// The column of the event mark, for the shapes of a store that records events.
const MARK_COLUMN: &str = ", records_events";

/// Its value: the job records its events (CONTRACT V1).
const MARK_VALUE: &str = ", true";

impl EnqueueStatements {
    /// The shapes, with the event mark when `records_events`.
    pub(super) fn render(r: &impl Fn(&str) -> Text, records_events: bool) -> Self {
        let (mark_column, mark_value) = if records_events {
            (MARK_COLUMN, MARK_VALUE)
        } else {
            ("", "")
        };
        let shape = |template: &str, rare: [&str; 5]| {
            let [arrays, names, while_active, columns, values] = rare;
            r(&template
                .replace("{rare_arrays}", arrays)
                .replace("{rare_names}", names)
                .replace("{while_active}", while_active)
                .replace("{rare_columns}", columns)
                .replace("{rare_values}", values)
                .replace("{mark_column}", mark_column)
                .replace("{mark_value}", mark_value))
        };
        let plain = ["", "", "false", "", ""];
        EnqueueStatements {
            insert_plain: shape(INSERT, plain),
            insert_full: shape(
                INSERT,
                [
                    ", $10::int8[], $11::text[], $12::text[], $13::text[], $14::bytea[]",
                    ", timeout_ms, placement, tags, trace_context, concurrency_key",
                    "",
                    ", timeout_ms, placement, tags, trace_context, concurrency_key",
                    ", t.timeout_ms, t.placement::jsonb, t.tags, t.trace_context, \
                     t.concurrency_key",
                ],
            ),
            checked_plain: shape(ENQUEUE, plain),
            checked_full: shape(
                ENQUEUE,
                [
                    ", $14::int8[], $15::bool[], $16::text[], $17::text[], $18::text[], \
                     $19::bytea[]",
                    ", timeout_ms, while_active, placement, tags, trace_context, \
                     concurrency_key",
                    "ok.while_active",
                    ", timeout_ms, placement, tags, trace_context, concurrency_key",
                    ", ok.timeout_ms, ok.placement::jsonb, ok.tags, ok.trace_context, \
                     ok.concurrency_key",
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

/// Sends wake-up notices, one per `$2` payload, on channel `$1`.
///
/// Its own transaction, never the one that wrote the jobs: a transaction that
/// notifies holds a database-wide lock from its commit until the commit is flushed,
/// so notifying inside every enqueue would serialize all enqueues on the disk flush.
/// A notice promises nothing durable, so this transaction does not wait for the
/// flush (`synchronous_commit` off, for this transaction only) and holds that lock
/// for microseconds.
pub(super) const NOTIFY: &str = "SELECT set_config('synchronous_commit', 'off', true), \
     count(pg_notify($1, payload)) FROM unnest($2::text[]) AS p(payload)";

/// Sends wake-up notices, one per `$2` payload, on channel `$1`, inside the caller's
/// transaction (CONTRACT §7, T2): PostgreSQL delivers them when it commits, and never
/// when it rolls back. Unlike [`NOTIFY`] it leaves `synchronous_commit` alone, since
/// the transaction holds the caller's own writes.
pub(super) const NOTIFY_IN: &str =
    "SELECT count(pg_notify($1, payload)) FROM unnest($2::text[]) AS p(payload)";
