//! Opening connections and the versioned schema.
//!
//! Every table is prefixed `jobq_` and the schema version lives in `jobq_meta`, not in
//! `PRAGMA user_version`, so the queue can share a file with an application's own tables
//! and migrations.

use std::path::Path;
use std::time::{Duration, Instant};

use durq_core::{Error, Result};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use crate::config::SqliteConfig;
use crate::error::DbResultExt;

/// The migrations, in order. Entry `i` moves the schema from version `i` to `i + 1`.
/// Applied migrations are never edited: a change is a new entry.
pub(crate) const MIGRATIONS: &[&str] = &[
    // Version 1.
    //
    // `jobq_jobs.ns` is a small integer from `jobq_namespaces`, so no index repeats the
    // namespace string. Payloads live in their own table: SQLite rewrites a whole row on
    // every UPDATE, and a claim or a heartbeat must not copy a 16 MiB payload.
    // `lease_token` is the last token issued and outlives the lease, so the next claim
    // hands out a greater one (CONTRACT C6).
    r#"
    CREATE TABLE jobq_namespaces (
        id   INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE
    );

    CREATE TABLE jobq_jobs (
        job              INTEGER PRIMARY KEY,
        ns               INTEGER NOT NULL,
        id               BLOB NOT NULL,
        queue            TEXT NOT NULL,
        state            INTEGER NOT NULL,
        priority         INTEGER NOT NULL,
        run_at           INTEGER NOT NULL,
        seq              INTEGER NOT NULL,
        attempts         INTEGER NOT NULL,
        max_attempts     INTEGER NOT NULL,
        lease_token      INTEGER NOT NULL,
        lease_worker     TEXT,
        lease_expires_at INTEGER,
        cancel_requested INTEGER NOT NULL,
        created_at       INTEGER NOT NULL,
        started_at       INTEGER,
        heartbeat_at     INTEGER,
        finished_at      INTEGER,
        tenant           TEXT NOT NULL,
        idem_key         TEXT,
        parent           BLOB,
        last_error       TEXT,
        result           BLOB
    );

    -- get, payload and every lease call: one job by id.
    CREATE UNIQUE INDEX jobq_jobs_id ON jobq_jobs (ns, id);
    -- claim: the ready set of one queue in claim order (CONTRACT C3), queued jobs only.
    CREATE INDEX jobq_jobs_ready ON jobq_jobs (ns, queue, priority, run_at, seq)
        WHERE state = 0;
    -- reclaim: running jobs by lease expiry, so the cost follows the expired ones (R6).
    CREATE INDEX jobq_jobs_lease ON jobq_jobs (ns, lease_expires_at) WHERE state = 1;
    -- list (newest first by id, per state) and stats (counts per state).
    CREATE INDEX jobq_jobs_state ON jobq_jobs (ns, queue, state, id);
    -- purge: terminal jobs by the time they finished.
    CREATE INDEX jobq_jobs_finished ON jobq_jobs (ns, finished_at)
        WHERE finished_at IS NOT NULL;
    -- children: a parent's jobs, oldest first.
    CREATE INDEX jobq_jobs_parent ON jobq_jobs (ns, parent, id) WHERE parent IS NOT NULL;

    CREATE TABLE jobq_payloads (
        job     INTEGER PRIMARY KEY,
        payload BLOB NOT NULL
    );

    -- The idempotency index: (tenant, key) -> the job it made, and when (E2, E5, E6).
    CREATE TABLE jobq_dedup (
        ns         INTEGER NOT NULL,
        tenant     TEXT NOT NULL,
        key        TEXT NOT NULL,
        job_id     BLOB NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (ns, tenant, key)
    ) WITHOUT ROWID;

    INSERT INTO jobq_meta (name, value) VALUES ('seq', 0);
    "#,
    // Version 2: a job's own time limit per attempt, in milliseconds (`NewJob::timeout`).
    // Nullable, so adding it rewrites no row.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN timeout_ms INTEGER;
    "#,
    // Version 3: paused queues (CONTRACT Q1). A claim looks each named queue up here.
    r#"
    CREATE TABLE jobq_paused (
        ns    INTEGER NOT NULL,
        queue TEXT NOT NULL,
        PRIMARY KEY (ns, queue)
    ) WITHOUT ROWID;
    "#,
    // Version 4: schedules (CONTRACT S1, S2). `spec` is the definition as durq-core
    // encodes it; the store reads and writes it whole.
    r#"
    CREATE TABLE jobq_schedules (
        ns        INTEGER NOT NULL,
        name      TEXT NOT NULL,
        spec      TEXT NOT NULL,
        enabled   INTEGER NOT NULL,
        last_tick INTEGER NOT NULL,
        PRIMARY KEY (ns, name)
    ) WITHOUT ROWID;
    "#,
    // Version 5: what a job needs and where it would best run (CONTRACT F1), as the one
    // text `durq_core::fit::encode_placement` writes. NULL for a job that declares
    // neither, so adding it rewrites no row and plain jobs store nothing more. The
    // ready index gains it as a last column, so a fitted claim judges the rows it walks
    // from the index alone, as a plain claim reads them; the key order, and so every
    // plain query, is unchanged, and a plain job's entry grows by one NULL byte.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN placement TEXT;
    DROP INDEX jobq_jobs_ready;
    CREATE INDEX jobq_jobs_ready ON jobq_jobs (ns, queue, priority, run_at, seq, placement)
        WHERE state = 0;
    "#,
    // Version 6: live workers (CONTRACT W1-W4). `spec` is the description as durq-core
    // encodes it, read and written whole; `in_flight` and `last_seen` sit beside it
    // because a heartbeat changes them. Reaping walks the namespace's workers by
    // `last_seen`, so its cost follows the silent ones (W4).
    r#"
    CREATE TABLE jobq_workers (
        ns        INTEGER NOT NULL,
        id        TEXT NOT NULL,
        spec      TEXT NOT NULL,
        in_flight INTEGER NOT NULL,
        last_seen INTEGER NOT NULL,
        PRIMARY KEY (ns, id)
    ) WITHOUT ROWID;
    CREATE INDEX jobq_workers_seen ON jobq_workers (ns, last_seen);
    "#,
    // Version 7: tags (CONTRACT E11), trace context (E12) and attempts (H1-H4).
    //
    // `tags` is the text `durq_core::meta::encode_tags` writes, `trace_context` the
    // traceparent as given; both NULL for a job without them, so adding them rewrites
    // no row and a plain job stores two NULL header bytes more. No index: `list`
    // filters by tag and tenant on the rows it walks (CONTRACT A4), and an index on
    // either would be one more entry for every enqueue to write.
    //
    // `jobq_attempts` holds only the attempts that ended by `fail`, `release` or
    // `reclaim`; the running and the succeeded attempt are read from the job's own
    // row (`durq_core::attempts::history`). A job has at most `ATTEMPTS_KEPT` rows, one
    // per `slot` (`durq_core::attempts::slot` of the token), overwritten as tokens
    // wrap, so no pass trims them. Rows are keyed by the job's id, not its rowid: a
    // rowid can be reused by a later job, an id never, so a record left behind by a
    // job deleted outside this crate can never be read as another job's. Jobs of
    // older versions start their history with their next claim; one that succeeded
    // before the upgrade shows no attempt (its worker was cleared on completion then).
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN tags TEXT;
    ALTER TABLE jobq_jobs ADD COLUMN trace_context TEXT;
    CREATE TABLE jobq_attempts (
        ns         INTEGER NOT NULL,
        job_id     BLOB NOT NULL,
        slot       INTEGER NOT NULL,
        token      INTEGER NOT NULL,
        worker     TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        ended_at   INTEGER NOT NULL,
        outcome    TEXT NOT NULL,
        error      TEXT,
        PRIMARY KEY (ns, job_id, slot)
    ) WITHOUT ROWID;
    "#,
    // Version 8: flow control (CONTRACT K1-K3).
    //
    // `concurrency_key` is NULL for a job without one, so adding it rewrites no row.
    // The claim counts a key's running jobs from `jobq_jobs_running_key`, which holds
    // only running jobs that have a key: a job without one never enters it, so queues
    // that use no keys pay no index write for it. A queue's running jobs in all are
    // counted on `jobq_jobs_state` (ns, queue, state), which every job already has.
    // `jobq_limits` holds a row per queue that has limits; a claim reads its queues'
    // rows by primary key.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN concurrency_key TEXT;
    CREATE INDEX jobq_jobs_running_key ON jobq_jobs (ns, queue, concurrency_key)
        WHERE state = 1 AND concurrency_key IS NOT NULL;
    CREATE TABLE jobq_limits (
        ns                  INTEGER NOT NULL,
        queue               TEXT NOT NULL,
        max_running         INTEGER,
        max_running_per_key INTEGER,
        PRIMARY KEY (ns, queue)
    ) WITHOUT ROWID;
    "#,
    // Version 9: rate limits and fair shares (CONTRACT K4, K5).
    //
    // A rate is two columns, its starts and its window in milliseconds, both NULL for
    // none. `jobq_starts` logs the claims' starts of the queues that have a rate: `key`
    // is '' for the queue's own log (a concurrency key is never empty) and the key for
    // a key's. Starts of one instant repeat (several claims, one job started twice), so
    // the rows are plain rows under an index. A claim reads a log's newest rows by the
    // index and trims the rows that left the window, so a log holds about one window
    // of starts.
    //
    // Fair shares: `fair_shares` is 1 for a queue whose claims take its keys in turn;
    // `jobq_turns` holds, per queue and priority, the key its claims served last (''
    // for the jobs without a key). `jobq_jobs_ready_key` finds the next key with queued
    // jobs, and that key's first jobs, in one seek each; it holds only queued jobs
    // that have a key, so jobs without one never enter it. The ready index gains the
    // key as its last column, as it gained the placement in version 5: a claim that
    // reads each ready row's key (a queue with limits, the turn of a fair queue's jobs
    // without a key) reads it from the index, and a plain job's entry grows by one
    // NULL byte.
    r#"
    DROP INDEX jobq_jobs_ready;
    CREATE INDEX jobq_jobs_ready ON jobq_jobs
        (ns, queue, priority, run_at, seq, placement, concurrency_key) WHERE state = 0;
    ALTER TABLE jobq_limits ADD COLUMN fair_shares INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE jobq_turns (
        ns       INTEGER NOT NULL,
        queue    TEXT NOT NULL,
        priority INTEGER NOT NULL,
        last_key TEXT NOT NULL,
        PRIMARY KEY (ns, queue, priority)
    ) WITHOUT ROWID;
    CREATE INDEX jobq_jobs_ready_key ON jobq_jobs
        (ns, queue, priority, concurrency_key, run_at, seq)
        WHERE state = 0 AND concurrency_key IS NOT NULL;
    ALTER TABLE jobq_limits ADD COLUMN max_starts INTEGER;
    ALTER TABLE jobq_limits ADD COLUMN max_starts_ms INTEGER;
    ALTER TABLE jobq_limits ADD COLUMN max_starts_per_key INTEGER;
    ALTER TABLE jobq_limits ADD COLUMN max_starts_per_key_ms INTEGER;
    CREATE TABLE jobq_starts (
        ns    INTEGER NOT NULL,
        queue TEXT NOT NULL,
        key   TEXT NOT NULL,
        at    INTEGER NOT NULL
    );
    CREATE INDEX jobq_starts_log ON jobq_starts (ns, queue, key, at);
    "#,
    // Version 10: jobs that wait for jobs (CONTRACT G1-G5).
    //
    // A waiting job (state 5) keeps the jobs it waits for in `depends_on` (their
    // 16-byte ids, concatenated, as enqueued) and in `waiting_for` how many have not
    // settled it yet; `dependency_policy` is 1 for `run` (NULL: cancel). A job some job
    // waits for has `has_dependents = 1`, and `jobq_dependencies` holds one row per
    // (dependency, dependent) until the dependency ends and settles it. The flag lets a
    // completion tell from its own UPDATE that it has nothing to settle, so a plain
    // job's completion reads nothing more. Edges name jobs by id, never by row: a row
    // number is reused after a purge, an id never is.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN depends_on BLOB;
    ALTER TABLE jobq_jobs ADD COLUMN dependency_policy INTEGER;
    ALTER TABLE jobq_jobs ADD COLUMN waiting_for INTEGER;
    ALTER TABLE jobq_jobs ADD COLUMN has_dependents INTEGER;
    CREATE TABLE jobq_dependencies (
        ns         INTEGER NOT NULL,
        dependency BLOB NOT NULL,
        dependent  BLOB NOT NULL,
        PRIMARY KEY (ns, dependency, dependent)
    ) WITHOUT ROWID;
    "#,
    // Version 11: durable steps (CONTRACT D1-D4).
    //
    // `generation` counts a job's reopens (D3). Its default is a constant, so adding
    // it rewrites no row: an old row reads 0, and a new one stores 0 in its record
    // header alone (one byte, no body). No query of enqueue, claim or complete names
    // it, and none reads `SELECT *`.
    //
    // `jobq_steps` holds one row per saved step. Rows are keyed by the job's id, not
    // its rowid, as `jobq_attempts` is (version 7): a job rowid is reused after a
    // purge, an id never. `step` is the save order: SQLite gives a new row the rowid
    // one past the largest in the table, so a later save has a larger one, deletes
    // included (only a table that reached rowid 2^63 - 1 would draw at random, which
    // no file reaches). It is a rowid table, not WITHOUT ROWID, because an output may
    // be as large as a payload. The unique index finds a step by name (the first save
    // stands), counts a job's steps for the bound, and reaches a job's steps for
    // `steps`, `retry_from`, purge and `drop_namespace`.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE jobq_steps (
        step     INTEGER PRIMARY KEY,
        ns       INTEGER NOT NULL,
        job_id   BLOB NOT NULL,
        name     TEXT NOT NULL,
        output   BLOB NOT NULL,
        saved_at INTEGER NOT NULL,
        UNIQUE (ns, job_id, name)
    );
    "#,
    // Version 12: the event stream (CONTRACT V1-V4).
    //
    // `events_at` is not NULL on a job enqueued through a store that records events
    // (`StoreSettings::record_events`) and NULL on every other: a nullable column, so
    // adding it rewrites no row, and a job that does not record stores one NULL header
    // byte. It holds the store's instant of the job's last change of state: the enqueue
    // writes it, and every statement that changes the state moves it, for a job that
    // records, in the same statement (`events_stamp!` in `store/mod.rs`). Old rows read
    // NULL: a job enqueued before the upgrade records nothing, so a job's events are
    // whole from its enqueue (V1).
    //
    // `jobq_events` holds the stream of every namespace. `seq` is the rowid: SQLite
    // gives a new row the rowid one past the largest in the table, and a file has one
    // writer at a time (every connection, every process), so rowid order is the order
    // the rows were written and committed, and a reader's snapshot never holds an event
    // without every event numbered before it (V2). Only the largest row going could
    // make a number come again: a trim keeps at least one event of its namespace and so
    // never deletes the largest, and `drop_namespace` leaves the largest behind, in
    // namespace 0, which no store has. Not AUTOINCREMENT: its counter is read at the
    // start of every statement whose triggers may insert here (every claim and
    // completion), whether they insert or not.
    //
    // `jobq_events_trimmed` holds, per namespace, the newest `seq` a trim deleted (V3).
    //
    // The triggers that record the changes are not part of the migration: they are
    // created by the first store that opens the file recording events
    // ([`EVENT_TRIGGERS`]), so a file no such store has opened pays nothing for them.
    r#"
    ALTER TABLE jobq_jobs ADD COLUMN events_at INTEGER;
    CREATE TABLE jobq_events (
        seq         INTEGER PRIMARY KEY,
        ns          INTEGER NOT NULL,
        job_id      BLOB NOT NULL,
        queue       TEXT NOT NULL,
        kind        TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        name        TEXT,
        data        BLOB,
        recorded_at INTEGER NOT NULL
    );
    CREATE INDEX jobq_events_ns ON jobq_events (ns, seq);
    CREATE TABLE jobq_events_trimmed (
        ns      INTEGER PRIMARY KEY,
        through INTEGER NOT NULL
    );
    "#,
];

/// The event stream's triggers (CONTRACT V1), created by [`ensure_event_triggers`] when
/// a store that records events opens the file, not by a migration.
///
/// They record every change of a marked job's state in the statement that makes it, so
/// every path that writes `state` (enqueue, claim, completion, failure, release,
/// reclaim, the operator's cancel and retry, a reopen, the G3 cascade, a burial)
/// records it in the same transaction. Created only once some store records events: a
/// row trigger costs every statement that may fire it, its `WHEN` false or not (about
/// 0.8k instructions per enqueue and 3.1k per claim or completion, some 5% of what
/// SQLite spends on a job), so a file where nothing records events has none. Once
/// created they stay: a marked job may be changed by any store of any process, and
/// SQLite prepares every connection's statements again after the schema changes, so
/// those fire them too. `recorded_at` is `events_at`, the store's instant of the
/// change, not the database's clock: every SQL function call in a trigger makes SQLite
/// open a statement journal for every statement that may fire it, recording or not,
/// which cost a claim and a completion about 40% more instructions (`store/mod.rs`).
/// The time is informational and never orders (V1, decided).
pub(crate) const EVENT_TRIGGERS: &str = r#"
    -- V1: `enqueued`, whatever the job's first state.
    CREATE TRIGGER IF NOT EXISTS jobq_record_event_enqueued AFTER INSERT ON jobq_jobs
    WHEN NEW.events_at IS NOT NULL
    BEGIN
        INSERT INTO jobq_events (ns, job_id, queue, kind, attempt, recorded_at)
        VALUES (NEW.ns, NEW.id, NEW.queue, 'enqueued', NEW.attempts, NEW.events_at);
    END;
    -- V1: the kind of a change of state, exactly as `durq_core::EventKind::of_change`
    -- decides it (states: 0 queued, 1 running, 2 succeeded, 3 dead, 4 cancelled,
    -- 5 waiting). A running job queued again with fewer attempts was released, with as
    -- many it failed; a waiting one is ready; an ended one was retried. A state left as
    -- it was records nothing, nor does a move into waiting (no change makes one) or
    -- into a state this does not know: the WHEN leaves them out. The body is one plain
    -- INSERT, so the frame SQLite sets up for each firing is small, and calls no SQL
    -- function (see above).
    CREATE TRIGGER IF NOT EXISTS jobq_record_event_changed AFTER UPDATE OF state ON jobq_jobs
    WHEN NEW.events_at IS NOT NULL AND OLD.state IS NOT NEW.state
        AND NEW.state IN (0, 1, 2, 3, 4)
    BEGIN
        INSERT INTO jobq_events (ns, job_id, queue, kind, attempt, recorded_at)
        VALUES (NEW.ns, NEW.id, NEW.queue, CASE NEW.state
            WHEN 1 THEN 'started'
            WHEN 2 THEN 'succeeded'
            WHEN 3 THEN 'dead'
            WHEN 4 THEN 'cancelled'
            ELSE CASE
                WHEN OLD.state = 1 AND NEW.attempts < OLD.attempts THEN 'released'
                WHEN OLD.state = 1 THEN 'failed'
                WHEN OLD.state = 5 THEN 'ready'
                ELSE 'retried'
            END
        END, NEW.attempts, NEW.events_at);
    END;
"#;

/// Creates the event stream's triggers on the file if they are not there yet, in the
/// caller's write transaction (see [`EVENT_TRIGGERS`]).
pub(crate) fn ensure_event_triggers(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.execute_batch(EVENT_TRIGGERS)
}

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn open_connection(path: &Path, config: &SqliteConfig) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).db("open the database file")?;
    conn.busy_timeout(config.busy_timeout)
        .db("set the busy timeout")?;
    // The bundled SQLite is built with STAT4, which re-prepares a statement whenever a
    // parameter used in a range (`run_at <= ?`, `lease_expires_at < ?`) is bound anew:
    // every claim and reclaim would be parsed again. The query planner stability
    // guarantee turns that off; the hot queries name their index anyway.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .db("enable the query planner stability guarantee")?;
    Ok(conn)
}

/// Runs `f` again while another connection holds a lock that the busy handler does not
/// wait for (switching the journal mode of a new file is one), up to the busy timeout.
fn retry_busy<T>(
    timeout: Duration,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match f() {
            Err(rusqlite::Error::SqliteFailure(failure, message))
                if matches!(
                    failure.code,
                    ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(rusqlite::Error::SqliteFailure(failure, message));
                }
                // A deliberate back-off: another process is creating the file.
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// Opens the writer's connection: WAL mode, the chosen `synchronous`, then the
/// migrations.
pub(crate) fn open_writer(path: &Path, config: &SqliteConfig) -> Result<Connection> {
    let mut conn = open_connection(path, config)?;
    let mode: String = retry_busy(config.busy_timeout, || {
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
    })
    .db("switch to WAL mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Backend {
            message: format!(
                "sqlite refused WAL mode (journal_mode is {mode}); the file must be on a local file system"
            ),
            source: None,
        });
    }
    // The page cache stays at SQLite's default of 2 MiB. A B-tree rebalance parks a
    // page at the lock-byte page's number (1 GiB / page size) for a moment, so the
    // commit after one finds a page past the end of the file in the cache and scans the
    // cache's whole hash table to drop it (`pcache1TruncateUnsafe`): the larger the
    // cache, the longer every such commit. With 32 MiB that scan was a tenth of the
    // writer's time; the pages a queue touches (the heads of its indexes, the rows
    // just written) fit in the smaller cache, and the operating system caches the file.
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {};
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -2000;
         PRAGMA journal_size_limit = 67108864;",
        // Migrations are as durable as enqueues; the writer sets the mode per group.
        config.synchronous.pragma_value(true)
    ))
    .db("set the connection pragmas")?;
    conn.set_prepared_statement_cache_capacity(64);
    retry_busy(config.busy_timeout, || migrate(&mut conn))
        .map_err(|err| crate::error::db_error("apply the schema migrations", err))??;
    Ok(conn)
}

/// Opens a reader's connection. `query_only` makes a write through it an error, so a
/// mistake cannot bypass the writer's group commit.
pub(crate) fn open_reader(path: &Path, config: &SqliteConfig) -> Result<Connection> {
    let conn = open_connection(path, config)?;
    conn.execute_batch("PRAGMA query_only = 1; PRAGMA temp_store = MEMORY;")
        .db("set the reader pragmas")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Applies the missing migrations in one `BEGIN IMMEDIATE` transaction. Two processes
/// opening a new file at once serialise on the write lock; the second finds the version
/// already current and applies nothing. The outer result is SQLite's (retried while
/// busy); the inner one refuses a file from a newer build.
fn migrate(conn: &mut Connection) -> rusqlite::Result<Result<()>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS jobq_meta (
             name  TEXT PRIMARY KEY,
             value INTEGER NOT NULL
         ) WITHOUT ROWID;
         INSERT OR IGNORE INTO jobq_meta (name, value) VALUES ('schema_version', 0);",
    )?;
    let version: i64 = tx.query_row(
        "SELECT value FROM jobq_meta WHERE name = 'schema_version'",
        [],
        |row| row.get(0),
    )?;
    if version > SCHEMA_VERSION {
        return Ok(Err(Error::Backend {
            message: format!(
                "the file's job schema is version {version}, newer than this build's {SCHEMA_VERSION}; upgrade durq-sqlite"
            ),
            source: None,
        }));
    }
    let start = usize::try_from(version.max(0)).unwrap_or(0);
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(start) {
        tx.execute_batch(migration)?;
        tx.execute(
            "UPDATE jobq_meta SET value = ?1 WHERE name = 'schema_version'",
            [index as i64 + 1],
        )?;
    }
    tx.commit()?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;

    fn must<T, E: std::fmt::Display>(result: std::result::Result<T, E>, what: &str) -> T {
        match result {
            Ok(value) => value,
            Err(err) => panic!("{what}: {err}"),
        }
    }

    /// Opens the file at `path`, written by an older build, and checks that the open
    /// migrated it to this build's version (12: a new migration changes it here once).
    async fn open_upgraded(
        path: &std::path::Path,
        settings: durq_core::StoreSettings,
        what: &str,
    ) -> durq_core::Store {
        let store =
            durq_core::Store::new(must(crate::SqliteBackend::open(path, settings).await, what));
        let version: i64 = must(
            must(Connection::open(path), "reopen").query_row(
                "SELECT value FROM jobq_meta WHERE name = 'schema_version'",
                [],
                |row| row.get(0),
            ),
            "read the version",
        );
        assert_eq!((version, SCHEMA_VERSION), (12, 12), "{what}");
        store
    }

    /// A file a version 4 build wrote (its migrations as they shipped, and its jobs as
    /// its enqueue stored them) opens at version 5 (and on to the current one): its jobs keep everything and need
    /// nothing, and new jobs store their placement next to them.
    #[tokio::test]
    async fn a_version_4_file_migrates_to_5_and_keeps_its_jobs() {
        use durq_core::{
            Budget, ClaimRequest, Clock, JobId, JobState, ManualClock, Needs, NewJob, StoreSettings,
        };

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v4.db");
        let clock = ManualClock::default();
        let now = clock.now().as_millis();
        let (ready, done) = (JobId::mint(clock.now()), JobId::mint(clock.now()));
        {
            let mut conn = must(Connection::open(&path), "open");
            let tx = must(conn.transaction(), "begin");
            must(
                tx.execute_batch(
                    "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                         WITHOUT ROWID;
                     INSERT INTO jobq_meta (name, value) VALUES ('schema_version', 4);",
                ),
                "create the meta table",
            );
            for migration in &MIGRATIONS[..4] {
                must(tx.execute_batch(migration), "apply a version 4 migration");
            }
            must(
                tx.execute_batch(
                    "INSERT INTO jobq_namespaces (id, name) VALUES (1, 'default');
                     UPDATE jobq_meta SET value = 2 WHERE name = 'seq';",
                ),
                "register the namespace",
            );
            for (row, id, state, finished_at) in [(1, ready, 0, None), (2, done, 2, Some(now))] {
                must(
                    tx.execute(
                        "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at,
                             seq, attempts, max_attempts, lease_token, cancel_requested,
                             created_at, finished_at, tenant, idem_key, parent, timeout_ms)
                         VALUES (?1, 1, ?2, 'old', ?3, 7, ?4, ?1, 0, 3, 0, 0, ?4, ?5, 't',
                             'key', NULL, 1500)",
                        rusqlite::params![row, id.to_bytes(), state, now, finished_at],
                    ),
                    "insert a version 4 job",
                );
                must(
                    tx.execute(
                        "INSERT INTO jobq_payloads (job, payload) VALUES (?1, x'0102')",
                        [row],
                    ),
                    "insert a version 4 payload",
                );
            }
            must(tx.commit(), "commit");
        }

        let settings = StoreSettings::default().clock(std::sync::Arc::new(clock.clone()));
        let store = open_upgraded(&path, settings, "open").await;
        assert_eq!(SCHEMA_VERSION, 12);

        let old = must(store.get(done).await, "get the finished job");
        assert_eq!(old.state, JobState::Succeeded);
        assert_eq!((old.needs, old.locality), (Needs::new(), None));
        let old = must(store.get(ready).await, "get the queued job");
        assert_eq!(
            (old.priority, old.max_attempts, old.tenant.as_str()),
            (7, 3, "t")
        );
        assert_eq!(old.timeout, Some(std::time::Duration::from_millis(1500)));
        assert_eq!((old.needs, old.locality), (Needs::new(), None));
        assert_eq!(must(store.payload(ready).await, "payload"), &[1u8, 2][..]);

        let gpu = must(
            store
                .enqueue(
                    NewJob::new("old")
                        .needs(Needs::new().amount("gpu", 2))
                        .locality("rack-1"),
                )
                .await,
            "enqueue after the migration",
        )
        .id;
        // A budget without GPUs takes the old job (it needs nothing), never the new one.
        let ttl = std::time::Duration::from_secs(30);
        let request = ClaimRequest::new(["old"], "w", ttl)
            .limit(10)
            .budget(Budget::new().amount("gpu", 0));
        let claimed = must(store.claim(request).await, "fitted claim");
        let ids: Vec<JobId> = claimed.iter().map(|job| job.id()).collect();
        assert_eq!(ids, vec![ready]);
        let new = must(store.get(gpu).await, "get the new job");
        assert_eq!(new.needs, Needs::new().amount("gpu", 2));
        assert_eq!(new.locality.as_deref(), Some("rack-1"));
        assert_eq!(new.state, JobState::Queued);
    }

    /// A file a version 5 build wrote opens at version 6 with its schedules, pauses and
    /// jobs kept, and workers register, beat and are reaped in it.
    #[tokio::test]
    async fn a_version_5_file_migrates_to_6_and_keeps_its_records() {
        use durq_core::{Clock, JobState, ManualClock, NewJob, Store, StoreSettings, WorkerInfo};

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v5.db");
        let clock = ManualClock::default();
        let settings = || StoreSettings::default().clock(std::sync::Arc::new(clock.clone()));
        let job = {
            let store = Store::new(must(
                crate::SqliteBackend::open(&path, settings()).await,
                "open at the current version",
            ));
            must(store.pause("stopped").await, "pause");
            must(store.enqueue(NewJob::new("old")).await, "enqueue").id
        };
        // Take the file back to what a version 5 build left: no event stream (version
        // 12), no steps (version 11), no
        // dependencies (version 10), no rates (version 9), no limits or concurrency keys
        // (version 8), no attempts, tags or trace context (version 7), no workers table
        // (version 6).
        {
            let conn = must(Connection::open(&path), "reopen");
            must(
                conn.execute_batch(
                    "DROP TRIGGER IF EXISTS jobq_record_event_enqueued;
                     DROP TRIGGER IF EXISTS jobq_record_event_changed;
                     DROP TABLE jobq_events_trimmed;
                     DROP TABLE jobq_events;
                     ALTER TABLE jobq_jobs DROP COLUMN events_at;
                     DROP TABLE jobq_steps;
                     ALTER TABLE jobq_jobs DROP COLUMN generation;
                     DROP TABLE jobq_dependencies;
                     ALTER TABLE jobq_jobs DROP COLUMN has_dependents;
                     ALTER TABLE jobq_jobs DROP COLUMN waiting_for;
                     ALTER TABLE jobq_jobs DROP COLUMN dependency_policy;
                     ALTER TABLE jobq_jobs DROP COLUMN depends_on;
                     DROP TABLE jobq_starts;
                     DROP TABLE jobq_turns;
                     DROP INDEX jobq_jobs_ready_key;
                     DROP INDEX jobq_jobs_ready;
                     CREATE INDEX jobq_jobs_ready ON jobq_jobs
                         (ns, queue, priority, run_at, seq, placement) WHERE state = 0;
                     DROP TABLE jobq_limits;
                     DROP INDEX jobq_jobs_running_key;
                     ALTER TABLE jobq_jobs DROP COLUMN concurrency_key;
                     DROP TABLE jobq_attempts;
                     ALTER TABLE jobq_jobs DROP COLUMN trace_context;
                     ALTER TABLE jobq_jobs DROP COLUMN tags;
                     DROP TABLE jobq_workers;
                     UPDATE jobq_meta SET value = 5 WHERE name = 'schema_version';",
                ),
                "undo versions 12, 11, 10, 9, 8, 7 and 6",
            );
        }
        let store = open_upgraded(&path, settings(), "open the version 5 file").await;
        assert_eq!(must(store.get(job).await, "get").state, JobState::Queued);
        assert_eq!(
            must(store.paused_queues().await, "paused"),
            vec!["stopped".to_owned()]
        );

        let worker = WorkerInfo::new("w-1", "host", 7, vec!["old".to_owned()], 2);
        must(store.register_worker(&worker).await, "register");
        must(store.worker_heartbeat("w-1", 1).await, "heartbeat");
        let read = must(store.worker("w-1").await, "worker");
        assert_eq!((read.in_flight, read.last_seen), (1, clock.now()));
        clock.advance(std::time::Duration::from_secs(60));
        assert_eq!(
            must(
                store.reap_workers(std::time::Duration::from_secs(30)).await,
                "reap"
            ),
            vec!["w-1".to_owned()]
        );
        assert!(must(store.workers().await, "workers").is_empty());
    }

    /// A file a version 6 build wrote (its migrations as they shipped, its jobs as its
    /// enqueue, claim and complete left them) opens at version 7: its jobs read back
    /// without tags or trace context, a running one shows its attempt from its lease,
    /// and attempts, tags and list filters work on old and new jobs alike.
    #[tokio::test]
    async fn a_version_6_file_migrates_to_7_and_keeps_its_jobs() {
        use durq_core::{
            AttemptOutcome, Clock, JobId, JobState, LeaseToken, ListQuery, ManualClock, NewJob,
            Retry, StoreSettings, Tags,
        };

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v6.db");
        let clock = ManualClock::default();
        let now = clock.now().as_millis();
        let (queued, running, done) = (
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
        );
        {
            let mut conn = must(Connection::open(&path), "open");
            let tx = must(conn.transaction(), "begin");
            must(
                tx.execute_batch(
                    "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                         WITHOUT ROWID;
                     INSERT INTO jobq_meta (name, value) VALUES ('schema_version', 6);",
                ),
                "create the meta table",
            );
            for migration in &MIGRATIONS[..6] {
                must(tx.execute_batch(migration), "apply a version 6 migration");
            }
            must(
                tx.execute_batch(
                    "INSERT INTO jobq_namespaces (id, name) VALUES (1, 'default');
                     UPDATE jobq_meta SET value = 3 WHERE name = 'seq';",
                ),
                "register the namespace",
            );
            // A version 6 completion cleared the worker; a running job holds its lease.
            let rows = [
                (1, queued, 0, 0, None, None, None),
                (2, running, 1, 2, Some("w-old"), Some(now + 30_000), None),
                (3, done, 2, 1, None, None, Some(now)),
            ];
            for (row, id, state, token, worker, expires, finished) in rows {
                let started = (token > 0).then_some(now);
                must(
                    tx.execute(
                        "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at,
                             seq, attempts, max_attempts, lease_token, lease_worker,
                             lease_expires_at, cancel_requested, created_at, started_at,
                             heartbeat_at, finished_at, tenant)
                         VALUES (?1, 1, ?2, 'old', ?3, 0, ?4, ?1, ?5, 5, ?5, ?6, ?7, 0, ?4,
                             ?8, ?8, ?9, '')",
                        rusqlite::params![
                            row,
                            id.to_bytes(),
                            state,
                            now,
                            token,
                            worker,
                            expires,
                            started,
                            finished
                        ],
                    ),
                    "insert a version 6 job",
                );
                must(
                    tx.execute(
                        "INSERT INTO jobq_payloads (job, payload) VALUES (?1, x'01')",
                        [row],
                    ),
                    "insert a version 6 payload",
                );
            }
            must(tx.commit(), "commit");
        }

        let settings = StoreSettings::default().clock(std::sync::Arc::new(clock.clone()));
        let store = open_upgraded(&path, settings, "open").await;
        for id in [queued, running, done] {
            let job = must(store.get(id).await, "get an old job");
            assert_eq!((job.tags, job.trace_context), (Tags::new(), None));
        }
        assert!(must(store.attempts(queued).await, "attempts").is_empty());
        assert!(
            must(store.attempts(done).await, "attempts").is_empty(),
            "a job that succeeded under version 6 kept no worker, so no attempt"
        );
        let history = must(store.attempts(running).await, "attempts");
        assert_eq!(history.len(), 1);
        assert_eq!(
            (
                history[0].token,
                history[0].worker.as_str(),
                history[0].outcome
            ),
            (LeaseToken::new(2), "w-old", AttemptOutcome::Running)
        );
        clock.advance(std::time::Duration::from_millis(5));
        must(
            store
                .fail(running, LeaseToken::new(2), "old boom", Retry::Never)
                .await,
            "fail the old running job",
        );
        let history = must(store.attempts(running).await, "attempts");
        assert_eq!(
            history
                .iter()
                .map(|a| (a.token.get(), a.outcome, a.error.as_deref(), a.ended_at))
                .collect::<Vec<_>>(),
            vec![(
                2,
                AttemptOutcome::Failed,
                Some("old boom"),
                Some(clock.now())
            )]
        );

        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tagged = must(
            store
                .enqueue(
                    NewJob::new("old")
                        .tag("customer", "42")
                        .trace_context(traceparent),
                )
                .await,
            "enqueue after the migration",
        )
        .id;
        let job = must(store.get(tagged).await, "get the new job");
        assert_eq!(job.tags.get("customer").map(String::as_str), Some("42"));
        assert_eq!(job.trace_context.as_deref(), Some(traceparent));
        let by_tag = must(
            store
                .list(ListQuery::new("old").tag("customer", "42"))
                .await,
            "list by tag",
        );
        assert_eq!(
            by_tag.jobs.iter().map(|job| job.id).collect::<Vec<_>>(),
            vec![tagged]
        );
        let everything = must(store.list(ListQuery::all()).await, "list every queue");
        assert_eq!(
            everything.jobs.iter().map(|job| job.id).collect::<Vec<_>>(),
            vec![tagged, done, running, queued]
        );
        let dead = must(
            store.list(ListQuery::all().state(JobState::Dead)).await,
            "list the dead",
        );
        assert_eq!(
            dead.jobs.iter().map(|job| job.id).collect::<Vec<_>>(),
            vec![running]
        );
    }

    /// A file a version 7 build wrote (its migrations as they shipped, two jobs running
    /// and one queued, as its claim and enqueue stored them) opens at version 8: its jobs
    /// read back without a concurrency key, and limits set after the upgrade count the
    /// jobs that were running before it (CONTRACT K2), so the queued job waits until one
    /// of them ends; keyed jobs enqueue and read back.
    #[tokio::test]
    async fn a_version_7_file_migrates_to_8_and_its_running_jobs_count_against_limits() {
        use durq_core::{
            ClaimRequest, Clock, JobId, JobState, LeaseToken, ManualClock, NewJob, QueueLimits,
            StoreSettings,
        };

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v7.db");
        let clock = ManualClock::default();
        let now = clock.now().as_millis();
        let ids = [
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
        ];
        {
            let mut conn = must(Connection::open(&path), "open");
            let tx = must(conn.transaction(), "begin");
            must(
                tx.execute_batch(
                    "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                         WITHOUT ROWID;
                     INSERT INTO jobq_meta (name, value) VALUES ('schema_version', 7);",
                ),
                "create the meta table",
            );
            for migration in &MIGRATIONS[..7] {
                must(tx.execute_batch(migration), "apply a version 7 migration");
            }
            must(
                tx.execute_batch(
                    "INSERT INTO jobq_namespaces (id, name) VALUES (1, 'default');
                     INSERT OR REPLACE INTO jobq_meta (name, value) VALUES ('seq', 3);",
                ),
                "register the namespace",
            );
            // Rows 1 and 2 running under w-old's leases (token 1), row 3 queued.
            for (row, id) in (1i64..).zip(ids) {
                let running = row < 3;
                must(
                    tx.execute(
                        "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at,
                             seq, attempts, max_attempts, lease_token, lease_worker,
                             lease_expires_at, cancel_requested, created_at, started_at,
                             heartbeat_at, tenant)
                         VALUES (?1, 1, ?2, 'old', ?3, 0, ?4, ?1, ?5, 5, ?5, ?6, ?7, 0, ?4,
                             ?8, ?8, '')",
                        rusqlite::params![
                            row,
                            id.to_bytes(),
                            i64::from(running),
                            now,
                            i64::from(running),
                            running.then_some("w-old"),
                            running.then_some(now + 30_000),
                            running.then_some(now),
                        ],
                    ),
                    "insert a version 7 job",
                );
                must(
                    tx.execute(
                        "INSERT INTO jobq_payloads (job, payload) VALUES (?1, x'01')",
                        [row],
                    ),
                    "insert a version 7 payload",
                );
            }
            must(tx.commit(), "commit");
        }

        let settings = StoreSettings::default().clock(std::sync::Arc::new(clock.clone()));
        let store = open_upgraded(&path, settings, "open the version 7 file").await;
        for id in ids {
            assert_eq!(
                must(store.get(id).await, "get an old job").concurrency_key,
                None
            );
        }
        must(
            store
                .set_limits("old", QueueLimits::new().max_running(2))
                .await,
            "set limits",
        );
        let claim =
            || ClaimRequest::new(["old"], "w-new", std::time::Duration::from_secs(30)).limit(10);
        assert!(
            must(store.claim(claim()).await, "claim").is_empty(),
            "the two jobs running since before the upgrade fill the limit"
        );
        must(
            store.complete(ids[0], LeaseToken::new(1), None).await,
            "complete an old running job",
        );
        let claimed = must(store.claim(claim()).await, "claim");
        assert_eq!(
            claimed.iter().map(|job| job.id()).collect::<Vec<_>>(),
            vec![ids[2]]
        );
        let keyed = must(
            store
                .enqueue(NewJob::new("old").concurrency_key("customer-7"))
                .await,
            "enqueue a keyed job",
        )
        .id;
        let job = must(store.get(keyed).await, "get the keyed job");
        assert_eq!(job.concurrency_key.as_deref(), Some("customer-7"));
        assert_eq!(job.state, JobState::Queued);
    }

    /// A file a version 10 build wrote (its migrations as they shipped, one job running
    /// and one succeeded, as its claim and complete left them) opens at version 11: its
    /// jobs are at generation 0 with no steps, the running one saves steps under the
    /// lease it took before the upgrade, and once it succeeded it reopens from one of
    /// them, its succeeded attempt kept in its history (H3).
    #[tokio::test]
    async fn a_version_10_file_migrates_to_11_and_its_jobs_save_and_reopen_steps() {
        use durq_core::{
            AttemptOutcome, Bytes, Clock, Error, JobId, JobState, LeaseToken, ManualClock, StepLog,
            StoreSettings,
        };

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v10.db");
        let clock = ManualClock::default();
        let now = clock.now().as_millis();
        let (running, done) = (JobId::mint(clock.now()), JobId::mint(clock.now()));
        {
            let mut conn = must(Connection::open(&path), "open");
            let tx = must(conn.transaction(), "begin");
            must(
                tx.execute_batch(
                    "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                         WITHOUT ROWID;
                     INSERT INTO jobq_meta (name, value) VALUES ('schema_version', 10);",
                ),
                "create the meta table",
            );
            for migration in &MIGRATIONS[..10] {
                must(tx.execute_batch(migration), "apply a version 10 migration");
            }
            must(
                tx.execute_batch(
                    "INSERT INTO jobq_namespaces (id, name) VALUES (1, 'default');
                     INSERT OR REPLACE INTO jobq_meta (name, value) VALUES ('seq', 2);",
                ),
                "register the namespace",
            );
            // Row 1 runs under w-old's lease (token 1); row 2 succeeded under its own
            // token 1, its worker kept on the row as a version 10 completion left it.
            let rows = [
                (1, running, 1, Some(now + 30_000), None),
                (2, done, 2, None, Some(now)),
            ];
            for (row, id, state, expires, finished) in rows {
                must(
                    tx.execute(
                        "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at,
                             seq, attempts, max_attempts, lease_token, lease_worker,
                             lease_expires_at, cancel_requested, created_at, started_at,
                             heartbeat_at, finished_at, tenant)
                         VALUES (?1, 1, ?2, 'old', ?3, 0, ?4, ?1, 1, 5, 1, 'w-old', ?5, 0,
                             ?4, ?4, ?4, ?6, '')",
                        rusqlite::params![row, id.to_bytes(), state, now, expires, finished],
                    ),
                    "insert a version 10 job",
                );
                must(
                    tx.execute(
                        "INSERT INTO jobq_payloads (job, payload) VALUES (?1, x'01')",
                        [row],
                    ),
                    "insert a version 10 payload",
                );
            }
            must(tx.commit(), "commit");
        }

        let settings = StoreSettings::default().clock(std::sync::Arc::new(clock.clone()));
        let store = open_upgraded(&path, settings, "open the version 10 file").await;
        for id in [running, done] {
            assert_eq!(
                must(store.steps(id).await, "steps of an old job"),
                StepLog::default()
            );
        }

        let token = LeaseToken::new(1);
        for name in ["fetch", "charge", "email"] {
            must(
                store
                    .save_step(running, token, name, Bytes::from_static(b"out"))
                    .await,
                "save under a lease taken before the upgrade",
            );
        }
        clock.advance(std::time::Duration::from_millis(5));
        must(store.complete(running, token, None).await, "complete");
        let finished = clock.now();
        clock.advance(std::time::Duration::from_millis(5));
        must(
            store.retry_from(running, "charge", 0).await,
            "reopen the job that ran across the upgrade",
        );
        let log = must(store.steps(running).await, "steps after the reopen");
        assert_eq!(log.generation, 1);
        assert_eq!(
            log.steps
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["fetch"]
        );
        let job = must(store.get(running).await, "get the reopened job");
        assert_eq!(
            (job.state, job.attempts, job.run_at),
            (JobState::Queued, 0, clock.now())
        );
        let history = must(store.attempts(running).await, "attempts");
        assert_eq!(
            history
                .iter()
                .map(|a| (a.token.get(), a.worker.as_str(), a.outcome, a.ended_at))
                .collect::<Vec<_>>(),
            vec![(1, "w-old", AttemptOutcome::Succeeded, Some(finished))],
            "the reopen keeps the succeeded attempt"
        );

        // The job that succeeded under version 10 saved no step to reopen from.
        match store.retry_from(done, "charge", 0).await {
            Err(err) => assert_eq!(err.invalid_field(), Some("step"), "{err}"),
            Ok(()) => panic!("a job with no steps was reopened"),
        }
        assert!(matches!(
            store.retry_from(done, "charge", 1).await,
            Err(Error::StaleGeneration {
                expected: 1,
                current: 0,
                ..
            })
        ));
    }

    /// A file a version 11 build wrote (its migrations as they shipped: one job running
    /// with a job waiting for it, one queued) opens at version 12 under a store that
    /// records events. The jobs from before the upgrade carry no mark, so none of their
    /// changes is recorded, the release of the waiting job by the completion included
    /// (V1: a job's events are whole from its enqueue or absent); the running one still
    /// emits under the lease it took before the upgrade, fenced by it; a job enqueued
    /// after the upgrade records every change.
    #[tokio::test]
    async fn a_version_11_file_migrates_to_12_and_only_new_jobs_record_their_changes() {
        use durq_core::{
            Bytes, ClaimRequest, Clock, Error, EventCursor, EventKind, JobId, JobState, LeaseToken,
            ManualClock, NewJob, StoreSettings,
        };

        let dir = must(tempfile::tempdir(), "temp dir");
        let path = dir.path().join("v11.db");
        let clock = ManualClock::default();
        let now = clock.now().as_millis();
        let (running, queued, waiting) = (
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
            JobId::mint(clock.now()),
        );
        {
            let mut conn = must(Connection::open(&path), "open");
            let tx = must(conn.transaction(), "begin");
            must(
                tx.execute_batch(
                    "CREATE TABLE jobq_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
                         WITHOUT ROWID;
                     INSERT INTO jobq_meta (name, value) VALUES ('schema_version', 11);",
                ),
                "create the meta table",
            );
            for migration in &MIGRATIONS[..11] {
                must(tx.execute_batch(migration), "apply a version 11 migration");
            }
            must(
                tx.execute_batch(
                    "INSERT INTO jobq_namespaces (id, name) VALUES (1, 'default');
                     INSERT OR REPLACE INTO jobq_meta (name, value) VALUES ('seq', 3);",
                ),
                "register the namespace",
            );
            // Row 1 runs under w-old's lease (token 1) and row 3 waits for it, as a
            // version 11 enqueue and claim left them; row 2 is queued.
            let rows = [
                (1, running, 1, 1, Some(now + 30_000), Some("w-old")),
                (2, queued, 0, 0, None, None),
                (3, waiting, 5, 0, None, None),
            ];
            for (row, id, state, attempts, expires, worker) in rows {
                must(
                    tx.execute(
                        "INSERT INTO jobq_jobs (job, ns, id, queue, state, priority, run_at,
                             seq, attempts, max_attempts, lease_token, lease_worker,
                             lease_expires_at, cancel_requested, created_at, started_at,
                             heartbeat_at, tenant)
                         VALUES (?1, 1, ?2, 'old', ?3, 0, ?4, ?1, ?5, 5, ?5, ?6, ?7, 0, ?4,
                             ?4, ?4, '')",
                        rusqlite::params![
                            row,
                            id.to_bytes(),
                            state,
                            now,
                            attempts,
                            worker,
                            expires
                        ],
                    ),
                    "insert a version 11 job",
                );
                must(
                    tx.execute(
                        "INSERT INTO jobq_payloads (job, payload) VALUES (?1, x'01')",
                        [row],
                    ),
                    "insert a version 11 payload",
                );
            }
            must(
                tx.execute("UPDATE jobq_jobs SET has_dependents = 1 WHERE job = 1", []),
                "flag the running job",
            );
            must(
                tx.execute(
                    "UPDATE jobq_jobs SET depends_on = ?1, waiting_for = 1 WHERE job = 3",
                    [running.to_bytes()],
                ),
                "make the waiting job wait",
            );
            must(
                tx.execute(
                    "INSERT INTO jobq_dependencies (ns, dependency, dependent)
                     VALUES (1, ?1, ?2)",
                    [running.to_bytes(), waiting.to_bytes()],
                ),
                "record the dependency",
            );
            must(tx.commit(), "commit");
        }

        let settings = StoreSettings::default()
            .clock(std::sync::Arc::new(clock.clone()))
            .record_events(100);
        let store = open_upgraded(&path, settings, "open the version 11 file").await;
        let stream = || async {
            must(
                store.events(EventCursor::START, 100).await,
                "read the stream",
            )
        };
        assert!(stream().await.events.is_empty());

        let token = LeaseToken::new(1);
        assert!(matches!(
            store
                .emit(running, LeaseToken::new(2), "progress", Bytes::new())
                .await,
            Err(Error::LeaseLost { .. })
        ));
        must(
            store
                .emit(running, token, "progress", Bytes::from_static(b"half"))
                .await,
            "emit under a lease taken before the upgrade",
        );
        must(store.complete(running, token, None).await, "complete");
        assert_eq!(
            must(store.get(waiting).await, "get the waiting job").state,
            JobState::Queued,
            "the completion released the job waiting for it"
        );
        let claim = || ClaimRequest::new(["old"], "w-new", std::time::Duration::from_secs(30));
        assert_eq!(must(store.claim(claim().limit(2)).await, "claim").len(), 2);

        let new = must(store.enqueue(NewJob::new("old")).await, "enqueue").id;
        let claimed = must(store.claim(claim()).await, "claim the new job");
        assert_eq!(
            claimed.iter().map(|job| job.id()).collect::<Vec<_>>(),
            [new]
        );

        let page = stream().await;
        assert_eq!(
            page.events
                .iter()
                .map(|e| (e.job, e.kind, e.attempt, e.name.as_deref(), e.data.clone()))
                .collect::<Vec<_>>(),
            vec![
                (
                    running,
                    EventKind::Emitted,
                    1,
                    Some("progress"),
                    Some(Bytes::from_static(b"half"))
                ),
                (new, EventKind::Enqueued, 0, None, None),
                (new, EventKind::Started, 1, None, None),
            ]
        );
        assert_eq!(
            page.events[0].recorded_at,
            clock.now(),
            "emit is the store's clock"
        );
        assert!(page.events.windows(2).all(|w| w[0].cursor < w[1].cursor));
        assert_eq!(page.next, page.events[2].cursor);
        assert!(!page.trimmed);
    }

    #[test]
    fn the_writer_gets_the_chosen_synchronous_mode_and_wal() {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(err) => panic!("{err}"),
        };
        for (mode, expected) in [
            (Synchronous::DurableEnqueues, 2),
            (Synchronous::Full, 2),
            (Synchronous::Normal, 1),
            (Synchronous::Off, 0),
        ] {
            let config = SqliteConfig::default().synchronous(mode);
            let conn = match open_writer(&dir.path().join("sync.db"), &config) {
                Ok(conn) => conn,
                Err(err) => panic!("{err}"),
            };
            let pragma = |name: &str| -> String {
                match conn.query_row(&format!("PRAGMA {name}"), [], |row| {
                    row.get::<_, rusqlite::types::Value>(0)
                }) {
                    Ok(rusqlite::types::Value::Integer(n)) => n.to_string(),
                    Ok(rusqlite::types::Value::Text(text)) => text,
                    Ok(other) => format!("{other:?}"),
                    Err(err) => panic!("{err}"),
                }
            };
            assert_eq!(pragma("synchronous"), expected.to_string(), "{mode:?}");
            assert_eq!(pragma("journal_mode"), "wal");
        }
    }
}
