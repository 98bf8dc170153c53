//! `purge`, `pause` and `resume`.

use serde::Serialize;

use crate::{Context, Result};

/// Jobs one purge call deletes at most.
const PURGE_BATCH: usize = 1_000;

/// `jobs purge`: deletes the finished jobs whose retention (the store's settings, from
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

/// `jobs pause QUEUE` and `jobs resume QUEUE`.
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
