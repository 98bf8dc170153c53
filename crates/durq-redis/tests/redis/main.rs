//! Redis-specific behaviour beyond the conformance suite: scale (200,000 due jobs,
//! 100,000 live leases), reconnection, wake-ups, script reloading, garbage-collection
//! TTLs, records that vanish by TTL, corrupt records, and key placement on a cluster.
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`); skipped loudly when
//! it is unreachable, failing instead when `JOBS_REQUIRE_SERVICES=1`. Every test removes
//! the keys (and ACL users) it wrote when it ends, passed or failed (see [`Cleanup`]).

mod claims_and_records;
mod dependencies;
mod durability_and_fit;
mod events;
mod keys_scale_and_connections;
mod partitions;
mod reads_and_history;
mod steps;
mod upgrade;
mod waits;

use durq_core::{
    Budget, Bytes, ClaimRequest, Clock, Error, JobId, JobState, ListQuery, ManualClock, Needs,
    NewJob, ReadyOrder, ReclaimedJob, Retry, Store, StoreSettings, Timestamp,
};
use durq_redis::{ReclaimReport, RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Removes what a test wrote when dropped, at the end of the test, whether it passed or
/// panicked: every key of `namespace` on each of `nodes` (SCAN and UNLINK on each node,
/// so on a cluster the node holding the namespace's slot deletes its keys), and the ACL
/// `users` it created. A drop cannot await, so this uses a blocking connection.
struct Cleanup {
    nodes: Vec<String>,
    namespace: String,
    users: Vec<String>,
}

impl Cleanup {
    fn new(nodes: Vec<String>, namespace: &str) -> Self {
        Cleanup {
            nodes,
            namespace: namespace.to_owned(),
            users: Vec::new(),
        }
    }

    fn run(&self) -> redis::RedisResult<()> {
        // The namespace's own keys and its partitions' (`{namespace#p}`).
        let pattern = format!("jobs:{{{}[}}#]*", self.namespace);
        for node in &self.nodes {
            let mut conn = redis::Client::open(node.as_str())?.get_connection()?;
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(10_000)
                    .query(&mut conn)?;
                for chunk in keys.chunks(1000) {
                    redis::cmd("UNLINK").arg(chunk).exec(&mut conn)?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        if let Some(node) = self.nodes.first().filter(|_| !self.users.is_empty()) {
            let mut conn = redis::Client::open(node.as_str())?.get_connection()?;
            redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.users)
                .exec(&mut conn)?;
        }
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Err(err) = self.run() {
            let what = format!(
                "could not remove namespace {} (and users {:?}): {err}",
                self.namespace, self.users
            );
            // Failing a test that already failed would abort the process.
            if std::thread::panicking() {
                eprintln!("*** {what}");
            } else {
                panic!("{what}");
            }
        }
    }
}

/// A Redis backend behind the contract's handle: the handle (which validates and reads
/// the clock, as users get it) for the operations, the backend for what only Redis has.
#[derive(Clone)]
struct TestStore {
    handle: Store,
    redis: RedisBackend,
}

impl TestStore {
    fn new(redis: RedisBackend) -> Self {
        TestStore {
            handle: Store::new(redis.clone()),
            redis,
        }
    }

    async fn wake_ready(&self, timeout: Duration) -> bool {
        self.redis.wake_ready(timeout).await
    }

    fn waiting_for_work(&self) -> usize {
        self.redis.waiting_for_work()
    }

    async fn reclaim_with_report(
        &self,
        limit: usize,
    ) -> durq_core::Result<(Vec<ReclaimedJob>, ReclaimReport)> {
        self.redis
            .reclaim_with_report(limit, self.handle.now())
            .await
    }
}

impl std::ops::Deref for TestStore {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.handle
    }
}

struct Env {
    clock: ManualClock,
    settings: StoreSettings,
    admin: MultiplexedConnection,
    cleanup: Cleanup,
}

impl Env {
    async fn new() -> Option<Env> {
        let url = url();
        // Cleaning up 200,000 keys takes longer than the driver's default 500 ms.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_secs(120)));
        let admin = match redis::Client::open(url.as_str()) {
            Ok(client) => match client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(conn) => conn,
                Err(err) => return durq_conformance::skip_or_fail("Redis", &url, &err),
            },
            Err(err) => return durq_conformance::skip_or_fail("Redis", &url, &err),
        };
        let clock = ManualClock::default();
        let namespace = durq_conformance::unique_namespace("redis");
        let cleanup = Cleanup::new(vec![url.clone()], &namespace);
        let settings = StoreSettings::default()
            .namespace(namespace)
            .clock(Arc::new(clock.clone()));
        Some(Env {
            clock,
            settings,
            admin,
            cleanup,
        })
    }

    async fn store(&self) -> TestStore {
        match RedisBackend::connect(&url(), self.settings.clone()).await {
            Ok(store) => TestStore::new(store),
            Err(err) => panic!("cannot connect: {err}"),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("jobs:{{{}}}:{name}", self.settings.namespace)
    }

    async fn zcard(&mut self, name: &str) -> u64 {
        let key = self.key(name);
        let n: u64 = self.admin.zcard(&key).await.expect("ZCARD");
        n
    }

    async fn llen(&mut self, name: &str) -> u64 {
        let key = self.key(name);
        let n: u64 = self.admin.llen(&key).await.expect("LLEN");
        n
    }

    /// Every key of the namespace's jobs (SCAN, so the server is never blocked): all
    /// but its layout record, which every store writes when it first opens the
    /// namespace and which outlives the jobs.
    async fn namespace_keys(&mut self) -> Vec<String> {
        let layout = self.key("layout");
        let pattern = format!("jobs:{{{}}}:*", self.settings.namespace);
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut self.admin)
                .await
                .expect("SCAN");
            out.extend(keys.into_iter().filter(|key| *key != layout));
            if next == 0 {
                return out;
            }
            cursor = next;
        }
    }
}

/// Enqueues `n` jobs on queue `q` and claims them all, with a 5 s lease, in order.
async fn enqueue_and_claim(store: &Store, n: usize) -> Vec<durq_core::ClaimedJob> {
    enqueue_all(store, (0..n).map(|_| NewJob::new("q")).collect()).await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(n))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), n, "every job enqueued is claimed");
    claimed
}

/// Enqueues `jobs` in batches of 10,000 (the batch limit), returning the ids in order.
async fn enqueue_all(store: &Store, jobs: Vec<NewJob>) -> Vec<JobId> {
    let mut ids = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        let batch: Vec<NewJob> = jobs.by_ref().take(10_000).collect();
        let enqueued = store.enqueue_batch(batch).await.expect("enqueue batch");
        assert!(enqueued.iter().all(|e| e.created));
        ids.extend(enqueued.into_iter().map(|e| e.id));
    }
    ids
}

/// One claim's jobs are in claim order (CONTRACT C3): priority descending, then enqueue
/// order (jobs enqueued at one instant, so their ids are in enqueue order).
fn assert_claim_order(batch: &[durq_core::ClaimedJob]) {
    let orders: Vec<(i16, JobId)> = batch.iter().map(|c| (c.job.priority, c.id())).collect();
    assert!(
        orders
            .windows(2)
            .all(|w| w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1)),
        "a claim out of order: {orders:?}"
    );
}

/// A store connected as a user of its own, whose key permissions the test chooses (ACL
/// key patterns; `read_only` patterns may only be read). The user is unique to the test,
/// so `CLIENT KILL USER` reaches this store's connections and no other test's.
async fn store_as_user(
    env: &mut Env,
    tag: &str,
    read_write: &[String],
    read_only: &[String],
) -> (Store, String) {
    let user = format!(
        "jobs-{tag}-{}-{}",
        std::process::id(),
        env.settings.namespace
    );
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">acl-test-password")
        .arg("&*")
        .arg("+@all");
    for pattern in read_write {
        cmd.arg(format!("~{pattern}"));
    }
    for pattern in read_only {
        cmd.arg(format!("%R~{pattern}"));
    }
    let _: () = cmd.query_async(&mut env.admin).await.expect("ACL SETUSER");
    env.cleanup.users.push(user.clone());
    let store_url = url().replacen("redis://", &format!("redis://{user}:acl-test-password@"), 1);
    let store = RedisBackend::connect(&store_url, env.settings.clone())
        .await
        .expect("connect as the test user");
    (Store::new(store), user)
}

/// What of the namespace is visible as jobs: index entries and hashes with a state.
async fn visible_jobs(env: &mut Env) -> (u64, u64, usize) {
    let list = env.zcard("list").await;
    let ready = env.zcard("ready").await;
    let mut with_state = 0;
    for key in env.namespace_keys().await {
        if key.contains(":job:") {
            let exists: bool = env.admin.hexists(&key, "state").await.expect("HEXISTS");
            with_state += usize::from(exists);
        }
    }
    (list, ready, with_state)
}

/// A redis-server of a test's own, killed when dropped (even when the test panics), with
/// its files in a directory of its own.
struct OwnServer {
    child: Option<std::process::Child>,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnServer {
    /// Starts `redis-server` with AOF on, fsync on every write, no RDB snapshots; `None`
    /// (skipped loudly, or failing under JOBS_REQUIRE_SERVICES=1) when it is not installed.
    async fn start() -> Option<OwnServer> {
        if let Err(err) = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
        {
            return durq_conformance::skip_or_fail("redis-server (binary)", "PATH", &err);
        }
        // A port nothing listens on now: bound by the OS, then released for the server.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("a free port");
        let dir = std::env::temp_dir().join(format!(
            "durq-redis-durability-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = OwnServer {
            child: None,
            port,
            dir,
        };
        server.spawn().await;
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server process and waits until it answers PING (it loads the AOF
    /// first after a restart).
    async fn spawn(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--appendonly", "yes"])
            .args(["--appendfsync", "always"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).expect("url");
        for _ in 0..500 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return;
                }
            }
            // Waiting for a process to start listening, not for an expiry.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// SIGKILL: no shutdown, no final fsync or snapshot.
    fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("reap redis-server");
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill_9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A claim with a budget of `gpu` units on queue `q`.
fn gpu_claim(gpu: u64, limit: usize) -> ClaimRequest {
    ClaimRequest::new(["q"], "w", Duration::from_secs(30))
        .limit(limit)
        .budget(Budget::new().amount("gpu", gpu))
}

/// The canonical text of a job id, as the store writes it into keys and index members.
fn id_text(id: JobId) -> String {
    id.to_string()
}

/// The fields of a job's hash, sorted.
async fn hash_fields(env: &mut Env, id: JobId) -> Vec<String> {
    let key = durq_redis::job_key(&env.settings.namespace, id);
    let mut fields: Vec<String> = env.admin.hkeys(&key).await.expect("HKEYS");
    fields.sort();
    fields
}
