//! The worker registry (CONTRACT W1–W4).

/// Rule W1: `$1` namespace, `$2` id, `$3` spec, `$4` now, `$5` in flight. Stores the
/// worker whole, `last_seen` now, replacing a record of that id.
pub(super) const PUT_WORKER: &str = r#"
INSERT INTO {schema}.workers (namespace, id, spec, in_flight, last_seen)
SELECT $1, $2, $3, $5, $4
WHERE {relax}
ON CONFLICT (namespace, id) DO UPDATE SET
    spec = excluded.spec, in_flight = excluded.in_flight, last_seen = excluded.last_seen
"#;

/// Rule W2: `$1` namespace, `$2` id, `$3` in flight, `$4` now. Returns a row when the
/// worker is registered; creates none.
pub(super) const TOUCH_WORKER: &str = r#"
UPDATE {schema}.workers SET in_flight = $3, last_seen = $4
WHERE namespace = $1 AND id = $2 AND {relax}
RETURNING 1
"#;

/// Rule W3: `$1` namespace, `$2` id. Returns a row when the worker existed.
pub(super) const DELETE_WORKER: &str = r#"
DELETE FROM {schema}.workers WHERE namespace = $1 AND id = $2 AND {relax}
RETURNING 1
"#;

/// Rule W1: every worker of namespace `$1`, by id in byte order (`COLLATE "C"`, as
/// Rust sorts strings, whatever the database's collation).
pub(super) const WORKERS: &str = r#"
SELECT id, spec, in_flight, last_seen FROM {schema}.workers
WHERE namespace = $1 ORDER BY id COLLATE "C"
"#;

/// Rule W4: `$1` namespace, `$2` cutoff. Deletes the workers last seen strictly before
/// the cutoff (through `workers_seen`) and returns their ids (unordered: the store
/// sorts them).
pub(super) const REAP_WORKERS: &str = r#"
DELETE FROM {schema}.workers WHERE namespace = $1 AND last_seen < $2 AND {relax}
RETURNING id
"#;
