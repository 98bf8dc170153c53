//! `durq dashboard`: the binary serves the dashboard crate's router on the address it
//! was given, with the token and read-only mode it was given, and refuses an open
//! address without a token. The test waits for the line the binary prints once it has
//! bound its address, never for a time.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use common::Target;

/// A running `durq dashboard`, killed when dropped.
struct Served {
    child: Child,
    address: String,
    /// Kept open, so what the server writes to stderr later has a reader.
    _stderr: BufReader<std::process::ChildStderr>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `durq --url URL dashboard --listen 127.0.0.1:0 args…` and waits for it to say
/// where it listens.
fn serve(t: &Target, args: &[&str], env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_durq"))
        .args(["--url", &t.url, "-n", &t.namespace, "dashboard"])
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("DURQ_DASHBOARD_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start jobs dashboard");
    let mut line = String::new();
    let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
    let read = stderr.read_line(&mut line);
    // Killed from here on, whatever the line says.
    let mut served = Served {
        child,
        address: String::new(),
        _stderr: stderr,
    };
    read.expect("read stderr");
    let address = line
        .strip_prefix("jobs: serving the dashboard at http://")
        .and_then(|rest| rest.split_once('/'))
        .map(|(address, _)| address.to_owned())
        .unwrap_or_else(|| panic!("the address line, not {line:?}"));
    served.address = address;
    served
}

/// One HTTP/1.1 exchange; the status code and the body.
fn request(address: &str, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for header in headers {
        text.push_str(header);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("receive");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP response, not {response:?}"));
    (status, response)
}

const FORM: &str = "Content-Type: application/x-www-form-urlencoded";

async fn store() -> (tempfile::TempDir, Target) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let target = Target::open(&url, "cli-test").await.expect("open sqlite");
    (dir, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_shows_the_store_and_refuses_actions() {
    let (_dir, t) = store().await;
    t.enqueue(&["emails", "{}"]);
    let served = serve(&t, &["--read-only"], &[]);
    let (status, page) = request(&served.address, "GET", "/", &[], "");
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("emails"),
        "the overview lists the queue: {page}"
    );
    let (status, _) = request(
        &served.address,
        "POST",
        "/queue/pause",
        &[FORM],
        "queue=emails",
    );
    assert_eq!(status, 403);
    assert!(!t.store.stats("emails").await.expect("stats").paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_comes_from_the_environment_and_guards_actions() {
    let (_dir, t) = store().await;
    t.enqueue(&["emails", "{}"]);
    let served = serve(&t, &[], &[("DURQ_DASHBOARD_TOKEN", "s3cret")]);
    let (status, _) = request(
        &served.address,
        "POST",
        "/queue/pause",
        &[FORM],
        "queue=emails",
    );
    assert!(matches!(status, 401 | 403), "no token, no action: {status}");
    assert!(!t.store.stats("emails").await.expect("stats").paused);
    let bearer = "Authorization: Bearer s3cret";
    let (status, response) = request(
        &served.address,
        "POST",
        "/queue/pause",
        &[FORM, bearer],
        "queue=emails",
    );
    assert!(status < 400, "{response}");
    assert!(t.store.stats("emails").await.expect("stats").paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_address_needs_a_token() {
    let (_dir, t) = store().await;
    t.run(&["dashboard", "--listen", "0.0.0.0:0"])
        .fails_with("without a token");
    t.run(&["dashboard", "--listen", "localhost:8080"])
        .usage_error();
}
