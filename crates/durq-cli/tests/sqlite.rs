//! The `durq` binary against a temporary SQLite file: every command, its output, its
//! exit status, and what it wrote (or did not).

mod common;

use common::{durq, durq_with, main_flow, Target};
use durq::{JobState, NewJob};

/// A store in a file of its own, removed with the directory.
async fn sqlite() -> (tempfile::TempDir, Target) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let target = Target::open(&url, "cli-test").await.expect("open sqlite");
    (dir, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_flow() {
    let (_dir, t) = sqlite().await;
    main_flow(&t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_before_anything_is_opened() {
    let (dir, t) = sqlite().await;
    t.run(&["queues", "--no-such-flag"]).usage_error();
    t.run(&["no-such-command"]).usage_error();
    t.run(&["inspect", "not-an-id"]).usage_error();
    t.run(&["list", "--tag", "no-equals-sign"]).usage_error();
    t.run(&["list", "--tag", "bad key=v"]).usage_error();
    t.run(&["list", "--prefix", "a%"]).usage_error();
    t.run(&["list", "--queue", "emails", "--state", "lost"])
        .usage_error();
    t.run(&["stats", "--queue", "bad queue"]).usage_error();
    // One queue is `--queue` wherever a command names one to read.
    t.run(&["stats", "emails"]).usage_error();
    t.run(&["enqueue", "emails", "{}", "--run-at", "tomorrow"])
        .usage_error();
    t.run(&["enqueue", "emails", "{}", "--delay", "soon"])
        .usage_error();
    let wrong = t.run(&["retry", "--queue", "emails", "--state", "queued"]);
    assert!(wrong
        .stderr
        .contains("acts on dead or cancelled jobs, not queued ones"));
    assert!(wrong.stderr.contains("Usage: durq retry "), "{wrong:#?}");
    wrong.usage_error();
    t.run(&["cancel", "--queue", "emails", "--state", "dead"])
        .usage_error();
    t.run(&["retry", "--queue", "emails"]).usage_error();
    t.run(&["retry"]).usage_error();
    let missing = durq(&["queues"]);
    assert!(missing.stderr.contains("--url"), "{missing:#?}");
    missing.usage_error();
    // A missing file is an error, and is not created by looking.
    let absent = dir.path().join("absent.db");
    let url = format!("sqlite://{}", absent.display());
    durq(&["--url", &url, "queues"]).fails_with("the file does not exist");
    assert!(!absent.exists());
    let help = durq(&["--help"]);
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("Exit status"), "{help:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_errors_exit_1_with_one_line() {
    let (_dir, t) = sqlite().await;
    let unknown = "01a2357b-3c76-766b-862d-9e44d3f302fe";
    t.run(&["inspect", unknown])
        .fails_with(&format!("job {unknown} not found"));
    t.run(&["retry", unknown])
        .fails_with(&format!("job {unknown} not found"));
    t.run(&["cancel", unknown, "--dry-run"])
        .fails_with(&format!("job {unknown} not found"));
    // Ids are all checked before any is touched.
    let id = t.enqueue(&["emails", "{}"]);
    t.run(&["cancel", &id.to_string(), unknown])
        .fails_with("not found");
    assert_eq!(t.state(id).await, JobState::Queued, "nothing was cancelled");
    // A store that cannot be reached: the message never shows the password.
    let refused = durq(&["--url", "redis://:hunter2@127.0.0.1:1", "queues"]);
    assert!(!refused.stderr.contains("hunter2"), "{refused:#?}");
    refused.fails_with("cannot open the store");
    durq(&["--url", "mysql://root:hunter2@db/jobs", "queues"]).fails_with("unknown scheme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_reads_checks_and_deduplicates() {
    let (dir, t) = sqlite().await;
    // Not JSON: refused, nothing written.
    t.run(&["enqueue", "emails", "{to: ada}"])
        .fails_with("the payload is not JSON");
    t.run_stdin(&["enqueue", "emails"], b"nope")
        .fails_with("pass --raw");
    assert!(t.store.queues().await.expect("queues").is_empty());
    // Nor is a file created for a refused job.
    let fresh = dir.path().join("fresh.db");
    let fresh_url = format!("sqlite://{}", fresh.display());
    durq(&["--url", &fresh_url, "enqueue", "emails", "{"]).fails_with("not JSON");
    durq(&["--url", &fresh_url, "enqueue", "emails", "{}", "--key", ""])
        .fails_with("invalid idempotency");
    assert!(!fresh.exists());
    // ... and is for the first job.
    let created = durq(&["--url", &fresh_url, "enqueue", "emails", "{}"]).ok();
    assert!(created.ends_with(" created\n"), "{created}");

    // Raw bytes from stdin, shown in hex; text shown escaped.
    let raw = t.run_stdin(&["enqueue", "blobs", "-", "--raw"], &[0, 159, 146, 150]);
    let raw: durq::JobId = raw.ok().split(' ').next().expect("id").parse().expect("id");
    assert_eq!(
        t.store.payload(raw).await.expect("payload").as_ref(),
        [0, 159, 146, 150]
    );
    let shown = t.run(&["inspect", &raw.to_string()]).ok();
    assert!(
        shown.contains("payload (4 bytes, binary):\n00000000  00 9f 92 96"),
        "{shown}"
    );
    assert_eq!(
        t.json(&["inspect", &raw.to_string()])["payload"]["hex"],
        "009f9296"
    );
    let text = t.enqueue(&["notes", "tab\there", "--raw"]);
    let shown = t.run(&["inspect", &text.to_string()]).ok();
    assert!(
        shown.contains("payload (8 bytes, text):\n\"tab\\there\"\n"),
        "{shown}"
    );

    // Every option lands on the job.
    let id = t.enqueue(&[
        "emails",
        r#"{"to":"ada"}"#,
        "--run-at",
        "2030-01-02T03:04:05Z",
        "--priority",
        "-3",
        "--key",
        "k-1",
        "--tenant",
        "acme",
        "--max-attempts",
        "4",
    ]);
    let job = t.store.get(id).await.expect("get");
    assert_eq!(
        (job.priority, job.max_attempts, job.tenant.as_str()),
        (-3, 4, "acme")
    );
    assert_eq!(job.idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(job.run_at.as_millis(), 1_893_553_445_000);
    let shown = t.run(&["inspect", &id.to_string()]).ok();
    assert!(
        shown.contains("run at:     2030-01-02T03:04:05Z (in "),
        "{shown}"
    );
    assert!(shown.contains("tenant:     acme\n"), "{shown}");
    // The key is scoped by its tenant: another tenant's is another job.
    let same = t.run(&[
        "enqueue", "emails", "{}", "--key", "k-1", "--tenant", "acme",
    ]);
    assert_eq!(same.ok(), format!("{id} deduplicated\n"));
    let other = t.json(&["enqueue", "emails", "{}", "--key", "k-1"]);
    assert_eq!(other["created"], true);
    // While active, and a key that lives past its job's end.
    let active = t.enqueue(&["emails", "{}", "--key", "nightly", "--unique-while-active"]);
    t.kill(active, "emails", "boom").await;
    let renewed = t.json(&[
        "enqueue",
        "emails",
        "{}",
        "--key",
        "nightly",
        "--unique-while-active",
    ]);
    assert_eq!(renewed["created"], true, "its job is dead, the key is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_an_empty_store_and_the_environment() {
    let (_dir, t) = sqlite().await;
    assert_eq!(
        t.run(&["queues"]).ok(),
        "(no queues in namespace \"cli-test\"; another namespace: -n NAME)\n"
    );
    assert_eq!(t.run(&["workers"]).ok(), "(no live workers)\n");
    assert_eq!(t.run(&["schedules"]).ok(), "(no schedules)\n");
    assert_eq!(t.run(&["list", "--queue", "emails"]).ok(), "(0 jobs)\n");
    for command in [
        &["queues"][..],
        &["workers"],
        &["schedules"],
        &["stats", "--queue", "emails"],
        &["list", "--queue", "emails"],
        &["purge"],
    ] {
        let doc = t.json(command);
        assert!(doc.is_object(), "{command:?}: {doc}");
    }
    assert_eq!(
        t.json(&["list", "--queue", "emails"])["jobs"],
        serde_json::json!([])
    );

    // DURQ_URL and DURQ_NAMESPACE point the binary as --url and -n do, and namespaces
    // do not see each other.
    let id = t.enqueue(&["emails", "{}"]);
    let env = [("DURQ_URL", t.url.as_str()), ("DURQ_NAMESPACE", "cli-test")];
    let listed = durq_with(&["--json", "list", "--queue", "emails"], &env, None).json();
    assert_eq!(listed["jobs"][0]["id"], id.to_string());
    let elsewhere = [("DURQ_URL", t.url.as_str())];
    let other = durq_with(&["--json", "list", "--queue", "emails"], &elsewhere, None).json();
    assert_eq!(
        other["jobs"],
        serde_json::json!([]),
        "the default namespace is empty"
    );
    // The URL in the environment is not shown by --help.
    let help = durq_with(&["--help"], &env, None);
    assert!(!help.stdout.contains(&t.url), "{help:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_children_and_list_filters_by_state() {
    let (_dir, t) = sqlite().await;
    let parent = t.enqueue(&["fanout", r#"{"batch":1}"#]);
    let child = t
        .store
        .enqueue(NewJob::new("fanout").parent(parent))
        .await
        .expect("child")
        .id;
    let shown = t.run(&["inspect", &parent.to_string()]).ok();
    assert!(shown.contains("children (1):\nID "), "{shown}");
    assert!(shown.contains(&child.to_string()), "{shown}");
    let doc = t.json(&["inspect", &parent.to_string()]);
    assert_eq!(doc["children"][0]["parent"], parent.to_string());
    let shown = t.run(&["inspect", &child.to_string()]).ok();
    assert!(
        shown.contains(&format!("parent:     {parent}\n")),
        "{shown}"
    );
    assert!(shown.contains("payload: (empty)\n"), "{shown}");

    t.kill(child, "fanout", "first line\nsecond line").await;
    let dead = t.json(&["list", "--queue", "fanout", "--state", "dead"]);
    assert_eq!(dead["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(dead["jobs"][0]["last_error"], "first line\nsecond line");
    let table = t
        .run(&["list", "--queue", "fanout", "--state", "dead"])
        .ok();
    assert!(
        table.contains("first line second line"),
        "one line per job: {table}"
    );
    let queued = t.json(&["list", "--queue", "fanout", "--state", "queued"]);
    assert_eq!(queued["jobs"][0]["id"], parent.to_string());
    // Retry by id, and by a filter with nothing in it.
    assert_eq!(
        t.run(&["retry", &child.to_string()]).ok(),
        "retried 1 job\n"
    );
    let none = t
        .run(&["retry", "--queue", "fanout", "--state", "dead"])
        .ok();
    assert_eq!(none, "no dead jobs of queue fanout to retry\n");
    let none = t.json(&["retry", "--queue", "fanout", "--state", "dead", "--yes"]);
    assert_eq!(
        (none["count"].as_u64(), none["done"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_across_queues_by_tag_and_inspect_shows_attempts() {
    let (_dir, t) = sqlite().await;
    let tagged = t
        .store
        .enqueue(NewJob::new("mail.welcome").tag("customer", "42"))
        .await
        .expect("tagged")
        .id;
    let other = t
        .store
        .enqueue(NewJob::new("mail.digest").tag("customer", "7"))
        .await
        .expect("other")
        .id;
    let elsewhere = t.enqueue(&["billing", "{}"]);
    let ids = |doc: serde_json::Value| -> Vec<String> {
        doc["jobs"]
            .as_array()
            .map(|jobs| {
                jobs.iter()
                    .map(|j| j["id"].to_string().replace('"', ""))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        ids(t.json(&["list"])),
        [elsewhere, other, tagged].map(|id| id.to_string()),
        "without --queue every queue is listed, newest first"
    );
    assert_eq!(
        ids(t.json(&["list", "--prefix", "mail."])),
        [other, tagged].map(|id| id.to_string())
    );
    assert_eq!(
        ids(t.json(&["list", "--tag", "customer=42"])),
        [tagged.to_string()]
    );
    assert!(ids(t.json(&["list", "--tag", "customer=4"])).is_empty());
    t.kill(tagged, "mail.welcome", "smtp refused").await;
    assert_eq!(
        ids(t.json(&["list", "--state", "dead", "--state", "queued", "--prefix", "mail."])),
        [other, tagged].map(|id| id.to_string())
    );
    let shown = t.run(&["inspect", &tagged.to_string()]).ok();
    assert!(shown.contains("attempts (1):"), "{shown}");
    assert!(shown.contains("failed"), "{shown}");
    assert!(shown.contains("smtp refused"), "{shown}");
    assert!(
        shown.contains("customer=42"),
        "inspect shows the tags: {shown}"
    );
    let doc = t.json(&["inspect", &tagged.to_string()]);
    assert_eq!(doc["job"]["tags"]["customer"], "42");
    assert_eq!(doc["attempts"][0]["outcome"], "failed");
    assert_eq!(doc["attempts"][0]["error"], "smtp refused");
    assert_eq!(doc["attempts"][0]["token"], 1);
}

/// `enqueue --after` makes a job that waits (CONTRACT G1); `inspect` shows what it
/// waits for and where each stands, `queues` counts it waiting, and a failed
/// dependency's cancellation is what `inspect` then explains (G3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_after_waits_and_inspect_shows_what_for() {
    let (_dir, t) = sqlite().await;
    let charge = t.enqueue(&["charge"]);
    let email = t.enqueue(&["email", "--after", &charge.to_string()]);
    assert_eq!(t.state(email).await, JobState::Waiting);
    let shown = t.run(&["inspect", &email.to_string()]).ok();
    assert!(
        shown.contains("waits for (0 of 1 succeeded; if one fails: cancel):\nID "),
        "{shown}"
    );
    assert!(shown.contains(&charge.to_string()), "{shown}");
    let doc = t.json(&["inspect", &email.to_string()]);
    assert_eq!(doc["job"]["state"], "waiting");
    assert_eq!(doc["depends_on"][0]["id"], charge.to_string());
    assert_eq!(doc["depends_on"][0]["state"], "queued");
    let queues = t.json(&["queues"]);
    let email_queue = queues["queues"]
        .as_array()
        .and_then(|all| all.iter().find(|q| q["queue"] == "email"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(email_queue["waiting"], 1, "{queues}");

    t.kill(charge, "charge", "card declined").await;
    let shown = t.run(&["inspect", &email.to_string()]).ok();
    assert!(
        shown.contains(&format!("cancelled: dependency {charge} ended dead")),
        "{shown}"
    );
    // A bad id is refused before anything is opened or written.
    t.run(&["enqueue", "email", "--after", "not-an-id"])
        .usage_error();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_prints_an_outcome_and_fails_unless_it_succeeded() {
    let (_dir, t) = sqlite().await;
    // A job that ends while `durq wait` waits, in another process.
    let report = t.enqueue(&["reports"]);
    let waiting = {
        let args: Vec<String> = ["wait", &report.to_string(), "--timeout", "60s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (url, namespace) = (t.url.clone(), t.namespace.clone());
        std::thread::spawn(move || {
            let mut all = vec!["--url", url.as_str(), "-n", namespace.as_str()];
            all.extend(args.iter().map(String::as_str));
            common::durq(&all)
        })
    };
    let claimed = t.claim(report, "reports", "w").await;
    t.store
        .complete(
            report,
            claimed.token(),
            Some(b"\"42 rows\"".to_vec().into()),
        )
        .await
        .expect("complete");
    let shown = waiting.join().expect("the waiting thread").ok();
    assert!(
        shown.starts_with(&format!("{report}: succeeded\n")),
        "{shown}"
    );
    assert!(shown.contains("42 rows"), "{shown}");
    let doc = t.json(&["wait", &report.to_string()]);
    assert_eq!(doc["job"]["state"], "succeeded");
    assert_eq!(doc["result"]["json"], "42 rows", "{doc}");

    // A dead job fails the command with its error; so does a timeout.
    let charge = t.enqueue(&["charge"]);
    t.kill(charge, "charge", "card declined").await;
    t.run(&["wait", &charge.to_string()])
        .fails_with(&format!("job {charge} ended dead: card declined"));
    let queued = t.enqueue(&["later"]);
    t.run(&["wait", &queued.to_string(), "--timeout", "0s"])
        .fails_with(&format!(
            "job {queued} has not ended after 0s (it is queued)"
        ));
    t.run(&["wait", "not-an-id"]).usage_error();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_steps_and_retry_from_reopens_from_one() {
    let (_dir, t) = sqlite().await;
    let order = t.enqueue(&["checkout"]);
    let claimed = t.claim(order, "checkout", "w").await;
    for (step, output) in [("charge", "\"ch_42\""), ("email", "\"sent\"")] {
        t.store
            .save_step(
                order,
                claimed.token(),
                step,
                output.as_bytes().to_vec().into(),
            )
            .await
            .expect("save a step");
    }
    t.store
        .complete(order, claimed.token(), None)
        .await
        .expect("complete");
    let shown = t.run(&["inspect", &order.to_string()]).ok();
    assert!(
        shown.contains("steps (generation 0, 2 saved):\nSTEP "),
        "{shown}"
    );
    assert!(shown.contains("ch_42"), "{shown}");
    let doc = t.json(&["inspect", &order.to_string()]);
    assert_eq!(doc["steps"]["generation"], 0, "{doc}");
    assert_eq!(doc["steps"]["steps"][1]["name"], "email", "{doc}");
    assert_eq!(doc["steps"]["steps"][0]["output"]["json"], "ch_42", "{doc}");

    // A stale generation is refused and writes nothing; the right one reopens.
    t.run(&[
        "retry-from",
        &order.to_string(),
        "email",
        "--generation",
        "3",
    ])
    .fails_with(&format!(
        "cannot reopen job {order} at generation 3: it is at generation 0"
    ));
    assert_eq!(t.state(order).await, JobState::Succeeded);
    let shown = t
        .run(&[
            "retry-from",
            &order.to_string(),
            "email",
            "--generation",
            "0",
        ])
        .ok();
    assert_eq!(
        shown,
        format!("reopened job {order} from step email (generation 1): queued\n")
    );
    assert_eq!(t.state(order).await, JobState::Queued);
    let log = t.store.steps(order).await.expect("steps");
    let names: Vec<_> = log.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((log.generation, names), (1, vec!["charge"]));
    // Without --generation, the job's own; a queued job has not ended.
    t.run(&["retry-from", &order.to_string(), "charge"])
        .fails_with(&format!("cannot retry_from job {order}: it is queued"));
    t.run(&["retry-from", &order.to_string(), "bad name"])
        .usage_error();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_prints_a_page_and_the_cursor_to_read_on_from() {
    let (_dir, t) = sqlite().await;
    let job = t.enqueue(&["import"]);
    let claimed = t.claim(job, "import", "w").await;
    for done in ["10", "20", "30"] {
        t.store
            .emit(
                job,
                claimed.token(),
                "progress",
                format!("{{\"done\":{done}}}").into_bytes().into(),
            )
            .await
            .expect("emit");
    }

    let shown = t.run(&["events", "--limit", "2"]).ok();
    assert!(
        shown.starts_with("CURSOR ") && shown.contains("emitted"),
        "{shown}"
    );
    assert!(shown.contains("progress {"), "{shown}");
    let next = shown
        .lines()
        .last()
        .and_then(|line| line.strip_prefix("next: "))
        .expect("the page ends with its next cursor")
        .to_owned();
    let doc = t.json(&["events", "--after", &next]);
    let events = doc["events"].as_array().expect("an array of events");
    assert_eq!(events.len(), 1, "{doc}");
    assert_eq!(events[0]["kind"], "emitted", "{doc}");
    assert_eq!(events[0]["job"], job.to_string(), "{doc}");
    assert_eq!(events[0]["data"]["json"]["done"], 30, "{doc}");
    assert_eq!(doc["trimmed"], false, "{doc}");
    let last = doc["next"].as_str().expect("next").to_owned();
    assert_eq!(
        t.run(&["events", "--after", &last]).ok(),
        format!("no events after this cursor\nnext: {last}\n")
    );

    t.store.trim_events(1).await.expect("trim");
    let shown = t.run(&["events"]).ok();
    assert!(
        shown.starts_with("events after this cursor were trimmed away"),
        "{shown}"
    );
    t.run(&["events", "--after", "7"]).usage_error();
    t.run(&["events", "--limit", "0"]).usage_error();
}
