//! TLS (issue #12), with the `tls` feature: a store connected with `sslmode=require`
//! works, and its connections, the wake-up listener's included, are encrypted.
//!
//! Needs the server at `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! with `ssl = on`; skipped loudly without it, failed under `JOBS_REQUIRE_SERVICES=1`.
#![cfg(feature = "tls")]

use std::sync::Arc;
use std::time::Duration;

use durq_conformance::unique_namespace;
use durq_core::{ClaimRequest, JobState, ManualClock, NewJob, Store, StoreSettings};
use durq_postgres::{PgPool, PgPoolOptions, PostgresConfig, PostgresPool};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// The URL with `sslmode` set to `mode` (a repeated parameter: the last one counts).
fn with_sslmode(mode: &str) -> String {
    let url = url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode={mode}")
}

/// Whether the session behind `pool`'s next connection is encrypted, as the server
/// sees it.
async fn encrypted(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .expect("read pg_stat_ssl")
}

/// A plain connection (`sslmode=disable`) to ask the server about itself and its
/// sessions, or `None` to skip: the server is unreachable, or it has TLS off.
async fn admin() -> Option<PgPool> {
    let url = with_sslmode("disable");
    let pool = match PgPoolOptions::new().max_connections(1).connect(&url).await {
        Ok(pool) => pool,
        Err(err) => return durq_conformance::skip_or_fail("PostgreSQL", &url, &err),
    };
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&pool)
        .await
        .expect("read the server's ssl setting");
    if ssl != "on" {
        let why = format!("the server has ssl = {ssl}; the TLS test needs ssl = on");
        return durq_conformance::skip_or_fail("PostgreSQL with TLS", &url, &why);
    }
    Some(pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_connected_with_sslmode_require_works_over_tls() {
    let Some(admin) = admin().await else { return };
    assert!(
        !encrypted(&admin).await,
        "sslmode=disable is plain: the check below can tell the two apart"
    );

    let app = format!("jobs_tls_{}", std::process::id());
    let config = PostgresConfig::new(&with_sslmode("require"))
        .expect("url")
        .max_connections(2)
        .application_name(&app);
    let backend = match PostgresPool::connect(config).await {
        Ok(backend) => backend,
        Err(err) => panic!("the server has ssl = on, yet sslmode=require failed: {err:?}"),
    };
    let clock = ManualClock::default();
    let settings = StoreSettings::default()
        .namespace(unique_namespace("pg-tls"))
        .clock(Arc::new(clock.clone()));
    let namespace = settings.namespace.clone();
    let store = Store::new(backend.backend(settings).expect("valid settings"));

    // The listener opens a connection of its own; it must be encrypted too.
    store
        .wait_for_work(&["tls".to_owned()], Duration::ZERO)
        .await
        .expect("start the listener");
    let enqueued = store
        .enqueue(NewJob::new("tls").payload(&b"over tls"[..]))
        .await
        .expect("enqueue over TLS");
    let request = ClaimRequest::new(["tls"], "w", Duration::from_secs(30));
    let claimed = store.claim(request).await.expect("claim over TLS");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), enqueued.id);
    assert_eq!(&claimed[0].payload[..], b"over tls");
    store
        .complete(enqueued.id, claimed[0].token(), None)
        .await
        .expect("complete over TLS");
    let job = store.get(enqueued.id).await.expect("get");
    assert_eq!(job.state, JobState::Succeeded);

    assert!(
        encrypted(backend.pool()).await,
        "the store's own connection"
    );
    // Every session of this backend, as the server lists them: pooled connections
    // and the listener.
    let listening = async {
        loop {
            let (sessions, all_ssl, listeners): (i64, Option<bool>, i64) = sqlx::query_as(
                "SELECT count(*), bool_and(s.ssl),
                        count(*) FILTER (WHERE a.query LIKE 'LISTEN%')
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.application_name = $1",
            )
            .bind(&app)
            .fetch_one(&admin)
            .await
            .expect("read sessions");
            if listeners > 0 {
                return (sessions, all_ssl);
            }
            tokio::task::yield_now().await;
        }
    };
    let (sessions, all_ssl) = tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .expect("the listener's session shows up");
    assert!(
        sessions >= 2,
        "a pooled connection and the listener: {sessions}"
    );
    assert_eq!(
        all_ssl,
        Some(true),
        "every session of the store is encrypted"
    );

    backend
        .drop_namespace(&namespace)
        .await
        .expect("delete the test's namespace");
}
