//! `cargo xtask bench`: builds the benchmark binaries (ours and the apalis peers) in
//! release mode, runs every workload per backend, size and run, and writes the results
//! into `docs/benchmarks.md` between its generated-section markers.
//!
//! ```text
//! cargo xtask bench [--backend memory|sqlite|redis|postgres|all] [--jobs N] [--runs R]
//!                   [--peer-jobs N] [--concurrency C] [--no-peers] [--no-scale]
//!                   [--out PATH]
//! cargo xtask bench --baseline[=REV] [--pairs P] [--workload W]... [--backend …] [--jobs N]
//! ```
//!
//! With `--baseline`, it runs this tree's binary and the one built at REV (by default
//! the revision pinned in `bench/BASELINE`) alternately, pair after pair, and writes
//! the speed-up of each figure into the report's baseline section instead ([`baseline`]).
//!
//! It shells out to cargo and to the binaries, and reads the one-line JSON result each
//! binary prints last. By job: [`args`] (the command line), [`measure`] (building and
//! running the binaries), [`results`] (the table of figures), [`report`] (the markdown).

mod args;
mod baseline;
pub mod cluster;
mod measure;
mod report;
mod results;

use std::env;
use std::time::{Duration, Instant};

pub use args::Args;
use args::{command_line, Settings, BACKENDS};
use measure::{bench_backend, build};
use report::{render, write_report};
use results::Results;

/// The backends apalis 1.0 has.
const PEER_BACKENDS: &[&str] = &["sqlite", "redis", "postgres"];
/// The backends that enqueue inside the caller's own transaction (CONTRACT §7), where
/// `latency-tx` runs.
const TRANSACTIONAL_BACKENDS: &[&str] = &["sqlite", "postgres"];
/// The backends with flow control (CONTRACT K1–K5), where the `claim-keys`,
/// `claim-limited` and `claim-one-per-key` workloads run.
const FLOW_CONTROL_BACKENDS: &[&str] = &["memory", "sqlite", "redis", "postgres"];
/// Claimers of the flow-control workloads (issue #28's target is set at 32).
const FLOW_CLAIMERS: &str = "32";
/// How long the 10×N drain may run; past it, its rate over the jobs drained so far is
/// reported.
const BIG_DRAIN_DEADLINE: Duration = Duration::from_secs(300);
/// An apalis measurement whose first run takes longer than this runs only once.
const SLOW_PEER_RUN: Duration = Duration::from_secs(90);

/// `cargo xtask bench …`: measures, then rewrites the report.
pub fn run(args: Args) -> Result<(), String> {
    let settings = Settings::new(args, command_line());
    let started = Instant::now();
    let root = crate::workspace_root();
    env::set_current_dir(&root).map_err(|e| format!("cd {}: {e}", root.display()))?;
    if let Some(pairs) = &settings.pairs {
        let mut ours_only = settings.clone();
        ours_only.peers = false;
        // Every backend built in, as the baseline's binary is (`baseline::build`),
        // whichever the pairs measure, so that the two differ in their code only: a
        // binary without PostgreSQL and Redis links tokio without its I/O driver, and
        // its idle workers park on a condvar instead of in `epoll` (on SQLite's
        // `enqueue-one`, 0.47 futex calls a job against the baseline's 0.25).
        ours_only.backends = BACKENDS.to_vec();
        let binaries = build(&ours_only)?;
        return baseline::run(&root, pairs, &binaries.ours);
    }
    let binaries = build(&settings)?;
    let mut results = Results::default();
    for backend in &settings.backends {
        bench_backend(&settings, &binaries, backend, &mut results)?;
    }
    let wall = started.elapsed();
    let report = render(&settings, &results, wall, &root);
    write_report(&settings.out, &report)?;
    eprintln!(
        "\nxtask bench: wrote {} in {:.1} min",
        settings.out.display(),
        wall.as_secs_f64() / 60.0
    );
    Ok(())
}
