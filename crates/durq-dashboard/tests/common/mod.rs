//! What the dashboard's tests share: requests through the router, and jobs in the
//! states the pages show.

#![allow(dead_code)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use durq::worker_calls::{ClaimRequest, Retry};
use durq::{JobId, NewJob, Store};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// An answer, its body read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: header::HeaderName) -> &str {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
    }

    /// The value of the page's hidden CSRF field.
    pub fn csrf(&self) -> String {
        let marker = "name=\"csrf\" value=\"";
        let start = self
            .body
            .find(marker)
            .unwrap_or_else(|| panic!("no CSRF field in the page: {}", self.body))
            + marker.len();
        let len = self.body[start..]
            .find('"')
            .expect("the field's value ends");
        self.body[start..start + len].to_owned()
    }
}

/// The href of the page's "Next page" link, `&amp;` decoded, if it has one.
pub fn next_page(page: &Answer) -> Option<String> {
    let before = page.body.split("id=\"next-page\"").next()?;
    if !page.body.contains("id=\"next-page\"") {
        return None;
    }
    let start = before.rfind("href=\"")? + 6;
    let href = &before[start..];
    let href = &href[..href.find('"')?];
    Some(href.replace("&amp;", "&"))
}

/// The jobs of `ids` listed on `page` (rows `data-job`), in the page's order.
pub fn listed(page: &Answer, ids: &[JobId]) -> Vec<JobId> {
    let mut on_page: Vec<(usize, JobId)> = ids
        .iter()
        .filter_map(|id| Some((page.body.find(&format!("data-job=\"{id}\""))?, *id)))
        .collect();
    on_page.sort();
    on_page.into_iter().map(|(_, id)| id).collect()
}

/// Sends `request` through `router`.
pub async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body is read")
        .to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GET uri`.
pub async fn get(router: &Router, uri: &str) -> Answer {
    let request = Request::get(uri)
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .expect("a request");
    send(router, request).await
}

/// A `POST` of an urlencoded `form` to `uri`, as a browser sends it from the
/// dashboard's own page, with extra `headers`.
pub fn post(uri: &str, form: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post(uri)
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Body::from(form.to_owned()))
        .expect("a request")
}

/// The headers of a browser's form post from the dashboard's own page.
pub const SAME_ORIGIN: [(&str, &str); 2] = [
    ("origin", "http://127.0.0.1:8080"),
    ("sec-fetch-site", "same-origin"),
];

/// Enqueues a job on `queue` and lets it die at its first attempt with `error`.
pub async fn dead_job(store: &Store, queue: &str, error: &str) -> JobId {
    dead_job_of(store, NewJob::new(queue).payload("{\"n\":1}"), error).await
}

/// Enqueues `job` with one attempt allowed, and lets it die at that attempt with
/// `error` (a claim by `test-worker`).
pub async fn dead_job_of(store: &Store, job: NewJob, error: &str) -> JobId {
    let queue = job.queue.clone();
    let id = store
        .enqueue(job.max_attempts(1))
        .await
        .expect("enqueue")
        .id;
    let claim = ClaimRequest::new([queue], "test-worker", Duration::from_secs(30)).reserved(id);
    let claimed = store.claim(claim).await.expect("claim");
    let job = claimed.first().expect("the job is claimed");
    store
        .fail(job.id(), job.token(), error, Retry::Never)
        .await
        .expect("fail");
    id
}

/// Whether `JOBS_REQUIRE_SERVICES=1` asks for every service to be there.
pub fn services_required() -> bool {
    std::env::var("JOBS_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Skips the test loudly, or fails it when services are required.
pub fn skip_or_fail(service: &str, why: &dyn std::fmt::Display) {
    if services_required() {
        panic!("{service} is required (JOBS_REQUIRE_SERVICES=1) but unavailable: {why}");
    }
    // Straight to stderr: the harness captures the output of passing tests.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: {service} is unavailable ({why}).\n*** CI sets JOBS_REQUIRE_SERVICES=1 and fails here.\n"
    );
}

/// A namespace no other test run uses.
pub fn unique_namespace(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}
