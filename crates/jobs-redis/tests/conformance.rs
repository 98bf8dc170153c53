//! The conformance suite against Redis.
//!
//! Single server: `REDIS_URL` (default `redis://127.0.0.1:6379`).
//! Cluster: set `JOBS_REDIS_CLUSTER_URLS` to the comma-separated node URLs (as
//! `cargo xtask conformance --backend redis-cluster` does) and every test runs on it.
//!
//! Every namespace a scenario opened is deleted after it, key by key, so a run leaves
//! nothing behind on the shared server.

use jobs_conformance::{skip_or_fail, Harness};
use jobs_core::{async_trait, Error, JobId, Result, Store, StoreSettings};
use jobs_redis::RedisStore;
use redis::aio::ConnectionLike;

enum Target {
    Single(String),
    Cluster(Vec<String>),
}

struct RedisHarness {
    target: Target,
}

/// Runs `cmd` on the server, or through the cluster (routed by its key).
async fn admin(target: &Target, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    match target {
        Target::Single(url) => {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            conn.req_packed_command(cmd).await
        }
        Target::Cluster(urls) => {
            let client = redis::cluster::ClusterClient::new(urls.clone())?;
            let mut conn = client.get_async_connection().await?;
            conn.req_packed_command(cmd).await
        }
    }
}

/// Every key matching `pattern` on the server at `url` (SCAN, so the server is never
/// blocked). On a cluster each node is asked for its own keys.
async fn scan(url: &str, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        keys.extend(page);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Every key of `namespace`. Its keys all start with `jobs:{namespace}:` (see
/// `jobs_redis::job_key`) and share that hash tag, so on a cluster they sit on one
/// node, which the per-node SCAN finds.
async fn namespace_keys(target: &Target, namespace: &str) -> redis::RedisResult<Vec<String>> {
    let pattern = format!("jobs:{{{namespace}}}:*");
    match target {
        Target::Single(url) => scan(url, &pattern).await,
        Target::Cluster(urls) => {
            let mut keys = Vec::new();
            for url in urls {
                keys.extend(scan(url, &pattern).await?);
            }
            // A replica lists its master's keys too.
            keys.sort();
            keys.dedup();
            Ok(keys)
        }
    }
}

/// Deletes every key of `namespace`: one UNLINK per chunk, routed to the namespace's
/// node on a cluster.
async fn delete_namespace(target: &Target, namespace: &str) -> redis::RedisResult<()> {
    let keys = namespace_keys(target, namespace).await?;
    for chunk in keys.chunks(1000) {
        admin(target, redis::cmd("UNLINK").arg(chunk)).await?;
    }
    Ok(())
}

#[async_trait]
impl Harness for RedisHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let store = match &self.target {
            Target::Single(url) => RedisStore::connect(url, settings).await?,
            Target::Cluster(urls) => RedisStore::connect_cluster(urls, settings).await?,
        };
        Ok(Store::new(store))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        admin(
            &self.target,
            redis::cmd("DEL").arg(jobs_redis::job_key(namespace, id)),
        )
        .await
        .map(drop)
        .map_err(|err| Error::unavailable("vanish", err))
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        delete_namespace(&self.target, namespace)
            .await
            .map_err(|err| Error::unavailable("teardown", err))
    }
}

async fn harness() -> Option<RedisHarness> {
    let target = match std::env::var("JOBS_REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.trim().is_empty() => Target::Cluster(
            urls.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect(),
        ),
        _ => Target::Single(
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        ),
    };
    let shown = match &target {
        Target::Single(url) => url.clone(),
        Target::Cluster(urls) => urls.join(","),
    };
    // A store on a throwaway namespace proves the server answers and takes the scripts;
    // opening writes no key.
    let probe = StoreSettings::default().namespace("conformance-probe");
    let reached = match &target {
        Target::Single(url) => RedisStore::connect(url, probe).await.map(drop),
        Target::Cluster(urls) => RedisStore::connect_cluster(urls, probe).await.map(drop),
    };
    match reached {
        Ok(()) => Some(RedisHarness { target }),
        Err(err) => skip_or_fail("Redis", &shown, &err),
    }
}

/// The harness's teardown deletes every key of a namespace and nothing of another.
#[tokio::test]
async fn teardown_deletes_the_namespace_and_only_it() {
    let Some(harness) = harness().await else {
        return;
    };
    let open = |namespace: String| {
        let harness = &harness;
        async move {
            harness
                .open(StoreSettings::default().namespace(namespace))
                .await
                .expect("open")
        }
    };
    let gone = jobs_conformance::unique_namespace("teardown");
    let kept = format!("{gone}-kept");
    for namespace in [&gone, &kept] {
        let store = open(namespace.clone()).await;
        let parent = store
            .enqueue(jobs_core::NewJob::new("q").idempotency_key("k"))
            .await
            .expect("enqueue")
            .id;
        store
            .enqueue(jobs_core::NewJob::new("q").parent(parent))
            .await
            .expect("enqueue");
    }
    let count = |namespace: String| {
        let target = &harness.target;
        async move {
            namespace_keys(target, &namespace)
                .await
                .expect("scan")
                .len()
        }
    };
    assert!(count(gone.clone()).await > 0);
    let kept_before = count(kept.clone()).await;
    harness.teardown(&gone).await.expect("teardown");
    assert_eq!(count(gone.clone()).await, 0, "keys of {gone} left behind");
    assert_eq!(
        count(kept.clone()).await,
        kept_before,
        "another namespace was touched"
    );
    harness.teardown(&kept).await.expect("teardown");
    assert_eq!(count(kept).await, 0);
}

jobs_conformance::conformance_tests!(harness);
