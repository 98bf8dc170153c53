//! The event stream (CONTRACT V1–V4): the rows of `jobq_events`. State changes are
//! recorded by the triggers of schema version 12 (`schema.rs`), in the statement that
//! changes the state; this reads the stream, records what a handler emits, trims, and
//! empties a namespace's stream.
//!
//! An event's cursor is `seq-0`, `seq` its rowid: the file has one writer at a time, so
//! rowids are handed out in commit order, and a read's snapshot holds every event
//! numbered below the newest it holds (V2).

use durq_core::events::{page, Event, EventCursor, EventKind, EventPage};

use super::*;

/// Rule V2: up to `limit` events of namespace `ns` after `after`, oldest first, and the
/// newest cursor a trim deleted, read in one snapshot: a trim committing between the two
/// reads would otherwise answer events past a gap it made without saying `trimmed`.
///
/// Events are numbered `N-0`, so a cursor `N-L` with `L > 0` lies between `N-0` and
/// `(N+1)-0`, and the events after it are those after `N`.
pub(crate) fn read_events(
    conn: &Connection,
    ns: i64,
    after: EventCursor,
    limit: usize,
) -> Result<EventPage> {
    // A cursor past every number SQLite hands out has nothing after it.
    let after_seq = i64::try_from(after.high()).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let through: Option<i64> = tx
        .prepare_cached("SELECT through FROM jobq_events_trimmed WHERE ns = ?1")
        .and_then(|mut stmt| stmt.query_row([ns], |row| row.get(0)).optional())
        .db("read how far the stream was trimmed")?;
    let mut stmt = tx
        .prepare_cached(
            "SELECT seq, job_id, queue, kind, attempt, name, data, recorded_at
             FROM jobq_events INDEXED BY jobq_events_ns
             WHERE ns = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .db("prepare the events read")?;
    let mut rows = stmt
        .query(params![ns, after_seq, limit])
        .db("read the events")?;
    let mut found = Vec::new();
    while let Some(row) = rows.next().db("read the events")? {
        found.push(event_from_row(row)?);
    }
    drop(rows);
    drop(stmt);
    tx.finish().db("end a read")?;
    let trimmed_through = match through {
        Some(through) => EventCursor::new(
            u64::try_from(through).map_err(|_| {
                Error::corrupt(
                    "the event stream",
                    format!("trimmed through {through}, out of range"),
                )
            })?,
            0,
        ),
        None => EventCursor::START,
    };
    Ok(page(after, found, trimmed_through))
}

/// One row of `jobq_events`, selected as [`read_events`] selects it; a value that
/// cannot be read back is a corrupt record, named by its cursor.
fn event_from_row(row: &Row<'_>) -> Result<Event> {
    let read = |err| crate::error::db_error("read an event", err);
    let seq: i64 = row.get(0).map_err(read)?;
    let what = || format!("event {seq}-0");
    let cursor = u64::try_from(seq)
        .map(|seq| EventCursor::new(seq, 0))
        .map_err(|_| Error::corrupt(what(), "a negative cursor"))?;
    let job = JobId::from_bytes(row.get::<_, [u8; 16]>(1).map_err(read)?)
        .map_err(|err| Error::corrupt(what(), err.to_string()))?;
    let kind: String = row.get(3).map_err(read)?;
    let kind = kind
        .parse::<EventKind>()
        .map_err(|_| Error::corrupt(what(), format!("unknown kind {kind:?}")))?;
    let attempt: i64 = row.get(4).map_err(read)?;
    let attempt = u32::try_from(attempt)
        .map_err(|_| Error::corrupt(what(), format!("attempt holds {attempt}, out of range")))?;
    let data: Option<Vec<u8>> = row.get(6).map_err(read)?;
    Ok(Event {
        cursor,
        job,
        queue: row.get(2).map_err(read)?,
        kind,
        attempt,
        name: row.get(5).map_err(read)?,
        data: data.map(Bytes::from),
        recorded_at: Timestamp::from_millis(row.get(7).map_err(read)?),
    })
}

/// Rule V1: records an `emitted` event `name` with `data` for job `id`, running under
/// `token`, whether or not the job records its changes. The lease is checked as every
/// lease call checks it (`NotFound`, `LeaseLost`) before the one write, so a refusal
/// writes nothing. `recorded_at` is the store's instant `now`: the backend writes this
/// event itself (V1, decided).
pub(crate) fn emit_event(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: JobId,
    token: LeaseToken,
    name: &str,
    data: &[u8],
    now: Timestamp,
) -> Result<()> {
    let conn = tx.conn();
    check_lease(conn, ns, id, token)?;
    conn.prepare_cached(
        "INSERT INTO jobq_events (ns, job_id, queue, kind, attempt, name, data, recorded_at)
         SELECT ns, id, queue, ?3, attempts, ?4, ?5, ?6 FROM jobq_jobs
         WHERE ns = ?1 AND id = ?2",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            ns,
            id.to_bytes(),
            EventKind::Emitted.as_str(),
            name,
            data,
            now.as_millis()
        ])
    })
    .db("record the emitted event")?;
    Ok(())
}

/// Rule V3: deletes namespace `ns`'s oldest events so that its newest `keep` (at least
/// one, checked by the handle) stay, and remembers the newest one it deleted, in the
/// caller's one write transaction. Answers how many it deleted.
///
/// The newest event to delete is found by one walk of the namespace's index from its
/// newest event, `keep` entries long; the delete is then one range of that index.
pub(crate) fn trim_events(tx: &mut WriteTx<'_>, ns: i64, keep: u64) -> Result<u64> {
    let conn = tx.conn();
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    let newest_deleted: Option<i64> = conn
        .prepare_cached(
            "SELECT seq FROM jobq_events INDEXED BY jobq_events_ns
             WHERE ns = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, keep], |row| row.get(0))
                .optional()
        })
        .db("find the events to trim")?;
    let Some(newest_deleted) = newest_deleted else {
        return Ok(0);
    };
    let deleted = conn
        .prepare_cached("DELETE FROM jobq_events WHERE ns = ?1 AND seq <= ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, newest_deleted]))
        .db("trim the events")?;
    conn.prepare_cached(
        "INSERT INTO jobq_events_trimmed (ns, through) VALUES (?1, ?2)
         ON CONFLICT (ns) DO UPDATE SET through = MAX(through, excluded.through)",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, newest_deleted]))
    .db("remember how far the stream was trimmed")?;
    Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
}

/// Deletes namespace `ns`'s events and its trim record, for `drop_namespace`.
///
/// A new event takes the number one past the largest in the table, so deleting the
/// table's newest event would hand its number out again, and every number after it:
/// a consumer of any namespace that had read to there would skip the events that take
/// them. So when the namespace holds the table's newest event, that row stays behind
/// as a bare placeholder in namespace 0, which no store has (namespace ids start at 1),
/// and older placeholders go, so there is at most one.
pub(super) fn drop_events(conn: &Connection, ns: i64) -> Result<()> {
    let exec = |sql: &str, what: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([ns]))
            .db(what)
    };
    exec(
        "UPDATE jobq_events SET ns = 0, job_id = x'', queue = '', kind = '', attempt = 0,
             name = NULL, data = NULL
         WHERE ns = ?1 AND seq = (SELECT MAX(seq) FROM jobq_events)",
        "keep the stream's newest number",
    )?;
    exec(
        "DELETE FROM jobq_events WHERE ns = ?1",
        "delete the namespace's events",
    )?;
    conn.prepare_cached(
        "DELETE FROM jobq_events WHERE ns = 0 AND seq < (SELECT MAX(seq) FROM jobq_events)",
    )
    .and_then(|mut stmt| stmt.execute([]))
    .db("delete the placeholders no longer needed")?;
    exec(
        "DELETE FROM jobq_events_trimmed WHERE ns = ?1",
        "delete the namespace's trim record",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [JobState; 6] = [
        JobState::Waiting,
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
    ];

    fn must<T, E: std::fmt::Display>(result: std::result::Result<T, E>, what: &str) -> T {
        match result {
            Ok(value) => value,
            Err(err) => panic!("{what}: {err}"),
        }
    }

    /// An in-memory database with every migration applied.
    fn schema() -> Connection {
        let conn = must(Connection::open_in_memory(), "open");
        must(
            conn.execute_batch(
                "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                 WITHOUT ROWID;",
            ),
            "create the meta table",
        );
        for migration in crate::schema::MIGRATIONS {
            must(conn.execute_batch(migration), "apply a migration");
        }
        // As a store that records events does when it opens the file.
        must(
            crate::schema::ensure_event_triggers(&conn),
            "create the event triggers",
        );
        conn
    }

    /// Inserts job row `row` in `state` with `attempts`, marked at instant `at` or not
    /// marked; answers its id.
    fn insert(
        conn: &Connection,
        row: i64,
        state: JobState,
        attempts: u32,
        at: Option<i64>,
    ) -> JobId {
        let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
        must(
            conn.execute(
                "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at, seq,
                     attempts, max_attempts, lease_token, cancel_requested, created_at, tenant,
                     events_at)
                 VALUES (?1, 1, ?2, 'q', ?3, 0, 0, ?1, ?4, 9, 0, 0, 0, '', ?5)",
                params![row, id.to_bytes(), state_code(state), attempts, at],
            ),
            "insert a job",
        );
        id
    }

    /// Changes job row `row`'s state and attempts at instant `at`, as the store's
    /// statements do (`events_stamp!`).
    fn change(conn: &Connection, row: i64, state: JobState, attempts: u32, at: i64) {
        must(
            conn.execute(
                concat!(
                    "UPDATE OR FAIL jobq_jobs SET state = ?2, attempts = ?3, ",
                    events_stamp!("4"),
                    " WHERE job = ?1"
                ),
                params![row, state_code(state), attempts, at],
            ),
            "change the state",
        );
    }

    /// The kinds, attempts and instants recorded for job `id`, oldest first, from the
    /// rows.
    fn recorded(conn: &Connection, id: JobId) -> Vec<(String, i64, i64)> {
        let mut stmt = must(
            conn.prepare(
                "SELECT kind, attempt, recorded_at FROM jobq_events WHERE job_id = ?1
                 ORDER BY seq",
            ),
            "prepare",
        );
        let rows = stmt.query_map([id.to_bytes()], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        });
        must(rows.and_then(|rows| rows.collect()), "read the events")
    }

    /// The event triggers record, for every change of state and of attempts,
    /// exactly the kind `EventKind::of_change` decides (none where it decides none), with
    /// the attempts after the change and the change's instant (an instant of 0
    /// included); an unmarked job records nothing, ever, and stays unmarked.
    #[test]
    fn the_triggers_record_what_of_change_decides() {
        let conn = schema();
        let mut row = 0;
        for was in STATES {
            for now in STATES {
                for (before, after) in [(1, 1), (1, 0), (0, 1), (2, 2), (2, 1), (0, 0)] {
                    row += 1;
                    let (enqueued_at, changed_at) = (row % 2 * 100, 1_000 + row);
                    let id = insert(&conn, row, was, before, Some(enqueued_at));
                    let unmarked = insert(&conn, row + 10_000, was, before, None);
                    change(&conn, row, now, after, changed_at);
                    change(&conn, row + 10_000, now, after, changed_at);
                    let mut expected =
                        vec![("enqueued".to_owned(), i64::from(before), enqueued_at)];
                    if let Some(kind) = EventKind::of_change(Some(was), now, before, after) {
                        expected.push((kind.as_str().to_owned(), i64::from(after), changed_at));
                    }
                    assert_eq!(
                        recorded(&conn, id),
                        expected,
                        "{was:?} -> {now:?}, attempts {before} -> {after}"
                    );
                    assert!(recorded(&conn, unmarked).is_empty());
                }
            }
        }
        let unmarked: i64 = must(
            conn.query_row(
                "SELECT COUNT(*) FROM jobq_jobs WHERE job > 10000 AND events_at IS NOT NULL",
                [],
                |found| found.get(0),
            ),
            "count the marks",
        );
        assert_eq!(unmarked, 0, "a change never marks a job");
        // A write that does not name the state, or names it unchanged, records nothing.
        let id = insert(&conn, 1_000_000, JobState::Running, 1, Some(7));
        must(
            conn.execute(
                "UPDATE jobq_jobs SET heartbeat_at = 5, cancel_requested = 1 WHERE job = 1000000",
                [],
            ),
            "write without a change of state",
        );
        change(&conn, 1_000_000, JobState::Running, 1, 9);
        assert_eq!(recorded(&conn, id), vec![("enqueued".to_owned(), 1, 7)]);
    }

    /// The stream's reads and the trim walk the namespace's index and sort nothing.
    #[test]
    fn the_stream_is_read_and_trimmed_by_its_index() {
        let conn = schema();
        for (sql, what) in [
            (
                "SELECT seq, job_id, queue, kind, attempt, name, data, recorded_at
                 FROM jobq_events INDEXED BY jobq_events_ns
                 WHERE ns = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                "the read",
            ),
            (
                "SELECT seq FROM jobq_events INDEXED BY jobq_events_ns
                 WHERE ns = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
                "the trim's walk",
            ),
            (
                "DELETE FROM jobq_events WHERE ns = ?1 AND seq <= ?2",
                "the trim's delete",
            ),
        ] {
            let mut stmt = must(conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")), what);
            let values = vec![1i64; stmt.parameter_count()];
            let plan: Vec<String> = must(
                stmt.query_map(rusqlite::params_from_iter(values), |row| row.get(3))
                    .and_then(|rows| rows.collect()),
                what,
            );
            let plan = plan.join("; ");
            assert!(
                plan.contains("jobq_events_ns") || plan.contains("INTEGER PRIMARY KEY"),
                "{what}: {plan}"
            );
            assert!(!plan.contains("TEMP B-TREE"), "{what}: {plan}");
            assert!(!plan.starts_with("SCAN jobq_events"), "{what}: {plan}");
        }
    }
}
