//! `durq wait ID`: waits for a job's outcome (CONTRACT O1), woken by its ending, and
//! says it through the exit status too, so a script can wait for a job it enqueued.

use std::time::Duration;

use durq::{JobId, JobState};
use serde::Serialize;

use crate::commands::inspect::bytes_section;
use crate::format::{Payload, PayloadJson};
use crate::view::JobJson;
use crate::{CliError, Context, Result};

/// `durq wait ID --timeout T`: prints a succeeded job's state and result. A job that
/// ended dead or cancelled fails the command with its last error, and so does one that
/// has not ended when the timeout passes (exit status 1, one line on stderr).
pub async fn wait(cx: &mut Context<'_>, id: JobId, timeout: Duration) -> Result<()> {
    let Some(job) = cx.store.wait(id, timeout).await? else {
        let state = cx.store.get(id).await?.state;
        return Err(CliError::new(format!(
            "job {id} has not ended after {} (it is {state})",
            humantime::format_duration(timeout)
        )));
    };
    if job.state != JobState::Succeeded {
        let why = job
            .last_error
            .as_deref()
            .map(|error| format!(": {error}"))
            .unwrap_or_default();
        return Err(CliError::new(format!("job {id} ended {}{why}", job.state)));
    }
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            job: JobJson<'a>,
            result: Option<Shown<'a>>,
        }
        #[derive(Serialize)]
        struct Shown<'a> {
            bytes: usize,
            #[serde(flatten)]
            content: PayloadJson<'a>,
        }
        let now = cx.store.now();
        cx.print_json(&Doc {
            job: JobJson::new(&job, now),
            result: job.result.as_deref().map(|bytes| Shown {
                bytes: bytes.len(),
                content: Payload::of(bytes).json(),
            }),
        })?;
    } else {
        let mut text = format!("{id}: {}\n", job.state);
        if let Some(result) = job.result.as_deref() {
            text.push_str(&bytes_section("result", result));
        }
        cx.print(&text)?;
    }
    Ok(())
}
