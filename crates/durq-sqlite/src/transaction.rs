//! Jobs written inside the caller's own write transaction on the store's file
//! (CONTRACT §7): the caller's rows and the jobs commit together or not at all.
//!
//! The operations are the writer thread's own (`store`), run over a [`WriteTx`] built on
//! the caller's transaction instead of a group's, so an enqueue or a completion here
//! keeps every rule it keeps through the writer.

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use durq_core::transaction::{prepare_batch, prepare_complete, prepare_enqueue};
use durq_core::{
    Bytes, Enqueued, Error, FencedCompletion, JobId, LeaseToken, NewJob, Result, StoreSettings,
};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::config::SqliteConfig;
use crate::engine::{
    in_savepoint, lost_transaction, write_seq, SeqCounter, Wakers, Wakes, WriteTx,
};
use crate::error::DbResultExt;
use crate::store;

/// Opens a connection on `path` set up as the store's writer connection is, where it
/// matters to the caller's transactions: the same busy timeout, the query planner
/// stability guarantee the hot queries are prepared under, and room in the statement
/// cache for the store's statements. WAL mode is a property of the file, already set.
pub(crate) fn open_connection(path: &Path, config: &SqliteConfig) -> Result<Connection> {
    // Only an existing file: a caller's connection on a path with no store behind it
    // would otherwise create an empty database there.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).db("open the database file")?;
    conn.busy_timeout(config.busy_timeout)
        .db("set the busy timeout")?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .db("enable the query planner stability guarantee")?;
    conn.execute_batch("PRAGMA temp_store = MEMORY;")
        .db("set the connection pragmas")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// What a transaction needs of its store.
pub(crate) struct Owner<'s> {
    pub(crate) ns: i64,
    pub(crate) settings: &'s Arc<StoreSettings>,
    pub(crate) wakers: &'s Arc<Wakers>,
    pub(crate) path: &'s Path,
    pub(crate) config: &'s SqliteConfig,
}

/// Begins a store transaction on `conn`; see [`crate::SqliteBackend::transaction`].
pub(crate) fn begin<'c>(
    owner: Owner<'_>,
    conn: &'c mut Connection,
) -> Result<SqliteTransaction<'c>> {
    same_file(conn, owner.path)?;
    if !conn.is_autocommit() {
        // BEGIN would fail anyway; `synchronous` cannot be changed inside a transaction.
        return Err(Error::invalid(
            "connection",
            "the connection is already inside a transaction",
        ));
    }
    // Set before BEGIN: SQLite ignores a change inside a transaction. A transaction that
    // may enqueue is synced as an enqueue through the writer is (CONTRACT T4).
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}",
        owner.config.synchronous.pragma_value(true)
    ))
    .db("set synchronous")?;
    // IMMEDIATE takes the write lock now, before the first read: the dedup lookups and
    // lease checks inside then see the file as it stands until the commit, and every
    // other writer (the store's writer thread, other processes, other transactions)
    // waits for this one to end.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .db("begin a write transaction")?;
    Ok(SqliteTransaction {
        tx,
        ns: owner.ns,
        settings: owner.settings.clone(),
        wakers: owner.wakers.clone(),
        seq: SeqCounter::default(),
        wakes: Wakes::default(),
        spoiled: None,
    })
}

/// Refuses a connection on another file than the store's: its jobs would be written to
/// a file no store of this one reads.
fn same_file(conn: &Connection, store_path: &Path) -> Result<()> {
    let other = |why: String| Err(Error::invalid("connection", why));
    let Some(path) = conn.path().filter(|path| !path.is_empty()) else {
        return other(
            "the connection is on an in-memory or temporary database, not the store's file"
                .to_owned(),
        );
    };
    let resolve = |path: &Path| {
        std::fs::canonicalize(path)
            .map_err(|err| Error::unavailable(format!("resolve {}", path.display()), err))
    };
    let (theirs, ours) = (resolve(Path::new(path))?, resolve(store_path)?);
    if theirs != ours {
        return other(format!(
            "the connection is on {}, not on the store's file {}",
            theirs.display(),
            ours.display()
        ));
    }
    Ok(())
}

/// A write transaction on the caller's own connection to the store's file, in which the
/// caller's own statements, enqueues and fenced completions commit together or not at
/// all (CONTRACT §7). Begun by [`crate::SqliteBackend::transaction`].
///
/// It dereferences to the [`rusqlite::Transaction`], so the caller runs their own SQL
/// with `tx.execute(..)` and friends. The methods block like any rusqlite call: from
/// async code, run the whole transaction in `tokio::task::spawn_blocking`.
///
/// The transaction holds the file's write lock from its start (`BEGIN IMMEDIATE`) to its
/// end, so keep it short: every other writer waits, the store's own writer thread
/// included (up to [`SqliteConfig::busy_timeout`], then its calls fail with
/// `Unavailable`). Do not await the store's write calls while holding it; its reads
/// are fine and see the file as it was before the transaction.
///
/// A completion whose lease is no longer current *spoils* the transaction: every later
/// call answers the same error, and [`commit`](Self::commit) rolls back and answers it,
/// so the caller's rows are never committed with a stale completion (CONTRACT T3).
/// Dropping the transaction rolls it back; only a commit wakes waiters.
#[must_use = "a transaction is rolled back unless committed"]
pub struct SqliteTransaction<'c> {
    tx: rusqlite::Transaction<'c>,
    ns: i64,
    settings: Arc<StoreSettings>,
    wakers: Arc<Wakers>,
    /// The sequence values drawn, written back once, just before the commit.
    seq: SeqCounter,
    /// The namespaces to wake once (and only if) the transaction commits.
    wakes: Wakes,
    /// Why the transaction must not commit, once it must not.
    spoiled: Option<Error>,
}

impl std::fmt::Debug for SqliteTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTransaction")
            .field("namespace", &self.settings.namespace)
            .field("spoiled", &self.spoiled)
            .finish_non_exhaustive()
    }
}

impl<'c> Deref for SqliteTransaction<'c> {
    type Target = rusqlite::Transaction<'c>;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl SqliteTransaction<'_> {
    /// Enqueues `job` in this transaction: it exists if and only if the transaction
    /// commits (CONTRACT T1), and no other connection sees it before.
    ///
    /// Invalid input is refused with the error the `Store` handle gives, writing nothing;
    /// the transaction stays usable. An idempotency key another committed transaction
    /// holds answers that transaction's job (`created: false`).
    pub fn enqueue(&mut self, job: NewJob) -> Result<Enqueued> {
        self.usable()?;
        let (job, now) = prepare_enqueue(&self.settings, job)?;
        let (ns, settings) = (self.ns, self.settings.clone());
        self.run(|tx| store::enqueue(tx, ns, &settings, job, now))
    }

    /// Enqueues `jobs` in this transaction, all or none: a batch refused for one job
    /// (an invalid job, a parent that does not exist) writes nothing of its own and
    /// leaves the transaction, and what the caller wrote in it, usable (CONTRACT E9).
    pub fn enqueue_batch(&mut self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.usable()?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let (jobs, now) = prepare_batch(&self.settings, jobs)?;
        let (ns, settings) = (self.ns, self.settings.clone());
        // In a savepoint of its own, so a refusal after the first jobs were written
        // undoes exactly the batch.
        let outcome = self
            .run(|tx| in_savepoint(tx, |tx| store::enqueue_batch(tx, ns, &settings, jobs, now)));
        match outcome {
            Ok(answer) => answer,
            Err(err) => {
                // The savepoint could not be ended: part of the batch may be written.
                self.spoiled.get_or_insert_with(|| err.clone());
                Err(err)
            }
        }
    }

    /// Completes job `id` in this transaction, under lease `token`, with `result`
    /// (CONTRACT T3): the lease is checked here (L2, L5, L9), and the completion commits
    /// with the caller's writes or not at all. Return the receipt from the handler once
    /// [`commit`](Self::commit) succeeded.
    ///
    /// A result over the payload limit is refused before anything is written, and the
    /// transaction stays usable. Any refusal of the completion itself (`LeaseLost`: the
    /// lease was reclaimed, the job finished or went to another worker; `NotFound`)
    /// spoils the transaction: [`commit`](Self::commit) then rolls everything back and
    /// answers that error.
    pub fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<FencedCompletion> {
        self.usable()?;
        let now = prepare_complete(&self.settings, result.as_ref())?;
        let ns = self.ns;
        match self.run(|tx| store::complete(tx, ns, id, token, result.as_deref(), now)) {
            Ok(()) => Ok(FencedCompletion::new(id, token)),
            Err(err) => {
                // The caller asked for their writes to stand only with this completion.
                self.spoiled.get_or_insert_with(|| err.clone());
                Err(err)
            }
        }
    }

    /// Why the transaction can no longer commit, if it cannot: the first error that
    /// spoiled it, which [`commit`](Self::commit) will answer.
    pub fn spoiled(&self) -> Option<&Error> {
        self.spoiled.as_ref()
    }

    /// Commits the caller's writes and the jobs together, then wakes this process's
    /// waiters for the jobs that became ready. Other processes find them at their next
    /// poll, as any enqueue.
    ///
    /// A spoiled transaction is rolled back instead and answers the error that spoiled
    /// it; so does one SQLite rolled back on its own (a full disk), with
    /// `Unavailable`. If the commit fails, nothing of the transaction is written.
    pub fn commit(self) -> Result<()> {
        let SqliteTransaction {
            tx,
            wakers,
            seq,
            wakes,
            spoiled,
            ..
        } = self;
        if let Some(err) = spoiled {
            if !tx.is_autocommit() {
                // The error to answer is the one that spoiled it; a failed rollback is
                // retried when the transaction is dropped.
                let _ = tx.rollback();
            }
            return Err(err);
        }
        if tx.is_autocommit() {
            // A COMMIT now would fail, or commit nothing the caller meant together.
            return Err(lost_transaction());
        }
        // Dropped on an error: rusqlite rolls the transaction back.
        write_seq(&tx, &seq).db("write the sequence back")?;
        tx.commit().db("commit the transaction")?;
        wakers.wake(&wakes);
        Ok(())
    }

    /// Rolls the transaction back: nothing of it is written, and nobody is woken.
    pub fn rollback(self) -> Result<()> {
        if self.tx.is_autocommit() {
            // Already ended by SQLite itself; there is nothing left to undo.
            return Ok(());
        }
        self.tx.rollback().db("roll the transaction back")
    }

    /// The spoiling error again, if any: a spoiled transaction does nothing more.
    fn usable(&self) -> Result<()> {
        match &self.spoiled {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }

    /// Runs one store operation in the transaction. An operation checks before it
    /// writes, so a refusal leaves nothing behind; one that fails after writing (only a
    /// database error can) or a transaction SQLite ended on its own spoils the
    /// transaction, which must then not commit.
    fn run<T>(&mut self, f: impl FnOnce(&mut WriteTx<'_>) -> Result<T>) -> Result<T> {
        let conn: &Connection = &self.tx;
        let before = conn.total_changes();
        let result = f(&mut WriteTx::new(conn, &mut self.seq, &mut self.wakes));
        if conn.is_autocommit() {
            self.spoiled.get_or_insert_with(lost_transaction);
        } else if let Err(err) = &result {
            // A batch's refusal comes back inside an `Ok` (its savepoint undid its
            // writes), so only failures that may have left writes behind reach here.
            if conn.total_changes() != before {
                self.spoiled.get_or_insert_with(|| err.clone());
            }
        }
        result
    }
}
