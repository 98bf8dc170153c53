//! Connections the server has closed (issue #11): noticed, dropped, never handed out
//! again, and the statements that may run twice run once more on a live connection.
//!
//! A connection the server terminated (`pg_terminate_backend`, a restart, a failover)
//! looks fine from this side until it is used: the server's last words and the closed
//! socket wait in the kernel until the next statement reads them. sqlx pings a pooled
//! connection on its way out only when asked to, and pinging every time costs a round
//! trip per statement, so the pool pings only connections idle for a while (see
//! `config::PING_AFTER_IDLE`); a connection the store keeps between statements (see
//! `warm`) is given back to the pool once idle that long. Without more, every idle
//! connection of a pool whose connections were all terminated fails one statement
//! each, whoever gets it: a worker retrying a completion could draw a dead connection
//! on every try.
//!
//! What is done instead:
//! - A statement that fails because its connection is gone detaches that connection
//!   from the pool (it is dropped, never returned) and records the moment in
//!   [`Health`]. Whatever kills one connection usually kills its siblings, so from then
//!   on the pool's `before_acquire` hook pings every connection that went idle before
//!   that moment before handing it out: one round trip per suspect connection, once.
//!   Connections returned after the moment were pinged by sqlx on their return, after
//!   the kill, so they go out unchecked as usual. Connections the store parked before
//!   the moment go back to the pool instead of to the next statement (`warm`). The
//!   wake-up listener reports the loss of its own connection too, usually before any
//!   statement meets a dead one.
//! - Statements that are safe to run twice (reads; claim, heartbeat, reclaim, purge,
//!   cancel; complete, whose second run recognises its own first one, see
//!   `sql::COMPLETE`) are then sent once more, on a connection that has just answered
//!   a ping. Enqueue, fail, release and retry are not: their caller gets `Unavailable`
//!   (the first run may have committed, and a second would answer "lease lost" or
//!   enqueue twice); the dead connection is gone all the same.

use std::fmt;
use std::sync::Arc;

use durq_core::Result;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Connection, PgPool, Postgres, Transaction};

use crate::error::{is_connection_lost, is_deadlock, map};
use crate::health::Health;
use crate::sql::Statements;
use crate::statistics::TableGrowth;
use crate::wake::Wake;
use crate::warm::{Checkout, WarmConnections};

/// Times [`Shared::fetch_all_again`] sends a statement again after the server aborted
/// it to break a deadlock: each time, the statement it deadlocked with went on.
const DEADLOCK_RETRIES: u32 = 3;

/// A statement with its parameters bound, ready to run on a connection.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// What every store of one backend shares: the pool, the schema's statements, the
/// wake-up listener.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) schema: String,
    pub(crate) sql: Arc<Statements>,
    pub(crate) wake: Wake,
    /// When a connection of the pool was last found closed by the server.
    pub(crate) health: Arc<Health>,
    /// Jobs claimed since the job table's size was last compared with its
    /// statistics.
    pub(crate) growth: TableGrowth,
    /// The in-process turns of the claims of limited queues (CONTRACT K1–K5).
    pub(crate) flow_gates: crate::store::limits::FlowGates,
    /// Connections kept out of the pool between statements (see `warm`).
    pub(crate) warm: Arc<WarmConnections>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("schema", &self.schema)
            .field("pool_size", &self.pool.size())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The error of a statement that failed on `conn`: when the connection is gone,
    /// it is detached (dropped, never returned to the pool) and the loss recorded.
    fn failed(&self, what: &str, conn: Checkout, err: sqlx::Error) -> durq_core::Error {
        if is_connection_lost(&err) {
            self.health.mark_lost();
            drop(conn.into_inner().detach());
        }
        map(what, err)
    }

    /// A driver error that did not come with a connection in hand (a pool acquire, a
    /// statement run on the pool): maps it, recording a loss it reports.
    pub(crate) fn error(&self, what: &str, err: sqlx::Error) -> durq_core::Error {
        if is_connection_lost(&err) {
            self.health.mark_lost();
        }
        map(what, err)
    }

    /// Begins a transaction on a connection of the pool, in a way that may be dropped
    /// at any point.
    ///
    /// Callers stop waiting: a worker's claim loop drops its `wait_for_work` whenever a
    /// job finishes, and a dashboard request ends with its client. sqlx's `begin`
    /// dropped after its `BEGIN` reached the server hands the connection back to the
    /// pool inside the transaction (its rollback guard acts only once it has counted
    /// the transaction), and whatever runs next on that connection, another worker's
    /// completion say, runs inside it and is lost with it: a chaos run showed
    /// acknowledged completions undone so. Begun on a task of its own, the `BEGIN` is
    /// always answered and counted; a caller that stopped waiting drops the transaction
    /// once it is begun, which rolls it back. Once begun, a transaction dropped halfway
    /// rolls back (sqlx queues the `ROLLBACK` before the connection's next use).
    pub(crate) async fn begin(&self, what: &str) -> Result<Transaction<'static, Postgres>> {
        self.warm.make_room();
        let pool = self.pool.clone();
        match tokio::spawn(async move { pool.begin().await }).await {
            Ok(begun) => begun.map_err(|err| self.error(what, err)),
            Err(err) => Err(durq_core::Error::unavailable(
                format!("{what}: the task beginning the transaction ended"),
                err,
            )),
        }
    }

    /// A connection for one or more statements: a parked one if there is one (see
    /// `warm`), else one from the pool. Give it back with [`Shared::park`] once its
    /// last statement has answered; dropped, it goes back to the pool.
    pub(crate) async fn acquire(&self, what: &str) -> Result<Checkout> {
        self.warm
            .acquire(&self.health)
            .await
            .map_err(|err| self.error(what, err))
    }

    /// Keeps `conn`, whose last statement ran to its answer, for the next statement.
    pub(crate) fn park(&self, conn: Checkout) {
        self.warm.park(conn);
    }

    /// Runs `query` once.
    pub(crate) async fn fetch_all(&self, what: &str, query: PgQuery<'_>) -> Result<Vec<PgRow>> {
        let mut conn = self.acquire(what).await?;
        match query.fetch_all(&mut *conn).await {
            Ok(rows) => {
                self.park(conn);
                Ok(rows)
            }
            Err(err) => Err(self.failed(what, conn, err)),
        }
    }

    /// Runs the statement `build(false)` makes; when its connection turns out to be
    /// gone, runs `build(true)` once more on a connection that has just answered a
    /// ping. Only for statements whose second run is right whether or not the first
    /// one committed before the connection broke.
    ///
    /// A statement the server aborted to break a deadlock wrote nothing, so it is
    /// sent again as it was, up to [`DEADLOCK_RETRIES`] times. Two batches of
    /// completions in flight deadlock when they share two jobs (a second `complete` of
    /// a job goes in the next batch) and the plan locks them in different orders
    /// (the server log showed it: `deadlock detected` between two completion batches);
    /// the batch that lost then answers as if it had run after the other.
    pub(crate) async fn fetch_all_again<'q>(
        &self,
        what: &str,
        build: impl Fn(bool) -> PgQuery<'q>,
    ) -> Result<Vec<PgRow>> {
        let mut conn = self.acquire(what).await?;
        let mut deadlocks = 0;
        let err = loop {
            match build(false).fetch_all(&mut *conn).await {
                Ok(rows) => {
                    self.park(conn);
                    return Ok(rows);
                }
                Err(err) if is_deadlock(&err) && deadlocks < DEADLOCK_RETRIES => {
                    deadlocks += 1;
                    tracing::debug!(what, error = %err, "deadlock; running the statement again");
                }
                Err(err) => break err,
            }
        };
        if !is_connection_lost(&err) {
            return Err(map(what, err));
        }
        self.health.mark_lost();
        drop(conn.into_inner().detach());
        tracing::debug!(what, error = %err, "connection lost; running the statement again");
        let mut conn = self.live_connection(what).await?;
        match build(true).fetch_all(&mut *conn).await {
            Ok(rows) => {
                self.park(conn);
                Ok(rows)
            }
            Err(err) => Err(self.failed(what, conn, err)),
        }
    }

    /// A pooled connection that has just answered a ping. Pools made by
    /// `PostgresConfig` already check suspect connections before handing them out; a
    /// pool given to `from_pool` may not, so every connection it holds may be dead:
    /// one more try than it has connections.
    async fn live_connection(&self, what: &str) -> Result<Checkout> {
        let tries = self.pool.options().get_max_connections().saturating_add(1);
        let mut last = None;
        for _ in 0..tries {
            let mut conn = self.acquire(what).await?;
            match conn.ping().await {
                Ok(()) => return Ok(conn),
                Err(err) if is_connection_lost(&err) => {
                    drop(conn.into_inner().detach());
                    last = Some(err);
                }
                Err(err) => return Err(self.failed(what, conn, err)),
            }
        }
        Err(match last {
            Some(err) => map(what, err),
            None => map(what, sqlx::Error::PoolTimedOut),
        })
    }
}
