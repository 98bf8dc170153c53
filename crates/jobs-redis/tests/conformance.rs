//! The conformance suite against Redis.
//!
//! Single server: `REDIS_URL` (default `redis://127.0.0.1:6379`).
//! Cluster: set `JOBS_REDIS_CLUSTER_URLS` to the comma-separated node URLs (as
//! `cargo xtask conformance --backend redis-cluster` does) and every test runs on it.

use std::sync::Arc;

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

async fn admin_del(target: &Target, key: &str) -> redis::RedisResult<()> {
    let cmd = redis::cmd("DEL").arg(key).clone();
    match target {
        Target::Single(url) => {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            conn.req_packed_command(&cmd).await.map(drop)
        }
        Target::Cluster(urls) => {
            let client = redis::cluster::ClusterClient::new(urls.clone())?;
            let mut conn = client.get_async_connection().await?;
            conn.req_packed_command(&cmd).await.map(drop)
        }
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Arc<dyn Store>> {
        let store = match &self.target {
            Target::Single(url) => RedisStore::connect(url, settings).await?,
            Target::Cluster(urls) => RedisStore::connect_cluster(urls, settings).await?,
        };
        Ok(Arc::new(store))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        admin_del(&self.target, &jobs_redis::job_key(namespace, id))
            .await
            .map_err(|err| Error::unavailable("vanish", err))
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
    // A store on a throwaway namespace proves the server answers and takes the scripts.
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

jobs_conformance::conformance_tests!(harness);
