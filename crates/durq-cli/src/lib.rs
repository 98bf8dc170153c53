//! The `durq` command line, as a library: the grammar ([`Cli`]), and each command as a
//! function of a [`Context`] (a [`Store`], a writer for what the command prints, and
//! the [`Terminal`] it may ask questions on), so commands are tested without a process
//! and the binary is a thin `main`.
//!
//! ```text
//! durq --url sqlite://jobs.db queues
//! durq --url redis://127.0.0.1:6379 -n billing list --queue invoices --state dead
//! durq --url postgres://ops@db/jobs retry --queue invoices --state dead --dry-run
//! ```
//!
//! Exit status: 0 on success; 1 when an operation failed (`durq: error: …` on stderr,
//! one line, never a URL's password); 2 on a usage error (clap's own message).

#![deny(missing_docs)]

pub mod cli;
pub mod commands;
mod connect;
pub mod error;
pub mod format;
mod terminal;
pub mod view;

use std::io::Write;

pub use cli::{Action, Cli, Command};
pub use durq::Store;
pub use error::{CliError, Result};
pub use terminal::{Console, Terminal};

/// What a command works with.
pub struct Context<'a> {
    /// The store the command reads and changes.
    pub store: &'a Store,
    /// Where the command's output goes (stdout in the binary).
    pub out: &'a mut dyn Write,
    /// Print one JSON document instead of tables.
    pub json: bool,
    /// Questions, progress and warnings (stdin and stderr in the binary).
    pub terminal: &'a mut dyn Terminal,
}

impl Context<'_> {
    /// Writes `text` to the output.
    pub fn print(&mut self, text: &str) -> Result<()> {
        self.out.write_all(text.as_bytes())?;
        Ok(())
    }

    /// Writes `value` as one JSON document, pretty, on its own lines.
    pub fn print_json<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        serde_json::to_writer_pretty(&mut *self.out, value).map_err(|err| {
            match err.io_error_kind() {
                // The output's own trouble (a reader gone away), not the JSON's.
                Some(kind) => CliError::from(std::io::Error::from(kind)),
                None => CliError::new(format!("cannot write JSON: {err}")),
            }
        })?;
        self.out.write_all(b"\n")?;
        Ok(())
    }
}

/// Runs the command `cli` names: checks and prepares what it needs from the command
/// line and stdin, opens the store, runs the command, and flushes `out`. An error's
/// message never holds the URL's password.
pub async fn execute(cli: &Cli, out: &mut dyn Write, terminal: &mut dyn Terminal) -> Result<()> {
    let url = cli.url();
    run(cli, url, out, terminal)
        .await
        .map_err(|err| err.redact(url))
}

async fn run(cli: &Cli, url: &str, out: &mut dyn Write, terminal: &mut dyn Terminal) -> Result<()> {
    // Everything the command line and stdin say is checked before the store is opened.
    let job = match &cli.command {
        Command::Enqueue(args) => Some(commands::enqueue::prepare(args, terminal)?),
        _ => None,
    };
    if connect::is_memory(url) {
        terminal.warn(
            "memory:// opens a new, empty store inside this process: nothing is shared \
             with any other process",
        );
    }
    let mut settings = durq::StoreSettings::default().namespace(cli.namespace.as_str());
    if let Command::Purge(args) = &cli.command {
        settings = settings.retention(args.retention);
    }
    // Only an enqueue may create an SQLite file: a typo in a path reads nothing.
    let create = job.is_some();
    let store = connect::open(url, settings, create).await?;
    let mut cx = Context {
        store: &store,
        out,
        json: cli.json,
        terminal,
    };
    match (&cli.command, job) {
        (Command::Enqueue(_), Some(job)) => commands::enqueue::run(&mut cx, job).await?,
        (command, _) => commands::run(&mut cx, command).await?,
    }
    cx.out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that went away, as `durq list | head -1` leaves it.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_closed_output_is_a_broken_pipe_for_tables_and_json() {
        let store = durq::connect("memory://").await.expect("store");
        let mut out = Closed;
        let mut console = Console;
        let mut cx = Context {
            store: &store,
            out: &mut out,
            json: false,
            terminal: &mut console,
        };
        assert!(cx.print("x\n").expect_err("closed").is_broken_pipe());
        let err = cx.print_json(&vec!["x"; 100]).expect_err("closed");
        assert!(err.is_broken_pipe(), "{err}");
    }
}
