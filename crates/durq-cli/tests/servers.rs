//! The `durq` binary's main flow against Redis (`REDIS_URL`, default
//! `redis://127.0.0.1:6379`) and PostgreSQL (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), each in a namespace of its own that is
//! removed when the test ends, passed or panicked. A server that does not answer is
//! skipped with a loud message, or fails the test under `JOBS_REQUIRE_SERVICES=1`.
//!
//! A memory:// store lives and dies with the process that opens it, so the binary's
//! runs share nothing with each other or the test: there is no memory flow.

mod common;

use common::{durq, main_flow, with_teardown, Target};
use durq_conformance::{skip_or_fail, unique_namespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_flow_on_redis() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = unique_namespace("cli-test");
    let target = match Target::open(&url, &namespace).await {
        Ok(target) => target,
        Err(err) => return skip_or_fail("Redis", &url, &err).unwrap_or(()),
    };
    let teardown = async {
        let settings = durq::StoreSettings::default().namespace(&namespace);
        let dropped = async {
            durq::backends::redis::RedisBackend::connect(&url, settings)
                .await?
                .drop_namespace()
                .await
        };
        dropped
            .await
            .map(drop)
            .map_err(|err| format!("could not remove Redis namespace {namespace}: {err}"))
    };
    with_teardown(main_flow(&target), teardown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_flow_on_postgres() {
    use durq::backends::postgres::{PostgresConfig, PostgresPool};
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let namespace = unique_namespace("cli-test");
    let target = match Target::open(&url, &namespace).await {
        Ok(target) => target,
        Err(err) => return skip_or_fail("PostgreSQL", &url, &err).unwrap_or(()),
    };
    let teardown = async {
        let dropped = async {
            let config = PostgresConfig::new(&url)?
                .max_connections(1)
                .application_name("durq-cli-teardown");
            PostgresPool::connect(config)
                .await?
                .drop_namespace(&namespace)
                .await
        };
        dropped
            .await
            .map(drop)
            .map_err(|err| format!("could not remove PostgreSQL namespace {namespace}: {err}"))
    };
    with_teardown(main_flow(&target), teardown).await;
}

/// A memory:// store is said to be private to its process, and a command on it works.
#[test]
fn memory_urls_warn_that_they_share_nothing() {
    let run = durq(&["--url", "memory://", "queues"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        run.stdout,
        "(no queues in namespace \"default\"; another namespace: -n NAME)\n"
    );
    assert!(
        run.stderr
            .starts_with("durq: warning: memory:// opens a new, empty store"),
        "{run:#?}"
    );
}

/// The binary is built with TLS: a URL asking PostgreSQL for it (`sslmode=require`, as
/// managed databases do) connects and reads, where a build without TLS refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_url_asking_for_tls_is_served() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let namespace = unique_namespace("cli-tls");
    // The server must answer at all; whether it offers TLS is what the run shows.
    if let Err(err) = Target::open(&url, &namespace).await {
        return skip_or_fail("PostgreSQL", &url, &err).unwrap_or(());
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    let tls = format!("{url}{separator}sslmode=require");
    let run = durq(&["--url", &tls, "-n", &namespace, "queues"]);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.starts_with("(no queues"), "{run:#?}");
}
