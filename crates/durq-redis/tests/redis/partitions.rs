//! Partitioned namespaces (CONTRACT §8) beyond the conformance suite's run on them: the
//! layout record that fixes a namespace's partition count, where jobs land, and the
//! batches and keyed children whose jobs live in more than one partition.

use super::*;

/// A store of the test's namespace spread over `partitions`.
async fn partitioned(env: &Env, partitions: usize) -> durq_core::Result<TestStore> {
    open_partitioned(env, partitions).await.map(TestStore::new)
}

async fn open_partitioned(env: &Env, partitions: usize) -> durq_core::Result<RedisBackend> {
    RedisConfig::new(url())
        .partitions(partitions)
        .open(env.settings.clone())
        .await
}

/// The key `name` of partition `p` of 12 of the test's namespace.
fn partition_key(env: &Env, p: usize, name: &str) -> String {
    let tag = durq_redis::partition_tag(&env.settings.namespace, p, 12);
    format!("jobs:{{{tag}}}:{name}")
}

#[tokio::test]
async fn a_namespace_keeps_the_partition_count_it_was_created_with() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let first = partitioned(&env, 12).await.expect("created with 12");
    assert_eq!(first.redis.partition_count(), 12);
    let record: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(env.key("layout"))
        .arg("partitions")
        .arg("version")
        .query_async(&mut env.admin)
        .await
        .expect("HMGET");
    assert_eq!(record, [Some("12".to_owned()), Some("2".to_owned())]);
    for other in [1, 3] {
        let err = open_partitioned(&env, other)
            .await
            .expect_err("another count");
        assert_eq!(err.invalid_field(), Some("partitions"), "{err}");
        assert!(err.to_string().contains("12 partition"), "{err}");
    }
    let again = partitioned(&env, 12).await.expect("the same count again");
    // The URL parameter says the same as the setting.
    let by_url = RedisBackend::connect(
        &format!("{}/?partitions=12", url().trim_end_matches('/')),
        env.settings.clone(),
    )
    .await
    .expect("partitions from the URL");
    assert_eq!(by_url.partition_count(), 12);
    drop((first, again, by_url));

    // A later layout's record is refused by name, and nothing is written.
    let _: () = env
        .admin
        .hset(env.key("layout"), "version", "3")
        .await
        .expect("HSET");
    let err = open_partitioned(&env, 12)
        .await
        .expect_err("a later layout");
    assert_eq!(err.invalid_field(), Some("namespace"), "{err}");
    assert!(err.to_string().contains("version \"3\""), "{err}");
    assert!(env.namespace_keys().await.is_empty());
}

#[tokio::test]
async fn an_unpartitioned_namespace_is_never_opened_partitioned() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let record = |mut admin: redis::aio::MultiplexedConnection, key: String| async move {
        let found: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(key)
            .arg("partitions")
            .arg("version")
            .query_async(&mut admin)
            .await
            .expect("HMGET");
        found
    };
    let plain = env.store().await;
    // Opening a new namespace writes nothing, not even its layout record.
    let layout: bool = env.admin.exists(env.key("layout")).await.expect("EXISTS");
    assert!(!layout && env.namespace_keys().await.is_empty());
    plain.enqueue(NewJob::new("q")).await.expect("enqueue");
    // Its jobs tell it is unpartitioned, record or not.
    let err = open_partitioned(&env, 4)
        .await
        .expect_err("holds unpartitioned jobs");
    assert_eq!(err.invalid_field(), Some("partitions"), "{err}");
    assert!(err.to_string().contains("unpartitioned"), "{err}");
    // The next unpartitioned open finds jobs and records the namespace.
    drop(env.store().await);
    assert_eq!(
        record(env.admin.clone(), env.key("layout")).await,
        [Some("1".to_owned()), Some("2".to_owned())]
    );
    let err = open_partitioned(&env, 4)
        .await
        .expect_err("recorded with one partition");
    assert_eq!(err.invalid_field(), Some("partitions"), "{err}");
    assert!(err.to_string().contains("1 partition"), "{err}");
    let keys = env.namespace_keys().await;
    assert!(keys.iter().all(|key| !key.contains('#')), "{keys:?}");
}

#[tokio::test]
async fn jobs_spread_over_every_partition_and_each_lives_where_its_id_says() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = partitioned(&env, 12).await.expect("open");
    let Some(partitioning) = store.capabilities().partitioning else {
        panic!("a partitioned store declares its partitioning");
    };
    let mut ids = Vec::new();
    for _ in 0..240 {
        ids.push(store.enqueue(NewJob::new("q")).await.expect("enqueue").id);
    }
    // Batches of unconstrained jobs: each one partition, taken in turn.
    for _ in 0..12 {
        let batch = enqueue_all(&store, (0..10).map(|_| NewJob::new("q")).collect()).await;
        let homes: HashSet<usize> = batch.iter().map(|id| partitioning.of(*id)).collect();
        assert_eq!(
            homes.len(),
            1,
            "a batch of unconstrained jobs is one partition"
        );
        ids.extend(batch);
    }
    let mut per_partition = [0u64; 12];
    for id in &ids {
        let home = partitioning.of(*id);
        per_partition[home] += 1;
        let key = durq_redis::job_key_in(&env.settings.namespace, 12, *id);
        assert_eq!(key, format!("{}{id}", partition_key(&env, home, "job:")));
        let exists: bool = env.admin.exists(&key).await.expect("EXISTS");
        assert!(exists, "job {id} lives in partition {home}");
    }
    for (p, expected) in per_partition.iter().enumerate() {
        let ready: u64 = env
            .admin
            .zcard(partition_key(&env, p, "ready"))
            .await
            .expect("ZCARD");
        assert_eq!(ready, *expected, "partition {p}'s ready index");
        // Single enqueues are spread in turn: 20 each, plus one batch of 10 each.
        assert_eq!(*expected, 30, "partition {p}: {per_partition:?}");
    }
    // One claim visits every partition until it holds its limit.
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(360))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 360);
    assert_eq!(store.stats("q").await.expect("stats").running, 360);
}

#[tokio::test]
async fn a_keyed_child_lives_with_its_key_and_its_parent_is_still_checked() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = partitioned(&env, 12).await.expect("open");
    let Some(partitioning) = store.capabilities().partitioning else {
        panic!("a partitioned store declares its partitioning");
    };
    let parent = store
        .enqueue(NewJob::new("parents"))
        .await
        .expect("parent")
        .id;
    // Keys until two children land away from their parent.
    let mut children = Vec::new();
    for n in 0.. {
        let child = store
            .enqueue(
                NewJob::new("children")
                    .parent(parent)
                    .idempotency_key(format!("child-{n}")),
            )
            .await
            .expect("child");
        assert!(child.created);
        let away = partitioning.of(child.id) != partitioning.of(parent);
        children.push(child.id);
        if away && children.len() >= 2 {
            break;
        }
        assert!(n < 200, "no key placed a child away from its parent");
    }
    // A plain child lives with its parent.
    let plain = store
        .enqueue(NewJob::new("children").parent(parent))
        .await
        .expect("plain child")
        .id;
    assert_eq!(partitioning.of(plain), partitioning.of(parent));
    children.push(plain);
    let listed: Vec<JobId> = store
        .children(parent)
        .await
        .expect("children")
        .iter()
        .map(|job| job.id)
        .collect();
    assert_eq!(listed, children, "E8: every child, oldest first");

    // The same key again deduplicates, with or without the parent (E2).
    let again = store
        .enqueue(NewJob::new("children").idempotency_key("child-0"))
        .await
        .expect("again");
    assert_eq!((again.id, again.created), (children[0], false));

    // A keyed child of a missing parent, alone or in a batch spanning partitions, is
    // refused and writes nothing.
    let missing = JobId::mint(store.now());
    let before = store.stats("children").await.expect("stats").total();
    let err = store
        .enqueue(
            NewJob::new("children")
                .parent(missing)
                .idempotency_key("orphan"),
        )
        .await
        .expect_err("missing parent");
    assert_eq!(err.invalid_field(), Some("parent"), "{err}");
    let batch = (0..24)
        .map(|n| NewJob::new("children").idempotency_key(format!("batch-{n}")))
        .chain([NewJob::new("children").parent(missing)])
        .collect();
    let err = store
        .enqueue_batch(batch)
        .await
        .expect_err("missing parent");
    assert_eq!(err.invalid_field(), Some("parent"), "{err}");
    assert_eq!(
        store.stats("children").await.expect("stats").total(),
        before,
        "E9: nothing of a refused batch is written"
    );
    // A batch whose keys span partitions is answered in order, duplicates included.
    let batch: Vec<NewJob> = (0..24)
        .map(|n| NewJob::new("keyed").idempotency_key(format!("k{}", n % 12)))
        .collect();
    let answers = store.enqueue_batch(batch).await.expect("batch");
    for (n, answer) in answers.iter().enumerate() {
        assert_eq!(answer.created, n < 12, "job {n}");
        assert_eq!(answer.id, answers[n % 12].id, "job {n}");
    }
    let homes: HashSet<usize> = answers.iter().map(|a| partitioning.of(a.id)).collect();
    assert!(homes.len() > 1, "twelve keys in one partition of twelve");
}

#[tokio::test]
async fn pause_stats_queues_and_list_read_every_partition() {
    let Some(env) = Env::new().await else {
        return;
    };
    let store = partitioned(&env, 12).await.expect("open");
    let ids = enqueue_all(&store, (0..5).map(|_| NewJob::new("a")).collect()).await;
    let mut all = ids.clone();
    for _ in 0..31 {
        all.push(store.enqueue(NewJob::new("a")).await.expect("enqueue").id);
    }
    store.pause("a").await.expect("pause");
    assert_eq!(store.paused_queues().await.expect("paused"), ["a"]);
    let claimed = store
        .claim(ClaimRequest::new(["a"], "w", Duration::from_secs(30)).limit(100))
        .await
        .expect("claim");
    assert!(claimed.is_empty(), "Q1: no partition serves a paused queue");
    store.resume("a").await.expect("resume");
    assert!(store.paused_queues().await.expect("paused").is_empty());
    let stats = store.stats("a").await.expect("stats");
    assert_eq!(stats.ready, 36);
    let queues = store.queues().await.expect("queues");
    assert_eq!(queues.len(), 1);
    assert_eq!(queues[0].stats.ready, 36);
    // Pages of 5, newest first, across every partition, each job once.
    let mut listed = Vec::new();
    let mut query = ListQuery::new("a").limit(5);
    loop {
        let page = store.list(query.clone()).await.expect("list");
        assert!(page.jobs.len() <= 5);
        listed.extend(page.jobs.iter().map(|job| job.id));
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    all.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(listed, all, "A4: every job once, newest first");
}

#[tokio::test]
async fn a_store_pinned_to_some_partitions_claims_only_their_jobs() {
    let Some(env) = Env::new().await else {
        return;
    };
    let producer = partitioned(&env, 4).await.expect("open");
    let Some(partitioning) = producer.capabilities().partitioning else {
        panic!("a partitioned store declares its partitioning");
    };
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(
            producer
                .enqueue(NewJob::new("q"))
                .await
                .expect("enqueue")
                .id,
        );
    }
    let pinned = RedisConfig::new(url())
        .partitions(4)
        .claim_partitions([3, 1])
        .open(env.settings.clone())
        .await
        .expect("pinned");
    // A reopened store (the worker's lease keeper opens one) keeps the pin.
    let reopened = durq_core::Backend::reopen(&pinned)
        .await
        .expect("reopen")
        .expect("a Redis store reopens");
    let pinned = Store::new(pinned);
    let request = || ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(100);
    let mine: HashSet<JobId> = ids
        .iter()
        .copied()
        .filter(|id| [1, 3].contains(&partitioning.of(*id)))
        .collect();
    let first = pinned.claim(request().limit(5)).await.expect("claim");
    let now = pinned.now();
    let rest = reopened.claim(request(), now).await.expect("claim");
    let claimed: HashSet<JobId> = first.iter().chain(&rest).map(|job| job.id()).collect();
    assert_eq!(claimed, mine, "only partitions 1 and 3, all of them");
    assert!(pinned.claim(request()).await.expect("claim").is_empty());
    let others = producer.claim(request()).await.expect("claim");
    assert_eq!(
        others.len(),
        40 - mine.len(),
        "the other partitions are left"
    );

    for (pin, why) in [
        (vec![], "empty"),
        (vec![4], "beyond"),
        (vec![1, 1], "twice"),
    ] {
        let err = RedisConfig::new(url())
            .partitions(4)
            .claim_partitions(pin)
            .open(env.settings.clone())
            .await
            .expect_err(why);
        assert_eq!(
            err.invalid_field(),
            Some("claim_partitions"),
            "{why}: {err}"
        );
    }
}
