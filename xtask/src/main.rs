//! Project automation, run as `cargo xtask <command>`; CI calls the same commands a
//! developer runs.
//!
//! - `cargo xtask conformance [--backend memory|sqlite|redis|redis-cluster|postgres|all]`
//! - `cargo xtask chaos [--backend sqlite|redis|postgres|all] [--jobs N] [--seconds S]`
//! - `cargo xtask ci`

mod bench;
mod chaos;
mod redis_cluster;
mod redis_server;

use std::env;
use std::process::{Command, ExitCode};

const BACKENDS: &[&str] = &["memory", "sqlite", "redis", "redis-cluster", "postgres"];

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("conformance") => backend_arg(&args[1..]).and_then(|b| conformance(&b)),
        Some("bench") => bench::run(&args[1..]),
        Some("chaos") => chaos::run(&args[1..]),
        Some("ci") => ci(),
        _ => Err(usage()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    format!(
        "usage:\n  cargo xtask conformance [--backend {}|all]\n  \
         cargo xtask chaos [--backend sqlite|redis|postgres|all] [--jobs N] [--seconds S]\n  \
         cargo xtask ci",
        BACKENDS.join("|")
    )
}

/// The value of `--backend`, `all` when absent.
fn backend_arg(args: &[String]) -> Result<Vec<&'static str>, String> {
    let mut chosen = "all".to_owned();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--backend" => chosen = rest.next().cloned().ok_or_else(usage)?,
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if chosen == "all" {
        return Ok(BACKENDS.to_vec());
    }
    BACKENDS
        .iter()
        .find(|b| **b == chosen)
        .map(|b| vec![*b])
        .ok_or_else(|| format!("unknown backend {chosen:?}\n{}", usage()))
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

fn cargo(args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    run(&cargo, args, envs)
}

fn conformance(backends: &[&str]) -> Result<(), String> {
    for backend in backends {
        match *backend {
            "redis-cluster" => redis_cluster_conformance()?,
            name => {
                let package = format!("jobs-{name}");
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
            &["test", "-p", "jobs-redis", "--test", "conformance"],
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
    // Features are additive: each backend alone and all together must compile.
    for features in FEATURE_SETS {
        cargo(
            &[
                "check",
                "-p",
                "jobs",
                "--no-default-features",
                "--features",
                features,
            ],
            &[],
        )?;
    }
    // All features, so the runtime tests of the `jobs` facade run on every backend.
    cargo(&["test", "--workspace", "--all-features"], &[])?;
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

/// The feature sets of the `jobs` facade that CI compiles.
const FEATURE_SETS: &[&str] = &[
    "memory",
    "sqlite",
    "redis",
    "postgres",
    "memory,sqlite,redis,postgres",
];
