//! Counters read before and after a drain, so a result says what bounds it: CPU spent
//! in this process (the client) and in the server, and the server's own counts of
//! commands, transactions and WAL flushes.
//!
//! Server counters are server-wide: other clients of a shared server add to them, so
//! they are an upper bound for this run's share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::report::Line;

/// CPU time this process has used (user + system), in microseconds, from
/// `/proc/self/stat`; `None` where that is not readable.
fn process_cpu_us(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')'.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000_000.0 / clock_ticks())
}

/// Kernel clock ticks per second, as `/proc` counts CPU time. 100 on every Linux
/// configuration in use (`USER_HZ`).
fn clock_ticks() -> f64 {
    100.0
}

/// CPU time of every local process whose command name is `name`, in microseconds, by
/// process id. `named` remembers, per process id, whether its name was `name`, so
/// each process's name is read once, not at every sample: reading every process's
/// name 50 times a second put `/proc` lookups among the top kernel symbols of a
/// PostgreSQL end-to-end profile of this binary, on two cores shared with the server.
fn processes_cpu_us(name: &str, named: &mut HashMap<u32, bool>) -> Option<HashMap<u32, f64>> {
    let mut found = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        let Ok(number) = pid.parse::<u32>() else {
            continue;
        };
        let is_named = *named.entry(number).or_insert_with(|| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == name)
        });
        if is_named {
            if let Some(cpu) = process_cpu_us(&pid) {
                found.insert(number, cpu);
            }
        }
    }
    (!found.is_empty()).then_some(found)
}

/// How often [`ServerCpu`] reads the server's processes. A pooled connection's backend
/// lives as long as its pool, which ends after the measurement, so a sample this
/// seldom loses nothing in practice and wakes this process five times less than one
/// every 20 ms did.
const SERVER_CPU_SAMPLE: Duration = Duration::from_millis(100);

/// The CPU time the processes of a server named `name` spend from its start to its
/// end, read every [`SERVER_CPU_SAMPLE`] meanwhile: a process that ends during the
/// run (a pooled connection's backend, closed with its pool) takes its CPU time with
/// it from `/proc`, so a reading only at the ends would lose it. A process is counted
/// from its first reading (zero if it started during the run) to its last, so at most
/// one sampling interval of a process that ends is lost.
struct ServerCpu {
    stop: Arc<AtomicBool>,
    /// Answers what it read, and the CPU time the sampling cost this process.
    sampler: std::thread::JoinHandle<(Readings, Option<f64>)>,
}

/// Per process id, its CPU time (µs) when first and when last read.
type Readings = HashMap<u32, (f64, f64)>;

impl ServerCpu {
    fn start(name: &'static str) -> ServerCpu {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let sampler = std::thread::spawn(move || {
            // pid -> (CPU time when first seen, when last seen).
            let mut seen = Readings::new();
            let mut named = HashMap::new();
            let mut first = true;
            loop {
                let last = stopping.load(Ordering::Acquire);
                for (pid, cpu) in processes_cpu_us(name, &mut named).unwrap_or_default() {
                    let from = if first { cpu } else { 0.0 };
                    seen.entry(pid).or_insert((from, cpu)).1 = cpu;
                }
                first = false;
                if last {
                    return (seen, process_cpu_us("thread-self"));
                }
                std::thread::sleep(SERVER_CPU_SAMPLE);
            }
        });
        ServerCpu { stop, sampler }
    }

    /// The server's CPU time since the start, and this sampler's own, in microseconds.
    fn finish(self) -> (Option<f64>, Option<f64>) {
        self.stop.store(true, Ordering::Release);
        let Ok((seen, own)) = self.sampler.join() else {
            return (None, None);
        };
        let server =
            (!seen.is_empty()).then(|| seen.values().map(|(from, to)| (to - from).max(0.0)).sum());
        (server, own)
    }
}

/// A snapshot of the counters.
#[derive(Debug, Default, Clone)]
struct Snapshot {
    client_cpu_us: Option<f64>,
    server_cpu_us: Option<f64>,
    /// Scripts run (Redis) or committed transactions (PostgreSQL).
    server_ops: Option<f64>,
    /// WAL flushes to disk (PostgreSQL `pg_stat_wal.wal_sync`).
    wal_syncs: Option<f64>,
    /// Each Redis node's CPU time (µs), in the order of `redis_nodes`, when there are
    /// several: how the work spread over a cluster's masters.
    node_cpu_us: Vec<f64>,
}

/// Counters taken at the start of a measurement.
pub struct Probe {
    backend: String,
    start: Snapshot,
    /// The server's CPU time, where it is read from its processes.
    server_cpu: Option<ServerCpu>,
}

impl Probe {
    /// Reads the counters now.
    pub async fn start(backend: &str) -> Probe {
        let server_cpu = (backend == "postgres").then(|| ServerCpu::start("postgres"));
        Probe {
            backend: backend.to_owned(),
            start: snapshot(backend).await,
            server_cpu,
        }
    }

    /// Reads the counters again and adds what was spent per job to `line`.
    pub async fn finish(self, jobs: u64, line: Line) -> Line {
        if self.backend == "postgres" {
            // Backends publish their statistics at most once a second.
            let settle = std::time::Duration::from_millis(1_100);
            tokio::time::sleep_until(tokio::time::Instant::now() + settle).await;
        }
        let mut end = snapshot(&self.backend).await;
        if let Some(sampled) = self.server_cpu {
            let (server, sampling) = sampled.finish();
            end.server_cpu_us = server;
            // The sampler's own CPU time is the bench's, not the client's.
            if let (Some(client), Some(sampling)) = (end.client_cpu_us.as_mut(), sampling) {
                *client -= sampling;
            }
        }
        let per_job = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if jobs > 0 => Some((b - a).max(0.0) / jobs as f64),
            _ => None,
        };
        let mut line = line;
        if let Some(v) = per_job(self.start.client_cpu_us, end.client_cpu_us) {
            line = line.num("client_cpu_us_per_job", v);
        }
        // A sampled server's figure is already the difference.
        let server_start = self.start.server_cpu_us.or(Some(0.0));
        if let Some(v) = per_job(server_start, end.server_cpu_us) {
            line = line.num("server_cpu_us_per_job", v);
        }
        if let Some(v) = per_job(self.start.server_ops, end.server_ops) {
            let key = if self.backend == "postgres" {
                "commits_per_job"
            } else {
                "scripts_per_job"
            };
            line = line.num(key, v);
        }
        if let Some(v) = per_job(self.start.wal_syncs, end.wal_syncs) {
            line = line.num("wal_syncs_per_job", v);
        }
        // Each node's share of the server CPU the run cost, when there are several.
        if self.start.node_cpu_us.len() > 1 && self.start.node_cpu_us.len() == end.node_cpu_us.len()
        {
            let spent: Vec<f64> = self
                .start
                .node_cpu_us
                .iter()
                .zip(&end.node_cpu_us)
                .map(|(a, b)| (b - a).max(0.0))
                .collect();
            let total: f64 = spent.iter().sum();
            if total > 0.0 {
                for (node, cpu) in spent.iter().enumerate() {
                    line = line.num(&format!("node{node}_cpu_share"), cpu / total);
                }
            }
        }
        line
    }
}

async fn snapshot(backend: &str) -> Snapshot {
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(unused_mut))]
    let mut snap = Snapshot {
        client_cpu_us: process_cpu_us("self"),
        ..Snapshot::default()
    };
    match backend {
        #[cfg(feature = "redis")]
        "redis" => {
            // Every node's counters; a node that does not answer leaves the figures out.
            let mut nodes = Vec::new();
            for node in crate::backends::redis_nodes() {
                match redis_counters(&node).await {
                    Some(counters) => nodes.push(counters),
                    None => {
                        nodes.clear();
                        break;
                    }
                }
            }
            if !nodes.is_empty() {
                snap.server_cpu_us = Some(nodes.iter().map(|(cpu, _)| cpu).sum());
                snap.server_ops = Some(nodes.iter().map(|(_, scripts)| scripts).sum());
                if nodes.len() > 1 {
                    snap.node_cpu_us = nodes.iter().map(|(cpu, _)| *cpu).collect();
                }
            }
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            if let Some((commits, syncs)) = postgres_counters().await {
                snap.server_ops = Some(commits);
                snap.wal_syncs = syncs;
            }
        }
        _ => {}
    }
    snap
}

/// A Redis server's CPU time (`used_cpu_user + used_cpu_sys`, µs) and the scripts it
/// ran.
#[cfg(feature = "redis")]
async fn redis_counters(url: &str) -> Option<(f64, f64)> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(&mut conn)
        .await
        .ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let cpu = (field("used_cpu_user:")? + field("used_cpu_sys:")?) * 1_000_000.0;
    // Round trips: the scripts and commands clients sent, not the commands scripts ran
    // (`total_commands_processed` counts both).
    let calls = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let scripts = calls("cmdstat_evalsha:") + calls("cmdstat_eval:") + calls("cmdstat_evalsha_ro:");
    Some((cpu, scripts))
}

/// Transactions committed in the current database, and WAL syncs server-wide.
#[cfg(feature = "postgres")]
async fn postgres_counters() -> Option<(f64, Option<f64>)> {
    let pool = sqlx::PgPool::connect(&crate::backends::postgres_url())
        .await
        .ok()?;
    let commits: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await
    .ok()?;
    let syncs: Option<i64> = sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
        .fetch_one(&pool)
        .await
        .ok();
    pool.close().await;
    Some((commits as f64, syncs.map(|s| s as f64)))
}
