//! `durq enqueue QUEUE [PAYLOAD|-]`: adds a job.

use durq::{NewJob, StoreSettings};
use serde::Serialize;

use crate::cli::EnqueueArgs;
use crate::error::CliError;
use crate::terminal::Terminal;
use crate::{Context, Result};

/// The job `args` describe, its payload read (from the argument, or from stdin when the
/// argument is `-`, or absent while stdin is not a terminal) and checked, and the job
/// checked as the store will check it: nothing is opened or written for a bad one.
pub fn prepare(args: &EnqueueArgs, terminal: &mut dyn Terminal) -> Result<NewJob> {
    let payload = match args.payload.as_deref() {
        Some("-") => terminal.read_stdin()?,
        Some(text) => text.as_bytes().to_vec(),
        None if !terminal.stdin_is_terminal() => terminal.read_stdin()?,
        None => Vec::new(),
    };
    if !args.raw && !payload.is_empty() {
        if let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(&payload) {
            return Err(CliError::new(format!(
                "the payload is not JSON ({err}); pass --raw to enqueue other bytes"
            )));
        }
    }
    let mut job = NewJob::new(args.queue.as_str())
        .payload(payload)
        .priority(args.priority)
        .tenant(args.tenant.as_str())
        .max_attempts(args.max_attempts);
    if let Some(key) = &args.key {
        job = if args.unique_while_active {
            job.unique_while_active(key.as_str())
        } else {
            job.idempotency_key(key.as_str())
        };
    }
    if let Some(key) = &args.concurrency_key {
        job = job.concurrency_key(key.as_str());
    }
    for dependency in &args.after {
        job = job.after(*dependency);
    }
    if args.run_after_failures {
        job = job.on_dependency_failure(durq::DependencyFailure::Run);
    }
    if let Some(at) = args.run_at {
        job = job.run_at(at);
    }
    if let Some(delay) = args.delay {
        job = job.delay(delay);
    }
    durq_core::validate::validate_new_job(&job, &StoreSettings::default())?;
    Ok(job)
}

/// Enqueues `job`; prints its id and `created`, or `deduplicated` when its idempotency
/// key named a job already there (whose id it is).
pub async fn run(cx: &mut Context<'_>, job: NewJob) -> Result<()> {
    let enqueued = cx.store.enqueue(job).await?;
    if cx.json {
        #[derive(Serialize)]
        struct Doc {
            id: durq::JobId,
            created: bool,
        }
        return cx.print_json(&Doc {
            id: enqueued.id,
            created: enqueued.created,
        });
    }
    let outcome = if enqueued.created {
        "created"
    } else {
        "deduplicated"
    };
    cx.print(&format!("{} {outcome}\n", enqueued.id))
}
