//! The history: one JSON line per event, one file per process, in the run directory.
//!
//! Every line is written with one `write` call on an unbuffered file, so a line is in
//! the kernel as soon as the call that produced it returns, and a SIGKILL can only cut
//! the line being written. The checker skips a final line that does not parse.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use durq::JobId;
use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch on the wall clock. All processes of a run share
/// one machine, so their times are comparable; microseconds, because a claim and a
/// completion of the same job can fall in the same millisecond.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The operation an outcome line answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `complete`, or one entry of `complete_batch`.
    Complete,
    /// `fail`.
    Fail,
    /// `release`.
    Release,
}

/// One history line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub enum Event {
    /// A process started (its pid is in the file name too).
    Start {
        /// Wall time.
        t: u64,
        /// `worker` or `producer`.
        role: String,
        /// The process id.
        pid: u32,
    },
    /// An enqueue the store acknowledged (logged after the call returned `Ok`).
    Enqueued {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// False when the idempotency key matched an existing job.
        created: bool,
        /// The idempotency key sent, if any.
        key: Option<String>,
        /// The producer's batch number.
        batch: u64,
    },
    /// Every job of a producer batch is acknowledged and logged.
    BatchDone {
        /// Wall time.
        t: u64,
        /// The producer's batch number.
        batch: u64,
    },
    /// A job a claim returned, with its token.
    Claim {
        /// Wall time at which the claim returned.
        t: u64,
        /// The job.
        id: JobId,
        /// The lease token of this claim.
        token: u64,
    },
    /// A handler run began.
    RunStart {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// The attempt number the handler saw.
        attempt: u32,
    },
    /// A handler run returned.
    RunEnd {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// Whether the handler returned `Ok`.
        ok: bool,
    },
    /// The store's answer to a complete, fail or release.
    Outcome {
        /// Wall time at which the call began.
        t0: u64,
        /// Wall time at which it returned.
        t: u64,
        /// Which call.
        op: Op,
        /// The job.
        id: JobId,
        /// The token the call carried.
        token: u64,
        /// Whether the store accepted it.
        ok: bool,
        /// Whether the refusal was `LeaseLost`.
        lease_lost: bool,
        /// The error, when refused.
        err: Option<String>,
    },
    /// A heartbeat the store refused for one lease, or a failed heartbeat call.
    HeartbeatRefused {
        /// Wall time.
        t: u64,
        /// The job, when one entry was refused; `None` for a failed call.
        id: Option<JobId>,
        /// The token.
        token: u64,
        /// The error.
        err: String,
    },
    /// A store call of the worker that failed as a whole (claim, reclaim, a wait for
    /// work): how the faults reached the workers.
    CallFailed {
        /// Wall time.
        t: u64,
        /// The call.
        op: String,
        /// The error.
        err: String,
    },
    /// A job `reclaim` took back, and where it went.
    Reclaimed {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// Its state afterwards.
        state: String,
    },
    /// A durable step's work began: written inside the closure `ctx.step` runs, so
    /// only when no saved output answered the step (CONTRACT D2).
    StepRun {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// The step's name.
        step: String,
    },
    /// `ctx.step` returned `Ok` after running the step's work: its output is saved
    /// under this run's token (CONTRACT D1).
    StepSaved {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// The step's name.
        step: String,
    },
    /// `ctx.step` answered from a saved output without running the work.
    StepReplayed {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// The step's name.
        step: String,
        /// The token of the run that saved the output, as the output itself says.
        saved_by: u64,
    },
    /// `ctx.step` returned `Err`: the steps could not be read, or the save was
    /// refused (a lost lease) or its answer lost (an unreachable store), so the step
    /// may run again.
    StepFailed {
        /// Wall time.
        t: u64,
        /// The job.
        id: JobId,
        /// The token of the claim being run.
        token: u64,
        /// The step's name.
        step: String,
        /// The error.
        err: String,
    },
}

/// An append-only history file of one process.
#[derive(Debug)]
pub struct Log {
    file: Mutex<File>,
}

impl Log {
    /// Creates `<dir>/<role>-<pid>.jsonl`.
    pub fn create(dir: &Path, role: &str) -> std::io::Result<Log> {
        let pid = std::process::id();
        let path = dir.join(format!("{role}-{pid}.jsonl"));
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let log = Log {
            file: Mutex::new(file),
        };
        log.write(&Event::Start {
            t: now_us(),
            role: role.to_owned(),
            pid,
        });
        Ok(log)
    }

    /// Appends one event. A history that cannot be written makes the run worthless,
    /// so a failed write ends the process loudly rather than leaving a silent gap.
    pub fn write(&self, event: &Event) {
        let mut line = match serde_json::to_string(event) {
            Ok(line) => line,
            Err(err) => fatal(&format!("cannot encode a history line: {err}")),
        };
        line.push('\n');
        let mut file = match self.file.lock() {
            Ok(file) => file,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(err) = file.write_all(line.as_bytes()) {
            fatal(&format!("cannot append to the history: {err}"));
        }
    }
}

/// Prints `message` and exits with status 3 (told apart from a SIGKILL by the
/// orchestrator).
pub fn fatal(message: &str) -> ! {
    eprintln!("durq-chaos: {message}");
    std::process::exit(3)
}

/// One history file read back: its role, pid and the events that parsed.
#[derive(Debug)]
pub struct ProcessHistory {
    /// `worker` or `producer`.
    pub role: String,
    /// The process id.
    pub pid: u32,
    /// The events, in file order.
    pub events: Vec<Event>,
    /// Lines that did not parse (a SIGKILL cuts at most the last one).
    pub bad_lines: usize,
    /// Whether a line other than the last did not parse.
    pub bad_inner_line: bool,
}

/// Reads every `<role>-<pid>.jsonl` file of `dir` whose role is `role` (any role for
/// `None`).
pub fn read_dir(dir: &Path, role: Option<&str>) -> std::io::Result<Vec<ProcessHistory>> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    paths.sort();
    for path in paths {
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let Some((file_role, pid)) = stem.rsplit_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if role.is_some_and(|r| r != file_role) || !matches!(file_role, "worker" | "producer") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let lines: Vec<&str> = text.lines().collect();
        let mut events = Vec::with_capacity(lines.len());
        let mut bad_lines = 0;
        let mut bad_inner_line = false;
        for (i, line) in lines.iter().enumerate() {
            match serde_json::from_str::<Event>(line) {
                Ok(event) => events.push(event),
                Err(_) => {
                    bad_lines += 1;
                    // Only the final line may be cut by a kill.
                    if i + 1 != lines.len() || text.ends_with('\n') {
                        bad_inner_line = true;
                    }
                }
            }
        }
        out.push(ProcessHistory {
            role: file_role.to_owned(),
            pid,
            events,
            bad_lines,
            bad_inner_line,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_final_line_is_tolerated_and_an_inner_one_is_not() {
        let dir = std::env::temp_dir().join(format!("durq-chaos-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let id = JobId::mint(durq::Timestamp::from_millis(1_000));
        let line = serde_json::to_string(&Event::Claim { t: 1, id, token: 7 }).expect("encode");
        let cut = &line[..line.len() / 2];
        std::fs::write(dir.join("worker-11.jsonl"), format!("{line}\n{cut}")).expect("write");
        std::fs::write(dir.join("worker-12.jsonl"), format!("{cut}\n{line}\n")).expect("write");
        let mut read = read_dir(&dir, Some("worker")).expect("read");
        read.sort_by_key(|h| h.pid);
        assert_eq!(
            (read[0].pid, read[0].events.len(), read[0].bad_lines),
            (11, 1, 1)
        );
        assert!(!read[0].bad_inner_line);
        assert!(read[1].bad_inner_line);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
