//! The dashboard in a real browser: headless Chromium driven over WebDriver
//! (`chromedriver`, started by the test on a port of its own) against a dashboard
//! served on 127.0.0.1 over an SQLite store with a real worker.
//!
//! It loads the overview and sees the queue, opens a dead job from the list of dead
//! jobs, unfolds the error of its failed attempt, retries it and sees it succeed with
//! a second attempt, pauses the queue and sees claims stop (a job
//! enqueued there stays ready while the worker takes the jobs of another queue),
//! resumes it and sees the job run. On the way it takes screenshots of the main pages:
//! into `$JOBS_DASHBOARD_SCREENSHOTS` (relative to the workspace root) when set — the
//! ones in `docs/images` come from `JOBS_DASHBOARD_SCREENSHOTS=docs/images` — and
//! into the target directory otherwise.
//!
//! Chromium and chromedriver are looked for at `$CHROMIUM` and `$CHROMEDRIVER`, then
//! at Debian's `/usr/bin/chromium` and `/usr/bin/chromedriver`. Without them the test
//! is skipped loudly, or fails under `JOBS_REQUIRE_SERVICES=1` (CI installs them).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{dead_job_of, skip_or_fail};
use durq::{Bytes, JobContext, JobError, JobId, JobState, NewJob, Store, Worker};
use durq_dashboard::{serve_on, Dashboard};
use fantoccini::{Client, ClientBuilder, Locator};

/// How long any one thing the test waits for may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(200);

/// The two programs, if they are installed.
fn browser_programs() -> Result<(PathBuf, PathBuf), String> {
    let find = |var: &str, default: &str| -> Result<PathBuf, String> {
        let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{} not found (set {var}, or apt-get install chromium chromium-driver)",
                path.display()
            ))
        }
    };
    Ok((
        find("CHROMIUM", "/usr/bin/chromium")?,
        find("CHROMEDRIVER", "/usr/bin/chromedriver")?,
    ))
}

/// A chromedriver process, killed when dropped.
struct Chromedriver {
    child: Child,
    url: String,
}

impl Chromedriver {
    /// Starts chromedriver on a free loopback port and waits for it to say which.
    async fn start(program: &Path) -> Result<Self, String> {
        let mut child = Command::new(program)
            .arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
        let stdout = child.stdout.take().ok_or("chromedriver has no stdout")?;
        let mut driver = Chromedriver {
            child,
            url: String::new(),
        };
        // "ChromeDriver was started successfully on port 40671." Read on a thread of
        // its own, which then drains the rest so chromedriver never blocks on its pipe.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut tx = Some(tx);
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(port) = line
                    .split("started successfully on port ")
                    .nth(1)
                    .map(|rest| rest.trim().trim_end_matches('.').to_owned())
                {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(port);
                    }
                    break;
                }
                line.clear();
            }
            let _ = std::io::copy(
                &mut reader.into_inner().take(u64::MAX),
                &mut std::io::sink(),
            );
        });
        let port = tokio::time::timeout(DEADLINE, rx)
            .await
            .map_err(|_| "chromedriver did not start within the deadline".to_owned())?
            .map_err(|_| "chromedriver exited before it started".to_owned())?;
        driver.url = format!("http://127.0.0.1:{port}");
        Ok(driver)
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A WebDriver session of headless Chromium, as root on a closed network.
async fn open_browser(driver: &Chromedriver, chromium: &Path, profile: &Path) -> Client {
    let args = [
        "--headless".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        "--hide-scrollbars".to_owned(),
        "--force-device-scale-factor=1".to_owned(),
        "--window-size=1280,1000".to_owned(),
        format!("--user-data-dir={}", profile.display()),
    ];
    let capabilities = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": chromium, "args": args },
    });
    let serde_json::Value::Object(capabilities) = capabilities else {
        unreachable!("a JSON object");
    };
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session of Chromium");
    client
        .set_window_size(1280, 1000)
        .await
        .expect("the window's size");
    client
}

/// Waits for an element matching `css`, looking again after the page refreshes
/// itself; fails the test at the deadline.
async fn wait_for(client: &Client, css: &str) -> fantoccini::elements::Element {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            return element;
        }
        assert!(
            Instant::now() < deadline,
            "no {css} within {DEADLINE:?} at {:?}: {}",
            client.current_url().await.map(|u| u.to_string()),
            client.source().await.unwrap_or_default()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the text of the element matching `css` is `text`.
async fn wait_for_text(client: &Client, css: &str, text: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            if element.text().await.is_ok_and(|t| t.trim() == text) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{css} never read {text:?}: {}",
            client.source().await.unwrap_or_default()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until job `id` is in `state`, as the store says.
async fn wait_for_state(store: &Store, id: JobId, state: JobState) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let job = store.get(id).await.expect("the job");
        if job.state == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} is still {:?}",
            job.state
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Where screenshots go.
fn screenshot_dir() -> PathBuf {
    match std::env::var_os("JOBS_DASHBOARD_SCREENSHOTS") {
        Some(dir) => {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            workspace.join(dir)
        }
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots"),
    }
}

/// Saves a screenshot of the page as `name`, and checks it is a PNG of the window.
async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}: not a PNG");
    let width = png
        .get(16..20)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    assert_eq!(width, Some(1280), "{name}: the window's width");
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    std::fs::write(dir.join(name), &png).expect("write the screenshot");
}

/// The number of points of the busiest line drawn on the page.
async fn longest_line(client: &Client) -> usize {
    let mut longest = 0;
    if let Ok(lines) = client.find_all(Locator::Css("figure.chart polyline")).await {
        for line in lines {
            if let Ok(Some(points)) = line.attr("points").await {
                longest = longest.max(points.split_whitespace().count());
            }
        }
    }
    longest
}

async fn succeed(_ctx: JobContext, _payload: Bytes) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_in_a_real_browser() {
    let (chromium, chromedriver) = match browser_programs() {
        Ok(programs) => programs,
        Err(why) => return skip_or_fail("The browser (Chromium with chromedriver)", &why),
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    // Its jobs record their events, for the event stream's live page.
    let settings = durq::StoreSettings::default().record_events(100_000);
    let store = durq::connect_with(&url, settings)
        .await
        .expect("an SQLite store");

    // Three dead jobs (the worker is not running yet, so they stay dead), tagged and
    // with the trace context of the request that enqueued them, and jobs for the
    // worker to run so the overview has something to chart.
    let mut dead = Vec::new();
    for (customer, error) in [
        (
            "acme",
            "smtp: 550 mailbox unavailable\n  at send_welcome (mail.rs:42)\n  at run (worker.rs:7)",
        ),
        ("globex", "smtp: connection reset by peer"),
        ("acme", "template \"welcome\" not found"),
    ] {
        let job = NewJob::new("emails")
            .payload(format!("{{\"to\":\"ada@{customer}.example\"}}"))
            .tag("customer", customer)
            .tag("campaign", "welcome")
            .trace_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        dead.push(dead_job_of(&store, job, error).await);
    }
    let first_dead = dead[0];
    for n in 0..30 {
        store
            .enqueue(NewJob::new("emails").payload(format!("{{\"to\":\"user{n}@example.com\"}}")))
            .await
            .expect("enqueue");
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("the address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let dashboard = Dashboard::new(store.clone())
        .sample_interval(Duration::from_millis(250))
        .chart_window(Duration::from_secs(20));
    let server = tokio::spawn(serve_on(dashboard, listener, async {
        let _ = stopped.await;
    }));

    let report_permits = Arc::new(tokio::sync::Semaphore::new(0));
    let producer_permits = Arc::clone(&report_permits);
    let handler_permits = Arc::clone(&report_permits);
    let worker = Worker::builder(store.clone())
        .handler("emails", succeed)
        .handler("reports", move |_ctx: JobContext, _payload: Bytes| {
            // A report is written when the test lets it (a permit each): the producer
            // lets fewer through than it enqueues, so a backlog and a lag build up
            // for the charts, and no handler waits on the clock.
            let reports = Arc::clone(&handler_permits);
            async move {
                if let Ok(permit) = reports.acquire().await {
                    permit.forget();
                }
                Ok::<(), JobError>(())
            }
        })
        .handler("probes", succeed)
        .concurrency(2)
        .poll_interval(Duration::from_millis(100))
        .build()
        .expect("a worker");
    let running = worker.spawn();
    // A producer keeps `reports` busy (10 jobs/s, of which it lets 2 in 3 be
    // written), so throughput and lag have lines to draw.
    let producer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            for tick in 0u64.. {
                ticks.tick().await;
                if tick % 3 != 0 {
                    producer_permits.add_permits(1);
                }
                if store.enqueue(NewJob::new("reports")).await.is_err() {
                    break;
                }
            }
        })
    };

    let driver = Chromedriver::start(&chromedriver)
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    let profile = tempfile::tempdir().expect("a browser profile");
    let client = open_browser(&driver, &chromium, profile.path()).await;
    let base = format!("http://127.0.0.1:{}", addr.port());

    // The overview lists the queue, and its charts fill in as samples come.
    client
        .goto(&format!("{base}/"))
        .await
        .expect("the overview");
    wait_for(&client, "tr[data-queue=\"emails\"]").await;
    wait_for(&client, "tr[data-queue=\"reports\"]").await;
    let deadline = Instant::now() + DEADLINE;
    while longest_line(&client).await < 40 {
        assert!(Instant::now() < deadline, "the charts never filled in");
        tokio::time::sleep(POLL).await;
        client.refresh().await.expect("reload");
    }
    wait_for(&client, "table#workers").await;
    screenshot(&client, "overview.png").await;
    // The reports backlog drains from here on; the dead job waits behind it.
    producer.abort();
    report_permits.add_permits(1_000_000);

    // The queue's dead count leads to its dead jobs.
    wait_for(&client, "tr[data-queue=\"emails\"] a[href$=\"state=dead\"]")
        .await
        .click()
        .await
        .expect("open the dead jobs");
    wait_for(&client, &format!("tr[data-job=\"{first_dead}\"]")).await;
    for id in &dead {
        wait_for(&client, &format!("tr[data-job=\"{id}\"]")).await;
    }
    screenshot(&client, "jobs.png").await;

    // The dead job's page shows its error, and retrying it from there runs it.
    wait_for(&client, &format!("tr[data-job=\"{first_dead}\"] a"))
        .await
        .click()
        .await
        .expect("open the dead job");
    wait_for(&client, "#job-state[data-state=\"dead\"]").await;
    wait_for(&client, "#last-error pre").await;
    wait_for(&client, "#job-tags a.tag[data-tag=\"customer=acme\"]").await;
    // The failed attempt's error is folded to its first line; a click unfolds it.
    // The page is loaded afresh first, so its own refresh (5 s) cannot fold it again
    // before the screenshot.
    let folded = wait_for(&client, "tr[data-outcome=\"failed\"] details").await;
    assert_eq!(folded.attr("open").await.ok().flatten(), None);
    let here = client.current_url().await.expect("the job's address");
    client.goto(here.as_str()).await.expect("reload the job");
    wait_for(&client, "tr[data-outcome=\"failed\"] details summary")
        .await
        .click()
        .await
        .expect("unfold the error");
    let unfolded = client
        .find(Locator::Css(
            "tr[data-outcome=\"failed\"] details[open] pre",
        ))
        .await
        .expect("the unfolded error");
    assert!(unfolded
        .text()
        .await
        .is_ok_and(|text| text.contains("at send_welcome (mail.rs:42)")));
    screenshot(&client, "job.png").await;
    wait_for(
        &client,
        &format!("form[action=\"/jobs/{first_dead}/retry\"] button"),
    )
    .await
    .click()
    .await
    .expect("press retry");
    // The page refreshes itself until the worker has run the job: a second attempt,
    // after the failed one.
    wait_for(&client, "#job-state[data-state=\"succeeded\"]").await;
    wait_for(
        &client,
        "tr[data-attempt=\"1\"][data-outcome=\"failed\"] ~ tr[data-attempt=\"2\"][data-outcome=\"succeeded\"]",
    )
    .await;
    assert_eq!(
        store.get(first_dead).await.expect("the job").state,
        JobState::Succeeded
    );
    for id in &dead[1..] {
        assert_eq!(store.get(*id).await.expect("job").state, JobState::Dead);
    }

    // Pause the queue from its page: claims stop.
    wait_for(&client, "#summary a[href^=\"/queue?name=emails\"]")
        .await
        .click()
        .await
        .expect("open the queue");
    wait_for(&client, "form[action=\"/queue/pause\"] button")
        .await
        .click()
        .await
        .expect("press pause");
    wait_for(&client, "#queue-paused").await;
    assert!(store.stats("emails").await.expect("stats").paused);
    // Both ahead of the reports backlog, `held` first.
    let held = store
        .enqueue(NewJob::new("emails").priority(10))
        .await
        .expect("enqueue")
        .id;
    let probe = store
        .enqueue(NewJob::new("probes").priority(10))
        .await
        .expect("enqueue")
        .id;
    // The worker claims across its queues in claim order, where `held` comes first
    // (same priority, enqueued before): once it has run `probe`, it has passed `held`
    // over.
    wait_for_state(&store, probe, JobState::Succeeded).await;
    let job = store.get(held).await.expect("the held job");
    assert_eq!(
        job.state,
        JobState::Queued,
        "a paused queue's job is not claimed"
    );
    assert_eq!(job.attempts, 0);
    wait_for_text(&client, "td[data-count=\"ready\"]", "1").await;
    screenshot(&client, "queue.png").await;

    // Resume: the held job runs.
    wait_for(&client, "form[action=\"/queue/resume\"] button")
        .await
        .click()
        .await
        .expect("press resume");
    // The notice shows until the page's next reload; the button stays.
    wait_for(&client, "form[action=\"/queue/pause\"] button").await;
    assert!(!store.stats("emails").await.expect("stats").paused);
    wait_for_state(&store, held, JobState::Succeeded).await;

    // The event stream's page, from the navigation: the held job's whole life, and a
    // job that runs while the page is open shows up as the page reloads itself.
    wait_for(&client, "header nav a[href=\"/events\"]")
        .await
        .click()
        .await
        .expect("open the events");
    for kind in ["enqueued", "started", "succeeded"] {
        wait_for(
            &client,
            &format!("tr[data-kind=\"{kind}\"] a[href=\"/jobs/{held}\"]"),
        )
        .await;
    }
    let late = store
        .enqueue(NewJob::new("probes"))
        .await
        .expect("enqueue")
        .id;
    wait_for(
        &client,
        &format!("tr[data-kind=\"succeeded\"] a[href=\"/jobs/{late}\"]"),
    )
    .await;
    screenshot(&client, "events.png").await;

    client.close().await.expect("close the browser");
    drop(driver);
    running.shutdown().await;
    let _ = stop.send(());
    let served = server.await.expect("the server task");
    assert!(served.is_ok(), "{served:?}");
}
