use super::*;

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
