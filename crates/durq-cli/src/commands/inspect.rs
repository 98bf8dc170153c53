//! `durq inspect ID`: one job, in sections (its fields, payload, lease, attempts, last
//! error, result, durable steps, the jobs it waits for, children), each written by a
//! function of its own.

use std::time::Duration;

use durq::{Attempt, Capability, Job, JobId, JobState, StepLog, Timestamp};
use serde::Serialize;

use crate::commands::list::{jobs_table, state_text};
use crate::format::{self, ago, fields, Payload, PayloadJson};
use crate::view::{JobJson, LeaseJson};
use crate::{Context, Result};

/// `durq inspect ID`.
pub async fn inspect(cx: &mut Context<'_>, id: JobId) -> Result<()> {
    let job = cx.store.get(id).await?;
    let payload = cx.store.payload(id).await?;
    let children = cx.store.children(id).await?;
    let attempts = cx.store.attempts(id).await?;
    // Its durable steps (CONTRACT D2), on a store that keeps them.
    let steps = if cx.store.supports(Capability::Steps) {
        Some(cx.store.steps(id).await?)
    } else {
        None
    };
    // The jobs it waits for, as they stand now: what an operator reads to see why a
    // job waits (CONTRACT G4). One purged since is shown gone.
    let dependencies = cx.store.dependencies(&job).await?;
    let now = cx.store.now();
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            job: JobJson<'a>,
            payload: Shown<'a>,
            result: Option<Shown<'a>>,
            attempts: Vec<AttemptJson<'a>>,
            steps: Option<StepsJson<'a>>,
            depends_on: Vec<DependencyJson>,
            children: Vec<JobJson<'a>>,
        }
        #[derive(Serialize)]
        struct StepsJson<'a> {
            generation: u64,
            steps: Vec<StepJson<'a>>,
        }
        #[derive(Serialize)]
        struct StepJson<'a> {
            name: &'a str,
            saved_at: String,
            output: Shown<'a>,
        }
        #[derive(Serialize)]
        struct DependencyJson {
            id: JobId,
            /// Its state now, or `gone` once purged.
            state: &'static str,
        }
        #[derive(Serialize)]
        struct AttemptJson<'a> {
            token: u64,
            worker: &'a str,
            started_at: String,
            ended_at: Option<String>,
            outcome: &'static str,
            error: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Shown<'a> {
            bytes: usize,
            #[serde(flatten)]
            content: PayloadJson<'a>,
        }
        fn shown(bytes: &[u8]) -> Shown<'_> {
            Shown {
                bytes: bytes.len(),
                content: Payload::of(bytes).json(),
            }
        }
        return cx.print_json(&Doc {
            job: JobJson::new(&job, now),
            payload: shown(&payload),
            result: job.result.as_deref().map(shown),
            attempts: attempts
                .iter()
                .map(|a| AttemptJson {
                    token: a.token.get(),
                    worker: &a.worker,
                    started_at: format::time(a.started_at),
                    ended_at: a.ended_at.map(format::time),
                    outcome: a.outcome.as_str(),
                    error: a.error.as_deref(),
                })
                .collect(),
            steps: steps.as_ref().map(|log| StepsJson {
                generation: log.generation,
                steps: log
                    .steps
                    .iter()
                    .map(|step| StepJson {
                        name: &step.name,
                        saved_at: format::time(step.saved_at),
                        output: shown(&step.output),
                    })
                    .collect(),
            }),
            depends_on: dependencies
                .iter()
                .map(|(id, found)| DependencyJson {
                    id: *id,
                    state: found.as_ref().map_or("gone", |job| job.state.as_str()),
                })
                .collect(),
            children: children.iter().map(|c| JobJson::new(c, now)).collect(),
        });
    }
    let sections = [
        job_section(&job, now),
        bytes_section("payload", &payload),
        lease_section(&job, now),
        attempts_section(&attempts, now),
        error_section(&job),
        job.result
            .as_deref()
            .map(|result| bytes_section("result", result))
            .unwrap_or_default(),
        steps
            .as_ref()
            .map(|log| steps_section(log, now))
            .unwrap_or_default(),
        dependencies_section(&job, &dependencies, now),
        children_section(&children, now),
    ];
    let text: Vec<String> = sections.into_iter().filter(|s| !s.is_empty()).collect();
    cx.print(&text.join("\n"))
}

fn job_section(job: &Job, now: Timestamp) -> String {
    let mut pairs = vec![
        ("id", job.id.to_string()),
        ("queue", job.queue.clone()),
        ("state", state_text(job, now)),
        (
            "attempts",
            format!("{} of {}", job.attempts, job.max_attempts),
        ),
        ("priority", job.priority.to_string()),
        ("run at", when(job.run_at, now)),
        ("created at", when(job.created_at, now)),
    ];
    let optional = [
        ("started at", job.started_at),
        ("heartbeat at", job.heartbeat_at),
        ("finished at", job.finished_at),
    ];
    for (key, at) in optional {
        if let Some(at) = at {
            pairs.push((key, when(at, now)));
        }
    }
    if !job.tenant.is_empty() {
        pairs.push(("tenant", job.tenant.clone()));
    }
    if let Some(key) = &job.idempotency_key {
        pairs.push(("key", key.clone()));
    }
    if !job.tags.is_empty() {
        let tags: Vec<String> = job.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.push(("tags", tags.join(" ")));
    }
    if let Some(traceparent) = &job.trace_context {
        pairs.push(("trace", traceparent.clone()));
    }
    if let Some(parent) = job.parent {
        pairs.push(("parent", parent.to_string()));
    }
    if let Some(timeout) = job.timeout {
        pairs.push(("timeout", duration_text(timeout)));
    }
    if !job.needs.is_empty() {
        let amounts = job.needs.amounts().iter().map(|(k, v)| format!("{k}={v}"));
        let capabilities = job.needs.capabilities().iter().cloned();
        let needs: Vec<String> = amounts.chain(capabilities).collect();
        pairs.push(("needs", needs.join(", ")));
    }
    if let Some(locality) = &job.locality {
        pairs.push(("locality", locality.clone()));
    }
    if job.cancel_requested {
        pairs.push((
            "cancel asked",
            "yes: the worker was asked to stop".to_owned(),
        ));
    }
    fields(&pairs)
}

pub(crate) fn bytes_section(title: &str, bytes: &[u8]) -> String {
    let shown = Payload::of(bytes);
    let kind = match shown {
        Payload::Empty => return format!("{title}: (empty)\n"),
        Payload::Json(_) => "JSON",
        Payload::Text(_) => "text",
        Payload::Binary(_) => "binary",
    };
    let size = match bytes.len() {
        1 => "1 byte".to_owned(),
        n => format!("{n} bytes"),
    };
    format!("{title} ({size}, {kind}):\n{}", shown.human())
}

fn lease_section(job: &Job, now: Timestamp) -> String {
    let Some(lease) = &job.lease else {
        return match job.state {
            JobState::Running => "lease: (none recorded)\n".to_owned(),
            _ => String::new(),
        };
    };
    let view = LeaseJson::new(lease);
    format!(
        "lease:\n{}",
        indent(&fields(&[
            ("worker", view.worker.to_owned()),
            ("token", view.token.to_string()),
            ("expires at", when(lease.expires_at, now)),
        ]))
    )
}

/// Every attempt kept, oldest first: its number, worker, start, run time, outcome and
/// the first line of its error.
fn attempts_section(attempts: &[Attempt], now: Timestamp) -> String {
    if attempts.is_empty() {
        return String::new();
    }
    let rows = attempts
        .iter()
        .map(|a| {
            vec![
                a.token.to_string(),
                a.worker.clone(),
                format::time(a.started_at),
                duration_text(Duration::from_millis(
                    u64::try_from(a.run_time(now).as_millis()).unwrap_or(u64::MAX),
                )),
                a.outcome.to_string(),
                a.error
                    .as_deref()
                    .and_then(|e| e.lines().next())
                    .map(|e| format::clip(e, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    format!(
        "attempts ({}):\n{}",
        attempts.len(),
        format::table(
            &["#", "WORKER", "STARTED", "RAN", "OUTCOME", "ERROR"],
            &[0],
            rows
        )
    )
}

fn error_section(job: &Job) -> String {
    match &job.last_error {
        Some(error) => format!("last error:\n{}\n", indent(error).trim_end()),
        None => String::new(),
    }
}

/// The durable steps the job saved in its generation, in save order, each with when
/// and the start of its output (CONTRACT D2): what `retry-from` can reopen it from.
fn steps_section(log: &StepLog, now: Timestamp) -> String {
    if log.steps.is_empty() && log.generation == 0 {
        return String::new();
    }
    let rows = log
        .steps
        .iter()
        .map(|step| {
            vec![
                step.name.clone(),
                when(step.saved_at, now),
                step.output.len().to_string(),
                format::clip(
                    Payload::of(&step.output)
                        .human()
                        .lines()
                        .next()
                        .unwrap_or(""),
                    40,
                ),
            ]
        })
        .collect();
    format!(
        "steps (generation {}, {} saved):\n{}",
        log.generation,
        log.steps.len(),
        format::table(&["STEP", "SAVED", "BYTES", "OUTPUT"], &[2], rows)
    )
}

/// The jobs `job` waits (or waited) for, each with its state now, and what `job`
/// does when one fails (CONTRACT G1, G3).
fn dependencies_section(
    job: &Job,
    dependencies: &[(JobId, Option<Job>)],
    now: Timestamp,
) -> String {
    if dependencies.is_empty() {
        return String::new();
    }
    let rows = dependencies
        .iter()
        .map(|(id, found)| match found {
            Some(found) => vec![id.to_string(), found.queue.clone(), state_text(found, now)],
            None => vec![id.to_string(), "-".to_owned(), "gone (purged)".to_owned()],
        })
        .collect();
    let met = dependencies
        .iter()
        .filter(|(_, found)| {
            found
                .as_ref()
                .is_some_and(|j| j.state == JobState::Succeeded)
        })
        .count();
    format!(
        "waits for ({met} of {} succeeded; if one fails: {}):\n{}",
        dependencies.len(),
        job.on_dependency_failure,
        format::table(&["ID", "QUEUE", "STATE"], &[], rows)
    )
}

fn children_section(children: &[Job], now: Timestamp) -> String {
    if children.is_empty() {
        return String::new();
    }
    format!(
        "children ({}):\n{}",
        children.len(),
        jobs_table(children, now)
    )
}

/// A time and how far it is from now: `2026-05-01T09:30:00Z (3m 12s ago)`.
fn when(at: Timestamp, now: Timestamp) -> String {
    format!("{} ({})", format::time(at), ago(at, now))
}

fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}
