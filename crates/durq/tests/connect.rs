//! `durq::connect` opens a working store for every scheme whose feature is enabled.
//! What the tests write on the shared Redis and PostgreSQL servers is removed when
//! they end.

// The helpers serve whichever backend features are on; with few on, some go unused.
#![allow(dead_code)]

mod common;

use durq::{JobState, NewJob, Store, StoreSettings};

/// Enqueues, claims and completes one job: the store behind the URL works.
async fn round_trip(store: &Store) {
    let id = store
        .enqueue(NewJob::new("connect").payload("ping"))
        .await
        .expect("enqueue")
        .id;
    let claimed = store
        .claim(durq::ClaimRequest::new(
            ["connect"],
            "w",
            std::time::Duration::from_secs(30),
        ))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id(), id);
    assert_eq!(claimed[0].payload, "ping");
    store
        .complete(id, claimed[0].token(), None)
        .await
        .expect("complete");
    assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);
}

/// A namespace of its own for one test.
fn namespace() -> String {
    durq_conformance::unique_namespace("connect")
}

fn settings(namespace: &str) -> StoreSettings {
    StoreSettings::default().namespace(namespace)
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn skip_or_fail(service: &str, err: &durq::Error) {
    let _: Option<()> = durq_conformance::skip_or_fail(service, "its default URL", err);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_urls_open_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("connect.db");
    let url = format!("sqlite://{}", path.display());
    let store = durq::connect_with(&url, settings(&namespace()))
        .await
        .expect("open");
    round_trip(&store).await;
    assert!(path.exists(), "the file is created at the URL's path");
}

#[cfg(feature = "memory")]
#[tokio::test]
async fn memory_urls_open_a_store() {
    let store = durq::connect("memory://").await.expect("open");
    round_trip(&store).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls_connect() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = namespace();
    match durq::connect_with(&url, settings(&namespace)).await {
        Ok(store) => {
            common::with_teardown(
                round_trip(&store),
                common::drop_redis_namespace(&url, &namespace),
            )
            .await
        }
        Err(err) => skip_or_fail("Redis", &err),
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_urls_connect_under_both_schemes() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let long = url.replacen("postgres://", "postgresql://", 1);
    for url in [url.clone(), long] {
        let namespace = namespace();
        match durq::connect_with(&url, settings(&namespace)).await {
            Ok(store) => {
                common::with_teardown(
                    round_trip(&store),
                    common::drop_postgres_namespace(&url, &namespace),
                )
                .await
            }
            Err(err) => return skip_or_fail("PostgreSQL", &err),
        }
    }
}

#[cfg(not(feature = "sqlite"))]
#[tokio::test]
async fn sqlite_urls_need_the_feature() {
    let err = durq::connect("sqlite://x.db")
        .await
        .expect_err("feature off");
    assert_eq!(err.invalid_field(), Some("url"));
}
