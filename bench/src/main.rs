// `durq-bench`: one benchmark workload on one backend, on a fresh store, printing one
// JSON result line. `cargo xtask bench` runs it per backend, size and run, and writes
// `docs/benchmarks.md`; see that file for the workloads and the protocol.
//
// ```text
// durq-bench <workload> --backend NAME [--jobs N] [--concurrency C] [--claim-batch B]
//            [--enqueue-batch B] [--producers P] [--rate R] [--driver runtime|loop]
//            [--stall-secs S] [--deadline-secs S] [--claimers N]
// workloads: info, enqueue-one, enqueue-batch, e2e-backlog, e2e-producer, e2e-graphs,
//            latency, latency-tx, reclaim, claim, claim-budget, claim-keys,
//            claim-limited, claim-one-per-key
// ```

#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backends;
mod drain;
mod housekeeping;
mod probe;
mod progress;
mod report;
#[cfg(feature = "runtime")]
mod runtime;
mod transactional;
mod workloads;

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::Parser;

use drain::Driver;
use report::Line;
use workloads::{FlowLimits, Options};

const WORKLOADS: &[&str] = &[
    "info",
    "enqueue-one",
    "enqueue-batch",
    "e2e-backlog",
    "e2e-producer",
    "e2e-graphs",
    "latency",
    "latency-tx",
    "reclaim",
    "claim",
    "claim-budget",
    "claim-keys",
    "claim-limited",
    "claim-one-per-key",
];

/// One benchmark workload on one backend, on a fresh store, printing one JSON result
/// line (`cargo xtask bench` runs it and collects the lines).
#[derive(Debug, Parser)]
#[command(name = "durq-bench")]
struct Cli {
    /// The workload to run.
    #[arg(value_parser = PossibleValuesParser::new(WORKLOADS))]
    workload: String,
    /// The backend: memory, sqlite, redis or postgres, of those this build has.
    #[arg(long)]
    backend: String,
    /// Jobs per run.
    #[arg(long, default_value_t = 100_000, value_parser = positive::<u64>)]
    jobs: u64,
    /// Jobs run at once by the workers.
    #[arg(long, default_value_t = 32, value_parser = positive::<usize>)]
    concurrency: usize,
    /// Jobs per claim of the loop driver and of the claim workloads.
    #[arg(long, default_value_t = 32, value_parser = positive::<usize>)]
    claim_batch: usize,
    /// Concurrent claimers of the claim workloads: four, as four worker processes'
    /// claim loops on one queue.
    #[arg(long, default_value_t = 4, value_parser = positive::<usize>)]
    claimers: usize,
    /// Jobs per `enqueue_batch` call.
    #[arg(long, default_value_t = 1_000, value_parser = positive::<usize>)]
    enqueue_batch: usize,
    /// Concurrent producers of the one-at-a-time enqueue workload.
    #[arg(long, default_value_t = 16, value_parser = positive::<usize>)]
    producers: usize,
    /// Jobs per second of the latency workloads' producer.
    #[arg(long, default_value_t = 500, value_parser = positive::<u64>)]
    rate: u64,
    /// How to drain: the worker runtime or a bare claim/complete loop [default: runtime
    /// when built in, else loop].
    #[arg(long, value_parser = Driver::parse, value_name = "runtime|loop")]
    driver: Option<Driver>,
    /// Seconds without a finished job before a run is declared stalled.
    #[arg(long, default_value_t = 60, value_parser = positive::<u64>)]
    stall_secs: u64,
    /// `e2e-backlog` stops after draining this many seconds and reports the rate so far.
    #[arg(long, value_parser = positive::<u64>)]
    deadline_secs: Option<u64>,
    /// The drain fails each job's first attempt (ready again at once) and completes the
    /// second: the price of a failure, and of recording its attempt (CONTRACT H2).
    #[arg(long)]
    fail_first: bool,
}

/// Parses a count that must be above zero: a run of zero jobs, producers or seconds
/// measures nothing.
fn positive<T: FromStr + Default + PartialEq>(text: &str) -> Result<T, String> {
    match text.parse::<T>() {
        Ok(n) if n != T::default() => Ok(n),
        _ => Err(format!("wants a positive integer, not {text:?}")),
    }
}

struct Args {
    workload: String,
    opts: Options,
}

impl From<Cli> for Args {
    fn from(cli: Cli) -> Self {
        Args {
            workload: cli.workload,
            opts: Options {
                backend: cli.backend,
                jobs: cli.jobs,
                concurrency: cli.concurrency,
                claim_batch: cli.claim_batch,
                claimers: cli.claimers,
                enqueue_batch: cli.enqueue_batch,
                producers: cli.producers,
                rate: cli.rate,
                driver: cli.driver.unwrap_or_else(Driver::default_for_build),
                stall: Duration::from_secs(cli.stall_secs),
                deadline: cli.deadline_secs.map(Duration::from_secs),
                fail_first: cli.fail_first,
            },
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let Args { workload, opts } = args;
    if workload == "info" {
        let server = backends::server_version(&opts.backend).await?;
        Line::new("info", &opts.backend)
            .text("server", server)
            .text("version", env!("CARGO_PKG_VERSION"))
            .emit();
        return Ok(());
    }
    let opened = backends::open(&opts.backend).await?;
    // The workload takes a handle of its own; `opened` keeps one for the clean-up.
    let store = opened.store.clone();
    let outcome = match workload.as_str() {
        "enqueue-one" => workloads::enqueue_one(store, &opts).await,
        "enqueue-batch" => workloads::enqueue_batch(store, &opts).await,
        "e2e-backlog" => workloads::e2e_backlog(store, &opened.housekeeping, &opts).await,
        "e2e-producer" => workloads::e2e_producer(store, &opened.housekeeping, &opts).await,
        "e2e-graphs" => workloads::e2e_graphs(store, &opened.housekeeping, &opts).await,
        "latency" => workloads::latency(store, &opts).await,
        "latency-tx" => workloads::latency_tx(store, opened.transactional.as_ref(), &opts).await,
        "reclaim" => workloads::reclaim(store, &opts).await,
        "claim" => workloads::claim(store, &opts, false).await,
        "claim-budget" => workloads::claim(store, &opts, true).await,
        "claim-keys" => workloads::claim_limited(store, &opts, FlowLimits::None).await,
        "claim-limited" => workloads::claim_limited(store, &opts, FlowLimits::AdmitAll).await,
        "claim-one-per-key" => workloads::claim_limited(store, &opts, FlowLimits::OnePerKey).await,
        other => Err(format!("unknown workload {other:?}")),
    };
    let cleaned = opened.cleanup().await;
    outcome?;
    cleaned
}

fn main() -> ExitCode {
    // clap prints the usage and exits with 2 on a bad command line (0 for --help).
    let parsed = Args::from(Cli::parse());
    let workload = parsed.workload.clone();
    let backend = parsed.opts.backend.clone();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("durq-bench: cannot start tokio: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(parsed)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // A failure is a result too: the report records it in the table.
            Line::new(&workload, &backend)
                .text("error", message.clone())
                .emit();
            eprintln!("durq-bench: {workload} on {backend}: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        let all = std::iter::once("durq-bench").chain(args.iter().copied());
        Cli::try_parse_from(all).map(Args::from)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_keep_their_defaults() {
        let Args { workload, opts } =
            parse(&["e2e-backlog", "--backend", "memory"]).expect("parses");
        assert_eq!(workload, "e2e-backlog");
        assert_eq!(opts.backend, "memory");
        assert_eq!((opts.jobs, opts.rate), (100_000, 500));
        assert_eq!((opts.concurrency, opts.claim_batch), (32, 32));
        assert_eq!((opts.enqueue_batch, opts.producers), (1_000, 16));
        assert_eq!(opts.driver, Driver::default_for_build());
        assert_eq!(opts.stall, Duration::from_secs(60));
        assert_eq!(opts.deadline, None);
        let Args { opts, .. } = parse(&[
            "latency",
            "--backend",
            "redis",
            "--jobs",
            "7",
            "--concurrency",
            "2",
            "--claim-batch",
            "3",
            "--enqueue-batch",
            "4",
            "--producers",
            "5",
            "--rate",
            "6",
            "--driver",
            "loop",
            "--stall-secs",
            "8",
            "--deadline-secs",
            "9",
        ])
        .expect("parses");
        assert_eq!((opts.jobs, opts.rate), (7, 6));
        assert_eq!((opts.concurrency, opts.claim_batch), (2, 3));
        assert_eq!((opts.enqueue_batch, opts.producers), (4, 5));
        assert_eq!(opts.driver, Driver::Loop);
        assert_eq!(opts.stall, Duration::from_secs(8));
        assert_eq!(opts.deadline, Some(Duration::from_secs(9)));
    }

    #[test]
    fn bad_flags_are_refused() {
        for bad in [
            &["e2e-backlog", "--backend", "memory", "--jobs", "0"][..],
            &["e2e-backlog", "--backend", "memory", "--rate", "-3"],
            &["e2e-backlog", "--backend", "memory", "--driver", "threads"],
            &["e2e-backlog", "--backend", "memory", "--jobs"],
            &["e2e-backlog"],
            &["nonsense", "--backend", "memory"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
