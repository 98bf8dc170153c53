use super::*;

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
    let before_recorded: bool = env.admin.exists(env.key("layout")).await.expect("EXISTS");

    let deleted = store.redis.drop_namespace().await.expect("drop_namespace");

    // Its jobs' keys, and its layout record when an open recorded it.
    let recorded = u64::from(before_recorded);
    assert_eq!(
        deleted,
        u64::try_from(before).expect("key count") + recorded
    );
    let record: bool = env.admin.exists(env.key("layout")).await.expect("EXISTS");
    assert!(!record, "the layout record went with the namespace");
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
    for name in ["ready", "sched", "leases", "list", "children"] {
        assert_eq!(env.zcard(name).await, 0, "{name} still has entries");
    }
    assert_eq!(
        env.llen("finished").await,
        0,
        "finished log still has entries"
    );
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
