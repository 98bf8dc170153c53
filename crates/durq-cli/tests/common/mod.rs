//! Shared by the tests of the `durq` binary: running it against a store, and the main
//! flow every backend goes through.
//!
//! The binary runs as a child process with stdin closed and stdout and stderr piped,
//! so it never sees a terminal: it cannot ask for a confirmation, and draws no
//! progress bar. The test reaches the same store through the library to put jobs in
//! states only a worker makes (running, dead) and to check what a command changed.

// Each test binary uses the parts it needs.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::process::{Command, Stdio};
use std::time::Duration;

use durq::worker_calls::{ClaimRequest, Retry};
use durq::{JobId, JobState, NewJob, Schedule, Store, WorkerInfo};
use futures::FutureExt;
use serde_json::Value;

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    /// Its exit status (-1 when killed by a signal).
    pub code: i32,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

/// Runs `durq` with `args` and nothing else from the environment that could point it
/// at a store, stdin closed.
pub fn durq(args: &[&str]) -> Run {
    durq_with(args, &[], None)
}

/// Runs `durq` with `args`, the environment variables `env`, and `stdin` piped in
/// (closed when `None`).
pub fn durq_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_durq"));
    command
        .args(args)
        .env_remove("DURQ_URL")
        .env_remove("DURQ_NAMESPACE")
        .env_remove("DURQ_DASHBOARD_TOKEN")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the durq binary starts");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(bytes).expect("write stdin");
    }
    let output = child.wait_with_output().expect("the durq binary ends");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Run {
    /// Asserts the run succeeded and printed nothing on stderr; its stdout.
    pub fn ok(self) -> String {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        assert_eq!(self.stderr, "", "expected a quiet stderr: {self:#?}");
        self.stdout
    }

    /// Asserts the run failed with status 1 and one `durq: error:` line containing
    /// `needle`, and printed nothing on stdout.
    pub fn fails_with(self, needle: &str) {
        assert_eq!(self.code, 1, "expected an operation error: {self:#?}");
        assert!(
            self.stderr.starts_with("durq: error: ")
                && self.stderr.ends_with('\n')
                && self.stderr.lines().count() == 1,
            "expected one `durq: error:` line: {self:#?}"
        );
        assert!(
            self.stderr.contains(needle),
            "expected {needle:?}: {self:#?}"
        );
        assert_eq!(self.stdout, "", "expected nothing on stdout: {self:#?}");
    }

    /// Asserts the run was a usage error (status 2, clap's message on stderr).
    pub fn usage_error(self) {
        assert_eq!(self.code, 2, "expected a usage error: {self:#?}");
        assert!(self.stderr.contains("error:"), "{self:#?}");
        assert_eq!(self.stdout, "", "{self:#?}");
    }

    /// Asserts success; stdout parsed as one JSON document.
    pub fn json(self) -> Value {
        let stdout = self.ok();
        serde_json::from_str(&stdout)
            .unwrap_or_else(|err| panic!("stdout is not one JSON document ({err}): {stdout}"))
    }
}

/// A store, and the arguments that point the binary at it.
pub struct Target {
    /// The store's URL.
    pub url: String,
    /// The namespace the test works in.
    pub namespace: String,
    /// The same store, through the library.
    pub store: Store,
}

impl Target {
    /// Opens `url`'s store in `namespace`.
    pub async fn open(url: &str, namespace: &str) -> durq::Result<Target> {
        let settings = durq::StoreSettings::default().namespace(namespace);
        Ok(Target {
            url: url.to_owned(),
            namespace: namespace.to_owned(),
            store: durq::connect_with(url, settings).await?,
        })
    }

    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--url", self.url.as_str(), "-n", self.namespace.as_str()];
        all.extend_from_slice(args);
        all
    }

    /// Runs `durq --url URL -n NAMESPACE args…`.
    pub fn run(&self, args: &[&str]) -> Run {
        durq(&self.args(args))
    }

    /// The same, with `stdin` piped in.
    pub fn run_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        durq_with(&self.args(args), &[], Some(stdin))
    }

    /// Runs the command with `--json`; its document.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.run(&all).json()
    }

    /// Enqueues through the binary; the new job's id.
    pub fn enqueue(&self, args: &[&str]) -> JobId {
        let mut all = vec!["enqueue"];
        all.extend_from_slice(args);
        let stdout = self.run(&all).ok();
        let (id, outcome) = stdout
            .trim_end()
            .split_once(' ')
            .unwrap_or_else(|| panic!("`ID created` expected: {stdout:?}"));
        assert_eq!(outcome, "created", "{stdout}");
        id.parse().expect("an id")
    }

    /// Claims job `id` as `worker`, as a worker would.
    pub async fn claim(
        &self,
        id: JobId,
        queue: &str,
        worker: &str,
    ) -> durq::worker_calls::ClaimedJob {
        let request = ClaimRequest::new([queue], worker, Duration::from_secs(300)).reserved(id);
        let mut claimed = self.store.claim(request).await.expect("claim");
        assert_eq!(claimed.len(), 1, "job {id} was claimed");
        claimed.remove(0)
    }

    /// Claims job `id` and fails it for good: it is dead.
    pub async fn kill(&self, id: JobId, queue: &str, error: &str) {
        let claimed = self.claim(id, queue, "killer").await;
        let state = self
            .store
            .fail(id, claimed.token(), error, Retry::Never)
            .await
            .expect("fail");
        assert_eq!(state, JobState::Dead);
    }

    /// The job's state, read through the library.
    pub async fn state(&self, id: JobId) -> JobState {
        self.store.get(id).await.expect("get").state
    }
}

fn ids_of(value: &Value) -> Vec<JobId> {
    value
        .as_array()
        .expect("an array of ids")
        .iter()
        .map(|id| id.as_str().expect("an id").parse().expect("a job id"))
        .collect()
}

/// The main flow, on any backend that outlives a process: enqueue, read every way,
/// put jobs in every state, retry and cancel one and many (dry run, refusal, --yes),
/// pause and resume, workers and schedules, purge.
pub async fn main_flow(t: &Target) {
    // Enqueue, from an argument and from stdin, with the options that show in reads.
    let first = t.enqueue(&["emails", r#"{"to":"ada@example.com"}"#]);
    let keyed = t.enqueue(&["emails", r#"{"to":"bob"}"#, "--key", "welcome-bob"]);
    let again = t.run(&[
        "enqueue",
        "emails",
        r#"{"to":"bob"}"#,
        "--key",
        "welcome-bob",
    ]);
    assert_eq!(again.ok(), format!("{keyed} deduplicated\n"));
    let piped = t.run_stdin(&["enqueue", "emails", "--priority", "7"], b"{\"n\": 3}\n");
    let piped: JobId = piped
        .ok()
        .split(' ')
        .next()
        .expect("id")
        .parse()
        .expect("id");
    let later = t.enqueue(&["reports", "[1, 2]", "--delay", "1h", "--max-attempts", "3"]);
    let dedup = t.json(&["enqueue", "emails", "{}", "--key", "welcome-bob"]);
    assert_eq!(dedup["created"], false);
    assert_eq!(dedup["id"], keyed.to_string());

    // What is there, read every way.
    let queues = t.json(&["queues"]);
    let names: Vec<&str> = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| q["queue"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["emails", "reports"]);
    assert_eq!(queues["queues"][0]["ready"], 3);
    assert_eq!(queues["queues"][1]["scheduled"], 1);
    assert!(queues["queues"][0]["lag_ms"].is_u64());
    assert!(queues["queues"][1]["lag_ms"].is_null(), "nothing ready");
    let table = t.run(&["queues"]).ok();
    assert!(table.starts_with("QUEUE "), "{table}");
    assert!(table
        .lines()
        .nth(1)
        .is_some_and(|l| l.starts_with("emails ")));

    let stats = t.json(&["stats", "--queue", "emails"]);
    assert_eq!(
        (stats["ready"].as_u64(), stats["total"].as_u64()),
        (Some(3), Some(3))
    );
    assert!(t
        .run(&["stats", "--queue", "emails"])
        .ok()
        .contains("ready:     3\n"));

    let page = t.json(&["list", "--queue", "emails", "--limit", "2"]);
    let listed: Vec<&str> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_str().expect("id"))
        .collect();
    let (p, k) = (piped.to_string(), keyed.to_string());
    assert_eq!(listed, [p.as_str(), k.as_str()], "newest first");
    let next = page["next"].as_str().expect("a next page").to_owned();
    let rest = t.json(&[
        "list", "--queue", "emails", "--limit", "2", "--after", &next,
    ]);
    assert_eq!(rest["jobs"][0]["id"], first.to_string());
    assert!(rest["next"].is_null());
    let human = t.run(&["list", "--queue", "emails", "--limit", "2"]).ok();
    assert!(
        human.ends_with(&format!("(2 jobs; next page: --after {next})\n")),
        "{human}"
    );

    let inspected = t.json(&["inspect", &piped.to_string()]);
    assert_eq!(inspected["job"]["priority"], 7);
    assert_eq!(inspected["payload"]["encoding"], "json");
    assert_eq!(inspected["payload"]["json"]["n"], 3);
    let shown = t.run(&["inspect", &later.to_string()]).ok();
    assert!(shown.contains("state:      scheduled\n"), "{shown}");
    assert!(shown.contains("attempts:   0 of 3\n"), "{shown}");
    assert!(
        shown.contains("payload (6 bytes, JSON):\n[\n  1,\n  2\n]\n"),
        "{shown}"
    );

    // A dead job, a running one under a registered worker, and the worker listed.
    t.kill(first, "emails", "smtp: 550 no such user").await;
    let worker = WorkerInfo::new("w-1", "box-7", 4242, vec!["emails".into()], 8);
    t.store.register_worker(&worker).await.expect("register");
    let running = t.claim(keyed, "emails", "w-1").await;
    let workers = t.json(&["workers"]);
    assert_eq!(workers["workers"][0]["id"], "w-1");
    assert_eq!(workers["workers"][0]["running"][0]["id"], keyed.to_string());
    let table = t.run(&["workers"]).ok();
    assert!(table.contains("box-7"), "{table}");
    assert!(table.contains(&format!("w-1     {keyed}")), "{table}");
    let dead = t.run(&["inspect", &first.to_string()]).ok();
    assert!(
        dead.contains("last error:\n  smtp: 550 no such user\n"),
        "{dead}"
    );
    let lease = t.run(&["inspect", &keyed.to_string()]).ok();
    assert!(lease.contains("lease:\n  worker:"), "{lease}");

    // Retry by filter: the dry run and the refusal touch nothing, --yes acts.
    let dry = t.json(&["retry", "--queue", "emails", "--state", "dead", "--dry-run"]);
    assert_eq!(dry["count"], 1);
    assert_eq!(ids_of(&dry["ids"]), [first]);
    let dry = t.run(&["retry", "--queue", "emails", "--state", "dead", "--dry-run"]);
    assert_eq!(
        dry.ok(),
        format!("would retry 1 dead job of queue emails:\n{first}\n")
    );
    assert_eq!(
        t.state(first).await,
        JobState::Dead,
        "the dry run touched nothing"
    );
    t.run(&["retry", "--queue", "emails", "--state", "dead"])
        .fails_with("refusing to retry 1 dead job of queue emails without confirmation");
    assert_eq!(
        t.state(first).await,
        JobState::Dead,
        "the refusal touched nothing"
    );
    let retried = t.run(&["retry", "--queue", "emails", "--state", "dead", "--yes"]);
    assert_eq!(retried.ok(), "retried 1 job\n");
    assert_eq!(t.state(first).await, JobState::Queued);
    t.run(&["retry", &first.to_string()])
        .fails_with(&format!("cannot retry job {first}: it is queued"));

    // Cancel: the running job is asked to stop; the queued ones by filter are cancelled.
    let stop = t.run(&["cancel", &keyed.to_string()]).ok();
    assert_eq!(stop, "asked 1 running job to stop\n");
    assert!(t.store.get(keyed).await.expect("get").cancel_requested);
    let dry = t.json(&[
        "cancel",
        "--queue",
        "emails",
        "--state",
        "queued",
        "--dry-run",
    ]);
    assert_eq!(ids_of(&dry["ids"]), [piped, first]);
    t.run(&["cancel", "--queue", "emails", "--state", "queued"])
        .fails_with("pass --yes");
    assert_eq!(t.state(piped).await, JobState::Queued);
    let cancelled = t.json(&["cancel", "--queue", "emails", "--state", "queued", "-y"]);
    assert_eq!(
        (cancelled["count"].as_u64(), cancelled["done"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(t.state(piped).await, JobState::Cancelled);
    assert_eq!(t.state(first).await, JobState::Cancelled);
    let none = t.run(&["cancel", "--queue", "emails", "--state", "queued", "--yes"]);
    assert_eq!(none.ok(), "no queued jobs of queue emails to cancel\n");
    // The running job, asked to stop, ends cancelled.
    let state = t
        .store
        .fail(keyed, running.token(), "stopped", Retry::Never)
        .await
        .expect("fail");
    assert_eq!(state, JobState::Cancelled);

    // Pause and resume. A queue the namespace does not know is refused as a typo,
    // and is not made up by the refusal; --allow-empty pauses it before its first job.
    t.run(&["pause", "emials"])
        .fails_with(r#"has no queue "emials"; pass --allow-empty"#);
    assert!(
        !t.json(&["queues"]).to_string().contains("emials"),
        "a refused pause leaves no queue behind"
    );
    assert_eq!(
        t.run(&["pause", "later", "--allow-empty"]).ok(),
        "paused queue later\n"
    );
    assert!(t.store.stats("later").await.expect("stats").paused);
    assert_eq!(t.run(&["resume", "later"]).ok(), "resumed queue later\n");
    assert_eq!(t.run(&["pause", "emails"]).ok(), "paused queue emails\n");
    assert!(t.json(&["stats", "--queue", "emails"])["paused"]
        .as_bool()
        .expect("paused"));
    assert_eq!(t.json(&["resume", "emails"])["paused"], false);
    assert!(!t.store.stats("emails").await.expect("stats").paused);

    // Limits (CONTRACT K3), on a backend with flow control; refused by name elsewhere.
    if t.store.supports(durq::Capability::FlowControl) {
        assert_eq!(t.run(&["limits"]).ok(), "(no queue has limits)\n");
        let keyed = t.enqueue(&["invoices", "--concurrency-key", "customer-9"]);
        assert_eq!(
            t.store
                .get(keyed)
                .await
                .expect("get")
                .concurrency_key
                .as_deref(),
            Some("customer-9")
        );
        assert_eq!(
            t.run(&["limits", "set", "emails", "--max-running-per-key", "1"])
                .ok(),
            "queue emails: at most 1 running per concurrency key\n"
        );
        let set = t.json(&[
            "limits",
            "set",
            "reports",
            "--max-running",
            "4",
            "--max-starts",
            "10/1s",
            "--max-starts-per-key",
            "1/1m",
        ]);
        assert_eq!(set["max_running"], 4);
        assert!(set["max_running_per_key"].is_null());
        assert_eq!(set["max_starts"], "10/1s");
        assert_eq!(set["max_starts_per_key"], "1/1m");
        assert_eq!(
            t.store.limits("reports").await.expect("limits"),
            durq::QueueLimits::new()
                .max_running(4)
                .max_starts(durq::Rate::new(10, Duration::from_secs(1)))
                .max_starts_per_key(durq::Rate::new(1, Duration::from_secs(60)))
        );
        t.run(&["limits", "set", "reports", "--max-starts", "0/1s"])
            .usage_error();
        t.run(&["limits", "set", "reports", "--max-starts", "ten"])
            .usage_error();
        let listed = t.json(&["limits"]);
        assert_eq!(listed["limits"][0]["queue"], "emails");
        assert_eq!(listed["limits"][1]["max_running"], 4);
        let table = t.run(&["limits"]).ok();
        assert!(table.contains("MAX RUNNING PER KEY"), "{table}");
        assert!(table.contains("MAX STARTS PER KEY"), "{table}");
        assert!(table.contains("10/1s"), "{table}");
        assert_eq!(
            t.store.limits("emails").await.expect("limits"),
            durq::QueueLimits::new().max_running_per_key(1)
        );
        t.run(&["limits", "set", "emails"])
            .fails_with("name --max-running, --max-running-per-key");
        let status = t.json(&["limits", "status", "emails"]);
        assert_eq!(status["queue"], "emails");
        assert_eq!(status["running"], 0);
        assert!(status["next_start"].is_null());
        let text = t.run(&["limits", "status", "emails"]).ok();
        assert!(text.contains("keys at their running limit: none"), "{text}");
        t.store
            .enqueue(NewJob::new("emails").concurrency_key("c1"))
            .await
            .expect("enqueue");
        let held = t
            .store
            .claim(ClaimRequest::new(
                ["emails"],
                "cli-test",
                Duration::from_secs(60),
            ))
            .await
            .expect("claim");
        assert_eq!(held.len(), 1);
        let status = t.json(&["limits", "status", "emails"]);
        assert_eq!(status["running"], 1);
        assert_eq!(status["keys_at_limit"][0]["key"], "c1");
        let text = t.run(&["limits", "status", "emails"]).ok();
        assert!(text.contains("c1 (1 running)"), "{text}");
        let fair = t.json(&["limits", "set", "shares", "--fair-shares"]);
        assert_eq!(fair["fair_shares"], true);
        assert_eq!(
            t.store.limits("shares").await.expect("limits"),
            durq::QueueLimits::new().fair_shares(true)
        );
        assert!(t.run(&["limits"]).ok().contains("FAIR SHARES"));
        t.run(&["limits", "clear", "shares"]).ok();
        t.run(&["limits", "set", "emails", "--max-running", "0"])
            .usage_error();
        for queue in ["emails", "reports"] {
            assert_eq!(
                t.run(&["limits", "clear", queue]).ok(),
                format!("cleared the limits of queue {queue}\n")
            );
        }
        assert!(t.store.all_limits().await.expect("limits").is_empty());
    } else {
        t.run(&["limits"]).fails_with("FlowControl");
        t.run(&["enqueue", "invoices", "--concurrency-key", "customer-9"])
            .fails_with("concurrency_key");
    }

    // Schedules.
    let schedule = Schedule::every("ping", Duration::from_secs(30), NewJob::new("pings"));
    t.store.put_schedule(&schedule).await.expect("put schedule");
    let schedules = t.json(&["schedules"]);
    assert_eq!(schedules["schedules"][0]["name"], "ping");
    assert_eq!(schedules["schedules"][0]["cadence"]["every_ms"], 30_000);
    assert_eq!(schedules["schedules"][0]["enabled"], true);
    let table = t.run(&["schedules"]).ok();
    assert!(table.contains("every 30s"), "{table}");
    t.run(&["schedules", "delete", "pong"])
        .fails_with(r#"has no schedule "pong""#);
    assert_eq!(
        t.run(&["schedules", "delete", "ping"]).ok(),
        "deleted schedule ping\n"
    );
    assert!(t.store.schedules().await.expect("schedules").is_empty());

    // Purge: nothing past a week's retention; everything finished past none.
    assert_eq!(t.run(&["purge"]).ok(), "purged 0 finished jobs\n");
    assert_eq!(t.json(&["purge", "--retention", "0s"])["purged"], 3);
    t.run(&["inspect", &first.to_string()])
        .fails_with(&format!("job {first} not found"));
}

/// Runs `test`, then `teardown` whether the test passed or panicked. A test that
/// panicked goes on panicking with its own message (a failed teardown is only
/// printed then); a test that passed fails if its teardown did.
pub async fn with_teardown<T, D>(test: T, teardown: D)
where
    T: Future<Output = ()>,
    D: Future<Output = Result<(), String>>,
{
    let outcome = AssertUnwindSafe(test).catch_unwind().await;
    let removed = teardown.await;
    match (outcome, removed) {
        (Err(panic), Err(err)) => {
            eprintln!("*** {err}");
            std::panic::resume_unwind(panic);
        }
        (Err(panic), Ok(())) => std::panic::resume_unwind(panic),
        (Ok(()), Err(err)) => panic!("{err}"),
        (Ok(()), Ok(())) => {}
    }
}
