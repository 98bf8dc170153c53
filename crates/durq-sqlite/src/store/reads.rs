//! Reads: get, payload, children, attempts, stats, queues and list (CONTRACT A3, A4, A7).

use super::*;

/// Rule E1.
pub(crate) fn get(conn: &Connection, ns: i64, id: JobId) -> Result<Job> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobq_jobs WHERE ns = ?1 AND id = ?2"
        ))
        .db("prepare get")?;
    let mut rows = stmt.query(params![ns, id.to_bytes()]).db("read a job")?;
    match rows.next().db("read a job")? {
        Some(row) => job_from_row(row),
        None => Err(Error::NotFound { id }),
    }
}

/// Rule E1: the payload bytes.
pub(crate) fn payload(conn: &Connection, ns: i64, id: JobId) -> Result<Bytes> {
    let found: Option<Option<Vec<u8>>> = conn
        .prepare_cached(
            "SELECT p.payload FROM jobq_jobs j LEFT JOIN jobq_payloads p ON p.job = j.job
             WHERE j.ns = ?1 AND j.id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| row.get(0))
                .optional()
        })
        .db("read a payload")?;
    match found {
        None => Err(Error::NotFound { id }),
        Some(None) => Err(Error::corrupt(format!("job {id}"), "payload missing")),
        Some(Some(bytes)) => Ok(Bytes::from(bytes)),
    }
}

pub(super) fn collect_jobs(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Job>> {
    let mut stmt = conn.prepare_cached(sql).db("prepare a job query")?;
    let mut rows = stmt.query(params).db("query jobs")?;
    let mut jobs = Vec::new();
    while let Some(row) = rows.next().db("query jobs")? {
        jobs.push(job_from_row(row)?);
    }
    Ok(jobs)
}

/// Rule E8.
pub(crate) fn children(conn: &Connection, ns: i64, parent: JobId) -> Result<Vec<Job>> {
    collect_jobs(
        conn,
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobq_jobs INDEXED BY jobq_jobs_parent
             WHERE ns = ?1 AND parent = ?2 ORDER BY id"
        ),
        params![ns, parent.to_bytes()],
    )
}

/// Rules H1–H4: the job's attempts, oldest first, from one snapshot: the records of
/// the attempts that ended by `fail`, `release` or `reclaim`, and the running or
/// succeeded attempt the job's own row describes (`durq_core::attempts::history` puts
/// them together). `NotFound` for an unknown job; a value that cannot be read back is
/// a corrupt record.
pub(crate) fn attempts(conn: &Connection, ns: i64, id: JobId) -> Result<Vec<Attempt>> {
    let what = || format!("job {id}");
    let corrupt = |why: String| Error::corrupt(what(), why);
    let tx = conn.unchecked_transaction().db("begin a read")?;
    type ClaimColumns = (i64, Option<String>, i64, Option<i64>, Option<i64>);
    let found: Option<ClaimColumns> = tx
        .prepare_cached(
            "SELECT state, lease_worker, lease_token, started_at, finished_at
             FROM jobq_jobs WHERE ns = ?1 AND id = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, id.to_bytes()], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            })
            .optional()
        })
        .db("read a job's last claim")?;
    let Some((state, worker, token, started_at, finished_at)) = found else {
        return Err(Error::NotFound { id });
    };
    let state = state_from_code(state).ok_or_else(|| corrupt(format!("unknown state {state}")))?;
    let token = u64::try_from(token)
        .map_err(|_| corrupt(format!("lease_token holds {token}, out of range")))?;
    let mut ended = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT token, worker, started_at, ended_at, outcome, error
                 FROM jobq_attempts WHERE ns = ?1 AND job_id = ?2",
            )
            .db("prepare the attempts")?;
        let mut rows = stmt
            .query(params![ns, id.to_bytes()])
            .db("read the attempts")?;
        while let Some(row) = rows.next().db("read the attempts")? {
            let field = |err: rusqlite::Error| corrupt(format!("an attempt record: {err}"));
            let token: i64 = row.get(0).map_err(field)?;
            let token = u64::try_from(token)
                .map_err(|_| corrupt(format!("an attempt's token holds {token}")))?;
            let outcome: String = row.get(4).map_err(field)?;
            let outcome = outcome
                .parse::<AttemptOutcome>()
                .map_err(|err| corrupt(format!("an attempt record: {err}")))?;
            ended.push(Attempt {
                token: LeaseToken::new(token),
                worker: row.get(1).map_err(field)?,
                started_at: Timestamp::from_millis(row.get(2).map_err(field)?),
                ended_at: Some(Timestamp::from_millis(row.get(3).map_err(field)?)),
                outcome,
                error: row.get(5).map_err(field)?,
            });
        }
    }
    tx.finish().db("end a read")?;
    Ok(attempts::history(
        ended,
        LastClaim {
            state,
            worker,
            token: LeaseToken::new(token),
            started_at: millis(started_at),
            finished_at: millis(finished_at),
        },
    ))
}

/// Adds `count` jobs of state `code` to a queue's counts (queued jobs to `queued`, to be
/// split into ready and scheduled); an unknown state code is a corrupt record.
pub(super) fn count_state(
    stats: &mut QueueStats,
    queued: &mut u64,
    queue: &str,
    code: i64,
    count: i64,
) -> Result<()> {
    let count = u64::try_from(count).unwrap_or(0);
    match state_from_code(code) {
        Some(JobState::Waiting) => stats.waiting = count,
        Some(JobState::Queued) => *queued = count,
        Some(JobState::Running) => stats.running = count,
        Some(JobState::Succeeded) => stats.succeeded = count,
        Some(JobState::Dead) => stats.dead = count,
        Some(JobState::Cancelled) => stats.cancelled = count,
        None => {
            return Err(Error::corrupt(
                format!("queue {queue}"),
                format!("{count} jobs in unknown state {code}"),
            ))
        }
    }
    Ok(())
}

/// Rule A3, from one snapshot.
pub(crate) fn stats(conn: &Connection, ns: i64, queue: &str, now: Timestamp) -> Result<QueueStats> {
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let mut stats = QueueStats::default();
    let mut queued = 0u64;
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT state, COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
                 WHERE ns = ?1 AND queue = ?2 GROUP BY state",
            )
            .db("prepare stats")?;
        let mut rows = stmt.query(params![ns, queue]).db("count jobs")?;
        while let Some(row) = rows.next().db("count jobs")? {
            let code: i64 = row.get(0).db("count jobs")?;
            let count: i64 = row.get(1).db("count jobs")?;
            count_state(&mut stats, &mut queued, queue, code, count)?;
        }
    }
    let ready: i64 = tx
        .prepare_cached(
            "SELECT COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND run_at <= ?3",
        )
        .and_then(|mut stmt| stmt.query_row(params![ns, queue, now.as_millis()], |r| r.get(0)))
        .db("count ready jobs")?;
    stats.ready = u64::try_from(ready).unwrap_or(0).min(queued);
    stats.scheduled = queued - stats.ready;
    tx.finish().db("end a read")?;
    Ok(stats)
}

/// Rule A7: every queue holding a job, by name, with its counts (as [`stats`] counts
/// them) and the ready time of its oldest ready job, in one read transaction. The
/// cost follows the namespace's queues and states, then each queue's ready jobs.
pub(crate) fn queues(conn: &Connection, ns: i64, now: Timestamp) -> Result<Vec<QueueOverview>> {
    let tx = conn.unchecked_transaction().db("begin a read")?;
    // (queue, counts, queued) in name order.
    let mut found: Vec<(String, QueueStats, u64)> = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "SELECT queue, state, COUNT(*) FROM jobq_jobs INDEXED BY jobq_jobs_state
                 WHERE ns = ?1 GROUP BY queue, state ORDER BY queue",
            )
            .db("prepare the queue list")?;
        let mut rows = stmt.query(params![ns]).db("list the queues")?;
        while let Some(row) = rows.next().db("list the queues")? {
            let queue: String = row.get(0).db("list the queues")?;
            let code: i64 = row.get(1).db("list the queues")?;
            let count: i64 = row.get(2).db("list the queues")?;
            if found.last().is_none_or(|(last, _, _)| *last != queue) {
                found.push((queue.clone(), QueueStats::default(), 0));
            }
            if let Some((name, stats, queued)) = found.last_mut() {
                count_state(stats, queued, name, code, count)?;
            }
        }
    }
    let mut ready = tx
        .prepare_cached(
            "SELECT COUNT(*), MIN(run_at) FROM jobq_jobs INDEXED BY jobq_jobs_ready
             WHERE ns = ?1 AND queue = ?2 AND state = 0 AND run_at <= ?3",
        )
        .db("prepare the ready count")?;
    let mut overviews = Vec::with_capacity(found.len());
    for (queue, mut stats, queued) in found {
        let mut oldest_ready = None;
        if queued > 0 {
            let (count, oldest): (i64, Option<i64>) = ready
                .query_row(params![ns, queue, now.as_millis()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .db("count ready jobs")?;
            stats.ready = u64::try_from(count).unwrap_or(0).min(queued);
            oldest_ready = oldest.map(Timestamp::from_millis);
        }
        stats.scheduled = queued - stats.ready;
        overviews.push(QueueOverview::new(queue, stats, oldest_ready));
    }
    drop(ready);
    tx.finish().db("end a read")?;
    Ok(overviews)
}

/// The most rows one `list` call examines before it ends its page early, `next` set
/// to the last id it examined (CONTRACT A4 lets a backend bound the work of one call):
/// a filter that matches few jobs costs at most this many rows per page, and the
/// caller pages on. A page the index ranges answer alone (one queue, or a few queues
/// and states, without a tenant or tag filter) never stops early: every row they yield
/// matches, and a page holds at most 1,000.
pub(super) const LIST_EXAMINE_MAX: usize = 16_384;

/// The most (queue, state) streams one `list` call merges; a filter that would need
/// more walks the id index once instead.
pub(super) const LIST_MAX_STREAMS: usize = 32;

/// The rows of one queue in one state, newest first, from the state index alone when
/// no tenant or tag filter needs the row.
pub(super) const LIST_STATE_SQL: &str = "SELECT job, id, queue, state FROM jobq_jobs
     INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue = ?2 AND state = ?3 AND id < ?4 ORDER BY id DESC LIMIT ?5";

pub(super) const LIST_STATE_SCOPED_SQL: &str =
    "SELECT job, id, queue, state, tenant, tags FROM jobq_jobs
     INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue = ?2 AND state = ?3 AND id < ?4 ORDER BY id DESC LIMIT ?5";

/// Every row of the namespace, newest first, through the id index.
pub(super) const LIST_ALL_SQL: &str =
    "SELECT job, id, queue, state FROM jobq_jobs INDEXED BY jobq_jobs_id
     WHERE ns = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3";

pub(super) const LIST_ALL_SCOPED_SQL: &str =
    "SELECT job, id, queue, state, tenant, tags FROM jobq_jobs
     INDEXED BY jobq_jobs_id
     WHERE ns = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3";

/// The first queue name at or after `?2`, and the first after it: one index seek each.
pub(super) const FIRST_QUEUE_SQL: &str = "SELECT queue FROM jobq_jobs INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue >= ?2 ORDER BY queue LIMIT 1";

pub(super) const NEXT_QUEUE_SQL: &str = "SELECT queue FROM jobq_jobs INDEXED BY jobq_jobs_state
     WHERE ns = ?1 AND queue > ?2 ORDER BY queue LIMIT 1";

/// One stream of `list` candidates, newest first, read in chunks: each chunk is one
/// statement run to its end, so any number of streams share the cached statements.
pub(super) struct ListSource<'q> {
    stream: ListStream<'q>,
    /// Fetched and not yet merged: (row, id, whether it matches every filter).
    buffered: std::collections::VecDeque<(i64, [u8; 16], bool)>,
    /// The last id fetched (exclusive bound of the next chunk).
    below: Vec<u8>,
    /// Rows the next chunk asks for; doubles with each chunk, so a stream that gives
    /// most of a page takes few statements.
    chunk: usize,
    exhausted: bool,
}

impl ListSource<'_> {
    /// Fetches the stream's next chunk, judging each row against `query`'s filters
    /// with the durq-core matchers, so a queue prefix is compared byte for byte and a
    /// tag exactly, as the reference does (no SQL pattern, no JSON path).
    fn refill(&mut self, conn: &Connection, ns: i64, query: &ListQuery) -> Result<()> {
        let scoped = query.tenant.is_some() || !query.tags.is_empty();
        let limit = i64::try_from(self.chunk).unwrap_or(i64::MAX);
        let mut stmt;
        let mut rows = match self.stream {
            ListStream::QueueState(queue, state) => {
                let sql = if scoped {
                    LIST_STATE_SCOPED_SQL
                } else {
                    LIST_STATE_SQL
                };
                stmt = conn.prepare_cached(sql).db("prepare the list scan")?;
                stmt.query(params![ns, queue, state_code(state), self.below, limit])
            }
            ListStream::All => {
                let sql = if scoped {
                    LIST_ALL_SCOPED_SQL
                } else {
                    LIST_ALL_SQL
                };
                stmt = conn.prepare_cached(sql).db("prepare the list scan")?;
                stmt.query(params![ns, self.below, limit])
            }
        }
        .db("scan jobs to list")?;
        let mut fetched = 0usize;
        while let Some(row) = rows.next().db("scan jobs to list")? {
            fetched += 1;
            let read = |err| crate::error::db_error("read a job to list", err);
            let job: i64 = row.get(0).map_err(read)?;
            let id: [u8; 16] = row.get(1).map_err(read)?;
            let matches = list_match(row, query, scoped)
                .map_err(|why| Error::corrupt(job_subject(conn, job), why))?;
            self.buffered.push_back((job, id, matches));
            self.below.clear();
            self.below.extend_from_slice(&id);
        }
        self.exhausted = fetched < self.chunk;
        self.chunk = (self.chunk * 2).min(1024);
        Ok(())
    }
}

/// Whether a row a list scan read passes every filter of `query`; why not, when a
/// value it must judge cannot be read.
pub(super) fn list_match(
    row: &Row<'_>,
    query: &ListQuery,
    scoped: bool,
) -> std::result::Result<bool, String> {
    let text = |index: usize| -> std::result::Result<&str, String> {
        row.get_ref(index)
            .and_then(|value| value.as_str().map_err(Into::into))
            .map_err(|err| err.to_string())
    };
    let code: i64 = row.get(3).map_err(|err| err.to_string())?;
    let state = state_from_code(code).ok_or_else(|| format!("unknown state {code}"))?;
    if !(query.matches_queue(text(2)?) && query.matches_state(state)) {
        return Ok(false);
    }
    if !scoped {
        return Ok(true);
    }
    // Tags are decoded only when the query names some.
    let tags = if query.tags.is_empty() {
        Tags::new()
    } else {
        tags_from(row.get_ref(5).map_err(|err| err.to_string())?)?
    };
    Ok(query.matches_scope(text(4)?, &tags))
}

/// The queues of the namespace whose names start with `prefix` (every queue for an
/// empty one), in name order, one index seek each; `None` once there are more than
/// `cap`. Names compare as bytes in SQLite and in Rust alike, so the names with a
/// prefix are one run starting at the prefix itself.
pub(super) fn queues_with_prefix(
    conn: &Connection,
    ns: i64,
    prefix: &str,
    cap: usize,
) -> Result<Option<Vec<String>>> {
    let mut first = conn
        .prepare_cached(FIRST_QUEUE_SQL)
        .db("prepare the queue seek")?;
    let mut next = conn
        .prepare_cached(NEXT_QUEUE_SQL)
        .db("prepare the queue seek")?;
    let mut found: Vec<String> = Vec::new();
    loop {
        let queue: Option<String> = match found.last() {
            None => first.query_row(params![ns, prefix], |row| row.get(0)),
            Some(last) => next.query_row(params![ns, last], |row| row.get(0)),
        }
        .optional()
        .db("find the queues to list")?;
        match queue {
            Some(queue) if queue.starts_with(prefix) => {
                if found.len() == cap {
                    return Ok(None);
                }
                found.push(queue);
            }
            _ => return Ok(Some(found)),
        }
    }
}

/// Rule A4: the jobs matching every filter of `query`, newest first by id, after its
/// cursor, from one snapshot.
///
/// The plan: the candidates come from streams that each yield rows newest first,
/// merged by id. A queue (and any states) reads one range of the state index
/// `(ns, queue, state, id)` per state asked; no queue, with a prefix or states, finds
/// the matching queues by seeking the same index and reads one range per (queue,
/// state), up to [`LIST_MAX_STREAMS`]; every queue and every state, or more streams
/// than that, walks the id index `(ns, id)` back from the cursor once. Tenant and
/// tags are judged on the rows read (no index serves them, so enqueues keep their
/// cost). Then the page's rows, and only those, are read whole. The cursor is only a
/// bound (`id < cursor`), so it works after its job is deleted.
pub(crate) fn list(conn: &Connection, ns: i64, query: &ListQuery) -> Result<ListPage> {
    // Every id is 16 bytes; 17 bytes of 0xff sort after all of them.
    let below: Vec<u8> = match query.cursor {
        Some(id) => id.to_bytes().to_vec(),
        None => vec![0xff; 17],
    };
    let states: Vec<JobState> = JobState::ALL
        .into_iter()
        .filter(|state| query.matches_state(*state))
        .collect();
    let tx = conn.unchecked_transaction().db("begin a read")?;
    let found_queues;
    let streams: Vec<ListStream<'_>> = match (&query.queue, &query.queue_prefix) {
        (Some(queue), _) if !query.matches_queue(queue) => Vec::new(),
        (Some(queue), _) => states
            .iter()
            .map(|state| ListStream::QueueState(queue, *state))
            .collect(),
        (None, None) if query.states.is_empty() => vec![ListStream::All],
        (None, prefix) => {
            let cap = LIST_MAX_STREAMS / states.len().max(1);
            found_queues = queues_with_prefix(&tx, ns, prefix.as_deref().unwrap_or(""), cap)?;
            match &found_queues {
                Some(queues) => queues
                    .iter()
                    .flat_map(|queue| {
                        states
                            .iter()
                            .map(move |state| ListStream::QueueState(queue, *state))
                    })
                    .collect(),
                None => vec![ListStream::All],
            }
        }
    };
    let chunk = query.limit.div_ceil(streams.len().max(1)).clamp(16, 1024);
    let mut sources: Vec<ListSource<'_>> = streams
        .into_iter()
        .map(|stream| ListSource {
            stream,
            buffered: std::collections::VecDeque::new(),
            below: below.clone(),
            chunk,
            exhausted: false,
        })
        .collect();

    let mut matched: Vec<(i64, [u8; 16])> = Vec::with_capacity(query.limit.min(1024));
    let mut examined = 0usize;
    let mut last_examined = None;
    while matched.len() < query.limit && examined < LIST_EXAMINE_MAX {
        for source in &mut sources {
            if source.buffered.is_empty() && !source.exhausted {
                source.refill(&tx, ns, query)?;
            }
        }
        // The newest head of all streams; ids are unique, so there is one.
        let newest = sources
            .iter_mut()
            .filter_map(|source| {
                let id = source.buffered.front()?.1;
                Some((id, source))
            })
            .max_by_key(|(id, _)| *id);
        let Some((_, source)) = newest else { break };
        let Some((job, id, matches)) = source.buffered.pop_front() else {
            break;
        };
        examined += 1;
        last_examined = Some(id);
        if matches {
            matched.push((job, id));
        }
    }
    let more = sources
        .iter()
        .any(|source| !source.buffered.is_empty() || !source.exhausted);

    let mut jobs = Vec::with_capacity(matched.len());
    {
        let mut read = tx
            .prepare_cached(concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobq_jobs WHERE job = ?1"
            ))
            .db("prepare the list read")?;
        for (job, _) in &matched {
            let mut rows = read.query([job]).db("read a listed job")?;
            if let Some(row) = rows.next().db("read a listed job")? {
                jobs.push(job_from_row(row)?);
            }
        }
    }
    tx.finish().db("end a read")?;
    let next = if jobs.len() == query.limit {
        jobs.last().map(|job| job.id)
    } else if more {
        // The page ended at the bound of examined rows: the next one starts below the
        // last row examined.
        last_examined
            .map(|id| id_from_blob("job id", id))
            .transpose()?
    } else {
        None
    };
    Ok(ListPage { jobs, next })
}
