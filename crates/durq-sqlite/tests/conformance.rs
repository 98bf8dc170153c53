//! The shared conformance suite against SQLite: every test of this binary shares one
//! file, so namespaces are tested side by side in it (CONTRACT C8), and each `open` is
//! a new store over that file (a reopen, CONTRACT A6). Each scenario's namespaces are
//! emptied after it, so the file holds no job once the suite is done.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use durq_conformance::{CallerTransaction, TransactionHarness};
use durq_core::{
    async_trait, Bytes, Enqueued, Error, FencedCompletion, JobId, LeaseToken, NewJob, Result,
    Store, StoreSettings,
};
use durq_sqlite::{SqliteBackend, SqliteConfig};
use tokio::sync::oneshot;

struct SqliteHarness {
    path: PathBuf,
    config: SqliteConfig,
}

/// One file per test process, in the target directory. Files of test processes that
/// are gone are removed first, so runs do not pile them up.
fn shared_file() -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| test_file("db")).clone()
}

/// A file of this test process named `{pid}.{suffix}`, in the target directory, after
/// removing the files of test processes that are gone.
fn test_file(suffix: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sqlite-conformance");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.split('.').next().unwrap_or_default();
            if !pid.is_empty() && !PathBuf::from(format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    dir.join(format!("{}.{suffix}", std::process::id()))
}

/// The configuration a new user gets, so the suite checks what they run (the per-group
/// choice of `synchronous` included), but for how long a writer waits for the file's
/// lock: the scenarios of §7 hold it in the caller's transactions, on threads that a
/// loaded machine may leave unscheduled for a while. How long a writer waits is not
/// what the suite checks.
fn config() -> SqliteConfig {
    SqliteConfig::default().busy_timeout(Duration::from_secs(30))
}

impl SqliteHarness {
    /// A backend on `namespace` with the default settings, for the harness's own work.
    async fn backend(&self, namespace: &str) -> Result<SqliteBackend> {
        let settings = StoreSettings::default().namespace(namespace);
        self.config.clone().open(&self.path, settings).await
    }
}

#[async_trait]
impl durq_conformance::Harness for SqliteHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let backend = self.config.clone().open(&self.path, settings).await?;
        Ok(Store::new(backend))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.backend(namespace).await?.vanish(id).await
    }

    /// Tags that are not JSON: a value SQLite stores but the store cannot read.
    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        let (path, namespace) = (self.path.clone(), namespace.to_owned());
        let changed = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(Duration::from_secs(10))?;
            conn.execute(
                "UPDATE jobq_jobs SET tags = '{' WHERE id = ?1
                 AND ns = (SELECT id FROM jobq_namespaces WHERE name = ?2)",
                rusqlite::params![id.to_bytes(), namespace],
            )
        })
        .await
        .map_err(|err| Error::backend("corrupt a record", err))?
        .map_err(|err| Error::backend("corrupt a record", err))?;
        Ok(changed == 1)
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.backend(namespace).await?.drop_namespace().await?;
        let (path, namespace) = (self.path.clone(), namespace.to_owned());
        blocking("remove the caller's rows", move || {
            let conn = caller_connection(&path)?;
            conn.execute(
                "DELETE FROM conformance_rows WHERE ns = ?1",
                rusqlite::params![namespace],
            )
            .map(drop)
        })
        .await
    }
}

/// The caller's side of CONTRACT §7: the caller's own connection to the store's file,
/// a table of the caller's (`conformance_rows`), and a transaction on it run on a
/// thread of its own, since a `SqliteTransaction` borrows its connection and blocks.
#[async_trait]
impl TransactionHarness for SqliteHarness {
    async fn begin(&self, settings: &StoreSettings) -> Result<Box<dyn CallerTransaction>> {
        let backend = self
            .config
            .clone()
            .open(&self.path, settings.clone())
            .await?;
        let (namespace, path) = (settings.namespace.clone(), self.path.clone());
        let (commands, inbox) = std::sync::mpsc::channel::<Command>();
        let (begun, begun_rx) = oneshot::channel();
        std::thread::spawn(move || {
            let mut conn = match caller_connection(&path) {
                Ok(conn) => conn,
                Err(err) => {
                    let _ = begun.send(Err(Error::backend("open the caller's connection", err)));
                    return;
                }
            };
            let mut tx = match backend.transaction(&mut conn) {
                Ok(tx) => tx,
                Err(err) => {
                    let _ = begun.send(Err(err));
                    return;
                }
            };
            let _ = begun.send(Ok(()));
            for command in inbox {
                match command {
                    Command::WriteRow(mark, reply) => {
                        let written = tx
                            .execute(
                                "INSERT INTO conformance_rows (ns, mark) VALUES (?1, ?2)",
                                rusqlite::params![namespace, mark],
                            )
                            .map(drop)
                            .map_err(|err| Error::backend("write the caller's row", err));
                        let _ = reply.send(written);
                    }
                    Command::Enqueue(job, reply) => drop(reply.send(tx.enqueue(*job))),
                    Command::EnqueueBatch(jobs, reply) => {
                        drop(reply.send(tx.enqueue_batch(jobs)));
                    }
                    Command::Complete(id, token, result, reply) => {
                        drop(reply.send(tx.complete(id, token, result)));
                    }
                    Command::End { commit, reply } => {
                        let ended = if commit { tx.commit() } else { tx.rollback() };
                        let _ = reply.send(ended);
                        return;
                    }
                }
            }
        });
        begun_rx.await.map_err(gone)??;
        Ok(Box::new(CallerTx { commands }))
    }

    async fn row_committed(&self, namespace: &str, mark: &str) -> Result<bool> {
        let (path, namespace, mark) = (self.path.clone(), namespace.to_owned(), mark.to_owned());
        blocking("read the caller's row", move || {
            caller_connection(&path)?.query_row(
                "SELECT count(*) FROM conformance_rows WHERE ns = ?1 AND mark = ?2",
                rusqlite::params![namespace, mark],
                |row| row.get::<_, i64>(0).map(|count| count > 0),
            )
        })
        .await
    }
}

/// A connection of the caller's on the store's file, with the caller's table.
fn caller_connection(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS conformance_rows (ns TEXT NOT NULL, mark TEXT NOT NULL)",
    )?;
    Ok(conn)
}

/// Runs blocking rusqlite work off the runtime.
async fn blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| Error::backend(what, err))?
        .map_err(|err| Error::backend(what, err))
}

type Reply<T> = oneshot::Sender<Result<T>>;

/// What the transaction's thread is asked to do.
enum Command {
    WriteRow(String, Reply<()>),
    Enqueue(Box<NewJob>, Reply<Enqueued>),
    EnqueueBatch(Vec<NewJob>, Reply<Vec<Enqueued>>),
    Complete(JobId, LeaseToken, Option<Bytes>, Reply<FencedCompletion>),
    End { commit: bool, reply: Reply<()> },
}

/// The scenario's handle on the transaction's thread.
struct CallerTx {
    commands: std::sync::mpsc::Sender<Command>,
}

fn gone<E>(_: E) -> Error {
    Error::backend("the caller's transaction", "its thread ended")
}

impl CallerTx {
    async fn ask<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).map_err(gone)?;
        answer.await.map_err(gone)?
    }
}

#[async_trait]
impl CallerTransaction for CallerTx {
    async fn write_row(&mut self, mark: &str) -> Result<()> {
        let mark = mark.to_owned();
        self.ask(|reply| Command::WriteRow(mark, reply)).await
    }

    async fn enqueue(&mut self, job: NewJob) -> Result<Enqueued> {
        self.ask(|reply| Command::Enqueue(Box::new(job), reply))
            .await
    }

    async fn enqueue_batch(&mut self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.ask(|reply| Command::EnqueueBatch(jobs, reply)).await
    }

    async fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<FencedCompletion> {
        self.ask(|reply| Command::Complete(id, token, result, reply))
            .await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.ask(|reply| Command::End {
            commit: true,
            reply,
        })
        .await
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        self.ask(|reply| Command::End {
            commit: false,
            reply,
        })
        .await
    }
}

async fn harness() -> Option<SqliteHarness> {
    Some(SqliteHarness {
        path: shared_file(),
        config: config(),
    })
}

durq_conformance::conformance_tests!(harness);
durq_conformance::transaction_tests!(harness);

/// Mutants of the caller's transaction: each breaks one rule of CONTRACT §7 the way a
/// hand-written outbox goes wrong, and the scenario of that rule must catch it.
mod transaction_mutants {
    use durq_conformance::Harness as _;
    use futures::FutureExt as _;

    use super::*;

    #[derive(Clone, Copy, Debug)]
    enum Bug {
        /// Enqueues through the store, outside the caller's transaction (T1).
        EnqueueOutsideTheTransaction,
        /// Completes through the store, outside the caller's transaction (T3).
        CompleteOutsideTheTransaction,
    }

    struct Mutant {
        inner: SqliteHarness,
        bug: Bug,
    }

    #[async_trait]
    impl durq_conformance::Harness for Mutant {
        async fn open(&self, settings: StoreSettings) -> Result<Store> {
            self.inner.open(settings).await
        }

        async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
            self.inner.vanish(namespace, id).await
        }

        async fn teardown(&self, namespace: &str) -> Result<()> {
            self.inner.teardown(namespace).await
        }
    }

    #[async_trait]
    impl TransactionHarness for Mutant {
        async fn begin(&self, settings: &StoreSettings) -> Result<Box<dyn CallerTransaction>> {
            let inner = self.inner.begin(settings).await?;
            let store = self.inner.open(settings.clone()).await?;
            Ok(Box::new(Broken {
                inner,
                store,
                bug: self.bug,
            }))
        }

        async fn row_committed(&self, namespace: &str, mark: &str) -> Result<bool> {
            self.inner.row_committed(namespace, mark).await
        }
    }

    struct Broken {
        inner: Box<dyn CallerTransaction>,
        store: Store,
        bug: Bug,
    }

    #[async_trait]
    impl CallerTransaction for Broken {
        async fn write_row(&mut self, mark: &str) -> Result<()> {
            self.inner.write_row(mark).await
        }

        async fn enqueue(&mut self, job: NewJob) -> Result<Enqueued> {
            match self.bug {
                Bug::EnqueueOutsideTheTransaction => self.store.enqueue(job).await,
                _ => self.inner.enqueue(job).await,
            }
        }

        async fn enqueue_batch(&mut self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
            match self.bug {
                Bug::EnqueueOutsideTheTransaction => self.store.enqueue_batch(jobs).await,
                _ => self.inner.enqueue_batch(jobs).await,
            }
        }

        async fn complete(
            &mut self,
            id: JobId,
            token: LeaseToken,
            result: Option<Bytes>,
        ) -> Result<FencedCompletion> {
            match self.bug {
                Bug::CompleteOutsideTheTransaction => {
                    self.store.complete(id, token, result).await?;
                    Ok(FencedCompletion::new(id, token))
                }
                _ => self.inner.complete(id, token, result).await,
            }
        }

        async fn commit(self: Box<Self>) -> Result<()> {
            self.inner.commit().await
        }

        async fn rollback(self: Box<Self>) -> Result<()> {
            self.inner.rollback().await
        }
    }

    /// How long a mutant's store writer waits for the file's lock. Each bug writes
    /// through the store while the caller's transaction holds the lock, so the store's
    /// writer waits for a commit that waits for it: the wait ends only at this timeout,
    /// and the scenario then fails as it must.
    const MUTANT_BUSY_TIMEOUT: Duration = Duration::from_secs(1);

    /// The mutants' own file. A mutant's writer is stuck for its busy timeout, and with
    /// it every write grouped with it: on the suite's shared file, that was any
    /// scenario's write (CI saw the M1 model check fail with `database is locked`).
    fn mutant_file() -> PathBuf {
        static FILE: OnceLock<PathBuf> = OnceLock::new();
        FILE.get_or_init(|| test_file("mutants.db")).clone()
    }

    /// Runs scenario `name` against `bug`, which must make it fail.
    fn caught(bug: Bug, name: &str) {
        let Some(scenario) = durq_conformance::TRANSACTION_SCENARIOS
            .iter()
            .find(|scenario| scenario.name == name)
        else {
            panic!("no transaction scenario is named {name}");
        };
        let mutant = Mutant {
            inner: SqliteHarness {
                path: mutant_file(),
                config: SqliteConfig::default().busy_timeout(MUTANT_BUSY_TIMEOUT),
            },
            bug,
        };
        durq_conformance::__private::run(async {
            let outcome = std::panic::AssertUnwindSafe(scenario.check(&mutant))
                .catch_unwind()
                .await;
            assert!(
                outcome.is_err(),
                "{name} passed against the mutant {bug:?}; it must catch it"
            );
        });
    }

    #[test]
    fn t1_catches_an_enqueue_outside_the_transaction() {
        caught(
            Bug::EnqueueOutsideTheTransaction,
            "t1_a_job_exists_only_if_its_transaction_commits",
        );
    }

    #[test]
    fn t3_catches_a_completion_outside_the_transaction() {
        caught(
            Bug::CompleteOutsideTheTransaction,
            "t3_a_fenced_completion_commits_with_the_callers_row",
        );
    }
}
