//! The servers a chaos run starts, kills and asks: its own `redis-server`, and `psql`.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_server;

/// A worker or producer process of the run.
pub(super) struct Proc {
    pub(super) child: Child,
    /// Closing it asks the process to stop gracefully.
    pub(super) stdin: Option<ChildStdin>,
    /// The PostgreSQL application_name of its connections.
    pub(super) app_name: String,
}

/// The Redis this task runs for the redis backend: AOF on every write, so a SIGKILL
/// loses nothing acknowledged, on its own port and directory.
pub(super) struct RedisServer {
    pub(super) dir: PathBuf,
    pub(super) child: Option<Child>,
}

impl RedisServer {
    pub(super) fn start(dir: &Path) -> Result<RedisServer, String> {
        if redis_server::answers_ping(REDIS_PORT) {
            return Err(format!(
                "port {REDIS_PORT} already answers PING: another server is there"
            ));
        }
        fs::create_dir_all(dir).map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        let mut server = RedisServer {
            dir: dir.to_path_buf(),
            child: None,
        };
        server.spawn()?;
        Ok(server)
    }

    pub(super) fn spawn(&mut self) -> Result<(), String> {
        let extra = ["--appendonly", "yes", "--appendfsync", "always"];
        let child = self
            .child
            .insert(redis_server::spawn(REDIS_PORT, &self.dir, &extra)?);
        redis_server::wait_until_up(REDIS_PORT, child, Instant::now() + Duration::from_secs(30))
    }

    /// SIGKILL, like a crash: whatever the AOF holds is what comes back.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(super) fn redis_cli(args: &[&str]) -> Result<String, String> {
    redis_server::redis_cli(REDIS_PORT, args)
}

pub(super) fn psql(url: &str, sql: &str) -> Result<String, String> {
    let output = Command::new("psql")
        .args([url, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run psql: {err}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "psql failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
