//! The threads that own the connections: one writer that commits operations in groups,
//! and a pool of readers. Async callers hand them closures over a channel and await the
//! answer on a oneshot, so no SQLite call ever runs on the async runtime.
//!
//! One engine serves every store opened on the same file (and configuration) in a
//! process: two writers in one process would only queue on SQLite's file lock, and
//! sharing the writer lets an enqueue through one store wake claimers of another.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use durq_core::{Error, Result};
use rusqlite::Connection;
use tokio::sync::{oneshot, watch, Notify};

use crate::config::SqliteConfig;
use crate::error::{db_error, stopped, DbResultExt};
use crate::schema;

/// The writer's view of one group transaction, handed to each operation; also built on
/// a caller's own transaction (`crate::SqliteTransaction`), so both run the same `store` functions.
///
/// The sequence and the wake-ups sit in cells so that code holding only a shared view
/// (a claim burying a record it cannot read, which settles the jobs waiting for it)
/// can still draw a sequence value and ask for a wake-up.
pub(crate) struct WriteTx<'a> {
    conn: &'a Connection,
    seq: RefCell<&'a mut SeqCounter>,
    wakes: RefCell<&'a mut Wakes>,
}

impl<'a> WriteTx<'a> {
    /// A view of the write transaction open on `conn`: sequence values are drawn from
    /// `seq` (write it back with [`write_seq`] before the commit) and the namespaces to
    /// wake after the commit gathered in `wakes`.
    pub(crate) fn new(
        conn: &'a Connection,
        seq: &'a mut SeqCounter,
        wakes: &'a mut Wakes,
    ) -> WriteTx<'a> {
        WriteTx {
            conn,
            seq: RefCell::new(seq),
            wakes: RefCell::new(wakes),
        }
    }

    /// The connection, inside the group's `BEGIN IMMEDIATE` transaction.
    ///
    /// Borrowed for the transaction's whole life, not the view's, so statements prepared
    /// on it can be held while the view hands out sequence values.
    pub(crate) fn conn(&self) -> &'a Connection {
        self.conn
    }

    /// The next value of the store-wide sequence that orders jobs entering `queued`
    /// (CONTRACT C3). Read from the file once per group and written back before the
    /// commit, so a group of a thousand enqueues touches the counter row once.
    pub(crate) fn next_seq(&self) -> Result<i64> {
        let mut seq = self.seq.borrow_mut();
        let next = match seq.next {
            Some(next) => next,
            None => {
                let stored: i64 = self
                    .conn
                    .prepare_cached("SELECT value FROM jobq_meta WHERE name = 'seq'")
                    .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
                    .db("read the sequence")?;
                seq.loaded = Some(stored);
                stored + 1
            }
        };
        seq.next = Some(next + 1);
        Ok(next)
    }

    /// Asks for the waiters of namespace `ns` to be woken once the group commits.
    pub(crate) fn wake(&self, ns: i64) {
        self.wakes.borrow_mut().ready.insert(ns);
    }

    /// Tells the waiters for endings (CONTRACT O2) to look again once the group
    /// commits: a job ended in it.
    pub(crate) fn ended(&self) {
        self.wakes.borrow_mut().ended = true;
    }
}

/// Whom a transaction wakes once it commits.
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    /// The namespaces where jobs became ready.
    ready: HashSet<i64>,
    /// Whether a job ended.
    ended: bool,
}

/// The store-wide sequence as one write transaction hands it out.
#[derive(Debug, Default)]
pub(crate) struct SeqCounter {
    /// The value stored when the group first asked, if it asked.
    loaded: Option<i64>,
    /// The next value to hand out.
    next: Option<i64>,
}

impl SeqCounter {
    fn pending_write(&self) -> Option<i64> {
        match (self.loaded, self.next) {
            (Some(loaded), Some(next)) if next - 1 > loaded => Some(next - 1),
            _ => None,
        }
    }
}

/// An operation waiting for the writer.
trait WriteOp: Send {
    /// Runs the operation inside the group transaction and returns what to do once the
    /// group's fate is known, or the error that spoiled the whole transaction.
    fn run(self: Box<Self>, tx: &mut WriteTx<'_>) -> std::result::Result<Box<dyn Finish>, Spoiled>;
    /// Answers without running: the group could not begin.
    fn abort(self: Box<Self>, error: Error);
    /// Whether the operation must reach stable storage under
    /// [`crate::Synchronous::DurableEnqueues`].
    fn durable(&self) -> bool;
}

/// How the writer runs an operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteMode {
    /// Inside a savepoint of its own, for operations that may refuse after writing.
    savepoint: bool,
    /// Committed with `fsync` under [`crate::Synchronous::DurableEnqueues`].
    durable: bool,
}

impl WriteMode {
    /// A worker's call: checked before it writes; power loss may undo it (re-delivery).
    pub(crate) const WORKER: WriteMode = WriteMode {
        savepoint: false,
        durable: false,
    };
    /// An enqueue or an operator's action: checked before it writes; synced.
    pub(crate) const DURABLE: WriteMode = WriteMode {
        savepoint: false,
        durable: true,
    };
    /// A batch enqueue: may refuse halfway, so it gets a savepoint; synced.
    pub(crate) const DURABLE_ATOMIC: WriteMode = WriteMode {
        savepoint: true,
        durable: true,
    };
}

/// An operation that ran, waiting for the commit before it answers.
trait Finish: Send {
    fn finish(self: Box<Self>, commit: std::result::Result<(), &Error>);
}

struct Call<F, T> {
    f: F,
    reply: oneshot::Sender<Result<T>>,
    mode: WriteMode,
}

/// An operation failed after it had written: without a savepoint to roll back to, the
/// group transaction holds a half-done operation and must not commit. Holds what the
/// group's other operations are told.
struct Spoiled(Error);

struct Ran<T> {
    result: Result<T>,
    reply: oneshot::Sender<Result<T>>,
}

impl<F, T> WriteOp for Call<F, T>
where
    F: FnOnce(&mut WriteTx<'_>) -> Result<T> + Send,
    T: Send + 'static,
{
    fn run(self: Box<Self>, tx: &mut WriteTx<'_>) -> std::result::Result<Box<dyn Finish>, Spoiled> {
        let Call { f, reply, mode } = *self;
        let result = if mode.savepoint {
            match in_savepoint(tx, f) {
                Ok(result) => result,
                Err(err) => {
                    // The savepoint could not be ended: what the operation wrote may still
                    // be in the transaction, which must not commit.
                    let spoiled = Error::Unavailable {
                        message: "another operation of the group commit failed after writing"
                            .to_owned(),
                        source: Some(Arc::new(err.clone())),
                    };
                    let _ = reply.send(Err(err));
                    return Err(Spoiled(spoiled));
                }
            }
        } else {
            // Most operations check everything before their first write, so a logical
            // refusal (not found, lease lost) leaves nothing behind and needs no
            // savepoint. If one fails after it wrote (only a database error can do that),
            // the group is rolled back whole and every operation in it is told so.
            let before = tx.conn.total_changes();
            let result = f(tx);
            if let Err(err) = &result {
                if tx.conn.total_changes() != before {
                    // The other operations of the group did nothing wrong: they are told
                    // to retry, which will succeed.
                    let spoiled = Error::Unavailable {
                        message: "another operation of the group commit failed after writing"
                            .to_owned(),
                        source: Some(Arc::new(err.clone())),
                    };
                    let _ = reply.send(result);
                    return Err(Spoiled(spoiled));
                }
            }
            result
        };
        Ok(Box::new(Ran { result, reply }))
    }

    fn abort(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }

    fn durable(&self) -> bool {
        self.mode.durable
    }
}

impl<T: Send> Finish for Ran<T> {
    fn finish(self: Box<Self>, commit: std::result::Result<(), &Error>) {
        let answer = match (commit, self.result) {
            // A failed operation changed nothing; its own error is the truer answer.
            (_, Err(err)) => Err(err),
            (Ok(()), Ok(value)) => Ok(value),
            (Err(commit), Ok(_)) => Err(commit.clone()),
        };
        // The caller may have stopped waiting (its future was dropped); nothing to do.
        let _ = self.reply.send(answer);
    }
}

/// Runs one operation between `SAVEPOINT` and `RELEASE`, rolling back to the savepoint
/// if it fails, so one failed operation never undoes the others of its group (or the
/// caller's own writes, in a caller's transaction).
///
/// The inner result is the operation's. The outer error says the savepoint itself could
/// not be managed: the transaction may then hold part of the operation's writes and
/// must not commit.
pub(crate) fn in_savepoint<T>(
    tx: &mut WriteTx<'_>,
    f: impl FnOnce(&mut WriteTx<'_>) -> Result<T>,
) -> Result<Result<T>> {
    let exec = |conn: &Connection, sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]))
            .db("manage a savepoint")
    };
    // Nothing was written yet if the savepoint cannot be opened: the operation's own
    // failure, not the transaction's.
    if let Err(err) = exec(tx.conn, "SAVEPOINT op") {
        return Ok(Err(err));
    }
    match f(tx) {
        Ok(value) => {
            exec(tx.conn, "RELEASE op")?;
            Ok(Ok(value))
        }
        Err(err) => {
            exec(tx.conn, "ROLLBACK TO op")?;
            exec(tx.conn, "RELEASE op")?;
            // A wake-up the operation asked for stays: spurious wake-ups are allowed.
            Ok(Err(err))
        }
    }
}

type ReadFn = Box<dyn FnOnce(Result<&Connection>) + Send>;

/// The wake-up signal of each namespace, shared by the writer and the stores, and the
/// signal of endings with its count of waiters.
#[derive(Default)]
pub(crate) struct Wakers {
    by_ns: Mutex<HashMap<i64, Arc<Notify>>>,
    /// Signalled after a commit that ended jobs (CONTRACT O2).
    pub(crate) endings: durq_core::ending::EndingSignal,
}

impl Wakers {
    pub(crate) fn for_ns(&self, ns: i64) -> Arc<Notify> {
        let mut map = self.by_ns.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(ns).or_default().clone()
    }

    /// Wakes this process's waiters of each namespace where jobs became ready, and its
    /// waiters for endings if a job ended; called only after the transaction that did
    /// it has committed.
    pub(crate) fn wake(&self, wakes: &Wakes) {
        // A wait counts itself before its first read, so either it is counted here or
        // its read comes after this commit.
        if wakes.ended {
            self.endings.ended();
        }
        if wakes.ready.is_empty() {
            return;
        }
        let map = self.by_ns.lock().unwrap_or_else(|p| p.into_inner());
        for ns in &wakes.ready {
            if let Some(notify) = map.get(ns) {
                notify.notify_waiters();
            }
        }
    }
}

/// The threads and channels serving one file.
pub(crate) struct Engine {
    writer: mpsc::Sender<Box<dyn WriteOp>>,
    readers: mpsc::Sender<ReadFn>,
    ready: watch::Receiver<Option<std::result::Result<(), String>>>,
    pub(crate) wakers: Arc<Wakers>,
    pub(crate) config: SqliteConfig,
    pub(crate) path: PathBuf,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

type Registry = Mutex<HashMap<(PathBuf, SqliteConfig), Weak<Engine>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// A path that names the same file however it was spelled, so two stores on one file
/// share one engine. The file may not exist yet, so only its directory is resolved.
fn canonical(path: &Path) -> Result<PathBuf> {
    let invalid = |why: &str| Error::invalid("path", format!("{}: {why}", path.display()));
    let file = path.file_name().ok_or_else(|| invalid("names no file"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = std::fs::canonicalize(&dir).map_err(|err| match err.kind() {
        // A directory that is not there is the caller's mistake, not an outage.
        std::io::ErrorKind::NotFound => invalid("its directory does not exist"),
        _ => Error::unavailable(format!("resolve {}", dir.display()), err),
    })?;
    Ok(dir.join(file))
}

impl Engine {
    /// The engine serving `path` with `config`, started if none runs in this process.
    pub(crate) async fn get(path: &Path, config: &SqliteConfig) -> Result<Arc<Engine>> {
        let key = (canonical(path)?, config.clone());
        let engine = {
            let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, engine| engine.strong_count() > 0);
            match map.get(&key).and_then(Weak::upgrade) {
                Some(engine) => engine,
                None => {
                    let engine = Arc::new(Engine::start(key.0.clone(), config.clone()));
                    map.insert(key.clone(), Arc::downgrade(&engine));
                    engine
                }
            }
        };
        let mut ready = engine.ready.clone();
        let outcome = ready
            .wait_for(Option::is_some)
            .await
            .map_err(|_| stopped())?
            .clone();
        match outcome {
            Some(Err(message)) => {
                // Forget the failed engine so the next open tries again.
                let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
                if map
                    .get(&key)
                    .is_some_and(|weak| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&engine)))
                {
                    map.remove(&key);
                }
                Err(Error::Unavailable {
                    message: format!("cannot open {}: {message}", key.0.display()),
                    source: None,
                })
            }
            _ => Ok(engine),
        }
    }

    fn start(path: PathBuf, config: SqliteConfig) -> Engine {
        let (writer_tx, writer_rx) = mpsc::channel::<Box<dyn WriteOp>>();
        let (reader_tx, reader_rx) = mpsc::channel::<ReadFn>();
        let (ready_tx, ready_rx) = watch::channel(None);
        let wakers = Arc::new(Wakers::default());
        let thread_wakers = wakers.clone();
        let thread_path = path.clone();
        let thread_config = config.clone();
        let spawned = std::thread::Builder::new()
            .name("durq-sqlite-writer".to_owned())
            .spawn(move || {
                let conn = match schema::open_writer(&thread_path, &thread_config) {
                    Ok(conn) => conn,
                    Err(err) => {
                        let _ = ready_tx.send(Some(Err(err.to_string())));
                        return;
                    }
                };
                // Readers start only now, after the migrations, so none of them ever sees
                // a file without the schema.
                let reader_rx = Arc::new(Mutex::new(reader_rx));
                for n in 0..thread_config.readers {
                    let rx = reader_rx.clone();
                    let path = thread_path.clone();
                    let config = thread_config.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("durq-sqlite-reader-{n}"))
                        .spawn(move || reader_loop(&path, &config, &rx));
                    if let Err(err) = spawned {
                        let _ = ready_tx.send(Some(Err(format!("spawn a reader: {err}"))));
                        return;
                    }
                }
                let _ = ready_tx.send(Some(Ok(())));
                writer_loop(conn, &writer_rx, &thread_config, &thread_wakers);
            });
        let (ready_rx, writer_tx) = match spawned {
            Ok(_) => (ready_rx, writer_tx),
            Err(err) => {
                let (tx, rx) = watch::channel(Some(Err(format!("spawn the writer: {err}"))));
                drop(tx);
                (rx, writer_tx)
            }
        };
        Engine {
            writer: writer_tx,
            readers: reader_tx,
            ready: ready_rx,
            wakers,
            config,
            path,
        }
    }

    /// Runs `f` on the writer thread inside a group transaction and answers once the
    /// group has committed.
    ///
    /// Without a savepoint in `mode`, `f` must not fail after its first write except
    /// through a database error (check first, then write): such a failure rolls back the
    /// whole group.
    pub(crate) async fn write<T, F>(&self, mode: WriteMode, f: F) -> Result<T>
    where
        F: FnOnce(&mut WriteTx<'_>) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Box::new(Call { f, reply, mode }))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs `f` on a reader thread.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: ReadFn = Box::new(move |conn: Result<&Connection>| {
            let _ = reply.send(conn.and_then(f));
        });
        self.readers.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn reader_loop(path: &Path, config: &SqliteConfig, rx: &Mutex<mpsc::Receiver<ReadFn>>) {
    let mut conn: Option<Connection> = None;
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(job) = job else { return };
        if conn.is_none() {
            match schema::open_reader(path, config) {
                Ok(opened) => conn = Some(opened),
                Err(err) => {
                    job(Err(err));
                    continue;
                }
            }
        }
        match conn.as_ref() {
            Some(conn) => job(Ok(conn)),
            None => job(Err(stopped())),
        }
    }
}

fn writer_loop(
    mut conn: Connection,
    rx: &mpsc::Receiver<Box<dyn WriteOp>>,
    config: &SqliteConfig,
    wakers: &Wakers,
) {
    let max_group = config.max_group;
    let mut group: Vec<Box<dyn WriteOp>> = Vec::with_capacity(max_group.min(1024));
    // What `open_writer` set.
    let mut synchronous = config.synchronous.pragma_value(true);
    // Everything that queued up while the previous group was committing forms the next
    // group: under load the groups grow and the fsyncs per job shrink, with no delay
    // added when the writer is idle.
    while let Ok(first) = rx.recv() {
        group.push(first);
        while group.len() < max_group {
            match rx.try_recv() {
                Ok(op) => group.push(op),
                Err(_) => break,
            }
        }
        // The mode is chosen per group, before BEGIN (SQLite refuses to change it inside
        // a transaction): a group holding one enqueue is synced whole.
        let wanted = config
            .synchronous
            .pragma_value(group.iter().any(|op| op.durable()));
        if wanted != synchronous {
            match conn.execute_batch(&format!("PRAGMA synchronous = {wanted}")) {
                Ok(()) => synchronous = wanted,
                Err(err) => {
                    let error = db_error("set synchronous", err);
                    for op in group.drain(..) {
                        op.abort(error.clone());
                    }
                    continue;
                }
            }
        }
        run_group(&mut conn, &mut group, wakers);
    }
}

fn run_group(conn: &mut Connection, group: &mut Vec<Box<dyn WriteOp>>, wakers: &Wakers) {
    if !conn.is_autocommit() {
        // A transaction left open by a failed commit whose rollback failed too would make
        // every later BEGIN fail; end it first (its group was already told it failed).
        let _ = conn.execute_batch("ROLLBACK");
    }
    let begin = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut stmt| stmt.execute([]))
        .db("begin a write transaction");
    if let Err(err) = begin {
        for op in group.drain(..) {
            op.abort(err.clone());
        }
        return;
    }
    let mut seq = SeqCounter::default();
    let mut wakes = Wakes::default();
    let mut finished: Vec<Box<dyn Finish>> = Vec::with_capacity(group.len());
    let mut spoiled: Option<Error> = None;
    {
        let mut tx = WriteTx::new(conn, &mut seq, &mut wakes);
        for op in group.drain(..) {
            if let Some(err) = &spoiled {
                op.abort(err.clone());
                continue;
            }
            if tx.conn.is_autocommit() {
                // SQLite rolled the whole transaction back on its own (a full disk, an
                // I/O error): running on would commit each statement separately.
                let lost = lost_transaction();
                op.abort(lost.clone());
                spoiled = Some(lost);
                continue;
            }
            match op.run(&mut tx) {
                Ok(done) => finished.push(done),
                Err(Spoiled(err)) => spoiled = Some(err),
            }
        }
    }
    let outcome = match spoiled {
        Some(err) => Err(err),
        None if conn.is_autocommit() => Err(lost_transaction()),
        None => commit(conn, &seq),
    };
    match &outcome {
        Ok(()) => {
            for done in finished {
                done.finish(Ok(()));
            }
            wakers.wake(&wakes);
        }
        Err(err) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            for done in finished {
                done.finish(Err(err));
            }
        }
    }
}

pub(crate) fn lost_transaction() -> Error {
    Error::Unavailable {
        message: "sqlite rolled the transaction back after an error".to_owned(),
        source: None,
    }
}

/// Writes the last sequence value the transaction handed out back to `jobq_meta`, if it
/// handed any out: once per transaction, just before its commit.
pub(crate) fn write_seq(conn: &Connection, seq: &SeqCounter) -> rusqlite::Result<()> {
    if let Some(value) = seq.pending_write() {
        conn.prepare_cached("UPDATE jobq_meta SET value = ?1 WHERE name = 'seq'")?
            .execute([value])?;
    }
    Ok(())
}

fn commit(conn: &Connection, seq: &SeqCounter) -> Result<()> {
    let run = || -> rusqlite::Result<()> {
        write_seq(conn, seq)?;
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    };
    run().map_err(|err| db_error("commit the group", err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Synchronous;

    async fn synchronous_of(engine: &Engine, mode: WriteMode) -> i64 {
        let read = engine
            .write(mode, |tx| {
                tx.conn()
                    .query_row("PRAGMA synchronous", [], |row| row.get::<_, i64>(0))
                    .db("read synchronous")
            })
            .await;
        match read {
            Ok(value) => value,
            Err(err) => panic!("{err}"),
        }
    }

    #[tokio::test]
    async fn each_group_is_synced_as_its_mode_asks() {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(err) => panic!("{err}"),
        };
        let path = dir.path().join("modes.db");
        let (full, normal, off) = (2, 1, 0);
        for (synchronous, worker, durable) in [
            (Synchronous::DurableEnqueues, normal, full),
            (Synchronous::Full, full, full),
            (Synchronous::Normal, normal, normal),
            (Synchronous::Off, off, off),
        ] {
            let config = SqliteConfig::default().synchronous(synchronous);
            let engine = match Engine::get(&path, &config).await {
                Ok(engine) => engine,
                Err(err) => panic!("{err}"),
            };
            // Alternating, so every switch is exercised in both directions.
            for _ in 0..2 {
                assert_eq!(synchronous_of(&engine, WriteMode::WORKER).await, worker);
                assert_eq!(synchronous_of(&engine, WriteMode::DURABLE).await, durable);
                assert_eq!(
                    synchronous_of(&engine, WriteMode::DURABLE_ATOMIC).await,
                    durable
                );
            }
        }
    }
}
