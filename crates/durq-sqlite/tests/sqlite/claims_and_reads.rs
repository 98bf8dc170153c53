use super::*;

/// Fitted claims over several queues, long priority bands, scheduled jobs and paused
/// queues take exactly what the durq-core reference takes: the ready jobs the budget
/// admits, ordered by `ClaimRequest::fit_order`, cut to the limit. This is what the
/// band-by-band scan, its early stops and its per-queue merge must add up to.
#[tokio::test]
async fn fitted_claims_take_what_the_reference_takes() {
    struct Model {
        id: JobId,
        queue: &'static str,
        order: ReadyOrder,
        needs: Needs,
        locality: Option<String>,
        claimed: bool,
    }
    const QUEUES: [&str; 3] = ["fa", "fb", "fc"];
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let now = clock.now();
    let mut rng = Lcg(7);
    let mut model = Vec::new();
    let mut batch = Vec::new();
    for seq in 0..600u64 {
        let queue = QUEUES[rng.below(3) as usize];
        let priority = rng.below(3) as i16;
        let mut needs = Needs::new();
        if rng.below(3) > 0 {
            needs = needs.amount("gpu", rng.below(4));
        }
        if rng.below(8) == 0 {
            needs = needs.capability("fpga");
        }
        let locality = match rng.below(4) {
            0 => None,
            n => Some(format!("host-{n}")),
        };
        let delay = Duration::from_secs(rng.below(6) * 60);
        let run_at = now.saturating_add(delay);
        let mut job = NewJob::new(queue)
            .priority(priority)
            .needs(needs.clone())
            .run_at(run_at);
        if let Some(locality) = &locality {
            job = job.locality(locality.clone());
        }
        batch.push(job);
        model.push((
            queue,
            ReadyOrder::new(priority, run_at, seq),
            needs,
            locality,
        ));
    }
    let answers = match store.enqueue_batch(batch).await {
        Ok(answers) => answers,
        Err(err) => panic!("enqueue failed: {err}"),
    };
    // Enqueued in one batch at one instant, so their sequence follows the batch.
    let mut model: Vec<Model> = model
        .into_iter()
        .zip(answers)
        .map(|((queue, order, needs, locality), answer)| Model {
            id: answer.id,
            queue,
            order,
            needs,
            locality,
            claimed: false,
        })
        .collect();
    if let Err(err) = store.pause("fc").await {
        panic!("pause failed: {err}");
    }
    let ttl = Duration::from_secs(30);
    for round in 0..120 {
        if round % 10 == 9 {
            clock.advance(Duration::from_secs(60));
        }
        let named: Vec<&str> = QUEUES
            .iter()
            .copied()
            .filter(|_| rng.below(4) > 0)
            .collect();
        if named.is_empty() {
            continue;
        }
        let mut request =
            ClaimRequest::new(named.clone(), "w", ttl).limit(1 + rng.below(7) as usize);
        if rng.below(4) > 0 {
            let mut budget = Budget::new().amount("gpu", rng.below(4));
            if rng.below(2) == 0 {
                budget = budget.capability("fpga");
            }
            request = request.budget(budget);
        }
        let prefer: Vec<String> = (1..4)
            .filter(|_| rng.below(3) == 0)
            .map(|n| format!("host-{n}"))
            .collect();
        if prefer.is_empty() && request.budget.is_none() {
            request = request.prefer(["host-1"]);
        } else {
            request = request.prefer(prefer);
        }
        let at = clock.now();
        let mut expected: Vec<(durq_core::fit::FitOrder, JobId)> = model
            .iter()
            .filter(|job| {
                !job.claimed
                    && job.queue != "fc"
                    && named.contains(&job.queue)
                    && job.order.ready_at <= at
                    && request.admits(&job.needs)
            })
            .map(|job| {
                (
                    request.fit_order(job.order, job.locality.as_deref()),
                    job.id,
                )
            })
            .collect();
        expected.sort();
        expected.truncate(request.limit);
        let expected: Vec<JobId> = expected.into_iter().map(|(_, id)| id).collect();
        let claimed: Vec<JobId> = match store.claim(request.clone()).await {
            Ok(claimed) => claimed.iter().map(|job| job.id()).collect(),
            Err(err) => panic!("claim failed: {err}"),
        };
        assert_eq!(claimed, expected, "round {round}: {request:?}");
        for job in &mut model {
            if claimed.contains(&job.id) {
                job.claimed = true;
            }
        }
    }
    assert!(
        model.iter().filter(|job| job.claimed).count() > 200,
        "the rounds claimed too little to test much"
    );
}

/// Tags that cannot be read back (not JSON, not a map of strings, not text) are a
/// corrupt record for every read that meets them; a claim buries the job (CONTRACT
/// C10) and leases nothing; an attempt record that cannot be read makes `attempts` corrupt.
#[tokio::test]
async fn unreadable_tags_and_attempts_are_reported_as_corrupt() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let parent = match store.enqueue(NewJob::new("parents")).await {
        Ok(done) => done.id,
        Err(err) => panic!("enqueue failed: {err}"),
    };
    let id = match store
        .enqueue(NewJob::new("tagged").tag("k", "v").parent(parent))
        .await
    {
        Ok(done) => done.id,
        Err(err) => panic!("enqueue failed: {err}"),
    };
    let conn = raw(&path);
    for bad in [
        rusqlite::types::Value::Text("{".to_owned()),
        rusqlite::types::Value::Text(r#"{"k":1}"#.to_owned()),
        rusqlite::types::Value::Text("[1]".to_owned()),
        rusqlite::types::Value::Integer(7),
        rusqlite::types::Value::Blob(vec![0xff, 0xfe]),
    ] {
        let broken = conn.execute(
            "UPDATE jobq_jobs SET tags = ?1 WHERE id = ?2",
            rusqlite::params![bad, id.to_bytes()],
        );
        assert!(matches!(broken, Ok(1)));
        assert!(
            matches!(store.get(id).await, Err(Error::Corrupt { .. })),
            "get with {bad:?}"
        );
        assert!(
            matches!(store.children(parent).await, Err(Error::Corrupt { .. })),
            "children with {bad:?}"
        );
        for query in [
            ListQuery::new("tagged"),
            ListQuery::all(),
            ListQuery::all().tag("k", "v"),
        ] {
            let listed = store.list(query.clone()).await;
            assert!(
                matches!(listed, Err(Error::Corrupt { .. })),
                "{query:?} with {bad:?}: {listed:?}"
            );
        }
    }
    // A claim that meets the unreadable tags buries the job, leasing nothing (C10).
    let request = ClaimRequest::new(["tagged"], "w", Duration::from_secs(30));
    match store.claim(request).await {
        Ok(claimed) => assert!(claimed.is_empty(), "{claimed:?}"),
        Err(err) => panic!("claim failed: {err}"),
    }
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM jobq_jobs WHERE state = 3 AND attempts = 0
             AND last_error LIKE 'corrupt record: %tags%'"
        ),
        1,
        "the claim buried the job, unleased, saying why"
    );
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobq_jobs WHERE state = 1"),
        0,
        "the claim leased nothing"
    );
    let repaired = conn.execute("UPDATE jobq_jobs SET tags = NULL", []);
    assert!(matches!(repaired, Ok(2)));
    let unknown_outcome = conn.execute(
        "INSERT INTO jobq_attempts (ns, job_id, slot, token, worker, started_at, ended_at,
             outcome, error)
         SELECT ns, id, 1, 1, 'w', 0, 1, 'lost', NULL FROM jobq_jobs WHERE id = ?1",
        [id.to_bytes()],
    );
    assert!(matches!(unknown_outcome, Ok(1)));
    assert!(matches!(
        store.attempts(id).await,
        Err(Error::Corrupt { .. })
    ));
}

/// A4: a filter that matches few jobs ends a page early once the call has examined its
/// bound of rows, `next` set, and the pages still join to every match, newest first.
#[tokio::test]
async fn a_sparse_list_filter_ends_pages_early_and_pages_on() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let mut rare = Vec::new();
    for batch in 0..2 {
        let jobs: Vec<NewJob> = (0..10_000)
            .map(|i| {
                let job = NewJob::new("bulk");
                if i % 4_000 == 0 {
                    job.tag("rare", "yes")
                } else {
                    job.tag("rare", "no")
                }
            })
            .collect();
        let done = match store.enqueue_batch(jobs).await {
            Ok(done) => done,
            Err(err) => panic!("batch {batch} failed: {err}"),
        };
        rare.extend(done.iter().step_by(4_000).map(|e| e.id));
    }
    rare.reverse();
    assert_eq!(rare.len(), 6);
    for query in [
        ListQuery::new("bulk").tag("rare", "yes"),
        ListQuery::all().tag("rare", "yes"),
    ] {
        let first = match store.list(query.clone().limit(10)).await {
            Ok(first) => first,
            Err(err) => panic!("list failed: {err}"),
        };
        assert!(
            first.jobs.len() < 10 && first.next.is_some(),
            "{query:?}: the first page stops at the bound with a cursor ({} jobs)",
            first.jobs.len()
        );
        let (ids, pages) = list_every_page(&store, query.clone(), 10).await;
        assert_eq!(ids, rare, "{query:?}: the pages join to every match");
        assert!(pages >= 2, "{query:?}");
    }
    // A queue alone never stops early: every row its index ranges give matches.
    let page = match store.list(ListQuery::new("bulk").limit(1_000)).await {
        Ok(page) => page,
        Err(err) => panic!("list failed: {err}"),
    };
    assert_eq!(page.jobs.len(), 1_000);
}

/// A4 across many queues: whether `list` merges one stream per (queue, state) or walks
/// the id index (more streams than it merges), every filter lists exactly what the
/// durq-core matcher says, newest first, for pages of any size.
#[tokio::test]
async fn list_filters_agree_with_the_reference_across_many_queues() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, settings(&clock), SqliteConfig::default()).await;
    let mut queues: Vec<String> = (0..40).map(|i| format!("p.{i}")).collect();
    queues.extend(["p_1".to_owned(), "P.1".to_owned(), "q.1".to_owned()]);
    for round in 0..3 {
        for (i, queue) in queues.iter().enumerate() {
            let mut job = NewJob::new(queue.as_str())
                .tenant(if i % 3 == 0 { "acme" } else { "" })
                .tag("round", round.to_string());
            if i % 2 == 0 {
                job = job.tag("even", "yes");
            }
            if let Err(err) = store.enqueue(job).await {
                panic!("enqueue failed: {err}");
            }
        }
        clock.advance(Duration::from_millis(1));
    }
    // Some of each state: round 0's jobs of the first ten queues run, two die, one is
    // cancelled.
    let first_ten: Vec<String> = queues[..10].to_vec();
    let claimed = match store
        .claim(ClaimRequest::new(first_ten, "w", Duration::from_secs(30)).limit(10))
        .await
    {
        Ok(claimed) => claimed,
        Err(err) => panic!("claim failed: {err}"),
    };
    for held in &claimed[..2] {
        if let Err(err) = store.fail(held.id(), held.token(), "x", Retry::Never).await {
            panic!("fail failed: {err}");
        }
    }
    if let Err(err) = store.cancel(claimed[2].id()).await {
        panic!("cancel failed: {err}");
    }
    let everything = match store.list(ListQuery::all().limit(1_000)).await {
        Ok(page) => page.jobs,
        Err(err) => panic!("list failed: {err}"),
    };
    assert_eq!(everything.len(), queues.len() * 3);
    let queries = [
        ListQuery::all().queue_prefix("p.1"),
        ListQuery::all().queue_prefix("p.1").state(JobState::Queued),
        ListQuery::all().queue_prefix("p.").state(JobState::Queued),
        ListQuery::all()
            .queue_prefix("p.")
            .states([JobState::Running, JobState::Dead]),
        ListQuery::all().state(JobState::Running),
        ListQuery::all().tenant("acme"),
        ListQuery::all().tag("even", "yes").tag("round", "1"),
        ListQuery::all()
            .queue_prefix("p")
            .tenant("acme")
            .state(JobState::Queued),
        ListQuery::all()
            .queue_prefix("p.3")
            .state(JobState::Queued)
            .tag("even", "yes"),
        ListQuery::all().queue_prefix("p_"),
        ListQuery::all().queue_prefix("P").tenant("acme"),
        ListQuery::all().queue_prefix("q"),
        ListQuery::all().queue_prefix("zz"),
        ListQuery::new("p.3").queue_prefix("p.3"),
        ListQuery::new("p.3").queue_prefix("p.4"),
        ListQuery::new("p.0").states([JobState::Running, JobState::Queued]),
    ];
    for query in queries {
        let expected: Vec<JobId> = everything
            .iter()
            .filter(|job| query.matches(job))
            .map(|job| job.id)
            .collect();
        for page in [1, 7, 1_000] {
            let (ids, _) = list_every_page(&store, query.clone(), page).await;
            assert_eq!(ids, expected, "{query:?} in pages of {page}");
        }
    }
}

/// CONTRACT K4: a claimer waiting on a queue whose rate holds its jobs back looks again
/// when the rate frees a start, not a poll later: with a poll of a minute, the wait
/// ends as soon as the store's clock has moved past the window (here 1 ms long). The
/// clock moves on by 1 ms at each reading once the wait begins, so the wait's second
/// look finds the start freed, whenever it makes it.
#[tokio::test]
async fn a_wait_ends_when_a_rate_frees_a_start() {
    use durq_core::{QueueLimits, Rate};
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    #[derive(Debug)]
    struct TickingClock {
        now: AtomicI64,
        ticking: AtomicBool,
    }
    impl Clock for TickingClock {
        fn now(&self) -> Timestamp {
            let step = i64::from(self.ticking.load(Ordering::SeqCst));
            Timestamp::from_millis(self.now.fetch_add(step, Ordering::SeqCst))
        }
    }
    fn must<T>(answer: durq_core::Result<T>, what: &str) -> T {
        match answer {
            Ok(value) => value,
            Err(err) => panic!("{what}: {err}"),
        }
    }

    let (_dir, path) = temp_db();
    let clock = Arc::new(TickingClock {
        now: AtomicI64::new(1_700_000_000_000),
        ticking: AtomicBool::new(false),
    });
    let settings = StoreSettings::default()
        .namespace("sqlite-tests")
        .clock(clock.clone());
    let config = SqliteConfig::default().poll_interval(Duration::from_secs(60));
    let store = open(&path, settings, config).await;
    let one_per_ms = QueueLimits::new().max_starts(Rate::new(1, Duration::from_millis(1)));
    must(store.set_limits("rated", one_per_ms).await, "set_limits");
    for _ in 0..2 {
        must(store.enqueue(NewJob::new("rated")).await, "enqueue");
    }
    let request = ClaimRequest::new(["rated"], "w", Duration::from_secs(30)).limit(10);
    let first = must(store.claim(request.clone()).await, "claim");
    assert_eq!(first.len(), 1, "the rate admits one start per window");
    assert!(must(store.claim(request.clone()).await, "claim").is_empty());

    clock.ticking.store(true, Ordering::SeqCst);
    let queues = vec!["rated".to_owned()];
    let waited = tokio::time::timeout(
        Duration::from_secs(20),
        store.wait_for_work(&queues, Duration::from_secs(60)),
    )
    .await;
    match waited {
        Ok(waited) => must(waited, "wait_for_work"),
        Err(_) => panic!("the wait outlasted the rate's window by 20 s: it waited for a poll"),
    }
    assert_eq!(must(store.claim(request).await, "claim").len(), 1);
}

/// CONTRACT O2 on SQLite: a wait is woken by the commit that ended its job in this
/// process, not by its poll: with an hour's poll interval, waits armed before their
/// jobs end (a completion, a failure, a cascade of G3, an operator's cancel, a caller's
/// fenced completion) all answer within seconds of an hour's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_are_woken_by_commits_in_the_process_not_by_the_poll() {
    use durq_core::Bytes;
    use futures::FutureExt;

    let (_dir, path) = temp_db();
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let config = SqliteConfig::default().poll_interval(Duration::from_secs(3600));
    let store = open(&path, settings(&clock), config.clone()).await;
    let waiter = open(&path, settings(&clock), config.clone()).await;
    fn must<T>(what: &str, r: durq_core::Result<T>) -> T {
        r.unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    let completed = must("enqueue", store.enqueue(NewJob::new("w")).await).id;
    let failed = must("enqueue", store.enqueue(NewJob::new("w")).await).id;
    let fenced = must("enqueue", store.enqueue(NewJob::new("w")).await).id;
    let dependent = must(
        "enqueue",
        store.enqueue(NewJob::new("w-after").after(failed)).await,
    )
    .id;
    let cancelled = must("enqueue", store.enqueue(NewJob::new("w-idle")).await).id;
    let claimed = must(
        "claim",
        store
            .claim(ClaimRequest::new(["w"], "worker", Duration::from_secs(60)).limit(3))
            .await,
    );
    assert_eq!(claimed.len(), 3);
    let token = |id: JobId| match claimed.iter().find(|c| c.id() == id) {
        Some(c) => c.token(),
        None => panic!("job {id} was claimed"),
    };

    let mut waits = Vec::new();
    for id in [completed, failed, fenced, dependent, cancelled] {
        let waiter = waiter.clone();
        let mut wait =
            Box::pin(async move { (id, waiter.wait(id, Duration::from_secs(3600)).await) });
        assert!((&mut wait).now_or_never().is_none(), "no job has ended yet");
        waits.push(tokio::spawn(wait));
    }

    must(
        "complete",
        store
            .complete(
                completed,
                token(completed),
                Some(Bytes::from_static(b"done")),
            )
            .await,
    );
    must(
        "fail",
        store
            .fail(failed, token(failed), "broke", Retry::Never)
            .await,
    );
    must("cancel", store.cancel(cancelled).await);
    let backend = open_backend(&path, settings(&clock), config).await;
    let mut conn = raw(&path);
    let mut tx = must("begin", backend.transaction(&mut conn));
    let _receipt = must(
        "fenced completion",
        tx.complete(fenced, token(fenced), None),
    );
    must("commit", tx.commit());

    let answers =
        match tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(waits)).await
        {
            Ok(answers) => answers,
            Err(_) => panic!("the waits were not woken by the commits that ended their jobs"),
        };
    for answer in answers {
        let (id, answer) = must(
            "join",
            answer.map_err(|e| Error::invalid("join", e.to_string())),
        );
        let job = match must("wait", answer) {
            Some(job) => job,
            None => panic!("job {id} ended, so its wait answers it"),
        };
        let expected = if id == completed || id == fenced {
            JobState::Succeeded
        } else if id == failed {
            JobState::Dead
        } else {
            JobState::Cancelled
        };
        assert_eq!(job.state, expected, "job {id}");
    }
}
