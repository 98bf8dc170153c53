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
        .claim(durq::worker_calls::ClaimRequest::new(
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

/// A port on this host where nothing listens: bound, then let go, so a connection to it
/// is refused.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn refusing_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// A refused connection is reported at once (not after a pool's timeout), and the
/// error's own text names the server and the cause, not only its `Debug` or sources.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn assert_refused_at_once(url: &str, port: u16) {
    let opened = tokio::time::timeout(std::time::Duration::from_secs(2), durq::connect(url))
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within 2 s"));
    let err = opened.expect_err("nothing listens there");
    assert!(err.is_retryable(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.to_lowercase().contains("refused"), "{text}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_refused_redis_connection_names_the_server_and_the_cause() {
    let port = refusing_port();
    assert_refused_at_once(&format!("redis://127.0.0.1:{port}"), port).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_refused_postgres_connection_names_the_server_and_the_cause() {
    let port = refusing_port();
    assert_refused_at_once(&format!("postgres://postgres@127.0.0.1:{port}/test"), port).await;
}
