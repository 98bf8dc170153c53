//! Counters read before and after a drain, so a result says what bounds it: CPU spent
//! in this process (the client) and in the server, and the server's own counts of
//! commands, transactions and WAL flushes.
//!
//! Server counters are server-wide: other clients of a shared server add to them, so
//! they are an upper bound for this run's share.

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

/// CPU time of every local process whose command name is `name`, in microseconds.
fn processes_cpu_us(name: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == name {
            if let Some(cpu) = process_cpu_us(&pid) {
                total += cpu;
                found = true;
            }
        }
    }
    found.then_some(total)
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
}

/// Counters taken at the start of a measurement.
pub struct Probe {
    backend: String,
    start: Snapshot,
}

impl Probe {
    /// Reads the counters now.
    pub async fn start(backend: &str) -> Probe {
        Probe {
            backend: backend.to_owned(),
            start: snapshot(backend).await,
        }
    }

    /// Reads the counters again and adds what was spent per job to `line`.
    pub async fn finish(self, jobs: u64, line: Line) -> Line {
        if self.backend == "postgres" {
            // Backends publish their statistics at most once a second.
            let settle = std::time::Duration::from_millis(1_100);
            tokio::time::sleep_until(tokio::time::Instant::now() + settle).await;
        }
        let end = snapshot(&self.backend).await;
        let per_job = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if jobs > 0 => Some((b - a).max(0.0) / jobs as f64),
            _ => None,
        };
        let mut line = line;
        if let Some(v) = per_job(self.start.client_cpu_us, end.client_cpu_us) {
            line = line.num("client_cpu_us_per_job", v);
        }
        if let Some(v) = per_job(self.start.server_cpu_us, end.server_cpu_us) {
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
            if let Some((cpu, commands)) = redis_counters().await {
                snap.server_cpu_us = Some(cpu);
                snap.server_ops = Some(commands);
            }
        }
        #[cfg(feature = "postgres")]
        "postgres" => {
            snap.server_cpu_us = processes_cpu_us("postgres");
            if let Some((commits, syncs)) = postgres_counters().await {
                snap.server_ops = Some(commits);
                snap.wal_syncs = syncs;
            }
        }
        _ => {
            let _ = processes_cpu_us;
        }
    }
    snap
}

/// Redis's CPU time (`used_cpu_user + used_cpu_sys`, µs) and the scripts it ran.
#[cfg(feature = "redis")]
async fn redis_counters() -> Option<(f64, f64)> {
    let client = redis::Client::open(crate::backends::redis_url().as_str()).ok()?;
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
