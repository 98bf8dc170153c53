//! The event stream (CONTRACT V1–V4): a read from a cursor, a handler's emitted event
//! and a trim (migration 15). Every change of a marked job's state is recorded by the
//! `record_event` trigger of migration 15, not here.

use super::*;

/// Rule V2 in one statement, so one snapshot: up to `$4` events of namespace `$1` with
/// cursors after (`$2` xid as text, `$3` seq), oldest first, each row also holding the
/// namespace's trim record (`trimmed_xid`, `trimmed_seq`, NULL when it was never
/// trimmed); one row of NULL event columns when there is no event to answer.
///
/// Only the events whose key is below `pg_snapshot_xmin` of the statement's own
/// snapshot are answered (an InitPlan, read once): every transaction below it has
/// ended, and no running or later transaction writes an event with a key below it
/// (migration 15), so none can still appear before the last one answered. Read in
/// the same snapshot, the trim record and the events agree: a trim is seen whole (its
/// deletions and its record) or not at all.
///
/// One range of the primary key `(namespace, xid, seq)`, bounded below by the cursor
/// and above by the horizon.
const EVENTS: &str = r#"
SELECT t.xid::text AS trimmed_xid, t.seq AS trimmed_seq,
       p.xid::text, p.seq, p.job, p.queue, p.kind, p.attempt, p.name, p.data, p.recorded_at
FROM (SELECT 1) one
LEFT JOIN {schema}.events_trimmed t ON t.namespace = $1
LEFT JOIN LATERAL (
    SELECT e.xid, e.seq, e.job, e.queue, e.kind, e.attempt, e.name, e.data, e.recorded_at
    FROM {schema}.events e
    WHERE e.namespace = $1
      AND (e.xid, e.seq) > ($2::text::xid8, $3::int8)
      AND e.xid < (SELECT pg_snapshot_xmin(pg_current_snapshot()))
    ORDER BY e.xid, e.seq
    LIMIT $4
) p ON true
ORDER BY p.xid, p.seq
"#;

/// Rule V1 in one statement: records event `$4` with data `$5` of job `$2` if token
/// `$3` holds its lease, at `$6` (the store's clock). `$1` namespace.
///
/// One row: `held` (the token held the lease, and the event is written) and `found`
/// (the job exists), from which the store answers `Ok`, `LeaseLost` or `NotFound`;
/// neither of the last two writes anything.
///
/// The job's row is locked (`FOR NO KEY UPDATE`, the lock its own `UPDATE`s take), as
/// `save_step` locks it: the event comes entirely before a completion, failure or
/// reclaim, or finds the lease gone after it (a lock that waited reads the row's new
/// version). The key is `event_key()` (migration 15), called once the lock is held, so
/// the event orders after the job's earlier changes and before its later ones, whether
/// or not the job records its changes. The row itself is not written.
///
/// No `{relax}`: an emitted event is as durable as an enqueue.
const EMIT: &str = r#"
WITH held AS MATERIALIZED (
    SELECT id AS held_id, queue, attempts FROM {schema}.jobs
    WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
    FOR NO KEY UPDATE
),
emitted AS (
    INSERT INTO {schema}.events
        (namespace, xid, seq, job, queue, kind, attempt, name, data, recorded_at)
    SELECT $1, {schema}.event_key(), nextval('{schema}.event_seq'), held_id, queue,
           'emitted', attempts, $4, $5, $6
    FROM held
)
SELECT EXISTS (SELECT 1 FROM held) AS held,
       EXISTS (SELECT 1 FROM {schema}.jobs WHERE namespace = $1 AND id = $2) AS found
"#;

/// Rule V3 in one statement, so one atomic step: deletes every event of namespace `$1`
/// but the newest `$2`, that is every one at or before `cut`, the newest past the `$2`
/// newest (found by walking the primary key backwards); records `cut` as the
/// namespace's `trimmed_through` (only ever moved forward, so of two trims at once the
/// newer record stays); answers how many rows it deleted. With no more than `$2`
/// events it changes nothing.
///
/// Every event the statement's snapshot sees counts, below the read's horizon or not.
/// An event that commits after the snapshot is not seen and stays, even with a cursor
/// before `cut` (a transaction that began before the trim and ended after it): a read
/// that meets it says `trimmed` as long as its cursor is before `cut`, as any read
/// after a cursor before the newest deleted event does.
const TRIM: &str = r#"
WITH cut AS MATERIALIZED (
    SELECT xid, seq FROM {schema}.events
    WHERE namespace = $1
    ORDER BY xid DESC, seq DESC
    OFFSET $2
    LIMIT 1
),
gone AS (
    DELETE FROM {schema}.events e USING cut
    WHERE e.namespace = $1 AND (e.xid, e.seq) <= (cut.xid, cut.seq)
    RETURNING 1
),
mark AS (
    INSERT INTO {schema}.events_trimmed AS t (namespace, xid, seq)
    SELECT $1, xid, seq FROM cut
    ON CONFLICT (namespace) DO UPDATE SET xid = excluded.xid, seq = excluded.seq
    WHERE (t.xid, t.seq) < (excluded.xid, excluded.seq)
)
SELECT count(*) FROM gone
"#;

/// The statements of the event stream, rendered for one schema.
#[derive(Debug)]
pub(crate) struct EventStatements {
    /// [`EVENTS`].
    pub(crate) events: Text,
    /// [`EMIT`].
    pub(crate) emit: Text,
    /// [`TRIM`].
    pub(crate) trim: Text,
}

impl EventStatements {
    pub(super) fn render(r: &impl Fn(&str) -> Text) -> Self {
        EventStatements {
            events: r(EVENTS),
            emit: r(EMIT),
            trim: r(TRIM),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_statement_is_rendered_whole_and_commits_as_configured() {
        for relaxed in [true, false] {
            let sql = Statements::new("\"jobs\"", relaxed);
            let events = &sql.events;
            for text in [&events.events, &events.emit, &events.trim] {
                assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
                // An emitted event is as durable as an enqueue; a trim's record too.
                assert!(!text.0.contains("set_config"), "{}", text.0);
            }
        }
    }

    /// V1: the hot path of a store that does not record events is the text it was
    /// before the stream existed: no mark, no parameter, no expression. A recording
    /// store's shapes differ from it by the mark only.
    #[test]
    fn only_a_recording_store_writes_the_mark() {
        let sql = Statements::new("\"jobs\"", true);
        for (plain, recording) in sql
            .enqueue
            .all()
            .into_iter()
            .zip(sql.enqueue_recording.all())
        {
            assert!(!plain.0.contains("records_events"), "{}", plain.0);
            assert!(!plain.0.contains("event"), "{}", plain.0);
            assert_eq!(recording.0.matches("records_events").count(), 1);
            let unmarked = recording
                .0
                .replace(", records_events", "")
                .replace(", true\n", "\n");
            assert_eq!(unmarked, &*plain.0, "the mark is the only difference");
        }
        for hot in [
            &sql.claim,
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
            &sql.heartbeat,
            &sql.heartbeat_batch,
            &sql.complete,
            &sql.complete_again,
            &sql.complete_in,
            &sql.fail,
            &sql.release,
            &sql.reclaim,
        ] {
            assert!(!hot.0.contains("event"), "{}", hot.0);
        }
    }
}
