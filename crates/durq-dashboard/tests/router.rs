//! The dashboard's router over a real store (memory, and SQLite where the store's own
//! behaviour matters), request by request with `oneshot`: what the pages show, what the
//! actions do, and every refusal, each checked to have written nothing.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use common::{dead_job, get, listed, next_page, post, send, SAME_ORIGIN};
use durq::layers::{Backend, LayeredBackend};
use durq::worker_calls::{ClaimRequest, Retry};
use durq::{JobState, ListPage, ListQuery, NewJob, Store, WorkerInfo};
use durq_dashboard::Dashboard;

async fn memory() -> Store {
    durq::connect("memory://").await.expect("a memory store")
}

fn router(store: &Store) -> Router {
    Dashboard::new(store.clone()).router()
}

/// `headers` plus a browser's same-origin headers.
fn browser<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut headers = SAME_ORIGIN.to_vec();
    headers.extend_from_slice(extra);
    headers
}

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

/// A layer over a store's backend that counts `list` calls and caps each page at
/// `cap` jobs, as a backend that bounds the work of one call ends a page early with
/// `next` set (CONTRACT A4).
#[derive(Debug)]
struct ShortPages {
    inner: Arc<dyn Backend>,
    cap: usize,
    reads: Arc<AtomicUsize>,
}

#[durq::layers::async_trait]
impl LayeredBackend for ShortPages {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn list(&self, mut query: ListQuery) -> durq::Result<ListPage> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        query.limit = query.limit.min(self.cap);
        self.inner.require_inspect()?.list(query).await
    }
}

/// `store` seen through [`ShortPages`], and its count of `list` calls.
fn short_pages(store: Store, cap: usize) -> (Store, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    let store = store.layer(move |inner: Arc<dyn Backend>| -> Arc<dyn Backend> {
        Arc::new(ShortPages {
            inner,
            cap,
            reads: Arc::clone(&counted),
        })
    });
    (store, reads)
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
        format!("jobs_workers{{namespace=\"{namespace}\"}} 0"),
        "# EOF".to_owned(),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "{expected} missing:\n{}",
            scrape.body
        );
    }
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
