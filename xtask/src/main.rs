//! Project automation, run as `cargo xtask <command>`; CI calls the same commands a
//! developer runs.
//!
//! - `cargo xtask conformance [--backend memory|sqlite|redis|redis-cluster|postgres|all]`
//! - `cargo xtask chaos [--backend sqlite|redis|redis-partitioned|postgres|all] [--jobs N] [--seconds S]`
//! - `cargo xtask bench [--backend memory|sqlite|redis|postgres|all] [--jobs N] …`
//! - `cargo xtask bench-cluster [--partitions K] [--pairs P] [--jobs N]`
//! - `cargo xtask readme`
//! - `cargo xtask ci`
//!
//! `cargo xtask --help` and `cargo xtask <command> --help` list every flag.

mod bench;
mod chaos;
mod readme;
mod redis_cluster;
mod redis_server;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand, ValueEnum};

/// Project automation; CI runs the same commands a developer does.
#[derive(Debug, Parser)]
#[command(name = "xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Run the conformance suite of one backend, or of all of them.
    Conformance {
        /// The backend to check.
        #[arg(long, value_enum, default_value_t = ConformanceBackend::All)]
        backend: ConformanceBackend,
    },
    /// Benchmark the backends (and the apalis peers) and rewrite docs/benchmarks.md.
    Bench(bench::Args),
    /// Benchmark one namespace on a 3-master Redis Cluster, unpartitioned against
    /// partitioned: each master's share of the work, and the throughput.
    BenchCluster(bench::cluster::Args),
    /// Run the chaos suite: kills and connection faults under a live queue.
    Chaos(chaos::Args),
    /// Build the README's example in a fresh crate, from the README's text, and run it.
    Readme,
    /// Everything CI checks: fmt, clippy, docs, feature sets, tests, cluster
    /// conformance and a short chaos run.
    Ci,
}

/// The backends `conformance` knows; `redis-cluster` is the Redis suite against a
/// cluster started for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ConformanceBackend {
    Memory,
    Sqlite,
    Redis,
    RedisCluster,
    Postgres,
    All,
}

impl ConformanceBackend {
    /// The backends this choice stands for, by name.
    fn names(self) -> Vec<&'static str> {
        match self {
            ConformanceBackend::Memory => vec!["memory"],
            ConformanceBackend::Sqlite => vec!["sqlite"],
            ConformanceBackend::Redis => vec!["redis"],
            ConformanceBackend::RedisCluster => vec!["redis-cluster"],
            ConformanceBackend::Postgres => vec!["postgres"],
            ConformanceBackend::All => BACKENDS.to_vec(),
        }
    }
}

const BACKENDS: &[&str] = &["memory", "sqlite", "redis", "redis-cluster", "postgres"];

fn main() -> ExitCode {
    // clap prints its own usage or help and exits (2 on a bad command line).
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Conformance { backend } => conformance(&backend.names()),
        Task::Bench(args) => bench::run(args),
        Task::Chaos(args) => chaos::run(args),
        Task::BenchCluster(args) => bench::cluster::run(args),
        Task::Readme => readme::run(),
        Task::Ci => ci(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Parses a count that must be above zero (a run of zero jobs or seconds measures
/// nothing), for clap.
pub(crate) fn positive(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("wants a positive integer, not {text:?}")),
    }
}

/// The workspace root: the parent of this crate's directory.
pub(crate) fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .map_or_else(|| here.to_path_buf(), Path::to_path_buf)
}

/// Runs a command, failing with its description if it fails.
fn run(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    let shown = format!("{program} {}", args.join(" "));
    eprintln!("\n==> {shown}");
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .map_err(|err| format!("cannot start `{shown}`: {err}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// The cargo running this task (`CARGO`, set by `cargo xtask`), or the one on the path.
pub(crate) fn cargo_program() -> String {
    env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn cargo(args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    run(&cargo_program(), args, envs)
}

fn conformance(backends: &[&str]) -> Result<(), String> {
    for backend in backends {
        match *backend {
            "redis-cluster" => redis_cluster_conformance()?,
            name => {
                let package = format!("durq-{name}");
                cargo(&["test", "-p", &package, "--test", "conformance"], &[])?;
            }
        }
    }
    Ok(())
}

/// Where the throwaway cluster listens: away from the default 6379 and from the
/// ports other local tools favour.
const CLUSTER_BASE_PORT: u16 = 17_000;

/// Runs the Redis conformance suite against a 3-master cluster started for the run.
fn redis_cluster_conformance() -> Result<(), String> {
    redis_cluster::with_cluster(CLUSTER_BASE_PORT, |urls| {
        let urls = urls.join(",");
        cargo(
            &["test", "-p", "durq-redis", "--test", "conformance"],
            &[("JOBS_REDIS_CLUSTER_URLS", urls.as_str())],
        )
    })
}

fn ci() -> Result<(), String> {
    cargo(&["fmt", "--all", "--check"], &[])?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // What a user's `cargo doc` builds: the facade with its default features, where
    // links to items of features that are off would dangle.
    cargo(
        &["doc", "-p", "durq", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // Features are additive: each backend alone and all together must compile.
    for features in FEATURE_SETS {
        cargo(
            &[
                "check",
                "-p",
                "durq",
                "--no-default-features",
                "--features",
                features,
            ],
            &[],
        )?;
    }
    // All features, so the runtime tests of the `durq` facade run on every backend.
    cargo(&["test", "--workspace", "--all-features"], &[])?;
    // The examples are what a new user runs first: each must run to its end (they
    // check their own outcome and exit non-zero when it is wrong).
    for (example, features) in EXAMPLES {
        let mut args = vec!["run", "-q", "-p", "durq", "--example", example];
        if !features.is_empty() {
            args.extend(["--features", features]);
        }
        cargo(&args, &[])?;
    }
    // The README's example, from its text, in a crate of its own.
    readme::run()?;
    conformance(&["redis-cluster"])?;
    // A short chaos run (docs/reliability.md): every multi-process backend under
    // kills and connection faults, 20 s each, about 2 minutes in all. It reuses the
    // debug build of the test step above.
    chaos::run_with(&chaos::Options {
        backends: chaos::BACKENDS.iter().map(|b| (*b).to_owned()).collect(),
        jobs: CI_CHAOS_JOBS,
        seconds: CI_CHAOS_SECONDS,
        release: false,
        seed: chaos::seed_from_clock(),
    })?;
    Ok(())
}

/// Jobs per backend in CI's short chaos run.
const CI_CHAOS_JOBS: u64 = 5_000;
/// Seconds of faults per backend in CI's short chaos run.
const CI_CHAOS_SECONDS: u64 = 20;

/// The examples of the `durq` crate that CI runs, with the features each needs beyond
/// the default.
const EXAMPLES: &[(&str, &str)] = &[
    ("quickstart", ""),
    ("signup", ""),
    ("scheduling", ""),
    ("resource_aware", ""),
    ("per_customer_limit", ""),
    ("rate_limited_api", ""),
    ("workflow", ""),
    ("transactional_sqlite", ""),
    ("transactional_postgres", "postgres"),
];

/// The feature sets of the `durq` facade that CI compiles.
const FEATURE_SETS: &[&str] = &[
    "memory",
    "sqlite",
    "redis",
    "postgres",
    "memory,sqlite,redis,postgres",
];

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn conformance_defaults_to_every_backend() {
        let cli = Cli::try_parse_from(["xtask", "conformance"]).expect("parses");
        let Task::Conformance { backend } = cli.task else {
            panic!("not conformance: {cli:?}");
        };
        assert_eq!(backend.names(), BACKENDS);
        let cli = Cli::try_parse_from(["xtask", "conformance", "--backend", "redis-cluster"])
            .expect("parses");
        assert!(matches!(
            cli.task,
            Task::Conformance {
                backend: ConformanceBackend::RedisCluster
            }
        ));
        assert!(Cli::try_parse_from(["xtask", "conformance", "--backend", "nope"]).is_err());
        assert!(Cli::try_parse_from(["xtask"]).is_err());
    }
}

/// ARCHITECTURE.md's code map against the tree: a crate or a rule file added without
/// its line in the map, or a crate without a README, fails here.
#[cfg(test)]
mod code_map {
    use std::fs;

    use super::workspace_root;

    #[test]
    fn the_code_map_names_every_crate_and_rule_file() {
        let root = workspace_root();
        let map = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
        let members: Vec<&str> = manifest
            .split("members = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("the workspace's members")
            .split(',')
            .map(|member| member.trim().trim_matches('"'))
            .filter(|member| !member.is_empty())
            .collect();
        assert!(members.len() >= 12, "{members:?}");
        for member in &members {
            assert!(
                map.contains(&format!("`{member}`")),
                "docs/ARCHITECTURE.md's code map does not name `{member}`"
            );
            assert!(
                root.join(member).join("README.md").is_file(),
                "{member} has no README.md"
            );
        }
        let rules = fs::read_dir(root.join("conformance/src/rules")).expect("the rule files");
        for entry in rules {
            let path = entry.expect("a rule file").path();
            let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) else {
                continue;
            };
            if stem == "mod" {
                continue;
            }
            assert!(
                map.contains(&format!("`{stem}`")),
                "docs/ARCHITECTURE.md's code map does not name the rule file `{stem}`"
            );
        }
    }

    /// The files every backend crate has, in one layout (docs/ARCHITECTURE.md, "One
    /// layout for every backend"): where one crate's operation is, every crate's is.
    const BACKEND_FILES: &[&str] = &[
        "lib.rs",
        "backend.rs",
        "store/mod.rs",
        "store/enqueue.rs",
        "store/claim.rs",
        "store/lease.rs",
        "store/sweep.rs",
        "store/reads.rs",
        "store/admin.rs",
        "store/schedules.rs",
        "store/workers.rs",
    ];

    /// The backend crates, each with the file it is opened from: a `…Config`, or for
    /// memory the `MemoryServer` that holds the data.
    const BACKENDS: &[(&str, &str)] = &[
        ("crates/durq-memory", "server.rs"),
        ("crates/durq-sqlite", "config.rs"),
        ("crates/durq-redis", "config.rs"),
        ("crates/durq-postgres", "config.rs"),
    ];

    #[test]
    fn every_backend_crate_has_the_one_layout() {
        let root = workspace_root();
        for (krate, opened_from) in BACKENDS {
            let src = root.join(krate).join("src");
            for file in BACKEND_FILES.iter().chain([opened_from]) {
                assert!(
                    src.join(file).is_file(),
                    "{krate} has no src/{file}, which every backend crate has"
                );
            }
            // The trait impls are in backend.rs and nowhere else, so a reader finds
            // every backend's seam in the same file.
            for path in rust_files(&src) {
                let text = fs::read_to_string(&path).expect("a source file");
                let implements = [
                    "impl Backend for",
                    "impl Inspect for",
                    "impl Admin for",
                    "impl Pause for",
                    "impl Schedules for",
                    "impl WorkerRegistry for",
                ]
                .iter()
                .any(|needle| text.contains(needle));
                assert!(
                    !implements || path.ends_with("backend.rs"),
                    "{} implements a backend trait outside backend.rs",
                    path.display()
                );
            }
        }
    }

    fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.extend(rust_files(&path));
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
        files
    }
}
