//! A store whose Redis server is killed and started again on the same port reconnects as
//! soon as the server answers again (docs/redis.md, "Reconnecting"; issue #30): within
//! the reconnect back-off cap, not after a back-off of seconds.
//!
//! Runs a `redis-server` of its own on a free port (never the shared server, which other
//! tests use); skipped loudly when `redis-server` is not installed, failing instead when
//! `JOBS_REQUIRE_SERVICES=1`. The server is killed when the test ends, passed or failed.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durq_core::{Store, StoreSettings};
use durq_redis::RedisBackend;

/// The reconnect back-off cap the store states (docs/redis.md): once the server answers,
/// a waiting call's next connection attempt starts within this.
const CAP: Duration = Duration::from_millis(200);
/// Allowed on top of the cap: the caller's own pause when the server came back during
/// it (at most 400 ms here), and a loaded machine.
const MARGIN: Duration = Duration::from_millis(800);
/// How long the server stays down: long enough for a series of reconnect attempts to
/// fail while the caller backs off (before issue #30's fix, several did, and the last
/// one's refusal was handed to the first call after the restart). The incident's
/// restarts: down 0.1–1.5 s, then the AOF replayed.
const OUTAGE: Duration = Duration::from_millis(3_500);

/// A redis-server of the test's own, without persistence, killed when dropped (even
/// when the test panics).
struct OwnServer {
    child: Option<Child>,
    port: u16,
}

impl OwnServer {
    /// `None` (skipped loudly, or failing under JOBS_REQUIRE_SERVICES=1) when
    /// `redis-server` is not installed.
    async fn start() -> Option<OwnServer> {
        if let Err(err) = Command::new("redis-server").arg("--version").output() {
            return durq_conformance::skip_or_fail("redis-server (binary)", "PATH", &err);
        }
        // A port nothing listens on now: bound by the OS, then released for the server.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("a free port");
        let mut server = OwnServer { child: None, port };
        server.spawn().await;
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server and returns the instant it first answered a PING.
    async fn spawn(&mut self) -> Instant {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).expect("url");
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        for _ in 0..2_000 {
            if let Ok(mut conn) = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                let pong: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return Instant::now();
                }
            }
            // Waiting for a process to start listening, not for an expiry.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// SIGKILL: the server is gone at once, its port refuses connections.
    fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("reap redis-server");
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// One store call: when it started and ended, and its error if it failed.
struct Call {
    started: Instant,
    ended: Instant,
    error: Option<durq_core::Error>,
}

/// Calls the store as a worker's claim loop does until `stop`: one call after another,
/// and after a failed one a pause of 100 ms doubling to 1 s (the worker runtime's
/// back-off after a failed store call), reset by a success.
fn call_like_a_worker(
    store: Store,
    calls: Arc<Mutex<Vec<Call>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let first = Duration::from_millis(100);
        let mut pause = first;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            // A script call (EVALSHA, loaded again after the restart) and a plain
            // command, sent together.
            let error = store.stats("q").await.err();
            let ended = Instant::now();
            let failed = error.is_some();
            calls.lock().expect("lock").push(Call {
                started,
                ended,
                error,
            });
            if failed {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            } else {
                pause = first;
            }
        }
    })
}

/// Issue #30: a store called as a worker calls it, whose server is killed (SIGKILL) and
/// started again on the same port after a few seconds, succeeds again within the
/// back-off cap of the server answering: no call made after the server answers fails,
/// and the wake-up subscriber is back within the same cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_found_again_within_the_reconnect_cap() {
    let Some(mut server) = OwnServer::start().await else {
        return;
    };
    let settings = StoreSettings::default().namespace("restart");
    let redis = RedisBackend::connect(&server.url(), settings)
        .await
        .expect("connect");
    let store = Store::new(redis.clone());
    store.stats("q").await.expect("a call before the kill");
    assert!(
        redis.wake_ready(Duration::from_secs(5)).await,
        "the wake-up subscriber did not subscribe"
    );

    let calls = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let caller = call_like_a_worker(store.clone(), Arc::clone(&calls), Arc::clone(&stop));
    // Calls go through, then the server is killed under them.
    while calls.lock().expect("lock").is_empty() {
        tokio::task::yield_now().await;
    }
    let killed = Instant::now();
    server.kill_9();
    // The outage: the calls fail meanwhile (the caller keeps calling).
    tokio::time::sleep(OUTAGE).await;
    assert!(
        !redis.wake_ready(Duration::ZERO).await,
        "the subscriber cannot be subscribed to a killed server"
    );
    let answering = server.spawn().await;
    let resubscribing = {
        let redis = redis.clone();
        tokio::spawn(async move {
            let subscribed = redis.wake_ready(Duration::from_secs(20)).await;
            (subscribed, answering.elapsed())
        })
    };

    // The caller's first success once the server answers (given up long after any
    // bound, so that a slow reconnect is measured rather than cut short).
    let first_success = loop {
        let success = calls
            .lock()
            .expect("lock")
            .iter()
            .find(|call| call.error.is_none() && call.ended >= answering)
            .map(|call| call.ended);
        if success.is_some() || answering.elapsed() > Duration::from_secs(20) {
            break success;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (subscribed_again, resubscribed) = resubscribing.await.expect("the subscriber wait");
    stop.store(true, Ordering::Relaxed);
    caller.await.expect("the caller panicked");

    let calls = calls.lock().expect("lock");
    let failed_in_outage = calls
        .iter()
        .filter(|call| call.error.is_some() && call.ended >= killed && call.ended < answering)
        .count();
    // Calls made after the server answered that failed all the same.
    let failed_after: Vec<String> = calls
        .iter()
        .filter(|call| call.started >= answering)
        .filter_map(|call| call.error.as_ref())
        .map(|err| err.to_string())
        .collect();
    let took = first_success.map(|at| at.duration_since(answering));
    eprintln!(
        "server down for {:?}; {failed_in_outage} calls failed meanwhile; \
         the first success came {took:?} after the server answered again, \
         {} failed calls made after it answered; the subscriber was back after {resubscribed:?}",
        answering.duration_since(killed),
        failed_after.len(),
    );
    for err in calls.iter().filter_map(|call| call.error.as_ref()) {
        assert!(
            err.is_retryable(),
            "a lost server must be Unavailable: {err:?}"
        );
    }
    assert!(
        failed_in_outage > 0,
        "calls kept succeeding without a server"
    );
    let took = took.expect("the store never reconnected");
    assert!(
        took < CAP + MARGIN,
        "the store took {took:?} to succeed again after its server answered \
         (cap {CAP:?}; calls that failed after it answered: {failed_after:?})"
    );
    assert!(
        failed_after.is_empty(),
        "calls made after the server answered again failed: {failed_after:?}"
    );
    assert!(subscribed_again, "the wake-up subscriber never came back");
    assert!(
        resubscribed < CAP + MARGIN,
        "the wake-up subscriber took {resubscribed:?} to subscribe again (cap {CAP:?})"
    );
}
