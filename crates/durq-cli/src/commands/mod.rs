//! The commands, one function each over a [`Context`].

pub mod admin;
pub mod bulk;
pub mod dashboard;
pub mod enqueue;
pub mod events;
pub mod inspect;
pub mod list;
pub mod read;
pub mod wait;

use crate::cli::{Action, Command, LimitsAction, ScheduleAction};
use crate::{Context, Result};

/// Runs `command` against the context's store.
pub async fn run(cx: &mut Context<'_>, command: &Command) -> Result<()> {
    match command {
        Command::Queues => read::queues(cx).await,
        Command::Workers => read::workers(cx).await,
        Command::Stats { queue } => read::stats(cx, queue).await,
        Command::List(args) => list::list(cx, args).await,
        Command::Inspect { id } => inspect::inspect(cx, *id).await,
        Command::Wait { id, timeout } => wait::wait(cx, *id, *timeout).await,
        Command::Events { after, limit } => {
            events::events(cx, after.unwrap_or_default(), usize::from(*limit)).await
        }
        Command::Enqueue(args) => {
            let job = enqueue::prepare(args, cx.terminal)?;
            enqueue::run(cx, job).await
        }
        Command::Retry(selection) => bulk::act(cx, Action::Retry, selection).await,
        Command::Cancel(selection) => bulk::act(cx, Action::Cancel, selection).await,
        Command::RetryFrom {
            id,
            step,
            generation,
        } => admin::retry_from(cx, *id, step, *generation).await,
        Command::Purge(_) => admin::purge(cx).await,
        Command::Pause { queue, allow_empty } => admin::pause(cx, queue, *allow_empty).await,
        Command::Resume { queue } => admin::set_paused(cx, queue, false).await,
        Command::Limits { action: None } => read::limits(cx).await,
        Command::Limits {
            action:
                Some(LimitsAction::Set {
                    queue,
                    max_running,
                    max_running_per_key,
                    max_starts,
                    max_starts_per_key,
                    fair_shares,
                }),
        } => {
            let mut limits = durq_core::QueueLimits::new();
            limits.max_running = *max_running;
            limits.max_running_per_key = *max_running_per_key;
            limits.max_starts = *max_starts;
            limits.max_starts_per_key = *max_starts_per_key;
            limits.fair_shares = *fair_shares;
            if limits.is_unlimited() {
                return Err(crate::CliError::new(format!(
                    "limits set {queue}: name --max-running, --max-running-per-key, \
                     --max-starts, --max-starts-per-key or --fair-shares (`limits clear \
                     {queue}` removes its limits)"
                )));
            }
            admin::set_limits(cx, queue, limits).await
        }
        Command::Limits {
            action: Some(LimitsAction::Status { queue }),
        } => read::flow_status(cx, queue).await,
        Command::Limits {
            action: Some(LimitsAction::Clear { queue }),
        } => admin::set_limits(cx, queue, durq_core::QueueLimits::new()).await,
        Command::Schedules { action: None } => read::schedules(cx).await,
        Command::Schedules {
            action: Some(ScheduleAction::Delete { name }),
        } => admin::delete_schedule(cx, name).await,
        Command::Dashboard(args) => dashboard::serve(cx, args).await,
    }
}
