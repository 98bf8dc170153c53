//! The grammar of the command line: every command, argument and flag, as clap reads
//! them. Values are checked here (ids, states, queue names, times, durations), so a
//! malformed one is a usage error (exit status 2) before any store is opened.

use std::net::SocketAddr;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use durq::{JobId, JobState, Timestamp};

/// The `durq` command line: reads and operates a durq store on any backend.
#[derive(Debug, Parser)]
#[command(
    name = "durq",
    version,
    about = "Inspect and operate a durq store on any backend",
    after_help = "Exit status: 0 on success, 1 when an operation failed (not found, invalid \
                  state, the store unreachable...), 2 on a usage error."
)]
pub struct Cli {
    /// The store: memory://, sqlite://PATH, redis://HOST:PORT, postgres://USER@HOST/DB.
    #[arg(long, env = "DURQ_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,

    /// The namespace of the store to work in.
    #[arg(
        short = 'n',
        long,
        env = "DURQ_NAMESPACE",
        global = true,
        default_value = "default",
        value_parser = namespace_name
    )]
    pub namespace: String,

    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Checks what clap alone cannot: that a URL was given (it is a global flag, which
    /// clap cannot require), and that a filter names states the action applies to.
    /// Returns clap's own error, so it is reported like every other usage error.
    pub fn check(&self) -> Result<(), clap::Error> {
        if self.url.as_deref().is_none_or(str::is_empty) {
            return Err(usage(
                ErrorKind::MissingRequiredArgument,
                "the store's URL is required: pass --url URL or set DURQ_URL",
            ));
        }
        match &self.command {
            Command::Retry(selection) => selection.check(Action::Retry),
            Command::Cancel(selection) => selection.check(Action::Cancel),
            _ => Ok(()),
        }
    }

    /// The URL, once [`Cli::check`] has passed.
    pub fn url(&self) -> &str {
        self.url.as_deref().unwrap_or_default()
    }
}

/// A usage error worded by us, formatted and reported by clap (exit status 2).
fn usage(kind: ErrorKind, message: impl std::fmt::Display) -> clap::Error {
    Cli::command().error(kind, message)
}

/// A usage error of subcommand `name`, showing that subcommand's usage.
fn subcommand_usage(name: &str, kind: ErrorKind, message: impl std::fmt::Display) -> clap::Error {
    let mut command = Cli::command();
    command.build();
    match command.find_subcommand_mut(name) {
        Some(subcommand) => subcommand.error(kind, message),
        None => command.error(kind, message),
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every queue of the namespace with its counts per state, lag, and whether it is paused.
    Queues,
    /// The live workers: where they run, what they serve, and the jobs they are running.
    Workers,
    /// Counts of one queue's jobs per state, and whether it is paused.
    Stats {
        /// The queue (as `list --queue` names it).
        #[arg(long, value_parser = queue_name)]
        queue: String,
    },
    /// One page of a queue's jobs, newest first; prints the cursor of the next page.
    List(ListArgs),
    /// One job: its fields, payload, lease, attempts, last error, the jobs it waits for and its children.
    Inspect {
        /// The job's id.
        id: JobId,
    },
    /// Waits until a job has ended, woken by its ending, and prints its outcome; fails
    /// (exit status 1) unless it succeeded, or when the timeout passes first.
    Wait {
        /// The job's id.
        id: JobId,
        /// How long to wait at most (`30s`, `5m`, `1h`).
        #[arg(long, default_value = "30s", value_parser = duration)]
        timeout: Duration,
    },
    /// One page of the namespace's event stream after a cursor, oldest first; prints
    /// the cursor to read on from (`--after`), and says when events were trimmed away
    /// before they were read.
    Events {
        /// Read the events after this cursor (`N-N`, as a page prints it); without it,
        /// from the oldest kept.
        #[arg(long, value_parser = event_cursor)]
        after: Option<durq_core::EventCursor>,
        /// The most events to print (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
    },
    /// Adds a job, and prints its id and whether it was created or deduplicated.
    Enqueue(EnqueueArgs),
    /// Queues dead or cancelled jobs again, with their attempts reset.
    Retry(Selection),
    /// Reopens an ended job from one of its durable steps: that step and the ones
    /// after it run again, the ones before it are kept (`inspect` lists them).
    RetryFrom {
        /// The job's id.
        id: JobId,
        /// The step to run again, with every step saved after it.
        #[arg(value_parser = step_name)]
        step: String,
        /// The generation read with `inspect`: the reopen is refused if the job was
        /// reopened since. Without it, the job's generation now.
        #[arg(long)]
        generation: Option<u64>,
    },
    /// Cancels queued jobs, and asks running ones to stop.
    Cancel(Selection),
    /// Deletes the finished jobs (succeeded, dead, cancelled) past their retention.
    Purge(PurgeArgs),
    /// Pauses a queue for every worker: no claim takes its jobs until it is resumed.
    Pause {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// Pause it even though it holds no job yet (a queue a deploy is about to
        /// use); without it, a name the namespace does not know is refused as a typo.
        #[arg(long)]
        allow_empty: bool,
    },
    /// Lets workers claim a paused queue's jobs again.
    Resume {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Every queue's limits on its running jobs and its starts; `limits set QUEUE …`
    /// sets a queue's, `limits status QUEUE` shows what they hold back, `limits clear
    /// QUEUE` removes them.
    Limits {
        /// What to do instead of listing them.
        #[command(subcommand)]
        action: Option<LimitsAction>,
    },
    /// Every periodic job: its cadence, its queue, whether it is enabled, its last and
    /// next run; `schedules delete NAME` removes one.
    Schedules {
        /// What to do instead of listing them.
        #[command(subcommand)]
        action: Option<ScheduleAction>,
    },
    /// Serves the web dashboard until ctrl-c.
    Dashboard(DashboardArgs),
}

/// What `durq limits` does besides listing.
#[derive(Debug, Subcommand)]
pub enum LimitsAction {
    /// Sets a queue's limits, replacing the ones it had, for every worker from its next
    /// claim on. Name at least one.
    Set {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// Most of the queue's jobs running at once.
        #[arg(long, value_name = "JOBS", value_parser = clap::value_parser!(u32).range(1..))]
        max_running: Option<u32>,
        /// Most jobs of one concurrency key (`NewJob::concurrency_key`) running at once.
        #[arg(long, value_name = "JOBS", value_parser = clap::value_parser!(u32).range(1..))]
        max_running_per_key: Option<u32>,
        /// Most starts of the queue's jobs in any window: STARTS/PERIOD, such as 10/1s.
        #[arg(long, value_name = "RATE", value_parser = rate)]
        max_starts: Option<durq_core::Rate>,
        /// Most starts of one concurrency key's jobs in any window: STARTS/PERIOD.
        #[arg(long, value_name = "RATE", value_parser = rate)]
        max_starts_per_key: Option<durq_core::Rate>,
        /// Claims take the queue's jobs by turns of concurrency key within a priority,
        /// so a key with a deep backlog starves no other.
        #[arg(long)]
        fair_shares: bool,
    },
    /// What a queue's limits hold back now: its running jobs, the keys at their running
    /// limit, when its rate admits the next start, and the keys whose rate is used up.
    Status {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Removes a queue's limits.
    Clear {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
}

/// What `durq schedules` does besides listing.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Deletes a schedule: no worker fires it again (one that declares it in its code
    /// stores it again when it starts).
    Delete {
        /// The schedule's name.
        name: String,
    },
}

/// The arguments of `durq dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// The address to listen on. Any address but loopback needs a token.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Show no action, and refuse every one.
    #[arg(long)]
    pub read_only: bool,
    /// The token actions need: a browser gives it once at /login, a script as
    /// `Authorization: Bearer TOKEN`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "DURQ_DASHBOARD_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Mark the login cookie `Secure`: the dashboard is reached over HTTPS (a proxy in
    /// front of it ends TLS).
    #[arg(long)]
    pub secure_cookie: bool,
}

/// The arguments of `durq list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only this queue; every queue when absent.
    #[arg(long, value_parser = queue_name)]
    pub queue: Option<String>,
    /// Only queues whose name starts with this text (literally: no wildcards).
    #[arg(long, value_name = "PREFIX", value_parser = queue_name)]
    pub prefix: Option<String>,
    /// Only jobs in this state; repeat for several.
    #[arg(long)]
    pub state: Vec<StateArg>,
    /// Only jobs of this tenant; `--tenant ""` lists the default tenant's jobs (those
    /// enqueued without one). Without it, every tenant's.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only jobs tagged KEY=VALUE; repeat to require several.
    #[arg(long, value_name = "KEY=VALUE", value_parser = tag_filter)]
    pub tag: Vec<(String, String)>,
    /// The most jobs on the page (1..=1000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,
    /// Continue after this job: the cursor the previous page printed.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<JobId>,
}

/// A `--tag KEY=VALUE` filter: the key a valid tag key, the value any text.
fn tag_filter(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    let tags = durq::Tags::from([(key.to_owned(), value.to_owned())]);
    durq_core::meta::validate_tags("tag", &tags).map_err(|err| err.to_string())?;
    Ok((key.to_owned(), value.to_owned()))
}

/// The arguments of `durq enqueue`.
#[derive(Debug, Clone, Args)]
pub struct EnqueueArgs {
    /// The queue to add the job to.
    #[arg(value_parser = queue_name)]
    pub queue: String,
    /// The payload, JSON unless --raw. `-`, or nothing when stdin is not a terminal,
    /// reads it from stdin; nothing on a terminal is an empty payload.
    pub payload: Option<String>,
    /// Take the payload's bytes as they are, without checking that they are JSON.
    #[arg(long)]
    pub raw: bool,
    /// The earliest time the job may run, RFC 3339 (2026-05-01T09:30:00Z).
    #[arg(long, value_name = "TIME", value_parser = rfc3339, conflicts_with = "delay")]
    pub run_at: Option<Timestamp>,
    /// Run the job this long after now (30s, 5m, 1h 30m).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub delay: Option<Duration>,
    /// Higher runs first (-32768..=32767).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i16,
    /// An idempotency key: an enqueue with the key of a job still remembered returns
    /// that job instead of making a new one.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Deduplicate on --key only while its job is queued or running, however old.
    #[arg(long, requires = "key")]
    pub unique_while_active: bool,
    /// The tenant that scopes the idempotency key.
    #[arg(long, default_value = "")]
    pub tenant: String,
    /// The concurrency key its queue's per-key limit counts it by (`durq limits`).
    #[arg(long, value_name = "KEY")]
    pub concurrency_key: Option<String>,
    /// A job this one waits for (CONTRACT G1): it runs once every job named with
    /// `--after` has succeeded. Repeat it for each.
    #[arg(long, value_name = "ID")]
    pub after: Vec<durq::JobId>,
    /// Runs the job even when a job it waits for ends dead or cancelled, instead of
    /// cancelling it (CONTRACT G3).
    #[arg(long, requires = "after")]
    pub run_after_failures: bool,
    /// Claims the job gets before it is dead.
    #[arg(long, value_name = "N", default_value_t = durq_core::DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
}

/// The jobs `retry` and `cancel` act on: ids, or a filter.
#[derive(Debug, Clone, Args)]
pub struct Selection {
    /// The jobs, by id. Or select them with --queue and --state.
    #[arg(
        value_name = "ID",
        required_unless_present = "queue",
        conflicts_with = "queue"
    )]
    pub ids: Vec<JobId>,
    /// Every job of this queue in --state.
    #[arg(long, value_parser = queue_name, requires = "state")]
    pub queue: Option<String>,
    /// The state of the jobs to select: dead or cancelled to retry, queued or running to cancel.
    #[arg(long, requires = "queue")]
    pub state: Option<StateArg>,
    /// Print how many jobs and which ones the command would act on, and act on none.
    #[arg(long)]
    pub dry_run: bool,
    /// Act on the jobs a filter selects without asking first. Without it, a filter asks
    /// on a terminal and is refused elsewhere.
    #[arg(short = 'y', long)]
    pub yes: bool,
}

impl Selection {
    fn check(&self, action: Action) -> Result<(), clap::Error> {
        match self.state {
            Some(state) if !action.applies_to(state.into()) => Err(subcommand_usage(
                action.verb(),
                ErrorKind::InvalidValue,
                format!(
                    "`durq {}` acts on {} jobs, not {} ones",
                    action.verb(),
                    action.states_text(),
                    JobState::from(state)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// What `retry` and `cancel` do, for the messages and the states each applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `durq retry`.
    Retry,
    /// `durq cancel`.
    Cancel,
}

impl Action {
    /// Whether a job in `state` can be acted on.
    pub fn applies_to(self, state: JobState) -> bool {
        match self {
            Action::Retry => matches!(state, JobState::Dead | JobState::Cancelled),
            Action::Cancel => matches!(state, JobState::Queued | JobState::Running),
        }
    }

    /// The command's name.
    pub fn verb(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
        }
    }

    /// The states it applies to, in words.
    pub fn states_text(self) -> &'static str {
        match self {
            Action::Retry => "dead or cancelled",
            Action::Cancel => "queued or running",
        }
    }
}

/// The arguments of `durq purge`.
#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    /// How long a finished job is kept: older ones are deleted (7d, 12h, 0s for all).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = duration)]
    pub retention: Duration,
}

/// A job state as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Waiting to be claimed, ready or scheduled for later.
    Queued,
    /// Claimed by a worker.
    Running,
    /// Completed.
    Succeeded,
    /// Failed for good.
    Dead,
    /// Cancelled by an operator.
    Cancelled,
}

impl From<StateArg> for JobState {
    fn from(state: StateArg) -> Self {
        match state {
            StateArg::Queued => JobState::Queued,
            StateArg::Running => JobState::Running,
            StateArg::Succeeded => JobState::Succeeded,
            StateArg::Dead => JobState::Dead,
            StateArg::Cancelled => JobState::Cancelled,
        }
    }
}

/// A rate as `STARTS/PERIOD` (`10/1s`), refused with the reason when out of range.
fn rate(text: &str) -> std::result::Result<durq_core::Rate, String> {
    text.parse()
        .map_err(|err: durq_core::Error| err.to_string())
}

fn queue_name(text: &str) -> Result<String, String> {
    durq_core::validate::validate_queue(text)
        .map(|()| text.to_owned())
        .map_err(|err| err.to_string())
}

fn event_cursor(text: &str) -> Result<durq_core::EventCursor, String> {
    text.parse()
        .map_err(|err: durq_core::Error| err.to_string())
}

fn step_name(text: &str) -> Result<String, String> {
    durq_core::validate::validate_step(text)
        .map(|()| text.to_owned())
        .map_err(|err| err.to_string())
}

fn namespace_name(text: &str) -> Result<String, String> {
    durq_core::validate::validate_namespace(text)
        .map(|()| text.to_owned())
        .map_err(|err| err.to_string())
}

/// An RFC 3339 time (`2026-05-01T09:30:00Z`, `2026-05-01T11:30:00+02:00`), to the
/// millisecond.
pub fn rfc3339(text: &str) -> Result<Timestamp, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|time| Timestamp::from_millis(time.timestamp_millis()))
        .map_err(|err| format!("not an RFC 3339 time such as 2026-05-01T09:30:00Z ({err})"))
}

/// A duration such as `30s`, `5m`, `1h 30m`, `7d`.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|err| format!("not a duration such as 30s, 5m or 1h 30m ({err})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("durq").chain(args.iter().copied()))?;
        cli.check()?;
        Ok(cli)
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn filters_must_name_states_the_action_applies_to() {
        let url = "--url=memory://";
        assert!(parse(&[url, "retry", "--queue", "q", "--state", "dead"]).is_ok());
        assert!(parse(&[url, "cancel", "--queue", "q", "--state", "running"]).is_ok());
        let err = parse(&[url, "retry", "--queue", "q", "--state", "queued"]).expect_err("bad");
        assert!(err.to_string().contains("dead or cancelled"), "{err}");
        assert!(parse(&[url, "cancel", "--queue", "q", "--state", "dead"]).is_err());
        // A filter is a queue and a state; ids and a filter do not mix.
        assert!(parse(&[url, "retry", "--queue", "q"]).is_err());
        assert!(parse(&[url, "retry"]).is_err());
        let id = "0190b6a2-3c4d-7e5f-8a6b-7c8d9e0f1a2b";
        assert!(parse(&[url, "retry", id, "--queue", "q", "--state", "dead"]).is_err());
        assert!(parse(&[url, "retry", id]).is_ok());
    }

    #[test]
    fn the_url_is_required_and_values_are_checked() {
        assert!(parse(&["queues"]).is_err());
        assert!(parse(&["--url", "", "queues"]).is_err());
        assert!(
            parse(&["queues", "--url", "memory://"]).is_ok(),
            "global flag"
        );
        assert!(parse(&["--url=memory://", "stats", "no spaces"]).is_err());
        assert!(parse(&["--url=memory://", "-n", "bad namespace", "queues"]).is_err());
        assert!(parse(&["--url=memory://", "inspect", "not-an-id"]).is_err());
        assert!(parse(&["--url=memory://", "list", "--queue", "q", "--limit", "0"]).is_err());
        assert!(parse(&["--url=memory://", "list", "--queue", "q", "--limit", "1001"]).is_err());
        let enqueue = ["--url=memory://", "enqueue", "q", "{}"];
        assert!(parse(&[&enqueue[..], &["--run-at", "tomorrow"]].concat()).is_err());
        assert!(parse(&[&enqueue[..], &["--delay", "soon"]].concat()).is_err());
        assert!(parse(&[&enqueue[..], &["--max-attempts", "0"]].concat()).is_err());
        assert!(parse(&[&enqueue[..], &["--unique-while-active"]].concat()).is_err());
        assert!(parse(&[&enqueue[..], &["--priority", "-5"]].concat()).is_ok());
        let both = ["--delay", "5s", "--run-at", "2026-05-01T09:30:00Z"];
        assert!(parse(&[&enqueue[..], &both[..]].concat()).is_err());
    }

    #[test]
    fn times_and_durations() {
        assert_eq!(
            rfc3339("2023-11-14T22:13:20.5Z"),
            Ok(Timestamp::from_millis(1_700_000_000_500))
        );
        assert_eq!(
            rfc3339("2023-11-15T00:13:20+02:00"),
            Ok(Timestamp::from_millis(1_700_000_000_000))
        );
        assert!(rfc3339("2023-11-14").is_err());
        assert_eq!(duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(duration("-5s").is_err());
    }
}
