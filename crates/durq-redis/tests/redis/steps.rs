//! Durable steps (CONTRACT D1–D4) on Redis beyond the conformance suite: where they are
//! kept (one hash per job, in the job's slot, on plain and partitioned namespaces),
//! that purge deletes them with their job, that a reopen is one compare-and-set of
//! the generation however many handles race for it, and that the scripts write nothing
//! when what they read is unreadable.

use super::*;
use durq_core::{LeaseToken, StepLog};

/// A job of queue `q` claimed by `store` (the only job of the queue that is ready).
async fn running(store: &Store) -> durq_core::ClaimedJob {
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    claim(store, id).await
}

/// The one ready job of queue `q`, which must be `id`, claimed by worker `w`.
async fn claim(store: &Store, id: JobId) -> durq_core::ClaimedJob {
    let claimed = store
        .claim_one(&["q"], "w", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("the job is ready");
    assert_eq!(claimed.id(), id, "the ready job of q");
    claimed
}

/// Saves `names` as steps of the claimed job, each step's output its name.
async fn save_all(store: &Store, claimed: &durq_core::ClaimedJob, names: &[&str]) {
    for name in names {
        store
            .save_step(
                claimed.id(),
                claimed.token(),
                name,
                Bytes::from(name.to_string()),
            )
            .await
            .expect("save_step");
    }
}

/// The names of a log's steps, in its order.
fn names(log: &StepLog) -> Vec<&str> {
    log.steps.iter().map(|step| step.name.as_str()).collect()
}

/// The steps hash of job `id`, field by field, sorted, as the server holds it.
async fn raw_steps(env: &mut Env, id: JobId) -> Vec<(String, Vec<u8>)> {
    let key = durq_redis::steps_key_in(&env.settings.namespace, 1, id);
    let mut fields: Vec<(String, Vec<u8>)> = env.admin.hgetall(&key).await.expect("HGETALL");
    fields.sort();
    fields
}

/// The text between a key's first `{` and the next `}`: what Redis Cluster hashes.
fn hash_tag(key: &str) -> &str {
    let open = key.find('{').expect("a hash tag") + 1;
    let close = open + key[open..].find('}').expect("a closed hash tag");
    &key[open..close]
}

/// The layout of D1: one hash per job (`…:steps:ID`, the job's hash tag), two fields
/// per step and the counter of places; the first save of a name stands; the lease
/// token fences every save. The job's hash gets no field until a reopen writes `gen`,
/// which `get` does not read.
#[tokio::test]
async fn steps_are_one_hash_beside_the_job_fenced_by_its_lease() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = running(&store).await;
    let id = claimed.id();
    let saved_at = env.clock.now().as_millis();
    save_all(&store, &claimed, &["a", "b"]).await;
    // A second save of a name changes nothing and succeeds.
    store
        .save_step(id, claimed.token(), "a", Bytes::from_static(b"again"))
        .await
        .expect("a second save of a name");
    let key = durq_redis::steps_key_in(&env.settings.namespace, 1, id);
    assert_eq!(
        key,
        format!("jobs:{{{}}}:steps:{id}", env.settings.namespace)
    );
    assert_eq!(
        hash_tag(&key),
        hash_tag(&durq_redis::job_key(&env.settings.namespace, id))
    );
    let at = |place: u32| format!("{place} {saved_at}").into_bytes();
    assert_eq!(
        raw_steps(&mut env, id).await,
        [
            ("n".to_owned(), b"2".to_vec()),
            ("o:a".to_owned(), b"a".to_vec()),
            ("o:b".to_owned(), b"b".to_vec()),
            ("t:a".to_owned(), at(1)),
            ("t:b".to_owned(), at(2)),
        ]
    );
    assert!(!hash_fields(&mut env, id).await.contains(&"gen".to_owned()));

    // Fenced by the lease (L2): a token that does not hold it, a job not running, an
    // unknown job; none writes.
    let stale = LeaseToken::new(claimed.token().get() + 1);
    let err = store
        .save_step(id, stale, "c", Bytes::new())
        .await
        .expect_err("another token");
    assert!(err.is_lease_lost(), "{err}");
    let unknown = JobId::mint(env.clock.now());
    let err = store
        .save_step(unknown, claimed.token(), "c", Bytes::new())
        .await
        .expect_err("an unknown job");
    assert!(
        matches!(err, Error::NotFound { id } if id == unknown),
        "{err}"
    );
    let err = store.steps(unknown).await.expect_err("an unknown job");
    assert!(
        matches!(err, Error::NotFound { id } if id == unknown),
        "{err}"
    );
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete");
    let err = store
        .save_step(id, claimed.token(), "c", Bytes::new())
        .await
        .expect_err("a job that ended");
    assert!(err.is_lease_lost(), "{err}");
    assert_eq!(
        raw_steps(&mut env, id).await.len(),
        5,
        "nothing was written"
    );

    // A reopen writes the generation into the job's hash, which every read leaves out.
    store.retry_from(id, "b", 0).await.expect("retry_from");
    assert!(hash_fields(&mut env, id).await.contains(&"gen".to_owned()));
    assert_eq!(store.get(id).await.expect("get").state, JobState::Queued);
    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]));
    // The next run saves under its own token; places go on from the counter, so they
    // never repeat across generations.
    let again = claim(&store, id).await;
    let err = store
        .save_step(id, claimed.token(), "b", Bytes::new())
        .await
        .expect_err("the run before the reopen");
    assert!(err.is_lease_lost(), "{err}");
    save_all(&store, &again, &["b"]).await;
    let raw = raw_steps(&mut env, id).await;
    assert!(raw.contains(&("n".to_owned(), b"3".to_vec())), "{raw:?}");
    assert!(raw.contains(&("t:b".to_owned(), at(3))), "{raw:?}");
    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a", "b"]));
}

/// D3 keeps the attempt that succeeded: its lease fields, which held it, are cleared by
/// the return to queued, so the reopen writes it as a record (outcome `s`) in its
/// token's slot, and `attempts` reads the same history before and after. A lease
/// field that cannot be read refuses the reopen, writing nothing.
#[tokio::test]
async fn a_reopen_keeps_the_attempt_that_succeeded_as_a_record() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = running(&store).await;
    let id = claimed.id();
    let job_key = durq_redis::job_key(&env.settings.namespace, id);
    save_all(&store, &claimed, &["a"]).await;
    store
        .fail(id, claimed.token(), "boom", Retry::At(env.clock.now()))
        .await
        .expect("fail");
    let claimed = store
        .claim_one(&["q"], "worker 2", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("the job again");
    env.clock.advance(Duration::from_millis(7));
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete");
    let history = store.attempts(id).await.expect("attempts");
    assert_eq!(history.len(), 2);
    let slot = format!("a{}", claimed.token().get() % 32);
    assert!(!hash_fields(&mut env, id).await.contains(&slot));

    // An unreadable start refuses the reopen; nothing is written.
    let started: String = env.admin.hget(&job_key, "started").await.expect("HGET");
    let _: () = env
        .admin
        .hset(&job_key, "started", "soon")
        .await
        .expect("HSET");
    let err = store.retry_from(id, "a", 0).await.expect_err("unreadable");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(store.steps(id).await.expect("steps").steps.len(), 1);
    assert!(!hash_fields(&mut env, id).await.contains(&slot));
    let _: () = env
        .admin
        .hset(&job_key, "started", started)
        .await
        .expect("HSET");

    store.retry_from(id, "a", 0).await.expect("retry_from");
    assert_eq!(store.attempts(id).await.expect("attempts"), history);
    let record: String = env.admin.hget(&job_key, &slot).await.expect("HGET");
    assert!(record.contains(" s 8 worker 2"), "{record:?}");
}

/// D4 on Redis: sixteen reopens of one generation, each on a connection of its own and
/// sent together; every answer is recorded. Exactly one wins; the job is queued once,
/// its generation one more and its steps cut once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_sixteen_concurrent_reopens_exactly_one_wins() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = running(&store).await;
    let id = claimed.id();
    save_all(&store, &claimed, &["a", "b", "c"]).await;
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete");
    let mut handles = Vec::new();
    for _ in 0..16 {
        handles.push(env.store().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(handles.len()));
    let tasks: Vec<_> = handles
        .into_iter()
        .map(|handle| {
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                handle.retry_from(id, "b", 0).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("join"));
    }
    let won = answers.iter().filter(|answer| answer.is_ok()).count();
    assert_eq!(won, 1, "{answers:?}");
    for answer in &answers {
        match answer {
            Ok(()) => {}
            Err(Error::StaleGeneration {
                expected: 0,
                current: 1,
                ..
            }) => {}
            Err(Error::InvalidState {
                state: JobState::Queued,
                operation: "retry_from",
                ..
            }) => {}
            Err(other) => panic!("a losing reopen answered {other}: {answers:?}"),
        }
    }
    let log = store.steps(id).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]));
    // Queued once: one ready entry, counted once, claimed once.
    let ready: Vec<String> = env
        .admin
        .zrange(env.key("ready"), 0, -1)
        .await
        .expect("ZRANGE");
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert!(ready[0].ends_with(&id.to_string()));
    let stats = store.stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.succeeded), (1, 0), "{stats:?}");
    let claims = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(10))
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1);
    assert_eq!(
        claims[0].job.attempts, 1,
        "queued as retry queues it: attempts 0"
    );
}

/// A5 and C7 on Redis: purge deletes a job's steps hash with its record, and also when
/// the record went first (deleted behind the store's back); the steps of a job that
/// was reopened, which the finished log still names, stay with the live job.
#[tokio::test]
async fn purge_deletes_the_steps_with_the_job() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let claimed = running(&store).await;
        save_all(&store, &claimed, &["a", "b"]).await;
        store
            .complete(claimed.id(), claimed.token(), None)
            .await
            .expect("complete");
        ids.push(claimed.id());
    }
    let (purged, vanished, reopened) = (ids[0], ids[1], ids[2]);
    let namespace = env.settings.namespace.clone();
    let _: () = env
        .admin
        .del(durq_redis::job_key(&namespace, vanished))
        .await
        .expect("DEL");
    store
        .retry_from(reopened, "b", 0)
        .await
        .expect("retry_from");
    for id in [purged, vanished, reopened] {
        let exists: bool = env
            .admin
            .exists(durq_redis::steps_key_in(&namespace, 1, id))
            .await
            .expect("EXISTS");
        assert!(exists, "{id} saved steps");
    }

    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge(100).await.expect("purge"), 2);
    for (id, kept) in [(purged, false), (vanished, false), (reopened, true)] {
        let exists: bool = env
            .admin
            .exists(durq_redis::steps_key_in(&namespace, 1, id))
            .await
            .expect("EXISTS");
        assert_eq!(exists, kept, "the steps of {id}");
    }
    let log = store.steps(reopened).await.expect("steps");
    assert_eq!((log.generation, names(&log)), (1, vec!["a"]));

    // The reopened job ends again and goes, steps and all: nothing of the jobs is left.
    let again = claim(&store, reopened).await;
    store
        .complete(reopened, again.token(), None)
        .await
        .expect("complete");
    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge(100).await.expect("purge"), 1);
    assert_eq!(env.namespace_keys().await, Vec::<String>::new());
}

/// What the scripts read is checked before their first write: a steps counter, a
/// generation or a `meta` field that cannot be read makes the call answer `Corrupt`
/// and write nothing, and a save past `MAX_STEPS` writes nothing either.
#[tokio::test]
async fn unreadable_step_state_is_reported_and_nothing_written() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let claimed = running(&store).await;
    let id = claimed.id();
    let job_key = durq_redis::job_key(&env.settings.namespace, id);
    let steps_key = durq_redis::steps_key_in(&env.settings.namespace, 1, id);
    save_all(&store, &claimed, &["a"]).await;

    // The bound: MAX_STEPS steps in one generation, and not one more.
    let max = durq_core::steps::MAX_STEPS;
    for i in 1..max {
        store
            .save_step(id, claimed.token(), &format!("s{i}"), Bytes::new())
            .await
            .expect("save_step");
    }
    let err = store
        .save_step(id, claimed.token(), "past", Bytes::new())
        .await
        .expect_err("one step past the bound");
    assert_eq!(err.invalid_field(), Some("step"), "{err}");
    let fields: u64 = env.admin.hlen(&steps_key).await.expect("HLEN");
    assert_eq!(fields, 2 * max as u64 + 1);
    // A name saved before is still answered Ok: it adds nothing.
    store
        .save_step(id, claimed.token(), "a", Bytes::new())
        .await
        .expect("a name saved before");

    let _: () = env.admin.hset(&steps_key, "n", "x").await.expect("HSET");
    let err = store
        .save_step(id, claimed.token(), "s-new", Bytes::new())
        .await
        .expect_err("an unreadable counter");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let _: () = env.admin.del(&steps_key).await.expect("DEL");
    save_all(&store, &claimed, &["a", "b"]).await;
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete");
    let before = raw_steps(&mut env, id).await;

    // A `meta` retry cannot read: the reopen refuses before its first write.
    let meta: String = env.admin.hget(&job_key, "meta").await.expect("HGET");
    let _: () = env
        .admin
        .hset(&job_key, "meta", "not meta")
        .await
        .expect("HSET");
    let err = store
        .retry_from(id, "b", 0)
        .await
        .expect_err("unreadable meta");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(raw_steps(&mut env, id).await, before);
    assert!(!hash_fields(&mut env, id).await.contains(&"gen".to_owned()));
    let _: () = env.admin.hset(&job_key, "meta", meta).await.expect("HSET");

    // A generation that is not one: `steps` and the reopen answer Corrupt.
    let _: () = env.admin.hset(&job_key, "gen", "01").await.expect("HSET");
    let err = store.steps(id).await.expect_err("unreadable generation");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let err = store
        .retry_from(id, "b", 1)
        .await
        .expect_err("unreadable generation");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(raw_steps(&mut env, id).await, before);
    assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);
    let _: () = env.admin.hdel(&job_key, "gen").await.expect("HDEL");

    // A step whose place cannot be read: reported by `steps`, and by a reopen that
    // must compare places.
    let _: () = env
        .admin
        .hset(&steps_key, "t:b", "later")
        .await
        .expect("HSET");
    let err = store.steps(id).await.expect_err("unreadable place");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let err = store
        .retry_from(id, "a", 0)
        .await
        .expect_err("unreadable place");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);

    // The checks of D3 come first, in their order, whatever else is unreadable.
    let err = store.retry_from(id, "a", 5).await.expect_err("stale");
    assert!(
        matches!(
            err,
            Error::StaleGeneration {
                expected: 5,
                current: 0,
                ..
            }
        ),
        "{err}"
    );
    let err = store.retry_from(id, "zz", 0).await.expect_err("not saved");
    assert_eq!(err.invalid_field(), Some("step"), "{err}");
}

/// P1 for steps: on a partitioned namespace a job's steps hash carries its partition's
/// hash tag, so it shares the job's slot, and every call (save, read, reopen, purge)
/// finds it there.
#[tokio::test]
async fn a_jobs_steps_live_in_its_partition() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    const PARTITIONS: usize = 12;
    let store = TestStore::new(
        RedisConfig::new(url())
            .partitions(PARTITIONS)
            .open(env.settings.clone())
            .await
            .expect("open partitioned"),
    );
    let namespace = env.settings.namespace.clone();
    // One at a time, so they go round the partitions (a batch is placed whole in one).
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(store.enqueue(NewJob::new("q")).await.expect("enqueue").id);
    }
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(24))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), ids.len());
    for job in &claimed {
        save_all(&store, job, &["a", "b"]).await;
    }
    // Every steps key the server holds, found by SCAN rather than by the crate's naming.
    let pattern = format!("jobs:{{{namespace}#*}}:steps:*");
    let mut cursor: u64 = 0;
    let mut found = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(10_000)
            .query_async(&mut env.admin)
            .await
            .expect("SCAN");
        found.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!(found.len(), claimed.len(), "{found:?}");
    let mut partitions_used = HashSet::new();
    for job in &claimed {
        let id = job.id();
        let key = found
            .iter()
            .find(|key| key.ends_with(&format!(":steps:{id}")))
            .unwrap_or_else(|| panic!("no steps key for {id}: {found:?}"));
        let job_key = durq_redis::job_key_in(&namespace, PARTITIONS, id);
        assert_eq!(hash_tag(key), hash_tag(&job_key), "{key} beside {job_key}");
        assert_eq!(*key, durq_redis::steps_key_in(&namespace, PARTITIONS, id));
        partitions_used.insert(hash_tag(&job_key).to_owned());
        let log = store.steps(id).await.expect("steps");
        assert_eq!(names(&log), ["a", "b"]);
        store
            .complete(id, job.token(), None)
            .await
            .expect("complete");
    }
    assert!(partitions_used.len() > 1, "the jobs were spread");
    // A reopen in the job's partition queues it there.
    let first = claimed[0].id();
    store.retry_from(first, "b", 0).await.expect("retry_from");
    let again = claim(&store, first).await;
    store
        .complete(first, again.token(), None)
        .await
        .expect("complete");
    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge(100).await.expect("purge"), claimed.len() as u64);
    let left: Vec<String> = {
        let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(0)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(100_000)
            .query_async(&mut env.admin)
            .await
            .expect("SCAN");
        keys
    };
    assert!(left.is_empty(), "purge left steps behind: {left:?}");
}

/// On a cluster (`JOBS_REDIS_CLUSTER_URLS`): the steps hash and the job's hash are in
/// one slot by the cluster's own reckoning (`CLUSTER KEYSLOT`), on a plain and on a
/// partitioned namespace, and the scripts that name both run there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_a_jobs_steps_in_its_slot() {
    let Ok(urls) = std::env::var("JOBS_REDIS_CLUSTER_URLS") else {
        eprintln!("cluster test skipped: JOBS_REDIS_CLUSTER_URLS is not set");
        return;
    };
    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
    let node = redis::Client::open(urls[0].as_str()).expect("url");
    let conn = node
        .get_multiplexed_async_connection()
        .await
        .expect("a node");
    for partitions in [1, 12] {
        let namespace = durq_conformance::unique_namespace("clsteps");
        let _cleanup = Cleanup::new(urls.clone(), &namespace);
        let store = Store::new(
            RedisConfig::cluster(urls.iter().cloned())
                .partitions(partitions)
                .open(StoreSettings::default().namespace(namespace.clone()))
                .await
                .expect("connect cluster"),
        );
        let claimed = running(&store).await;
        let id = claimed.id();
        save_all(&store, &claimed, &["a", "b"]).await;
        store
            .complete(id, claimed.token(), None)
            .await
            .expect("complete");
        store.retry_from(id, "b", 0).await.expect("retry_from");
        let log = store.steps(id).await.expect("steps");
        assert_eq!((log.generation, names(&log)), (1, vec!["a"]));
        let slot = |key: String| {
            let mut conn = conn.clone();
            async move {
                let slot: i64 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("KEYSLOT");
                slot
            }
        };
        assert_eq!(
            slot(durq_redis::steps_key_in(&namespace, partitions, id)).await,
            slot(durq_redis::job_key_in(&namespace, partitions, id)).await,
            "{partitions} partitions"
        );
    }
}
