//! Shared by the test binaries that write to the shared Redis and PostgreSQL servers:
//! removing what a test wrote there when it ends, passed or panicked.

// Each binary uses the helpers of the backend features it is built with.
#![allow(dead_code)]

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;

/// Runs `test`, then `teardown` whether the test passed or panicked. A test that
/// panicked goes on panicking with its own message (a failed teardown is only
/// printed then); a test that passed fails if its teardown did.
pub async fn with_teardown<T, D>(test: T, teardown: D)
where
    T: Future<Output = ()>,
    D: Future<Output = Result<(), String>>,
{
    let outcome = AssertUnwindSafe(test).catch_unwind().await;
    let removed = teardown.await;
    match (outcome, removed) {
        (Err(panic), Err(err)) => {
            eprintln!("*** {err}");
            std::panic::resume_unwind(panic);
        }
        (Err(panic), Ok(())) => std::panic::resume_unwind(panic),
        (Ok(()), Err(err)) => panic!("{err}"),
        (Ok(()), Ok(())) => {}
    }
}

/// Deletes every key of `namespace` on the Redis server at `url`, as the backend's
/// conformance harness does.
#[cfg(feature = "redis")]
pub async fn drop_redis_namespace(url: &str, namespace: &str) -> Result<(), String> {
    use durq::backends::redis::RedisBackend;
    let settings = durq::StoreSettings::default().namespace(namespace);
    let dropped = async {
        RedisBackend::connect(url, settings)
            .await?
            .drop_namespace()
            .await
    };
    dropped
        .await
        .map(drop)
        .map_err(|err| format!("could not remove Redis namespace {namespace}: {err}"))
}

/// Deletes every row of `namespace` in the default schema of the PostgreSQL database
/// at `url`, as the backend's conformance harness does.
#[cfg(feature = "postgres")]
pub async fn drop_postgres_namespace(url: &str, namespace: &str) -> Result<(), String> {
    use durq::backends::postgres::{PostgresConfig, PostgresPool};
    let dropped = async {
        let config = PostgresConfig::new(url)?
            .max_connections(1)
            .application_name("jobs-facade-teardown");
        PostgresPool::connect(config)
            .await?
            .drop_namespace(namespace)
            .await
    };
    dropped
        .await
        .map(drop)
        .map_err(|err| format!("could not remove PostgreSQL namespace {namespace}: {err}"))
}
