//! The interactive side of a command: its stdin, its questions, its progress bar and
//! its warnings. [`Console`] is the process's own; tests give commands another.

use std::io::{self, BufRead, IsTerminal, Read, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What a command may ask of the person (or script) running it.
pub trait Terminal {
    /// Whether stdin is a terminal (so nothing is piped in).
    fn stdin_is_terminal(&self) -> bool;

    /// Reads all of stdin.
    fn read_stdin(&mut self) -> io::Result<Vec<u8>>;

    /// Whether a person can answer a question: stdin and stderr are terminals.
    fn can_ask(&self) -> bool;

    /// Asks `question` and whether the answer was yes. Called only when
    /// [`Terminal::can_ask`].
    fn confirm(&mut self, question: &str) -> io::Result<bool>;

    /// A progress bar of `len` steps; hidden where nobody watches.
    fn progress(&self, len: u64) -> ProgressBar;

    /// Tells the person something that is not the command's output.
    fn warn(&mut self, message: &str);

    /// Tells the person what the command is doing (a server's address), on stderr.
    fn note(&mut self, message: &str);
}

/// The process's stdin and stderr.
#[derive(Debug, Default)]
pub struct Console;

impl Terminal for Console {
    fn stdin_is_terminal(&self) -> bool {
        io::stdin().is_terminal()
    }

    fn read_stdin(&mut self) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        io::stdin().lock().read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn can_ask(&self) -> bool {
        io::stdin().is_terminal() && io::stderr().is_terminal()
    }

    fn confirm(&mut self, question: &str) -> io::Result<bool> {
        let mut stderr = io::stderr().lock();
        write!(stderr, "{question} [y/N] ")?;
        stderr.flush()?;
        let mut answer = String::new();
        io::stdin().lock().read_line(&mut answer)?;
        Ok(is_yes(&answer))
    }

    fn progress(&self, len: u64) -> ProgressBar {
        if !io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta} left)")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    }

    fn warn(&mut self, message: &str) {
        eprintln!("durq: warning: {message}");
    }

    fn note(&mut self, message: &str) {
        eprintln!("jobs: {message}");
    }
}

/// Whether `answer` says yes: `y` or `yes`, in any case.
pub fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_y_and_yes_are_yes() {
        for yes in ["y", "Y", "yes\n", " YES "] {
            assert!(is_yes(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yep", "oui"] {
            assert!(!is_yes(no), "{no:?}");
        }
    }
}
