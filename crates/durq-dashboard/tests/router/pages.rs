use super::*;

#[tokio::test]
async fn the_overview_lists_queues_with_counts_and_workers() {
    let store = memory().await;
    store.enqueue(NewJob::new("emails")).await.expect("enqueue");
    store.enqueue(NewJob::new("emails")).await.expect("enqueue");
    dead_job(&store, "reports", "boom").await;
    store.pause("idle").await.expect("pause");
    let worker = WorkerInfo::new("w-1", "box-7", 42, vec!["emails".into()], 8);
    store.register_worker(&worker).await.expect("register");
    let router = router(&store);

    let page = get(&router, "/").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.header(header::CONTENT_TYPE).starts_with("text/html"));
    for queue in ["emails", "reports", "idle"] {
        assert!(
            page.body.contains(&format!("data-queue=\"{queue}\"")),
            "{queue} missing: {}",
            page.body
        );
    }
    assert!(page
        .body
        .contains("href=\"/jobs?queue=emails&amp;state=queued\">2</a>"));
    assert!(page
        .body
        .contains("href=\"/jobs?queue=reports&amp;state=dead\">1</a>"));
    assert!(page.body.contains("badge paused"), "idle is paused");
    assert!(page.body.contains("box-7"), "the worker is listed");
    assert!(
        page.body.contains("http-equiv=\"refresh\""),
        "it refreshes itself"
    );
    assert!(page.body.contains("Throughput") && page.body.contains("Lag"));
    assert!(!page.body.contains("<script"), "no script at all");
    // Security headers on every page.
    assert!(page
        .header(header::CONTENT_SECURITY_POLICY)
        .contains("default-src 'none'"));
    assert_eq!(page.header(header::X_FRAME_OPTIONS), "DENY");
    // Not no-referrer: a browser would send `Origin: null` with the dashboard's forms.
    assert_eq!(page.header(header::REFERRER_POLICY), "same-origin");
    assert_eq!(page.header(header::CACHE_CONTROL), "no-store");
}

#[tokio::test]
async fn user_text_is_escaped_everywhere() {
    let store = memory().await;
    let evil = "<img src=x onerror=alert(1)>";
    let id = dead_job(&store, "q", evil).await;
    let with_payload = store
        .enqueue(NewJob::new("q").payload(format!("<script>{evil}</script>")))
        .await
        .expect("enqueue")
        .id;
    let tagged = store
        .enqueue(NewJob::new("q").tag("k", evil).tenant(evil))
        .await
        .expect("enqueue")
        .id;
    let worker = WorkerInfo::new("<b>w</b>", "<i>host</i>", 1, vec!["q".into()], 1);
    store.register_worker(&worker).await.expect("register");
    let router = router(&store);
    let by_tag = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("tag", &format!("k={evil}"))
        .append_pair("tenant", evil)
        .finish();
    for uri in [
        format!("/jobs/{tagged}"),
        "/jobs".to_owned(),
        format!("/jobs?{by_tag}"),
        "/".to_owned(),
        "/workers".to_owned(),
        format!("/jobs/{id}"),
        format!("/jobs/{with_payload}"),
        "/jobs?queue=q".to_owned(),
        "/jobs?queue=q&state=dead".to_owned(),
    ] {
        let page = get(&router, &uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
        for raw in ["<img", "<script", "<b>w", "<i>host"] {
            assert!(!page.body.contains(raw), "{uri} holds {raw}: {}", page.body);
        }
    }
    let detail = get(&router, &format!("/jobs/{id}")).await;
    assert!(detail.body.contains("&lt;img src=x onerror=alert(1)&gt;"));
    let workers = get(&router, "/workers").await;
    assert!(workers.body.contains("&lt;b&gt;w&lt;/b&gt;"));
    let filtered = get(&router, &format!("/jobs?{by_tag}")).await;
    assert!(
        filtered.body.contains(&format!("data-job=\"{tagged}\"")),
        "the evil tag matches: {}",
        filtered.body
    );
    assert!(filtered
        .body
        .contains("value=\"k=&lt;img src=x onerror=alert(1)&gt;\""));
}

#[tokio::test]
async fn job_lists_filter_by_state_and_page_by_cursor() {
    let store = memory().await;
    let mut queued = Vec::new();
    for _ in 0..5 {
        queued.push(store.enqueue(NewJob::new("q")).await.expect("enqueue").id);
    }
    let dead = dead_job(&store, "q", "boom").await;
    let router = router(&store);

    let dead_only = get(&router, "/jobs?queue=q&state=dead").await;
    assert_eq!(dead_only.status, StatusCode::OK, "{}", dead_only.body);
    assert!(dead_only.body.contains(&dead.to_string()));
    assert!(!dead_only.body.contains(&queued[0].to_string()));

    // Newest first, two per page: the 5 queued jobs take three pages.
    let mut seen = Vec::new();
    let mut uri = Some("/jobs?queue=q&state=queued&limit=2".to_owned());
    let mut pages = 0;
    while let Some(at) = uri.take() {
        let page = get(&router, &at).await;
        assert_eq!(page.status, StatusCode::OK, "{at}: {}", page.body);
        let on_page = listed(&page, &queued);
        assert!(on_page.len() <= 2, "two per page");
        seen.extend(on_page);
        uri = next_page(&page);
        pages += 1;
        assert!(pages <= 3, "the third page is the last");
    }
    assert_eq!(pages, 3);
    let mut newest_first = queued.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first, "every queued job once, newest first");

    // Without a queue, every queue's jobs.
    let everything = get(&router, "/jobs").await;
    assert_eq!(everything.status, StatusCode::OK);
    assert!(everything.body.contains("Jobs of every queue"));
    let mut all = queued.clone();
    all.push(dead);
    all.reverse();
    assert_eq!(listed(&everything, &all), all);
}

#[tokio::test]
async fn the_job_page_shows_every_attempt_its_tags_and_trace_context() {
    let store = memory().await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = store
        .enqueue(
            NewJob::new("q")
                .max_attempts(5)
                .tag("customer", "<acme>")
                .tag("region", "eu")
                .trace_context(trace),
        )
        .await
        .expect("enqueue")
        .id;
    let router = router(&store);
    let fresh = get(&router, &format!("/jobs/{id}")).await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.body);
    assert!(fresh.body.contains("id=\"no-attempts\""), "{}", fresh.body);

    // The first attempt fails with an error of two lines; the job is ready again at
    // once, and a second worker claims it.
    let claim =
        |worker: &str| ClaimRequest::new(["q"], worker, Duration::from_secs(30)).reserved(id);
    let first = store.claim(claim("worker-<1>")).await.expect("claim");
    let first = first.first().expect("the job is claimed");
    let error = "smtp said <no>\n  at send (mail.rs:42)";
    store
        .fail(first.id(), first.token(), error, Retry::At(store.now()))
        .await
        .expect("fail");
    let second = store.claim(claim("worker-2")).await.expect("claim");
    let second = second.first().expect("the job is claimed again");

    let page = get(&router, &format!("/jobs/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let section = page
        .body
        .split("id=\"attempt-history\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no attempts section: {}", page.body));
    let failed = section
        .split("data-attempt=\"1\" data-outcome=\"failed\"")
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("no failed attempt 1: {section}"));
    assert!(failed.contains("worker-&lt;1&gt;"), "{failed}");
    assert!(
        failed.contains("<details><summary>smtp said &lt;no&gt;…</summary>"),
        "the error's first line: {failed}"
    );
    assert!(
        failed.contains("<pre>smtp said &lt;no&gt;\n  at send (mail.rs:42)</pre>"),
        "the whole error, folded: {failed}"
    );
    let running = section
        .split("data-attempt=\"2\" data-outcome=\"running\"")
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("no running attempt 2: {section}"));
    assert!(running.contains("worker-2"), "{running}");
    assert!(
        running.contains("<td class=\"muted\">running</td>"),
        "{running}"
    );
    assert!(
        !running.contains("<details>"),
        "no error while it runs: {running}"
    );
    assert!(
        section.find("data-attempt=\"1\"") < section.find("data-attempt=\"2\""),
        "oldest first"
    );
    // Tags as chips, each a link to the jobs carrying it; the trace context as given.
    assert!(
        page.body.contains(
            "<a class=\"tag\" data-tag=\"customer=&lt;acme&gt;\" \
             href=\"/jobs?tag=customer%3D%3Cacme%3E\">customer=&lt;acme&gt;</a>"
        ),
        "{}",
        page.body
    );
    assert!(page.body.contains("data-tag=\"region=eu\""));
    assert!(page.body.contains(&format!(
        "id=\"trace-context\" title=\"W3C traceparent\">{trace}</dd>"
    )));
    for raw in ["<acme>", "<no>", "worker-<1>"] {
        assert!(!page.body.contains(raw), "{raw} unescaped: {}", page.body);
    }

    // Once it succeeds, the second attempt says so and ends.
    store
        .complete(second.id(), second.token(), None)
        .await
        .expect("complete");
    let done = get(&router, &format!("/jobs/{id}")).await;
    assert!(
        done.body
            .contains("data-attempt=\"2\" data-outcome=\"succeeded\""),
        "{}",
        done.body
    );
    assert!(!done.body.contains("<td class=\"muted\">running</td>"));
    // A job without tags or trace context shows neither.
    let plain = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let plain = get(&router, &format!("/jobs/{plain}")).await;
    assert!(!plain.body.contains("id=\"job-tags\""));
    assert!(!plain.body.contains("id=\"trace-context\""));
}

#[tokio::test]
async fn job_lists_span_queues_and_filter_by_prefix_states_tenant_and_tags() {
    let store = memory().await;
    let enqueue = |queue: &str, tenant: &str, customer: &str| {
        let job = NewJob::new(queue).tenant(tenant).tag("customer", customer);
        let store = store.clone();
        async move { store.enqueue(job).await.expect("enqueue").id }
    };
    let eu = enqueue("emails.eu", "acme", "42").await;
    let us = enqueue("emails.us", "beta", "42").await;
    let eu_420 = enqueue("emails.eu", "acme", "420").await;
    let report = enqueue("reports", "acme", "42").await;
    let dead = dead_job(&store, "emails.eu", "boom").await;
    let every = [eu, us, eu_420, report, dead];
    let router = router(&store);

    let newest_first = |ids: &[durq::JobId]| {
        let mut ids = ids.to_vec();
        ids.sort();
        ids.reverse();
        ids
    };
    let cases: [(&str, Vec<durq::JobId>); 9] = [
        ("/jobs", newest_first(&every)),
        ("/jobs?tag=customer%3D42", newest_first(&[eu, us, report])),
        ("/jobs?tag=customer=420", vec![eu_420]),
        (
            "/jobs?prefix=emails.&tag=customer%3D42",
            newest_first(&[eu, us]),
        ),
        (
            "/jobs?tenant=acme&tag=customer%3D42",
            newest_first(&[eu, report]),
        ),
        (
            "/jobs?prefix=emails.eu&state=queued&state=dead",
            newest_first(&[eu, eu_420, dead]),
        ),
        ("/jobs?state=dead", vec![dead]),
        ("/jobs?queue=emails.us", vec![us]),
        ("/jobs?prefix=Emails", vec![]),
    ];
    for (uri, expected) in cases {
        let page = get(&router, uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
        assert_eq!(listed(&page, &every), expected, "{uri}: {}", page.body);
        if expected.is_empty() {
            assert!(page.body.contains("id=\"no-jobs\""), "{uri}");
        }
    }

    // Across queues, each row names its queue and shows its tags.
    let all = get(&router, "/jobs").await;
    assert!(all.body.contains("<th>Queue</th>") && all.body.contains("<th>Tags</th>"));
    assert!(all
        .body
        .contains("href=\"/queue?name=reports\">reports</a>"));
    assert!(all.body.contains("data-tag=\"customer=420\""));
    assert!(all
        .body
        .contains("<option value=\"\" selected>all queues</option>"));
    // One queue's list needs no queue column.
    let one = get(&router, "/jobs?queue=reports").await;
    assert!(!one.body.contains("<th>Queue</th>"), "{}", one.body);

    // The form shows the filters it was given.
    let form = get(
        &router,
        "/jobs?prefix=emails.&state=dead&state=queued&tenant=acme&tag=customer%3D42",
    )
    .await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);
    for wanted in [
        "name=\"prefix\" value=\"emails.\"",
        "name=\"state\" value=\"dead\" checked",
        "name=\"state\" value=\"queued\" checked",
        "name=\"state\" value=\"running\">",
        "name=\"tenant\" value=\"acme\"",
        "name=\"tag\" value=\"customer=42\"",
        "name=\"tag\" placeholder=\"key=value\"",
        "Jobs of every queue · queued, dead",
    ] {
        assert!(form.body.contains(wanted), "{wanted}: {}", form.body);
    }
    assert_eq!(listed(&form, &every), vec![eu]);
}

#[tokio::test]
async fn paging_keeps_every_filter() {
    let store = memory().await;
    let mut wanted = Vec::new();
    for n in 0..5 {
        let queue = if n % 2 == 0 { "x.a" } else { "x.b" };
        let job = NewJob::new(queue).tenant("t1").tag("batch", "7");
        wanted.push(store.enqueue(job).await.expect("enqueue").id);
        // Noise between them, each failing one filter.
        for job in [
            NewJob::new(queue).tenant("t1").tag("batch", "8"),
            NewJob::new("y").tenant("t1").tag("batch", "7"),
            NewJob::new(queue).tenant("t2").tag("batch", "7"),
        ] {
            store.enqueue(job).await.expect("enqueue");
        }
    }
    let router = router(&store);
    let mut seen = Vec::new();
    let mut uri = Some("/jobs?prefix=x.&state=queued&tenant=t1&tag=batch%3D7&limit=2".to_owned());
    let mut pages = 0;
    while let Some(at) = uri.take() {
        let page = get(&router, &at).await;
        assert_eq!(page.status, StatusCode::OK, "{at}: {}", page.body);
        let rows = page.body.matches("<tr data-job=").count();
        let on_page = listed(&page, &wanted);
        assert_eq!(
            rows,
            on_page.len(),
            "{at}: only matching jobs: {}",
            page.body
        );
        assert!(on_page.len() <= 2, "{at}");
        seen.extend(on_page);
        uri = next_page(&page);
        if let Some(next) = &uri {
            for kept in [
                "prefix=x.",
                "state=queued",
                "tenant=t1",
                "tag=batch%3D7",
                "limit=2",
            ] {
                assert!(next.contains(kept), "{next} lost {kept}");
            }
        }
        if pages > 0 {
            // "First page" keeps them too.
            assert!(
                page.body.contains(
                    "href=\"/jobs?prefix=x.&amp;state=queued&amp;tenant=t1&amp;tag=batch%3D7&amp;limit=2\">← First page"
                ),
                "{}",
                page.body
            );
        }
        pages += 1;
        assert!(pages <= 4, "at most three pages and an empty last one");
    }
    wanted.reverse();
    assert_eq!(seen, wanted, "every matching job once, newest first");
}

#[tokio::test]
async fn a_page_the_store_ends_early_reads_on() {
    // Each store read hands back at most 2 jobs with `next` set, as Redis does under
    // tag filters; a page of 5 takes three reads.
    let (store, reads) = short_pages(memory().await, 2);
    let mut ids = Vec::new();
    for n in 0..20 {
        let queue = if n % 2 == 0 { "a" } else { "b" };
        let job = NewJob::new(queue).tag("t", "1");
        ids.push(store.enqueue(job).await.expect("enqueue").id);
    }
    ids.reverse();
    let router = router(&store);
    let page = get(&router, "/jobs?tag=t%3D1&limit=5").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(listed(&page, &ids), ids[..5]);
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    assert!(!page.body.contains("id=\"ended-early\""));
    let next = next_page(&page).expect("a next page");
    assert!(next.contains(&format!("after={}", ids[4])), "{next}");

    // A page of 50 stops after 8 reads (16 jobs) and says so; the next page goes on.
    reads.store(0, Ordering::SeqCst);
    let page = get(&router, "/jobs?tag=t%3D1").await;
    assert_eq!(listed(&page, &ids), ids[..16]);
    assert_eq!(reads.load(Ordering::SeqCst), 8);
    assert!(page.body.contains("id=\"ended-early\""), "{}", page.body);
    let next = next_page(&page).expect("a next page");
    let rest = get(&router, &next).await;
    assert_eq!(listed(&rest, &ids), ids[16..]);
    assert!(next_page(&rest).is_none(), "{}", rest.body);
}

#[tokio::test]
async fn bad_list_filters_are_refused_before_the_store_is_read() {
    let (store, reads) = short_pages(memory().await, 1000);
    store
        .enqueue(NewJob::new("q").tag("k", "v"))
        .await
        .expect("enqueue");
    let router = router(&store);
    let counts = || async {
        let queues = store.queues().await.expect("queues");
        queues
            .into_iter()
            .map(|q| (q.queue, q.stats))
            .collect::<Vec<_>>()
    };
    let before = counts().await;
    let too_many: String = (0..17).map(|i| format!("tag=k{i}%3Dv&")).collect();
    let too_many = format!("/jobs?{too_many}");
    let long_tenant = format!("/jobs?tenant={}", "t".repeat(257));
    let long_value = format!("/jobs?tag=k%3D{}", "v".repeat(257));
    for uri in [
        "/jobs?tag=novalue",
        "/jobs?tag=%3Dv",
        "/jobs?tag=a%20b%3Dv",
        "/jobs?tag=%3Cscript%3E%3Dv",
        "/jobs?tag=k%3Dline%0Abreak",
        "/jobs?tag=k%3D1&tag=k%3D2",
        too_many.as_str(),
        long_value.as_str(),
        "/jobs?prefix=a*",
        "/jobs?prefix=a%20b",
        "/jobs?prefix=%3Cscript%3E",
        "/jobs?prefix=a&prefix=b",
        "/jobs?tenant=a&tenant=b",
        long_tenant.as_str(),
        "/jobs?state=dead&state=zombie",
        "/jobs?state=Dead",
        "/jobs?queue=q&after=not-an-id",
    ] {
        let page = get(&router, uri).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(!page.body.contains("<script"), "{uri}: {}", page.body);
    }
    assert_eq!(
        reads.load(Ordering::SeqCst),
        0,
        "the store was never listed"
    );
    assert_eq!(counts().await, before, "nothing written");
    let fine = get(&router, "/jobs?tag=k%3Dv").await;
    assert_eq!(fine.status, StatusCode::OK);
    assert_eq!(reads.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_inputs_of_pages_are_refused_with_400() {
    let store = memory().await;
    let router = router(&store);
    for uri in [
        "/jobs?queue=a%20b",
        "/jobs?queue=q&state=zombie",
        "/jobs?queue=q&limit=0",
        "/jobs?queue=q&limit=1001",
        "/jobs?queue=q&after=not-an-id",
        "/jobs?queue=q&queue=r",
        "/jobs?queue=q&sort=asc",
        "/jobs/not-an-id",
        "/jobs/00000000-0000-4000-8000-000000000000",
        "/queue",
        "/queue?name=",
        "/queue?name=%3Cscript%3E",
        "/queue?name=q&notice=%3Cscript%3E",
        "/?x=1",
    ] {
        let page = get(&router, uri).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(!page.body.contains("<script"), "{uri}: {}", page.body);
    }
    let id = durq::JobId::mint(store.now());
    let missing = get(&router, &format!("/jobs/{id}")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let nowhere = get(&router, "/nowhere").await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_dead_job_is_retried_from_its_page() {
    let store = memory().await;
    let id = dead_job(&store, "q", "boom").await;
    let router = router(&store);
    let page = get(&router, &format!("/jobs/{id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("data-state=\"dead\""));
    assert!(page.body.contains("boom"), "the last error is shown");
    assert!(
        page.body.contains("{\n  &quot;n&quot;: 1\n}"),
        "the payload, as JSON: {}",
        page.body
    );
    let action = format!("action=\"/jobs/{id}/retry\"");
    assert!(page.body.contains(&action), "a retry button: {}", page.body);

    let form = format!("csrf={}", page.csrf());
    let done = send(
        &router,
        post(&format!("/jobs/{id}/retry"), &form, &browser(&[])),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.header(header::LOCATION),
        format!("/jobs/{id}?notice=retried")
    );
    let job = store.get(id).await.expect("the job");
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.attempts, 0);
    let after = get(&router, &format!("/jobs/{id}?notice=retried")).await;
    assert!(after.body.contains("Queued again"), "{}", after.body);
    // Its reload drops the notice, which says what the press did, not what is now.
    assert!(
        after.body.contains(&format!(
            "http-equiv=\"refresh\" content=\"5; url=/jobs/{id}\""
        )),
        "{}",
        after.body
    );
    assert!(page.body.contains("http-equiv=\"refresh\" content=\"5\""));

    // Retrying it again is refused by the store: 409, nothing changes.
    let again = send(
        &router,
        post(&format!("/jobs/{id}/retry"), &form, &browser(&[])),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
}

#[tokio::test]
async fn cancel_pause_and_resume() {
    let store = memory().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let router = router(&store);
    let csrf = get(&router, "/").await.csrf();

    let cancelled = send(
        &router,
        post(
            &format!("/jobs/{id}/cancel"),
            &format!("csrf={csrf}"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(
        cancelled.status,
        StatusCode::SEE_OTHER,
        "{}",
        cancelled.body
    );
    assert_eq!(store.get(id).await.expect("job").state, JobState::Cancelled);

    let paused = send(
        &router,
        post(
            "/queue/pause",
            &format!("csrf={csrf}&queue=q"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER, "{}", paused.body);
    assert_eq!(
        paused.header(header::LOCATION),
        "/queue?name=q&notice=paused"
    );
    assert!(store.stats("q").await.expect("stats").paused);
    let page = get(&router, "/queue?name=q&notice=paused").await;
    assert!(page.body.contains("id=\"queue-paused\""), "{}", page.body);
    assert!(page.body.contains("action=\"/queue/resume\""));

    let resumed = send(
        &router,
        post(
            "/queue/resume",
            &format!("csrf={csrf}&queue=q"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(resumed.status, StatusCode::SEE_OTHER, "{}", resumed.body);
    assert!(!store.stats("q").await.expect("stats").paused);
}

#[tokio::test]
async fn every_dead_job_of_a_queue_is_retried_after_a_confirmation() {
    let store = memory().await;
    let mut dead = Vec::new();
    for _ in 0..3 {
        dead.push(dead_job(&store, "q", "boom").await);
    }
    let other = dead_job(&store, "other", "boom").await;
    let router = router(&store);

    let queue = get(&router, "/queue?name=q").await;
    assert!(queue.body.contains("href=\"/queue/retry-dead?name=q\""));
    let confirm = get(&router, "/queue/retry-dead?name=q").await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(
        confirm.body.contains("id=\"dead-count\">3<"),
        "{}",
        confirm.body
    );
    assert!(
        !confirm.body.contains("http-equiv=\"refresh\""),
        "a form stays put"
    );
    let csrf = confirm.csrf();

    // Without the confirmation: 400, and every job is still dead.
    let unconfirmed = send(
        &router,
        post(
            "/queue/retry-dead",
            &format!("csrf={csrf}&queue=q"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(unconfirmed.status, StatusCode::BAD_REQUEST);
    assert_eq!(store.stats("q").await.expect("stats").dead, 3);

    let done = send(
        &router,
        post(
            "/queue/retry-dead",
            &format!("csrf={csrf}&queue=q&confirm=yes"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.header(header::LOCATION),
        "/queue?name=q&notice=retried-dead&n=3&skipped=0"
    );
    for id in dead {
        assert_eq!(store.get(id).await.expect("job").state, JobState::Queued);
    }
    assert_eq!(
        store.get(other).await.expect("job").state,
        JobState::Dead,
        "another queue's dead job is left alone"
    );
    let page = get(&router, "/queue?name=q&notice=retried-dead&n=3&skipped=0").await;
    assert!(page.body.contains("Retried 3 dead jobs."), "{}", page.body);
}

/// A queue's page shows its limits on running jobs (CONTRACT K3) on a store with flow
/// control: none until set, then what was set.
#[tokio::test]
async fn a_queue_page_shows_its_limits() {
    let store = memory().await;
    store
        .enqueue(durq::NewJob::new("q"))
        .await
        .expect("enqueue");
    let router = router(&store);
    let before = get(&router, "/queue?name=q").await;
    assert!(
        before.body.contains("Limits: <strong>none</strong>"),
        "{}",
        before.body
    );
    store
        .set_limits(
            "q",
            durq::QueueLimits::new()
                .max_running(3)
                .max_running_per_key(1),
        )
        .await
        .expect("set_limits");
    let after = get(&router, "/queue?name=q").await;
    assert!(
        after.body.contains(
            "Limits: <strong>at most 3 running, at most 1 running per concurrency key</strong>"
        ),
        "{}",
        after.body
    );
}

#[tokio::test]
async fn the_job_page_shows_what_it_waits_for_and_its_steps() {
    let store = memory().await;
    let charge = store
        .enqueue(NewJob::new("charge"))
        .await
        .expect("enqueue")
        .id;
    let invoice = store
        .enqueue(NewJob::new("invoice"))
        .await
        .expect("enqueue")
        .id;
    let report = store
        .enqueue(NewJob::new("report").after(charge).after(invoice))
        .await
        .expect("enqueue")
        .id;
    // The charge runs, saves two steps and succeeds; the invoice is still queued.
    let claimed = store
        .claim(ClaimRequest::new(["charge"], "w", Duration::from_secs(30)))
        .await
        .expect("claim");
    let token = claimed.first().expect("the charge is claimed").token();
    for (step, output) in [("authorize", "\"auth-<1>\""), ("capture", "\"done\"")] {
        store
            .save_step(charge, token, step, output.as_bytes().to_vec().into())
            .await
            .expect("save a step");
    }
    store.complete(charge, token, None).await.expect("complete");
    let router = router(&store);

    let page = get(&router, &format!("/jobs/{report}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let section = page
        .body
        .split("id=\"waits-for\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no waits-for section: {}", page.body));
    assert!(
        section.contains("1 of 2 succeeded; if one fails: cancel"),
        "{section}"
    );
    for (id, state) in [(charge, "succeeded"), (invoice, "queued")] {
        let row = section
            .split(&format!("data-dependency=\"{id}\""))
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .unwrap_or_else(|| panic!("no row for {id}: {section}"));
        assert!(row.contains(state), "{id} is {state}: {row}");
    }
    assert!(
        !page.body.contains("id=\"steps\""),
        "the report saved no step"
    );

    let page = get(&router, &format!("/jobs/{charge}")).await;
    let section = page
        .body
        .split("id=\"steps\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no steps section: {}", page.body));
    assert!(section.contains("data-generation=\"0\""), "{section}");
    let (authorize, capture) = (
        section.find("data-step=\"authorize\""),
        section.find("data-step=\"capture\""),
    );
    assert!(
        authorize.is_some() && authorize < capture,
        "in save order: {section}"
    );
    assert!(section.contains("auth-&lt;1&gt;"), "escaped: {section}");
    assert!(
        !page.body.contains("id=\"waits-for\""),
        "the charge waits for nothing"
    );
}

/// A store of the memory backend whose jobs record their events (CONTRACT V1).
async fn recording() -> Store {
    let settings = durq::StoreSettings::default().record_events(10_000);
    durq::connect_with("memory://", settings)
        .await
        .expect("a memory store")
}

/// The events on `page` (rows `data-event`), in the page's order, with their kinds.
fn events_on(page: &common::Answer) -> Vec<(String, String)> {
    page.body
        .split("data-event=\"")
        .skip(1)
        .map(|row| {
            let cursor = row[..row.find('"').expect("the cursor ends")].to_owned();
            let kind = row
                .split("data-kind=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .expect("each row names its kind")
                .to_owned();
            (cursor, kind)
        })
        .collect()
}

/// Where `page` reloads to, `&amp;` decoded.
fn reload_of(page: &common::Answer) -> String {
    let start = page
        .body
        .find("http-equiv=\"refresh\" content=\"5; url=")
        .expect("the page reloads to an address")
        + "http-equiv=\"refresh\" content=\"5; url=".len();
    let rest = &page.body[start..];
    rest[..rest.find('"').expect("the address ends")].replace("&amp;", "&")
}

#[tokio::test]
async fn the_event_stream_shows_every_change_and_what_handlers_emit() {
    let store = recording().await;
    let first = store
        .enqueue(NewJob::new("orders"))
        .await
        .expect("enqueue")
        .id;
    let second = store
        .enqueue(NewJob::new("orders"))
        .await
        .expect("enqueue")
        .id;
    let claimed = store
        .claim(ClaimRequest::new(["orders"], "w", Duration::from_secs(30)).reserved(first))
        .await
        .expect("claim");
    let token = claimed.first().expect("the first job is claimed").token();
    store
        .emit(first, token, "charged", "{\"cents\":<1250>}".into())
        .await
        .expect("emit");
    store.complete(first, token, None).await.expect("complete");
    let router = router(&store);

    let page = get(&router, "/events").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let kinds: Vec<String> = events_on(&page).into_iter().map(|(_, kind)| kind).collect();
    assert_eq!(
        kinds,
        ["succeeded", "emitted", "started", "enqueued", "enqueued"],
        "every change, newest first: {}",
        page.body
    );
    for text in [
        format!("href=\"/jobs/{first}\""),
        format!("href=\"/jobs/{second}\""),
        "href=\"/queue?name=orders\"".to_owned(),
        "charged".to_owned(),
        // The handler's data, escaped.
        "{&quot;cents&quot;:&lt;1250&gt;}".to_owned(),
        "href=\"/events\"".to_owned(),
    ] {
        assert!(page.body.contains(&text), "lacks {text}: {}", page.body);
    }
    // The newest events follow the stream: the page reloads from before the first
    // event it shows, so it shows them again with what came since.
    assert_eq!(reload_of(&page), "/events?tail=0-0");
    let third = store
        .enqueue(NewJob::new("orders"))
        .await
        .expect("enqueue")
        .id;
    let reloaded = get(&router, &reload_of(&page)).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.body);
    assert_eq!(events_on(&reloaded).len(), 6);
    assert!(reloaded.body.contains(&format!("href=\"/jobs/{third}\"")));
}

#[tokio::test]
async fn the_newest_events_are_the_last_hundred_and_the_reload_reads_on() {
    let store = recording().await;
    let batch: Vec<NewJob> = (0..150).map(|_| NewJob::new("q")).collect();
    store.enqueue_batch(batch).await.expect("enqueue 150");
    let all = store
        .events(durq::stream::EventCursor::START, 1_000)
        .await
        .expect("read the stream")
        .events;
    assert_eq!(all.len(), 150);
    let router = router(&store);

    let page = get(&router, "/events").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let shown: Vec<String> = events_on(&page).into_iter().map(|(c, _)| c).collect();
    let newest: Vec<String> = all[50..]
        .iter()
        .rev()
        .map(|e| e.cursor.to_string())
        .collect();
    assert_eq!(shown, newest, "the newest 100, newest first");
    assert_eq!(reload_of(&page), format!("/events?tail={}", all[49].cursor));

    // Twenty more: the reload shows the newest 100 again, read from its cursor on.
    let batch: Vec<NewJob> = (0..20).map(|_| NewJob::new("q")).collect();
    store.enqueue_batch(batch).await.expect("enqueue 20");
    let all = store
        .events(durq::stream::EventCursor::START, 1_000)
        .await
        .expect("read the stream")
        .events;
    let reloaded = get(&router, &reload_of(&page)).await;
    let shown: Vec<String> = events_on(&reloaded).into_iter().map(|(c, _)| c).collect();
    let newest: Vec<String> = all[70..]
        .iter()
        .rev()
        .map(|e| e.cursor.to_string())
        .collect();
    assert_eq!(shown, newest);
    assert_eq!(
        reload_of(&reloaded),
        format!("/events?tail={}", all[69].cursor)
    );
}

#[tokio::test]
async fn a_stream_longer_than_one_walk_is_caught_up_with_reload_by_reload() {
    // More events than one request walks (50 reads of 1,000).
    const WALKED: usize = 50_000;
    let store = recording().await;
    for _ in 0..51 {
        let batch: Vec<NewJob> = (0..1_000).map(|_| NewJob::new("q")).collect();
        store.enqueue_batch(batch).await.expect("enqueue 1,000");
    }
    let mut all = Vec::new();
    let mut after = durq::stream::EventCursor::START;
    loop {
        let page = store.events(after, 1_000).await.expect("read the stream");
        if page.events.is_empty() {
            break;
        }
        after = page.next;
        all.extend(
            page.events
                .into_iter()
                .map(|event| event.cursor.to_string()),
        );
    }
    assert_eq!(all.len(), 51_000);
    let router = router(&store);

    let page = get(&router, "/events").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("id=\"catching-up\""), "{}", page.body);
    let shown: Vec<String> = events_on(&page).into_iter().map(|(c, _)| c).collect();
    let walked: Vec<String> = all[WALKED - 100..WALKED].iter().rev().cloned().collect();
    assert_eq!(shown, walked, "the last 100 the walk read");
    assert_eq!(
        reload_of(&page),
        format!("/events?tail={}", all[WALKED - 101])
    );

    let reloaded = get(&router, &reload_of(&page)).await;
    assert!(!reloaded.body.contains("id=\"catching-up\""), "caught up");
    let shown: Vec<String> = events_on(&reloaded).into_iter().map(|(c, _)| c).collect();
    let newest: Vec<String> = all[all.len() - 100..].iter().rev().cloned().collect();
    assert_eq!(shown, newest);
}

#[tokio::test]
async fn the_stream_read_page_by_page_shows_each_event_once_and_says_when_it_was_trimmed() {
    let store = recording().await;
    let batch: Vec<NewJob> = (0..230).map(|_| NewJob::new("q")).collect();
    store.enqueue_batch(batch).await.expect("enqueue 230");
    let router = router(&store);

    let mut seen = Vec::new();
    let mut uri = Some("/events?after=0-0".to_owned());
    let mut pages = 0;
    while let Some(at) = uri.take() {
        let page = get(&router, &at).await;
        assert_eq!(page.status, StatusCode::OK, "{at}: {}", page.body);
        assert!(!page.body.contains("id=\"trimmed\""), "nothing was trimmed");
        seen.extend(events_on(&page).into_iter().map(|(cursor, _)| cursor));
        uri = next_page(&page);
        pages += 1;
        // A full page is still; the last, which new events extend, reloads itself.
        assert_eq!(
            page.body.contains("http-equiv=\"refresh\""),
            uri.is_none(),
            "{at}"
        );
        assert!(pages <= 3, "{seen:?}");
    }
    let all: Vec<String> = store
        .events(durq::stream::EventCursor::START, 1_000)
        .await
        .expect("read the stream")
        .events
        .iter()
        .map(|event| event.cursor.to_string())
        .collect();
    assert_eq!(seen.len(), all.len(), "{seen:?}");
    assert_eq!(seen, all, "every event once, in order");

    assert_eq!(store.trim_events(10).await.expect("trim"), 220);
    let page = get(&router, "/events?after=0-0").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("id=\"trimmed\""), "{}", page.body);
    assert_eq!(events_on(&page).len(), 10);
}

#[tokio::test]
async fn the_event_pages_say_when_nothing_was_recorded_and_refuse_bad_cursors() {
    let store = recording().await;
    let router = router(&store);
    let empty = get(&router, "/events").await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert!(empty.body.contains("id=\"no-events\""), "{}", empty.body);
    for bad in [
        "/events?after=x",
        "/events?tail=1",
        "/events?after=1-2-3",
        "/events?after=0-0&tail=0-0",
        "/events?limit=5",
    ] {
        let page = get(&router, bad).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{bad}: {}", page.body);
    }
}
