//! [`PostgresPool`]: the connection pool and the schema it migrates on opening, shared
//! by the backends of any number of namespaces, and the factory of those backends; the
//! checks made on connecting, and the pool a reopened backend gets. Its configuration
//! is in `config.rs`.

use std::sync::Arc;

use durq_core::{validate, Error, Result, StoreSettings};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::backend::PostgresBackend;
use crate::config::{Durability, PostgresConfig};
use crate::conn::Shared;
use crate::health::Health;
use crate::schema;
use crate::sql::Statements;
use crate::statistics::TableGrowth;
use crate::wake::Wake;
use crate::warm::WarmConnections;

/// Opens one connection and closes it, so a server that cannot be reached is reported
/// at once, with its address and the cause. The pool alone would retry a refused
/// connection until its acquire timeout (10 s by default) and then report only that
/// it timed out. One connection more at open, none on any later call.
async fn first_connection(config: &PostgresConfig) -> Result<()> {
    let options = &config.options;
    let server = match options.get_socket() {
        Some(socket) => format!("{}", socket.display()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let what = format!("connect to PostgreSQL at {server}");
    match tokio::time::timeout(config.acquire_timeout, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => {
            // Closing politely is a courtesy to the server's log; a failure to do so
            // says nothing about the pool's connections.
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(err)) => Err(crate::error::map(&what, err)),
        Err(elapsed) => Err(Error::unavailable(
            format!("{what}: no connection within {:?}", config.acquire_timeout),
            elapsed,
        )),
    }
}

/// Refuses options that require TLS in a build without it: every connection would
/// fail with a driver error that reads as a network failure, and callers would retry
/// it forever.
fn check_tls(options: &PgConnectOptions) -> Result<()> {
    use sqlx::postgres::PgSslMode;
    let required = matches!(
        options.get_ssl_mode(),
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
    );
    if required && !cfg!(feature = "tls") {
        return Err(Error::invalid(
            "sslmode",
            "TLS is required but this build of durq-postgres has no TLS: enable its `tls` feature",
        ));
    }
    Ok(())
}

/// What the stores of a backend share, over a pool of its own with the same options
/// and size, whose connections are opened as they are needed, from the runtime that
/// needs them (see `Backend::reopen`): a caller making one call at a time opens one.
/// The schema is migrated already; nothing is listened to until a store waits for work.
pub(crate) fn reopened(old: &Shared) -> Arc<Shared> {
    let health = Arc::new(Health::default());
    let options = old.pool.options();
    let config = PostgresConfig::from_options((*old.pool.connect_options()).clone())
        .max_connections(options.get_max_connections())
        .acquire_timeout(options.get_acquire_timeout());
    let pool = config
        .pool_options(Arc::clone(&health))
        .connect_lazy_with(config.options.clone());
    let warm = Arc::new(WarmConnections::new(pool.clone()));
    let shared = Shared {
        wake: Wake::new(
            pool.clone(),
            old.wake.channel().to_owned(),
            old.sql.notify.clone(),
            Arc::clone(&health),
            Arc::clone(&warm),
        ),
        sql: Arc::clone(&old.sql),
        schema: old.schema.clone(),
        warm,
        pool,
        health,
        growth: TableGrowth::default(),
        flow_gates: Default::default(),
    };
    Arc::new(shared)
}

/// A migrated database schema and a connection pool: the factory of backends, one per
/// namespace.
///
/// Backends of any number of namespaces can be made from one pool; they share its
/// connections and its wake-up listener. Cloning is cheap.
///
/// ```no_run
/// use durq_core::{Store, StoreSettings};
/// use durq_postgres::{PostgresPool, PostgresConfig};
/// # async fn example() -> durq_core::Result<()> {
/// let pool = PostgresPool::connect(PostgresConfig::new("postgres://localhost/app")?).await?;
/// let billing = Store::new(pool.backend(StoreSettings::default().namespace("billing"))?);
/// let email = Store::new(pool.backend(StoreSettings::default().namespace("email"))?);
/// # let _ = (billing, email);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresPool {
    shared: Arc<Shared>,
}

impl PostgresPool {
    /// Opens a pool and brings the schema to the latest version.
    ///
    /// Fails with `Unavailable` when the server cannot be reached, naming the server
    /// and the cause (a refused connection fails at once), and with `InvalidInput`
    /// (field `sslmode`) when the options require TLS and this build has none (the
    /// `tls` feature is off).
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        check_tls(&config.options)?;
        first_connection(&config).await?;
        let health = Arc::new(Health::default());
        let pool = config
            .pool_options(Arc::clone(&health))
            .connect_lazy_with(config.options.clone());
        Self::open(pool, &config.schema, config.durability, health).await
    }

    /// Uses an existing pool (its size and options are the caller's) with the
    /// tables in `schema`, migrating it first, with the default durability.
    ///
    /// The store keeps a connection it used out of the pool until the next statement
    /// takes it, for a second at most, and never while the pool has nothing idle and
    /// no room (see `docs/postgres.md`, "Connections kept between statements"): an
    /// application sharing the pool waits that second at the most for one of them.
    ///
    /// Such a pool lacks the check that keeps connections the server has closed from
    /// being handed out again (see `docs/postgres.md`): after a terminate round, each
    /// of its idle connections fails one statement (with `Unavailable`) before sqlx
    /// drops it, though the statements the store may run twice still succeed.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self> {
        Self::from_pool_with(pool, schema, Durability::default()).await
    }

    /// `from_pool` with the given durability.
    pub async fn from_pool_with(
        pool: PgPool,
        schema: &str,
        durability: Durability,
    ) -> Result<Self> {
        Self::open(pool, schema, durability, Arc::default()).await
    }

    async fn open(
        pool: PgPool,
        schema: &str,
        durability: Durability,
        health: Arc<Health>,
    ) -> Result<Self> {
        let quoted = schema::quote_schema(schema)?;
        schema::migrate(&pool, schema, &quoted).await?;
        let channel = format!("{schema}.jobs_wake");
        let sql = Statements::new(&quoted, durability.relaxes_workers());
        let warm = Arc::new(WarmConnections::new(pool.clone()));
        let shared = Shared {
            wake: Wake::new(
                pool.clone(),
                channel,
                sql.notify.clone(),
                Arc::clone(&health),
                Arc::clone(&warm),
            ),
            sql: Arc::new(sql),
            schema: schema.to_owned(),
            warm,
            pool,
            health,
            growth: TableGrowth::default(),
            flow_gates: Default::default(),
        };
        Ok(PostgresPool {
            shared: Arc::new(shared),
        })
    }

    /// What the stores of this backend share.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.shared.pool
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.shared.schema
    }

    /// The schema's applied migration version.
    pub async fn schema_version(&self) -> Result<i32> {
        let quoted = schema::quote_schema(&self.shared.schema)?;
        schema::current_version(&self.shared.pool, &quoted).await
    }

    /// Deletes the row of job `id` in `namespace` directly, leaving any dedup entry
    /// that points to it: what a lost record or a careless operator does. For tests
    /// of the store's handling of vanished jobs (CONTRACT C7, E5, R5).
    #[cfg(feature = "testing")]
    pub async fn vanish(&self, namespace: &str, id: durq_core::JobId) -> Result<()> {
        crate::store::admin::vanish(&self.shared, namespace, id).await
    }

    /// Deletes every job (with its attempts and steps), idempotency key, paused queue,
    /// schedule, worker record and event (with the record of its trims) of `namespace`
    /// in this backend's schema, in one transaction, and returns how many jobs it deleted. The schema and the other
    /// namespaces are left as they are.
    ///
    /// For tests and for retiring a namespace: jobs still running in it are gone
    /// too, and their holders' next calls answer `NotFound`.
    pub async fn drop_namespace(&self, namespace: &str) -> Result<u64> {
        crate::store::admin::drop_namespace(&self.shared, namespace).await
    }
}

impl PostgresPool {
    /// The backend of namespace `settings.namespace` over this pool; wrap it in a
    /// [`durq_core::Store`] to use it. Settings the contract refuses are refused here.
    pub fn backend(&self, settings: StoreSettings) -> Result<PostgresBackend> {
        validate::validate_settings(&settings)?;
        Ok(PostgresBackend::new(Arc::clone(self.shared()), settings))
    }
}
