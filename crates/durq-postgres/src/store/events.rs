//! The event stream (CONTRACT V1–V4): `events`, `emit` and `trim_events`, one
//! statement each (the texts are in `sql/events.rs`, the tables and the trigger that
//! records every change of a marked job in migration 15).

use durq_core::events::{self, Event, EventCursor, EventKind, EventPage};

use super::*;

/// A cursor's first number as the statement binds it: the `xid8` key, as text.
fn xid_param(cursor: EventCursor) -> String {
    cursor.high().to_string()
}

/// A cursor's second number as the statement binds it: `seq`, a positive `bigint`.
/// One beyond `i64::MAX` compares as `i64::MAX` does: no stored `seq` reaches either.
fn seq_param(cursor: EventCursor) -> i64 {
    i64::try_from(cursor.low()).unwrap_or(i64::MAX)
}

/// The cursor in columns `xid` (an `xid8` as text) and `seq` of `row`, or `None` when
/// both are NULL (no such row of a left join).
fn cursor(
    row: &PgRow,
    xid: usize,
    seq: usize,
    what: &dyn Fn() -> String,
) -> Result<Option<EventCursor>> {
    let key: Option<String> = column(row, xid, what)?;
    let number: Option<i64> = column(row, seq, what)?;
    let (Some(key), Some(number)) = (key, number) else {
        return Ok(None);
    };
    let high = key
        .parse::<u64>()
        .map_err(|_| Error::corrupt(what(), format!("event key {key:?}")))?;
    let low =
        u64::try_from(number).map_err(|_| Error::corrupt(what(), format!("event seq {number}")))?;
    Ok(Some(EventCursor::new(high, low)))
}

/// Rule V2: one statement, one snapshot (see `sql::EVENTS`).
pub(crate) async fn events(
    store: &PostgresBackend,
    after: EventCursor,
    limit: usize,
) -> Result<EventPage> {
    // A read: sent again if the connection broke.
    let rows = store
        .shared()
        .fetch_all_again("events", |_| {
            sqlx::query(store.sql().events.events.sql())
                .bind(store.namespace())
                .bind(xid_param(after))
                .bind(seq_param(after))
                .bind(limit_param(limit))
        })
        .await?;
    let what = || "event row".to_owned();
    let mut trimmed_through = EventCursor::START;
    let mut found = Vec::with_capacity(rows.len());
    for row in &rows {
        // Every row repeats the trim record.
        if let Some(trimmed) = cursor(row, 0, 1, &what)? {
            trimmed_through = trimmed;
        }
        // The left join's NULLs: no event to answer.
        let Some(at) = cursor(row, 2, 3, &what)? else {
            continue;
        };
        let what = || format!("event {at}");
        let kind: String = column(row, 6, &what)?;
        let kind = kind
            .parse::<EventKind>()
            .map_err(|_| Error::corrupt(what(), format!("unknown kind {kind:?}")))?;
        let attempt: i64 = column(row, 7, &what)?;
        let attempt = u32::try_from(attempt)
            .map_err(|_| Error::corrupt(what(), format!("attempt is {attempt}")))?;
        let data: Option<Vec<u8>> = column(row, 9, &what)?;
        found.push(Event {
            cursor: at,
            job: row::job_id(column(row, 4, &what)?)?,
            queue: column(row, 5, &what)?,
            kind,
            attempt,
            name: column(row, 8, &what)?,
            data: data.map(Bytes::from),
            recorded_at: Timestamp::from_millis(column(row, 10, &what)?),
        });
    }
    Ok(events::page(after, found, trimmed_through))
}

/// Rule V1: one statement, one round trip, whatever it answers.
pub(crate) async fn emit(
    store: &PostgresBackend,
    id: JobId,
    token: LeaseToken,
    name: &str,
    data: Bytes,
    now: Timestamp,
) -> Result<()> {
    // Sent once: a first run that committed unseen emitted the event, and a second
    // would emit it again.
    let query = sqlx::query(store.sql().events.emit.sql())
        .bind(store.namespace())
        .bind(Uuid::from(id))
        .bind(token_param(token))
        .bind(name)
        .bind(data.as_ref())
        .bind(now.as_millis());
    let row = store
        .fetch_optional_once("emit", query)
        .await?
        .ok_or_else(|| Error::corrupt("emit", "no result row"))?;
    let what = || format!("job {id}");
    let held: bool = column(&row, 0, &what)?;
    let found: bool = column(&row, 1, &what)?;
    // As a completion answers (L2, L3): the lease lost, or the job unknown.
    match (held, found) {
        (true, _) => Ok(()),
        (false, true) => Err(Error::LeaseLost { id }),
        (false, false) => Err(Error::NotFound { id }),
    }
}

/// Rule V3: one statement, so one transaction (see `sql::TRIM`).
pub(crate) async fn trim_events(store: &PostgresBackend, keep: u64) -> Result<u64> {
    // Trimming twice keeps the same newest events: sent again if the connection broke
    // (the count then misses what the first run deleted).
    let row = store
        .fetch_optional_again("trim_events", || {
            sqlx::query(store.sql().events.trim.sql())
                .bind(store.namespace())
                .bind(i64::try_from(keep).unwrap_or(i64::MAX))
        })
        .await?
        .ok_or_else(|| Error::corrupt("trim_events", "no result row"))?;
    let deleted: i64 = column(&row, 0, &|| "trim_events result".to_owned())?;
    Ok(deleted.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_bind_as_the_statement_compares_them() {
        let at = EventCursor::new(7_000_000_123, 42);
        assert_eq!(xid_param(at), "7000000123");
        assert_eq!(seq_param(at), 42);
        assert_eq!(seq_param(EventCursor::new(1, u64::MAX)), i64::MAX);
        assert_eq!(xid_param(EventCursor::START), "0");
    }
}
