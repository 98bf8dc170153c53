//! Enqueueing (CONTRACT E1–E10): single calls gathered into shared statements, and
//! explicit batches, all-or-nothing.

use std::collections::HashMap;
use std::sync::Arc;

use jobs_core::batch::{Batch, Limits};
use jobs_core::{Enqueued, Error, JobId, NewJob, Result, StoreSettings, Timestamp, Uniqueness};
use sqlx::postgres::PgBindIterExt;
use sqlx::Postgres;
use uuid::Uuid;

use crate::conn::Shared;
use crate::row::{self, column};

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
    let result = sqlx::query(shared.sql.enqueue.sql())
        .bind(&settings.namespace)
        .bind(now.as_millis())
        .bind(rows.iter().map(|r| Uuid::from(r.id)).bind_iter())
        .bind(rows.iter().map(|r| r.job.queue.as_str()).bind_iter())
        .bind(rows.iter().map(|r| r.job.tenant.as_bytes()).bind_iter())
        .bind(
            rows.iter()
                .map(|r| r.job.idempotency_key.as_deref().map(str::as_bytes))
                .bind_iter(),
        )
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
        .bind(
            rows.iter()
                .map(|r| r.job.parent.map(Uuid::from))
                .bind_iter(),
        )
        .bind(now.saturating_sub(settings.dedup_window).as_millis())
        .bind(whole)
        .bind(
            rows.iter()
                .map(|r| crate::row::timeout_param(r.job.timeout))
                .bind_iter(),
        )
        .bind(
            rows.iter()
                .map(|r| r.job.uniqueness == Uniqueness::WhileActive)
                .bind_iter(),
        )
        .bind(rows.iter().map(|r| row::placement_param(r.job)).bind_iter())
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

fn unknown_parent(parent: JobId) -> Error {
    Error::invalid("parent", format!("job {parent} does not exist"))
}

/// Wakes waiters of the queues that got a job ready now.
fn announce(
    shared: &Shared,
    settings: &StoreSettings,
    now: Timestamp,
    rows: &[Pending<'_>],
    answers: &[RowAnswer],
) {
    let ready = rows
        .iter()
        .zip(answers)
        .filter(|(row, answer)| {
            matches!(answer, Ok(Enqueued { created: true, .. }))
                && row.job.run_at.is_none_or(|at| at <= now)
        })
        .map(|(row, _)| row.job.queue.as_str());
    shared.wake.announce(&settings.namespace, ready);
}

/// An explicit batch (E9): the same as enqueueing each job in order at `now`, all or
/// nothing.
pub(crate) async fn enqueue_all(
    shared: &Shared,
    settings: &StoreSettings,
    jobs: &[NewJob],
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    // A key repeated in the batch is sent once; the later jobs answer like a second
    // enqueue would, with the first one's job.
    let mut first_of_key: HashMap<(&str, &str), usize> = HashMap::new();
    let mut sent: Vec<Pending<'_>> = Vec::with_capacity(jobs.len());
    let mut slot: Vec<std::result::Result<usize, usize>> = Vec::with_capacity(jobs.len());
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

    let answers = if let [only] = chunks[..] {
        statement(shared, settings, &shared.pool, now, only, true).await?
    } else {
        let mut tx = shared
            .pool
            .begin()
            .await
            .map_err(|err| shared.error("enqueue: begin", err))?;
        let mut answers = Vec::with_capacity(sent.len());
        for chunk in chunks {
            answers.extend(statement(shared, settings, &mut *tx, now, chunk, true).await?);
        }
        tx.commit()
            .await
            .map_err(|err| shared.error("enqueue: commit", err))?;
        answers
    };
    announce(shared, settings, now, &sent, &answers);

    let answers = answers
        .into_iter()
        .map(|answer| answer.map_err(unknown_parent))
        .collect::<Result<Vec<Enqueued>>>()?;
    slot.into_iter()
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
        let now = crate::complete::latest(calls.iter().map(|c| c.now));
        let rows: Vec<Pending<'_>> = calls
            .iter()
            .map(|call| Pending {
                id: JobId::mint(now),
                job: &call.job,
            })
            .collect();
        let answers = statement(
            &self.shared,
            &self.settings,
            &self.shared.pool,
            now,
            &rows,
            false,
        )
        .await?;
        announce(&self.shared, &self.settings, now, &rows, &answers);
        Ok(answers
            .into_iter()
            .map(|answer| answer.map_err(unknown_parent))
            .collect())
    }
}
