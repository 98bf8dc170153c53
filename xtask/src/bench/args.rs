//! `cargo xtask bench`'s command line, and the settings of a run made from it.

use std::env;
use std::path::PathBuf;

use super::baseline::PairSettings;

/// Every backend the benchmark measures, in the report's order.
pub(super) const BACKENDS: &[&str] = &["memory", "sqlite", "redis", "postgres"];

/// `cargo xtask bench`'s command line.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The backend to measure.
    #[arg(long, value_enum, default_value_t = BenchBackend::All)]
    backend: BenchBackend,
    /// Jobs per end-to-end run (N); growth is measured at N/10 and 10×N.
    #[arg(long, default_value_t = 100_000, value_parser = crate::positive)]
    jobs: u64,
    /// Runs of every measurement; the report shows their median.
    #[arg(long, default_value_t = 3, value_parser = crate::positive)]
    runs: u64,
    /// Jobs per end-to-end run compared with apalis [default: 20000, at most --jobs].
    #[arg(long, value_parser = crate::positive)]
    peer_jobs: Option<u64>,
    /// Jobs the workers run at once.
    #[arg(long, default_value_t = 32, value_parser = crate::positive)]
    concurrency: u64,
    /// Skip the apalis peers.
    #[arg(long)]
    no_peers: bool,
    /// Skip the growth measurements (N/10 and 10×N).
    #[arg(long)]
    no_scale: bool,
    /// The report to rewrite between its generated-section markers.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// Measure against the benchmark binary of this revision instead, pair after pair
    /// (alone: the revision pinned in bench/BASELINE).
    #[arg(long, value_name = "REV")]
    #[allow(clippy::option_option)] // absent, present alone, or present with a revision
    baseline: Option<Option<String>>,
    /// With --baseline: pairs per workload.
    #[arg(long, default_value_t = 5, value_parser = crate::positive)]
    pairs: u64,
    /// With --baseline: only this workload (repeatable).
    #[arg(long = "workload", value_parser = ["enqueue-one", "enqueue-batch", "e2e-backlog", "e2e-producer", "latency"])]
    workloads: Vec<String>,
}

/// The choices of `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BenchBackend {
    Memory,
    Sqlite,
    Redis,
    Postgres,
    All,
}

/// What one `cargo xtask bench` measures, and where it writes the report.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) backends: Vec<&'static str>,
    pub(super) jobs: u64,
    pub(super) runs: usize,
    pub(super) peer_jobs: u64,
    pub(super) enqueue_jobs: u64,
    pub(super) concurrency: u64,
    pub(super) peers: bool,
    pub(super) scale: bool,
    pub(super) out: PathBuf,
    pub(super) command: String,
    /// Set for `--baseline`: pairs against another revision instead of the tables.
    pub(super) pairs: Option<PairSettings>,
}

impl Settings {
    /// The settings of a run from its arguments; `command` is the command line as the
    /// report shows it.
    pub(super) fn new(args: Args, command: String) -> Settings {
        let backends = match args.backend {
            BenchBackend::All => BACKENDS.to_vec(),
            BenchBackend::Memory => vec!["memory"],
            BenchBackend::Sqlite => vec!["sqlite"],
            BenchBackend::Redis => vec!["redis"],
            BenchBackend::Postgres => vec!["postgres"],
        };
        let command_shown = command.clone();
        let pairs = args.baseline.map(|rev| PairSettings {
            rev: rev.filter(|r| !r.is_empty()),
            backends: backends.clone(),
            jobs: args.jobs,
            enqueue_jobs: 10_000.min(args.jobs),
            concurrency: args.concurrency,
            pairs: usize::try_from(args.pairs).unwrap_or(usize::MAX),
            workloads: args.workloads,
            out: args.out.clone(),
            command: command_shown,
        });
        Settings {
            backends,
            jobs: args.jobs,
            runs: usize::try_from(args.runs).unwrap_or(usize::MAX),
            peer_jobs: args.peer_jobs.unwrap_or(20_000).min(args.jobs),
            enqueue_jobs: 10_000.min(args.jobs),
            concurrency: args.concurrency,
            peers: !args.no_peers,
            scale: !args.no_scale,
            out: args.out,
            command,
            pairs,
        }
    }
}

/// The command line as typed, for the report: `cargo xtask` and this process's
/// arguments.
pub(super) fn command_line() -> String {
    let args: Vec<String> = env::args().skip(1).collect();
    format!("cargo xtask {}", args.join(" "))
        .trim_end()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Args` as its own command, to parse it alone.
    #[derive(Debug, clap::Parser)]
    struct Bench {
        #[command(flatten)]
        args: Args,
    }

    fn settings(args: &[&str]) -> Result<Settings, clap::Error> {
        use clap::Parser as _;
        let all = std::iter::once("bench").chain(args.iter().copied());
        Bench::try_parse_from(all).map(|b| Settings::new(b.args, "cmd".to_owned()))
    }

    #[test]
    fn arguments_keep_their_defaults() {
        let s = settings(&[]).expect("parses");
        assert_eq!(s.backends, BACKENDS);
        assert_eq!((s.jobs, s.runs, s.peer_jobs), (100_000, 3, 20_000));
        assert_eq!((s.enqueue_jobs, s.concurrency), (10_000, 32));
        assert!(s.peers && s.scale);
        assert_eq!(s.out, PathBuf::from("docs/benchmarks.md"));
        let s = settings(&[
            "--backend",
            "redis",
            "--jobs",
            "5000",
            "--runs",
            "1",
            "--concurrency",
            "8",
            "--no-peers",
            "--no-scale",
            "--out",
            "x.md",
        ])
        .expect("parses");
        assert_eq!(s.backends, ["redis"]);
        // The comparison and enqueue sizes never exceed N.
        assert_eq!(
            (s.jobs, s.runs, s.peer_jobs, s.enqueue_jobs),
            (5_000, 1, 5_000, 5_000)
        );
        assert_eq!(s.concurrency, 8);
        assert!(!s.peers && !s.scale);
        assert_eq!(s.out, PathBuf::from("x.md"));
        assert_eq!(
            settings(&["--peer-jobs", "700"]).expect("parses").peer_jobs,
            700
        );
        assert!(settings(&["--runs", "0"]).is_err());
        assert!(settings(&["--backend", "mysql"]).is_err());
        assert!(settings(&["--bogus"]).is_err());
        assert!(settings(&[]).expect("parses").pairs.is_none());
    }

    #[test]
    fn baseline_takes_a_revision_or_the_pinned_one() {
        let pinned = settings(&["--baseline"])
            .expect("parses")
            .pairs
            .expect("pairs");
        assert_eq!((pinned.rev, pinned.pairs), (None, 5));
        assert!(pinned.workloads.is_empty());
        let given = settings(&[
            "--baseline=abc123",
            "--pairs",
            "3",
            "--workload",
            "e2e-backlog",
            "--workload",
            "latency",
            "--backend",
            "redis",
        ])
        .expect("parses")
        .pairs
        .expect("pairs");
        assert_eq!(given.rev.as_deref(), Some("abc123"));
        assert_eq!((given.pairs, given.backends), (3, vec!["redis"]));
        assert_eq!(given.workloads, ["e2e-backlog", "latency"]);
        assert!(settings(&["--baseline", "--workload", "claim"]).is_err());
        assert!(settings(&["--baseline", "--pairs", "0"]).is_err());
    }
}
