//! [`SqliteConfig`]: the options of the SQLite backend that the shared
//! [`durq_core::StoreSettings`] do not cover, and [`SqliteConfig::open`], the one way to
//! open a SQLite backend.

use std::path::Path;
use std::time::Duration;

use durq_core::StoreSettings;

use crate::SqliteBackend;

/// SQLite's `PRAGMA synchronous` in WAL mode: when a commit is flushed to stable storage.
///
/// Every mode keeps acknowledged writes across a crash of the *process* (a panic, an
/// OOM kill, `SIGKILL`): a commit is acknowledged only after its pages are in the WAL
/// file, and the operating system keeps the file's pages once `write()` returned. The
/// modes differ only when the *machine* stops (power loss, kernel panic, a VM killed
/// from outside). See `docs/sqlite.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Synchronous {
    /// `FULL` for every commit that holds an enqueue, an operator's `cancel`, `retry` or
    /// `retry_from`, or a saved step (`save_step`); `NORMAL` for commits of workers'
    /// other calls only (claim, heartbeat, complete, fail, release, reclaim, purge). The
    /// default.
    ///
    /// An acknowledged job is never lost, power loss included. What a power loss may
    /// undo is the workers' most recent progress, never more than the commits after the
    /// last synced one (the WAL is append-only, so each `fsync` also secures everything
    /// before it): a completion or a failure rolls back to `running`, a claim to `queued`,
    /// and reclaim runs those jobs again, which is the at-least-once delivery every
    /// crashed worker already causes. The workers' hot path pays no `fsync`.
    #[default]
    DurableEnqueues,
    /// `FULL`: every commit calls `fsync` on the WAL before it is acknowledged, so every
    /// acknowledged call survives power loss. Group commit pays one `fsync` for all the
    /// operations that arrived together; throughput is then bounded by the number of
    /// operations in flight per `fsync`.
    Full,
    /// `NORMAL`: commits are written to the WAL without `fsync`; the WAL is synced only at
    /// checkpoints. A power loss or OS crash may lose the most recent acknowledged commits,
    /// enqueues included (never corrupting the file); a process crash loses nothing.
    Normal,
    /// `OFF`: no `fsync` at all, not even at checkpoints. A power loss or OS crash may
    /// lose recent commits and, rarely, corrupt the file. For tests and throwaway queues.
    Off,
}

impl Synchronous {
    /// The `PRAGMA synchronous` value of a commit; `durable` tells whether the commit
    /// holds an enqueue or an operator's action.
    pub(crate) fn pragma_value(self, durable: bool) -> &'static str {
        match self {
            Synchronous::DurableEnqueues if durable => "FULL",
            Synchronous::DurableEnqueues => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
            Synchronous::Off => "OFF",
        }
    }
}

/// How a [`crate::SqliteBackend`] uses its file.
///
/// ```
/// use std::time::Duration;
/// use durq_sqlite::{SqliteConfig, Synchronous};
///
/// let config = SqliteConfig::default()
///     .synchronous(Synchronous::Normal)
///     .busy_timeout(Duration::from_secs(10))
///     .readers(4);
/// assert_eq!(config.synchronous, Synchronous::Normal);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SqliteConfig {
    /// When commits reach stable storage. Default [`Synchronous::DurableEnqueues`].
    pub synchronous: Synchronous,
    /// How long a connection waits for another process's lock before the operation
    /// fails with `Error::Unavailable`. Default 5 s.
    pub busy_timeout: Duration,
    /// Reader threads, each with its own connection, serving `get`, `payload`, `list`,
    /// `stats`, `children` and the checks of `wait_for_work`. Default 2, at least 1.
    pub readers: usize,
    /// How often `wait_for_work` looks for jobs enqueued by *other processes*; inside one
    /// process an enqueue wakes waiters at once. Default 100 ms.
    pub poll_interval: Duration,
    /// The most operations one group commit holds. Default 1024.
    pub max_group: usize,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            synchronous: Synchronous::DurableEnqueues,
            busy_timeout: Duration::from_secs(5),
            readers: 2,
            poll_interval: Duration::from_millis(100),
            max_group: 1024,
        }
    }
}

impl SqliteConfig {
    /// Sets when commits reach stable storage.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// Sets how long to wait for another process's lock.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets the number of reader threads (at least 1).
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers;
        self
    }

    /// Sets how often `wait_for_work` polls for other processes' jobs.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets the most operations one group commit holds (at least 1).
    pub fn max_group(mut self, max_group: usize) -> Self {
        self.max_group = max_group;
        self
    }

    pub(crate) fn validate(&self) -> durq_core::Result<()> {
        if self.readers == 0 {
            return Err(durq_core::Error::invalid("readers", "must be at least 1"));
        }
        if self.max_group == 0 {
            return Err(durq_core::Error::invalid("max_group", "must be at least 1"));
        }
        if self.poll_interval.is_zero() {
            return Err(durq_core::Error::invalid(
                "poll_interval",
                "must be longer than zero",
            ));
        }
        Ok(())
    }
}

impl SqliteConfig {
    /// Opens (creating if needed) the queue in the file at `path` with this
    /// configuration, applying any missing schema migrations, and returns the backend
    /// of namespace `settings.namespace`: the one way to open a SQLite backend with
    /// more than the defaults ([`SqliteBackend::open`] is its shortcut).
    pub async fn open(
        self,
        path: impl AsRef<Path>,
        settings: StoreSettings,
    ) -> durq_core::Result<SqliteBackend> {
        SqliteBackend::open_configured(path.as_ref(), settings, self).await
    }
}
