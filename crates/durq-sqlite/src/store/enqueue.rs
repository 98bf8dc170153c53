//! Enqueue (CONTRACT E1–E12, G1–G3): one job or a batch, in the writer's transaction.

use durq_core::graph::Start;

use super::*;

/// Rules E1–E7 for one job.
pub(crate) fn enqueue(
    tx: &mut WriteTx<'_>,
    ns: i64,
    settings: &StoreSettings,
    job: NewJob,
    now: Timestamp,
) -> Result<Enqueued> {
    Enqueuer::new(tx.conn())?.enqueue(tx, ns, settings, job, now, &[])
}

/// Rules E1–E7 for each job of a batch, in order, all in the caller's transaction.
pub(crate) fn enqueue_batch(
    tx: &mut WriteTx<'_>,
    ns: i64,
    settings: &StoreSettings,
    jobs: Vec<NewJob>,
    now: Timestamp,
) -> Result<Vec<Enqueued>> {
    let mut enqueuer = Enqueuer::new(tx.conn())?;
    let mut answers: Vec<Enqueued> = Vec::with_capacity(jobs.len());
    // The ids answered so far, which a later job may wait for by index (G2); kept
    // only for a batch that has dependencies.
    let mut earlier: Vec<JobId> = Vec::new();
    let graph = jobs.iter().any(|job| !job.depends_on.is_empty());
    for job in jobs {
        let answer = enqueuer.enqueue(tx, ns, settings, job, now, &earlier)?;
        if graph {
            earlier.push(answer.id);
        }
        answers.push(answer);
    }
    Ok(answers)
}

/// The statements every enqueue runs, prepared once per call rather than once per
/// job: looking a statement up in the connection's cache hashes its whole text, which
/// cost a batch of small jobs about as much as binding them. The job's insert comes in
/// two shapes, each prepared the first time a job of the call needs it.
pub(super) struct Enqueuer<'c> {
    conn: &'c Connection,
    /// [`INSERT_JOB`]: every column a new job may fill.
    insert_job: Option<CachedStatement<'c>>,
    /// [`INSERT_PLAIN_JOB`]: a job with none of the rarer fields, most jobs.
    insert_plain_job: Option<CachedStatement<'c>>,
    insert_payload: CachedStatement<'c>,
}

/// A new job's row, every column a new job may fill.
const INSERT_JOB: &str =
    "INSERT OR FAIL INTO jobq_jobs (ns, id, queue, state, priority, run_at, seq,
         attempts, max_attempts, lease_token, cancel_requested, created_at, tenant, idem_key,
         parent, timeout_ms, placement, tags, trace_context, concurrency_key, events_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
         ?18, ?19, ?20)";

/// The same row for a queued job with no key, parent, timeout, placement, tags, trace
/// context or concurrency key, from a store that does not record events: the columns
/// it leaves out are NULL either way. Nine values bound instead of twenty, which was
/// about a tenth of a microsecond each in `enqueue-one`.
const INSERT_PLAIN_JOB: &str =
    "INSERT OR FAIL INTO jobq_jobs (ns, id, queue, state, priority, run_at,
         seq, attempts, max_attempts, lease_token, cancel_requested, created_at, tenant)
     VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, 0, ?7, 0, 0, ?8, ?9)";

// `INSERT_PLAIN_JOB` writes the state as the literal 0.
const _: () = assert!(
    QUEUED == 0,
    "INSERT_PLAIN_JOB writes a queued job's state as 0"
);

/// The statement `sql` held in `slot`, prepared (looked up in the connection's cache)
/// the first time it is asked for.
fn prepared<'s, 'c>(
    conn: &'c Connection,
    slot: &'s mut Option<CachedStatement<'c>>,
    sql: &str,
) -> Result<&'s mut CachedStatement<'c>> {
    match slot {
        Some(statement) => Ok(statement),
        empty => Ok(empty.insert(conn.prepare_cached(sql).db("prepare the job insert")?)),
    }
}

impl<'c> Enqueuer<'c> {
    fn new(conn: &'c Connection) -> Result<Self> {
        // OR REPLACE: a payload row left behind by a job deleted outside this crate must
        // not block the new job that reuses its rowid.
        let insert_payload = conn
            .prepare_cached("INSERT OR REPLACE INTO jobq_payloads (job, payload) VALUES (?1, ?2)")
            .db("prepare the payload insert")?;
        Ok(Enqueuer {
            conn,
            insert_job: None,
            insert_plain_job: None,
            insert_payload,
        })
    }

    fn enqueue(
        &mut self,
        tx: &mut WriteTx<'_>,
        ns: i64,
        settings: &StoreSettings,
        mut job: NewJob,
        now: Timestamp,
        earlier: &[JobId],
    ) -> Result<Enqueued> {
        let conn = self.conn;
        if let Some(parent) = job.parent {
            if !job_exists(conn, ns, parent)? {
                return Err(Error::invalid("parent", format!("no job {parent} exists")));
            }
        }
        if let Some(key) = &job.idempotency_key {
            if let Some(id) = held_key(conn, ns, settings, &job, key, now)? {
                return Ok(Enqueued { id, created: false });
            }
        }

        // Read before anything is written: a dependency that does not exist refuses
        // the enqueue (G1).
        let dependencies = std::mem::take(&mut job.depends_on);
        let waits = match dependencies.is_empty() {
            true => None,
            false => Some(graph::plan(
                conn,
                ns,
                &dependencies,
                earlier,
                job.on_dependency_failure,
            )?),
        };

        // A job with no key, parent, dependency or rarer field, from a store that does
        // not record events, is a queued row whose other columns are all NULL: the lean
        // insert (`INSERT_PLAIN_JOB`) writes the same row.
        let plain = !job.sets_rarer_fields()
            && job.idempotency_key.is_none()
            && job.parent.is_none()
            && waits.is_none()
            && !settings.records_events();
        let id = JobId::mint(now);
        let seq = tx.next_seq()?;
        // The record is what durq-core says a new job is; the row stores it as it stands.
        let (mut job, payload) = Job::enqueued(job, id, now);
        if let Some(waits) = &waits {
            match &waits.start {
                Start::Queued => {}
                Start::Waiting(_) => job.state = JobState::Waiting,
                Start::Cancelled(_) => job.state = JobState::Cancelled,
            }
        }
        let events_at = settings.records_events().then_some(now.as_millis());
        if plain {
            prepared(conn, &mut self.insert_plain_job, INSERT_PLAIN_JOB)?
                .execute(params![
                    ns,
                    id.to_bytes(),
                    job.queue,
                    job.priority,
                    job.run_at.as_millis(),
                    seq,
                    job.max_attempts,
                    job.created_at.as_millis(),
                    job.tenant,
                ])
                .db("insert the job")?;
        } else {
            prepared(conn, &mut self.insert_job, INSERT_JOB)?
                .execute(params![
                    ns,
                    id.to_bytes(),
                    job.queue,
                    state_code(job.state),
                    job.priority,
                    job.run_at.as_millis(),
                    seq,
                    job.attempts,
                    job.max_attempts,
                    job.cancel_requested,
                    job.created_at.as_millis(),
                    job.tenant,
                    job.idempotency_key,
                    job.parent.map(JobId::to_bytes),
                    job.timeout.map(durq_core::duration_millis),
                    job.placement(),
                    encode_tags(&job.tags),
                    job.trace_context,
                    job.concurrency_key,
                    // V1: the mark the triggers of schema 12 read on this insert and
                    // every later change, the instant of the change; NULL (nothing
                    // recorded, ever) unless this store records events.
                    events_at,
                ])
                .db("insert the job")?;
        }
        let row = conn.last_insert_rowid();
        self.insert_payload
            .execute(params![row, &payload[..]])
            .db("insert the payload")?;
        if let Some(waits) = waits {
            // Only a job with dependencies writes these, so a plain enqueue binds
            // nothing more than it did before they existed.
            let (waiting_for, finished_at, error) = match &waits.start {
                Start::Queued => (None, None, None),
                Start::Waiting(count) => (Some(*count), None, None),
                Start::Cancelled(error) => (None, Some(now.as_millis()), Some(error.as_str())),
            };
            let policy = match job.on_dependency_failure {
                DependencyFailure::Cancel => None,
                DependencyFailure::Run => Some(1),
            };
            conn.prepare_cached(
                "UPDATE jobq_jobs SET depends_on = ?2, dependency_policy = ?3, waiting_for = ?4,
                     finished_at = ?5, last_error = ?6
                 WHERE job = ?1",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    row,
                    graph::ids_to_blob(&waits.ids),
                    policy,
                    waiting_for,
                    finished_at,
                    error
                ])
            })
            .db("record the job's dependencies")?;
            graph::record_edges(conn, ns, id, &waits)?;
        }
        if let Some(key) = &job.idempotency_key {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO jobq_dedup (ns, tenant, key, job_id, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![ns, job.tenant, key, id.to_bytes(), now.as_millis()])
            })
            .db("record the idempotency key")?;
        }
        if job.is_ready(now) {
            tx.wake(ns);
        }
        Ok(Enqueued { id, created: true })
    }
}

/// The job that holds `key` for `job`'s tenant now, if one does.
pub(super) fn held_key(
    conn: &Connection,
    ns: i64,
    settings: &StoreSettings,
    job: &NewJob,
    key: &str,
    now: Timestamp,
) -> Result<Option<JobId>> {
    let existing: Option<([u8; 16], i64)> = conn
        .prepare_cached(
            "SELECT job_id, created_at FROM jobq_dedup
             WHERE ns = ?1 AND tenant = ?2 AND key = ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![ns, job.tenant, key], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
        })
        .db("look the idempotency key up")?;
    let Some((id_bytes, created_at)) = existing else {
        return Ok(None);
    };
    let id = id_from_blob("idempotency record", id_bytes)?;
    // The key counts only while its window is open and its job still exists (E2, E6),
    // or, unique while active, while its job is queued or running (E10); a key whose
    // job is gone is taken over by the new job (E5).
    let holds = match job.uniqueness {
        Uniqueness::Window => {
            settings.dedup_active(Timestamp::from_millis(created_at), now)
                && job_exists(conn, ns, id)?
        }
        Uniqueness::WhileActive => job_state(conn, ns, id)?.is_some_and(JobState::is_active),
    };
    Ok(holds.then_some(id))
}
