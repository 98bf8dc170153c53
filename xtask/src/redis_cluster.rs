//! A throwaway 3-master Redis Cluster on loopback ports, for
//! `cargo xtask conformance --backend redis-cluster`. Standard library only.
//!
//! [`with_cluster`] starts `redis-server --cluster-enabled yes` on ports
//! `base..base+2` (no persistence, files in a temporary directory), joins them with
//! `redis-cli --cluster create … --cluster-replicas 0 --cluster-yes`, waits until every
//! node reports `cluster_state:ok`, runs the caller's closure with the node URLs, and
//! always stops the servers and removes the directory afterwards, on success, on error
//! and on panic alike.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::redis_server::{self, redis_cli};
use std::thread;
use std::time::{Duration, Instant};

/// How many masters the cluster has.
const NODES: u16 = 3;
/// How long a server may take to answer PING, and the cluster to report ok.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);
/// The pause between two readiness probes (a poll of an external process, not a test).
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Starts a 3-master cluster on `base_port..base_port + 2`, calls `f` with the node URLs
/// (`redis://127.0.0.1:PORT`), and stops the cluster whatever `f` returns.
pub fn with_cluster<T>(
    base_port: u16,
    f: impl FnOnce(&[String]) -> Result<T, String>,
) -> Result<T, String> {
    let ports: Vec<u16> = (0..NODES)
        .map(|i| {
            base_port
                .checked_add(i)
                .ok_or_else(|| format!("base port {base_port} leaves no room for {NODES} nodes"))
        })
        .collect::<Result<_, _>>()?;
    let dir = std::env::temp_dir().join(format!(
        "durq-redis-cluster-{}-{base_port}",
        std::process::id()
    ));
    // The guard owns the servers and the directory from here on: dropping it (at the end
    // of this function, on `?`, or while unwinding a panic of `f`) stops and removes them.
    let mut cluster = Cluster {
        dir,
        ports: ports.clone(),
        servers: Vec::new(),
    };
    cluster.start()?;
    cluster.create()?;
    cluster.wait_until_ok()?;
    let urls: Vec<String> = ports
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    eprintln!("redis-cluster: up at {}", urls.join(","));
    f(&urls)
}

struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
    servers: Vec<(u16, Child)>,
}

impl Cluster {
    fn start(&mut self) -> Result<(), String> {
        if self.dir.exists() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        for port in self.ports.clone() {
            if redis_server::answers_ping(port) {
                return Err(format!(
                    "port {port} already answers PING: another server is there"
                ));
            }
            let node_dir = self.dir.join(port.to_string());
            fs::create_dir_all(&node_dir)
                .map_err(|err| format!("cannot create {}: {err}", node_dir.display()))?;
            let child = redis_server::spawn(
                port,
                &node_dir,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--appendonly",
                    "no",
                ],
            )?;
            self.servers.push((port, child));
        }
        let deadline = Instant::now() + STARTUP_LIMIT;
        for (port, child) in &mut self.servers {
            redis_server::wait_until_up(*port, child, deadline)?;
        }
        Ok(())
    }

    fn create(&self) -> Result<(), String> {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|err| format!("cannot run redis-cli --cluster create: {err}"))?;
        if !output.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(())
    }

    fn wait_until_ok(&self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_LIMIT;
        for port in &self.ports {
            loop {
                let info = redis_cli(*port, &["cluster", "info"]).unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the cluster node on port {port} is not ok in time:\n{info}"
                    ));
                }
                thread::sleep(PROBE_INTERVAL);
            }
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (port, child) in &mut self.servers {
            redis_server::stop(*port, child);
        }
        if !self.servers.is_empty() {
            eprintln!("redis-cluster: stopped");
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
