//! Stored schedules (CONTRACT S1–S3).

/// Rule S1: `$1` namespace, `$2` name, `$3` spec, `$4` now. A known schedule keeps
/// whether it is enabled and its last tick.
pub(super) const PUT_SCHEDULE: &str = r#"
INSERT INTO {schema}.schedules (namespace, name, spec, enabled, last_tick)
VALUES ($1, $2, $3, true, $4)
ON CONFLICT (namespace, name) DO UPDATE SET spec = excluded.spec
"#;

/// Rule S1: every schedule of namespace `$1`, by name.
pub(super) const SCHEDULES: &str = r#"
SELECT name, spec, enabled, last_tick FROM {schema}.schedules
WHERE namespace = $1 ORDER BY name
"#;

/// Rule S2: `$3` enabled or NULL (unchanged), `$4` a last tick or NULL; the last tick
/// only moves forward. Returns a row when the schedule exists.
pub(super) const UPDATE_SCHEDULE: &str = r#"
UPDATE {schema}.schedules SET
    enabled = COALESCE($3, enabled),
    last_tick = GREATEST(last_tick, COALESCE($4, last_tick))
WHERE namespace = $1 AND name = $2
RETURNING 1
"#;

/// Rule S1. Returns a row when the schedule existed.
pub(super) const DELETE_SCHEDULE: &str = r#"
DELETE FROM {schema}.schedules WHERE namespace = $1 AND name = $2
RETURNING 1
"#;
