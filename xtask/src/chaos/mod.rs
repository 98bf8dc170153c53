//! `cargo xtask chaos [--backend sqlite|redis|redis-partitioned|postgres|all] [--jobs N] [--seconds S]`:
//! the chaos suite of issue #11.
//!
//! For each backend it builds `durq-chaos` once, starts a producer and three worker
//! processes (the real `durq` runtime), and for S seconds injects faults at random
//! moments: SIGKILL of a worker (a new one starts at once), SIGKILL of the producer in
//! the middle of a batch (a new one resumes the plan, re-sending the same keys), and
//! per backend Redis `CLIENT KILL` and SIGKILL + restart of a Redis with AOF that this
//! task starts itself, PostgreSQL `pg_terminate_backend` of the workers' own
//! connections (found by their `application_name`), and for SQLite worker kills at
//! random sub-millisecond moments, which land in the middle of commits. Then it lets
//! the workers drain the queue, stops them gracefully (their standard input closes),
//! and runs `durq-chaos check` on the history. See docs/reliability.md.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::{redis_server, workspace_root};

/// The backends with several processes sharing one store. `memory` is one process's
/// private store, so there is nothing to kill but the store itself.
mod faults;
mod report;
mod servers;

pub use self::faults::seed_from_clock;
use self::faults::*;
use self::report::*;
use self::servers::*;

pub const BACKENDS: &[&str] = &["sqlite", "redis", "redis-partitioned", "postgres"];
/// The partitions of the `redis-partitioned` run's namespace (CONTRACT §8): every
/// partition a slot of its own on the one server, so claims, reclaims and completions
/// cross partitions under the same faults.
const CHAOS_PARTITIONS: usize = 12;
/// Worker processes kept running at all times.
const WORKERS: usize = 3;
/// The port of the Redis this task starts for itself: away from the shared 6379 and
/// from the throwaway cluster's 17000–17002.
const REDIS_PORT: u16 = 17_100;
/// How long the workers get to drain the queue after the faults stop.
const DRAIN_TIMEOUT_S: u64 = 60;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Backends, in order.
    pub backends: Vec<String>,
    /// Jobs in each backend's plan.
    pub jobs: u64,
    /// Seconds of faults per backend.
    pub seconds: u64,
    /// Build and run `durq-chaos` with `--release`.
    pub release: bool,
    /// The random seed (printed, so a run can be repeated).
    pub seed: u64,
}

/// `cargo xtask chaos`'s command line.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The backend to run under faults (`memory` is one process's private store, so it
    /// has no process to kill and is skipped).
    #[arg(long, value_enum, default_value_t = ChaosBackend::All)]
    backend: ChaosBackend,
    /// Jobs in each backend's plan.
    #[arg(long, default_value_t = 20_000, value_parser = crate::positive)]
    jobs: u64,
    /// Seconds of faults per backend.
    #[arg(long, default_value_t = 60, value_parser = crate::positive)]
    seconds: u64,
    /// Build and run `durq-chaos` with `--release`.
    #[arg(long)]
    release: bool,
    /// The random seed, to repeat a run (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

/// The choices of `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ChaosBackend {
    Sqlite,
    Redis,
    /// Redis with a namespace of several partitions.
    RedisPartitioned,
    Postgres,
    // Accepted so that `--backend memory` says why it is skipped.
    Memory,
    All,
}

/// `cargo xtask chaos …` from its arguments.
pub fn run(args: Args) -> Result<(), String> {
    let backends = match args.backend {
        ChaosBackend::All => BACKENDS.to_vec(),
        ChaosBackend::Sqlite => vec!["sqlite"],
        ChaosBackend::Redis => vec!["redis"],
        ChaosBackend::RedisPartitioned => vec!["redis-partitioned"],
        ChaosBackend::Postgres => vec!["postgres"],
        ChaosBackend::Memory => {
            eprintln!(
                "chaos: the memory backend lives inside one process, so no worker or \
                 producer process can be killed under it: skipped (sqlite, redis and \
                 postgres are the multi-process backends)"
            );
            return Ok(());
        }
    };
    run_with(&Options {
        backends: backends.into_iter().map(str::to_owned).collect(),
        jobs: args.jobs,
        seconds: args.seconds,
        release: args.release,
        seed: args.seed.unwrap_or_else(seed_from_clock),
    })
}

/// Runs the suite with `options`; fails if any backend fails a check.
pub fn run_with(options: &Options) -> Result<(), String> {
    let started = Instant::now();
    let root = workspace_root();
    let bin = build(&root, options.release)?;
    eprintln!(
        "chaos: seed {} ({} jobs, {} s of faults per backend)",
        options.seed, options.jobs, options.seconds
    );
    let mut rng = Rng::new(options.seed);
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for backend in &options.backends {
        eprintln!("\n==> chaos: {backend}");
        let outcome = run_backend(&root, &bin, backend, options, &mut rng);
        match outcome {
            Ok(row) => {
                if !row.passed {
                    failed.push(format!("{backend}: {}", row.failures()));
                }
                rows.push(row);
            }
            Err(err) => failed.push(format!("{backend}: {err}")),
        }
    }
    let table = table(&rows);
    println!("\n{table}");
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "chaos: {} backend(s) in {elapsed:.0} s",
        options.backends.len()
    );
    let results = chaos_root(&root).join("last-results.md");
    let _ = fs::write(
        &results,
        format!("{table}\n(seed {}, {elapsed:.0} s)\n", options.seed),
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("chaos checks failed:\n  {}", failed.join("\n  ")))
    }
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the current directory,
/// as cargo reads it) or `<root>/target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().map_or(dir.clone(), |cwd| cwd.join(dir))
            }
        }
        None => root.join("target"),
    }
}

fn chaos_root(root: &Path) -> PathBuf {
    target_dir(root).join("chaos")
}

/// Builds `durq-chaos` and returns the binary's path.
fn build(root: &Path, release: bool) -> Result<PathBuf, String> {
    let mut args = vec!["build", "-p", "durq-chaos"];
    if release {
        args.push("--release");
    }
    crate::cargo(&args, &[])?;
    let bin = target_dir(root)
        .join(if release { "release" } else { "debug" })
        .join(format!("durq-chaos{}", std::env::consts::EXE_SUFFIX));
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "built durq-chaos, but {} is not there",
            bin.display()
        ))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            redis_server::stop(REDIS_PORT, &mut child);
        }
    }
}

/// Everything one backend's run holds. Dropping it kills whatever still runs, so an
/// error or a panic leaves no process behind.
struct Run<'a> {
    backend: &'a str,
    bin: &'a Path,
    dir: PathBuf,
    url: String,
    namespace: String,
    pg_schema: Option<String>,
    /// The `application_name` prefix of this run's workers.
    app_prefix: String,
    workers: Vec<Proc>,
    producer: Option<Proc>,
    producer_lines: Option<Receiver<()>>,
    producer_done: bool,
    spawned: u32,
    faults: File,
    redis: Option<RedisServer>,
    start_us: u64,
    spread_ms: u64,
    jobs: u64,
    /// Unexpected exits and other anomalies of the processes, for the report.
    anomalies: Vec<String>,
}

impl Run<'_> {
    fn common_args(&self, app_name: &str) -> Vec<String> {
        let mut args = vec![
            "--url".to_owned(),
            self.url.clone(),
            "--namespace".to_owned(),
            self.namespace.clone(),
            "--run-dir".to_owned(),
            self.dir.display().to_string(),
            "--app-name".to_owned(),
            app_name.to_owned(),
        ];
        if let Some(schema) = &self.pg_schema {
            args.extend(["--pg-schema".to_owned(), schema.clone()]);
        }
        args
    }

    fn stderr_file(&self, name: &str) -> Result<File, String> {
        let path = self.dir.join(format!("{name}.stderr"));
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|err| format!("cannot open {}: {err}", path.display()))
    }

    fn spawn_worker(&mut self) -> Result<(), String> {
        self.spawned += 1;
        let app_name = format!("{}w{}", self.app_prefix, self.spawned);
        let mut command = Command::new(self.bin);
        command
            .arg("worker")
            .args(self.common_args(&app_name))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(self.stderr_file(&format!("worker-{}", self.spawned))?);
        let mut child = command
            .spawn()
            .map_err(|err| format!("cannot start a worker: {err}"))?;
        let stdin = child.stdin.take();
        self.workers.push(Proc {
            child,
            stdin,
            app_name,
        });
        Ok(())
    }

    fn spawn_producer(&mut self) -> Result<(), String> {
        self.spawned += 1;
        let app_name = format!("{}p{}", self.app_prefix, self.spawned);
        let mut child = Command::new(self.bin)
            .arg("producer")
            .args(self.common_args(&app_name))
            .args([
                "--jobs",
                &self.jobs.to_string(),
                "--start-us",
                &self.start_us.to_string(),
                "--spread-ms",
                &self.spread_ms.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(self.stderr_file("producer")?)
            .spawn()
            .map_err(|err| format!("cannot start the producer: {err}"))?;
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.starts_with("sending") && tx.send(()).is_err() {
                        break;
                    }
                }
            });
        }
        self.producer = Some(Proc {
            child,
            stdin,
            app_name,
        });
        self.producer_lines = Some(rx);
        Ok(())
    }

    /// Appends one line to the fault log (read by `durq-chaos check`).
    fn record(&mut self, t: u64, kind: &str, pid: Option<u32>, end: Option<u64>) {
        self.record_hits(t, kind, pid, end, None);
    }

    /// [`Run::record`] with how many connections the fault closed.
    fn record_hits(
        &mut self,
        t: u64,
        kind: &str,
        pid: Option<u32>,
        end: Option<u64>,
        hits: Option<u64>,
    ) {
        let record = serde_json::json!({
            "t": t,
            "kind": kind,
            "pid": pid,
            "end": end,
            "hits": hits,
        });
        let line = format!("{record}\n");
        if let Err(err) = self.faults.write_all(line.as_bytes()) {
            self.anomalies
                .push(format!("cannot write the fault log: {err}"));
        }
    }

    /// Restarts processes that exited without being told to, noting it.
    fn reap(&mut self) -> Result<(), String> {
        let mut exited = Vec::new();
        for (i, worker) in self.workers.iter_mut().enumerate() {
            if let Ok(Some(status)) = worker.child.try_wait() {
                exited.push((i, status));
            }
        }
        for (i, status) in exited.into_iter().rev() {
            let worker = self.workers.remove(i);
            self.anomalies.push(format!(
                "worker {} (pid {}) exited on its own: {status}",
                worker.app_name,
                worker.child.id()
            ));
            self.spawn_worker()?;
        }
        if let Some(producer) = &mut self.producer {
            if let Ok(Some(status)) = producer.child.try_wait() {
                let pid = producer.child.id();
                self.producer = None;
                if status.success() {
                    self.producer_done = true;
                } else {
                    self.anomalies.push(format!(
                        "the producer (pid {pid}) exited on its own: {status}"
                    ));
                    self.spawn_producer()?;
                }
            }
        }
        Ok(())
    }

    fn kill_worker(&mut self, rng: &mut Rng) -> Result<(), String> {
        if self.workers.is_empty() {
            return self.spawn_worker();
        }
        let i = rng.below(self.workers.len() as u64) as usize;
        if self.backend == "sqlite" {
            // A random sub-millisecond moment: the worker's writer thread is inside a
            // group commit for much of its time, so kills land in the middle of them.
            spin(Duration::from_micros(rng.below(1_000)));
        }
        let mut worker = self.workers.remove(i);
        let pid = worker.child.id();
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        // Recorded once the process is gone: nothing it logged is later than this.
        self.record(now_us(), "kill_worker", Some(pid), None);
        self.spawn_worker()
    }

    fn kill_producer(&mut self, rng: &mut Rng) -> Result<(), String> {
        let Some(lines) = &self.producer_lines else {
            return Ok(());
        };
        // Wait for the next batch to go out, then kill inside its call.
        while lines.try_recv().is_ok() {}
        match lines.recv_timeout(Duration::from_secs(3)) {
            Ok(()) => {}
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return Ok(()),
        }
        spin(Duration::from_micros(rng.below(3_000)));
        let Some(mut producer) = self.producer.take() else {
            return Ok(());
        };
        let pid = producer.child.id();
        let _ = producer.child.kill();
        let status = producer.child.wait();
        if status.is_ok_and(|s| s.success()) {
            // It finished before the signal landed.
            self.producer_done = true;
            return Ok(());
        }
        self.record(now_us(), "kill_producer", Some(pid), None);
        self.spawn_producer()
    }

    fn client_kill(&mut self, rng: &mut Rng) {
        let t = now_us();
        // All normal connections (the workers' and the producer's commands), or the
        // pub/sub connections that carry wake-ups, or one connection at random.
        let answer = match rng.below(3) {
            0 => redis_cli(&["client", "kill", "type", "normal"]),
            1 => redis_cli(&["client", "kill", "type", "pubsub"]),
            _ => {
                let list = redis_cli(&["client", "list"]).unwrap_or_default();
                let ids: Vec<&str> = list
                    .lines()
                    .filter(|l| !l.contains("cmd=client"))
                    .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
                    .collect();
                if ids.is_empty() {
                    Ok(String::new())
                } else {
                    let id = ids[rng.below(ids.len() as u64) as usize];
                    redis_cli(&["client", "kill", "id", id])
                }
            }
        };
        // `CLIENT KILL TYPE` answers how many it closed, `CLIENT KILL ID` answers 1 or 0.
        let hits = match answer {
            Ok(text) => text.trim().parse().ok(),
            Err(err) => {
                self.anomalies.push(format!("CLIENT KILL failed: {err}"));
                None
            }
        };
        self.record_hits(t, "client_kill", None, Some(now_us()), hits);
    }

    fn redis_kill(&mut self, rng: &mut Rng) -> Result<(), String> {
        let Some(server) = &mut self.redis else {
            return Ok(());
        };
        let t = now_us();
        server.kill();
        // Down for a moment, as a crashed server under a supervisor would be.
        thread::sleep(Duration::from_millis(100 + rng.below(1_400)));
        server.spawn()?;
        self.record(t, "redis_kill", None, Some(now_us()));
        Ok(())
    }

    fn pg_terminate(&mut self, rng: &mut Rng) {
        let t = now_us();
        // One worker's connections, or every worker's: only names this run gave out.
        let filter = if rng.below(2) == 0 && !self.workers.is_empty() {
            let i = rng.below(self.workers.len() as u64) as usize;
            format!("application_name = '{}'", self.workers[i].app_name)
        } else {
            format!("starts_with(application_name, '{}w')", self.app_prefix)
        };
        let sql = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {filter} AND pid <> pg_backend_pid()"
        );
        let hits = match psql(&self.url, &sql) {
            Ok(text) => text.trim().parse().ok(),
            Err(err) => {
                self.anomalies
                    .push(format!("pg_terminate_backend failed: {err}"));
                None
            }
        };
        self.record_hits(t, "pg_terminate", None, Some(now_us()), hits);
    }

    /// Stops every worker gracefully (closing its standard input); false if one had
    /// to be killed.
    fn stop_workers(&mut self) -> bool {
        for worker in &mut self.workers {
            worker.stdin = None;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut graceful = true;
        for worker in &mut self.workers {
            loop {
                match worker.child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            graceful = false;
                            self.anomalies
                                .push(format!("worker {} stopped with {status}", worker.app_name));
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        graceful = false;
                        self.anomalies.push(format!(
                            "worker {} did not stop within 30 s of its shutdown",
                            worker.app_name
                        ));
                        let _ = worker.child.kill();
                        let _ = worker.child.wait();
                        break;
                    }
                }
            }
        }
        self.workers.clear();
        graceful
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for proc in self.workers.iter_mut().chain(self.producer.iter_mut()) {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
    }
}

fn run_backend(
    root: &Path,
    bin: &Path,
    backend: &str,
    options: &Options,
    rng: &mut Rng,
) -> Result<Row, String> {
    let began = Instant::now();
    let stamp = now_us() / 1_000_000;
    let dir = chaos_root(root).join(format!("{backend}-{stamp}"));
    fs::create_dir_all(&dir).map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    let id = format!("{stamp}{}", std::process::id() % 1_000);
    let namespace = format!("chaos-{id}");
    let mut pg_schema = None;
    let mut redis = None;
    let url = match backend {
        "sqlite" => format!("sqlite://{}", dir.join("jobs.db").display()),
        "redis" => {
            redis = Some(RedisServer::start(&dir.join("redis"))?);
            format!("redis://127.0.0.1:{REDIS_PORT}")
        }
        "redis-partitioned" => {
            redis = Some(RedisServer::start(&dir.join("redis"))?);
            format!("redis://127.0.0.1:{REDIS_PORT}/?partitions={CHAOS_PARTITIONS}")
        }
        "postgres" => {
            pg_schema = Some(format!("chaos_{id}"));
            std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
        }
        other => return Err(format!("no chaos run for {other}")),
    };
    let faults_path = dir.join("faults.jsonl");
    let faults = File::create(&faults_path)
        .map_err(|err| format!("cannot create {}: {err}", faults_path.display()))?;
    eprintln!("chaos: run directory {}", dir.display());
    let seconds = options.seconds;
    let mut run = Run {
        backend,
        bin,
        dir: dir.clone(),
        url,
        namespace,
        pg_schema,
        app_prefix: format!("jc{id}"),
        workers: Vec::new(),
        producer: None,
        producer_lines: None,
        producer_done: false,
        spawned: 0,
        faults,
        redis,
        start_us: now_us(),
        // The plan is spread over the first quarter of the window: faster than the
        // workers drain it, so faults hit enqueues and a busy queue (jobs in flight),
        // and the throughput under faults is the workers' own, not the producer's pace.
        spread_ms: seconds * 250,
        jobs: options.jobs,
        anomalies: Vec::new(),
    };
    for _ in 0..WORKERS {
        run.spawn_worker()?;
    }
    run.spawn_producer()?;

    let fault_start = now_us();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let menu = fault_menu(backend);
    let mut last_redis_kill: Option<Instant> = None;
    while Instant::now() < deadline {
        let pause = Duration::from_millis(200 + rng.below(1_300));
        thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        if Instant::now() >= deadline {
            break;
        }
        run.reap()?;
        let kind = rng.pick(&menu);
        match kind {
            "kill_worker" => run.kill_worker(rng)?,
            "kill_producer" if !run.producer_done => run.kill_producer(rng)?,
            "client_kill" => run.client_kill(rng),
            // A restart replays the AOF: one at most every 5 s keeps the run moving.
            "redis_kill"
                if last_redis_kill.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) =>
            {
                last_redis_kill = Some(Instant::now());
                run.redis_kill(rng)?;
            }
            "pg_terminate" => run.pg_terminate(rng),
            _ => run.kill_worker(rng)?,
        }
    }
    let fault_end = now_us();
    eprintln!("chaos: faults over; waiting for the producer to finish its plan");

    // No more faults: the producer finishes its plan (restarted if need be).
    let producer_deadline = Instant::now() + Duration::from_secs(120);
    while !run.producer_done {
        run.reap()?;
        if Instant::now() > producer_deadline {
            return Err(
                "the producer did not finish its plan within 120 s after the faults".to_owned(),
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    eprintln!("chaos: draining");
    let store_args = run.common_args(&format!("{}c", run.app_prefix));
    let drain = Command::new(bin)
        .arg("drain")
        .args(&store_args)
        .args(["--timeout-s", &DRAIN_TIMEOUT_S.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run durq-chaos drain: {err}"))?;
    let drained = drain.status.success();
    eprint!("{}", String::from_utf8_lossy(&drain.stderr));
    eprintln!(
        "chaos: drain: {}",
        String::from_utf8_lossy(&drain.stdout).trim()
    );
    let graceful = run.stop_workers();

    let check = Command::new(bin)
        .arg("check")
        .args(&store_args)
        .args([
            "--backend",
            backend,
            "--faults",
            &faults_path.display().to_string(),
            "--fault-start-us",
            &fault_start.to_string(),
            "--fault-end-us",
            &fault_end.to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|err| format!("cannot run durq-chaos check: {err}"))?;
    let verdict = String::from_utf8_lossy(&check.stdout).trim().to_owned();
    if !check.status.success() || verdict.is_empty() {
        return Err(format!("durq-chaos check failed ({})", check.status));
    }
    let _ = fs::write(dir.join("verdict.json"), format!("{verdict}\n"));

    let parsed = Verdict::parse(&verdict)?;
    let mut row = row_from(&parsed, backend);
    row.drained = drained;
    row.graceful = graceful;
    row.passed = row.passed && drained && graceful;
    row.seconds = began.elapsed().as_secs_f64();
    for example in &parsed.examples {
        eprintln!("chaos: {backend}: {example}");
    }
    for anomaly in &run.anomalies {
        eprintln!("chaos: {backend}: note: {anomaly}");
    }
    eprintln!(
        "chaos: {backend}: {} in {:.0} s: {}",
        if row.passed { "pass" } else { "FAIL" },
        row.seconds,
        verdict
    );

    // Clean up what the run wrote outside its directory, and the big files in it.
    if let Some(schema) = &run.pg_schema {
        if let Err(err) = psql(&run.url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")) {
            eprintln!("chaos: could not drop schema {schema}: {err}");
        }
    }
    drop(run.redis.take());
    if row.passed {
        for file in ["jobs.db", "jobs.db-wal", "jobs.db-shm"] {
            let _ = fs::remove_file(dir.join(file));
        }
        let _ = fs::remove_dir_all(dir.join("redis"));
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_fields_are_read() {
        let verdict = r#"{"backend":"redis","jobs":20000,"unacknowledged_jobs_run":0,
            "faults":{"client_kill":3,"kill_worker":5},"connections_killed":3,
            "store_errors_seen":9,"lost":0,"double_completions":0,"stale_accepted":0,
            "stuck":0,"other_violations":0,"runs":20011,"planned_reruns":0,
            "extra_runs_worker_kill":11,"extra_runs_store_fault":0,
            "extra_runs_unexplained":1,"worker_kills":5,"claims_in_flight_at_kills":40,
            "runs_in_flight_at_kills":38,"succeeded_without_acknowledged_completion":0,
            "throughput_under_faults":812.5,"throughput_overall":900.0,"cut_lines":2,
            "passed":false,"examples":["a: x","b: \"y\""]}"#;
        let parsed = Verdict::parse(verdict).expect("a verdict");
        assert_eq!(parsed.examples, ["a: x", "b: \"y\""]);
        let row = row_from(&parsed, "redis");
        assert_eq!((row.jobs, row.faults, row.worker_kills), (20_000, 8, 5));
        assert_eq!(row.fault_kinds, "client_kill 3, kill_worker 5");
        assert_eq!((row.extra_kill, row.claims_in_flight), (11, 40));
        assert_eq!(row.throughput_faults, 812.5);
        // One unexplained extra run fails the row.
        assert!(!row.passed);
        // Verdicts from before durable steps read as none; one step violation fails
        // a row that passes otherwise.
        assert_eq!((row.step_jobs, row.step_violations), (0, 0));
        let steps = r#"{"jobs":10,"connections_killed":0,"store_errors_seen":0,"lost":0,
            "double_completions":0,"stale_accepted":0,"stuck":0,"other_violations":0,
            "extra_runs_worker_kill":0,"extra_runs_store_fault":0,"extra_runs_unexplained":0,
            "planned_reruns":0,"worker_kills":1,"claims_in_flight_at_kills":1,
            "runs_in_flight_at_kills":1,"throughput_under_faults":1.0,
            "throughput_overall":1.0,"step_jobs":4,"step_runs":13,"steps_replayed":2,
            "step_reruns_after_kill":1,"step_reruns_after_store_fault":0,
            "step_reruns_after_failed_save":0,"step_violations":1}"#;
        let mut row = row_from(&Verdict::parse(steps).expect("a verdict"), "sqlite");
        (row.drained, row.graceful) = (true, true);
        assert_eq!(
            (
                row.step_jobs,
                row.step_runs,
                row.steps_replayed,
                row.step_reruns_kill
            ),
            (4, 13, 2, 1)
        );
        assert!(!row.passed);
        assert_eq!(row.failures(), "1 durable step violations");
        assert!(table(&[row]).contains("| 4: 13 / 2; 1 / 0 / 0; 1 |"));
        let missing = Verdict::parse(r#"{"jobs":1}"#).expect_err("fields are missing");
        assert!(missing.contains("missing field"), "{missing}");
        assert!(Verdict::parse("not json").is_err());
    }

    /// `Args` as its own command, to parse it alone.
    #[derive(Debug, clap::Parser)]
    struct Chaos {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn arguments_keep_their_defaults() {
        use clap::Parser as _;
        let Chaos { args } = Chaos::try_parse_from(["chaos"]).expect("parses");
        assert_eq!(args.backend, ChaosBackend::All);
        assert_eq!((args.jobs, args.seconds), (20_000, 60));
        assert!(!args.release);
        assert_eq!(args.seed, None);
        let Chaos { args } = Chaos::try_parse_from([
            "chaos",
            "--backend",
            "redis",
            "--jobs",
            "5",
            "--seconds",
            "2",
            "--release",
            "--seed",
            "0",
        ])
        .expect("parses");
        assert_eq!(args.backend, ChaosBackend::Redis);
        assert_eq!((args.jobs, args.seconds, args.seed), (5, 2, Some(0)));
        assert!(args.release);
        assert!(Chaos::try_parse_from(["chaos", "--jobs", "0"]).is_err());
        assert!(Chaos::try_parse_from(["chaos", "--backend", "mysql"]).is_err());
    }

    #[test]
    fn picks_follow_the_menu() {
        let mut rng = Rng::new(7);
        let menu = [("a", 1), ("b", 0), ("c", 3)];
        let picks: Vec<&str> = (0..1_000).map(|_| rng.pick(&menu)).collect();
        assert!(!picks.contains(&"b"));
        let a = picks.iter().filter(|p| **p == "a").count();
        assert!((150..350).contains(&a), "{a}");
    }
}
