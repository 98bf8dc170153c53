//! Building the benchmark binaries and running each workload: how many times, at which
//! sizes, with what limits, and what each run reported.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use std::{env, thread};

use super::args::Settings;
use super::results::{Outcome, Results, Sample};
use super::{
    BIG_DRAIN_DEADLINE, FLOW_CLAIMERS, FLOW_CONTROL_BACKENDS, PEER_BACKENDS, SLOW_PEER_RUN,
    TRANSACTIONAL_BACKENDS,
};

/// Where apalis is measured when it cannot take the comparison size: the largest of
/// these that it survives is compared.
const PEER_FALLBACK_SIZES: &[u64] = &[10_000, 5_000, 2_000, 1_000];

/// The features of the benchmark package a build may ask for: a backend each, and the
/// worker runtime (without it the bench drains with a bare claim loop).
pub(super) const BENCH_FEATURES: &[&str] = &["memory", "sqlite", "redis", "postgres", "runtime"];

/// The two binaries and how to call them.
pub(super) struct Binaries {
    pub(super) ours: PathBuf,
    peers: Option<PathBuf>,
}

/// The target directory cargo builds into: `CARGO_TARGET_DIR`, or `default_name`.
pub(super) fn target_dir(default_name: &str) -> PathBuf {
    match env::var("CARGO_TARGET_DIR") {
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(default_name),
    }
}

pub(super) fn build(settings: &Settings) -> Result<Binaries, String> {
    let cargo = crate::cargo_program();
    let features = settings
        .backends
        .iter()
        .chain(&["runtime"])
        .copied()
        .collect::<Vec<_>>()
        .join(",");
    crate::run(
        &cargo,
        &[
            "build",
            "--release",
            "-p",
            "durq-bench",
            "--no-default-features",
            "--features",
            &features,
        ],
        &[],
    )?;
    let ours = target_dir("target").join("release").join("durq-bench");
    let wants_peers = settings.peers && settings.backends.iter().any(|b| PEER_BACKENDS.contains(b));
    let peers = if wants_peers {
        // The peers are their own workspace; keep their build apart from ours unless
        // the caller chose a target directory for everything.
        let peers_target = match env::var("CARGO_TARGET_DIR") {
            Ok(dir) if !dir.is_empty() => PathBuf::from(format!("{dir}-peers")),
            _ => PathBuf::from("bench/peers/target"),
        };
        let target = peers_target.to_string_lossy().into_owned();
        crate::run(
            &cargo,
            &[
                "build",
                "--release",
                "--manifest-path",
                "bench/peers/Cargo.toml",
            ],
            &[("CARGO_TARGET_DIR", target.as_str())],
        )?;
        Some(peers_target.join("release").join("durq-bench-peers"))
    } else {
        None
    };
    Ok(Binaries { ours, peers })
}

/// Runs one workload once; a crash, a timeout or an error line is a failed outcome.
pub(super) fn measure(
    binary: &Path,
    workload: &str,
    backend: &str,
    args: &[String],
    limit: Duration,
) -> Outcome {
    let shown = format!(
        "{} {workload} --backend {backend} {}",
        binary
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        args.join(" ")
    );
    eprint!("  {shown} ... ");
    let child = Command::new(binary)
        .arg(workload)
        .args(["--backend", backend])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) => {
            eprintln!("cannot start: {err}");
            return Outcome::Failed(format!("cannot start: {err}"));
        }
    };
    let started = Instant::now();
    // Drain both pipes while the child runs, so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(err) => {
                eprintln!("wait failed: {err}");
                let _ = child.kill();
                return Outcome::Failed(format!("wait failed: {err}"));
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let last_stderr = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let sample = stdout
        .lines()
        .rev()
        .find_map(|line| Sample::parse(line).ok());
    let outcome = match (status, sample) {
        (None, _) => Outcome::Failed(format!("killed after {} s", limit.as_secs())),
        (Some(_), Some(sample)) if sample.text("error").is_some() => {
            Outcome::Failed(sample.text("error").unwrap_or_default().to_owned())
        }
        (Some(status), Some(sample)) if status.success() => Outcome::Ok(sample),
        (Some(status), _) => {
            Outcome::Failed(format!("exited with {status}, no result: {last_stderr}"))
        }
    };
    match &outcome {
        Outcome::Ok(sample) => {
            let value = sample.num("value").unwrap_or_default();
            let unit = sample.text("unit").unwrap_or_default();
            eprintln!(
                "{value:.1} {unit} ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
        Outcome::Failed(message) => eprintln!("FAILED: {message}"),
    }
    outcome
}

fn common_args(settings: &Settings, jobs: u64) -> Vec<String> {
    vec![
        "--jobs".to_owned(),
        jobs.to_string(),
        "--concurrency".to_owned(),
        settings.concurrency.to_string(),
    ]
}

/// A generous limit per run: what a slow but working backend needs, with margin.
fn limit_for(jobs: u64) -> Duration {
    Duration::from_secs(120 + jobs / 1_000 * 2)
}

/// Runs and records the measurements of one backend.
struct Runner<'a> {
    settings: &'a Settings,
    backend: &'a str,
    results: &'a mut Results,
    /// Peer measurements whose first run took longer than [`SLOW_PEER_RUN`]: measured
    /// once, so the whole benchmark stays within its time budget.
    slow: BTreeSet<(String, u64)>,
    run: usize,
}

impl Runner<'_> {
    fn once(
        &mut self,
        imp: &str,
        binary: &Path,
        workload: &str,
        jobs: u64,
        extra: &[&str],
    ) -> bool {
        let slow_key = (workload.to_owned(), jobs);
        if imp == "apalis" && self.run > 1 && self.slow.contains(&slow_key) {
            eprintln!(
                "  skipped: apalis {workload} at {jobs} took over {} s in run 1",
                SLOW_PEER_RUN.as_secs()
            );
            return true;
        }
        let mut args = common_args(self.settings, jobs);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let started = Instant::now();
        let outcome = measure(binary, workload, self.backend, &args, limit_for(jobs));
        if imp == "apalis" && started.elapsed() > SLOW_PEER_RUN {
            self.slow.insert(slow_key);
            self.results
                .slow_peers
                .insert((self.backend.to_owned(), workload.to_owned(), jobs));
        }
        self.results
            .record(imp, self.backend, workload, jobs, &outcome);
        outcome.is_ok()
    }
}

/// The flow-control workloads, measured back to back in each run (issue #28).
pub(super) const FLOW_WORKLOADS: [&str; 3] = ["claim-keys", "claim-limited", "claim-one-per-key"];

pub(super) fn bench_backend(
    settings: &Settings,
    binaries: &Binaries,
    backend: &str,
    results: &mut Results,
) -> Result<(), String> {
    eprintln!("\n==> {backend}");
    let ours = binaries.ours.as_path();
    let peers = binaries
        .peers
        .as_deref()
        .filter(|_| PEER_BACKENDS.contains(&backend));
    for (imp, binary) in [("jobs", Some(ours)), ("apalis", peers)] {
        let Some(binary) = binary else { continue };
        if let Outcome::Ok(sample) = measure(binary, "info", backend, &[], Duration::from_secs(60))
        {
            let server = sample.text("server").unwrap_or_default().to_owned();
            results
                .info
                .insert((imp.to_owned(), backend.to_owned()), server);
        }
    }
    let mut runner = Runner {
        settings,
        backend,
        results,
        slow: BTreeSet::new(),
        run: 0,
    };

    let n = settings.jobs;
    let peer_n = settings.peer_jobs;
    let enqueue_n = settings.enqueue_jobs;
    // Sizes ours runs end to end in both protocols every run: N, and the sizes apalis
    // is compared at (grown when apalis fails at the comparison size).
    let mut ours_sizes = vec![n];
    if peers.is_some() {
        ours_sizes.push(peer_n);
    }
    // Per protocol, the size apalis is measured at from the second run on.
    let mut peer_sizes: BTreeMap<&str, u64> = BTreeMap::new();

    for run in 1..=settings.runs {
        eprintln!("-- {backend}, run {run} of {}", settings.runs);
        runner.run = run;
        runner.once("jobs", ours, "enqueue-one", enqueue_n, &[]);
        runner.once("jobs", ours, "enqueue-batch", enqueue_n, &[]);
        if let Some(peers) = peers {
            runner.once("apalis", peers, "enqueue-one", enqueue_n, &[]);
            runner.once("apalis", peers, "enqueue-batch", enqueue_n, &[]);
            for workload in ["e2e-backlog", "e2e-producer"] {
                if run > 1 {
                    let size = peer_sizes.get(workload).copied().unwrap_or(peer_n);
                    runner.once("apalis", peers, workload, size, &[]);
                    continue;
                }
                if runner.once("apalis", peers, workload, peer_n, &[]) {
                    continue;
                }
                // Failed at the comparison size: the failure stays in the table, and
                // the largest size it survives is compared instead (ours runs there too).
                for &smaller in PEER_FALLBACK_SIZES.iter().filter(|s| **s < peer_n) {
                    if runner.once("apalis", peers, workload, smaller, &[]) {
                        peer_sizes.insert(workload, smaller);
                        runner
                            .results
                            .note_peer_fallback(backend, workload, smaller);
                        ours_sizes.push(smaller);
                        break;
                    }
                }
            }
            if settings.scale {
                // How apalis's cost grows: a tenth of the comparison size.
                runner.once("apalis", peers, "e2e-backlog", (peer_n / 10).max(1), &[]);
            }
        }
        ours_sizes.sort_unstable();
        ours_sizes.dedup();
        for &size in &ours_sizes {
            runner.once("jobs", ours, "e2e-backlog", size, &[]);
            runner.once("jobs", ours, "e2e-producer", size, &[]);
        }
        if settings.scale {
            // Growth: a tenth of N every run, ten times N on the first run only.
            runner.once("jobs", ours, "e2e-backlog", (n / 10).max(1), &[]);
            if run == 1 {
                // Bounded: a backend whose claims slow down with the backlog would
                // otherwise take the whole budget; the rate so far is the figure.
                let deadline = BIG_DRAIN_DEADLINE.as_secs().to_string();
                runner.once(
                    "jobs",
                    ours,
                    "e2e-backlog",
                    n * 10,
                    &["--deadline-secs", &deadline],
                );
            }
        }
        runner.once("jobs", ours, "latency", 2_000.min(n), &["--rate", "500"]);
        if TRANSACTIONAL_BACKENDS.contains(&backend) {
            // The same, each job enqueued in a transaction beside a business row.
            runner.once("jobs", ours, "latency-tx", 2_000.min(n), &["--rate", "500"]);
        }
        runner.once("jobs", ours, "reclaim", n, &[]);
        runner.once("jobs", ours, "claim", n, &[]);
        runner.once("jobs", ours, "claim-budget", n, &[]);
        if FLOW_CONTROL_BACKENDS.contains(&backend) {
            for workload in FLOW_WORKLOADS {
                runner.once("jobs", ours, workload, n, &["--claimers", FLOW_CLAIMERS]);
            }
        }
        // Issue #29: the backlog as graphs (a root, ten after it, one after those),
        // against the plain backlog of the same size measured above.
        runner.once("jobs", ours, "e2e-graphs", n, &[]);
    }
    Ok(())
}
