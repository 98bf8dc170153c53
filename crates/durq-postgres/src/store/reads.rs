//! Reads of one namespace: get, payload, children, attempts, stats, queues and list
//! (CONTRACT A3, A4, A7).

use std::time::Duration;

use durq_core::ending::Armed;

use super::*;

pub(crate) async fn get(store: &PostgresBackend, id: JobId) -> Result<Job> {
    let row = store
        .fetch_optional_again("get", || {
            sqlx::query(store.sql().get.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
        })
        .await?;
    match row {
        Some(row) => row::job(&row),
        None => Err(Error::NotFound { id }),
    }
}

/// Rules O1, O2: waits for job `id` to end. It registers the watch, starts the
/// listener and marks the row awaited (so the ending's trigger announces it) once; each
/// arming then notes the watch's counter and reads the job afresh, in a statement of
/// its own: an ending before that note is seen by the read, one after it moves the
/// counter. No poll: a notice is lost only when the listener reconnects, and its
/// reconnection moves every watch.
pub(crate) async fn wait_for_ending(
    store: &PostgresBackend,
    id: JobId,
    timeout: Duration,
) -> Result<Option<Job>> {
    let wake = &store.inner.shared.wake;
    let watch = wake.hub.watch_ending(store.namespace(), id);
    wake.ensure_listening().await;
    store
        .fetch_optional_again("mark a job awaited", || {
            sqlx::query(store.sql().mark_awaited.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
        })
        .await?;
    let watch = &watch;
    durq_core::ending::wait_until_ended(timeout, None, || {
        Box::pin(async move {
            let before = watch.seen();
            let job = get(store, id).await?;
            Ok(Armed::new(job, watch.moved_past(before)))
        })
    })
    .await
}

pub(crate) async fn payload(store: &PostgresBackend, id: JobId) -> Result<Bytes> {
    let row = store
        .fetch_optional_again("payload", || {
            sqlx::query(store.sql().payload.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
        })
        .await?;
    match row {
        Some(row) => {
            let bytes: Vec<u8> = column(&row, 0, &|| format!("job {id}"))?;
            Ok(Bytes::from(bytes))
        }
        None => Err(Error::NotFound { id }),
    }
}

pub(crate) async fn children(store: &PostgresBackend, parent: JobId) -> Result<Vec<Job>> {
    let rows = store
        .shared()
        .fetch_all_again("children", |_| {
            sqlx::query(store.sql().children.sql())
                .bind(store.namespace())
                .bind(Uuid::from(parent))
        })
        .await?;
    rows.iter().map(row::job).collect()
}

pub(crate) async fn attempts(store: &PostgresBackend, id: JobId) -> Result<Vec<Attempt>> {
    // A read: sent again if the connection broke.
    let rows = store
        .shared()
        .fetch_all_again("attempts", |_| {
            sqlx::query(store.sql().attempts.sql())
                .bind(store.namespace())
                .bind(Uuid::from(id))
        })
        .await?;
    // Every row repeats the job's own columns; none means no such job.
    let Some(first) = rows.first() else {
        return Err(Error::NotFound { id });
    };
    let last = row::last_claim(first, id)?;
    let ended = rows
        .iter()
        .filter_map(|row| row::attempt(row, id).transpose())
        .collect::<Result<Vec<Attempt>>>()?;
    Ok(history(ended, last))
}

pub(crate) async fn stats(
    store: &PostgresBackend,
    queue: &str,
    now: Timestamp,
) -> Result<QueueStats> {
    let rows = store
        .shared()
        .fetch_all_again("stats", |_| {
            sqlx::query(store.sql().stats.sql())
                .bind(store.namespace())
                .bind(queue)
                .bind(now.as_millis())
        })
        .await?;
    let what = || format!("stats of queue {queue}");
    let mut stats = QueueStats::default();
    for row in &rows {
        let state = row::state(row, 0, &what)?;
        let due: i64 = column(row, 1, &what)?;
        let total: i64 = column(row, 2, &what)?;
        count_state(&mut stats, state, due, total);
    }
    Ok(stats)
}

pub(crate) async fn queues(store: &PostgresBackend, now: Timestamp) -> Result<Vec<QueueOverview>> {
    let rows = store
        .shared()
        .fetch_all_again("queues", |_| {
            sqlx::query(store.sql().queues.sql())
                .bind(store.namespace())
                .bind(now.as_millis())
        })
        .await?;
    let mut overviews: Vec<QueueOverview> = Vec::new();
    for row in &rows {
        let queue: String = column(row, 0, &|| "queue list row".to_owned())?;
        let what = || format!("queue {queue}");
        let state = row::state(row, 1, &what)?;
        let due: i64 = column(row, 2, &what)?;
        let total: i64 = column(row, 3, &what)?;
        let oldest: Option<i64> = column(row, 4, &what)?;
        if overviews.last().is_none_or(|last| last.queue != queue) {
            overviews.push(QueueOverview::new(
                queue.clone(),
                QueueStats::default(),
                None,
            ));
        }
        let Some(overview) = overviews.last_mut() else {
            continue;
        };
        count_state(&mut overview.stats, state, due, total);
        if state == JobState::Queued {
            overview.oldest_ready = oldest.map(Timestamp::from_millis);
        }
    }
    Ok(overviews)
}

pub(crate) async fn list(store: &PostgresBackend, query: ListQuery) -> Result<ListPage> {
    let cursor = query.cursor.map_or(Uuid::max(), Uuid::from);
    // NULL binds "every tenant" and "no tag filter" (see `sql::list_filters`); the
    // default tenant is stored as the empty value, so `Some("")` binds that.
    let tenant = query.tenant.as_deref().map(str::as_bytes);
    let tags = encode_tags(&query.tags);
    let states: Vec<&str> = JobState::ALL
        .iter()
        .filter(|state| query.matches_state(**state))
        .map(|state| state.as_str())
        .collect();
    let page = ListPageQuery {
        query: &query,
        states: &states,
        cursor,
    };
    // A tenant or tag filter may pass over any number of rows before it fills a
    // page: the page then holds only the matches among the newest
    // `LIST_EXAMINE_BOUND` rows the other conditions select, and ends there with
    // `next` set (CONTRACT A4 lets a backend bound one call's work). The bound is
    // found by the same walk without the filters, reading ids only.
    let sql = store.sql();
    let mut lowest = None;
    if tenant.is_some() || tags.is_some() {
        let examined = store
            .list_rows(&sql.list_ids, &page, LIST_EXAMINE_BOUND, None, None, None)
            .await?;
        if let (LIST_EXAMINE_BOUND, Some(last)) = (examined.len(), examined.last()) {
            lowest = Some(column::<Uuid>(last, 0, &|| "list bound row".to_owned())?);
        }
    }
    let rows = store
        .list_rows(
            &sql.list,
            &page,
            query.limit,
            tenant,
            tags.as_deref(),
            lowest,
        )
        .await?;
    let jobs = rows.iter().map(row::job).collect::<Result<Vec<_>>>()?;
    let next = if jobs.len() == query.limit {
        jobs.last().map(|job| job.id)
    } else {
        // Ended at the bound: the next page starts below the rows examined.
        lowest.map(row::job_id).transpose()?
    };
    Ok(ListPage { jobs, next })
}

/// Adds one (state, due, total) row of [`crate::sql`]'s counts to a queue's counts:
/// queued jobs split into ready (due) and scheduled.
fn count_state(stats: &mut QueueStats, state: JobState, due: i64, total: i64) {
    let (due, total) = (due.unsigned_abs(), total.unsigned_abs());
    match state {
        JobState::Waiting => stats.waiting = total,
        JobState::Queued => {
            stats.ready = due;
            stats.scheduled = total.saturating_sub(due);
        }
        JobState::Running => stats.running = total,
        JobState::Succeeded => stats.succeeded = total,
        JobState::Dead => stats.dead = total,
        JobState::Cancelled => stats.cancelled = total,
    }
}

/// The most rows one `list` call with a tenant or tag filter examines (see
/// [`list`]), as many as Redis examines.
pub(super) const LIST_EXAMINE_BOUND: usize = 4096;

/// What every statement of one `list` page shares.
pub(super) struct ListPageQuery<'a> {
    query: &'a ListQuery,
    states: &'a [&'a str],
    cursor: Uuid,
}

impl PostgresBackend {
    /// One of `statements` for `page`: up to `limit` rows newest first, those of
    /// `tenant` and with `tags` (NULL: any), none below `lowest` (NULL: no bound). The
    /// statement is chosen by what the query names (see `sql::LIST_QUEUE`).
    async fn list_rows(
        &self,
        statements: &crate::sql::ListStatements,
        page: &ListPageQuery<'_>,
        limit: usize,
        tenant: Option<&[u8]>,
        tags: Option<&str>,
        lowest: Option<Uuid>,
    ) -> Result<Vec<PgRow>> {
        let query = page.query;
        let limit = limit_param(limit);
        let every_state = page.states.len() == JobState::ALL.len();
        match &query.queue {
            // A queue outside the prefix: nothing can match.
            Some(queue) if !query.matches_queue(queue) => Ok(Vec::new()),
            Some(queue) => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.queue.sql())
                            .bind(self.namespace())
                            .bind(queue)
                            .bind(page.states)
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
            // Every job: the newest first by primary key reads a page and no more.
            None if every_state && query.queue_prefix.is_none() => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.all.sql())
                            .bind(self.namespace())
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
            // Some states or some queues: per queue and state, an index range.
            None => {
                self.shared()
                    .fetch_all_again("list", |_| {
                        sqlx::query(statements.queues.sql())
                            .bind(self.namespace())
                            .bind(query.queue_prefix.as_deref())
                            .bind(page.states)
                            .bind(page.cursor)
                            .bind(limit)
                            .bind(tenant)
                            .bind(tags)
                            .bind(lowest)
                    })
                    .await
            }
        }
    }
}
