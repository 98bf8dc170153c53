//! Stored schedules (CONTRACT S1–S3).

use super::*;

pub(crate) async fn put_schedule(
    store: &PostgresBackend,
    name: &str,
    spec: &str,
    now: Timestamp,
) -> Result<()> {
    // Storing the same definition twice changes nothing: sent again if the
    // connection broke.
    store
        .shared()
        .fetch_all_again("put_schedule", |_| {
            sqlx::query(store.sql().put_schedule.sql())
                .bind(store.namespace())
                .bind(name)
                .bind(spec)
                .bind(now.as_millis())
        })
        .await
        .map(drop)
}

pub(crate) async fn schedules(store: &PostgresBackend) -> Result<Vec<StoredSchedule>> {
    let rows = store
        .shared()
        .fetch_all_again("schedules", |_| {
            sqlx::query(store.sql().schedules.sql()).bind(store.namespace())
        })
        .await?;
    let what = || "schedule row".to_owned();
    rows.iter()
        .map(|row| {
            Ok(StoredSchedule {
                name: column(row, 0, &what)?,
                spec: column(row, 1, &what)?,
                enabled: column(row, 2, &what)?,
                last_tick: Timestamp::from_millis(column(row, 3, &what)?),
            })
        })
        .collect()
}

pub(crate) async fn update_schedule(
    store: &PostgresBackend,
    name: &str,
    update: ScheduleUpdate,
) -> Result<()> {
    // Setting a flag, or moving the last tick forward to a given instant, twice is
    // the same as once: sent again if the connection broke.
    let rows = store
        .shared()
        .fetch_all_again("update_schedule", |_| {
            sqlx::query(store.sql().update_schedule.sql())
                .bind(store.namespace())
                .bind(name)
                .bind(update.enabled)
                .bind(update.last_tick.map(Timestamp::as_millis))
        })
        .await?;
    if rows.is_empty() {
        return Err(Error::ScheduleNotFound {
            name: name.to_owned(),
        });
    }
    Ok(())
}

pub(crate) async fn delete_schedule(store: &PostgresBackend, name: &str) -> Result<bool> {
    // Sent once: a second run after a broken connection would answer `false`.
    let query = sqlx::query(store.sql().delete_schedule.sql())
        .bind(store.namespace())
        .bind(name);
    Ok(store
        .fetch_optional_once("delete_schedule", query)
        .await?
        .is_some())
}
