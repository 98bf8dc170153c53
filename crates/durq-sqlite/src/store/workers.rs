//! The worker registry (CONTRACT W1–W4).

use super::*;

/// Rule W1: stores worker `id` whole, its `in_flight` and `last_seen` `now`, replacing
/// any record of that id.
pub(crate) fn put_worker(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: &str,
    spec: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<()> {
    tx.conn()
        .prepare_cached(
            "INSERT INTO jobq_workers (ns, id, spec, in_flight, last_seen)
             VALUES (?1, ?2, ?3, ?5, ?4)
             ON CONFLICT (ns, id) DO UPDATE SET
                 spec = excluded.spec,
                 in_flight = excluded.in_flight,
                 last_seen = excluded.last_seen",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![ns, id, spec, now.as_millis(), i64::from(in_flight)])
        })
        .db("store a worker")
        .map(drop)
}

/// Rule W2: sets a worker's `in_flight` and `last_seen`; whether it is registered (an
/// unknown worker is not created).
pub(crate) fn touch_worker(
    tx: &mut WriteTx<'_>,
    ns: i64,
    id: &str,
    in_flight: u32,
    now: Timestamp,
) -> Result<bool> {
    tx.conn()
        .prepare_cached(
            "UPDATE jobq_workers SET in_flight = ?3, last_seen = ?4
             WHERE ns = ?1 AND id = ?2",
        )
        .and_then(|mut stmt| stmt.execute(params![ns, id, i64::from(in_flight), now.as_millis()]))
        .db("update a worker")
        .map(|changed| changed > 0)
}

/// Rule W3: whether the worker existed.
pub(crate) fn delete_worker(tx: &mut WriteTx<'_>, ns: i64, id: &str) -> Result<bool> {
    tx.conn()
        .prepare_cached("DELETE FROM jobq_workers WHERE ns = ?1 AND id = ?2")
        .and_then(|mut stmt| stmt.execute(params![ns, id]))
        .db("delete a worker")
        .map(|deleted| deleted > 0)
}

/// Rule W1: every worker of the namespace, by id. A negative or oversized `in_flight`,
/// or a value of the wrong type, is a corrupt record.
pub(crate) fn workers(conn: &Connection, ns: i64) -> Result<Vec<StoredWorker>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, spec, in_flight, last_seen FROM jobq_workers
             WHERE ns = ?1 ORDER BY id",
        )
        .db("prepare the workers")?;
    let mut rows = stmt.query([ns]).db("read the workers")?;
    let mut workers = Vec::new();
    while let Some(row) = rows.next().db("read the workers")? {
        let id: String = row.get(0).db("read a worker's id")?;
        let what = || format!("worker {id}");
        let spec: String = row
            .get(1)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        let raw: i64 = row
            .get(2)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        let in_flight = u32::try_from(raw)
            .map_err(|_| Error::corrupt(what(), format!("in_flight holds {raw}, out of range")))?;
        let last_seen: i64 = row
            .get(3)
            .map_err(|err| Error::corrupt(what(), err.to_string()))?;
        workers.push(StoredWorker {
            id,
            spec,
            in_flight,
            last_seen: Timestamp::from_millis(last_seen),
        });
    }
    Ok(workers)
}

/// Rule W4: deletes the workers last seen strictly before `cutoff`; their ids, sorted.
pub(crate) fn reap_workers(
    tx: &mut WriteTx<'_>,
    ns: i64,
    cutoff: Timestamp,
) -> Result<Vec<String>> {
    let conn = tx.conn();
    let mut ids = {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM jobq_workers INDEXED BY jobq_workers_seen
                 WHERE ns = ?1 AND last_seen < ?2",
            )
            .db("prepare the silent workers")?;
        let rows = stmt
            .query_map(params![ns, cutoff.as_millis()], |row| {
                row.get::<_, String>(0)
            })
            .db("find the silent workers")?;
        rows.collect::<rusqlite::Result<Vec<String>>>()
            .db("find the silent workers")?
    };
    if ids.is_empty() {
        return Ok(ids);
    }
    conn.prepare_cached(
        "DELETE FROM jobq_workers INDEXED BY jobq_workers_seen
         WHERE ns = ?1 AND last_seen < ?2",
    )
    .and_then(|mut stmt| stmt.execute(params![ns, cutoff.as_millis()]))
    .db("delete the silent workers")?;
    ids.sort_unstable();
    Ok(ids)
}
