//! Operator actions (CONTRACT A1, A2, Q1) and the statements of tests and retirement.

/// Rule A1 on a waiting, queued or running job. `$3` now.
pub(super) const CANCEL: &str = r#"
UPDATE {schema}.jobs SET
    -- A1, G4: a waiting or queued job is cancelled at once (the jobs waiting for it
    -- are settled by the `settle_dependents` trigger); a running one only gets
    -- cancel_requested (its holder, or reclaim, ends it).
    state = CASE WHEN state IN ('waiting', 'queued') THEN 'cancelled' ELSE state END,
    finished_at = CASE WHEN state IN ('waiting', 'queued') THEN $3 ELSE finished_at END,
    waiting_for = NULL,
    cancel_requested = cancel_requested OR state = 'running'
WHERE namespace = $1 AND id = $2 AND (state IN ('waiting', 'queued', 'running')) IS TRUE
RETURNING state
"#;

/// Rule A2. `$3` now. The job starts over (`start_over!`): no error, start or
/// heartbeat of a past run is left on it (they are in its attempt history).
pub(super) const RETRY: &str = concat!(
    "
UPDATE {schema}.jobs SET
    ",
    start_over!("$3"),
    "
WHERE namespace = $1 AND id = $2 AND (state IN ('dead', 'cancelled')) IS TRUE
RETURNING queue
"
);

/// Deletes a job row behind the store's back, as a lost record would (test harnesses).
#[cfg(feature = "testing")]
pub(super) const VANISH: &str = "DELETE FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

/// Rule Q1: `$1` namespace, `$2` queue.
pub(super) const PAUSE: &str = r#"
INSERT INTO {schema}.paused_queues (namespace, queue) VALUES ($1, $2)
ON CONFLICT DO NOTHING
"#;

/// Rule Q1: `$1` namespace, `$2` queue. Returns a row when the queue was paused.
pub(super) const RESUME: &str = r#"
DELETE FROM {schema}.paused_queues WHERE namespace = $1 AND queue = $2
RETURNING queue
"#;

/// Rule Q1: the namespace's paused queues, by name.
pub(super) const PAUSED_QUEUES: &str = r#"
SELECT queue FROM {schema}.paused_queues WHERE namespace = $1 ORDER BY queue
"#;

/// Deletes every row of namespace `$1`, jobs, attempts, steps, keys, dependencies,
/// pauses, schedules, workers, flow control, events and the trim record, in one
/// transaction; returns how many jobs it deleted.
pub(super) const DROP_NAMESPACE: &str = r#"
WITH keys AS (
    DELETE FROM {schema}.dedup WHERE namespace = $1
),
attempts AS (
    DELETE FROM {schema}.attempts WHERE namespace = $1
),
steps AS (
    DELETE FROM {schema}.steps WHERE namespace = $1
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
controls AS (
    DELETE FROM {schema}.queue_controls WHERE namespace = $1
),
starts AS (
    DELETE FROM {schema}.queue_starts WHERE namespace = $1
),
turns AS (
    DELETE FROM {schema}.queue_turns WHERE namespace = $1
),
edges AS (
    DELETE FROM {schema}.dependencies WHERE namespace = $1
),
events AS (
    DELETE FROM {schema}.events WHERE namespace = $1
),
trimmed AS (
    DELETE FROM {schema}.events_trimmed WHERE namespace = $1
),
gone AS (
    DELETE FROM {schema}.jobs WHERE namespace = $1
    RETURNING 1
)
SELECT count(*) FROM gone
"#;
