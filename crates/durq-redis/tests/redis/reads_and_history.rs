use super::*;

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
    let indexes = [env.key("leases"), env.key("running"), env.key("finished")];
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
