//! The concurrency key of a job (CONTRACT K1-K5) on Redis: stored with the job, read
//! back by `get`, `list` and claims, and indexed where the limited claim reads it (the
//! `ckeys` hash, the `kready` and `kleases` sorted sets; see `lua/core.lua`). Every
//! script that moves a job into or out of the ready index, or leases it, keeps those
//! indexes; these tests drive each such move through the backend and compare the
//! indexes with raw Redis commands.
//!
//! The backend is called directly: the `durq_core::Store` handle refuses jobs with a key
//! until the backend declares `FlowControl`.
//!
//! Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`); skipped loudly when it
//! is unreachable, failing instead when `JOBS_REQUIRE_SERVICES=1`. Each test works in a
//! namespace of its own and drops it at the end, passed or failed.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use durq_core::{
    Admin, Backend, Budget, ClaimRequest, ClaimedJob, Inspect, JobId, JobState, ListQuery, NewJob,
    Retry, StoreSettings, Timestamp,
};
use durq_redis::RedisBackend;
use futures::FutureExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A backend on a fresh namespace, and a raw connection to look at its keys.
#[derive(Clone)]
struct Env {
    backend: RedisBackend,
    conn: MultiplexedConnection,
    namespace: String,
}

/// Runs `test` on a fresh namespace, then drops the namespace whether it passed or not.
async fn run<F, Fut>(test: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = ()>,
{
    let url = url();
    let conn = match redis::Client::open(url.as_str()) {
        Ok(client) => match client.get_multiplexed_async_connection().await {
            Ok(conn) => conn,
            Err(err) => return durq_conformance::skip_or_fail("Redis", &url, &err).unwrap_or(()),
        },
        Err(err) => return durq_conformance::skip_or_fail("Redis", &url, &err).unwrap_or(()),
    };
    let namespace = durq_conformance::unique_namespace("ckeys");
    let settings = StoreSettings::default().namespace(namespace.clone());
    let backend = RedisBackend::connect(&url, settings)
        .await
        .expect("connect");
    let env = Env {
        backend: backend.clone(),
        conn,
        namespace,
    };
    let outcome = AssertUnwindSafe(test(env)).catch_unwind().await;
    backend.drop_namespace().await.expect("drop the namespace");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A concurrency key as the store indexes it: its bytes in lower-case hex.
fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

const T0: i64 = 1_750_000_000_000;

fn at(offset: Duration) -> Timestamp {
    Timestamp::from_millis(T0 + i64::try_from(offset.as_millis()).expect("small"))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn plain_claim(limit: usize, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(["q"], "w", lease).limit(limit)
}

impl Env {
    fn key(&self, name: &str) -> String {
        format!("jobs:{{{}}}:{name}", self.namespace)
    }

    async fn zset(&mut self, name: &str) -> Vec<String> {
        let key = self.key(name);
        self.conn.zrange(&key, 0, -1).await.expect("ZRANGE")
    }

    async fn hash(&mut self, name: &str) -> BTreeMap<String, String> {
        let key = self.key(name);
        self.conn.hgetall(&key).await.expect("HGETALL")
    }

    async fn exists(&mut self, name: &str) -> bool {
        let key = self.key(name);
        self.conn.exists(&key).await.expect("EXISTS")
    }

    async fn job_field(&mut self, id: JobId, field: &str) -> Option<String> {
        let key = durq_redis::job_key(&self.namespace, id);
        self.conn.hget(&key, field).await.expect("HGET")
    }

    async fn enqueue(&self, jobs: Vec<NewJob>, now: Timestamp) -> Vec<JobId> {
        let enqueued = self
            .backend
            .enqueue_batch(jobs, now)
            .await
            .expect("enqueue");
        assert!(enqueued.iter().all(|e| e.created));
        enqueued.into_iter().map(|e| e.id).collect()
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Vec<ClaimedJob> {
        self.backend.claim(request, now).await.expect("claim")
    }

    /// The indexes hold exactly what they should: `ckeys` the keys of `keyed` (every
    /// live job with a key, by id), `kready` one member per ready job of `ready_keyed`
    /// and nothing else, each exactly the ready member it stands for with the job's key
    /// spliced in; every keyed job's hash has its `ckey`.
    async fn check(&mut self, keyed: &[(JobId, &str)], ready_keyed: &[JobId], when: &str) {
        let expected: BTreeMap<String, String> = keyed
            .iter()
            .map(|(id, key)| (id.to_string(), hex(key)))
            .collect();
        let ckeys = self.hash("ckeys").await;
        assert_eq!(ckeys, expected, "ckeys {when}");
        let kready: BTreeSet<String> = self.zset("kready").await.into_iter().collect();
        let kready_ids: BTreeSet<String> = kready
            .iter()
            .map(|m| m[m.len() - 36..].to_owned())
            .collect();
        let expected_ids: BTreeSet<String> = ready_keyed.iter().map(JobId::to_string).collect();
        assert_eq!(kready_ids, expected_ids, "kready ids {when}");
        assert_eq!(
            kready.len(),
            ready_keyed.len(),
            "one kready member per job {when}"
        );
        // Derived from the ready index: `QUEUE PRIO HEXKEY ORDER ID` of each ready member
        // `QUEUE ORDER ID` whose job has a key.
        let derived: BTreeSet<String> = self
            .zset("ready")
            .await
            .into_iter()
            .filter_map(|m| {
                let tail = &m[m.len() - 72..];
                let queue = &m[..m.len() - 73];
                let key = ckeys.get(&m[m.len() - 36..])?;
                Some(format!("{queue} {} {key} {tail}", &tail[..4]))
            })
            .collect();
        assert_eq!(kready, derived, "kready in step with ready {when}");
        for (id, key) in keyed {
            assert_eq!(
                self.job_field(*id, "ckey").await,
                Some(hex(key)),
                "ckey field {when}"
            );
        }
    }

    async fn kleases(&mut self) -> BTreeSet<String> {
        self.zset("kleases").await.into_iter().collect()
    }
}

fn lease_member(id: JobId, key: &str) -> String {
    format!("q {} {id}", hex(key))
}

fn ids_of(claimed: &[ClaimedJob]) -> Vec<JobId> {
    claimed.iter().map(ClaimedJob::id).collect()
}

fn keys_of(claimed: &[ClaimedJob]) -> BTreeMap<JobId, Option<String>> {
    claimed
        .iter()
        .map(|c| (c.id(), c.job.concurrency_key.clone()))
        .collect()
}

#[tokio::test]
async fn keyed_jobs_keep_their_indexes_through_every_move() {
    run(|mut env| async move {
        let t0 = at(secs(0));
        let ids = env
            .enqueue(
                vec![
                    NewJob::new("q").concurrency_key("cust-1"),
                    NewJob::new("q")
                        .concurrency_key("cust-2")
                        .run_at(at(secs(10))),
                    NewJob::new("q"),
                    NewJob::new("q").concurrency_key("cust-1").priority(5),
                    NewJob::new("q").run_at(at(secs(10))),
                ],
                t0,
            )
            .await;
        let [a, b, c, d, e] = ids[..] else {
            unreachable!()
        };
        let keyed = [(a, "cust-1"), (b, "cust-2"), (d, "cust-1")];
        env.check(&keyed, &[a, d], "after enqueue").await;
        assert_eq!(env.job_field(c, "ckey").await, None);
        assert_eq!(env.job_field(e, "ckey").await, None);
        for (id, key) in [
            (a, Some("cust-1")),
            (b, Some("cust-2")),
            (c, None),
            (e, None),
        ] {
            let job = env.backend.get(id).await.expect("get");
            assert_eq!(
                job.concurrency_key.as_deref(),
                key,
                "get reads the key back"
            );
        }
        let listed = env.backend.list(ListQuery::new("q")).await.expect("list");
        assert_eq!(listed.jobs.len(), 5);
        for job in &listed.jobs {
            let expected = keyed.iter().find(|(id, _)| *id == job.id).map(|(_, k)| *k);
            assert_eq!(
                job.concurrency_key.as_deref(),
                expected,
                "list reads the key"
            );
        }

        // Promotion (stats promotes due jobs first): b becomes ready, and enters kready.
        let t1 = at(secs(20));
        env.backend.stats("q", t1).await.expect("stats");
        env.check(&keyed, &[a, b, d], "after promotion").await;

        // Claim: d (priority 5), then a; both leave kready and enter kleases.
        let claimed = env.claim(plain_claim(2, secs(30)), t1).await;
        assert_eq!(
            keys_of(&claimed),
            BTreeMap::from([
                (d, Some("cust-1".to_owned())),
                (a, Some("cust-1".to_owned()))
            ])
        );
        env.check(&keyed, &[b], "after the first claim").await;
        assert_eq!(
            env.kleases().await,
            BTreeSet::from([lease_member(a, "cust-1"), lease_member(d, "cust-1")])
        );
        let token = |id: JobId, claimed: &[ClaimedJob]| {
            claimed
                .iter()
                .find(|c| c.id() == id)
                .expect("claimed")
                .token()
        };

        // Release: a due now goes back to kready; d snoozed does not (yet).
        env.backend
            .release(a, token(a, &claimed), t1, t1)
            .await
            .expect("release a");
        env.backend
            .release(d, token(d, &claimed), at(secs(80)), t1)
            .await
            .expect("snooze d");
        env.check(&keyed, &[a, b], "after release").await;
        // A lease's end takes its kleases entry with it.
        assert!(
            env.kleases().await.is_empty(),
            "released leases leave kleases"
        );

        // Claim everything ready: a, b, c, e.
        let claimed = env.claim(plain_claim(10, secs(30)), t1).await;
        assert_eq!(
            keys_of(&claimed),
            BTreeMap::from([
                (a, Some("cust-1".to_owned())),
                (b, Some("cust-2".to_owned())),
                (c, None),
                (e, None),
            ])
        );
        env.check(&keyed, &[], "after claiming all").await;
        assert_eq!(
            env.kleases().await,
            BTreeSet::from([lease_member(a, "cust-1"), lease_member(b, "cust-2")]),
            "one member per leased keyed job"
        );

        // Fail: b retried now (ready), a retried later (scheduled), c dead, e done.
        env.backend
            .fail(b, token(b, &claimed), "boom", Retry::At(t1), t1)
            .await
            .expect("fail b");
        env.backend
            .fail(a, token(a, &claimed), "boom", Retry::At(at(secs(25))), t1)
            .await
            .expect("fail a");
        let state = env
            .backend
            .fail(c, token(c, &claimed), "boom", Retry::Never, t1)
            .await
            .expect("fail c");
        assert_eq!(state, JobState::Dead);
        env.backend
            .complete(e, token(e, &claimed), None, t1)
            .await
            .expect("complete e");
        env.check(&keyed, &[b], "after fail").await;
        assert!(
            env.kleases().await.is_empty(),
            "failed leases leave kleases"
        );

        // Promotion by the queue overview: a and d are due.
        let t2 = at(secs(90));
        env.backend.queues(t2).await.expect("queues");
        env.check(&keyed, &[a, b, d], "after the second promotion")
            .await;

        // Cancel of a queued job: it leaves kready, keeps its key while it exists.
        assert_eq!(
            env.backend.cancel(b, t2).await.expect("cancel"),
            JobState::Cancelled
        );
        env.check(&keyed, &[a, d], "after cancel").await;
        // Admin retry: back in kready; an unkeyed job retried enters none.
        env.backend.retry(b, t2).await.expect("retry b");
        env.backend.retry(c, t2).await.expect("retry c");
        env.check(&keyed, &[a, b, d], "after retry").await;

        // Reclaim of expired leases: back in kready.
        let claimed = env.claim(plain_claim(10, secs(1)), t2).await;
        assert_eq!(claimed.len(), 4);
        env.check(&keyed, &[], "after the short claim").await;
        assert_eq!(env.kleases().await.len(), 3);
        let reclaimed = env
            .backend
            .reclaim(10, at(secs(95)))
            .await
            .expect("reclaim");
        assert_eq!(reclaimed.len(), 4);
        assert!(reclaimed.iter().all(|r| r.state == JobState::Queued));
        env.check(&keyed, &[a, b, d], "after reclaim").await;
        assert!(
            env.kleases().await.is_empty(),
            "reclaimed leases leave kleases"
        );

        // A fitted claim (claim_fit.lua) keeps them too, and reads the keys back.
        let t3 = at(secs(100));
        let fitted = plain_claim(10, secs(30)).budget(Budget::new().amount("gpu", 1));
        let claimed = env.claim(fitted, t3).await;
        assert_eq!(
            keys_of(&claimed),
            BTreeMap::from([
                (a, Some("cust-1".to_owned())),
                (b, Some("cust-2".to_owned())),
                (c, None),
                (d, Some("cust-1".to_owned())),
            ])
        );
        env.check(&keyed, &[], "after the fitted claim").await;
        assert_eq!(env.kleases().await.len(), 3);
        for c in &claimed {
            env.backend
                .complete(c.id(), c.token(), None, t3)
                .await
                .expect("complete");
        }
        assert!(
            env.kleases().await.is_empty(),
            "completed leases leave kleases"
        );

        // Purge of finished jobs: their keys go; a live keyed job keeps its entries.
        let f = env
            .enqueue(vec![NewJob::new("q").concurrency_key("cust-3")], t3)
            .await[0];
        let purged = env.backend.purge(100, t3).await.expect("purge");
        assert_eq!(purged, 5);
        env.check(&[(f, "cust-3")], &[f], "after purge").await;

        // The last job purged: a namespace without jobs keeps none of these keys.
        env.backend.cancel(f, t3).await.expect("cancel f");
        env.check(&[(f, "cust-3")], &[], "after cancelling f").await;
        assert_eq!(env.backend.purge(100, t3).await.expect("purge"), 1);
        for name in ["ckeys", "kready", "kleases"] {
            assert!(!env.exists(name).await, "{name} left behind");
        }
    })
    .await;
}

#[tokio::test]
async fn jobs_without_a_key_write_no_key_index() {
    run(|mut env| async move {
        let t0 = at(secs(0));
        let ids = env
            .enqueue(
                vec![
                    NewJob::new("q"),
                    NewJob::new("q").run_at(at(secs(10))),
                    NewJob::new("q").priority(3),
                    NewJob::new("q"),
                ],
                t0,
            )
            .await;
        let t1 = at(secs(20));
        let claimed = env.claim(plain_claim(3, secs(1)), t1).await;
        assert_eq!(claimed.len(), 3);
        assert!(claimed.iter().all(|c| c.job.concurrency_key.is_none()));
        env.backend
            .release(claimed[0].id(), claimed[0].token(), t1, t1)
            .await
            .expect("release");
        env.backend
            .release(claimed[1].id(), claimed[1].token(), at(secs(30)), t1)
            .await
            .expect("snooze");
        env.backend
            .fail(claimed[2].id(), claimed[2].token(), "x", Retry::At(t1), t1)
            .await
            .expect("fail");
        env.backend.stats("q", at(secs(40))).await.expect("stats");
        let fitted = plain_claim(1, secs(1)).budget(Budget::new().amount("gpu", 1));
        assert_eq!(env.claim(fitted, at(secs(40))).await.len(), 1);
        env.backend
            .reclaim(10, at(secs(50)))
            .await
            .expect("reclaim");
        let queued = env.backend.get(ids[3]).await.expect("get");
        assert_eq!(queued.concurrency_key, None);
        env.backend
            .cancel(ids[3], at(secs(50)))
            .await
            .expect("cancel");
        env.backend
            .retry(ids[3], at(secs(50)))
            .await
            .expect("retry");
        for id in &ids {
            assert_eq!(env.job_field(*id, "ckey").await, None);
        }
        for name in ["ckeys", "kready", "kleases"] {
            assert!(!env.exists(name).await, "{name} written for unkeyed jobs");
        }
    })
    .await;
}

#[tokio::test]
async fn any_utf8_key_round_trips_and_sorts_before_its_extensions() {
    run(|mut env| async move {
        let odd = "a b {x} }{ ü€😀\u{0}";
        let t0 = at(secs(0));
        let ids = env
            .enqueue(
                vec![
                    NewJob::new("q").concurrency_key(odd),
                    NewJob::new("q").concurrency_key("a b"),
                    NewJob::new("q").concurrency_key("a"),
                    NewJob::new("q").concurrency_key("é".repeat(128)),
                ],
                t0,
            )
            .await;
        let keys = [
            odd.to_owned(),
            "a b".to_owned(),
            "a".to_owned(),
            "é".repeat(128),
        ];
        let keyed: Vec<(JobId, &str)> = ids
            .iter()
            .copied()
            .zip(keys.iter().map(String::as_str))
            .collect();
        env.check(&keyed, &ids, "after enqueue").await;
        for (id, key) in &keyed {
            let job = env.backend.get(*id).await.expect("get");
            assert_eq!(job.concurrency_key.as_deref(), Some(*key));
        }
        // Within a queue and priority, a key's members come before its extensions'.
        let kready = env.zset("kready").await;
        let order: Vec<&str> = kready
            .iter()
            .map(|m| m.split(' ').nth(2).expect("key"))
            .collect();
        let mut sorted = vec![hex("a"), hex("a b"), hex(odd), hex(&"é".repeat(128))];
        sorted.sort();
        assert_eq!(order, sorted);
        assert_eq!(order[0], hex("a"));
        let claimed = env.claim(plain_claim(10, secs(30)), t0).await;
        let expected: BTreeMap<JobId, Option<String>> = keyed
            .iter()
            .map(|(id, key)| (*id, Some((*key).to_owned())))
            .collect();
        assert_eq!(keys_of(&claimed), expected);
        env.check(&keyed, &[], "after claim").await;
        let expected: BTreeSet<String> = keyed
            .iter()
            .map(|(id, key)| lease_member(*id, key))
            .collect();
        assert_eq!(env.kleases().await, expected);
    })
    .await;
}

#[tokio::test]
async fn a_claim_drops_the_key_entries_of_a_vanished_job_and_dedup_hits_write_nothing() {
    run(|mut env| async move {
        let t0 = at(secs(0));
        let first = env
            .backend
            .enqueue(
                NewJob::new("q")
                    .concurrency_key("k1")
                    .idempotency_key("same"),
                t0,
            )
            .await
            .expect("enqueue");
        let again = env
            .backend
            .enqueue(
                NewJob::new("q")
                    .concurrency_key("k2")
                    .idempotency_key("same"),
                t0,
            )
            .await
            .expect("enqueue again");
        assert!(first.created && !again.created && again.id == first.id);
        let gone = env
            .enqueue(vec![NewJob::new("q").concurrency_key("k3")], t0)
            .await[0];
        env.check(
            &[(first.id, "k1"), (gone, "k3")],
            &[first.id, gone],
            "after enqueue",
        )
        .await;

        // The hash vanishes under its index entries (C7): the claim drops them all.
        let key = durq_redis::job_key(&env.namespace, gone);
        let _: () = env.conn.del(&key).await.expect("DEL");
        let claimed = env.claim(plain_claim(10, secs(30)), t0).await;
        assert_eq!(
            keys_of(&claimed),
            BTreeMap::from([(first.id, Some("k1".to_owned()))])
        );
        env.check(&[(first.id, "k1")], &[], "after the claim").await;
        assert!(env.zset("ready").await.is_empty());
        assert_eq!(
            env.kleases().await,
            BTreeSet::from([lease_member(first.id, "k1")])
        );

        // A stored key that is not this crate's hex is a corrupt record.
        let key = durq_redis::job_key(&env.namespace, first.id);
        let _: () = env.conn.hset(&key, "ckey", "6G").await.expect("HSET");
        let err = env
            .backend
            .get(first.id)
            .await
            .expect_err("unreadable ckey");
        assert!(matches!(err, durq_core::Error::Corrupt { .. }), "{err:?}");
        let _: () = env.conn.hset(&key, "ckey", hex("k1")).await.expect("HSET");

        // A running job whose hash vanishes: reclaim drops its key with its entries (R5).
        let running = env
            .enqueue(vec![NewJob::new("q").concurrency_key("k4")], t0)
            .await[0];
        let claimed = env.claim(plain_claim(1, secs(1)), t0).await;
        assert_eq!(ids_of(&claimed), [running]);
        let key = durq_redis::job_key(&env.namespace, running);
        let _: () = env.conn.del(&key).await.expect("DEL");
        let reclaimed = env.backend.reclaim(10, at(secs(5))).await.expect("reclaim");
        assert!(reclaimed.is_empty(), "a vanished job is not reported");
        env.check(&[(first.id, "k1")], &[], "after reclaiming a vanished job")
            .await;
    })
    .await;
}

/// The plain claim script refuses queues with limits (`{'limited'}`), before promoting
/// or writing anything; the fitted claim applies them itself, and stops at a limits
/// field it cannot read before any write; a store whose queues have none claims as
/// before. Run as the store runs them (EVAL of the helpers and the script), so the
/// routing of the answer in Rust plays no part.
#[tokio::test]
async fn the_claim_scripts_leave_limited_queues_alone() {
    const CORE: &str = include_str!("../src/lua/core.lua");
    const LIB: &str = include_str!("../src/lua/lib.lua");
    const CLAIM: &str = include_str!("../src/lua/claim.lua");
    const CLAIM_FIT: &str = include_str!("../src/lua/claim_fit.lua");
    const FLOW: &str = include_str!("../src/lua/flow.lua");
    run(|mut env| async move {
        let t0 = at(secs(0));
        env.enqueue(
            vec![
                NewJob::new("q").concurrency_key("k"),
                NewJob::new("q").concurrency_key("k").run_at(at(secs(5))),
            ],
            t0,
        )
        .await;
        let now = at(secs(10)).as_millis().to_string();
        let placement = env.key("placement");
        let flow = env.key("flow");
        let shared: Vec<String> = [
            "ready", "sched", "leases", "list", "running", "finished", "paused", "ckeys", "kready",
            "kleases", "limits",
        ]
        .iter()
        .map(|name| env.key(name))
        .collect();
        let plain = |queue: &str| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(format!("{CORE}{CLAIM}")).arg(shared.len());
            cmd.arg(&shared)
                .arg(&now)
                .arg("w")
                .arg(&now)
                .arg(1)
                .arg(1)
                .arg(1000)
                .arg(1)
                .arg(queue);
            cmd
        };
        let fitted = |queue: &str| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(format!("{CORE}{LIB}{FLOW}{CLAIM_FIT}"))
                .arg(shared.len() + 2);
            cmd.arg(&shared)
                .arg(&placement)
                .arg(&flow)
                .arg(&now)
                .arg("w")
                .arg(&now)
                .arg(1)
                .arg(1)
                .arg(1000)
                .arg(2000)
                .arg("")
                .arg("")
                .arg("")
                .arg(1)
                .arg(queue)
                .arg(0);
            cmd
        };
        let limits = env.key("limits");
        let _: () = env.conn.hset(&limits, "q", "limits").await.expect("HSET");
        let reply: redis::Value = plain("q").query_async(&mut env.conn).await.expect("EVAL");
        assert_eq!(
            reply,
            redis::Value::Array(vec![redis::Value::BulkString(b"limited".to_vec())])
        );
        assert_eq!(env.zset("sched").await.len(), 1, "nothing promoted");
        assert_eq!(env.zset("kready").await.len(), 1);
        let refused: redis::RedisResult<redis::Value> =
            fitted("q").query_async(&mut env.conn).await;
        let err = refused.expect_err("an unreadable limits field stops the fitted claim");
        assert!(err.to_string().contains("JOBSCORRUPT"), "{err}");
        assert_eq!(env.zset("sched").await.len(), 1, "nothing promoted");
        assert_eq!(env.zset("kready").await.len(), 1);
        // Another queue's limits do not concern a claim of `q`: it promotes and goes on.
        let _: () = env.conn.hdel(&limits, "q").await.expect("HDEL");
        let _: () = env
            .conn
            .hset(&limits, "other", "limits")
            .await
            .expect("HSET");
        for cmd in [plain("q"), fitted("q")] {
            let reply: Vec<redis::Value> = cmd.query_async(&mut env.conn).await.expect("EVAL");
            assert_eq!(reply[0], redis::Value::BulkString(b"ok".to_vec()));
        }
        assert!(env.zset("sched").await.is_empty(), "promoted");
        assert_eq!(env.zset("kready").await.len(), 2);
        let _: () = env.conn.del(&limits).await.expect("DEL");
    })
    .await;
}

/// The start logs (CONTRACT K4) of keys that stopped starting jobs leave `flow` with
/// reclaim's housekeeping once their window has passed; a log still inside its window
/// stays, and so does a fair queue's turn. A queue whose limits lost their rate loses
/// its logs too. Each sweep runs on a fresh handle: a handle sweeps at most every 10 s.
#[tokio::test]
async fn reclaim_sweeps_start_logs_no_window_counts() {
    use durq_core::{FlowControl, QueueLimits, Rate};
    run(|mut env| async move {
        let limits = QueueLimits::new()
            .max_starts(Rate::new(100, secs(1)))
            .max_starts_per_key(Rate::new(10, secs(1)))
            .fair_shares(true);
        env.backend
            .set_limits("q", limits)
            .await
            .expect("set_limits");
        let t0 = at(secs(0));
        env.enqueue(
            vec![
                NewJob::new("q").concurrency_key("a"),
                NewJob::new("q").concurrency_key("b"),
            ],
            t0,
        )
        .await;
        assert_eq!(env.claim(plain_claim(10, secs(60)), t0).await.len(), 2);
        let t1 = at(Duration::from_millis(900));
        env.enqueue(vec![NewJob::new("q").concurrency_key("c")], t1)
            .await;
        assert_eq!(env.claim(plain_claim(10, secs(60)), t1).await.len(), 1);
        let fields = |flow: &BTreeMap<String, String>| -> BTreeSet<String> {
            flow.keys().cloned().collect()
        };
        let (a, b, c) = (hex("a"), hex("b"), hex("c"));
        let before = fields(&env.hash("flow").await);
        for field in [
            "s q".to_owned(),
            format!("k q {a}"),
            format!("k q {b}"),
            format!("k q {c}"),
        ] {
            assert!(before.contains(&field), "{field} in {before:?}");
        }
        let turns = before.iter().filter(|f| f.starts_with("t q ")).count();
        assert!(turns > 0, "a fair turn is kept: {before:?}");

        // At t0 + 1.5 s: a's and b's starts (t0) have left their windows, c's and the
        // queue's newest (t0 + 0.9 s) have not.
        let sweeper = |namespace: String| async move {
            let settings = StoreSettings::default().namespace(namespace);
            RedisBackend::connect(&url(), settings)
                .await
                .expect("connect")
        };
        let first = sweeper(env.namespace.clone()).await;
        first
            .reclaim(10, at(Duration::from_millis(1_500)))
            .await
            .expect("reclaim");
        let after = fields(&env.hash("flow").await);
        assert!(!after.contains(&format!("k q {a}")), "{after:?}");
        assert!(!after.contains(&format!("k q {b}")), "{after:?}");
        assert!(after.contains(&format!("k q {c}")), "{after:?}");
        assert!(after.contains("s q"), "{after:?}");
        assert_eq!(
            after.iter().filter(|f| f.starts_with("t q ")).count(),
            turns
        );

        // The rates removed: the queue's logs go whatever their age.
        env.backend
            .set_limits("q", QueueLimits::new().fair_shares(true))
            .await
            .expect("set_limits");
        let second = sweeper(env.namespace.clone()).await;
        second
            .reclaim(10, at(Duration::from_millis(1_600)))
            .await
            .expect("reclaim");
        let last = fields(&env.hash("flow").await);
        assert!(last.iter().all(|f| f.starts_with("t q ")), "{last:?}");
    })
    .await;
}

/// `set_limits` of one queue goes past another queue's unreadable limits: the rate it
/// takes away forgets its own starts (CONTRACT K4), the other queue's log stays, as
/// nothing can be judged by limits that cannot be read, and the call answers `Ok`. It
/// used to answer `Corrupt` after its own write.
#[tokio::test]
async fn set_limits_goes_past_another_queues_unreadable_limits() {
    use durq_core::{FlowControl, QueueLimits, Rate};
    run(|mut env| async move {
        let rated = QueueLimits::new().max_starts(Rate::new(100, secs(60)));
        for queue in ["q", "other"] {
            env.backend
                .set_limits(queue, rated)
                .await
                .expect("set_limits");
        }
        let t0 = at(secs(0));
        env.enqueue(vec![NewJob::new("q"), NewJob::new("other")], t0)
            .await;
        let both = ClaimRequest::new(["q", "other"], "w", secs(60)).limit(10);
        assert_eq!(env.claim(both, t0).await.len(), 2);
        let flow = env.hash("flow").await;
        assert!(
            flow.contains_key("s q") && flow.contains_key("s other"),
            "{flow:?}"
        );
        let limits = env.key("limits");
        let _: () = env
            .conn
            .hset(&limits, "other", "unreadable")
            .await
            .expect("HSET");
        env.backend
            .set_limits("q", QueueLimits::new().max_running(5))
            .await
            .expect("set_limits past another queue's unreadable limits");
        let flow = env.hash("flow").await;
        assert!(
            !flow.contains_key("s q"),
            "q's rate went, and its starts: {flow:?}"
        );
        assert!(
            flow.contains_key("s other"),
            "the unreadable queue's log stays: {flow:?}"
        );
        assert_eq!(
            env.hash("limits").await.get("q").map(String::as_str),
            Some("5 - - - - - 0"),
            "q's new limits are written"
        );
        let _: () = env.conn.hdel(&limits, "other").await.expect("HDEL");
    })
    .await;
}
