//! [`PostgresConfig`]: how to reach the database and shape the pool (connect options,
//! schema, pool size, timeouts), [`Durability`]: which commits wait for the disk, and
//! [`PostgresConfig::open`], the one way to open a PostgreSQL backend with a full
//! configuration. The pool it opens is in `pool.rs`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{Error, Result, StoreSettings};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Connection;

use crate::backend::PostgresBackend;
use crate::health::Health;
use crate::pool::PostgresPool;
use crate::schema;

/// The schema the tables live in unless configured otherwise.
pub const DEFAULT_SCHEMA: &str = "jobs";

/// The `application_name` of the pool's connections unless the URL, the connect
/// options (or `PGAPPNAME`) or [`PostgresConfig::application_name`] name another: it
/// lets an operator find this queue's sessions in `pg_stat_activity`.
pub const DEFAULT_APPLICATION_NAME: &str = "durq";

/// How long a pooled connection may sit idle before it is pinged on its way out.
/// Recently used connections go out without the extra round trip, unless a sibling
/// was found closed by the server since they went idle (see `conn`).
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Which commits wait for the WAL to reach the disk (`synchronous_commit`), per kind
/// of call. See `docs/postgres.md`, "Durability".
///
/// Either way a crash of this process loses nothing acknowledged: a commit is done
/// when the server says so. The choice is about a crash of the database server or
/// its machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// Enqueues and the operator's `cancel` and `retry` commit as the server is
    /// configured (`synchronous_commit`, normally `on`: flushed, and on synchronous
    /// standbys, before the call returns). Workers' calls (claim, heartbeat,
    /// complete, fail, release, reclaim, purge) commit with `synchronous_commit =
    /// off`, for their own transaction only. The default.
    ///
    /// An acknowledged job is never lost. What a server crash may undo is the
    /// workers' most recent progress, at most the commits of the last
    /// `3 × wal_writer_delay` (600 ms by default) and only those after the last
    /// flushed commit (the WAL is one sequence, so flushing a commit flushes
    /// everything before it): a completion or failure rolls back to `running`, a
    /// claim to `queued`, and reclaim runs those jobs again, the at-least-once
    /// delivery a crashed worker already causes. The workers' hot path never waits
    /// for the disk.
    #[default]
    DurableEnqueues,
    /// Every commit as the server is configured: with `synchronous_commit = on`,
    /// every acknowledged call survives a server crash. Each claim and each batch of
    /// completions then waits for a WAL flush.
    Full,
}

impl Durability {
    /// Whether the workers' statements turn `synchronous_commit` off for their own
    /// transaction.
    pub(crate) fn relaxes_workers(self) -> bool {
        match self {
            Durability::DurableEnqueues => true,
            Durability::Full => false,
        }
    }
}

/// How to reach the database and shape the pool.
///
/// ```
/// use durq_postgres::PostgresConfig;
/// let config = PostgresConfig::new("postgres://app:secret@db.internal/app")?
///     .schema("jobs")?
///     .max_connections(8);
/// // The password never appears in debug output.
/// assert!(!format!("{config:?}").contains("secret"));
/// # Ok::<(), durq_core::Error>(())
/// ```
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) options: PgConnectOptions,
    pub(crate) schema: String,
    max_connections: u32,
    min_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) durability: Durability,
}

impl PostgresConfig {
    /// A configuration from a `postgres://` URL, with the default schema (`jobs`),
    /// 10 connections at most, and a 10 s wait for a free connection. The URL's
    /// parameters are honoured, `application_name` included; without one the
    /// connections are named [`DEFAULT_APPLICATION_NAME`].
    pub fn new(url: &str) -> Result<Self> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::invalid(
                "url",
                "must start with postgres:// or postgresql://",
            ));
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|err| Error::invalid("url", format!("not a Postgres URL: {err}")))?;
        Ok(Self::from_options(options))
    }

    /// A configuration from sqlx connect options (TLS, sockets, passwords from
    /// elsewhere, session parameters). Options without an `application_name` get
    /// [`DEFAULT_APPLICATION_NAME`].
    pub fn from_options(options: PgConnectOptions) -> Self {
        let options = if options.get_application_name().is_some() {
            options
        } else {
            options.application_name(DEFAULT_APPLICATION_NAME)
        };
        PostgresConfig {
            options,
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(10),
            durability: Durability::default(),
        }
    }

    /// Which commits wait for the disk; `Durability::DurableEnqueues` by default.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The schema holding the tables: 1..=48 bytes of `a-z`, `0-9`, `_`. Stores of
    /// every namespace share it; a separate schema is a separate set of tables.
    pub fn schema(mut self, schema: impl Into<String>) -> Result<Self> {
        let schema = schema.into();
        schema::quote_schema(&schema)?;
        self.schema = schema;
        Ok(self)
    }

    /// The most connections the pool opens (at least 1). The wake-up listener holds
    /// one more of its own once `wait_for_work` is first called.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Connections the pool keeps open even when idle.
    pub fn min_connections(mut self, min: u32) -> Self {
        self.min_connections = min;
        self
    }

    /// How long a call waits for a free connection before failing with `Unavailable`.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The `application_name` the server shows for this pool's connections and its
    /// wake-up listener ([`DEFAULT_APPLICATION_NAME`] unless set here or in the URL).
    pub fn application_name(mut self, name: &str) -> Self {
        self.options = self.options.application_name(name);
        self
    }

    /// The connect options, to adjust anything not covered here.
    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// The pool options this configuration stands for, checking connections against
    /// `health`.
    pub(crate) fn pool_options(&self, health: Arc<Health>) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(self.min_connections.min(self.max_connections))
            .acquire_timeout(self.acquire_timeout)
            // sqlx would ping every idle connection before handing it out, a round
            // trip per statement; ping only those idle long enough to have gone stale,
            // and those idle since before a sibling was found closed by the server
            // (a terminated connection fails its ping and sqlx opens another).
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let check = meta.idle_for >= PING_AFTER_IDLE || health.is_suspect(meta.idle_for);
                Box::pin(async move {
                    if check {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("host", &self.options.get_host())
            .field("port", &self.options.get_port())
            .field("database", &self.options.get_database())
            .field("username", &self.options.get_username())
            .field("application_name", &self.options.get_application_name())
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

impl PostgresConfig {
    /// Connects a pool of its own, migrates the schema, and opens the backend of
    /// namespace `settings.namespace` over it: the one way to open a PostgreSQL
    /// backend with a full configuration (schema, pool size, timeouts). Namespaces
    /// that share a pool open it with [`PostgresPool::connect`] and
    /// [`PostgresPool::backend`].
    pub async fn open(self, settings: StoreSettings) -> Result<PostgresBackend> {
        PostgresPool::connect(self).await?.backend(settings)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgBindIterExt;
    use sqlx::{PgPool, Postgres, Transaction};
    use uuid::Uuid;

    use super::*;
    use crate::sql::Statements;

    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

    async fn pool() -> Option<PgPool> {
        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
        let config = PostgresConfig::new(&url).ok()?.max_connections(2);
        match PostgresPool::connect(config).await {
            Ok(backend) => Some(backend.pool().clone()),
            Err(err) => durq_conformance::skip_or_fail("PostgreSQL", &url, &err),
        }
    }

    async fn synchronous_commit(tx: &mut Transaction<'_, Postgres>) -> String {
        sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&mut **tx)
            .await
            .expect("read synchronous_commit")
    }

    /// Runs `name`'s statement inside a transaction (on a namespace without jobs, so
    /// it changes nothing) and returns `synchronous_commit` as it stands afterwards in
    /// that transaction: what the statement's own commit would use.
    async fn setting_after(pool: &PgPool, sql: &Statements, name: &str) -> String {
        let ns = "durability-test-no-jobs";
        let id = Uuid::max();
        let mut tx = pool.begin().await.expect("begin");
        let query = match name {
            "claim" => sqlx::query(sql.claim.sql())
                .bind(ns)
                .bind(vec!["q"])
                .bind(1_i64)
                .bind(10_i64)
                .bind(&b"w"[..])
                .bind(2_i64),
            "claim_one_queue" => sqlx::query(sql.plain_claim(1, 10).sql())
                .bind(ns)
                .bind(vec!["q"])
                .bind(1_i64)
                .bind(10_i64)
                .bind(&b"w"[..])
                .bind(2_i64),
            "heartbeat" => sqlx::query(sql.heartbeat.sql())
                .bind(ns)
                .bind(id)
                .bind(1_i64)
                .bind(2_i64)
                .bind(1_i64),
            "complete" | "complete_again" => sqlx::query(if name == "complete" {
                sql.complete.sql()
            } else {
                sql.complete_again.sql()
            })
            .bind(ns)
            .bind([id].into_iter().bind_iter())
            .bind([1_i64].into_iter().bind_iter())
            .bind([None::<&[u8]>].into_iter().bind_iter())
            .bind(1_i64),
            "heartbeat_batch" => sqlx::query(sql.heartbeat_batch.sql())
                .bind(ns)
                .bind([id].into_iter().bind_iter())
                .bind([1_i64].into_iter().bind_iter())
                .bind(2_i64)
                .bind(1_i64),
            "fail" => sqlx::query(sql.fail.sql())
                .bind(ns)
                .bind(id)
                .bind(1_i64)
                .bind(Some(2_i64))
                .bind(1_i64)
                .bind(&b"e"[..])
                .bind(1_i32),
            "release" => sqlx::query(sql.release.sql())
                .bind(ns)
                .bind(id)
                .bind(1_i64)
                .bind(1_i64)
                .bind(1_i64),
            "reclaim" => sqlx::query(sql.reclaim.sql())
                .bind(ns)
                .bind(1_i64)
                .bind(10_i64)
                .bind(&b"e"[..]),
            "purge" => sqlx::query(sql.purge.sql())
                .bind(ns)
                .bind(1_i64)
                .bind(10_i64)
                .bind(1_i64),
            "put_worker" => sqlx::query(sql.put_worker.sql())
                .bind(ns)
                .bind("w")
                .bind("{}")
                .bind(1_i64)
                .bind(0_i64),
            "touch_worker" => sqlx::query(sql.touch_worker.sql())
                .bind(ns)
                .bind("w")
                .bind(1_i64)
                .bind(1_i64),
            "delete_worker" => sqlx::query(sql.delete_worker.sql()).bind(ns).bind("w"),
            "reap_workers" => sqlx::query(sql.reap_workers.sql()).bind(ns).bind(1_i64),
            "cancel" => sqlx::query(sql.cancel.sql()).bind(ns).bind(id).bind(1_i64),
            "retry" => sqlx::query(sql.retry.sql()).bind(ns).bind(id).bind(1_i64),
            "save_step" => sqlx::query(sql.steps.save.sql())
                .bind(ns)
                .bind(id)
                .bind(1_i64)
                .bind("s")
                .bind(&b"o"[..])
                .bind(1_i64)
                .bind(1_000_i64),
            "reopen" => sqlx::query(sql.steps.reopen.sql())
                .bind(ns)
                .bind(id)
                .bind(1_i64)
                .bind("s"),
            other => panic!("no statement {other}"),
        };
        query.fetch_all(&mut *tx).await.expect(name);
        let setting = synchronous_commit(&mut tx).await;
        tx.rollback().await.expect("rollback");
        setting
    }

    const WORKERS: [&str; 14] = [
        "claim",
        "claim_one_queue",
        "heartbeat",
        "heartbeat_batch",
        "complete",
        "complete_again",
        "fail",
        "release",
        "reclaim",
        "purge",
        "put_worker",
        "touch_worker",
        "delete_worker",
        "reap_workers",
    ];
    /// The statements that commit as the server is configured whatever the durability:
    /// the operator's, and a step's save (a worker's call, but a saved step must not
    /// run again after a server crash, CONTRACT D2).
    const KEPT: [&str; 4] = ["cancel", "retry", "save_step", "reopen"];

    /// Under `DurableEnqueues` every worker statement turns `synchronous_commit` off for
    /// its transaction, even when it matches no row, and the operator's statements and
    /// a step's save leave the server's setting; under `Full` none changes it.
    #[tokio::test]
    async fn worker_statements_commit_without_waiting_for_the_flush_by_default() {
        let Some(pool) = pool().await else { return };
        let server = {
            let mut tx = pool.begin().await.expect("begin");
            synchronous_commit(&mut tx).await
        };
        assert_ne!(server, "off", "the test needs a server that syncs commits");
        let relaxed = Statements::new("\"jobs\"", Durability::DurableEnqueues.relaxes_workers());
        let full = Statements::new("\"jobs\"", Durability::Full.relaxes_workers());
        for name in WORKERS {
            assert_eq!(setting_after(&pool, &relaxed, name).await, "off", "{name}");
            assert_eq!(setting_after(&pool, &full, name).await, server, "{name}");
        }
        for name in KEPT {
            assert_eq!(setting_after(&pool, &relaxed, name).await, server, "{name}");
        }
        // The setting is the transaction's: the connection keeps the server's.
        let after: String = sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
            .fetch_one(&pool)
            .await
            .expect("read");
        assert_eq!(after, server);
    }
}
