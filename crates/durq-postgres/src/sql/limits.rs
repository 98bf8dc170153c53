//! Flow control (CONTRACT K1–K5): each queue's limits, the claim of queues that have
//! some, the start log of their rates and the turns of their fair shares.
//!
//! A plain claim never runs these: its statements take nothing from a queue with
//! limits (see `open_queues!`), and the claim of such a queue is a transaction of
//! several statements under the queue's advisory lock (`store::limits`).

use super::*;

/// The columns of a limits row, in the order `store::limits::limits_from` reads them.
macro_rules! limits_columns {
    () => {
        "max_running, max_running_per_key, max_starts, max_starts_ms, max_starts_per_key, \
         max_starts_per_key_ms, fair_shares"
    };
}

/// Every queue's limits, by name. `$1` namespace.
const LIMITS: &str = concat!(
    "SELECT queue, ",
    limits_columns!(),
    " FROM {schema}.queue_controls WHERE namespace = $1 AND limited ORDER BY queue"
);

/// The limits of queues `$2`, by name. `$1` namespace.
const LIMITS_OF: &str = concat!(
    "SELECT queue, ",
    limits_columns!(),
    " FROM {schema}.queue_controls WHERE namespace = $1 AND queue = ANY($2::text[]) AND limited \
     ORDER BY queue"
);

/// What a limited claim reads once it holds its queues' locks, in one statement: each
/// named queue `$2` that is paused (Q1) or has limits, with its limits and, when they
/// limit running jobs, its running jobs (K1, K2: a range of `jobs_listing`). `$1`
/// namespace. Columns: queue, paused, limited, the limits as in `limits_columns!`,
/// running (NULL when not counted).
const CONTROLS_OF: &str = concat!(
    "SELECT c.queue, c.paused, c.limited, ",
    limits_columns!(),
    ", CASE WHEN c.limited AND (c.max_running IS NOT NULL OR c.max_running_per_key IS NOT NULL) \
     THEN (SELECT count(*) FROM {schema}.jobs j \
           WHERE j.namespace = $1 AND j.queue = c.queue AND j.state = 'running') END \
     FROM {schema}.queue_controls c \
     WHERE c.namespace = $1 AND c.queue = ANY($2::text[]) AND (c.limited OR c.paused) \
     ORDER BY c.queue"
);

/// Stores queue `$2`'s limits (K3), leaving its pause as it is. `$1` namespace,
/// `$3..$9` the limits as in `limits_columns!`.
const PUT_LIMITS: &str = concat!(
    "INSERT INTO {schema}.queue_controls (namespace, queue, ",
    limits_columns!(),
    r#")
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (namespace, queue) DO UPDATE SET
    max_running = excluded.max_running, max_running_per_key = excluded.max_running_per_key,
    max_starts = excluded.max_starts, max_starts_ms = excluded.max_starts_ms,
    max_starts_per_key = excluded.max_starts_per_key,
    max_starts_per_key_ms = excluded.max_starts_per_key_ms,
    fair_shares = excluded.fair_shares"#
);

/// Removes what queue `$2`'s new limits leave unused: its own start log when `$3` (no
/// queue rate reads it any more), its keys' start logs when `$6` (no key rate), its
/// turns when `$4` (no fair claim reads them), and when `$5` (no limits at all) the
/// limits themselves, with the queue's row unless it is paused. `$1` namespace. Each
/// rate taken away forgets its starts (CONTRACT K4).
const REMOVE_LIMITS: &str = r#"
WITH starts AS (
    DELETE FROM {schema}.queue_starts WHERE namespace = $1 AND queue = $2
        AND ((key = ''::bytea AND $3) OR (key <> ''::bytea AND $6))
),
turns AS (
    DELETE FROM {schema}.queue_turns WHERE namespace = $1 AND queue = $2 AND $4
),
gone AS (
    DELETE FROM {schema}.queue_controls WHERE namespace = $1 AND queue = $2 AND $5
        AND NOT paused
)
UPDATE {schema}.queue_controls SET max_running = NULL, max_running_per_key = NULL,
    max_starts = NULL, max_starts_ms = NULL, max_starts_per_key = NULL,
    max_starts_per_key_ms = NULL, fair_shares = false
WHERE namespace = $1 AND queue = $2 AND $5 AND paused
"#;

/// What `set_limits` waits for before it writes: every statement in flight that wrote
/// jobs, claims above all. A claim that started before the limits existed took its
/// jobs without counting; once it has committed, the next limited claim counts them
/// (K3: limits bind the claims that start after `set_limits` returned). `SHARE` lets
/// reads through and holds writers back only until this transaction commits.
const LOCK_JOBS: &str = "LOCK TABLE {schema}.jobs IN SHARE MODE";

/// Takes the advisory locks of queues `$2` of namespace `$1`, in one order (so two
/// claims of overlapping queues never wait for each other in a cycle), until the end
/// of the transaction: claims of one limited queue run one at a time, so each counts
/// what the one before it leased. `$3` the schema's lock class.
///
/// It also turns explicit sorts off for the rest of the transaction. Each statement of
/// a limited claim reads an index in the order it asks for, but with statistics older
/// than a burst of enqueues (a table that looks empty) the server would rather read
/// `jobs_ready` and sort, which walks a whole priority band per key: a fair claim over
/// a key with 100,000 jobs took a second so. Without sorts, the index that gives the
/// order is the only cheap plan, whatever the statistics say.
const LOCK_QUEUES: &str = r#"
SELECT set_config('enable_sort', 'off', true), count(pg_advisory_xact_lock($3, h))
FROM (SELECT DISTINCT hashtext($1 || chr(31) || q) AS h FROM unnest($2::text[]) AS q
      ORDER BY h) locks
"#;

/// The running jobs of queue `$2` (K2): a range of `jobs_listing`. `$1` namespace.
const COUNT_RUNNING: &str = "SELECT count(*) FROM {schema}.jobs
     WHERE namespace = $1 AND queue = $2 AND state = 'running'";

/// The running jobs of keys `$3` of queue `$2` (K1), those with any. `$1` namespace.
const COUNT_KEYS_RUNNING: &str = "SELECT concurrency_key, count(*) FROM {schema}.jobs
     WHERE namespace = $1 AND queue = $2 AND state = 'running'
       AND concurrency_key = ANY($3::bytea[]) AND concurrency_key IS NOT NULL
     GROUP BY concurrency_key";

/// The keys of queue `$2` with at least `$3` running jobs, by key, and their counts;
/// at most `$4`. `$1` namespace.
const KEYS_AT_LIMIT: &str = "SELECT concurrency_key, count(*) FROM {schema}.jobs
     WHERE namespace = $1 AND queue = $2 AND state = 'running' AND concurrency_key IS NOT NULL
     GROUP BY concurrency_key HAVING count(*) >= $3
     ORDER BY concurrency_key LIMIT $4";

/// The start windows of logs `$3` of queue `$2` (K4): per log with starts after `$4`
/// (the window's opening), how many of its newest `$5` lie in the window and the
/// oldest of those. `$1` namespace.
const WINDOWS: &str = r#"
SELECT k, count(*), min(at)
FROM unnest($3::bytea[]) AS k
CROSS JOIN LATERAL (
    SELECT at FROM {schema}.queue_starts
    WHERE namespace = $1 AND queue = $2 AND key = k AND at > $4
    ORDER BY at DESC LIMIT $5
) s
GROUP BY k
"#;

/// The per-key logs of queue `$2` whose window (after `$3`) holds at least `$4`
/// starts, by key; at most `$5` (NULL: all). `$1` namespace.
const FULL_KEY_WINDOWS: &str = "SELECT key FROM {schema}.queue_starts
     WHERE namespace = $1 AND queue = $2 AND key <> '\\x'::bytea AND at > $3
     GROUP BY key HAVING count(*) >= $4 ORDER BY key LIMIT $5";

/// The highest priority below `$3` with queued jobs in queue `$2`: one seek on
/// `jobs_ready`. `$1` namespace.
const NEXT_BAND: &str = "SELECT priority FROM {schema}.jobs
     WHERE namespace = $1 AND queue = $2 AND state = 'queued' AND priority < $3
     ORDER BY priority DESC LIMIT 1";

/// The next ready jobs of queue `$2` at priority `$3`, after (`$5`, `$6`) in claim
/// order, up to `$7`; `$4` now and `$8` the budget of a fitted claim (`{fit}`, NULL
/// for none). `$1` namespace. One range of `jobs_ready`. Not locked: the queue's lock
/// keeps other claims out, and the lease takes the chosen jobs only if they are still
/// queued (`LEASE_CHOSEN`). Locking them would cost a write per row, under the lock.
macro_rules! band_page {
    () => {
        r#"
SELECT id, run_at, seq, concurrency_key, placement ->> 'l'
FROM {schema}.jobs
WHERE namespace = $1 AND queue = $2 AND state = 'queued' AND priority = $3
  AND run_at <= $4 AND (run_at, seq) > ($5, $6)
  AND (placement IS NULL OR placement @@ (SELECT {schema}.budget_admits($8::jsonb)))
ORDER BY run_at, seq
LIMIT $7
"#
    };
}

const BAND_PAGE: &str = band_page!();

/// `BAND_PAGE` locked, skipping rows others hold: for a queue without limits that a
/// limited claim names too, whose jobs plain claims take meanwhile.
const BAND_PAGE_LOCKED: &str = concat!(band_page!(), "FOR UPDATE SKIP LOCKED\n");

/// A reserved job (CONTRACT F6): job `$3` if it is ready in one of queues `$2` and
/// passes the budget `$5`, locked. `$4` now, `$1` namespace.
const RESERVED: &str = r#"
SELECT id, priority, run_at, seq, concurrency_key, placement ->> 'l', queue
FROM {schema}.jobs
WHERE namespace = $1 AND id = $3
  AND (state = 'queued' AND run_at <= $4 AND queue = ANY($2::text[])) IS TRUE
  AND (placement IS NULL OR placement @@ (SELECT {schema}.budget_admits($5::jsonb)))
FOR UPDATE SKIP LOCKED
"#;

/// The first keys above `$4` (in byte order) with queued jobs in queue `$2` at
/// priority `$3`, up to `$5`, each with its first queued job in claim order (ready if
/// its `run_at` has come: no later job of the key is). `$1` namespace. A loose scan of
/// `jobs_ready_key`, one seek per key however deep any key's backlog, whose order the
/// `ORDER BY` names: no other index gives it, so the server takes this one even when
/// its statistics are stale. Not locked: the lease takes the chosen jobs only if they
/// are still queued (`LEASE_CHOSEN`).
const NEXT_KEYS: &str = r#"
WITH RECURSIVE keys(k, id, run_at, seq) AS (
    (SELECT concurrency_key, id, run_at, seq FROM {schema}.jobs
     WHERE namespace = $1 AND queue = $2 AND state = 'queued' AND concurrency_key IS NOT NULL
       AND priority = $3 AND concurrency_key > $4
     ORDER BY concurrency_key, run_at, seq LIMIT 1)
    UNION ALL
    SELECT n.* FROM keys CROSS JOIN LATERAL (
        SELECT concurrency_key, id, run_at, seq FROM {schema}.jobs
        WHERE namespace = $1 AND queue = $2 AND state = 'queued'
          AND concurrency_key IS NOT NULL AND priority = $3 AND concurrency_key > keys.k
        ORDER BY concurrency_key, run_at, seq LIMIT 1
    ) n
)
SELECT k, id, run_at, seq FROM keys LIMIT $5
"#;

/// The next ready jobs of key `$4` of queue `$2` at priority `$3`, after (`$6`, `$7`)
/// in claim order, up to `$8`, locked; `$5` now. `$1` namespace. One range of
/// `jobs_ready_key`: the key is bounded as a range, not matched, so the `ORDER BY`
/// names that index's order and no other index gives it (with the key matched, the
/// band's range of `jobs_ready` gives the same order, and a server with stale
/// statistics may walk it, past every job of the other keys).
const KEY_JOBS: &str = r#"
SELECT id, run_at, seq FROM {schema}.jobs
WHERE namespace = $1 AND queue = $2 AND state = 'queued' AND priority = $3
  AND concurrency_key IS NOT NULL AND (concurrency_key, run_at, seq) > ($4, $6, $7)
  AND concurrency_key <= $4 AND run_at <= $5
ORDER BY concurrency_key, run_at, seq LIMIT $8
FOR UPDATE SKIP LOCKED
"#;

/// The next ready jobs without a key of queue `$2` at priority `$3`, after (`$5`,
/// `$6`) in claim order, up to `$7`, locked; `$4` now. `$1` namespace. A range of
/// `jobs_ready`, whose rows do not hold the key: a band of keyed jobs is read past
/// (row by row, from the table) to reach them.
const UNKEYED_JOBS: &str = r#"
SELECT id, run_at, seq FROM {schema}.jobs
WHERE namespace = $1 AND queue = $2 AND state = 'queued' AND priority = $3
  AND concurrency_key IS NULL
  AND run_at <= $4 AND (run_at, seq) > ($5, $6)
ORDER BY priority DESC, run_at, seq LIMIT $7
FOR UPDATE SKIP LOCKED
"#;

/// The key fair queue `$2`'s claims served last at priority `$3`. `$1` namespace.
const TURN: &str = "SELECT key FROM {schema}.queue_turns
     WHERE namespace = $1 AND queue = $2 AND priority = $3";

/// Moves the turns of fair queues on (K5): per (`$2` queue, `$3` priority), the key
/// `$4` served last. `$1` namespace.
const PUT_TURNS: &str = r#"
INSERT INTO {schema}.queue_turns (namespace, queue, priority, key)
SELECT $1, t.q, t.p, t.k FROM unnest($2::text[], $3::int2[], $4::bytea[]) AS t(q, p, k)
ON CONFLICT (namespace, queue, priority) DO UPDATE SET key = excluded.key
"#;

/// Leases the `$4` jobs `$2` that limited claims chose, as every claim does (`$1`
/// namespace, `$3` now), each to its claim's worker (`$5`, in step with `$2`) until
/// its claim's lease expiry (`$6`), and returns them with their payloads: those still
/// queued when written. The walk that chose them did not lock them (the queue's lock
/// keeps other claims out), so a job some other call changed since (a cancel, say) is
/// left out by the update's own test, which the server makes again on the row as it
/// is once that call commits; it is never leased in its new state. Locking the rows
/// first would cost a write per row. The tests sit inside `( … ) IS TRUE` so that only
/// the primary key serves each lookup.
const LEASE_CHOSEN: &str = concat!(
    r#"WITH cand AS (
    SELECT j.id AS cand_id, c.worker AS cand_worker, c.expires AS cand_expires
    FROM unnest($2::uuid[], $5::bytea[], $6::int8[]) AS c(id, worker, expires)
    JOIN {schema}.jobs j ON j.namespace = $1 AND j.id = c.id
    WHERE (j.state = 'queued' AND j.run_at <= $3) IS TRUE
    LIMIT $4
)
"#,
    lease_candidates!(
        "cand.cand_worker",
        "cand.cand_expires",
        "AND (state = 'queued' AND run_at <= $3) IS TRUE "
    )
);

/// Logs starts (K4) at `$5`: per (`$2` queue, `$3` log key), and trims each log to the
/// starts after its window's opening `$4`. `$1` namespace.
const LOG_STARTS: &str = r#"
WITH trimmed AS (
    DELETE FROM {schema}.queue_starts s
    USING (SELECT DISTINCT q, k, cut FROM unnest($2::text[], $3::bytea[], $4::int8[])
           AS t(q, k, cut)) t
    WHERE s.namespace = $1 AND s.queue = t.q AND s.key = t.k AND s.at <= t.cut
)
INSERT INTO {schema}.queue_starts (namespace, queue, key, at)
SELECT $1, t.q, t.k, $5 FROM unnest($2::text[], $3::bytea[]) AS t(q, k)
"#;

/// Deletes the starts that left their queue's windows, and every start of a queue
/// whose rates are gone: a claim trims only the logs it writes to. `$1` namespace,
/// `$2` now. Runs with reclaim's housekeeping.
const FORGET_OLD_STARTS: &str = r#"
DELETE FROM {schema}.queue_starts s
WHERE s.namespace = $1 AND s.at <= $2 - COALESCE(
    (SELECT greatest(COALESCE(l.max_starts_ms, 0), COALESCE(l.max_starts_per_key_ms, 0))
     FROM {schema}.queue_controls l WHERE l.namespace = s.namespace AND l.queue = s.queue),
    0)
"#;

/// The statements of flow control, rendered for one schema.
#[derive(Debug)]
pub(crate) struct LimitStatements {
    pub(crate) limits: Text,
    pub(crate) limits_of: Text,
    pub(crate) controls_of: Text,
    pub(crate) put_limits: Text,
    pub(crate) remove_limits: Text,
    pub(crate) lock_jobs: Text,
    pub(crate) lock_queues: Text,
    pub(crate) count_running: Text,
    pub(crate) count_keys_running: Text,
    pub(crate) keys_at_limit: Text,
    pub(crate) windows: Text,
    pub(crate) full_key_windows: Text,
    pub(crate) next_band: Text,
    pub(crate) band_page: Text,
    pub(crate) band_page_locked: Text,
    pub(crate) reserved: Text,
    pub(crate) next_keys: Text,
    pub(crate) key_jobs: Text,
    pub(crate) unkeyed_jobs: Text,
    pub(crate) turn: Text,
    pub(crate) put_turns: Text,
    pub(crate) lease_chosen: Text,
    pub(crate) log_starts: Text,
    pub(crate) forget_old_starts: Text,
}

impl LimitStatements {
    pub(super) fn render(r: &impl Fn(&str) -> Text) -> Self {
        LimitStatements {
            limits: r(LIMITS),
            limits_of: r(LIMITS_OF),
            controls_of: r(CONTROLS_OF),
            put_limits: r(PUT_LIMITS),
            remove_limits: r(REMOVE_LIMITS),
            lock_jobs: r(LOCK_JOBS),
            lock_queues: r(LOCK_QUEUES),
            count_running: r(COUNT_RUNNING),
            count_keys_running: r(COUNT_KEYS_RUNNING),
            keys_at_limit: r(KEYS_AT_LIMIT),
            windows: r(WINDOWS),
            full_key_windows: r(FULL_KEY_WINDOWS),
            next_band: r(NEXT_BAND),
            band_page: r(BAND_PAGE),
            band_page_locked: r(BAND_PAGE_LOCKED),
            reserved: r(RESERVED),
            next_keys: r(NEXT_KEYS),
            key_jobs: r(KEY_JOBS),
            unkeyed_jobs: r(UNKEYED_JOBS),
            turn: r(TURN),
            put_turns: r(PUT_TURNS),
            lease_chosen: r(LEASE_CHOSEN),
            log_starts: r(LOG_STARTS),
            forget_old_starts: r(FORGET_OLD_STARTS),
        }
    }
}
