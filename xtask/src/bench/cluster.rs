//! `cargo xtask bench-cluster`: one namespace on a 3-master loopback Redis Cluster,
//! unpartitioned (K = 1) against partitioned (K = `--partitions`), run alternately pair
//! after pair: each master's share of the server CPU the drain cost, and the throughput
//! of K against 1 on the same cluster (CONTRACT §8, issue #27's evidence).
//!
//! ```text
//! cargo xtask bench-cluster [--partitions K] [--pairs P] [--jobs N] [--workload W]
//! ```
//!
//! It prints a markdown table; docs/redis.md ("Partitioned namespaces on a cluster")
//! keeps the one it was last run for, with the machine's cores beside it.

use std::path::Path;
use std::process::Command;

use super::measure::target_dir;
use super::results::{median, Sample};
use crate::redis_cluster;

/// Where this task's cluster listens: away from the conformance cluster's 17000.
const BENCH_CLUSTER_PORT: u16 = 17_200;

/// `cargo xtask bench-cluster`'s command line.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Partitions of the partitioned namespace.
    #[arg(long, default_value_t = 12, value_parser = crate::positive)]
    partitions: u64,
    /// Alternating pairs of runs (K = 1, then K = partitions).
    #[arg(long, default_value_t = 3, value_parser = crate::positive)]
    pairs: u64,
    /// Jobs per run.
    #[arg(long, default_value_t = 50_000, value_parser = crate::positive)]
    jobs: u64,
    /// The workload (`durq-bench`'s): `e2e-backlog` or `e2e-producer`.
    #[arg(long, default_value = "e2e-backlog")]
    workload: String,
}

/// One run's figures.
struct Run {
    jobs_per_s: f64,
    server_cpu_us_per_job: Option<f64>,
    /// Each master's share of the run's server CPU, the busiest first (which master
    /// holds an unpartitioned namespace changes with its name, so runs are compared by
    /// rank, not by node).
    shares: Vec<f64>,
}

pub fn run(args: Args) -> Result<(), String> {
    crate::run(
        &crate::cargo_program(),
        &[
            "build",
            "--release",
            "-p",
            "durq-bench",
            "--no-default-features",
            "--features",
            "redis,runtime",
        ],
        &[],
    )?;
    let binary = target_dir("target").join("release").join("durq-bench");
    let partitions = args.partitions;
    let (single, spread) = redis_cluster::with_cluster(BENCH_CLUSTER_PORT, |urls| {
        let mut single = Vec::new();
        let mut spread = Vec::new();
        for pair in 1..=args.pairs {
            eprintln!("bench-cluster: pair {pair} of {}", args.pairs);
            single.push(run_once(&binary, &args, urls, 1)?);
            spread.push(run_once(&binary, &args, urls, partitions)?);
        }
        Ok((single, spread))
    })?;
    println!("{}", table(&args, &single, &spread));
    Ok(())
}

/// One `durq-bench` run on the cluster with a namespace of `partitions`.
fn run_once(binary: &Path, args: &Args, urls: &[String], partitions: u64) -> Result<Run, String> {
    let nodes = urls
        .iter()
        .map(|url| format!("{url}/?partitions={partitions}"))
        .collect::<Vec<_>>()
        .join(",");
    let jobs = args.jobs.to_string();
    let output = Command::new(binary)
        .args([
            args.workload.as_str(),
            "--backend",
            "redis",
            "--jobs",
            &jobs,
        ])
        .env("JOBS_REDIS_CLUSTER_URLS", &nodes)
        .output()
        .map_err(|err| format!("cannot start {}: {err}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let sample = stdout
        .lines()
        .rev()
        .find_map(|line| Sample::parse(line).ok())
        .ok_or_else(|| {
            format!(
                "durq-bench printed no result (K = {partitions}, {}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    if let Some(error) = sample.text("error") {
        return Err(format!("durq-bench failed (K = {partitions}): {error}"));
    }
    let mut shares: Vec<f64> = (0..urls.len())
        .map_while(|node| sample.num(&format!("node{node}_cpu_share")))
        .collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    let run = Run {
        jobs_per_s: sample.num("value").ok_or("a result without its value")?,
        server_cpu_us_per_job: sample.num("server_cpu_us_per_job"),
        shares,
    };
    eprintln!(
        "  K = {partitions}: {:.0} jobs/s, master shares (busiest first) {:?}",
        run.jobs_per_s,
        run.shares
            .iter()
            .map(|share| format!("{share:.2}"))
            .collect::<Vec<_>>()
    );
    Ok(run)
}

/// The report: medians per K, each master's share, and the pairs' speed-up.
fn table(args: &Args, single: &[Run], spread: &[Run]) -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mut out = format!(
        "`cargo xtask bench-cluster --partitions {} --pairs {} --jobs {} --workload {}` \
         (3 masters on loopback, one `durq-bench` worker process; this machine has {cores} \
         cores for the masters and the client together)\n\n\
         | namespace | jobs/s (median) | server CPU µs/job | busiest master's share | second | third |\n\
         |---|---:|---:|---:|---:|---:|\n",
        args.partitions, args.pairs, args.jobs, args.workload
    );
    for (name, runs) in [
        ("K = 1".to_owned(), single),
        (format!("K = {}", args.partitions), spread),
    ] {
        let value = |pick: &dyn Fn(&Run) -> Option<f64>| {
            median(runs.iter().filter_map(pick).collect()).map_or_else(
                || "–".to_owned(),
                |v| {
                    if v >= 100.0 {
                        format!("{v:.0}")
                    } else {
                        format!("{v:.2}")
                    }
                },
            )
        };
        let shares: Vec<String> = (0..3)
            .map(|node| value(&|run: &Run| run.shares.get(node).copied()))
            .collect();
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            value(&|run: &Run| Some(run.jobs_per_s)),
            value(&|run: &Run| run.server_cpu_us_per_job),
            shares[0],
            shares[1],
            shares[2],
        ));
    }
    let ratios: Vec<f64> = single
        .iter()
        .zip(spread)
        .map(|(one, many)| many.jobs_per_s / one.jobs_per_s)
        .collect();
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(0.0, f64::max);
    out.push_str(&format!(
        "\nThroughput of K = {} against K = 1, pair by pair: median {:.2} (range {low:.2}–{high:.2}).\n",
        args.partitions,
        median(ratios.clone()).unwrap_or(0.0),
    ));
    out
}
