use super::*;

/// `heartbeat_batch` answers each entry as `heartbeat` would (extended, lease lost,
/// not found) in one statement: every lease it extends was written by one
/// transaction, where one `heartbeat` per entry would write each in its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_batch_answers_each_entry_in_one_statement() {
    let Some(backend) = backend("durq-postgres-heartbeat-batch", 4).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let store = open(&backend, settings.clone());
    let jobs = (0..4).map(|_| NewJob::new("beat")).collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    let request = ClaimRequest::new(["beat"], "w", TTL).limit(4);
    let claimed = store.claim(request).await.expect("claim");
    assert_eq!(claimed.len(), 4);
    store.cancel(claimed[1].id()).await.expect("cancel");
    let stale = store.get(claimed[3].id()).await.expect("get");
    let unknown = JobId::mint(clock.now());

    clock.advance(Duration::from_secs(9));
    let ttl = Duration::from_secs(60);
    let stale_token = LeaseToken::new(claimed[3].token().get() + 1);
    let leases = vec![
        HeldLease::new(claimed[2].id(), claimed[2].token()),
        HeldLease::new(claimed[3].id(), stale_token),
        HeldLease::new(unknown, LeaseToken::new(1)),
        HeldLease::new(claimed[0].id(), claimed[0].token()),
        HeldLease::new(claimed[1].id(), claimed[1].token()),
        // The same lease twice is extended once and answered twice.
        HeldLease::new(claimed[0].id(), claimed[0].token()),
    ];
    let answers = store
        .heartbeat_batch(leases, ttl)
        .await
        .expect("heartbeat_batch");
    let expires_at = clock.now().saturating_add(ttl);
    let beat = |cancel_requested| Heartbeat {
        cancel_requested,
        expires_at,
    };
    assert_eq!(answers.len(), 6);
    assert_eq!(answers[0].as_ref().ok(), Some(&beat(false)));
    assert!(
        matches!(answers[1], Err(Error::LeaseLost { id }) if id == claimed[3].id()),
        "{:?}",
        answers[1]
    );
    assert!(
        matches!(answers[2], Err(Error::NotFound { id }) if id == unknown),
        "{:?}",
        answers[2]
    );
    assert_eq!(answers[3].as_ref().ok(), Some(&beat(false)));
    assert_eq!(
        answers[4].as_ref().ok(),
        Some(&beat(true)),
        "cancel requested"
    );
    assert_eq!(answers[5].as_ref().ok(), Some(&beat(false)));

    // The stale entry changed nothing; the others moved.
    assert_eq!(store.get(claimed[3].id()).await.expect("get"), stale);
    for job in [&claimed[0], &claimed[1], &claimed[2]] {
        let stored = store.get(job.id()).await.expect("get");
        assert_eq!(stored.lease.map(|l| l.expires_at), Some(expires_at));
        assert_eq!(stored.heartbeat_at, Some(clock.now()));
    }
    // One statement: the three extended rows carry one transaction id.
    let writers: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM jobs.jobs
         WHERE namespace = $1 AND heartbeat_at = $2",
    )
    .bind(&settings.namespace)
    .bind(clock.now().as_millis())
    .fetch_one(backend.pool())
    .await
    .expect("read xmin");
    assert_eq!(writers, 1, "the batch is one statement, one transaction");

    assert!(store
        .heartbeat_batch(Vec::new(), ttl)
        .await
        .expect("empty")
        .is_empty());
    let refused = store
        .heartbeat_batch(
            vec![HeldLease::new(claimed[0].id(), claimed[0].token())],
            Duration::ZERO,
        )
        .await;
    assert_eq!(
        refused.err().and_then(|e| e.invalid_field()),
        Some("lease_ttl")
    );
    clean_up(&backend, &settings.namespace).await;
}

/// Connections are named: `durq` unless configured, the URL's `application_name` when
/// it has one, and the configured name otherwise; the wake-up listener's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_carry_the_configured_application_name() {
    let Some(admin) = admin().await else { return };
    let name_of = |config: PostgresConfig| async move {
        let backend = PostgresPool::connect(config.max_connections(1))
            .await
            .expect("connect");
        let name: String = sqlx::query_scalar("SELECT current_setting('application_name')")
            .fetch_one(backend.pool())
            .await
            .expect("read application_name");
        (backend, name)
    };
    let (_, name) = name_of(PostgresConfig::new(&url()).expect("url")).await;
    assert_eq!(name, durq_postgres::DEFAULT_APPLICATION_NAME);

    let from_url = unique_name("jobs_url");
    let separator = if url().contains('?') { '&' } else { '?' };
    let config = PostgresConfig::new(&format!("{}{separator}application_name={from_url}", url()))
        .expect("url");
    let (_, name) = name_of(config).await;
    assert_eq!(name, from_url, "the URL's application_name is honoured");

    let configured = unique_name("jobs_cfg");
    let config = PostgresConfig::new(&url())
        .expect("url")
        .application_name(&configured);
    let (backend, name) = name_of(config).await;
    assert_eq!(name, configured);
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    store
        .wait_for_work(&["q".to_owned()], Duration::ZERO)
        .await
        .expect("start the listener");
    let listening = async {
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            )
            .bind(&configured)
            .fetch_one(&admin)
            .await
            .expect("read sessions");
            if n > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .expect("the listener carries the name too");
}

/// Random jobs and random claims (budgets, preferences, reservations, limits, several
/// queues, a paused queue, jobs not yet due) against the reference: `ClaimRequest::admits` and
/// `ClaimRequest::fit_order` over the ready jobs, cut to the limit. One claimer, so
/// the answer is exact: the SQL's candidate sets (per-queue probes, the preferred
/// localities at the edge priority) must never miss a job the reference takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fitted_claims_take_what_the_reference_takes() {
    let Some(backend) = backend("durq-postgres-fit", 2).await else {
        return;
    };
    const HOSTS: [&str; 4] = ["host-0", "host-1", "host-2", "host-3"];
    const CAPABILITIES: [&str; 2] = ["fpga", "tpu"];
    for seed in 1..=4_u64 {
        let clock = ManualClock::default();
        let store = open(&backend, settings(&clock));
        let mut rng = Lcg(seed);
        let mut known: Vec<Known> = Vec::new();
        let mut seq = 0;
        let mut paused_b = false;
        for step in 0..40 {
            for _ in 0..rng.below(8) {
                clock.advance(Duration::from_millis(rng.below(3)));
                let now = clock.now();
                let queue = if rng.chance(60) { "a" } else { "b" };
                let priority = rng.below(3) as i16;
                // Most are ready, some earlier than jobs enqueued before them, a few not
                // yet due.
                let run_at = if rng.chance(10) {
                    now.saturating_add(Duration::from_secs(3600))
                } else {
                    now.saturating_sub(Duration::from_millis(rng.below(20)))
                };
                let mut needs = Needs::new();
                if rng.chance(60) {
                    needs = needs.amount("gpu", rng.below(4));
                }
                if rng.chance(30) {
                    needs = needs.amount("mem", rng.below(3));
                }
                for key in CAPABILITIES {
                    if rng.chance(15) {
                        needs = needs.capability(key);
                    }
                }
                let locality = rng
                    .chance(70)
                    .then(|| HOSTS[rng.below(4) as usize].to_owned());
                let mut job = NewJob::new(queue)
                    .priority(priority)
                    .run_at(run_at)
                    .needs(needs.clone());
                if let Some(locality) = &locality {
                    job = job.locality(locality.clone());
                }
                let id = store.enqueue(job).await.expect("enqueue").id;
                seq += 1;
                known.push(Known {
                    id,
                    queue,
                    priority,
                    run_at,
                    seq,
                    needs,
                    locality,
                });
            }
            if rng.chance(10) {
                paused_b = !paused_b;
                if paused_b {
                    store.pause("b").await.expect("pause");
                } else {
                    store.resume("b").await.expect("resume");
                }
            }
            let queues: &[&str] = match rng.below(3) {
                0 => &["a"],
                1 => &["b"],
                _ => &["a", "b"],
            };
            let mut request = ClaimRequest::new(queues.iter().copied(), "w", TTL)
                .limit(1 + rng.below(5) as usize);
            if rng.chance(75) {
                let mut budget = Budget::new();
                if rng.chance(80) {
                    budget = budget.amount("gpu", rng.below(4));
                }
                if rng.chance(30) {
                    budget = budget.amount("mem", rng.below(3));
                }
                for key in CAPABILITIES {
                    if rng.chance(50) {
                        budget = budget.capability(key);
                    }
                }
                request = request.budget(budget);
            }
            if rng.chance(60) {
                let first = rng.below(4) as usize;
                let count = 1 + rng.below(2) as usize;
                request = request.prefer(HOSTS.iter().cycle().skip(first).take(count).copied());
            }

            if rng.chance(15) && !known.is_empty() {
                let job = &known[rng.below(known.len() as u64) as usize];
                request = request.reserved(job.id);
            }

            let now = clock.now();
            let mut expected: Vec<(durq_core::fit::FitOrder, JobId)> = known
                .iter()
                .filter(|job| {
                    request.reserved.is_none_or(|id| id == job.id)
                        && queues.contains(&job.queue)
                        && !(paused_b && job.queue == "b")
                        && job.run_at <= now
                        && request.admits(&job.needs)
                })
                .map(|job| {
                    let ready = durq_core::ReadyOrder::new(job.priority, job.run_at, job.seq);
                    (request.fit_order(ready, job.locality.as_deref()), job.id)
                })
                .collect();
            expected.sort();
            // The handle claims a reservation with a limit of one.
            expected.truncate(if request.reserved.is_some() {
                1
            } else {
                request.limit
            });
            let expected: Vec<JobId> = expected.into_iter().map(|(_, id)| id).collect();

            let what = format!("seed {seed}, step {step}: {request:?}");
            let claimed: Vec<JobId> = store
                .claim(request)
                .await
                .expect("claim")
                .iter()
                .map(|job| job.id())
                .collect();
            assert_eq!(claimed, expected, "{what}");
            known.retain(|job| !claimed.contains(&job.id));
        }
        clean_up(&backend, &store.settings().namespace).await;
    }
}

/// A job's timeout is stored and read back by every read: single and batch enqueue,
/// get, claim, list, children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_timeouts_round_trip_through_every_read() {
    let Some(backend) = backend("durq-postgres-timeout", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let parent = store.enqueue(NewJob::new("p")).await.expect("enqueue").id;
    let single = store
        .enqueue(
            NewJob::new("t")
                .parent(parent)
                .timeout(Duration::from_millis(2_500)),
        )
        .await
        .expect("enqueue")
        .id;
    let batch = store
        .enqueue_batch(vec![
            NewJob::new("t")
                .parent(parent)
                .timeout(Duration::from_secs(366 * 24 * 3600)),
            NewJob::new("t").parent(parent),
        ])
        .await
        .expect("enqueue_batch");
    let expected = [
        (single, Some(Duration::from_millis(2_500))),
        (batch[0].id, Some(Duration::from_secs(366 * 24 * 3600))),
        (batch[1].id, None),
    ];
    for (id, timeout) in expected {
        assert_eq!(store.get(id).await.expect("get").timeout, timeout, "get");
    }
    let children = store.children(parent).await.expect("children");
    let listed = store
        .list(durq_core::ListQuery::new("t"))
        .await
        .expect("list")
        .jobs;
    for (id, timeout) in expected {
        let child = children.iter().find(|j| j.id == id).expect("a child");
        assert_eq!(child.timeout, timeout, "children");
        let job = listed.iter().find(|j| j.id == id).expect("listed");
        assert_eq!(job.timeout, timeout, "list");
    }
    let request = ClaimRequest::new(["t"], "w", TTL).limit(3);
    let claimed = store.claim(request).await.expect("claim");
    assert_eq!(claimed.len(), 3);
    for (id, timeout) in expected {
        let job = claimed.iter().find(|j| j.id() == id).expect("claimed");
        assert_eq!(job.job.timeout, timeout, "claim");
    }
    // Out of range as stored by hand: corrupt, not a panic.
    sqlx::query("UPDATE jobs.jobs SET timeout_ms = 0 WHERE namespace = $1 AND id = $2::text::uuid")
        .bind(&store.settings().namespace)
        .bind(single.to_string())
        .execute(backend.pool())
        .await
        .expect("damage");
    let err = store.get(single).await.expect_err("a zero timeout");
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    clean_up(&backend, &store.settings().namespace).await;
}

/// `drop_namespace`, the conformance harness's teardown, deletes every job (queued,
/// waiting or running), every key, attempt and dependency edge of one namespace, and
/// nothing of another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_namespace_deletes_one_namespace_and_nothing_else() {
    let Some(backend) = backend("durq-postgres-drop", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let (gone, kept) = (settings(&clock), settings(&clock));
    for settings in [&gone, &kept] {
        let store = open(&backend, settings.clone());
        store
            .enqueue(NewJob::new("q").idempotency_key("k"))
            .await
            .expect("enqueue");
        store
            .enqueue_batch(vec![NewJob::new("q"), NewJob::new("r")])
            .await
            .expect("enqueue_batch");
        let request = ClaimRequest::new(["q"], "w", TTL);
        assert_eq!(store.claim(request).await.expect("claim").len(), 1);
        let released = store
            .claim(ClaimRequest::new(["r"], "w", TTL))
            .await
            .expect("claim");
        store
            .release(released[0].id(), released[0].token())
            .await
            .expect("release");
        // A job waiting for the released one: one edge.
        store
            .enqueue(NewJob::new("s").after(released[0].id()))
            .await
            .expect("enqueue a dependent");
    }
    assert_eq!(rows_of(&backend, &gone.namespace).await, (4, 1));
    assert_eq!(attempt_rows(&backend, &gone.namespace).await, 1);
    assert_eq!(edge_rows(&backend, &gone.namespace).await, 1);

    let deleted = backend.drop_namespace(&gone.namespace).await.expect("drop");
    assert_eq!(deleted, 4);
    assert_eq!(rows_of(&backend, &gone.namespace).await, (0, 0));
    assert_eq!(edge_rows(&backend, &gone.namespace).await, 0);
    assert_eq!(
        rows_of(&backend, &kept.namespace).await,
        (4, 1),
        "untouched"
    );
    assert_eq!(edge_rows(&backend, &kept.namespace).await, 1, "untouched");
    assert_eq!(attempt_rows(&backend, &gone.namespace).await, 0);
    assert_eq!(
        attempt_rows(&backend, &kept.namespace).await,
        1,
        "untouched"
    );
    let again = backend
        .drop_namespace(&gone.namespace)
        .await
        .expect("again");
    assert_eq!(again, 0, "dropping an empty namespace deletes nothing");
    clean_up(&backend, &kept.namespace).await;
    assert_eq!(rows_of(&backend, &kept.namespace).await, (0, 0));
    assert_eq!(attempt_rows(&backend, &kept.namespace).await, 0);
    assert_eq!(edge_rows(&backend, &kept.namespace).await, 0);
}

/// Purge gets only the retention cutoff, not now: it deletes a purged job's key with
/// the job, keeps a key that still deduplicates, and deletes a key left behind (its
/// job vanished) once it is past its window counted from the cutoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_the_keys_it_no_longer_needs() {
    let Some(backend) = backend("durq-postgres-purge-keys", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock)
        .retention(Duration::from_secs(10))
        .dedup_window(Duration::from_secs(100));
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let keys = || async {
        let keys: Vec<String> = sqlx::query_scalar(
            "SELECT convert_from(key, 'UTF8') FROM jobs.dedup WHERE namespace = $1 ORDER BY 1",
        )
        .bind(&namespace)
        .fetch_all(backend.pool())
        .await
        .expect("read keys");
        keys
    };

    let done = store
        .enqueue(NewJob::new("done").idempotency_key("done"))
        .await
        .expect("enqueue")
        .id;
    let claimed = store
        .claim_one(&["done"], "w", TTL)
        .await
        .expect("claim")
        .expect("the job");
    store
        .complete(done, claimed.token(), None)
        .await
        .expect("complete");
    let vanished = store
        .enqueue(NewJob::new("vanish").idempotency_key("vanished"))
        .await
        .expect("enqueue")
        .id;
    backend.vanish(&namespace, vanished).await.expect("vanish");
    let queued = store
        .enqueue(NewJob::new("wait").idempotency_key("queued"))
        .await
        .expect("enqueue")
        .id;

    clock.advance(Duration::from_secs(11));
    assert_eq!(
        store.purge(100).await.expect("purge"),
        1,
        "the finished job"
    );
    assert!(store.get(done).await.is_err_and(|e| e.is_not_found()));
    assert_eq!(
        keys().await,
        ["queued", "vanished"],
        "the purged job's key went"
    );
    let again = store
        .enqueue(NewJob::new("wait").idempotency_key("queued"))
        .await
        .expect("enqueue");
    assert_eq!((again.id, again.created), (queued, false), "still in force");

    // Now past the window counted from the cutoff (now - retention - window).
    clock.advance(Duration::from_secs(100));
    assert_eq!(
        store.purge(100).await.expect("purge"),
        0,
        "no job is finished"
    );
    assert!(keys().await.is_empty(), "both keys are past their window");
    assert_eq!(
        store.get(queued).await.expect("get").state,
        JobState::Queued
    );
    clean_up(&backend, &namespace).await;
}

/// Without the `tls` feature, options that require TLS are refused when connecting,
/// with the field named, instead of failing every connection as if the network did.
#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn tls_required_without_the_tls_feature_is_refused() {
    for mode in ["require", "verify-ca", "verify-full"] {
        let separator = if url().contains('?') { '&' } else { '?' };
        let config =
            PostgresConfig::new(&format!("{}{separator}sslmode={mode}", url())).expect("url");
        let err = PostgresPool::connect(config)
            .await
            .expect_err("no TLS in this build");
        assert_eq!(err.invalid_field(), Some("sslmode"), "{mode}: {err:?}");
    }
}

/// `reopen` opens a pool of the reopening runtime's own: while the runtime the store's
/// connections were opened on runs nothing (as one whose threads handlers block), the
/// reopened store still answers, where one sharing the first pool would be handed a
/// connection that runtime must drive.
#[test]
fn a_reopened_store_is_driven_by_the_runtime_that_reopened_it() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let (opening, reopening) = (runtime(), runtime());
    let Some(backend) = opening.block_on(backend("jobs_reopen", 1)) else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let id = opening
        .block_on(store.enqueue(NewJob::new("q")))
        .expect("enqueue")
        .id;
    // From here on `opening` is never driven again; its one connection sits idle in
    // the first pool.
    let reopened = reopening
        .block_on(store.reopen())
        .expect("reopen")
        .expect("a PostgreSQL store reopens");
    let job = reopening
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), reopened.get(id)).await })
        .expect("the reopened store answers without the first runtime")
        .expect("get");
    assert_eq!(job.queue, "q");
    drop(reopened);
    opening.block_on(clean_up(&backend, &namespace));
}

/// A store dropped where no runtime runs lets go of the connection it keeps between
/// statements: dropped as it is, a pooled connection has sqlx spawn its return to the
/// pool, which panics without a runtime; the store closes it instead.
#[test]
fn a_store_dropped_outside_a_runtime_lets_go_of_its_parked_connection() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Room in the pool, so the statement's connection is parked, not given back.
    let Some(backend) = runtime.block_on(backend("jobs_drop_outside", 4)) else {
        return;
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    runtime
        .block_on(store.stats("q"))
        .expect("a statement, whose connection is parked");
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "no runtime is current outside block_on"
    );
    drop(store);
    drop(backend);
}

/// A `list` filtered by tenant or tags examines at most 4,096 rows per call (CONTRACT
/// A4 lets a backend bound one call's work): a page over more rows that do not match
/// ends early with `next` set, and paging on still finds every match once. Each of the
/// three statement shapes (every job; one queue; some states across queues) is paged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_list_examines_a_bounded_number_of_rows_per_page() {
    let Some(backend) = backend("durq-postgres-list-bound", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let rare = store
        .enqueue(NewJob::new("q").tenant("rare"))
        .await
        .expect("enqueue")
        .id;
    for _ in 0..5 {
        let batch: Vec<NewJob> = (0..1000).map(|_| NewJob::new("q")).collect();
        store.enqueue_batch(batch).await.expect("enqueue batch");
    }
    for query in [
        ListQuery::all().tenant("rare"),
        ListQuery::new("q").tenant("rare"),
        ListQuery::all().state(JobState::Queued).tenant("rare"),
    ] {
        let first = store.list(query.clone().limit(10)).await.expect("list");
        assert!(first.jobs.is_empty(), "{query:?}: {:?}", first.jobs);
        assert!(
            first.next.is_some(),
            "{query:?}: the page ends at the bound"
        );
        let mut found = Vec::new();
        let mut pages = 0;
        let mut next = None;
        loop {
            let mut page_query = query.clone().limit(10);
            if let Some(cursor) = next {
                page_query = page_query.after(cursor);
            }
            let page = store.list(page_query).await.expect("list");
            pages += 1;
            found.extend(page.jobs.iter().map(|job| job.id));
            next = page.next;
            if next.is_none() {
                break;
            }
            assert!(pages < 10, "{query:?}: paging does not end");
        }
        assert_eq!(found, [rare], "{query:?}");
        assert!(pages >= 2, "{query:?}: {pages} pages");
    }
    clean_up(&backend, &namespace).await;
}

/// An admin connection and a backend migrated into the new schema `schema`
/// ([`schema_config`]), whose job table has never been analyzed; `None` when the
/// server is not there and the tests may skip.
async fn fresh_schema(schema: &str) -> Option<(PgPool, PostgresPool)> {
    let admin = admin().await?;
    let backend = PostgresPool::connect(schema_config(schema))
        .await
        .expect("migrate");
    Some((admin, backend))
}

/// `pg_class.reltuples` of `schema`'s job table: negative until its first `ANALYZE`.
async fn analyzed_rows(admin: &PgPool, schema: &str) -> f32 {
    sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = $1::regclass")
        .bind(format!("\"{schema}\".jobs"))
        .fetch_one(admin)
        .await
        .expect("read pg_class")
}

/// Waits until `schema`'s job table has been analyzed with at least `rows` rows and its
/// `namespace` and `id` statistics (the columns the hot path's plans hinge on) are
/// committed; answers the rows `ANALYZE` counted and how many of those two columns
/// have statistics, as they stand when that happened or at the deadline.
///
/// The look and the `ANALYZE` run in a task of the backend, after the claim that set
/// them off returned, and nothing announces their end: this reads the catalog until it
/// shows them, each read paced by its own round trip (no timer), for up to 20 s.
/// `ANALYZE` writes `pg_class.reltuples` in place, visible at once, but its
/// `pg_stats` rows only when its transaction commits: this waits for both.
async fn analyzed(admin: &PgPool, schema: &str, rows: f32) -> (f32, i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let columns: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stats WHERE schemaname = $1 AND tablename = 'jobs' \
             AND attname IN ('namespace', 'id')",
        )
        .bind(schema)
        .fetch_one(admin)
        .await
        .expect("read pg_stats");
        let seen = (analyzed_rows(admin, schema).await, columns);
        if (seen.0 >= rows && seen.1 == 2) || tokio::time::Instant::now() >= deadline {
            return seen;
        }
    }
}

/// The job table's statistics follow its growth (`statistics.rs` in the crate): a fresh
/// schema's table, never analyzed, grown past a few pages by a producer, is analyzed by
/// the backend whose worker claims from it, without waiting for autovacuum's nap.
/// Plans made from the statistics of an empty table read a whole namespace per
/// completion batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_job_table_gets_fresh_statistics() {
    let schema = unique_name("jobs_stats");
    let Some((admin, backend)) = fresh_schema(&schema).await else {
        return;
    };
    assert!(
        analyzed_rows(&admin, &schema).await < 0.0,
        "a new table is never analyzed"
    );

    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    let payload = vec![b'x'; 200];
    for batch in 0..2 {
        let jobs = (0..1_000)
            .map(|i| {
                NewJob::new("q")
                    .payload(payload.clone())
                    .priority(i % 3 + batch)
            })
            .collect();
        store.enqueue_batch(jobs).await.expect("enqueue");
    }
    assert!(
        analyzed_rows(&admin, &schema).await < 0.0,
        "enqueueing alone leaves the statistics to autovacuum"
    );
    let mut claimed = 0;
    while claimed < 2_000 {
        let request = ClaimRequest::new(["q"], "w", TTL).limit(500);
        let jobs = store.claim(request).await.expect("claim");
        assert!(!jobs.is_empty(), "2,000 jobs are ready");
        claimed += jobs.len();
    }

    let (rows, columns) = analyzed(&admin, &schema, 1_000.0).await;
    assert!(
        rows >= 1_000.0,
        "the table of 2,000 jobs was analyzed (pg_class.reltuples = {rows})"
    );
    assert_eq!(columns, 2, "the columns the hot path's plans hinge on");

    drop(store);
    drop(backend);
    drop_schema(&admin, &schema).await;
}

/// A young table is analyzed within its first hundred jobs claimed, not after a
/// thousand: until its first `ANALYZE`, every claim's lease read the namespace's whole
/// range of `jobs_pkey` (800 buffers a claim of one job after 900 jobs, in the
/// `latency` benchmark, against 22 once analyzed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_job_table_is_analyzed_within_its_first_hundred_claims() {
    let schema = unique_name("jobs_young");
    let Some((admin, backend)) = fresh_schema(&schema).await else {
        return;
    };
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    // 200 jobs of 1 KiB: 25 pages at least, past the 4 below which statistics do
    // not matter.
    let jobs = (0..200)
        .map(|_| NewJob::new("q").payload(vec![b'x'; 1024]))
        .collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
    // One job a claim, as a worker keeping up with its producer claims them.
    for _ in 0..100 {
        let request = ClaimRequest::new(["q"], "w", TTL).limit(1);
        let jobs = store.claim(request).await.expect("claim");
        assert_eq!(jobs.len(), 1, "200 jobs are ready");
    }

    let (rows, columns) = analyzed(&admin, &schema, 100.0).await;
    assert!(
        rows >= 100.0,
        "100 claims of a 200-job table analyzed it (pg_class.reltuples = {rows})"
    );
    assert_eq!(columns, 2, "the columns the hot path's plans hinge on");

    drop(store);
    drop(backend);
    drop_schema(&admin, &schema).await;
}

/// A pool whose connections count their returns to it, for `from_pool`.
async fn counting_pool(max_connections: u32) -> (PgPool, Arc<AtomicU64>) {
    let returns = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&returns);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(20))
        .after_release(move |_, _| {
            counter.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Ok(true) })
        })
        .connect(&url())
        .await
        .expect("connect");
    (pool, returns)
}

/// sqlx pings every connection it takes back into its pool, a round trip per
/// statement; a busy store keeps its connection between statements instead, so a run
/// of calls one after another gives none back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_store_keeps_its_connection_between_statements() {
    let Some(_admin) = admin().await else { return };
    let (pool, returns) = counting_pool(4).await;
    let backend = PostgresPool::from_pool(pool, durq_postgres::DEFAULT_SCHEMA)
        .await
        .expect("open");
    let clock = ManualClock::default();
    let settings = settings(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let before = returns.load(Ordering::Relaxed);
    for _ in 0..30 {
        store.enqueue(NewJob::new("warm")).await.expect("enqueue");
        let claimed = store
            .claim(ClaimRequest::new(["warm"], "w", TTL))
            .await
            .expect("claim");
        let [job] = &claimed[..] else {
            panic!("one job claimed, got {}", claimed.len())
        };
        store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
    }
    let given_back = returns.load(Ordering::Relaxed) - before;
    clean_up(&backend, &namespace).await;
    // 90 statements; before, each gave its connection back. A pause of a second
    // (a slow machine) may hand one back to the pool's idle rules.
    assert!(
        given_back <= 3,
        "{given_back} connections given back to the pool over 90 statements"
    );
}

/// A connection the store keeps between statements goes back to the pool once idle,
/// so an application sharing the pool (`from_pool`) is not left waiting for it; and a
/// closed pool gets it back at once, so `close` completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_sharing_the_pool_gets_the_stores_idle_connection() {
    let Some(_admin) = admin().await else { return };
    let (pool, _) = counting_pool(2).await;
    let backend = PostgresPool::from_pool(pool.clone(), durq_postgres::DEFAULT_SCHEMA)
        .await
        .expect("open");
    let clock = ManualClock::default();
    let store = open(&backend, settings(&clock));
    store.stats("q").await.expect("a statement");
    // Two connections at most: the application's second waits for the store's.
    let first = pool.acquire().await.expect("the application's first");
    let second = pool.acquire().await.expect("the application's second");
    drop((first, second));

    store.stats("q").await.expect("a statement");
    tokio::time::timeout(Duration::from_secs(10), pool.close())
        .await
        .expect("the pool closes with the store's connection parked");
}
