//! `jobs::connect` opens a working store for every scheme whose feature is enabled.

// The helpers serve whichever backend features are on; with few on, some go unused.
#![allow(dead_code)]

use jobs::{JobState, NewJob, Store, StoreSettings};

/// Enqueues, claims and completes one job: the store behind the URL works.
async fn round_trip(store: &dyn Store) {
    let id = store
        .enqueue(NewJob::new("connect").payload("ping"))
        .await
        .expect("enqueue")
        .id;
    let claimed = store
        .claim(jobs::ClaimRequest::new(
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

fn namespace() -> StoreSettings {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    StoreSettings::default().namespace(format!("connect-{}-{nanos:x}", std::process::id()))
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn skip_or_fail(service: &str, err: &jobs::Error) {
    let _: Option<()> = jobs_conformance::skip_or_fail(service, "its default URL", err);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_urls_open_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("connect.db");
    let url = format!("sqlite://{}", path.display());
    let store = jobs::connect_with(&url, namespace()).await.expect("open");
    round_trip(store.as_ref()).await;
    assert!(path.exists(), "the file is created at the URL's path");
}

#[cfg(feature = "memory")]
#[tokio::test]
async fn memory_urls_open_a_store() {
    let store = jobs::connect("memory://").await.expect("open");
    round_trip(store.as_ref()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls_connect() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    match jobs::connect_with(&url, namespace()).await {
        Ok(store) => round_trip(store.as_ref()).await,
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
        match jobs::connect_with(&url, namespace()).await {
            Ok(store) => round_trip(store.as_ref()).await,
            Err(err) => return skip_or_fail("PostgreSQL", &err),
        }
    }
}

#[cfg(not(feature = "sqlite"))]
#[tokio::test]
async fn sqlite_urls_need_the_feature() {
    let err = jobs::connect("sqlite://x.db")
        .await
        .expect_err("feature off");
    assert_eq!(err.invalid_field(), Some("url"));
}
