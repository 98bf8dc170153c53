use super::*;

/// Every action, each in a form that is wrong in one way: none writes.
#[tokio::test]
async fn refused_actions_write_nothing() {
    let store = memory().await;
    let dead = dead_job(&store, "q", "boom").await;
    let queued = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let router = router(&store);
    let csrf = get(&router, "/").await.csrf();
    let retry = format!("/jobs/{dead}/retry");
    let cancel = format!("/jobs/{queued}/cancel");
    let good = format!("csrf={csrf}");
    let good_queue = format!("csrf={csrf}&queue=q");
    let good_all = format!("csrf={csrf}&queue=q&confirm=yes");
    let cross_site = [
        ("origin", "http://evil.test"),
        ("sec-fetch-site", "cross-site"),
    ];
    let other_origin = [("origin", "http://127.0.0.1:9999")];

    let cases: Vec<(&str, Request<Body>, StatusCode)> = vec![
        // No CSRF token, a wrong one, one cut short.
        (
            "no csrf",
            post(&retry, "", &browser(&[])),
            StatusCode::FORBIDDEN,
        ),
        (
            "wrong csrf",
            post(&retry, "csrf=0000", &browser(&[])),
            StatusCode::FORBIDDEN,
        ),
        (
            "short csrf",
            post(&cancel, &good[..good.len() - 1], &browser(&[])),
            StatusCode::FORBIDDEN,
        ),
        // From another site, even with the right token.
        (
            "cross-site",
            post(&retry, &good, &cross_site),
            StatusCode::FORBIDDEN,
        ),
        (
            "other origin",
            post("/queue/pause", &good_queue, &other_origin),
            StatusCode::FORBIDDEN,
        ),
        (
            "same-site",
            post(&cancel, &good, &[("sec-fetch-site", "same-site")]),
            StatusCode::FORBIDDEN,
        ),
        // Bad inputs.
        (
            "bad id",
            post("/jobs/nope/retry", &good, &browser(&[])),
            StatusCode::BAD_REQUEST,
        ),
        (
            "v4 id",
            post(
                "/jobs/00000000-0000-4000-8000-000000000000/cancel",
                &good,
                &browser(&[]),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad queue",
            post("/queue/pause", &format!("{good}&queue=a+b"), &browser(&[])),
            StatusCode::BAD_REQUEST,
        ),
        (
            "no queue",
            post("/queue/pause", &good, &browser(&[])),
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown field",
            post(&retry, &format!("{good}&state=dead"), &browser(&[])),
            StatusCode::BAD_REQUEST,
        ),
        (
            "field twice",
            post(
                "/queue/pause",
                &format!("{good_queue}&queue=r"),
                &browser(&[]),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "confirm=no",
            post(
                "/queue/retry-dead",
                &format!("{good_queue}&confirm=no"),
                &browser(&[]),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "retry-dead bad queue",
            post(
                "/queue/retry-dead",
                &format!("{good}&queue=%3Cx%3E&confirm=yes"),
                &browser(&[]),
            ),
            StatusCode::BAD_REQUEST,
        ),
        // Not a form.
        (
            "json body",
            {
                let mut request = post(&retry, "{\"csrf\":\"x\"}", &browser(&[]));
                request.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                request
            },
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "huge body",
            post(
                "/queue/retry-dead",
                &format!("{good_all}&x={}", "a".repeat(64 * 1024)),
                &browser(&[]),
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (what, request, status) in cases {
        let answer = send(&router, request).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
    }
    // A GET never acts.
    let get_retry = get(&router, &retry).await;
    assert_eq!(get_retry.status, StatusCode::METHOD_NOT_ALLOWED);

    assert_eq!(store.get(dead).await.expect("job").state, JobState::Dead);
    assert_eq!(
        store.get(queued).await.expect("job").state,
        JobState::Queued
    );
    assert!(store.paused_queues().await.expect("paused").is_empty());
}

#[tokio::test]
async fn a_read_only_dashboard_shows_no_action_and_refuses_every_one() {
    let store = memory().await;
    let dead = dead_job(&store, "q", "boom").await;
    let router = Dashboard::new(store.clone()).read_only(true).router();
    for uri in [
        "/".to_owned(),
        format!("/jobs/{dead}"),
        "/queue?name=q".to_owned(),
    ] {
        let page = get(&router, &uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}");
        assert!(
            !page.body.contains("method=\"post\""),
            "{uri}: {}",
            page.body
        );
        assert!(page.body.contains("read-only"), "{uri}");
    }
    // Even with a CSRF token lifted from another dashboard's page, nothing passes.
    let csrf = get(&Dashboard::new(store.clone()).router(), "/")
        .await
        .csrf();
    for (path, form) in [
        (format!("/jobs/{dead}/retry"), format!("csrf={csrf}")),
        (format!("/jobs/{dead}/cancel"), format!("csrf={csrf}")),
        (
            format!("/jobs/{dead}/retry-from"),
            format!("csrf={csrf}&step=s&generation=0"),
        ),
        ("/queue/pause".to_owned(), format!("csrf={csrf}&queue=q")),
        ("/queue/resume".to_owned(), format!("csrf={csrf}&queue=q")),
        (
            "/queue/retry-dead".to_owned(),
            format!("csrf={csrf}&queue=q&confirm=yes"),
        ),
        ("/login".to_owned(), format!("csrf={csrf}&token=x")),
    ] {
        let answer = send(&router, post(&path, &form, &browser(&[]))).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{path}: {}",
            answer.body
        );
    }
    let confirm = get(&router, "/queue/retry-dead?name=q").await;
    assert_eq!(confirm.status, StatusCode::FORBIDDEN);
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Dead);
    assert!(store.paused_queues().await.expect("paused").is_empty());
}

#[tokio::test]
async fn a_token_guards_actions_through_a_login_cookie_or_a_bearer_header() {
    let store = memory().await;
    let dead = dead_job(&store, "q", "boom").await;
    let router = Dashboard::new(store.clone())
        .token(Some("correct horse".into()))
        .router();
    let page = get(&router, &format!("/jobs/{dead}")).await;
    assert_eq!(page.status, StatusCode::OK, "reads need no token");
    assert!(
        !page.body.contains("/retry\""),
        "no action without the token"
    );
    assert!(page.body.contains("Log in to act"));
    assert!(!page.body.contains("name=\"csrf\""), "no form to post");
    let csrf = get(&router, "/login").await.csrf();

    let retry = format!("/jobs/{dead}/retry");
    let anonymous = send(
        &router,
        post(&retry, &format!("csrf={csrf}"), &browser(&[])),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong_bearer = send(
        &router,
        post(&retry, "", &[("authorization", "Bearer wrong")]),
    )
    .await;
    assert_eq!(wrong_bearer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Dead);

    // A wrong token at the login form: 403 and no cookie.
    let login = get(&router, "/login").await;
    assert!(login.body.contains("type=\"password\""));
    assert!(
        !login.body.contains("http-equiv=\"refresh\""),
        "a form stays put"
    );
    let refused = send(
        &router,
        post("/login", &format!("csrf={csrf}&token=guess"), &browser(&[])),
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.headers.get(header::SET_COOKIE).is_none());
    // Without the CSRF token the login is refused too.
    let forged = send(
        &router,
        post("/login", "token=correct+horse", &browser(&[])),
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);

    let logged_in = send(
        &router,
        post(
            "/login",
            &format!("csrf={csrf}&token=correct+horse"),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(
        logged_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        logged_in.body
    );
    let cookie = logged_in.header(header::SET_COOKIE).to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(cookie.contains("Path=/;"), "{cookie}");
    assert!(
        !cookie.contains("correct"),
        "the cookie does not spell the token out"
    );
    let cookie_pair = cookie.split(';').next().expect("name=value").to_owned();

    // The cookie opens the actions, still with the CSRF token.
    let page = send(
        &router,
        Request::get(format!("/jobs/{dead}"))
            .header(header::COOKIE, &cookie_pair)
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert!(page
        .body
        .contains(&format!("action=\"/jobs/{dead}/retry\"")));
    let no_csrf = send(
        &router,
        post(&retry, "", &browser(&[("cookie", &cookie_pair)])),
    )
    .await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    let with_cookie = send(
        &router,
        post(
            &retry,
            &format!("csrf={csrf}"),
            &browser(&[("cookie", &cookie_pair)]),
        ),
    )
    .await;
    assert_eq!(
        with_cookie.status,
        StatusCode::SEE_OTHER,
        "{}",
        with_cookie.body
    );
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Queued);

    // A script sends the token as a bearer header, and needs no CSRF token.
    let scripted = send(
        &router,
        Request::post("/queue/pause")
            .header(header::AUTHORIZATION, "Bearer correct horse")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("queue=q"))
            .expect("request"),
    )
    .await;
    assert_eq!(scripted.status, StatusCode::SEE_OTHER, "{}", scripted.body);
    assert!(store.stats("q").await.expect("stats").paused);

    let logout = send(
        &router,
        post(
            "/logout",
            &format!("csrf={csrf}"),
            &browser(&[("cookie", &cookie_pair)]),
        ),
    )
    .await;
    assert_eq!(logout.status, StatusCode::SEE_OTHER);
    assert!(logout.header(header::SET_COOKIE).contains("Max-Age=0"));
}

#[tokio::test]
async fn metrics_are_the_queues_depth_and_lag_at_scrape_time() {
    let store = memory().await;
    store.enqueue(NewJob::new("emails")).await.expect("enqueue");
    store.enqueue(NewJob::new("emails")).await.expect("enqueue");
    dead_job(&store, "emails", "boom").await;
    store.pause("idle").await.expect("pause");
    store
        .set_limits(
            "emails",
            durq::QueueLimits::new()
                .max_running_per_key(2)
                .max_starts(durq::Rate::new(30, std::time::Duration::from_secs(60))),
        )
        .await
        .expect("set_limits");
    // A queue whose one key is at its running limit and whose rate is used up.
    store
        .set_limits(
            "keyed",
            durq::QueueLimits::new()
                .max_running_per_key(1)
                .max_starts(durq::Rate::new(1, std::time::Duration::from_secs(3_600))),
        )
        .await
        .expect("set_limits");
    for _ in 0..2 {
        store
            .enqueue(NewJob::new("keyed").concurrency_key("acme"))
            .await
            .expect("enqueue");
    }
    let held = store
        .claim(ClaimRequest::new(["keyed"], "w", std::time::Duration::from_secs(60)).limit(2))
        .await
        .expect("claim");
    assert_eq!(held.len(), 1);
    let router = router(&store);
    let scrape = get(&router, "/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(scrape
        .header(header::CONTENT_TYPE)
        .starts_with("application/openmetrics-text; version=1.0.0"));
    let namespace = store.settings().namespace.clone();
    let lines: Vec<&str> = scrape.body.lines().collect();
    for expected in [
        "# TYPE jobs_queue_depth gauge".to_owned(),
        format!("jobs_queue_depth{{namespace=\"{namespace}\",queue=\"emails\",state=\"ready\"}} 2"),
        format!("jobs_queue_depth{{namespace=\"{namespace}\",queue=\"emails\",state=\"dead\"}} 1"),
        format!(
            "jobs_queue_depth{{namespace=\"{namespace}\",queue=\"emails\",state=\"running\"}} 0"
        ),
        format!("jobs_queue_depth{{namespace=\"{namespace}\",queue=\"idle\",state=\"ready\"}} 0"),
        "# TYPE jobs_queue_lag_seconds gauge".to_owned(),
        format!("jobs_queue_lag_seconds{{namespace=\"{namespace}\",queue=\"idle\"}} 0.0"),
        format!("jobs_queue_paused{{namespace=\"{namespace}\",queue=\"idle\"}} 1"),
        format!("jobs_queue_paused{{namespace=\"{namespace}\",queue=\"emails\"}} 0"),
        format!(
            "jobs_queue_limit{{namespace=\"{namespace}\",queue=\"emails\",limit=\"max_running_per_key\"}} 2"
        ),
        format!(
            "jobs_queue_rate_limit{{namespace=\"{namespace}\",queue=\"emails\",limit=\"max_starts\"}} 0.5"
        ),
        format!("jobs_queue_keys_at_limit{{namespace=\"{namespace}\",queue=\"keyed\"}} 1"),
        format!("jobs_queue_keys_at_limit{{namespace=\"{namespace}\",queue=\"emails\"}} 0"),
        format!("jobs_workers{{namespace=\"{namespace}\"}} 0"),
        "# EOF".to_owned(),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "{expected} missing:\n{}",
            scrape.body
        );
    }
    let waits = |queue: &str| -> f64 {
        let prefix =
            format!("jobs_queue_rate_wait_seconds{{namespace=\"{namespace}\",queue=\"{queue}\"}} ");
        lines
            .iter()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no rate wait for {queue}:\n{}", scrape.body))
    };
    let keyed = waits("keyed");
    assert!(
        (3_590.0..=3_600.0).contains(&keyed),
        "the next start of a used-up rate of 1 per hour: {keyed}"
    );
    assert_eq!(waits("emails"), 0.0, "a rate with room admits a start now");
    assert!(
        !scrape.body.contains("limit=\"max_running\""),
        "a limit that is not set has no series:\n{}",
        scrape.body
    );
    let lag_prefix =
        format!("jobs_queue_lag_seconds{{namespace=\"{namespace}\",queue=\"emails\"}} ");
    let lag = lines
        .iter()
        .find_map(|l| l.strip_prefix(lag_prefix.as_str()))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the lag of emails");
    assert!(lag >= 0.0);
    // The next scrape reads the store again.
    store.enqueue(NewJob::new("emails")).await.expect("enqueue");
    let again = get(&router, "/metrics").await;
    assert!(again.body.contains(&format!(
        "jobs_queue_depth{{namespace=\"{namespace}\",queue=\"emails\",state=\"ready\"}} 3"
    )));
}

#[tokio::test]
async fn a_nested_dashboard_links_and_redirects_under_its_path() {
    let store = memory().await;
    let dead = dead_job(&store, "q", "boom").await;
    let app: Router = Router::new().nest("/admin/jobs", Dashboard::new(store.clone()).router());
    let overview = get(&app, "/admin/jobs").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(overview
        .body
        .contains("href=\"/admin/jobs/assets/dashboard.css\""));
    assert!(overview.body.contains("href=\"/admin/jobs/queue?name=q\""));
    assert!(!overview.body.contains("href=\"/jobs"), "{}", overview.body);
    let css = get(&app, "/admin/jobs/assets/dashboard.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.header(header::CONTENT_TYPE).starts_with("text/css"));
    let detail = get(&app, &format!("/admin/jobs/jobs/{dead}")).await;
    assert!(detail
        .body
        .contains(&format!("action=\"/admin/jobs/jobs/{dead}/retry\"")));
    let done = send(
        &app,
        post(
            &format!("/admin/jobs/jobs/{dead}/retry"),
            &format!("csrf={}", detail.csrf()),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.header(header::LOCATION),
        format!("/admin/jobs/jobs/{dead}?notice=retried")
    );
    let missing = get(&app, "/admin/jobs/nowhere").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.body.contains("href=\"/admin/jobs\""),
        "{}",
        missing.body
    );
}

#[tokio::test]
async fn the_charts_fill_from_samples_taken_in_the_background() {
    let store = memory().await;
    store.enqueue(NewJob::new("q")).await.expect("enqueue");
    let router = Dashboard::new(store.clone())
        .sample_interval(Duration::from_millis(100))
        .router();
    let first = get(&router, "/").await;
    assert!(first.body.contains("Collecting samples") || first.body.contains("<polyline"));
    // The first request started the sampler: within a few samples the lag line of q
    // is drawn. Bounded by a generous deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = get(&router, "/queue?name=q").await;
        if page.body.matches("<polyline").count() >= 2 {
            break; // throughput and lag both have two points or more
        }
        assert!(
            Instant::now() < deadline,
            "no chart after 30 s: {}",
            page.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn pages_of_a_sqlite_store() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = durq::connect(&url).await.expect("an SQLite store");
    let dead = dead_job(&store, "q", "boom").await;
    let child = store
        .enqueue(NewJob::new("q").parent(dead))
        .await
        .expect("enqueue")
        .id;
    let router = router(&store);
    let detail = get(&router, &format!("/jobs/{dead}")).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert!(
        detail.body.contains(&format!("href=\"/jobs/{child}\"")),
        "its child"
    );
    let child_page = get(&router, &format!("/jobs/{child}")).await;
    assert!(
        child_page.body.contains(&format!("href=\"/jobs/{dead}\"")),
        "its parent"
    );
    let done = send(
        &router,
        post(
            &format!("/jobs/{dead}/retry"),
            &format!("csrf={}", detail.csrf()),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Queued);
}

/// Guessing the token online is throttled (issue #30): after five wrong tokens, at the
/// login form or as a bearer header, every attempt is refused with 429 before its token
/// is compared, a right one too, so a guess learns nothing; a browser already logged in
/// keeps acting. Told it is served over TLS, the dashboard marks its cookie `Secure`.
#[tokio::test]
async fn wrong_tokens_are_throttled_and_a_logged_in_browser_is_not() {
    let store = memory().await;
    let dead = dead_job(&store, "q", "boom").await;
    let router = Dashboard::new(store.clone())
        .token(Some("correct horse".into()))
        .secure_cookie(true)
        .router();
    let csrf = get(&router, "/login").await.csrf();
    let login = |token: &str| {
        post(
            "/login",
            &format!("csrf={csrf}&token={token}"),
            &browser(&[]),
        )
    };
    let logged_in = send(&router, login("correct+horse")).await;
    assert_eq!(
        logged_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        logged_in.body
    );
    let cookie = logged_in.header(header::SET_COOKIE).to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let cookie_pair = cookie.split(';').next().expect("name=value").to_owned();

    for guess in ["a", "b", "c", "d"] {
        assert_eq!(
            send(&router, login(guess)).await.status,
            StatusCode::FORBIDDEN
        );
    }
    let bearer = |token: &str| {
        Request::post("/queue/pause")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("queue=q"))
            .expect("request")
    };
    assert_eq!(
        send(&router, bearer("e")).await.status,
        StatusCode::UNAUTHORIZED,
        "the fifth wrong token"
    );
    let throttled = send(&router, login("f")).await;
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        throttled.body.contains("try again in"),
        "{}",
        throttled.body
    );
    assert_eq!(
        send(&router, login("correct+horse")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a right token is refused alike while guessing is throttled"
    );
    assert_eq!(
        send(&router, bearer("correct horse")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(!store.stats("q").await.expect("stats").paused);

    // The browser logged in before keeps acting.
    let retried = send(
        &router,
        post(
            &format!("/jobs/{dead}/retry"),
            &format!("csrf={csrf}"),
            &browser(&[("cookie", &cookie_pair)]),
        ),
    )
    .await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER, "{}", retried.body);
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Queued);
}

/// The queue page shows what the limits hold back (CONTRACT K3) and a form that sets
/// them: saved as given, a bad count or rate refused with 400 and nothing written, all
/// fields empty removing them; a read-only dashboard shows no form.
#[tokio::test]
async fn the_queue_page_shows_and_sets_a_queues_limits() {
    let store = memory().await;
    let router = router(&store);
    store
        .set_limits("q", durq::QueueLimits::new().max_running_per_key(1))
        .await
        .expect("set_limits");
    store
        .enqueue(durq::NewJob::new("q").concurrency_key("acme"))
        .await
        .expect("enqueue");
    let held = store
        .claim(ClaimRequest::new(
            ["q"],
            "w",
            std::time::Duration::from_secs(60),
        ))
        .await
        .expect("claim");
    assert_eq!(held.len(), 1);
    let page = get(&router, "/queue?name=q").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("id=\"limits-form\""), "{}", page.body);
    assert!(
        page.body.contains("acme</span> (1 running)"),
        "the key at its limit is shown: {}",
        page.body
    );
    let csrf = page.csrf();

    let form = format!(
        "csrf={csrf}&queue=q&max_running=20&max_running_per_key=2&max_starts=10%2F1s\
         &max_starts_per_key=&fair_shares=on"
    );
    let saved = send(&router, post("/queue/limits", &form, &browser(&[]))).await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    assert_eq!(
        store.limits("q").await.expect("limits"),
        durq::QueueLimits::new()
            .max_running(20)
            .max_running_per_key(2)
            .max_starts(durq::Rate::new(10, std::time::Duration::from_secs(1)))
            .fair_shares(true)
    );
    for bad in [
        "max_running=0",
        "max_running=many",
        "max_starts=10",
        "max_starts_per_key=0%2F1s",
    ] {
        let refused = send(
            &router,
            post(
                "/queue/limits",
                &format!("csrf={csrf}&queue=q&{bad}"),
                &browser(&[]),
            ),
        )
        .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            store.limits("q").await.expect("limits").max_running,
            Some(20),
            "{bad}: a refused form writes nothing"
        );
    }
    let cleared = send(
        &router,
        post(
            "/queue/limits",
            &format!("csrf={csrf}&queue=q&max_running="),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(cleared.status, StatusCode::SEE_OTHER);
    assert!(store.limits("q").await.expect("limits").is_unlimited());

    let read_only = Dashboard::new(store.clone()).read_only(true).router();
    let page = get(&read_only, "/queue?name=q").await;
    assert!(!page.body.contains("limits-form"));
}

/// A finished job's page offers to run it again from each of its durable steps; the
/// form carries the generation the page showed, so a second reopen from the same
/// page is refused (CONTRACT D4) and writes nothing.
#[tokio::test]
async fn a_job_is_reopened_from_a_step_with_the_generation_its_page_showed() {
    let store = memory().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)))
        .await
        .expect("claim");
    let token = claimed.first().expect("the job is claimed").token();
    for step in ["charge", "email"] {
        store
            .save_step(id, token, step, b"\"done\"".to_vec().into())
            .await
            .expect("save a step");
    }
    let router = router(&store);
    let running = get(&router, &format!("/jobs/{id}")).await;
    assert!(
        !running.body.contains("retry-from"),
        "a running job is not offered a reopen: {}",
        running.body
    );
    store.complete(id, token, None).await.expect("complete");
    let page = get(&router, &format!("/jobs/{id}")).await;
    assert!(
        page.body
            .contains(&format!("action=\"/jobs/{id}/retry-from\"")),
        "{}",
        page.body
    );
    let form = format!("csrf={}&step=email&generation=0", page.csrf());
    let reopen = format!("/jobs/{id}/retry-from");

    let done = send(&router, post(&reopen, &form, &browser(&[]))).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(done.header(header::LOCATION).contains("notice=reopened"));
    assert_eq!(store.get(id).await.expect("get").state, JobState::Queued);
    let log = store.steps(id).await.expect("steps");
    let names: Vec<_> = log.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((log.generation, names), (1, vec!["charge"]));

    // The same form again: the job is queued now (not ended); once it has ended again,
    // the generation the old page showed is stale. Neither writes.
    let again = send(&router, post(&reopen, &form, &browser(&[]))).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)))
        .await
        .expect("claim");
    let token = claimed.first().expect("the job is claimed again").token();
    store.complete(id, token, None).await.expect("complete");
    let stale = send(&router, post(&reopen, &form, &browser(&[]))).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert!(stale.body.contains("generation 1"), "{}", stale.body);
    assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);
    let bad = send(
        &router,
        post(
            &reopen,
            &format!("csrf={}&step=email&generation=x", page.csrf()),
            &browser(&[]),
        ),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}
