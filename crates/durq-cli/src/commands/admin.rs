//! `purge`, `retry-from`, `pause`, `resume`, `limits set`, `limits clear` and
//! `schedules delete`.

use serde::Serialize;

use crate::{CliError, Context, Result};

/// Jobs one purge call deletes at most.
const PURGE_BATCH: usize = 1_000;

/// `durq purge`: deletes the finished jobs whose retention (the store's settings, from
/// `--retention`) has passed, a batch at a time until none is left; prints how many.
pub async fn purge(cx: &mut Context<'_>) -> Result<()> {
    let mut purged = 0u64;
    loop {
        let deleted = cx.store.purge(PURGE_BATCH).await?;
        purged += deleted;
        if deleted < PURGE_BATCH as u64 {
            break;
        }
    }
    if cx.json {
        #[derive(Serialize)]
        struct Doc {
            purged: u64,
        }
        return cx.print_json(&Doc { purged });
    }
    let jobs = if purged == 1 { "job" } else { "jobs" };
    cx.print(&format!("purged {purged} finished {jobs}\n"))
}

/// `durq retry-from ID STEP [--generation N]`: reopens an ended job from a durable
/// step (CONTRACT D3). Without `--generation` the job's generation is read first, so
/// the reopen is still refused if another reopens the job in between (D4).
pub async fn retry_from(
    cx: &mut Context<'_>,
    id: durq::JobId,
    step: &str,
    generation: Option<u64>,
) -> Result<()> {
    let generation = match generation {
        Some(generation) => generation,
        None => cx.store.steps(id).await?.generation,
    };
    cx.store.retry_from(id, step, generation).await?;
    let next = generation + 1;
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            id: durq::JobId,
            step: &'a str,
            generation: u64,
        }
        return cx.print_json(&Doc {
            id,
            step,
            generation: next,
        });
    }
    cx.print(&format!(
        "reopened job {id} from step {step} (generation {next}): queued\n"
    ))
}

/// `durq pause QUEUE`: refused for a queue the namespace does not know (most often a
/// typo, which would otherwise pause nothing and show up in `queues`), unless
/// `allow_empty`.
pub async fn pause(cx: &mut Context<'_>, queue: &str, allow_empty: bool) -> Result<()> {
    if !allow_empty && !cx.store.queues().await?.iter().any(|q| q.queue == queue) {
        let namespace = &cx.store.settings().namespace;
        return Err(CliError::new(format!(
            "namespace {namespace:?} has no queue {queue:?}; pass --allow-empty to pause it before it holds a job"
        )));
    }
    set_paused(cx, queue, true).await
}

/// `durq limits set QUEUE …` and, with unlimited limits, `durq limits clear QUEUE`.
pub async fn set_limits(
    cx: &mut Context<'_>,
    queue: &str,
    limits: durq_core::QueueLimits,
) -> Result<()> {
    cx.store.set_limits(queue, limits).await?;
    if cx.json {
        return cx.print_json(&super::read::LimitsJson::new(queue, &limits));
    }
    if limits.is_unlimited() {
        return cx.print(&format!(
            "cleared the limits of queue {queue}
"
        ));
    }
    cx.print(&format!("queue {queue}: {limits}\n"))
}

/// `durq schedules delete NAME`.
pub async fn delete_schedule(cx: &mut Context<'_>, name: &str) -> Result<()> {
    if !cx.store.delete_schedule(name).await? {
        let namespace = &cx.store.settings().namespace;
        return Err(CliError::new(format!(
            "namespace {namespace:?} has no schedule {name:?}"
        )));
    }
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            schedule: &'a str,
            deleted: bool,
        }
        return cx.print_json(&Doc {
            schedule: name,
            deleted: true,
        });
    }
    cx.print(&format!("deleted schedule {name}\n"))
}

/// `durq pause QUEUE` and `durq resume QUEUE`.
pub async fn set_paused(cx: &mut Context<'_>, queue: &str, paused: bool) -> Result<()> {
    if paused {
        cx.store.pause(queue).await?;
    } else {
        cx.store.resume(queue).await?;
    }
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            queue: &'a str,
            paused: bool,
        }
        return cx.print_json(&Doc { queue, paused });
    }
    let done = if paused { "paused" } else { "resumed" };
    cx.print(&format!("{done} queue {queue}\n"))
}
