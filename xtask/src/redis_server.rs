//! Throwaway redis-server processes on their own ports and directories, for the
//! cluster conformance run and the chaos suite: started, probed and asked things with
//! `redis-cli`, the same way in both.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How often a starting server is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// Runs `redis-cli` against the server on `port`; its output, or why it failed.
pub fn redis_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run redis-cli: {err}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("redis-cli exited with {}", output.status))
    }
}

/// Whether a server answers PING on `port`.
pub fn answers_ping(port: u16) -> bool {
    redis_cli(port, &["ping"]).is_ok_and(|out| out.contains("PONG"))
}

/// Starts a redis-server on `port` with its files (and `redis.log`) in `dir`, in the
/// foreground of the returned child, no RDB snapshots, plus `extra` arguments.
pub fn spawn(port: u16, dir: &Path, extra: &[&str]) -> Result<Child, String> {
    let log = dir.join("redis.log").display().to_string();
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--dir", &dir.display().to_string(), "--save", ""])
        .args(["--daemonize", "no", "--logfile", &log])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| format!("cannot start redis-server on port {port}: {err}"))
}

/// Waits until the server `child` started on `port` answers PING, or fails when it
/// exits or `deadline` passes.
pub fn wait_until_up(port: u16, child: &mut Child, deadline: Instant) -> Result<(), String> {
    loop {
        if answers_ping(port) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "redis-server on port {port} exited ({status}); see its redis.log"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("redis-server on port {port} does not answer PING"));
        }
        // Waiting for a process to start listening: there is nothing to be told by.
        thread::sleep(PROBE_INTERVAL);
    }
}

/// Stops the server `child` on `port`: a polite shutdown first, a kill if it has not
/// exited within 5 s.
pub fn stop(port: u16, child: &mut Child) {
    let _ = redis_cli(port, &["shutdown", "nosave"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
        thread::sleep(PROBE_INTERVAL);
    }
    if !matches!(child.try_wait(), Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
    }
}
