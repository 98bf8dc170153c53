//! The `durq` binary: parses the command line, runs the command, and exits 0 on
//! success, 1 when the operation failed (`durq: error: …` on stderr), 2 on a usage
//! error (clap's own message).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use durq_cli::{Cli, Console};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = cli.check() {
        err.exit();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(&format!("cannot start the async runtime: {err}")),
    };
    let mut stdout = std::io::stdout().lock();
    let outcome = runtime.block_on(durq_cli::execute(&cli, &mut stdout, &mut Console));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // `durq list | head`: the reader has gone, as `psql` takes it.
        Err(err) if err.is_broken_pipe() => ExitCode::SUCCESS,
        Err(err) => {
            let _ = stdout.flush();
            fail(err.message())
        }
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("durq: error: {message}");
    ExitCode::FAILURE
}
