//! The conformance suite against Redis.
//!
//! Single server: `REDIS_URL` (default `redis://127.0.0.1:6379`).
//! Cluster: set `JOBS_REDIS_CLUSTER_URLS` to the comma-separated node URLs (as
//! `cargo xtask conformance --backend redis-cluster` does) and every test runs on it.
//!
//! The suite runs twice: on unpartitioned namespaces, and (module `partitioned`) on
//! namespaces of [`PARTITIONS`] partitions (CONTRACT §8), where it asserts the claim
//! order per partition.
//!
//! Every namespace a scenario opened is deleted after it (`RedisBackend::drop_namespace`),
//! so a run leaves nothing behind on the shared server.

use durq_conformance::{skip_or_fail, Harness};
use durq_core::{async_trait, Error, JobId, Result, Store, StoreSettings};
use durq_redis::{RedisBackend, RedisConfig};
use redis::aio::ConnectionLike;

enum Target {
    Single(String),
    Cluster(Vec<String>),
}

struct RedisHarness {
    target: Target,
    /// The partitions of every namespace the harness opens.
    partitions: usize,
}

/// The partitions of the second run: more than a 3-master cluster has masters, and not
/// a multiple of 2, so spreading and rotation are both exercised.
const PARTITIONS: usize = 12;

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

#[async_trait]
impl Harness for RedisHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        Ok(Store::new(self.connect(settings).await?))
    }

    /// The record and its steps, as purge deletes them (CONTRACT C7: a lost record is
    /// lost whole). One `DEL` of two keys of one slot, so a cluster takes it too.
    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        admin(
            &self.target,
            redis::cmd("DEL")
                .arg(durq_redis::job_key_in(namespace, self.partitions, id))
                .arg(durq_redis::steps_key_in(namespace, self.partitions, id)),
        )
        .await
        .map(drop)
        .map_err(|err| Error::unavailable("vanish", err))
    }

    /// A `meta` field that is not the record's encoding of its rarer fields.
    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        let key = durq_redis::job_key_in(namespace, self.partitions, id);
        let exists = admin(&self.target, redis::cmd("EXISTS").arg(&key))
            .await
            .map_err(|err| Error::unavailable("corrupt", err))?;
        if exists != redis::Value::Int(1) {
            return Ok(false);
        }
        admin(
            &self.target,
            redis::cmd("HSET").arg(&key).arg("meta").arg("not meta"),
        )
        .await
        .map_err(|err| Error::unavailable("corrupt", err))?;
        Ok(true)
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        let settings = StoreSettings::default().namespace(namespace);
        self.connect(settings).await?.drop_namespace().await?;
        Ok(())
    }
}

impl RedisHarness {
    async fn connect(&self, settings: StoreSettings) -> Result<RedisBackend> {
        match &self.target {
            Target::Single(url) => RedisConfig::new(url),
            Target::Cluster(urls) => RedisConfig::cluster(urls.iter().cloned()),
        }
        .partitions(self.partitions)
        .open(settings)
        .await
    }
}

async fn harness() -> Option<RedisHarness> {
    harness_of(1).await
}

async fn partitioned_harness() -> Option<RedisHarness> {
    harness_of(PARTITIONS).await
}

async fn harness_of(partitions: usize) -> Option<RedisHarness> {
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
    // opening an unpartitioned one writes no key.
    let probe = StoreSettings::default().namespace("conformance-probe");
    let reached = match &target {
        Target::Single(url) => RedisBackend::connect(url, probe).await.map(drop),
        Target::Cluster(urls) => RedisConfig::cluster(urls.iter().cloned())
            .open(probe)
            .await
            .map(drop),
    };
    match reached {
        Ok(()) => Some(RedisHarness { target, partitions }),
        Err(err) => skip_or_fail("Redis", &shown, &err),
    }
}

/// Every key matching `pattern` on the server at `url` (SCAN, so the server is never
/// blocked): how the test checks `drop_namespace` without trusting it.
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

/// Every key of `namespace` and of its partitions (`{namespace#p}`), asking each node
/// of a cluster for its own.
async fn namespace_keys(target: &Target, namespace: &str) -> redis::RedisResult<Vec<String>> {
    let pattern = format!("jobs:{{{namespace}[}}#]*");
    let urls = match target {
        Target::Single(url) => vec![url.clone()],
        Target::Cluster(urls) => urls.clone(),
    };
    let mut keys = Vec::new();
    for url in &urls {
        keys.extend(scan(url, &pattern).await?);
    }
    // A replica lists its master's keys too.
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// The harness's teardown deletes every key of a namespace and nothing of another.
#[tokio::test]
async fn teardown_deletes_the_namespace_and_only_it() {
    for partitions in [1, PARTITIONS] {
        let Some(harness) = harness_of(partitions).await else {
            return;
        };
        teardown_deletes(harness).await;
    }
}

async fn teardown_deletes(harness: RedisHarness) {
    let open = |namespace: String| {
        let harness = &harness;
        async move {
            harness
                .open(StoreSettings::default().namespace(namespace))
                .await
                .expect("open")
        }
    };
    let gone = durq_conformance::unique_namespace("teardown");
    let kept = format!("{gone}-kept");
    for namespace in [&gone, &kept] {
        let store = open(namespace.clone()).await;
        let parent = store
            .enqueue(durq_core::NewJob::new("q").idempotency_key("k"))
            .await
            .expect("enqueue")
            .id;
        store
            .enqueue(durq_core::NewJob::new("q").parent(parent))
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

durq_conformance::conformance_tests!(harness);

/// The whole suite again on partitioned namespaces.
mod partitioned {
    durq_conformance::conformance_tests!(super::partitioned_harness);
}
