use super::*;

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
    assert_eq!(env.llen("finished").await, 2);
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
        "finished",
        "paused",
        "children",
        "dependents",
        "placement",
        "seq",
        "ckeys",
        "kready",
        "kleases",
        "limits",
        "events",
        "none",
        "job:*",
    ]
    .iter()
    .map(|name| format!("jobs:{{{ns}}}:{name}"))
    .collect();
    // Every open reads the layout record (docs/redis.md, "ACL key patterns").
    let read_only = vec![
        format!("jobs:{{{ns}}}:dedup:*"),
        format!("jobs:{{{ns}}}:layout"),
    ];
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
