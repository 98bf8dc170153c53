//! Stored schedules (CONTRACT S1–S3).

use super::*;

/// Rule S1: a new schedule starts enabled at `now`; a known one keeps both.
pub(crate) fn put_schedule(
    tx: &mut WriteTx<'_>,
    ns: i64,
    name: &str,
    spec: &str,
    now: Timestamp,
) -> Result<()> {
    tx.conn()
        .prepare_cached(
            "INSERT INTO jobq_schedules (ns, name, spec, enabled, last_tick)
             VALUES (?1, ?2, ?3, 1, ?4)
             ON CONFLICT (ns, name) DO UPDATE SET spec = excluded.spec",
        )
        .and_then(|mut stmt| stmt.execute(params![ns, name, spec, now.as_millis()]))
        .db("store a schedule")
        .map(drop)
}

/// Rule S1: every schedule, by name.
pub(crate) fn schedules(conn: &Connection, ns: i64) -> Result<Vec<StoredSchedule>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT name, spec, enabled, last_tick FROM jobq_schedules
             WHERE ns = ?1 ORDER BY name",
        )
        .db("prepare the schedules")?;
    let rows = stmt
        .query_map([ns], |row| {
            Ok(StoredSchedule {
                name: row.get(0)?,
                spec: row.get(1)?,
                enabled: row.get::<_, i64>(2)? != 0,
                last_tick: Timestamp::from_millis(row.get(3)?),
            })
        })
        .db("read the schedules")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .db("read the schedules")
}

/// Rule S2: only what `update` sets changes; the last tick only moves forward.
pub(crate) fn update_schedule(
    tx: &mut WriteTx<'_>,
    ns: i64,
    name: &str,
    update: ScheduleUpdate,
) -> Result<()> {
    let changed = tx
        .conn()
        .prepare_cached(
            "UPDATE jobq_schedules SET
                 enabled = COALESCE(?3, enabled),
                 last_tick = MAX(last_tick, COALESCE(?4, last_tick))
             WHERE ns = ?1 AND name = ?2",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                ns,
                name,
                update.enabled.map(i64::from),
                update.last_tick.map(Timestamp::as_millis)
            ])
        })
        .db("update a schedule")?;
    if changed == 0 {
        return Err(Error::ScheduleNotFound {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Rule S1: whether the schedule existed.
pub(crate) fn delete_schedule(tx: &mut WriteTx<'_>, ns: i64, name: &str) -> Result<bool> {
    tx.conn()
        .prepare_cached("DELETE FROM jobq_schedules WHERE ns = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, name]))
        .db("delete a schedule")
        .map(|deleted| deleted > 0)
}
