//! Every statement the store runs, as templates over the schema name.
//!
//! The schema is chosen at run time, so the text is rendered once per backend and
//! kept; sqlx prepares each text once per connection and reuses the plan. Every
//! value is a bind parameter, and every time is the store's clock passed in as one
//! (CONTRACT §3): no statement calls `now()` to decide anything.
//!
//! Lookups of one job bind `namespace = $1 AND id = $2` and test the job's state (and
//! lease token) inside `( … ) IS TRUE`. The wrapper changes nothing for a row (the
//! columns are never NULL) but no index can serve it, so the only index matching the
//! statement is the primary key. A bare `state = 'running'` also matches
//! `jobs_listing` (which leads with `namespace` and holds `state`) and, before
//! migration 2, the partial lease index; the jobs table is rarely analyzed (a queue
//! table turns over faster than autovacuum's thresholds, and some servers run none),
//! so the planner, guessing that few jobs are running, picked a scan of every running
//! job in the namespace and every dead index entry left behind by finished ones, per
//! lookup, and a connection keeps that plan in its prepared statement. Reclaim and
//! purge wrap their state test the same way, so only their own index (ordered by
//! expiry or finish time) serves them.
//!
//! The statements of workers' calls (claim, heartbeat, complete, fail, release,
//! reclaim, purge, and a worker's own record: put, touch, delete and reap) hold `{relax}` in their `WHERE`: an always-true condition that,
//! when the workers' commits are relaxed (`Durability::DurableEnqueues`, the
//! default), turns `synchronous_commit` off for the statement's own transaction. It
//! is an uncorrelated scalar subquery, so Postgres runs it once per statement, as a
//! one-time filter evaluated before any row is read, whether or not a row matches;
//! the commit that ends the statement's implicit transaction then does not wait for
//! the WAL flush. Enqueue, cancel, retry, the durable steps' statements (a save, a
//! reopen) and the event stream's (an emit, a trim) do not hold it and commit as the
//! server is configured.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

/// The columns of a job as `get` shows it, in the order `row::job` reads them. The
/// placement is read as its text: sqlx decodes no `jsonb` into a `String`, and
/// durq-core decodes the text. The tags are stored as text already (migration 10).
macro_rules! job_columns {
    () => {
        "id, queue, tenant, idempotency_key, priority, run_at, seq, max_attempts, parent, \
         state, attempts, lease_worker, lease_token, lease_expires_at, created_at, \
         started_at, heartbeat_at, finished_at, last_error, result, cancel_requested, \
         timeout_ms, placement::text, tags, trace_context, concurrency_key, depends_on, \
         dependency_policy"
    };
}

/// What every claim statement ends with: it leases the rows of `cand` (running, one
/// more attempt and token, the lease) and returns them with their payloads. The lease
/// goes to worker `$5` until `$6`, or, given, to the worker and until the expiry that
/// `cand`'s own columns hold for each row (a limited claim leases for several claims
/// at once, `store::limits`), on the rows that still pass `$recheck` (`AND …`, for a
/// `cand` that did not lock its rows) when written.
macro_rules! lease_candidates {
    () => {
        lease_candidates!("$5", "$6", "")
    };
    ($worker:literal, $expires:literal, $recheck:literal) => {
        concat!(
            "
UPDATE {schema}.jobs SET
    state = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
    lease_worker = ",
            $worker,
            ", lease_expires_at = ",
            $expires,
            ", started_at = $3, heartbeat_at = $3
FROM cand
WHERE namespace = $1 AND id = cand.cand_id ",
            $recheck,
            "AND {relax}
RETURNING ",
            job_columns!(),
            ", payload"
        )
    };
}

/// The per-queue probe's guard in the claim statements: `o.open` is false for a paused
/// queue `q.name` (CONTRACT Q1), and a queue with limits (K1–K5) fails the statement
/// (`refuse_limited_claim`, migration 11) so that its claim counts them
/// (`store::limits`). One key lookup per queue, in `queue_controls`, which holds both
/// (`controls!`).
macro_rules! open_queues {
    () => {
        concat!(
            "    CROSS JOIN LATERAL (",
            controls!("q.name"),
            ") o
"
        )
    };
}

/// Whether queue `$queue` of namespace `$1` is open to a claim statement: false when
/// it is paused, the statement failed when it has limits, true otherwise (no row).
///
/// Two primary-key lookups of the one row, the second made only when the first finds
/// no limits: the server knows each returns at most one row, so the plan it makes for
/// any namespace costs what the one for a given namespace does, and a prepared claim
/// keeps its generic plan (an aggregate over the row costed differently and was
/// planned anew at every run).
macro_rules! controls {
    ($queue:literal) => {
        concat!(
            "
        SELECT CASE
            WHEN (SELECT limited FROM {schema}.queue_controls
                  WHERE namespace = $1 AND queue = ",
            $queue,
            ")
            THEN {schema}.refuse_limited_claim(",
            $queue,
            ")
            ELSE (SELECT paused FROM {schema}.queue_controls
                  WHERE namespace = $1 AND queue = ",
            $queue,
            ") IS NOT TRUE
        END AS open
    "
        )
    };
}

/// The end of a statement that ends leases (`fail`, `release`, `reclaim`): `ended`,
/// the `UPDATE … RETURNING` of the jobs whose lease it ended (their id, last token,
/// worker and start, none of which the update changes), becomes one attempt record
/// each (CONTRACT H2), in the same statement, so the call costs no extra round trip
/// and the record commits with the change of state or not at all.
///
/// The record goes in slot `token % ATTEMPTS_KEPT` (`durq_core::attempts::slot`),
/// overwriting the attempt that many claims older (H3). A running row always has a
/// worker and a start; one edited by hand to lack them ends its lease as any other,
/// without a record.
macro_rules! record_attempt {
    ($ended_at:literal, $outcome:literal, $error:literal) => {
        concat!(
            "
recorded AS (
    INSERT INTO {schema}.attempts
        (namespace, job, slot, token, worker, started_at, ended_at, outcome, error)
    SELECT $1, ended.id, (ended.lease_token % {kept})::smallint, ended.lease_token,
           ended.lease_worker, ended.started_at, ",
            $ended_at,
            ", '",
            $outcome,
            "', ",
            $error,
            "
    FROM ended
    WHERE ended.lease_worker IS NOT NULL AND ended.started_at IS NOT NULL
    ON CONFLICT (namespace, job, slot) DO UPDATE SET
        token = excluded.token, worker = excluded.worker, started_at = excluded.started_at,
        ended_at = excluded.ended_at, outcome = excluded.outcome, error = excluded.error
)
"
        )
    };
}

/// What queues an ended job again as an operator's retry does (CONTRACT A2), the
/// `SET` list of an `UPDATE` of its row, ready at `$now`: attempts 0, a new `seq`, and
/// nothing of a past run left on it (its error, result, lease, start and heartbeat are
/// in its attempt history). `retry` (A2) and `retry_from` (D3) both queue a job with
/// it, so the two cannot drift apart.
macro_rules! start_over {
    ($now:literal) => {
        concat!(
            "state = 'queued', run_at = ",
            $now,
            ", seq = nextval('{schema}.seq'), attempts = 0,
    cancel_requested = false, finished_at = NULL, result = NULL,
    lease_worker = NULL, lease_expires_at = NULL, started_at = NULL,
    heartbeat_at = NULL, last_error = NULL"
        )
    };
}

/// A statement's text, rendered for one schema.
#[derive(Debug, Clone)]
pub(crate) struct Text(Arc<str>);

/// `{relax}` for relaxed workers' commits: `synchronous_commit` off until the
/// end of the current transaction (the statement's own, when it runs alone).
const RELAX: &str = "(SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL";

/// `{relax}` otherwise (`Durability::Full`): the server's setting stands.
const NO_RELAX: &str = "true";

impl Text {
    fn render(template: &str, schema: &str, relax: &str, again: &str) -> Self {
        Text(Arc::from(
            template
                .replace("{fit}", FIT)
                .replace("{again}", again)
                .replace("{schema}", schema)
                .replace("{relax}", relax)
                .replace("{kept}", &durq_core::ATTEMPTS_KEPT.to_string()),
        ))
    }

    /// The text as sqlx takes it. The schema name was validated and quoted, and every
    /// value is a bind parameter, so the text is safe.
    pub(crate) fn sql(&self) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(&self.0))
    }
}

/// Every statement, rendered for one schema.
#[derive(Debug)]
pub(crate) struct Statements {
    /// The enqueue shapes of a store that does not record events.
    pub(crate) enqueue: EnqueueStatements,
    /// The same shapes writing the job's event mark (CONTRACT V1, migration 15).
    pub(crate) enqueue_recording: EnqueueStatements,
    pub(crate) claim: Text,
    /// [`CLAIM`] of [`ONE_QUEUE`] for each limit from 1 to [`LIMITS_WRITTEN_OUT`],
    /// written out, at `limit - 1`.
    claim_one_queue: Vec<Text>,
    /// [`CLAIM`] with [`FIT`]: a claim with a budget and nothing else.
    pub(crate) claim_budgeted: Text,
    pub(crate) claim_preferring: Text,
    pub(crate) claim_reserved: Text,
    pub(crate) exists: Text,
    pub(crate) get: Text,
    /// [`MARK_AWAITED`].
    pub(crate) mark_awaited: Text,
    pub(crate) payload: Text,
    pub(crate) children: Text,
    pub(crate) attempts: Text,
    pub(crate) heartbeat: Text,
    pub(crate) heartbeat_batch: Text,
    pub(crate) complete: Text,
    /// `complete` sent again after its connection broke (see [`COMPLETE`]).
    pub(crate) complete_again: Text,
    /// [`COMPLETE_IN`]: one fenced completion in the caller's transaction.
    pub(crate) complete_in: Text,
    pub(crate) fail: Text,
    pub(crate) release: Text,
    pub(crate) reclaim: Text,
    pub(crate) cancel: Text,
    pub(crate) retry: Text,
    pub(crate) stats: Text,
    pub(crate) queues: Text,
    pub(crate) pause: Text,
    pub(crate) resume: Text,
    pub(crate) paused_queues: Text,
    pub(crate) put_schedule: Text,
    pub(crate) schedules: Text,
    pub(crate) update_schedule: Text,
    pub(crate) delete_schedule: Text,
    pub(crate) put_worker: Text,
    pub(crate) touch_worker: Text,
    pub(crate) delete_worker: Text,
    pub(crate) workers: Text,
    pub(crate) reap_workers: Text,
    /// The `list` statements, returning whole jobs.
    pub(crate) list: ListStatements,
    /// The same walks returning ids only: what bounds the rows a filtered page
    /// examines (see `PostgresBackend::list`).
    pub(crate) list_ids: ListStatements,
    pub(crate) purge: Text,
    pub(crate) bury: Text,
    #[cfg(feature = "testing")]
    pub(crate) vanish: Text,
    pub(crate) drop_namespace: Text,
    pub(crate) notify: Text,
    /// [`NOTIFY_IN`]: notices sent inside the caller's transaction.
    pub(crate) notify_in: Text,
    /// [`TABLE_SIZE`].
    pub(crate) table_size: Text,
    /// [`ANALYZE_JOBS`].
    pub(crate) analyze_jobs: Text,
    /// The statements of flow control.
    pub(crate) limits: LimitStatements,
    /// [`LOCK_DEPENDENCIES`].
    pub(crate) lock_dependencies: Text,
    /// [`START_DEPENDENTS`].
    pub(crate) start_dependents: Text,
    /// [`RECORD_EDGES`].
    pub(crate) record_edges: Text,
    /// The statements of durable steps.
    pub(crate) steps: StepStatements,
    /// The statements of the event stream.
    pub(crate) events: EventStatements,
}

impl Statements {
    /// The plain claim (no budget, no preference, no reservation) of up to `limit`
    /// jobs from `queues` queues: [`CLAIM`], written out for one queue and a limit up
    /// to [`LIMITS_WRITTEN_OUT`] (see [`ONE_QUEUE`]). Every text binds the same
    /// parameters.
    pub(crate) fn plain_claim(&self, queues: usize, limit: usize) -> &Text {
        let written_out = match (queues, limit.checked_sub(1)) {
            (1, Some(index)) => self.claim_one_queue.get(index),
            _ => None,
        };
        written_out.unwrap_or(&self.claim)
    }

    /// The enqueue shapes of a store that records events (`records_events`, CONTRACT
    /// V1) or of one that does not.
    pub(crate) fn enqueue_for(&self, records_events: bool) -> &EnqueueStatements {
        if records_events {
            &self.enqueue_recording
        } else {
            &self.enqueue
        }
    }
}

/// The three statements of `list` (CONTRACT A4), one per shape of query, each
/// selecting `{columns}`.
#[derive(Debug)]
pub(crate) struct ListStatements {
    /// [`LIST_QUEUE`]: a page of one queue.
    pub(crate) queue: Text,
    /// [`LIST_QUEUES`]: a page across the queues, by state or queue prefix.
    pub(crate) queues: Text,
    /// [`LIST_ALL`]: a page of every job.
    pub(crate) all: Text,
}

impl ListStatements {
    fn render(columns: &str, r: &impl Fn(&str) -> Text) -> Self {
        let with = |template: &str| r(&template.replace("{columns}", columns));
        ListStatements {
            queue: with(LIST_QUEUE),
            queues: with(LIST_QUEUES),
            all: with(LIST_ALL),
        }
    }
}

impl Statements {
    /// Renders every statement for `quoted_schema` (already a quoted identifier);
    /// with `relax_workers`, the workers' statements commit without waiting for the
    /// WAL flush.
    pub(crate) fn new(quoted_schema: &str, relax_workers: bool) -> Self {
        let relax = if relax_workers { RELAX } else { NO_RELAX };
        let r = |template: &str| Text::render(template, quoted_schema, relax, "false");
        Statements {
            enqueue: EnqueueStatements::render(&r, false),
            enqueue_recording: EnqueueStatements::render(&r, true),
            claim: r(&claim("", EVERY_QUEUE, "$4")),
            claim_one_queue: (1..=LIMITS_WRITTEN_OUT)
                .map(|limit| r(&claim("", ONE_QUEUE, &limit.to_string())))
                .collect(),
            claim_budgeted: r(&claim(FIT, EVERY_QUEUE, "$4")),
            claim_preferring: r(CLAIM_PREFERRING),
            claim_reserved: r(CLAIM_RESERVED),
            exists: r(EXISTS),
            get: r(GET),
            mark_awaited: r(MARK_AWAITED),
            payload: r(PAYLOAD),
            children: r(CHILDREN),
            attempts: r(ATTEMPTS),
            heartbeat: r(HEARTBEAT),
            heartbeat_batch: r(HEARTBEAT_BATCH),
            complete: r(COMPLETE),
            complete_again: Text::render(COMPLETE, quoted_schema, relax, COMPLETED_BEFORE),
            complete_in: r(COMPLETE_IN),
            fail: r(FAIL),
            release: r(RELEASE),
            reclaim: r(RECLAIM),
            cancel: r(CANCEL),
            retry: r(RETRY),
            stats: r(STATS),
            queues: r(QUEUES),
            pause: r(PAUSE),
            resume: r(RESUME),
            paused_queues: r(PAUSED_QUEUES),
            put_schedule: r(PUT_SCHEDULE),
            schedules: r(SCHEDULES),
            update_schedule: r(UPDATE_SCHEDULE),
            delete_schedule: r(DELETE_SCHEDULE),
            put_worker: r(PUT_WORKER),
            touch_worker: r(TOUCH_WORKER),
            delete_worker: r(DELETE_WORKER),
            workers: r(WORKERS),
            reap_workers: r(REAP_WORKERS),
            list: ListStatements::render(job_columns!(), &r),
            list_ids: ListStatements::render("id", &r),
            purge: r(PURGE),
            bury: r(BURY),
            #[cfg(feature = "testing")]
            vanish: r(VANISH),
            drop_namespace: r(DROP_NAMESPACE),
            notify: r(NOTIFY),
            notify_in: r(NOTIFY_IN),
            table_size: r(TABLE_SIZE),
            analyze_jobs: r(ANALYZE_JOBS),
            limits: LimitStatements::render(&r),
            lock_dependencies: r(LOCK_DEPENDENCIES),
            start_dependents: r(START_DEPENDENTS),
            record_edges: r(RECORD_EDGES),
            steps: StepStatements::render(&r),
            events: EventStatements::render(&r),
        }
    }
}

/// [`CLAIM`] with its placeholders filled: `fit` the admission test or nothing,
/// `queues` what the queues are read from, `probe_limit` the limit of each queue's probe.
fn claim(fit: &str, queues: &str, probe_limit: &str) -> String {
    CLAIM
        .replace("{fit}", fit)
        .replace("{queues}", queues)
        .replace("{probe_limit}", probe_limit)
}

// After the macros: a `macro_rules!` is in scope only below its definition.
mod admin;
mod claim;
mod enqueue;
mod events;
mod graph;
mod lease;
mod limits;
mod reads;
mod schedules;
mod steps;
mod sweep;
mod workers;

use self::admin::*;
use self::claim::*;
pub(crate) use self::enqueue::EnqueueStatements;
use self::enqueue::*;
pub(crate) use self::events::EventStatements;
use self::graph::*;
use self::lease::*;
pub(crate) use self::limits::LimitStatements;
use self::reads::*;
use self::schedules::*;
pub(crate) use self::steps::StepStatements;
use self::sweep::*;
use self::workers::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// What runs in the caller's transaction must leave its `synchronous_commit`
    /// alone: relaxing it there would relax the caller's own writes.
    #[test]
    fn statements_in_the_callers_transaction_never_relax_its_commit() {
        for relaxed in [true, false] {
            let sql = Statements::new("\"jobs\"", relaxed);
            for text in sql
                .enqueue
                .all()
                .into_iter()
                .chain(sql.enqueue_recording.all())
                .chain([&sql.complete_in, &sql.notify_in])
            {
                assert!(!text.0.contains("set_config"), "{}", text.0);
                assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
            }
        }
    }

    /// CONTRACT H4, decided: the hot path (enqueue, claim, heartbeat, complete) writes
    /// no attempt and completions keep the worker; each call that ends a lease
    /// otherwise records its attempt in its own statement, in its slot.
    /// The batched lease calls name their ids as an index condition of the scan of
    /// `jobs`, not only as a join: joined alone, a namespace whose statistics lagged its
    /// growth read every one of its rows per batch (PostgreSQL's counters in the
    /// benchmark: 141 rows read through `jobs_pkey` per completed job).
    #[test]
    fn batched_lease_calls_scan_their_ids_only() {
        let sql = Statements::new("\"jobs\"", true);
        for batched in [&sql.complete, &sql.complete_again, &sql.heartbeat_batch] {
            assert!(
                batched
                    .0
                    .contains("j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id"),
                "{}",
                batched.0
            );
        }
    }

    #[test]
    fn only_leases_ending_off_the_hot_path_write_attempts() {
        let sql = Statements::new("\"jobs\"", true);
        for hot in [
            &sql.enqueue.insert_plain,
            &sql.enqueue.insert_full,
            &sql.enqueue.checked_plain,
            &sql.enqueue.checked_full,
            &sql.enqueue_recording.insert_plain,
            &sql.enqueue_recording.insert_full,
            &sql.enqueue_recording.checked_plain,
            &sql.enqueue_recording.checked_full,
            &sql.claim,
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
            &sql.heartbeat,
            &sql.heartbeat_batch,
            &sql.complete,
            &sql.complete_again,
            &sql.complete_in,
        ] {
            assert!(!hot.0.contains("\"jobs\".attempts"), "{}", hot.0);
            assert!(!hot.0.contains("lease_worker = NULL"), "{}", hot.0);
        }
        for ending in [&sql.fail, &sql.release, &sql.reclaim] {
            assert!(
                ending.0.contains("INSERT INTO \"jobs\".attempts"),
                "{}",
                ending.0
            );
            let slot = format!("% {})::smallint", durq_core::ATTEMPTS_KEPT);
            assert!(ending.0.contains(&slot), "{}", ending.0);
        }
        for text in [
            &sql.attempts,
            &sql.fail,
            &sql.release,
            &sql.reclaim,
            &sql.list.queue,
            &sql.list.queues,
            &sql.list.all,
            &sql.list_ids.queue,
            &sql.list_ids.queues,
            &sql.list_ids.all,
            &sql.purge,
            &sql.drop_namespace,
        ] {
            assert!(!text.0.contains('{'), "a placeholder is left: {}", text.0);
        }
    }

    #[test]
    fn only_fitted_claims_test_a_budget() {
        let sql = Statements::new("\"jobs\"", true);
        assert!(!sql.claim.0.contains("placement @@"), "{}", sql.claim.0);
        for fitted in [
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
        ] {
            assert!(
                fitted
                    .0
                    .contains("placement @@ (SELECT \"jobs\".budget_admits($7::jsonb))"),
                "{}",
                fitted.0
            );
        }
        for claim in [
            &sql.claim,
            &sql.claim_budgeted,
            &sql.claim_preferring,
            &sql.claim_reserved,
        ] {
            assert!(!claim.0.contains('{'), "a placeholder is left: {}", claim.0);
        }
    }
}
