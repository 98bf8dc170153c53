// `jobs-bench`: one benchmark workload on one backend, on a fresh store, printing one
// JSON result line. `cargo xtask bench` runs it per backend, size and run, and writes
// `docs/benchmarks.md`; see that file for the workloads and the protocol.
//
// ```text
// jobs-bench <workload> --backend NAME [--jobs N] [--concurrency C] [--claim-batch B]
//            [--enqueue-batch B] [--producers P] [--rate R] [--driver runtime|loop]
//            [--stall-secs S] [--deadline-secs S]
// workloads: info, enqueue-one, enqueue-batch, e2e-backlog, e2e-producer, latency, reclaim
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
mod workloads;

use std::process::ExitCode;
use std::time::Duration;

use drain::Driver;
use report::Line;
use workloads::Options;

const WORKLOADS: &[&str] = &[
    "info",
    "enqueue-one",
    "enqueue-batch",
    "e2e-backlog",
    "e2e-producer",
    "latency",
    "reclaim",
];

fn usage() -> String {
    format!(
        "usage: jobs-bench <{}> --backend <{}> [--jobs N] [--concurrency C] [--claim-batch B] \
         [--enqueue-batch B] [--producers P] [--rate R] [--driver runtime|loop] [--stall-secs S] [--deadline-secs S]",
        WORKLOADS.join("|"),
        backends::compiled().join("|")
    )
}

struct Args {
    workload: String,
    opts: Options,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let workload = args.first().cloned().ok_or_else(usage)?;
    if !WORKLOADS.contains(&workload.as_str()) {
        return Err(format!("unknown workload {workload:?}\n{}", usage()));
    }
    let mut opts = Options {
        backend: String::new(),
        jobs: 100_000,
        concurrency: 32,
        claim_batch: 32,
        enqueue_batch: 1_000,
        producers: 16,
        rate: 500,
        driver: Driver::default_for_build(),
        stall: Duration::from_secs(60),
        deadline: None,
    };
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))?;
        let number = || -> Result<u64, String> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{flag} wants a positive integer, not {value:?}"))
        };
        match flag.as_str() {
            "--backend" => opts.backend = value.clone(),
            "--jobs" => opts.jobs = number()?,
            "--concurrency" => opts.concurrency = number()? as usize,
            "--claim-batch" => opts.claim_batch = number()? as usize,
            "--enqueue-batch" => opts.enqueue_batch = number()? as usize,
            "--producers" => opts.producers = number()? as usize,
            "--rate" => opts.rate = number()?,
            "--driver" => opts.driver = Driver::parse(value)?,
            "--stall-secs" => opts.stall = Duration::from_secs(number()?),
            "--deadline-secs" => opts.deadline = Some(Duration::from_secs(number()?)),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if opts.backend.is_empty() {
        return Err(format!("--backend is required\n{}", usage()));
    }
    Ok(Args { workload, opts })
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
    let store = std::sync::Arc::clone(&opened.store);
    let outcome = match workload.as_str() {
        "enqueue-one" => workloads::enqueue_one(store, &opts).await,
        "enqueue-batch" => workloads::enqueue_batch(store, &opts).await,
        "e2e-backlog" => workloads::e2e_backlog(store, &opened.housekeeping, &opts).await,
        "e2e-producer" => workloads::e2e_producer(store, &opened.housekeeping, &opts).await,
        "latency" => workloads::latency(store, &opts).await,
        "reclaim" => workloads::reclaim(store, &opts).await,
        other => Err(format!("unknown workload {other:?}")),
    };
    let cleaned = opened.cleanup().await;
    outcome?;
    cleaned
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("jobs-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let workload = parsed.workload.clone();
    let backend = parsed.opts.backend.clone();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("jobs-bench: cannot start tokio: {err}");
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
            eprintln!("jobs-bench: {workload} on {backend}: {message}");
            ExitCode::FAILURE
        }
    }
}
