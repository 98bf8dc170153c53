//! `durq-chaos`: the processes of the chaos suite (issue #11), driven by
//! `cargo xtask chaos`, which starts them, kills them and checks what they recorded.
//!
//! - `durq-chaos worker …`: a real worker (the `durq` runtime) over a recording store;
//! - `durq-chaos producer …`: enqueues a fixed plan of batches, resuming after a kill;
//! - `durq-chaos drain …`: waits until the queue has nothing ready, scheduled or running;
//! - `durq-chaos check …`: reads the run's history and the store's final state and
//!   prints the verdict as one JSON line.
//!
//! Every process writes its own history file in the run directory (see
//! [`history`]). Workers and the producer stop gracefully when their standard input
//! closes, so they never outlive the orchestrator that started them.

mod check;
mod history;
mod producer;
mod recording;
mod worker;

use clap::{Args, Parser, Subcommand};
use durq::{Store, StoreSettings};
use std::path::PathBuf;
use std::process::ExitCode;

/// The chaos suite's processes.
#[derive(Debug, Parser)]
#[command(name = "durq-chaos", about = "processes of the jobs chaos suite")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a worker until standard input closes, then shuts it down gracefully.
    Worker(worker::WorkerArgs),
    /// Enqueues the run's plan of batches, skipping those an earlier producer finished.
    Producer(producer::ProducerArgs),
    /// Waits until nothing is ready, scheduled or running on the queue.
    Drain(check::DrainArgs),
    /// Checks the history against the store and prints the verdict as JSON.
    Check(check::CheckArgs),
}

/// Where the store is and where the history goes: shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The store URL: sqlite://…, redis://… or postgres://….
    #[arg(long)]
    url: String,
    /// The store namespace of this run.
    #[arg(long)]
    namespace: String,
    /// The PostgreSQL schema of this run (PostgreSQL only).
    #[arg(long)]
    pg_schema: Option<String>,
    /// The PostgreSQL `application_name` of this process's connections, by which the
    /// orchestrator finds them (and only them) to terminate.
    #[arg(long)]
    app_name: Option<String>,
    /// The most PostgreSQL connections this process opens.
    #[arg(long, default_value_t = 4)]
    pg_connections: u32,
    /// The run directory holding the history files.
    #[arg(long)]
    run_dir: PathBuf,
    /// The queue the run uses.
    #[arg(long, default_value = "chaos")]
    queue: String,
}

/// Opens the store `args` names, in the run's namespace (and schema), carrying the
/// layers `durq::connect` adds, so every backend runs under the same ones.
pub async fn open_store(args: &StoreArgs) -> Result<Store, String> {
    // Every store of the run records its jobs' events, so the checker can read the
    // stream back against the history (CONTRACT V1, V2); it keeps them all.
    let settings = StoreSettings::default()
        .namespace(args.namespace.clone())
        .record_events(1 << 40);
    if args.url.starts_with("postgres://") || args.url.starts_with("postgresql://") {
        use durq::backends::postgres::PostgresConfig;
        let mut config = PostgresConfig::new(&args.url)
            .map_err(|err| format!("postgres config: {err}"))?
            .max_connections(args.pg_connections);
        if let Some(schema) = &args.pg_schema {
            config = config
                .schema(schema.clone())
                .map_err(|err| format!("postgres schema: {err}"))?;
        }
        if let Some(name) = &args.app_name {
            config = config.application_name(name);
        }
        let store = config
            .open(settings)
            .await
            .map_err(|err| format!("cannot open the PostgreSQL store: {err}"))?;
        return Ok(Store::new(store).layer(durq::layers::MetricsLayer));
    }
    durq::connect_with(&args.url, settings)
        .await
        .map_err(|err| format!("cannot open the store: {err}"))
}

/// Calls `f` until it succeeds, waiting `pause` between attempts: a process of the
/// suite starts while its store may be down (a Redis being restarted) and must wait
/// for it rather than give up.
pub async fn patiently<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut pause = std::time::Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        match f().await {
            Ok(value) => return value,
            Err(err) => {
                tries += 1;
                if tries % 20 == 1 {
                    eprintln!("durq-chaos: {what} failed (try {tries}): {err}");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
        }
    }
}

/// Resolves when standard input reaches its end: the orchestrator closed it (asking
/// for a graceful stop) or died.
pub async fn stdin_closed() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let _ = rx.await;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("durq-chaos: cannot start tokio: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Worker(args) => worker::run(args).await,
            Command::Producer(args) => producer::run(args).await,
            Command::Drain(args) => check::drain(args).await,
            Command::Check(args) => check::run(args).await,
        }
    });
    // Leftover tasks (a wake-up listener, a connection manager) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("durq-chaos: {message}");
            ExitCode::FAILURE
        }
    }
}
