//! The dashboard's pages over the Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`) and the PostgreSQL at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), each in a namespace of its own that is
//! removed at the end, passed or failed. A server that is unreachable skips its test
//! loudly, or fails it under `JOBS_REQUIRE_SERVICES=1`.

mod common;

use std::future::Future;
use std::time::Duration;

use axum::http::StatusCode;
use common::{
    dead_job, get, listed, next_page, post, send, skip_or_fail, unique_namespace, SAME_ORIGIN,
};
use durq::{JobState, NewJob, Schedule, Store, StoreSettings, WorkerInfo};
use durq_dashboard::Dashboard;

/// Every page over `store`, and one action.
async fn pages_over(store: Store) {
    store
        .enqueue(NewJob::new("emails").payload("hello <you>"))
        .await
        .expect("enqueue");
    let dead = dead_job(&store, "emails", "smtp said <no>").await;
    let child = store
        .enqueue(NewJob::new("emails").parent(dead))
        .await
        .expect("enqueue")
        .id;
    store.pause("idle").await.expect("pause");
    let worker = WorkerInfo::new("w-dash", "box-9", 7, vec!["emails".into()], 4);
    store.register_worker(&worker).await.expect("register");
    let tagged = |queue: &str, customer: &str| {
        let job = NewJob::new(queue).tenant("acme").tag("customer", customer);
        let store = store.clone();
        async move { store.enqueue(job).await.expect("enqueue a tagged job").id }
    };
    let tagged_a = tagged("tagged.a", "42").await;
    let tagged_b = tagged("tagged.b", "42").await;
    let tagged_420 = tagged("tagged.b", "420").await;
    let other = tagged("other", "42").await;
    let tick = Schedule::every("tick", Duration::from_secs(3600), NewJob::new("emails"));
    store.put_schedule(&tick).await.expect("put a schedule");
    let router = Dashboard::new(store.clone()).router();

    let ns = store.settings().namespace.clone();
    let checks: Vec<(String, Vec<String>)> = vec![
        (
            "/".into(),
            vec![
                "data-queue=\"emails\"".into(),
                "data-queue=\"idle\"".into(),
                "badge paused".into(),
                "box-9".into(),
            ],
        ),
        (
            "/queue?name=emails".into(),
            vec!["data-count=\"dead\"".into(), "tick".into(), "w-dash".into()],
        ),
        (
            "/jobs?queue=emails&state=dead".into(),
            vec![format!("data-job=\"{dead}\"")],
        ),
        (
            "/jobs?queue=emails&limit=1".into(),
            vec!["id=\"next-page\"".into()],
        ),
        (
            "/jobs?prefix=tagged.&tag=customer%3D42&tenant=acme&state=queued".into(),
            vec![
                format!("data-job=\"{tagged_a}\""),
                format!("data-job=\"{tagged_b}\""),
                "data-tag=\"customer=42\"".into(),
            ],
        ),
        (
            "/jobs?tag=customer%3D42&limit=1".into(),
            vec![
                "id=\"next-page\"".into(),
                "tag=customer%3D42&amp;limit=1".into(),
            ],
        ),
        (
            format!("/jobs/{dead}"),
            vec![
                "data-attempt=\"1\" data-outcome=\"failed\"".into(),
                "<summary>smtp said &lt;no&gt;</summary>".into(),
                "test-worker".into(),
                "smtp said &lt;no&gt;".into(),
                format!("href=\"/jobs/{child}\""),
                "data-state=\"dead\"".into(),
            ],
        ),
        ("/workers".into(), vec!["w-dash".into()]),
        ("/schedules".into(), vec!["tick".into(), "every 1h".into()]),
        (
            "/metrics".into(),
            vec![
                format!("jobs_queue_depth{{namespace=\"{ns}\",queue=\"emails\",state=\"dead\"}} 1"),
                format!(
                    "jobs_queue_depth{{namespace=\"{ns}\",queue=\"emails\",state=\"ready\"}} 2"
                ),
                format!("jobs_queue_paused{{namespace=\"{ns}\",queue=\"idle\"}} 1"),
                format!("jobs_workers{{namespace=\"{ns}\"}} 1"),
            ],
        ),
    ];
    // Across queues by tag: neither a value that only starts with the one asked for
    // nor a queue outside the prefix is listed.
    let by_tag = get(&router, "/jobs?prefix=tagged.&tag=customer%3D42").await;
    assert_eq!(by_tag.status, StatusCode::OK, "{}", by_tag.body);
    for unwanted in [tagged_420, other, dead] {
        assert!(
            !by_tag.body.contains(&format!("data-job=\"{unwanted}\"")),
            "{unwanted} listed: {}",
            by_tag.body
        );
    }
    // Page by page, every job tagged customer=42, each once.
    let mut seen = Vec::new();
    let mut uri = Some("/jobs?tag=customer%3D42&limit=1".to_owned());
    while let Some(at) = uri.take() {
        let page = get(&router, &at).await;
        assert_eq!(page.status, StatusCode::OK, "{at}: {}", page.body);
        seen.extend(listed(&page, &[tagged_a, tagged_b, tagged_420, other]));
        uri = next_page(&page);
        assert!(seen.len() <= 3, "{seen:?}");
    }
    assert_eq!(seen, [other, tagged_b, tagged_a], "newest first, each once");
    let refused = get(&router, "/jobs?tag=customer").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);

    for (uri, wanted) in checks {
        let page = get(&router, &uri).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
        for text in wanted {
            assert!(
                page.body.contains(&text),
                "{uri} lacks {text}: {}",
                page.body
            );
        }
    }

    // The event stream, read by the store, then by the page: the page reads later, so
    // it shows at least those (on PostgreSQL a read may answer only the events below
    // the cluster's horizon, which only moves forward, CONTRACT V2).
    let recorded = store
        .events(durq::stream::EventCursor::START, 1_000)
        .await
        .expect("read the event stream")
        .events;
    let stream = get(&router, "/events").await;
    assert_eq!(stream.status, StatusCode::OK, "{}", stream.body);
    for event in &recorded {
        let row = format!(
            "data-event=\"{}\" data-kind=\"{}\"",
            event.cursor, event.kind
        );
        assert!(stream.body.contains(&row), "lacks {row}: {}", stream.body);
    }

    let csrf = get(&router, "/").await.csrf();
    let retried = send(
        &router,
        post(
            &format!("/jobs/{dead}/retry"),
            &format!("csrf={csrf}"),
            &SAME_ORIGIN,
        ),
    )
    .await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER, "{}", retried.body);
    assert_eq!(store.get(dead).await.expect("job").state, JobState::Queued);
}

/// Runs `test`, then `teardown`, whether the test passed or panicked.
async fn with_teardown<T, D>(test: T, teardown: D)
where
    T: Future<Output = ()> + Send + 'static,
    D: Future<Output = Result<(), String>>,
{
    let outcome = tokio::spawn(test).await;
    let removed = teardown.await;
    match outcome {
        Err(err) if err.is_panic() => {
            if let Err(removal) = removed {
                eprintln!("*** {removal}");
            }
            std::panic::resume_unwind(err.into_panic());
        }
        Err(err) => panic!("the test task failed: {err}"),
        Ok(()) => {
            if let Err(removal) = removed {
                panic!("{removal}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_over_redis() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = unique_namespace("dash");
    let settings = || {
        StoreSettings::default()
            .namespace(namespace.clone())
            .record_events(1_000)
    };
    let store = match durq::connect_with(&url, settings()).await {
        Ok(store) => store,
        Err(err) => return skip_or_fail(&format!("Redis at {url}"), &err),
    };
    let teardown = async {
        let store = durq::backends::redis::RedisBackend::connect(&url, settings())
            .await
            .map_err(|err| format!("could not reconnect to remove {namespace}: {err}"))?;
        store
            .drop_namespace()
            .await
            .map(drop)
            .map_err(|err| format!("could not remove Redis namespace {namespace}: {err}"))
    };
    with_teardown(pages_over(store), teardown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_over_postgres() {
    use durq::backends::postgres::{PostgresConfig, PostgresPool};
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let namespace = unique_namespace("dash");
    let config = PostgresConfig::new(&url)
        .expect("DATABASE_URL is a postgres URL")
        .max_connections(4)
        .application_name("durq-dashboard-tests");
    let backend = match PostgresPool::connect(config).await {
        Ok(backend) => backend,
        Err(err) => return skip_or_fail(&format!("PostgreSQL at {url}"), &err),
    };
    let settings = StoreSettings::default()
        .namespace(namespace.clone())
        .record_events(1_000);
    let store = Store::new(backend.backend(settings).expect("a postgres store"));
    let teardown = async {
        backend
            .drop_namespace(&namespace)
            .await
            .map(drop)
            .map_err(|err| format!("could not remove PostgreSQL namespace {namespace}: {err}"))
    };
    with_teardown(pages_over(store), teardown).await;
}
