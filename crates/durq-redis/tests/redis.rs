//! Redis-specific behaviour beyond the conformance suite: scale (200,000 due jobs,
//! 100,000 live leases), reconnection, wake-ups, script reloading, garbage-collection
//! TTLs, records that vanish by TTL, corrupt records, and key placement on a cluster.
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`); skipped loudly when
//! it is unreachable, failing instead when `JOBS_REQUIRE_SERVICES=1`. Every test removes
//! the keys (and ACL users) it wrote when it ends, passed or failed (see [`Cleanup`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    Budget, Bytes, ClaimRequest, Clock, Error, JobId, JobState, ListQuery, ManualClock, Needs,
    NewJob, ReadyOrder, ReclaimedJob, Retry, Store, StoreSettings, Timestamp,
};
use durq_redis::{ReclaimReport, RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

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
        let pattern = format!("jobs:{{{}}}:*", self.namespace);
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

    /// Every key of the namespace (SCAN, so the server is never blocked).
    async fn namespace_keys(&mut self) -> Vec<String> {
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
            out.extend(keys);
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

/// Keys unique while active carry no TTL (CONTRACT E10): purge deletes the key of a
/// job it deletes, and keeps a key a newer job has taken over.
#[tokio::test]
async fn purge_deletes_the_keys_of_unique_jobs_it_deletes() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let lease = Duration::from_secs(30);
    let finish = |id: JobId| {
        let store = &store;
        async move {
            let claimed = store
                .claim(ClaimRequest::new(["q"], "w", lease).limit(1))
                .await
                .expect("claim");
            assert_eq!(claimed[0].id(), id);
            store
                .complete(id, claimed[0].token(), None)
                .await
                .expect("complete");
        }
    };
    let gone = store
        .enqueue(NewJob::new("q").unique_while_active("u"))
        .await
        .expect("enqueue");
    finish(gone.id).await;
    let replaced = store
        .enqueue(NewJob::new("q").unique_while_active("v"))
        .await
        .expect("enqueue");
    finish(replaced.id).await;
    let newer = store
        .enqueue(NewJob::new("q").unique_while_active("v"))
        .await
        .expect("enqueue");
    assert!(newer.created);
    let dedup_keys = |keys: Vec<String>| keys.into_iter().filter(|k| k.contains(":dedup:")).count();
    assert_eq!(dedup_keys(env.namespace_keys().await), 2);

    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge(100).await.expect("purge"), 2);

    assert_eq!(
        dedup_keys(env.namespace_keys().await),
        1,
        "the purged job's key is gone, the newer job's key is kept"
    );
    let again = store
        .enqueue(NewJob::new("q").unique_while_active("v"))
        .await
        .expect("enqueue");
    assert_eq!((again.id, again.created), (newer.id, false));
}

/// A namespace whose every job was purged keeps no key of its jobs: neither their
/// records and index entries nor the sequence and running counters that ordered and
/// counted them (`purge --retention 0s` used to leave `seq` and `running` behind).
#[tokio::test]
async fn purging_every_job_leaves_no_key_of_the_namespace() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = enqueue_and_claim(&store, 2).await;
    store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .expect("complete");
    store
        .fail(
            claimed[1].id(),
            claimed[1].token(),
            "boom",
            durq_core::Retry::Never,
        )
        .await
        .expect("fail");
    let cancelled = store.enqueue(NewJob::new("other")).await.expect("enqueue");
    store.cancel(cancelled.id).await.expect("cancel");
    assert!(!env.namespace_keys().await.is_empty());

    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge(100).await.expect("purge"), 3);
    assert_eq!(env.namespace_keys().await, Vec::<String>::new());

    // The emptied namespace works as a new one: jobs are claimed in enqueue order.
    let ids = enqueue_all(&store, (0..3).map(|_| NewJob::new("q")).collect()).await;
    let again = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(3))
        .await
        .expect("claim");
    assert_eq!(again.iter().map(|job| job.id()).collect::<Vec<_>>(), ids);
}

#[tokio::test]
async fn drop_namespace_deletes_every_key_of_its_namespace_and_no_other() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let Some(mut other) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let kept = other.store().await;
    // Keys of every kind: ready, scheduled and running indexes, an idempotency key, a
    // parent with its children, a placement, finished jobs, the sequence counter.
    let parent = store
        .enqueue(NewJob::new("q").idempotency_key("once"))
        .await
        .expect("enqueue");
    store
        .enqueue(NewJob::new("q").parent(parent.id).locality("here"))
        .await
        .expect("child with a placement");
    store
        .enqueue(NewJob::new("q").run_at(env.clock.now().saturating_add(Duration::from_secs(60))))
        .await
        .expect("scheduled");
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(1))
        .await
        .expect("claim");
    store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .expect("complete");
    store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(1))
        .await
        .expect("claim");
    kept.enqueue(NewJob::new("q").idempotency_key("once"))
        .await
        .expect("enqueue elsewhere");
    let mut others_before = other.namespace_keys().await;
    others_before.sort();
    let before = env.namespace_keys().await.len();
    assert!(before >= 8, "only {before} keys were written");

    let deleted = store.redis.drop_namespace().await.expect("drop_namespace");

    assert_eq!(deleted, u64::try_from(before).expect("key count"));
    assert_eq!(env.namespace_keys().await, Vec::<String>::new());
    let mut others_after = other.namespace_keys().await;
    others_after.sort();
    assert_eq!(others_after, others_before, "another namespace lost keys");
    // The namespace starts again empty: the old jobs are gone, the key is free.
    assert!(matches!(
        store.get(parent.id).await,
        Err(Error::NotFound { .. })
    ));
    let again = store
        .enqueue(NewJob::new("q").idempotency_key("once"))
        .await
        .expect("enqueue after the drop");
    assert!(again.created && again.id != parent.id);
    let written = env.namespace_keys().await.len();
    assert_eq!(
        store.redis.drop_namespace().await.expect("second drop"),
        u64::try_from(written).expect("key count")
    );
    assert_eq!(env.namespace_keys().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_from_200k_due_jobs_returns_the_first_in_order() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let start = env.clock.now();
    // 200,000 jobs, all scheduled one second ahead, with seven priorities interleaved, so
    // the claim must promote every due job (in bounded steps) before it may cut the order.
    let run_at = start.saturating_add(Duration::from_secs(1));
    let priority = |i: usize| (i % 7) as i16 - 3;
    let jobs: Vec<NewJob> = (0..200_000)
        .map(|i| NewJob::new("big").priority(priority(i)).run_at(run_at))
        .collect();
    let ids = enqueue_all(&store, jobs).await;
    assert_eq!(ids.len(), 200_000);
    assert_eq!(env.zcard("sched").await, 200_000);
    let before = store.stats("big").await.expect("stats");
    assert_eq!((before.ready, before.scheduled), (0, 200_000));

    env.clock.advance(Duration::from_secs(2));
    let claimed = store
        .claim(ClaimRequest::new(["big"], "w", Duration::from_secs(60)).limit(100))
        .await
        .expect("claim");
    // Priority 3 first (every 7th job from index 6), in enqueue order.
    let expected: Vec<JobId> = (0..200_000)
        .filter(|i| priority(*i) == 3)
        .take(100)
        .map(|i| ids[i])
        .collect();
    let got: Vec<JobId> = claimed.iter().map(|c| c.id()).collect();
    assert_eq!(got, expected);
    assert!(claimed.iter().all(|c| c.job.state == JobState::Running));

    let after = store.stats("big").await.expect("stats");
    assert_eq!(
        (after.ready, after.scheduled, after.running),
        (199_900, 0, 100)
    );
    // The next claim continues the order with no gap.
    let next = store
        .claim(ClaimRequest::new(["big"], "w", Duration::from_secs(60)).limit(5))
        .await
        .expect("claim");
    let expected_next: Vec<JobId> = (0..200_000)
        .filter(|i| priority(*i) == 3)
        .skip(100)
        .take(5)
        .map(|i| ids[i])
        .collect();
    assert_eq!(
        next.iter().map(|c| c.id()).collect::<Vec<_>>(),
        expected_next
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_with_100k_live_leases_touches_only_the_expired() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let short = enqueue_all(&store, (0..3).map(|_| NewJob::new("short")).collect()).await;
    enqueue_all(&store, (0..100_000).map(|_| NewJob::new("long")).collect()).await;
    let claimed_short = store
        .claim(ClaimRequest::new(["short"], "w", Duration::from_secs(1)).limit(10))
        .await
        .expect("claim short");
    assert_eq!(claimed_short.len(), 3);
    let mut live = 0;
    loop {
        let batch = store
            .claim(ClaimRequest::new(["long"], "w", Duration::from_secs(3600)).limit(10_000))
            .await
            .expect("claim long");
        if batch.is_empty() {
            break;
        }
        live += batch.len();
    }
    assert_eq!(live, 100_000);
    assert_eq!(env.zcard("leases").await, 100_003);

    env.clock.advance(Duration::from_secs(2));
    let (reclaimed, report) = store.reclaim_with_report(1000).await.expect("reclaim");
    let got: HashSet<JobId> = reclaimed.iter().map(|r| r.id).collect();
    assert_eq!(got, short.iter().copied().collect::<HashSet<_>>());
    assert!(reclaimed.iter().all(|r| r.state == JobState::Queued));
    // The scripts looked at the three expired entries and nothing else.
    assert_eq!(report.examined, 3);
    assert_eq!(env.zcard("leases").await, 100_000);
    // Nothing else is expired: a second reclaim examines nothing.
    let (again, report) = store.reclaim_with_report(1000).await.expect("reclaim");
    assert!(again.is_empty());
    assert_eq!(report.examined, 0);
}

/// The store's connections are killed from another connection: the next call fails
/// with a retryable error (or succeeds on a fresh connection), the one after works, and
/// nothing acknowledged before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_is_unavailable_then_reconnects() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    // A user of its own, so the kill reaches this store's connections and no other
    // test's, wherever they run against the same server.
    let user = format!("jobs-kill-{}", std::process::id());
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">kill-test-password")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut env.admin)
        .await
        .expect("ACL SETUSER");
    env.cleanup.users.push(user.clone());
    let store_url = url().replacen(
        "redis://",
        &format!("redis://{user}:kill-test-password@"),
        1,
    );
    let store = Store::new(
        RedisBackend::connect(&store_url, env.settings.clone())
            .await
            .expect("connect as the test user"),
    );
    let before = store
        .enqueue(NewJob::new("q").payload(&b"acknowledged"[..]))
        .await
        .expect("enqueue");

    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg(&user)
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut env.admin)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the store's connection was not found");

    let first = store.get(before.id).await;
    eprintln!("first call after the kill: {first:?}");
    match first {
        Ok(job) => assert_eq!(job.id, before.id),
        Err(err) => assert!(
            err.is_retryable(),
            "a dropped connection must be Unavailable, got {err:?}"
        ),
    }
    // The next-but-one call works on a new connection.
    let mut last = None;
    for _ in 0..3 {
        match store.get(before.id).await {
            Ok(job) => {
                last = Some(job);
                break;
            }
            Err(err) => assert!(err.is_retryable(), "{err:?}"),
        }
    }
    let job = last.expect("the store did not reconnect");
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(
        store.payload(before.id).await.expect("payload"),
        Bytes::from_static(b"acknowledged")
    );
    let after = store
        .enqueue(NewJob::new("q"))
        .await
        .expect("enqueue after");
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10))
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![before.id, after.id]
    );
}

/// A server that is not there is `Unavailable`, not a backend error or a panic.
#[tokio::test]
async fn unreachable_server_is_unavailable() {
    let settings = StoreSettings::default().namespace("nowhere");
    // Port 1 on loopback: nothing listens there.
    let err = RedisBackend::connect("redis://127.0.0.1:1", settings)
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_retryable(), "{err:?}");
    let err = RedisBackend::connect("not a url", StoreSettings::default())
        .await
        .expect_err("bad url");
    assert_eq!(err.invalid_field(), Some("url"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claimer_is_woken_by_an_enqueue_on_its_queue() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let producer = env.store().await;
    assert!(store.wake_ready(Duration::from_secs(10)).await);
    // Each waiter waits up to a minute; finishing within ten seconds can only come from
    // a wake-up. Other queues' news does not end the wait.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_for_work(&["mine".to_owned()], Duration::from_secs(60))
                .await
        })
    };
    while store.waiting_for_work() == 0 {
        tokio::task::yield_now().await;
    }
    producer
        .enqueue(NewJob::new("other"))
        .await
        .expect("enqueue");
    // A scheduled job is no work yet either.
    producer
        .enqueue(NewJob::new("mine").run_at(env.clock.now().saturating_add(Duration::from_secs(9))))
        .await
        .expect("enqueue");
    assert!(!waiter.is_finished());
    producer
        .enqueue(NewJob::new("mine"))
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken")
        .expect("join")
        .expect("wait_for_work");

    // Requeues wake too: release of a claimed job.
    let claimed = store
        .claim_one(&["mine"], "w", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("a job");
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_for_work(&["mine".to_owned()], Duration::from_secs(60))
                .await
        })
    };
    while store.waiting_for_work() == 0 {
        tokio::task::yield_now().await;
    }
    producer
        .release(claimed.id(), claimed.token())
        .await
        .expect("release");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken by a release")
        .expect("join")
        .expect("wait_for_work");
}

#[tokio::test]
async fn wait_for_work_times_out_without_news() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let started = tokio::time::Instant::now();
    store
        .wait_for_work(&["quiet".to_owned()], Duration::from_millis(50))
        .await
        .expect("wait");
    assert!(started.elapsed() >= Duration::from_millis(50));
}

/// After SCRIPT FLUSH (or a server restart) the scripts are loaded again on NOSCRIPT.
#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut env.admin)
        .await
        .expect("SCRIPT FLUSH");
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let claimed = store
        .claim_one(&["q"], "w", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("a job");
    assert_eq!(claimed.id(), id);
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete");
}

/// No job record carries a server TTL, terminal ones included: purge deletes them once
/// retention has passed. Dedup keys expire by their own TTL, beyond the window.
#[tokio::test]
async fn job_records_carry_no_ttl_dedup_keys_do() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let done = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let pttl = |admin: &mut MultiplexedConnection, id: JobId| {
        let key = durq_redis::job_key(&env.settings.namespace, id);
        let mut admin = admin.clone();
        async move {
            let ttl: i64 = admin.pttl(&key).await.expect("PTTL");
            ttl
        }
    };
    assert_eq!(pttl(&mut env.admin, id).await, -1, "queued");
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(2))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    assert_eq!(pttl(&mut env.admin, id).await, -1, "running");
    let token = |job: JobId| {
        claimed
            .iter()
            .find(|c| c.id() == job)
            .map(|c| c.token())
            .expect("claimed")
    };
    store
        .fail(id, token(id), "boom", Retry::Never)
        .await
        .expect("fail");
    store
        .complete(done, token(done), None)
        .await
        .expect("complete");
    assert_eq!(pttl(&mut env.admin, id).await, -1, "dead");
    assert_eq!(pttl(&mut env.admin, done).await, -1, "succeeded");
    store.retry(id).await.expect("retry");
    assert_eq!(pttl(&mut env.admin, id).await, -1, "retried");
    let dedup = store
        .enqueue(NewJob::new("q").idempotency_key("k"))
        .await
        .expect("enqueue");
    let dedup_key = format!(
        "jobs:{{{}}}:dedup::{}",
        env.settings.namespace,
        "k".bytes().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let ttl: i64 = env.admin.pttl(&dedup_key).await.expect("PTTL");
    assert!(ttl > env.settings.dedup_window.as_millis() as i64);
    assert!(dedup.created);
}

/// A terminal job whose record was deleted behind the store's back before purge ran:
/// purge still removes every index entry, from what the finished index records.
#[tokio::test]
async fn purge_cleans_entries_of_records_already_gone() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let parent = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let child = store
        .enqueue(NewJob::new("q").parent(parent))
        .await
        .expect("enqueue")
        .id;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(2))
        .await
        .expect("claim");
    for job in &claimed {
        store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
    }
    // The child's record is gone (an operator's DEL, or a server TTL of an older layout).
    let _: () = env
        .admin
        .del(durq_redis::job_key(&env.settings.namespace, child))
        .await
        .expect("DEL");
    env.clock
        .advance(env.settings.retention + Duration::from_millis(1));
    assert_eq!(store.purge(100).await.expect("purge"), 2);
    for name in ["ready", "sched", "leases", "list", "done", "children"] {
        assert_eq!(env.zcard(name).await, 0, "{name} still has entries");
    }
    let stats = store.stats("q").await.expect("stats");
    assert_eq!(stats.total(), 0);
    assert!(store.get(parent).await.expect_err("purged").is_not_found());
}

/// A record that cannot be read is `Corrupt`, never a panic or a wrong value.
#[tokio::test]
async fn corrupt_record_is_reported() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let key = durq_redis::job_key(&env.settings.namespace, id);
    let meta: String = env.admin.hget(&key, "meta").await.expect("HGET");
    let _: () = env
        .admin
        .hset(&key, "meta", "q - high")
        .await
        .expect("HSET");
    let err = store.get(id).await.expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    // Scripts refuse to act on it too, and write nothing.
    let err = store.cancel(id).await.expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let _: () = env.admin.hset(&key, "meta", &meta).await.expect("HSET");
    assert_eq!(
        store.get(id).await.expect("readable again").state,
        JobState::Queued
    );
    let _: () = env
        .admin
        .hset(&key, "state", "sleeping")
        .await
        .expect("HSET");
    let err = store.get(id).await.expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
}

/// Tenants and keys holding `:`, `{`, `}` or any byte stay apart and inside the
/// namespace's hash slot; the claim order index is exactly `ReadyOrder::sort_key`.
#[tokio::test]
async fn user_strings_are_encoded_and_order_keys_match_core() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let a = store
        .enqueue(NewJob::new("q").tenant("a:b").idempotency_key("c"))
        .await
        .expect("enqueue");
    let b = store
        .enqueue(NewJob::new("q").tenant("a").idempotency_key("b:c"))
        .await
        .expect("enqueue");
    let c = store
        .enqueue(NewJob::new("q").tenant("}{x").idempotency_key("{ns}"))
        .await
        .expect("enqueue");
    assert!(a.created && b.created && c.created);
    assert_eq!(
        store
            .enqueue(NewJob::new("q").tenant("}{x").idempotency_key("{ns}"))
            .await
            .expect("enqueue")
            .id,
        c.id
    );
    let keys = env.namespace_keys().await;
    for key in &keys {
        // Exactly one `{` and `}`: the namespace's tag. User braces never reach a key.
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
    }
    // Redis Cluster hashes the text between the first `{` and the next `}`: for every
    // key that is the namespace, so all of them are in one slot.
    for key in &keys {
        let open = key.find('{').expect("a hash tag");
        let close = open + key[open..].find('}').expect("a closed hash tag");
        assert_eq!(&key[open + 1..close], env.settings.namespace, "{key}");
    }
    assert!(keys.len() >= 6, "{keys:?}");

    // The ready index member is "queue order-key id" with core's exact order key.
    let job = store.get(a.id).await.expect("get");
    let members: Vec<String> = env
        .admin
        .zrange(env.key("ready"), 0, 0)
        .await
        .expect("ZRANGE");
    let first = members.first().expect("a ready entry");
    let order = &first[2..38];
    let seq = u64::from_str_radix(&order[20..], 16).expect("hex sequence");
    assert_eq!(
        order,
        ReadyOrder::new(job.priority, job.run_at, seq).sort_key()
    );
    assert!(first.ends_with(&a.id.to_string()));
}

/// Extreme times and priorities keep the exact order in the lexical index.
#[tokio::test]
async fn extreme_times_and_priorities_keep_the_order() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let now = env.clock.now();
    let ids = enqueue_all(
        &store,
        vec![
            NewJob::new("q")
                .priority(i16::MIN)
                .run_at(Timestamp::from_millis(i64::MIN)),
            NewJob::new("q")
                .priority(0)
                .run_at(Timestamp::from_millis(-1)),
            NewJob::new("q")
                .priority(0)
                .run_at(Timestamp::from_millis(-2)),
            NewJob::new("q").priority(i16::MAX).run_at(now),
            NewJob::new("q").priority(0).run_at(now),
            NewJob::new("q")
                .priority(0)
                .run_at(Timestamp::from_millis(i64::MAX)),
        ],
    )
    .await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10))
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![ids[3], ids[2], ids[1], ids[4], ids[0]]
    );
    let far = store.get(ids[5]).await.expect("get");
    assert_eq!(far.run_at, Timestamp::from_millis(i64::MAX));
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.running, stats.scheduled), (5, 1));
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

/// Many claimers on several store instances (connections) against one queue, with
/// limits above one: every job once, each claim in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batch_claims_hand_out_each_job_once_in_order() {
    let Some(env) = Env::new().await else {
        return;
    };
    let producer = env.store().await;
    let ids = enqueue_all(
        &producer,
        (0..2000)
            .map(|i| NewJob::new("q").priority((i % 3) as i16))
            .collect(),
    )
    .await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = env.store().await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut empty_in_a_row = 0;
            while empty_in_a_row < 3 {
                let batch = store
                    .claim(
                        ClaimRequest::new(["q"], format!("w{worker}"), Duration::from_secs(60))
                            .limit(7),
                    )
                    .await
                    .expect("claim");
                if batch.is_empty() {
                    empty_in_a_row += 1;
                    continue;
                }
                empty_in_a_row = 0;
                assert_claim_order(&batch);
                mine.extend(batch.into_iter().map(|c| c.id()));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("join"));
    }
    assert_eq!(all.len(), ids.len(), "some job was claimed twice or never");
    let unique: HashSet<JobId> = all.iter().copied().collect();
    assert_eq!(unique, ids.iter().copied().collect::<HashSet<_>>());
}

/// Many claimers sharing one store handle, whose calls are in flight together, each
/// holding its slice of the predicted head (`store/heads.rs`): plain claims and fitted
/// ones with a budget that admits only part of the queue. Every job is handed out once,
/// each claim in order, and the jobs the budget does not admit are never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claimers_sharing_one_store_take_each_job_once_in_order() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store: Store = (*env.store().await).clone();
    // Priorities interleaved, and every third job needs 2 GPUs (no claim below admits it).
    let jobs: Vec<NewJob> = (0..3000)
        .map(|i| {
            let job = NewJob::new("q").priority((i % 3) as i16);
            if i % 3 == 0 {
                job.needs(Needs::new().amount("gpu", 2))
            } else {
                job.needs(Needs::new().amount("gpu", 1))
            }
        })
        .collect();
    let ids = enqueue_all(&store, jobs).await;
    let big: HashSet<JobId> = ids.iter().step_by(3).copied().collect();
    let mut tasks = Vec::new();
    for claimer in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut empty_in_a_row = 0;
            while empty_in_a_row < 3 {
                let request =
                    ClaimRequest::new(["q"], format!("w{claimer}"), Duration::from_secs(60))
                        .limit(1 + claimer % 9);
                // Half the claimers fit the worker to one GPU.
                let request = if claimer % 2 == 0 {
                    request.budget(Budget::new().amount("gpu", 1))
                } else {
                    request
                };
                let batch = store.claim(request).await.expect("claim");
                if batch.is_empty() {
                    empty_in_a_row += 1;
                    continue;
                }
                empty_in_a_row = 0;
                assert_claim_order(&batch);
                mine.extend(batch.into_iter().map(|c| (claimer % 2 == 0, c.id())));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("join"));
    }
    for (fitted, id) in &all {
        assert!(
            !(*fitted && big.contains(id)),
            "a fitted claim took a job needing 2 GPUs"
        );
    }
    let claimed: Vec<JobId> = all.iter().map(|(_, id)| *id).collect();
    let unique: HashSet<JobId> = claimed.iter().copied().collect();
    assert_eq!(unique.len(), claimed.len(), "a job was claimed twice");
    // Plain claimers drained the rest, big jobs included, so every job was claimed.
    assert_eq!(unique, ids.iter().copied().collect::<HashSet<_>>());
}

/// On a cluster (`JOBS_REDIS_CLUSTER_URLS`), namespaces land on different masters and
/// every operation works on each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_namespaces_spread_over_masters() {
    let Ok(urls) = std::env::var("JOBS_REDIS_CLUSTER_URLS") else {
        eprintln!("cluster test skipped: JOBS_REDIS_CLUSTER_URLS is not set");
        return;
    };
    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
    let mut nodes_used = HashSet::new();
    for i in 0..12 {
        let clock = ManualClock::default();
        let namespace = durq_conformance::unique_namespace(&format!("cl{i}"));
        let settings = StoreSettings::default()
            .namespace(namespace.clone())
            .clock(Arc::new(clock.clone()));
        let _cleanup = Cleanup::new(urls.clone(), &namespace);
        let store = TestStore::new(
            RedisConfig::cluster(urls.iter().cloned())
                .open(settings)
                .await
                .expect("connect cluster"),
        );
        // Wake-ups cross the cluster: the subscriber listens on the first node, the
        // script publishes on whichever master owns the namespace.
        assert!(store.wake_ready(Duration::from_secs(10)).await);
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .wait_for_work(&["q".to_owned()], Duration::from_secs(60))
                    .await
            })
        };
        while store.waiting_for_work() == 0 {
            tokio::task::yield_now().await;
        }
        let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was not woken across the cluster")
            .expect("join")
            .expect("wait_for_work");
        let claimed = store
            .claim_one(&["q"], "w", Duration::from_secs(1))
            .await
            .expect("claim")
            .expect("a job");
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.reclaim(10).await.expect("reclaim").len(), 1);
        assert!(store
            .complete(id, claimed.token(), None)
            .await
            .expect_err("reclaimed")
            .is_lease_lost());
        let page = store.list(ListQuery::new("q")).await.expect("list");
        assert_eq!(page.jobs.len(), 1);
        // Which master holds the namespace?
        let key = durq_redis::job_key(&namespace, id);
        for url in &urls {
            let client = redis::Client::open(url.as_str()).expect("url");
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("node");
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("KEYSLOT");
            let here: i64 = redis::cmd("CLUSTER")
                .arg("COUNTKEYSINSLOT")
                .arg(slot)
                .query_async(&mut conn)
                .await
                .expect("COUNTKEYSINSLOT");
            if here > 0 {
                nodes_used.insert(url.clone());
            }
        }
    }
    assert!(
        nodes_used.len() >= 2,
        "12 namespaces all landed on one master: {nodes_used:?}"
    );
}

/// Queued and running jobs share one list code, so pages of either state skip the other
/// on the way; running pages come from the lease index. Pages stay full and join up.
#[tokio::test]
async fn list_pages_by_state_through_interleaved_queued_and_running_jobs() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    // Even jobs high priority: the claim takes exactly them, so states alternate by id.
    let ids = enqueue_all(
        &store,
        (0..10)
            .map(|i| NewJob::new("q").priority(if i % 2 == 0 { 1 } else { 0 }))
            .collect(),
    )
    .await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(5))
        .await
        .expect("claim");
    let running: Vec<JobId> = ids.iter().step_by(2).rev().copied().collect();
    let queued: Vec<JobId> = ids.iter().skip(1).step_by(2).rev().copied().collect();
    assert_eq!(claimed.len(), 5);

    for (state, expected) in [(JobState::Queued, &queued), (JobState::Running, &running)] {
        let mut seen = Vec::new();
        let mut query = ListQuery::new("q").state(state).limit(2);
        loop {
            let page = store.list(query.clone()).await.expect("list");
            assert!(page.jobs.iter().all(|job| job.state == state));
            seen.extend(page.jobs.iter().map(|job| job.id));
            match page.next {
                Some(next) => {
                    assert_eq!(page.jobs.len(), 2, "a page with a cursor is full");
                    query = query.after(next);
                }
                None => break,
            }
        }
        assert_eq!(&seen, expected, "{state:?}");
    }
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running), (5, 5));

    // A running job vanishes; reclaim drops its entries and the counts follow.
    let _: () = env
        .admin
        .del(durq_redis::job_key(&env.settings.namespace, ids[0]))
        .await
        .expect("DEL");
    env.clock.advance(Duration::from_secs(6));
    let reclaimed = store.reclaim(100).await.expect("reclaim");
    assert_eq!(reclaimed.len(), 4);
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running, stats.total()), (9, 0, 9));
    let all = store
        .list(ListQuery::new("q").limit(100))
        .await
        .expect("list");
    assert_eq!(all.jobs.len(), 9);
}

/// Concurrent single enqueues of one store go to Redis together; each still gets its own
/// answer: duplicates find their first job (an existing one, or one made in the same
/// group), an unknown parent fails only its own call, and the rest are created.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_single_enqueues_keep_their_own_outcomes() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let existing = store
        .enqueue(NewJob::new("q").idempotency_key("k0"))
        .await
        .expect("enqueue")
        .id;
    let ghost = JobId::mint(env.clock.now());
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let job = match i % 4 {
                    0 => NewJob::new("q").idempotency_key("k0"),
                    1 => NewJob::new("q").idempotency_key("shared"),
                    2 => NewJob::new("q").parent(ghost),
                    _ => NewJob::new("q").payload(vec![i as u8; 3]),
                };
                (i, store.enqueue(job).await)
            })
        })
        .collect();
    let mut shared = HashSet::new();
    let mut shared_created = 0;
    let mut plain = HashSet::new();
    for task in tasks {
        let (i, outcome) = task.await.expect("join");
        match i % 4 {
            0 => {
                let e = outcome.expect("duplicate of an existing key");
                assert_eq!((e.id, e.created), (existing, false));
            }
            1 => {
                let e = outcome.expect("shared key");
                shared.insert(e.id);
                shared_created += usize::from(e.created);
            }
            2 => {
                let err = outcome.expect_err("unknown parent");
                assert_eq!(err.invalid_field(), Some("parent"), "{err:?}");
            }
            _ => {
                let e = outcome.expect("plain");
                assert!(e.created);
                assert_eq!(
                    store.payload(e.id).await.expect("payload"),
                    Bytes::from(vec![i as u8; 3])
                );
                plain.insert(e.id);
            }
        }
    }
    assert_eq!((shared.len(), shared_created), (1, 1));
    assert_eq!(plain.len(), 16);
    let stats = store.stats("q").await.expect("stats");
    assert_eq!(stats.ready, 1 + 1 + 16);
}

/// CONTRACT §5 (corrupt records): one unreadable record at the head of a queue does not
/// block it, and is not silently dropped either: the claim moves it to `dead` with
/// last_error "corrupt record: ...", stats count it dead, `list` shows it dead, and the
/// jobs behind it are handed out. Guards against the old behaviour (left `queued`, dropped
/// from the ready index, still counted as queued by stats, invisible to list by state).
#[tokio::test]
async fn unreadable_job_at_the_head_does_not_block_the_queue() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let ids = enqueue_all(&store, (0..4).map(|_| NewJob::new("q")).collect()).await;
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let _: () = env
        .admin
        .hset(key(ids[0]), "meta", "not meta")
        .await
        .expect("HSET");
    // Unreadable attempts: Lua cannot count the claim on it.
    let _: () = env
        .admin
        .hset(key(ids[2]), "att", "many")
        .await
        .expect("HSET");
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10))
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![ids[1], ids[3]]
    );
    for bad in [ids[0], ids[2]] {
        let state: String = env.admin.hget(key(bad), "state").await.expect("HGET");
        assert_eq!(state, "dead");
        let error: String = env.admin.hget(key(bad), "error").await.expect("HGET");
        assert!(error.starts_with("corrupt record: "), "{error}");
    }
    assert_eq!(env.zcard("ready").await, 0);
    assert_eq!(env.zcard("done").await, 2);
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running, stats.dead), (0, 2, 2));
    let dead = store
        .list(ListQuery::new("q").state(JobState::Dead))
        .await
        .expect("list");
    let mut listed: Vec<JobId> = dead.jobs.iter().map(|j| j.id).collect();
    listed.sort();
    assert_eq!(listed, vec![ids[0], ids[2]]);
    assert!(dead.jobs.iter().all(|j| j.state == JobState::Dead
        && j.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("corrupt record: "))));
    // The one with readable meta is shown with its own queue; `get` stays honest.
    let err = store.get(ids[0]).await.expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    // Purge removes buried jobs like any dead job.
    env.clock
        .advance(env.settings.retention + Duration::from_secs(1));
    assert_eq!(store.purge(100).await.expect("purge"), 2);
}

/// CONTRACT §5 (corrupt records): reclaim moves an expired job whose record cannot be read
/// to `dead` ("corrupt record: ..."), counted and listed as dead, and still recovers the
/// valid jobs next to it. Guards against the old reclaim, which dropped the lease entry and
/// left the record `running` forever (counted as queued, never reclaimed again).
#[tokio::test]
async fn reclaim_buries_an_unreadable_running_job() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let ids = enqueue_all(&store, (0..3).map(|_| NewJob::new("q")).collect()).await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(3))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let _: () = env
        .admin
        .hset(key(ids[0]), "meta", "q - not-a-priority")
        .await
        .expect("HSET");
    let _: () = env
        .admin
        .hset(key(ids[1]), "state", "sleeping")
        .await
        .expect("HSET");
    env.clock.advance(Duration::from_secs(6));
    let mut reclaimed = store.reclaim(10).await.expect("reclaim");
    reclaimed.sort_by_key(|r| r.id);
    assert_eq!(
        reclaimed
            .iter()
            .map(|r| (r.id, r.state))
            .collect::<Vec<_>>(),
        vec![
            (ids[0], JobState::Dead),
            (ids[1], JobState::Dead),
            (ids[2], JobState::Queued)
        ]
    );
    assert_eq!(env.zcard("leases").await, 0);
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running, stats.dead), (1, 0, 2));
    let dead = store
        .list(ListQuery::new("q").state(JobState::Dead))
        .await
        .expect("list");
    assert_eq!(dead.jobs.len(), 2);
    assert!(dead.jobs.iter().all(|j| j.queue == "q"
        && j.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("corrupt record: "))));
    // The valid job goes on.
    let again = store
        .claim_one(&["q"], "w", Duration::from_secs(5))
        .await
        .expect("claim")
        .expect("the requeued job");
    assert_eq!(again.id(), ids[2]);
}

/// Check before write (issue #11, 6): a lease call on a running job whose record holds a
/// malformed field fails with `Corrupt` and changes nothing: the lease entry stays, the
/// state stays `running`, the counters stay. Redis does not roll back a script that fails
/// half-way, and the old fail/release/reclaim scripts removed the lease entry before
/// comparing numbers, leaving a running job without its lease entry.
#[tokio::test]
async fn lease_calls_on_a_malformed_record_change_nothing() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = enqueue_and_claim(&store, 2).await;
    assert_eq!(claimed.len(), 2);
    let (job, other) = (&claimed[0], &claimed[1]);
    let key = durq_redis::job_key(&env.settings.namespace, job.id());
    let _: () = env.admin.hset(&key, "att", "one").await.expect("HSET");
    let snapshot = |mut admin: MultiplexedConnection, key: String, leases: String| async move {
        let fields: Vec<(String, String)> = admin.hgetall(&key).await.expect("HGETALL");
        let entries: Vec<(String, f64)> = admin
            .zrange_withscores(&leases, 0, -1)
            .await
            .expect("ZRANGE");
        let running: Vec<(String, String)> = admin
            .hgetall(leases.replace(":leases", ":running"))
            .await
            .expect("HGETALL");
        (fields, entries, running)
    };
    let before = snapshot(env.admin.clone(), key.clone(), env.key("leases")).await;
    assert_eq!(before.1.len(), 2);

    let retry_at = Retry::At(env.clock.now());
    let err = store
        .fail(job.id(), job.token(), "boom", retry_at)
        .await
        .expect_err("fail on a malformed record");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        snapshot(env.admin.clone(), key.clone(), env.key("leases")).await,
        before
    );
    let err = store
        .release(job.id(), job.token())
        .await
        .expect_err("release on a malformed record");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        snapshot(env.admin.clone(), key.clone(), env.key("leases")).await,
        before
    );

    // Reclaim buries an unreadable record (see above), so what it must check before its
    // first write is the rest it reads: a malformed running counter fails the whole call
    // with both expired jobs untouched.
    let _: () = env.admin.hset(&key, "att", "1").await.expect("HSET");
    let _: () = env
        .admin
        .hset(env.key("running"), "q", "two")
        .await
        .expect("HSET");
    let before = snapshot(env.admin.clone(), key.clone(), env.key("leases")).await;
    env.clock.advance(Duration::from_secs(6));
    let err = store
        .reclaim(10)
        .await
        .expect_err("reclaim with a malformed counter");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        snapshot(env.admin.clone(), key.clone(), env.key("leases")).await,
        before
    );
    let other_state: String = env
        .admin
        .hget(
            durq_redis::job_key(&env.settings.namespace, other.id()),
            "state",
        )
        .await
        .expect("HGET");
    assert_eq!(other_state, "running");
    // Complete and heartbeat check the counter before writing too.
    let err = store
        .complete(other.id(), other.token(), None)
        .await
        .expect_err("complete with a malformed counter");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        snapshot(env.admin.clone(), key.clone(), env.key("leases")).await,
        before
    );
    let _: () = env
        .admin
        .hset(env.key("running"), "q", "2")
        .await
        .expect("HSET");
    assert_eq!(store.reclaim(10).await.expect("reclaim").len(), 2);
}

/// Claims over several queues follow one order across all of them: 300 jobs with mixed
/// priorities and ready times in three queues, claimed in batches of 7, come out exactly
/// in the order `ReadyOrder` defines (priority, ready time, enqueue order).
#[tokio::test]
async fn claims_over_several_queues_merge_in_exact_order() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let now = env.clock.now();
    let mut jobs = Vec::new();
    for i in 0..300u64 {
        let queue = ["a", "b", "c"][(i * 7 % 3) as usize];
        let priority = ((i * 13) % 5) as i16 - 2;
        let run_at = Timestamp::from_millis(now.as_millis() - ((i * 31) % 4) as i64);
        jobs.push((queue, priority, run_at));
    }
    let ids = enqueue_all(
        &store,
        jobs.iter()
            .map(|(q, p, t)| NewJob::new(*q).priority(*p).run_at(*t))
            .collect(),
    )
    .await;
    // Enqueue order is the sequence order: sort by (priority desc, run_at, index).
    let mut expected: Vec<usize> = (0..jobs.len()).collect();
    expected.sort_by_key(|&i| (std::cmp::Reverse(jobs[i].1), jobs[i].2, i));
    let expected: Vec<JobId> = expected.into_iter().map(|i| ids[i]).collect();
    let mut got = Vec::new();
    loop {
        let batch = store
            .claim(ClaimRequest::new(["c", "a", "b"], "w", Duration::from_secs(60)).limit(7))
            .await
            .expect("claim");
        if batch.is_empty() {
            break;
        }
        got.extend(batch.iter().map(|c| c.id()));
    }
    assert_eq!(got, expected);
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

/// E9 at every size (issue #11, 5): a batch refused part-way writes nothing. The store's
/// user may only read dedup keys, so the script call carrying the batch's one idempotency
/// key (its last job) is refused by the server. 2,000 small jobs (one inline call) and
/// 2,000 jobs of 5 KiB (10 MiB: payloads staged first, then one call) both leave nothing
/// behind. The old code sent 512 jobs (or 8 MiB) per script call, so the first calls'
/// jobs stayed written and claimable while the batch returned Err.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_batch_writes_nothing_at_any_size() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let ns = env.settings.namespace.clone();
    let read_write: Vec<String> = [
        "ready",
        "sched",
        "leases",
        "list",
        "running",
        "done",
        "paused",
        "children",
        "placement",
        "seq",
        "none",
        "job:*",
    ]
    .iter()
    .map(|name| format!("jobs:{{{ns}}}:{name}"))
    .collect();
    let read_only = vec![format!("jobs:{{{ns}}}:dedup:*")];
    let (store, _user) = store_as_user(&mut env, "refuse", &read_write, &read_only).await;
    for payload in [16usize, 5 * 1024] {
        let mut jobs: Vec<NewJob> = (0..2000)
            .map(|i| NewJob::new("q").payload(vec![(i % 251) as u8; payload]))
            .collect();
        jobs[1999] = NewJob::new("q").idempotency_key("refused");
        let err = store
            .enqueue_batch(jobs)
            .await
            .expect_err("the dedup key may not be written");
        eprintln!("batch of 2,000 x {payload} B refused: {err}");
        assert_eq!(visible_jobs(&mut env).await, (0, 0, 0), "payload {payload}");
        // Staged payloads of the refused batch were removed on the spot.
        assert_eq!(env.namespace_keys().await.len(), 0, "payload {payload}");
        assert_eq!(store.stats("q").await.expect("stats").total(), 0);
    }
    // The same store writes a batch it may write, whole.
    let ids = enqueue_all(
        &store,
        (0..2000)
            .map(|_| NewJob::new("q").payload(vec![7u8; 5 * 1024]))
            .collect(),
    )
    .await;
    assert_eq!(visible_jobs(&mut env).await, (2000, 2000, 2000));
    for key in env.namespace_keys().await {
        if key.contains(":job:") {
            let ttl: i64 = env.admin.pttl(&key).await.expect("PTTL");
            assert_eq!(ttl, -1, "a committed job keeps no staging TTL");
        }
    }
    assert_eq!(
        store.payload(ids[1234]).await.expect("payload"),
        Bytes::from(vec![7u8; 5 * 1024])
    );
}

/// E9 with connection loss (issue #11, 5): the store's connections are killed while a
/// staged batch (2,000 jobs, 10 MiB) is written: early in the staging, half-way, and once
/// every payload is staged (about when the commit goes out). Whatever the timing, the
/// batch is all or nothing: Ok means every job is there; an error (retryable) means either
/// none is visible (no index entry, no hash with a state) or, when only the reply of the
/// commit was lost, all are; never a part. What staging left behind is only payload
/// hashes with a TTL, which nothing reads as jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_cut_by_killed_connections_is_all_or_nothing() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let ns = env.settings.namespace.clone();
    let pattern = vec![format!("jobs:{{{ns}}}:*")];
    let (store, user) = store_as_user(&mut env, "cut", &pattern, &[]).await;
    let mut visible_before = 0;
    for (round, threshold) in [1usize, 1000, 2000].into_iter().enumerate() {
        let jobs: Vec<NewJob> = (0..2000)
            .map(|_| NewJob::new("q").payload(vec![1u8; 5 * 1024]))
            .collect();
        let already = env.namespace_keys().await.len();
        let batch = {
            let store = store.clone();
            tokio::spawn(async move { store.enqueue_batch(jobs).await })
        };
        // Kill once the namespace holds `threshold` more keys (staged payloads appear
        // one pipeline at a time), or once the batch is done.
        let mut admin = env.admin.clone();
        let match_pattern = format!("jobs:{{{ns}}}:job:*");
        loop {
            let mut cursor: u64 = 0;
            let mut count = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&match_pattern)
                    .arg("COUNT")
                    .arg(10_000)
                    .query_async(&mut admin)
                    .await
                    .expect("SCAN");
                count += keys.len();
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            if count >= already + threshold || batch.is_finished() {
                break;
            }
        }
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("USER")
            .arg(&user)
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .expect("CLIENT KILL");
        let outcome = batch.await.expect("join");
        let (list, ready, with_state) = visible_jobs(&mut env).await;
        eprintln!(
            "round {round}: killed {killed} at {threshold} staged: {:?}, {list} visible",
            outcome.as_ref().map(Vec::len)
        );
        match &outcome {
            Ok(done) => assert_eq!(done.len(), 2000),
            Err(err) => assert!(err.is_retryable(), "{err:?}"),
        }
        if outcome.is_ok() {
            assert_eq!(list, visible_before + 2000, "round {round}");
        } else {
            assert!(
                list == visible_before || list == visible_before + 2000,
                "round {round}: a part of the batch is visible: {list} (before {visible_before})"
            );
        }
        assert_eq!((ready, with_state as u64), (list, list), "round {round}");
        visible_before = list;
        // Leftovers are staged payloads only, each with a TTL.
        for key in env.namespace_keys().await {
            if key.contains(":job:") {
                let has_state: bool = env.admin.hexists(&key, "state").await.expect("HEXISTS");
                if !has_state {
                    let ttl: i64 = env.admin.pttl(&key).await.expect("PTTL");
                    assert!(ttl > 0, "a staged payload without TTL: {key}");
                }
            }
        }
        // The store works again after the kill.
        let mut reconnected = false;
        for _ in 0..3 {
            if store.stats("q").await.is_ok() {
                reconnected = true;
                break;
            }
        }
        assert!(reconnected, "the store did not reconnect");
    }
}

/// `heartbeat_batch` (one script call) answers each entry as `heartbeat` would: extended,
/// cancellation requested, stale token, unknown job; an empty batch is no call at all and
/// a bad ttl refuses the whole call.
#[tokio::test]
async fn heartbeat_batch_answers_each_lease() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = enqueue_and_claim(&store, 3).await;
    let lease = |i: usize| durq_core::HeldLease::new(claimed[i].id(), claimed[i].token());
    store.cancel(claimed[1].id()).await.expect("cancel");
    store
        .complete(claimed[2].id(), claimed[2].token(), None)
        .await
        .expect("complete");
    let ghost = JobId::mint(env.clock.now());
    env.clock.advance(Duration::from_secs(1));
    let answers = store
        .heartbeat_batch(
            vec![
                lease(0),
                lease(1),
                lease(2),
                durq_core::HeldLease::new(ghost, claimed[0].token()),
                lease(0),
            ],
            Duration::from_secs(30),
        )
        .await
        .expect("heartbeat batch");
    assert_eq!(answers.len(), 5);
    let expires = env.clock.now().saturating_add(Duration::from_secs(30));
    let ok = |i: usize| answers[i].as_ref().expect("extended");
    assert!(!ok(0).cancel_requested && ok(0).expires_at == expires);
    assert!(ok(1).cancel_requested);
    assert!(answers[2].as_ref().expect_err("completed").is_lease_lost());
    assert!(answers[3].as_ref().expect_err("unknown").is_not_found());
    assert!(ok(4).expires_at == expires);
    let job = store.get(claimed[0].id()).await.expect("get");
    assert_eq!(job.lease.map(|l| l.expires_at), Some(expires));
    assert_eq!(job.heartbeat_at, Some(env.clock.now()));
    // The lease index follows: nothing is expired 29 s later.
    env.clock.advance(Duration::from_secs(29));
    assert!(store.reclaim(10).await.expect("reclaim").is_empty());
    let stats = store.stats("q").await.expect("stats");
    assert_eq!(stats.running, 2);
    assert!(store
        .heartbeat_batch(Vec::new(), Duration::from_secs(1))
        .await
        .expect("empty")
        .is_empty());
    let err = store
        .heartbeat_batch(vec![lease(0)], Duration::ZERO)
        .await
        .expect_err("bad ttl");
    assert!(err.invalid_field().is_some(), "{err:?}");
}

/// A job's timeout is a hash field in milliseconds, absent when none; every read returns
/// it, single and batch enqueues alike, and a record written without it reads as `None`.
#[tokio::test]
async fn timeout_is_stored_in_milliseconds_and_optional() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let single = store
        .enqueue(NewJob::new("q").timeout(Duration::from_millis(1500)))
        .await
        .expect("enqueue")
        .id;
    let batch = enqueue_all(
        &store,
        vec![
            NewJob::new("q")
                .timeout(Duration::from_secs(90))
                .parent(single),
            NewJob::new("q").parent(single),
        ],
    )
    .await;
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let stored: Option<String> = env.admin.hget(key(single), "timeout").await.expect("HGET");
    assert_eq!(stored.as_deref(), Some("1500"));
    let stored: Option<String> = env
        .admin
        .hget(key(batch[1]), "timeout")
        .await
        .expect("HGET");
    assert_eq!(stored, None);
    let expected = [
        (single, Some(Duration::from_millis(1500))),
        (batch[0], Some(Duration::from_secs(90))),
        (batch[1], None),
    ];
    for (id, timeout) in expected {
        assert_eq!(store.get(id).await.expect("get").timeout, timeout);
    }
    let children = store.children(single).await.expect("children");
    assert_eq!(
        children.iter().map(|j| j.timeout).collect::<Vec<_>>(),
        vec![Some(Duration::from_secs(90)), None]
    );
    let listed = store.list(ListQuery::new("q")).await.expect("list");
    assert_eq!(listed.jobs.len(), 3);
    for job in &listed.jobs {
        assert_eq!(
            Some(job.timeout),
            expected.iter().find(|e| e.0 == job.id).map(|e| e.1)
        );
    }
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(3))
        .await
        .expect("claim");
    for job in &claimed {
        assert_eq!(
            Some(job.job.timeout),
            expected.iter().find(|e| e.0 == job.id()).map(|e| e.1)
        );
    }
    // A record of an earlier version has no field: None.
    let _: () = env.admin.hdel(key(single), "timeout").await.expect("HDEL");
    assert_eq!(store.get(single).await.expect("get").timeout, None);
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

/// Durability (docs/redis.md, "Durability"; CONTRACT A6): with `appendfsync always`, a
/// redis-server killed with SIGKILL in the middle of enqueues, claims and completions
/// loses no acknowledged enqueue (single or batch) and no acknowledged completion, and
/// the store's connection recovers by itself once the server is back on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_sigkilled_server_with_fsync_always() {
    let Some(mut server) = OwnServer::start().await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = StoreSettings::default()
        .namespace("durability")
        .clock(Arc::new(clock.clone()));
    let store = Store::new(
        RedisBackend::connect(&server.url(), settings)
            .await
            .expect("connect"),
    );
    let batch = enqueue_all(&store, (0..100).map(|_| NewJob::new("q")).collect()).await;
    let enqueued = Arc::new(std::sync::Mutex::new(batch));
    let completed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let producer = {
        let (store, enqueued) = (store.clone(), enqueued.clone());
        tokio::spawn(async move {
            let mut i = 0u32;
            while let Ok(e) = store
                .enqueue(NewJob::new("q").payload(i.to_le_bytes().to_vec()))
                .await
            {
                enqueued.lock().expect("lock").push(e.id);
                i += 1;
            }
        })
    };
    let worker = {
        let (store, completed) = (store.clone(), completed.clone());
        tokio::spawn(async move {
            loop {
                let Ok(batch) = store
                    .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(600)).limit(10))
                    .await
                else {
                    return;
                };
                for job in batch {
                    if store.complete(job.id(), job.token(), None).await.is_err() {
                        return;
                    }
                    completed.lock().expect("lock").push(job.id());
                }
            }
        })
    };
    // Mid-run: once both have acknowledged a good number of writes.
    loop {
        let (e, c) = (
            enqueued.lock().expect("lock").len(),
            completed.lock().expect("lock").len(),
        );
        if e >= 600 && c >= 200 {
            break;
        }
        tokio::task::yield_now().await;
    }
    server.kill_9();
    producer.await.expect("join producer");
    worker.await.expect("join worker");
    let enqueued: Vec<JobId> = enqueued.lock().expect("lock").clone();
    let completed: Vec<JobId> = completed.lock().expect("lock").clone();
    eprintln!(
        "killed after {} acknowledged enqueues, {} acknowledged completions",
        enqueued.len(),
        completed.len()
    );

    server.spawn().await;
    // The store's connection manager reconnects by itself: the first calls may still
    // see the old connection fail.
    let mut recovered = false;
    for _ in 0..100 {
        match store.stats("q").await {
            Ok(_) => {
                recovered = true;
                break;
            }
            Err(err) => {
                assert!(err.is_retryable(), "{err:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        recovered,
        "the store did not reconnect to the restarted server"
    );
    let done: HashSet<JobId> = completed.iter().copied().collect();
    for id in &enqueued {
        let job = store
            .get(*id)
            .await
            .expect("an acknowledged enqueue was lost");
        if done.contains(id) {
            assert_eq!(
                job.state,
                JobState::Succeeded,
                "an acknowledged completion was lost"
            );
        }
    }
    let stats = store.stats("q").await.expect("stats");
    assert!(stats.total() >= enqueued.len() as u64);
    assert!(stats.succeeded >= completed.len() as u64);
    // The store still works: claims go on from where they were.
    let more = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(600)).limit(10))
        .await
        .expect("claim after the restart");
    for job in more {
        store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete after the restart");
    }
}

/// On a cluster (`JOBS_REDIS_CLUSTER_URLS`), the paths the conformance suite does not
/// reach run too: a batch whose payloads are staged (3 x 3 MiB, above one call's 8 MiB),
/// its pipelines and final call all in the namespace's slot, and `heartbeat_batch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_runs_staged_batches_and_heartbeat_batches() {
    let Ok(urls) = std::env::var("JOBS_REDIS_CLUSTER_URLS") else {
        eprintln!("cluster test skipped: JOBS_REDIS_CLUSTER_URLS is not set");
        return;
    };
    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
    let clock = ManualClock::default();
    let namespace = durq_conformance::unique_namespace("clstage");
    let _cleanup = Cleanup::new(urls.clone(), &namespace);
    let settings = StoreSettings::default()
        .namespace(namespace)
        .clock(Arc::new(clock.clone()));
    let store = Store::new(
        RedisConfig::cluster(urls.iter().cloned())
            .open(settings)
            .await
            .expect("connect cluster"),
    );
    let big = 3 * 1024 * 1024;
    let ids = enqueue_all(
        &store,
        (0..3u8)
            .map(|i| NewJob::new("q").payload(vec![i; big]))
            .collect(),
    )
    .await;
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            store.payload(*id).await.expect("payload"),
            Bytes::from(vec![i as u8; big])
        );
    }
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(5)).limit(3))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    let leases = claimed
        .iter()
        .map(|c| durq_core::HeldLease::new(c.id(), c.token()))
        .collect();
    let answers = store
        .heartbeat_batch(leases, Duration::from_secs(30))
        .await
        .expect("heartbeat batch");
    assert!(answers.iter().all(Result::is_ok));
    for job in claimed {
        store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
    }
    clock.advance(StoreSettings::default().retention + Duration::from_secs(1));
    assert_eq!(store.purge(10).await.expect("purge"), 3);
}

/// A claim with a budget of `gpu` units on queue `q`.
fn gpu_claim(gpu: u64, limit: usize) -> ClaimRequest {
    ClaimRequest::new(["q"], "w", Duration::from_secs(30))
        .limit(limit)
        .budget(Budget::new().amount("gpu", gpu))
}

/// CONTRACT §5 for placements (F1): a `placement` field that is not the JSON the store
/// wrote is `Corrupt` for `get`, and a claim that meets it buries the job (dead,
/// `corrupt record: …`) and goes on with the jobs behind it: a fitted claim from Lua
/// (where the index entry says the same), a plain claim once Rust fails to decode the
/// job it leased. Neither hands it out, and `list` shows both dead.
#[tokio::test]
async fn unreadable_placement_is_corrupt_and_buried_by_claims() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let needs = Needs::new().amount("gpu", 1);
    let ids = enqueue_all(
        &store,
        vec![
            NewJob::new("q").needs(needs.clone()),
            NewJob::new("q"),
            NewJob::new("q").needs(needs.clone()).locality("here"),
            NewJob::new("q").needs(needs.clone()),
            NewJob::new("q"),
        ],
    )
    .await;
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let index = env.key("placement");
    // Damaged in the record and its index entry alike, as a bad restore would leave it.
    let _: () = env
        .admin
        .hset(key(ids[0]), "placement", "{\"a\":")
        .await
        .expect("HSET");
    let _: () = env
        .admin
        .hset(&index, id_text(ids[0]), "{\"a\":")
        .await
        .expect("HSET");
    // Readable JSON of the wrong shape, in the record only (the index is repaired from it).
    let _: () = env
        .admin
        .hset(key(ids[3]), "placement", "{\"a\":{\"gpu\":-1}}")
        .await
        .expect("HSET");
    for bad in [ids[0], ids[3]] {
        let err = store.get(bad).await.expect_err("corrupt");
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    }

    let claimed = store.claim(gpu_claim(1, 2)).await.expect("fitted claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![ids[1], ids[2]],
        "the unreadable job is skipped and buried, the next ones are claimed"
    );
    assert_eq!(claimed[1].job.needs, needs);
    assert_eq!(claimed[1].job.locality.as_deref(), Some("here"));
    // The wrong shape only Rust can tell: a plain claim leases it, then buries it.
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10))
        .await
        .expect("plain claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![ids[4]]
    );
    for bad in [ids[0], ids[3]] {
        let state: String = env.admin.hget(key(bad), "state").await.expect("HGET");
        assert_eq!(state, "dead", "{bad}");
        let error: String = env.admin.hget(key(bad), "error").await.expect("HGET");
        assert!(error.starts_with("corrupt record: "), "{error}");
        assert!(error.contains("placement"), "{error}");
        let err = store.get(bad).await.expect_err("still corrupt");
        assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    }
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running, stats.dead), (0, 3, 2));
    let dead = store
        .list(ListQuery::new("q").state(JobState::Dead))
        .await
        .expect("list");
    let mut listed: Vec<JobId> = dead.jobs.iter().map(|j| j.id).collect();
    listed.sort();
    assert_eq!(listed, vec![ids[0], ids[3]]);
    // Purge deletes them with their index entries.
    env.clock
        .advance(env.settings.retention + Duration::from_secs(1));
    assert_eq!(store.purge(100).await.expect("purge"), 2);
    let left: Vec<String> = env.admin.hkeys(&index).await.expect("HKEYS");
    assert_eq!(
        left,
        vec![id_text(ids[2])],
        "only the running job's entry is left"
    );
}

/// CONTRACT F4 when the placement index was changed behind the store's back: the job's
/// own `placement` field decides. A job needing 8 GPUs whose index entry is gone is not
/// leased by a claim with 1 (it is never written); the index is set from the record, and
/// a claim it fits takes it.
#[tokio::test]
async fn a_placement_index_that_disagrees_with_the_record_is_repaired_not_trusted() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let big = store
        .enqueue(NewJob::new("q").needs(Needs::new().amount("gpu", 8)))
        .await
        .expect("enqueue")
        .id;
    let small = store
        .enqueue(NewJob::new("q").needs(Needs::new().amount("gpu", 1)))
        .await
        .expect("enqueue")
        .id;
    let index = env.key("placement");
    let stored: String = env
        .admin
        .hget(&index, id_text(big))
        .await
        .expect("the index holds the big job");
    let _: () = env.admin.hdel(&index, id_text(big)).await.expect("HDEL");
    let before = store.get(big).await.expect("get");

    let claimed = store.claim(gpu_claim(1, 10)).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![small]
    );
    assert_eq!(
        store.get(big).await.expect("get"),
        before,
        "a job that does not fit is never written"
    );
    let repaired: Option<String> = env.admin.hget(&index, id_text(big)).await.expect("HGET");
    assert_eq!(repaired.as_deref(), Some(stored.as_str()));
    let claimed = store.claim(gpu_claim(8, 10)).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![big]
    );
}

/// CONTRACT §5 (Redis), the other way round: a job the claim holds is judged by its own
/// `placement` field, not by the index. A job needing 1 GPU whose index entry says 8 is
/// leased by a claim with 1 GPU, in its order between the jobs around it.
#[tokio::test]
async fn a_held_job_is_judged_by_its_record_not_the_index() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let one = || NewJob::new("q").needs(Needs::new().amount("gpu", 1));
    let ids = enqueue_all(&store, vec![one(), one(), one()]).await;
    let index = env.key("placement");
    let _: () = env
        .admin
        .hset(&index, id_text(ids[1]), r#"{"a":{"gpu":8}}"#)
        .await
        .expect("HSET");
    // The first call holds nothing, stops at the first job and learns the three ids;
    // the second holds them and reads each record.
    let claimed = store.claim(gpu_claim(1, 10)).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        ids,
        "the record decides for the job whose index entry is wrong"
    );
}

/// The scan bound of a fitted claim (`FIT_SCAN_BOUND`, 2,000 ready entries per script
/// call, and `FIT_SCAN_CALLS`, 4 calls more per claim): a job that fits behind 5,000 that
/// do not is still claimed, in one claim, and none of the others is written; behind
/// 17,000 (more than 5 × 2,000) a claim finds nothing and leaves everything as it was,
/// and the job is claimed once the head has drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fitted_claim_scans_past_jobs_it_does_not_fit_within_its_bound() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let big = || NewJob::new("q").needs(Needs::new().amount("gpu", 8));
    let small = || NewJob::new("q").needs(Needs::new().amount("gpu", 1));
    let mut jobs: Vec<NewJob> = (0..5_000).map(|_| big()).collect();
    jobs.push(small());
    let fits = *enqueue_all(&store, jobs).await.last().expect("ids");
    let started = std::time::Instant::now();
    let claimed = store.claim(gpu_claim(1, 1)).await.expect("claim");
    eprintln!(
        "a fitted claim past 5,000 jobs it does not fit took {:?}",
        started.elapsed()
    );
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![fits]
    );
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running), (5_000, 1));

    let mut jobs: Vec<NewJob> = (0..12_000).map(|_| big()).collect();
    jobs.push(small());
    let deep = *enqueue_all(&store, jobs).await.last().expect("ids");
    let started = std::time::Instant::now();
    let claimed = store.claim(gpu_claim(1, 1)).await.expect("claim");
    eprintln!(
        "an empty fitted claim over 17,000 jobs took {:?}",
        started.elapsed()
    );
    assert!(claimed.is_empty(), "past the bound the claim gives up");
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.running), (17_001, 1));
    let drained = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10_000))
        .await
        .expect("claim");
    assert_eq!(drained.len(), 10_000);
    let claimed = store.claim(gpu_claim(1, 1)).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.id()).collect::<Vec<_>>(),
        vec![deep]
    );
}

/// `claim_fit.lua` transcribes `Budget::admits` and `FitOrder` into Lua: random jobs
/// (amounts of three names, zero and 2^53 - 1 included, capabilities, localities,
/// priorities) over two queues, claimed by random budgets (named zeros, absent names, no
/// capabilities, no budget), preferences and limits, come out exactly as the Rust
/// reference orders and cuts them, and a plain claim then takes exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fitted_claims_agree_with_the_rust_reference() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    // A fixed LCG: the same cases on every run, no extra dependency.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    const NAMES: [&str; 3] = ["cpu_milli", "mem_bytes", "gpu"];
    const CAPS: [&str; 3] = ["fpga", "fpga-large", "tpu"];
    const PLACES: [&str; 3] = ["x", "y", "z"];
    let amounts = [0, 1, 2, 3, durq_core::validate::MAX_AMOUNT];
    for round in 0..12 {
        let queues = [format!("r{round}a"), format!("r{round}b")];
        let mut jobs = Vec::new();
        for _ in 0..40 {
            let mut needs = Needs::new();
            for name in NAMES {
                if next(2) == 0 {
                    needs = needs.amount(name, amounts[next(5) as usize]);
                }
            }
            for cap in CAPS {
                if next(4) == 0 {
                    needs = needs.capability(cap);
                }
            }
            let mut job = NewJob::new(queues[next(2) as usize].clone())
                .priority(next(3) as i16)
                .needs(needs);
            if next(3) > 0 {
                job = job.locality(PLACES[next(3) as usize]);
            }
            jobs.push(job);
        }
        let ids = enqueue_all(&store, jobs.clone()).await;
        let budget = (next(5) > 0).then(|| {
            let mut budget = Budget::new();
            for name in NAMES {
                if next(2) == 0 {
                    budget = budget.amount(name, amounts[next(5) as usize]);
                }
            }
            for cap in CAPS {
                if next(2) == 0 {
                    budget = budget.capability(cap);
                }
            }
            budget
        });
        let prefer: Vec<&str> = PLACES.into_iter().filter(|_| next(3) == 0).collect();
        let limit = 1 + next(30) as usize;
        let mut request = ClaimRequest::new(queues.clone(), "w", Duration::from_secs(60))
            .limit(limit)
            .prefer(prefer.clone());
        if let Some(budget) = budget.clone() {
            request = request.budget(budget);
        }
        // Enqueued at one instant in this order: the sequence is the index.
        let mut expected: Vec<(durq_core::fit::FitOrder, JobId)> = jobs
            .iter()
            .zip(&ids)
            .enumerate()
            .filter(|(_, (job, _))| request.admits(&job.needs))
            .map(|(i, (job, id))| {
                let ready = ReadyOrder::new(job.priority, Timestamp::from_millis(0), i as u64);
                (request.fit_order(ready, job.locality.as_deref()), *id)
            })
            .collect();
        expected.sort();
        let expected: Vec<JobId> = expected.into_iter().take(limit).map(|(_, id)| id).collect();
        let claimed = store.claim(request).await.expect("fitted claim");
        let got: Vec<JobId> = claimed.iter().map(|c| c.id()).collect();
        assert_eq!(
            got, expected,
            "round {round}: budget {budget:?}, prefer {prefer:?}, limit {limit}"
        );
        let rest = store
            .claim(ClaimRequest::new(queues.clone(), "w", Duration::from_secs(60)).limit(100))
            .await
            .expect("plain claim");
        let mut all: Vec<JobId> = got.into_iter().chain(rest.iter().map(|c| c.id())).collect();
        all.sort();
        let mut ids = ids;
        ids.sort();
        assert_eq!(all, ids, "round {round}: every job is claimed once");
    }
}

/// The canonical text of a job id, as the store writes it into keys and index members.
fn id_text(id: JobId) -> String {
    id.to_string()
}

/// `queues.lua` (CONTRACT A7): the queues come from the list index, names that are
/// prefixes of others ("a", "a-", "a.b", "ab") each listed once; counts match `stats`
/// for each; the oldest ready time is found across priority bands (the lowest band
/// holding the oldest job), after promoting the scheduled jobs that came due; a queue
/// whose jobs are all finished is listed with no ready time; an empty namespace lists
/// none.
#[tokio::test]
async fn queues_lists_every_queue_with_counts_and_oldest_ready_time() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let overviews = |store: &TestStore| {
        let store = store.clone();
        async move {
            durq_core::Inspect::queues(&store.redis, store.now())
                .await
                .expect("queues")
        }
    };
    assert!(overviews(&store).await.is_empty(), "empty namespace");
    assert!(store.queues().await.expect("queues").is_empty());

    let t0 = env.clock.now();
    let at = |ms: i64| Timestamp::from_millis(t0.as_millis() + ms);
    enqueue_all(
        &store,
        vec![
            // Comes due at t0 + 1 s, in the lowest band: the oldest ready job of "a".
            NewJob::new("a").priority(-3).run_at(at(1_000)),
            // Stays scheduled.
            NewJob::new("a").priority(-3).run_at(at(3_600_000)),
            NewJob::new("ab").run_at(at(3_600_000)),
        ],
    )
    .await;
    env.clock.advance(Duration::from_secs(10));
    let jobs = enqueue_all(
        &store,
        vec![
            NewJob::new("a").priority(5),
            NewJob::new("a").priority(0),
            NewJob::new("a").priority(i16::MAX),
            NewJob::new("a.b"),
            NewJob::new("a.b"),
            NewJob::new("a.b"),
            NewJob::new("a-")
                .priority(i16::MIN)
                .run_at(Timestamp::from_millis(-5_000)),
            NewJob::new("a-").priority(i16::MAX),
            NewJob::new("b:1"),
        ],
    )
    .await;
    let lease = Duration::from_secs(30);
    let claimed = store
        .claim(ClaimRequest::new(["a.b"], "w", lease).limit(3))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 3);
    store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .expect("complete");
    store
        .fail(claimed[1].id(), claimed[1].token(), "boom", Retry::Never)
        .await
        .expect("fail");
    store.cancel(jobs[8]).await.expect("cancel");
    store.pause("b:1").await.expect("pause");
    store.pause("zz").await.expect("pause");
    env.clock.advance(Duration::from_secs(1));

    let listed = overviews(&store).await;
    let names: Vec<&str> = listed.iter().map(|o| o.queue.as_str()).collect();
    assert_eq!(
        names,
        ["a", "a-", "a.b", "ab", "b:1"],
        "by name, paused zz not a backend's"
    );
    for overview in &listed {
        let mut stats = store.stats(&overview.queue).await.expect("stats");
        stats.paused = false;
        assert_eq!(overview.stats, stats, "{}", overview.queue);
        assert_eq!(overview.lag, None, "the handle fills in the lag");
    }
    let by_name = |name: &str| {
        listed
            .iter()
            .find(|o| o.queue == name)
            .unwrap_or_else(|| panic!("{name} listed"))
    };
    let a = by_name("a");
    assert_eq!(
        (a.stats.ready, a.stats.scheduled),
        (4, 1),
        "the due job was promoted"
    );
    assert_eq!(
        a.oldest_ready,
        Some(at(1_000)),
        "the lowest band holds the oldest"
    );
    assert_eq!(
        by_name("a-").oldest_ready,
        Some(Timestamp::from_millis(-5_000))
    );
    let ab = by_name("a.b");
    assert_eq!(
        (
            ab.stats.running,
            ab.stats.succeeded,
            ab.stats.dead,
            ab.oldest_ready
        ),
        (1, 1, 1, None)
    );
    let ab = by_name("ab");
    assert_eq!(
        (ab.stats.scheduled, ab.stats.ready, ab.oldest_ready),
        (1, 0, None)
    );
    let b1 = by_name("b:1");
    assert_eq!(
        (b1.stats.cancelled, b1.stats.total(), b1.oldest_ready),
        (1, 1, None)
    );

    // Through the handle: paused flags and lag filled in, the empty paused queue added.
    let handle = store.queues().await.expect("queues");
    let names: Vec<&str> = handle.iter().map(|o| o.queue.as_str()).collect();
    assert_eq!(names, ["a", "a-", "a.b", "ab", "b:1", "zz"]);
    assert_eq!(handle[0].lag, Some(Duration::from_secs(10)));
    assert!(handle[4].stats.paused && handle[5].stats.paused && !handle[0].stats.paused);

    // Once the oldest band is claimed, the next oldest ready time is the answer.
    let taken = store
        .claim(ClaimRequest::new(["a"], "w", lease).limit(3))
        .await
        .expect("claim");
    assert_eq!(taken.len(), 3, "priorities MAX, 5 and 0 first");
    let a = overviews(&store).await.remove(0);
    assert_eq!((a.queue.as_str(), a.oldest_ready), ("a", Some(at(1_000))));
    let last = store
        .claim(ClaimRequest::new(["a"], "w", lease).limit(1))
        .await
        .expect("claim");
    assert_eq!(last.len(), 1);
    let a = overviews(&store).await.remove(0);
    assert_eq!(
        (a.stats.ready, a.stats.running, a.oldest_ready),
        (0, 4, None)
    );
}

/// More queues than one `queues.lua` call reads (its read budget): the calls continue
/// after the last queue listed, and every queue is listed once, in order.
#[tokio::test]
async fn queues_lists_more_queues_than_one_call_reads() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let names: Vec<String> = (0..1500).map(|i| format!("q{i}")).collect();
    let mut jobs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        jobs.push(NewJob::new(name.as_str()));
        if i % 3 == 0 {
            jobs.push(NewJob::new(name.as_str()).priority(-1));
        }
    }
    enqueue_all(&store, jobs).await;
    let listed = durq_core::Inspect::queues(&store.redis, store.now())
        .await
        .expect("queues");
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(
        listed.iter().map(|o| o.queue.clone()).collect::<Vec<_>>(),
        expected
    );
    let now = store.now();
    for overview in &listed {
        let n: usize = overview.queue[1..].parse().expect("index");
        let jobs = if n % 3 == 0 { 2 } else { 1 };
        assert_eq!(overview.stats.ready, jobs, "{}", overview.queue);
        assert_eq!(overview.oldest_ready, Some(now), "{}", overview.queue);
    }
}

/// A list index member that names no queue is reported as corrupt, not skipped.
#[tokio::test]
async fn queues_reports_a_list_member_without_a_queue_as_corrupt() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    store.enqueue(NewJob::new("q")).await.expect("enqueue");
    let list = env.key("list");
    let _: i64 = env.admin.zadd(&list, " a broken", 0).await.expect("ZADD");
    let err = store.queues().await.expect_err("corrupt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
}

/// W1–W4 on Redis: a worker is three entries under the namespace's tag (spec, in
/// flight, last seen); reaping more workers than one script call handles (1,000) takes
/// them all, in calls that each stay bounded; an unreadable in-flight count or
/// last-seen score is `Corrupt`; a stray index entry without a spec is never reported
/// but reaped quietly; `drop_namespace` removes the worker keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_reaped_in_bounded_calls_and_unreadable_ones_are_corrupt() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let worker = |id: String| durq_core::WorkerInfo::new(id, "host", 1, vec!["q".into()], 4);
    let silent: Vec<String> = (0..2_500).map(|i| format!("old-{i:05}")).collect();
    for id in &silent {
        store
            .register_worker(&worker(id.clone()))
            .await
            .expect("register");
    }
    env.clock.advance(Duration::from_secs(60));
    store
        .register_worker(&worker("alive".into()))
        .await
        .expect("register");
    store.worker_heartbeat("alive", 3).await.expect("heartbeat");
    for name in ["workers", "workers:busy"] {
        let n: u64 = env.admin.hlen(env.key(name)).await.expect("HLEN");
        assert_eq!(n, 2_501, "{name}");
    }
    assert_eq!(env.zcard("workers:seen").await, 2_501);
    let seen: Option<f64> = env
        .admin
        .zscore(env.key("workers:seen"), "alive")
        .await
        .expect("ZSCORE");
    assert_eq!(seen, Some(env.clock.now().as_millis() as f64));

    // A seen entry with no spec (left by hand) is removed by reap but not reported.
    let _: () = env
        .admin
        .zadd(env.key("workers:seen"), "stray", 0)
        .await
        .expect("ZADD");
    let reaped = store
        .reap_workers(Duration::from_secs(30))
        .await
        .expect("reap");
    assert_eq!(reaped, silent, "every silent worker, sorted");
    assert_eq!(env.zcard("workers:seen").await, 1);
    let left: Vec<String> = store
        .workers()
        .await
        .expect("workers")
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, ["alive"]);
    let alive = store.worker("alive").await.expect("worker");
    assert_eq!((alive.in_flight, alive.last_seen), (3, env.clock.now()));

    // Unreadable values are reported, never guessed.
    for (key, field, value) in [
        ("workers:busy", "alive", "-1"),
        ("workers:busy", "alive", "many"),
    ] {
        let _: () = env
            .admin
            .hset(env.key(key), field, value)
            .await
            .expect("HSET");
        assert!(
            matches!(store.workers().await, Err(Error::Corrupt { .. })),
            "in flight {value:?}"
        );
    }
    let _: () = env
        .admin
        .hset(env.key("workers:busy"), "alive", "3")
        .await
        .expect("HSET");
    let _: () = env
        .admin
        .zadd(env.key("workers:seen"), "alive", 1.5)
        .await
        .expect("ZADD");
    assert!(matches!(store.workers().await, Err(Error::Corrupt { .. })));
    let _: i64 = env
        .admin
        .zrem(env.key("workers:seen"), "alive")
        .await
        .expect("ZREM");
    assert!(matches!(store.workers().await, Err(Error::Corrupt { .. })));
    // A heartbeat writes both values again.
    store.worker_heartbeat("alive", 2).await.expect("heartbeat");
    assert_eq!(store.worker("alive").await.expect("worker").in_flight, 2);

    store.redis.drop_namespace().await.expect("drop_namespace");
    assert_eq!(env.namespace_keys().await, Vec::<String>::new());
}

/// The fields of a job's hash, sorted.
async fn hash_fields(env: &mut Env, id: JobId) -> Vec<String> {
    let key = durq_redis::job_key(&env.settings.namespace, id);
    let mut fields: Vec<String> = env.admin.hkeys(&key).await.expect("HKEYS");
    fields.sort();
    fields
}

/// CONTRACT H1–H4 on Redis: an attempt that ends by fail, release or reclaim is a field of
/// the job's own hash (`a` + token mod 32), written by the script that ends the lease; no
/// key is added for it. A claim and a completion write no attempt: the completion writes
/// only what it wrote before (`state`, `finished`), and the hash keeps the worker of the
/// last lease, from which `attempts` shows the succeeded attempt.
#[tokio::test]
async fn attempts_are_fields_of_the_job_hash_and_complete_writes_none() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let keys_before = env.namespace_keys().await;
    let ttl = Duration::from_secs(5);
    let first = store
        .claim_one(&["q"], "w-1", ttl)
        .await
        .expect("claim")
        .expect("a job");
    env.clock.advance(Duration::from_millis(3));
    store
        .fail(id, first.token(), "boom", Retry::At(env.clock.now()))
        .await
        .expect("fail");
    let after_fail = hash_fields(&mut env, id).await;
    assert!(after_fail.contains(&"a1".to_owned()), "{after_fail:?}");
    let second = store
        .claim_one(&["q"], "w-2", ttl)
        .await
        .expect("claim")
        .expect("a job");
    let fields = hash_fields(&mut env, id).await;
    assert_eq!(
        fields
            .iter()
            .filter(|f| f.starts_with('a') && f[1..].parse::<u64>().is_ok())
            .count(),
        1,
        "a claim writes no attempt: {fields:?}"
    );
    env.clock.advance(Duration::from_millis(4));
    store
        .complete(id, second.token(), None)
        .await
        .expect("complete");
    let after_complete = hash_fields(&mut env, id).await;
    let added: Vec<&String> = after_complete
        .iter()
        .filter(|f| !fields.contains(f))
        .collect();
    assert_eq!(added, vec!["finished"], "complete adds only finished_at");
    let worker: String = env
        .admin
        .hget(durq_redis::job_key(&env.settings.namespace, id), "worker")
        .await
        .expect("HGET");
    assert_eq!(worker, "w-2", "the worker of the last lease is kept");
    assert_eq!(store.get(id).await.expect("get").lease, None);
    let history = store.attempts(id).await.expect("attempts");
    assert_eq!(
        history
            .iter()
            .map(|a| (
                a.token.get(),
                a.worker.as_str(),
                a.outcome,
                a.error.as_deref()
            ))
            .collect::<Vec<_>>(),
        vec![
            (1, "w-1", durq_core::AttemptOutcome::Failed, Some("boom")),
            (2, "w-2", durq_core::AttemptOutcome::Succeeded, None),
        ]
    );
    let added: Vec<String> = env
        .namespace_keys()
        .await
        .into_iter()
        .filter(|key| !keys_before.contains(key))
        .collect();
    let indexes = [env.key("leases"), env.key("running"), env.key("done")];
    assert!(
        added.iter().all(|key| indexes.contains(key)),
        "no key beyond the indexes a claim and a completion always wrote: {added:?}"
    );
}

/// An attempt record or a lease that cannot be read is corrupt (CONTRACT §5): `attempts`
/// answers `Corrupt` while `get` still reads the job; a lease call on a running job
/// without its worker refuses with `Corrupt` and writes nothing (its attempt could not
/// be recorded), and reclaim buries such a job.
#[tokio::test]
async fn unreadable_attempts_and_leases_are_corrupt() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = enqueue_and_claim(&store, 2).await;
    let (job, other) = (&claimed[0], &claimed[1]);
    store.release(job.id(), job.token()).await.expect("release");
    let key = durq_redis::job_key(&env.settings.namespace, job.id());
    let _: () = env
        .admin
        .hset(&key, "a1", "1 2 x r 1 w")
        .await
        .expect("HSET");
    let err = store.attempts(job.id()).await.expect_err("corrupt attempt");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert_eq!(
        store.get(job.id()).await.expect("get").state,
        JobState::Queued
    );

    let other_key = durq_redis::job_key(&env.settings.namespace, other.id());
    let _: i64 = env.admin.hdel(&other_key, "worker").await.expect("HDEL");
    let before: Vec<(String, String)> = env.admin.hgetall(&other_key).await.expect("HGETALL");
    let err = store
        .fail(other.id(), other.token(), "boom", Retry::Never)
        .await
        .expect_err("fail without a worker");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let err = store
        .release(other.id(), other.token())
        .await
        .expect_err("release without a worker");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let after: Vec<(String, String)> = env.admin.hgetall(&other_key).await.expect("HGETALL");
    assert_eq!(after, before, "nothing written");
    env.clock.advance(Duration::from_secs(6));
    let reclaimed = store.reclaim(10).await.expect("reclaim");
    assert_eq!(
        reclaimed
            .iter()
            .map(|r| (r.id, r.state))
            .collect::<Vec<_>>(),
        vec![(other.id(), JobState::Dead)]
    );
    let error: String = env.admin.hget(&other_key, "error").await.expect("HGET");
    assert_eq!(error, "corrupt record: field worker missing");
}

/// Tags and trace context live in `meta`, after tenant and key; a job with neither
/// stores `meta` as before they existed, so records written then read as having none.
#[tokio::test]
async fn tags_and_trace_context_are_kept_in_meta() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tagged = store
        .enqueue(
            NewJob::new("q")
                .tenant("t")
                .tag("plan", "pro")
                .trace_context(trace),
        )
        .await
        .expect("enqueue")
        .id;
    let plain = store
        .enqueue(NewJob::new("q").tenant("t"))
        .await
        .expect("enqueue")
        .id;
    let meta = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let tagged_meta: String = env.admin.hget(meta(tagged), "meta").await.expect("HGET");
    assert!(
        tagged_meta.ends_with(&format!(" 1 - t {trace} {{\"plan\":\"pro\"}}")),
        "{tagged_meta}"
    );
    let plain_meta: String = env.admin.hget(meta(plain), "meta").await.expect("HGET");
    assert!(plain_meta.ends_with(" 1 - t"), "{plain_meta}");
    // Tags that do not decode make the record corrupt.
    let _: () = env
        .admin
        .hset(
            meta(tagged),
            "meta",
            tagged_meta.replace("{\"plan\"", "[\"plan\""),
        )
        .await
        .expect("HSET");
    let err = store.get(tagged).await.expect_err("corrupt tags");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    // A tag filter does not match what it cannot read; the list goes on.
    let listed = store
        .list(ListQuery::new("q").tag("plan", "pro"))
        .await
        .expect("list");
    assert!(listed.jobs.is_empty() && listed.next.is_none());
}

/// CONTRACT A4 on Redis: under a tenant or tag filter one `list` call examines at most
/// 4,096 index entries; a page that has not filled by then ends early with `next` set
/// to the last id examined, and paging on finds every match. Records that vanished or
/// whose `meta` cannot be read match no tenant and do not break the listing.
#[tokio::test]
async fn filtered_list_examines_a_bounded_number_of_entries_per_call() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let oldest = store
        .enqueue(NewJob::new("q").tenant("acme").tag("plan", "pro"))
        .await
        .expect("enqueue")
        .id;
    let others = enqueue_all(
        &store,
        (0..5_000)
            .map(|i| NewJob::new(if i % 2 == 0 { "q" } else { "r" }).tenant("other"))
            .collect(),
    )
    .await;
    let newest = store
        .enqueue(NewJob::new("r").tenant("acme").tag("plan", "pro"))
        .await
        .expect("enqueue")
        .id;
    // One record vanished, one with unreadable meta: neither breaks a filtered list.
    let _: () = env
        .admin
        .del(durq_redis::job_key(&env.settings.namespace, others[4_980]))
        .await
        .expect("DEL");
    let _: () = env
        .admin
        .hset(
            durq_redis::job_key(&env.settings.namespace, others[4_990]),
            "meta",
            "garbage",
        )
        .await
        .expect("HSET");
    for query in [
        ListQuery::all().tenant("acme"),
        ListQuery::all().tag("plan", "pro"),
        ListQuery::all().queue_prefix("q").tenant("acme"),
    ] {
        let mut found = Vec::new();
        let mut calls = 0;
        let mut cursor = None;
        loop {
            let mut page_query = query.clone().limit(10);
            page_query.cursor = cursor;
            let page = store.list(page_query).await.expect("list");
            calls += 1;
            found.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let expected = if query.queue_prefix.is_some() {
            vec![oldest]
        } else {
            vec![newest, oldest]
        };
        assert_eq!(found, expected, "{query:?}");
        if query.queue_prefix.is_none() {
            assert!(calls >= 2, "5,000 entries take more than one call: {calls}");
        }
    }
    // Without them, an unreadable record no claim has buried yet is reported, as `get`
    // reports it (CONTRACT §5); a vanished one is skipped, and pages stay full.
    let unfiltered = store.list(ListQuery::all().limit(1_000)).await;
    assert!(
        matches!(unfiltered, Err(Error::Corrupt { .. })),
        "{:?}",
        unfiltered.err()
    );
    let _: i64 = env
        .admin
        .del(durq_redis::job_key(&env.settings.namespace, others[4_990]))
        .await
        .expect("DEL");
    let page = store
        .list(ListQuery::all().limit(1_000))
        .await
        .expect("list");
    assert_eq!(page.jobs.len(), 1_000);
    assert_eq!(page.jobs[0].id, newest);
    assert!(page
        .jobs
        .iter()
        .all(|j| j.id != others[4_980] && j.id != others[4_990]));
}

/// Pages of queued jobs only or running jobs only, across queues and under a prefix:
/// queued and running share the list code `a`, so the lease index tells them apart.
#[tokio::test]
async fn queued_and_running_pages_span_queues() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let queue = ["a1", "a2", "b"][i % 3];
        ids.push((
            store.enqueue(NewJob::new(queue)).await.expect("enqueue").id,
            queue,
        ));
    }
    let mut running = HashSet::new();
    for queue in ["a1", "a2", "b"] {
        let claimed = store
            .claim(ClaimRequest::new([queue], "w", Duration::from_secs(30)).limit(2))
            .await
            .expect("claim");
        running.extend(claimed.iter().map(|c| c.id()));
    }
    for (query, state) in [
        (ListQuery::all().state(JobState::Queued), JobState::Queued),
        (ListQuery::all().state(JobState::Running), JobState::Running),
        (
            ListQuery::all().queue_prefix("a").state(JobState::Running),
            JobState::Running,
        ),
        (
            ListQuery::all().queue_prefix("a").state(JobState::Queued),
            JobState::Queued,
        ),
    ] {
        let expected: Vec<JobId> = ids
            .iter()
            .rev()
            .filter(|(id, queue)| {
                query.matches_queue(queue) && (running.contains(id) == (state == JobState::Running))
            })
            .map(|(id, _)| *id)
            .collect();
        let mut found = Vec::new();
        let mut cursor = None;
        loop {
            let mut page_query = query.clone().limit(2);
            page_query.cursor = cursor;
            let page = store.list(page_query).await.expect("list");
            assert!(page.jobs.iter().all(|j| j.state == state));
            found.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(found, expected, "{query:?}");
    }
}

/// `reopen` opens a connection of the reopening runtime's own: while the runtime the
/// store was opened on runs nothing (as one whose threads handlers block), the reopened
/// store still answers, where one sharing the first store's connection would wait for
/// that runtime to drive it.
#[test]
fn a_reopened_store_is_driven_by_the_runtime_that_reopened_it() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let (opening, reopening) = (runtime(), runtime());
    let Some(env) = opening.block_on(Env::new()) else {
        return;
    };
    let store = opening.block_on(env.store());
    let id = opening
        .block_on(store.enqueue(NewJob::new("q")))
        .expect("enqueue")
        .id;
    // From here on `opening` is never driven again.
    let reopened = reopening
        .block_on(store.handle.reopen())
        .expect("reopen")
        .expect("a Redis store reopens");
    let job = reopening
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), reopened.get(id)).await })
        .expect("the reopened store answers without the first runtime")
        .expect("get");
    assert_eq!(job.queue, "q");
    drop(reopened);
    drop(store);
    drop(opening);
    // The clean-up runs on its own connection.
    drop(env);
}
