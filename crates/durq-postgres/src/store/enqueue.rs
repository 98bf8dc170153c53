//! Enqueueing (CONTRACT E1–E10): single calls gathered into shared statements, and
//! explicit batches, all-or-nothing.

use std::collections::HashMap;
use std::sync::Arc;

use durq_core::batch::{Batch, Limits};
use durq_core::{Enqueued, Error, JobId, NewJob, Result, StoreSettings, Timestamp, Uniqueness};
use sqlx::postgres::PgBindIterExt;
use sqlx::{Connection, PgConnection, Postgres};
use uuid::Uuid;

use crate::conn::{PgQuery, Shared};
use crate::row::{self, column};
use crate::wake;

use super::graph;

/// Most payload bytes sent in one enqueue statement. A larger batch is split into
/// several statements inside one transaction, so it stays all-or-nothing.
const MAX_STATEMENT_PAYLOAD: usize = 64 * 1024 * 1024;

/// One job of an enqueue statement, with the id the store minted for it.
struct Pending<'a> {
    id: JobId,
    job: &'a NewJob,
}

/// The answer for one job of a statement: enqueued, or its parent is unknown.
type RowAnswer = std::result::Result<Enqueued, JobId>;

/// Runs the enqueue statement over `rows`. With `whole`, an unknown parent anywhere
/// refuses the whole statement, which then writes nothing.
async fn statement<'e, E>(
    shared: &Shared,
    settings: &StoreSettings,
    executor: E,
    now: Timestamp,
    rows: &[Pending<'_>],
    whole: bool,
) -> Result<Vec<RowAnswer>>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let plain = rows.iter().all(|r| is_plain(r.job));
    if rows.iter().all(|r| is_unchecked(r.job)) {
        return insert(shared, settings, executor, now, rows, plain).await;
    }
    let shapes = shared.sql.enqueue_for(settings.records_events());
    let text = if plain {
        &shapes.checked_plain
    } else {
        &shapes.checked_full
    };
    let query = sqlx::query(text.sql())
        .bind(&settings.namespace)
        .bind(now.as_millis());
    let query = bind_identity(query, rows).bind(
        rows.iter()
            .map(|r| r.job.idempotency_key.as_deref().map(str::as_bytes))
            .bind_iter(),
    );
    let mut query = bind_schedule(query, rows, now)
        .bind(
            rows.iter()
                .map(|r| r.job.parent.map(Uuid::from))
                .bind_iter(),
        )
        .bind(now.saturating_sub(settings.dedup_window).as_millis())
        .bind(whole);
    if !plain {
        query = bind_rarer(query, rows, true);
    }
    let result = query
        .fetch_all(executor)
        .await
        .map_err(|err| shared.error("enqueue", err))?;
    if result.len() != rows.len() {
        return Err(Error::corrupt(
            "enqueue",
            format!("{} answers for {} jobs", result.len(), rows.len()),
        ));
    }
    let what = || "enqueue result row".to_owned();
    result
        .iter()
        .zip(rows)
        .map(|(row, pending)| {
            let parent_ok: bool = column(row, 3, &what)?;
            if !parent_ok {
                return Ok(Err(pending.job.parent.unwrap_or(pending.id)));
            }
            let bad_parents: i64 = column(row, 4, &what)?;
            if whole && bad_parents > 0 {
                return Err(Error::invalid(
                    "parent",
                    "a job of the batch names a parent that does not exist",
                ));
            }
            Ok(Ok(Enqueued {
                id: row::job_id(column(row, 1, &what)?)?,
                created: column(row, 2, &what)?,
            }))
        })
        .collect()
}

/// Binds the jobs' ids, queues and tenants: the first arrays of both statements.
fn bind_identity<'q>(query: PgQuery<'q>, rows: &'q [Pending<'_>]) -> PgQuery<'q> {
    query
        .bind(rows.iter().map(|r| Uuid::from(r.id)).bind_iter())
        .bind(rows.iter().map(|r| r.job.queue.as_str()).bind_iter())
        .bind(rows.iter().map(|r| r.job.tenant.as_bytes()).bind_iter())
}

/// Binds the jobs' payloads, priorities, ready times and attempts: the arrays both
/// statements take after the identity (and, in the checked one, the keys).
fn bind_schedule<'q>(query: PgQuery<'q>, rows: &'q [Pending<'_>], now: Timestamp) -> PgQuery<'q> {
    query
        .bind(rows.iter().map(|r| &r.job.payload[..]).bind_iter())
        .bind(rows.iter().map(|r| r.job.priority).bind_iter())
        .bind(
            rows.iter()
                .map(|r| r.job.run_at.unwrap_or(now).as_millis())
                .bind_iter(),
        )
        .bind(
            rows.iter()
                .map(|r| i64::from(r.job.max_attempts))
                .bind_iter(),
        )
}

/// Binds the rarer fields of the full shapes: timeout, then (for the checked
/// statement, whose keys may be unique while active) while-active, then placement,
/// tags, trace context and concurrency key.
fn bind_rarer<'q>(query: PgQuery<'q>, rows: &'q [Pending<'_>], while_active: bool) -> PgQuery<'q> {
    let query = query.bind(
        rows.iter()
            .map(|r| crate::row::timeout_param(r.job.timeout))
            .bind_iter(),
    );
    let query = if while_active {
        query.bind(
            rows.iter()
                .map(|r| r.job.uniqueness == Uniqueness::WhileActive)
                .bind_iter(),
        )
    } else {
        query
    };
    query
        .bind(rows.iter().map(|r| row::placement_param(r.job)).bind_iter())
        .bind(rows.iter().map(|r| row::tags_param(r.job)).bind_iter())
        .bind(
            rows.iter()
                .map(|r| r.job.trace_context.as_deref())
                .bind_iter(),
        )
        .bind(
            rows.iter()
                .map(|r| row::concurrency_key_param(r.job))
                .bind_iter(),
        )
}

/// Runs `sql::INSERT` over `rows`, none of which names a key or a parent: each is a
/// new job, with the id the store minted.
async fn insert<'e, E>(
    shared: &Shared,
    settings: &StoreSettings,
    executor: E,
    now: Timestamp,
    rows: &[Pending<'_>],
    plain: bool,
) -> Result<Vec<RowAnswer>>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let shapes = shared.sql.enqueue_for(settings.records_events());
    let text = if plain {
        &shapes.insert_plain
    } else {
        &shapes.insert_full
    };
    let query = sqlx::query(text.sql())
        .bind(&settings.namespace)
        .bind(now.as_millis());
    let mut query = bind_schedule(bind_identity(query, rows), rows, now);
    if !plain {
        query = bind_rarer(query, rows, false);
    }
    let done = query
        .execute(executor)
        .await
        .map_err(|err| shared.error("enqueue", err))?;
    if usize::try_from(done.rows_affected()).ok() != Some(rows.len()) {
        return Err(Error::corrupt(
            "enqueue",
            format!(
                "{} rows inserted for {} jobs",
                done.rows_affected(),
                rows.len()
            ),
        ));
    }
    Ok(rows
        .iter()
        .map(|r| {
            Ok(Enqueued {
                id: r.id,
                created: true,
            })
        })
        .collect())
}

/// Whether `job` names neither an idempotency key nor a parent, so enqueueing it
/// decides nothing: it is a new row (`sql::INSERT`).
fn is_unchecked(job: &NewJob) -> bool {
    job.idempotency_key.is_none() && job.parent.is_none()
}

/// Whether `job` leaves every field of the full statement's extra parameters unset, so
/// the plain statement stores it exactly as the full one would (`sql::ENQUEUE`).
fn is_plain(job: &NewJob) -> bool {
    !job.sets_rarer_fields() && job.uniqueness != Uniqueness::WhileActive
}

fn unknown_parent(parent: JobId) -> Error {
    Error::invalid("parent", format!("job {parent} does not exist"))
}

/// The queues that got a job ready at `now`.
fn ready_queues<'r>(
    now: Timestamp,
    rows: &'r [Pending<'_>],
    answers: &'r [RowAnswer],
) -> impl Iterator<Item = &'r str> {
    rows.iter()
        .zip(answers)
        .filter(move |(row, answer)| {
            matches!(answer, Ok(Enqueued { created: true, .. }))
                && row.job.run_at.is_none_or(|at| at <= now)
        })
        .map(|(row, _)| row.job.queue.as_str())
}

/// Wakes waiters of the queues that got a job ready now.
fn announce(
    shared: &Shared,
    settings: &StoreSettings,
    now: Timestamp,
    rows: &[Pending<'_>],
    answers: &[RowAnswer],
) {
    shared
        .wake
        .announce(&settings.namespace, ready_queues(now, rows, answers));
}

/// An explicit batch, ready to send: the jobs sent (a key repeated in the batch is
/// sent once), and for each job of the batch, the sent job whose answer is its own.
struct Plan<'a> {
    sent: Vec<Pending<'a>>,
    /// `Ok(i)`: answered by `sent[i]`; `Err(i)`: a later job with `sent[i]`'s key,
    /// answered as a second enqueue would be, with that job.
    slot: Vec<std::result::Result<usize, usize>>,
}

impl<'a> Plan<'a> {
    fn new(jobs: &'a [NewJob], now: Timestamp) -> Self {
        let mut first_of_key: HashMap<(&str, &str), usize> = HashMap::new();
        let mut sent: Vec<Pending<'_>> = Vec::with_capacity(jobs.len());
        let mut slot = Vec::with_capacity(jobs.len());
        for job in jobs {
            if let Some(key) = job.idempotency_key.as_deref() {
                if let Some(&index) = first_of_key.get(&(job.tenant.as_str(), key)) {
                    slot.push(Err(index));
                    continue;
                }
                first_of_key.insert((job.tenant.as_str(), key), sent.len());
            }
            slot.push(Ok(sent.len()));
            sent.push(Pending {
                id: JobId::mint(now),
                job,
            });
        }
        Plan { sent, slot }
    }

    /// The sent jobs cut into statements of at most [`MAX_STATEMENT_PAYLOAD`] bytes
    /// of payload (and at least one job each).
    fn chunks(&self) -> Vec<&[Pending<'a>]> {
        let sent = &self.sent;
        let mut chunks: Vec<&[Pending<'_>]> = Vec::new();
        let mut start = 0;
        let mut bytes = 0;
        for (index, row) in sent.iter().enumerate() {
            let size = row.job.payload.len();
            if index > start && bytes + size > MAX_STATEMENT_PAYLOAD {
                chunks.push(&sent[start..index]);
                start = index;
                bytes = 0;
            }
            bytes += size;
        }
        chunks.push(&sent[start..]);
        chunks
    }

    /// Each job's answer, in the batch's order, from the answers of the sent jobs.
    fn answer(self, answers: Vec<RowAnswer>) -> Result<Vec<Enqueued>> {
        let answers = answers
            .into_iter()
            .map(|answer| answer.map_err(unknown_parent))
            .collect::<Result<Vec<Enqueued>>>()?;
        self.slot
            .into_iter()
            .map(|slot| match slot {
                Ok(index) => answers.get(index).copied(),
                Err(index) => answers.get(index).map(|first| Enqueued {
                    id: first.id,
                    created: false,
                }),
            })
            .map(|answer| answer.ok_or_else(|| Error::corrupt("enqueue", "missing answer")))
            .collect()
    }
}

/// Writes the batch `jobs` on `conn`, inside a transaction or savepoint the caller
/// holds: the statements of an explicit batch, without their wake-ups. Answers each
/// job as [`enqueue_all`] does.
pub(super) async fn write_batch(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    jobs: &[NewJob],
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    let plan = Plan::new(jobs, now);
    let mut answers = Vec::with_capacity(plan.sent.len());
    for chunk in plan.chunks() {
        answers.extend(statement(shared, settings, &mut *conn, now, chunk, true).await?);
    }
    plan.answer(answers)
}

/// An explicit batch (E9): the same as enqueueing each job in order at `now`, all or
/// nothing. A batch that waits for jobs (G1, G2) takes
/// [`enqueue_graph`](super::graph::enqueue_graph) in a transaction of its own.
pub(crate) async fn enqueue_all(
    shared: &Shared,
    settings: &StoreSettings,
    jobs: &[NewJob],
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    if graph::names_dependencies(jobs) {
        let mut tx = shared.begin("enqueue: begin").await?;
        let (answers, ready) = graph::enqueue_graph(shared, settings, &mut tx, jobs, now).await?;
        tx.commit()
            .await
            .map_err(|err| shared.error("enqueue: commit", err))?;
        shared
            .wake
            .announce(&settings.namespace, ready.iter().map(String::as_str));
        return Ok(answers);
    }
    let plan = Plan::new(jobs, now);
    let answers = if let [only] = plan.chunks()[..] {
        let mut conn = shared.acquire("enqueue").await?;
        let answers = statement(shared, settings, &mut *conn, now, only, true).await?;
        shared.park(conn);
        answers
    } else {
        let mut tx = shared.begin("enqueue: begin").await?;
        let mut answers = Vec::with_capacity(plan.sent.len());
        for chunk in plan.chunks() {
            answers.extend(statement(shared, settings, &mut *tx, now, chunk, true).await?);
        }
        tx.commit()
            .await
            .map_err(|err| shared.error("enqueue: commit", err))?;
        answers
    };
    announce(shared, settings, now, &plan.sent, &answers);
    plan.answer(answers)
}

/// E9 inside the caller's transaction (CONTRACT §7, T1, T2): the jobs are written on
/// `conn` and exist once its transaction commits; their wake-ups are sent inside it,
/// so PostgreSQL delivers them at that commit and drops them at a rollback.
///
/// A refused batch writes nothing and leaves the caller's transaction usable: one
/// statement writes nothing when one of its jobs names a missing parent, and a batch
/// of several statements runs inside a savepoint of its own.
pub(crate) async fn enqueue_in(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    jobs: &[NewJob],
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    if graph::names_dependencies(jobs) {
        let mut savepoint = conn
            .begin()
            .await
            .map_err(|err| shared.error("enqueue: savepoint", err))?;
        // On an error the savepoint is dropped, which rolls back to it.
        let (answers, ready) =
            graph::enqueue_graph(shared, settings, &mut savepoint, jobs, now).await?;
        savepoint
            .commit()
            .await
            .map_err(|err| shared.error("enqueue: release savepoint", err))?;
        notify_in(shared, settings, conn, ready.iter().map(String::as_str)).await?;
        return Ok(answers);
    }
    let plan = Plan::new(jobs, now);
    let answers = if let [only] = plan.chunks()[..] {
        statement(shared, settings, &mut *conn, now, only, true).await?
    } else {
        let mut savepoint = conn
            .begin()
            .await
            .map_err(|err| shared.error("enqueue: savepoint", err))?;
        let mut answers = Vec::with_capacity(plan.sent.len());
        for chunk in plan.chunks() {
            // On an error the savepoint is dropped, which rolls back to it.
            answers.extend(statement(shared, settings, &mut *savepoint, now, chunk, true).await?);
        }
        savepoint
            .commit()
            .await
            .map_err(|err| shared.error("enqueue: release savepoint", err))?;
        answers
    };
    notify_in(
        shared,
        settings,
        conn,
        ready_queues(now, &plan.sent, &answers),
    )
    .await?;
    plan.answer(answers)
}

/// Sends the wake-ups of `queues` inside the caller's transaction (T2).
async fn notify_in<'q>(
    shared: &Shared,
    settings: &StoreSettings,
    conn: &mut PgConnection,
    queues: impl Iterator<Item = &'q str>,
) -> Result<()> {
    let mut payloads: Vec<String> = queues
        .map(|queue| wake::key(&settings.namespace, queue))
        .collect();
    payloads.sort_unstable();
    payloads.dedup();
    if !payloads.is_empty() {
        sqlx::query(shared.sql.notify_in.sql())
            .bind(shared.wake.channel())
            .bind(&payloads)
            .execute(&mut *conn)
            .await
            .map_err(|err| shared.error("enqueue: notify", err))?;
    }
    Ok(())
}

/// One `enqueue` call: the job and the instant its caller read.
pub(crate) struct Enqueue {
    pub(crate) job: NewJob,
    pub(crate) now: Timestamp,
}

/// Single enqueues of one store, gathered: concurrent callers share a statement and
/// its commit. One job's unknown parent refuses that job only.
pub(crate) struct Enqueues {
    pub(crate) shared: Arc<Shared>,
    pub(crate) settings: StoreSettings,
}

impl Batch for Enqueues {
    type Call = Enqueue;
    type Answer = Result<Enqueued>;
    /// Two calls with one key are two enqueues one after the other: the second must
    /// see the first one's job, so it waits for the next statement.
    type Key = (String, String);

    const LIMITS: Limits = Limits {
        max_calls: 1_000,
        max_bytes: 32 * 1024 * 1024,
        in_flight: 4,
        queued: 8_000,
    };

    fn key(call: &Enqueue) -> Option<(String, String)> {
        call.job
            .idempotency_key
            .as_ref()
            .map(|key| (call.job.tenant.clone(), key.clone()))
    }

    fn size(call: &Enqueue) -> usize {
        call.job.payload.len()
    }

    async fn run(&self, calls: &[Enqueue]) -> Result<Vec<Result<Enqueued>>> {
        let now = super::latest(calls.iter().map(|c| c.now));
        let rows: Vec<Pending<'_>> = calls
            .iter()
            .map(|call| Pending {
                id: JobId::mint(now),
                job: &call.job,
            })
            .collect();
        let mut conn = self.shared.acquire("enqueue").await?;
        let answers =
            statement(&self.shared, &self.settings, &mut *conn, now, &rows, false).await?;
        self.shared.park(conn);
        announce(&self.shared, &self.settings, now, &rows, &answers);
        Ok(answers
            .into_iter()
            .map(|answer| answer.map_err(unknown_parent))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use durq_core::NewJob;

    use super::{is_plain, is_unchecked};

    /// The plain statement stores NULL (or `false`) for each of the full statement's
    /// extra fields: a job setting any one of them must take the full statement, or
    /// that field would be lost. Which fields are rarer is durq-core's
    /// (`NewJob::sets_rarer_fields`, tested there); what this backend adds is
    /// uniqueness while active, and that a key judged by the window stays plain.
    #[test]
    fn a_job_setting_any_rarer_field_takes_the_full_statement() {
        let plain = NewJob::new("q").payload(&b"{}"[..]).idempotency_key("k");
        assert!(is_plain(&plain), "a key judged by the window is plain");
        assert!(!is_plain(&NewJob::new("q").unique_while_active("k")));
        assert!(!is_plain(&NewJob::new("q").timeout(Duration::from_secs(1))));
    }

    /// Only a job that decides nothing (no key to deduplicate by, no parent to find)
    /// may skip the checked statement.
    #[test]
    fn a_job_naming_a_key_or_a_parent_is_checked() {
        assert!(is_unchecked(&NewJob::new("q").payload(&b"{}"[..])));
        assert!(!is_unchecked(&NewJob::new("q").idempotency_key("k")));
        assert!(!is_unchecked(&NewJob::new("q").unique_while_active("k")));
        let parent = durq_core::JobId::mint(durq_core::Timestamp::from_millis(1));
        assert!(!is_unchecked(&NewJob::new("q").parent(parent)));
    }
}
