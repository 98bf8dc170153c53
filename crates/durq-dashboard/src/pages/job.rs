//! `GET /jobs/{id}`: one job. The page is a list of sections, each a function of what
//! the store answered: the summary (tags and trace context included), its actions,
//! the last error, its attempts (CONTRACT H1–H4), the jobs it waits for (G1, G4: why a
//! waiting job waits), its durable steps (D2), the payload, the result, and its family
//! (parent and children).

use axum::extract::Path;
use axum::http::Uri;
use axum::response::Response;
use durq::{
    Attempt, AttemptOutcome, Bytes, Capability, Job, JobId, JobState, StepLog, Timestamp,
    ATTEMPTS_KEPT,
};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::{self, Params};
use crate::layout::{self, action_button, View};
use crate::pages::list::first_line;
use crate::pages::{
    job_href, list_href, notice, queue_href, state_badge, tag_chips, Notice, NOTICE_FIELDS,
};
use crate::problem::Problem;

/// The most payload or result bytes a page shows.
const SHOWN_BYTES: usize = 64 * 1024;

/// The most children a page lists.
const SHOWN_CHILDREN: usize = 100;

/// `GET /jobs/{id}`.
pub(crate) async fn page(ctx: Ctx, Path(id): Path<String>, uri: Uri) -> Response {
    let view = view(&ctx, &id, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, id: &str, query: Option<&str>) -> Result<View, Problem> {
    let id = input::job_id(id)?;
    let params = Params::query(query, &NOTICE_FIELDS)?;
    let done = Notice::from_params(&params)?;
    let store = &ctx.app.store;
    let (job, payload, children, attempts) = tokio::join!(
        store.get(id),
        store.payload(id),
        store.children(id),
        store.attempts(id)
    );
    let job = job?;
    // What it waits for, as each stands now, and its steps where the store keeps them.
    let dependencies = store.dependencies(&job).await.map_err(|e| e.to_string());
    let steps = if store.supports(Capability::Steps) {
        Some(store.steps(id).await.map_err(|e| e.to_string()))
    } else {
        None
    };
    let now = store.now();
    let body = html! {
        h1 { "Job " span class="mono" { (job.id) } " " (state_badge(&job, now)) }
        (notice(done))
        (actions(ctx, &job))
        (summary(ctx, &job, now))
        (last_error(&job))
        (attempts_section(attempts.map_err(|e| e.to_string()), now))
        (waits_for(ctx, &job, dependencies, now))
        @if let Some(steps) = steps { (steps_section(ctx, &job, steps, now)) }
        (section("Payload", "payload", bytes_view(payload.as_ref().map_err(|e| e.to_string()))))
        (result(&job))
        (family(ctx, &job, children.map_err(|e| e.to_string())))
    };
    let view = View::live(format!("Job {id}"), body);
    Ok(match done {
        Some(_) => view.refresh_to(job_href(ctx, id)),
        None => view,
    })
}

fn section(title: &str, id: &str, body: Markup) -> Markup {
    html! { section id=(id) { h2 { (title) } (body) } }
}

/// What an operator can do to the job in its state: retry a dead or cancelled one,
/// cancel a queued or running one.
fn actions(ctx: &Ctx, job: &Job) -> Markup {
    let id = job.id.to_string();
    let path = |action: &str| format!("/jobs/{id}/{action}");
    html! {
        div class="actions" {
            @match job.state {
                JobState::Dead | JobState::Cancelled => {
                    (action_button(ctx, &path("retry"), &[], "Retry", "primary"))
                }
                JobState::Queued => {
                    (action_button(ctx, &path("cancel"), &[], "Cancel", "danger"))
                }
                JobState::Running if !job.cancel_requested => {
                    (action_button(ctx, &path("cancel"), &[], "Ask to cancel", "danger"))
                }
                _ => {}
            }
            a href=(list_href(ctx, &job.queue, Some(job.state))) { "Other " (job.state.as_str()) " jobs of " (job.queue) }
        }
    }
}

fn summary(ctx: &Ctx, job: &Job, now: Timestamp) -> Markup {
    let at = |ts: Timestamp| {
        html! { (format::timestamp(ts)) " " span class="muted" { "(" (format::relative(now, ts)) ")" } }
    };
    html! {
        section id="summary" {
            dl class="fields" {
                dt { "Queue" } dd { a class="mono" href=(queue_href(ctx, &job.queue)) { (job.queue) } }
                dt { "State" } dd id="job-state" data-state=(job.state.as_str()) { (job.state.as_str()) }
                dt { "Attempts" } dd { (job.attempts) " of " (job.max_attempts) }
                dt { "Priority" } dd { (job.priority) }
                dt { "Created" } dd { (at(job.created_at)) }
                dt { @if job.state == JobState::Queued { "Runs at" } @else { "Ready since" } } dd { (at(job.run_at)) }
                @if let Some(started) = job.started_at { dt { "Last claimed" } dd { (at(started)) } }
                @if let Some(beat) = job.heartbeat_at { dt { "Last heartbeat" } dd { (at(beat)) } }
                @if let Some(finished) = job.finished_at { dt { "Finished" } dd { (at(finished)) } }
                @if let Some(lease) = &job.lease {
                    dt { "Lease" } dd {
                        "held by " span class="mono" { (lease.worker) } ", expires " (format::relative(now, lease.expires_at))
                    }
                }
                @if job.cancel_requested { dt { "Cancel" } dd { "requested" } }
                @if let Some(timeout) = job.timeout { dt { "Timeout" } dd { (format::duration(timeout)) } }
                @if !job.tenant.is_empty() { dt { "Tenant" } dd class="mono" { (job.tenant) } }
                @if let Some(key) = &job.idempotency_key { dt { "Idempotency key" } dd class="mono" { (key) } }
                @if !job.needs.is_empty() {
                    dt { "Needs" } dd class="mono" {
                        @for (name, amount) in job.needs.amounts() { (name) "=" (amount) " " }
                        @for capability in job.needs.capabilities() { (capability) " " }
                    }
                }
                @if let Some(locality) = &job.locality { dt { "Locality" } dd class="mono" { (locality) } }
                @if !job.tags.is_empty() { dt { "Tags" } dd id="job-tags" { (tag_chips(Some(ctx), &job.tags)) } }
                @if let Some(trace) = &job.trace_context {
                    dt { "Trace context" } dd class="mono" id="trace-context" title="W3C traceparent" { (trace) }
                }
            }
        }
    }
}

fn last_error(job: &Job) -> Markup {
    match &job.last_error {
        Some(error) => section("Last error", "last-error", html! { pre { (error) } }),
        None => html! {},
    }
}

/// Every attempt the store keeps, oldest first: its number (the claim's token), worker,
/// start, end (or "running"), run time, outcome, and its error's first line with the
/// whole error folded under it.
fn attempts_section(attempts: Result<Vec<Attempt>, String>, now: Timestamp) -> Markup {
    let body = match attempts {
        Err(err) => html! { p class="problem" { "Could not read its attempts: " (err) } },
        Ok(attempts) if attempts.is_empty() => {
            html! { p class="muted" id="no-attempts" { "Not claimed yet." } }
        }
        Ok(attempts) => html! {
            @if attempts.len() as u64 >= ATTEMPTS_KEPT {
                p class="muted" { "The newest " (ATTEMPTS_KEPT) " attempts; older ones are not kept." }
            }
            table id="attempts" {
                thead { tr {
                    th class="num" { "#" } th { "Worker" } th { "Started" } th { "Ended" }
                    th class="num" { "Run time" } th { "Outcome" } th { "Error" }
                } }
                tbody {
                    @for attempt in &attempts {
                        tr data-attempt=(attempt.token) data-outcome=(attempt.outcome.as_str()) {
                            td class="num" { (attempt.token) }
                            td class="mono" { (attempt.worker) }
                            td title=(format::timestamp(attempt.started_at)) { (format::relative(now, attempt.started_at)) }
                            @match attempt.ended_at {
                                Some(ended) => td title=(format::timestamp(ended)) { (format::relative(now, ended)) },
                                None => td class="muted" { "running" },
                            }
                            td class="num" { (format::duration(attempt.run_time(now))) }
                            td { (outcome_badge(attempt.outcome)) }
                            td class="error" {
                                @if let Some(error) = &attempt.error {
                                    details {
                                        summary { (first_line(error, 120)) }
                                        pre { (error) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    };
    section("Attempts", "attempt-history", body)
}

/// The jobs this one waits (or waited) for, each with its state now (one purged since
/// is shown gone), and what it does if one fails: why a waiting job waits (CONTRACT
/// G4).
fn waits_for(
    ctx: &Ctx,
    job: &Job,
    dependencies: Result<Vec<(JobId, Option<Job>)>, String>,
    now: Timestamp,
) -> Markup {
    if job.depends_on.is_empty() {
        return html! {};
    }
    let body = match dependencies {
        Err(err) => html! { p class="problem" { "Could not read the jobs it waits for: " (err) } },
        Ok(dependencies) => {
            let met = dependencies
                .iter()
                .filter(|(_, found)| {
                    found
                        .as_ref()
                        .is_some_and(|j| j.state == JobState::Succeeded)
                })
                .count();
            html! {
                p { (met) " of " (dependencies.len()) " succeeded; if one fails: " (job.on_dependency_failure) }
                table id="dependencies" {
                    thead { tr { th { "Job" } th { "Queue" } th { "State" } } }
                    tbody {
                        @for (id, found) in &dependencies {
                            tr data-dependency=(id) {
                                td class="mono" { a href=(job_href(ctx, *id)) { (id) } }
                                @match found {
                                    Some(found) => {
                                        td { (found.queue) }
                                        td { (state_badge(found, now)) }
                                    }
                                    None => {
                                        td class="muted" { "-" }
                                        td class="muted" { "gone (purged)" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    section("Waits for", "waits-for", body)
}

/// The durable steps the job saved in its generation, in save order, each output
/// folded under its name (CONTRACT D2): what a reopen from a step (`durq retry-from`)
/// would keep or run again.
fn steps_section(ctx: &Ctx, job: &Job, steps: Result<StepLog, String>, now: Timestamp) -> Markup {
    let log = match steps {
        Err(err) => {
            return section(
                "Steps",
                "steps",
                html! { p class="problem" { "Could not read its steps: " (err) } },
            )
        }
        Ok(log) if log.steps.is_empty() && log.generation == 0 => return html! {},
        Ok(log) => log,
    };
    // An ended job can be reopened from any of its steps (D3); the form carries the
    // generation shown here, so a page read before another reopen is refused (D4).
    let ended = job.state.is_terminal();
    let generation = log.generation.to_string();
    let path = format!("/jobs/{}/retry-from", job.id);
    let body = html! {
        p class="muted" id="step-generation" data-generation=(log.generation) {
            "Generation " (log.generation) "; " (log.steps.len()) " saved, oldest first"
        }
        table id="step-list" {
            thead { tr { th { "Step" } th { "Saved" } th { "Output" } @if ended { th {} } } }
            tbody {
                @for step in &log.steps {
                    tr data-step=(step.name) {
                        td class="mono" { (step.name) }
                        td title=(format::timestamp(step.saved_at)) { (format::relative(now, step.saved_at)) }
                        td { details { summary { (step.output.len()) " bytes" } (bytes_view(Ok(&step.output))) } }
                        @if ended {
                            td {
                                (action_button(
                                    ctx,
                                    &path,
                                    &[("step", step.name.as_str()), ("generation", generation.as_str())],
                                    "Run again from here",
                                    "step-rerun",
                                ))
                            }
                        }
                    }
                }
            }
        }
    };
    section("Steps", "steps", body)
}

fn outcome_badge(outcome: AttemptOutcome) -> Markup {
    html! { span class={ "badge outcome-" (outcome.as_str()) } { (outcome.as_str()) } }
}

fn result(job: &Job) -> Markup {
    match &job.result {
        Some(bytes) => section("Result", "result", bytes_view(Ok(bytes))),
        None => html! {},
    }
}

/// Bytes as the job holds them: JSON pretty-printed, other text as it is, anything
/// else in hex; at most [`SHOWN_BYTES`].
fn bytes_view(bytes: Result<&Bytes, String>) -> Markup {
    let bytes = match bytes {
        Ok(bytes) => bytes,
        Err(err) => return html! { p class="problem" { "Could not read it: " (err) } },
    };
    if bytes.is_empty() {
        return html! { p class="muted" { "empty" } };
    }
    let shown = &bytes[..bytes.len().min(SHOWN_BYTES)];
    let cut = shown.len() < bytes.len();
    let (kind, text) = if !cut {
        match serde_json::from_slice::<serde_json::Value>(shown) {
            Ok(value) => (
                "JSON",
                serde_json::to_string_pretty(&value).unwrap_or_default(),
            ),
            Err(_) => text_or_hex(shown),
        }
    } else {
        text_or_hex(shown)
    };
    html! {
        p class="muted" {
            (bytes.len()) " bytes, " (kind)
            @if cut { ", the first " (shown.len()) " shown" }
        }
        pre { (text) }
    }
}

fn text_or_hex(bytes: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(bytes) {
        Ok(text) => ("text", text.to_owned()),
        // A cut may fall inside a character: show what decodes.
        Err(err) if err.error_len().is_none() && err.valid_up_to() > 0 => (
            "text",
            String::from_utf8_lossy(&bytes[..err.valid_up_to()]).into_owned(),
        ),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len().min(4096) * 3);
            for (i, chunk) in bytes.chunks(16).take(256).enumerate() {
                out.push_str(&format!("{:08x}  ", i * 16));
                for byte in chunk {
                    out.push_str(&format!("{byte:02x} "));
                }
                out.push('\n');
            }
            ("binary, in hex", out)
        }
    }
}

fn family(ctx: &Ctx, job: &Job, children: Result<Vec<Job>, String>) -> Markup {
    let now = ctx.app.store.now();
    let body = html! {
        @if let Some(parent) = job.parent {
            p { "Parent: " a class="mono" href=(job_href(ctx, parent)) { (parent) } }
        }
        @match children {
            Err(err) => p class="problem" { "Could not read its children: " (err) },
            Ok(children) if children.is_empty() => p class="muted" { "No children." },
            Ok(children) => {
                p { (children.len()) " children, oldest first"
                    @if children.len() > SHOWN_CHILDREN { "; the first " (SHOWN_CHILDREN) " shown" } }
                table {
                    thead { tr { th { "Job" } th { "Queue" } th { "State" } th { "Last error" } } }
                    tbody {
                        @for child in children.iter().take(SHOWN_CHILDREN) {
                            tr {
                                td class="mono" { a href=(job_href(ctx, child.id)) { (child.id) } }
                                td { (child.queue) }
                                td { (state_badge(child, now)) }
                                td { @if let Some(error) = &child.last_error { (first_line(error, 80)) } }
                            }
                        }
                    }
                }
            }
        }
    };
    section("Parent and children", "family", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_show_as_json_text_or_hex() {
        let json = Bytes::from_static(br#"{"to":"<ada>"}"#);
        let shown = bytes_view(Ok(&json)).into_string();
        assert!(
            shown.contains("JSON") && shown.contains("&lt;ada&gt;"),
            "{shown}"
        );
        let text = Bytes::from_static(b"plain <b>");
        let shown = bytes_view(Ok(&text)).into_string();
        assert!(
            shown.contains("text") && shown.contains("plain &lt;b&gt;"),
            "{shown}"
        );
        let binary = Bytes::from_static(&[0xff, 0x00, 0x10]);
        let shown = bytes_view(Ok(&binary)).into_string();
        assert!(shown.contains("ff 00 10"), "{shown}");
        let big = Bytes::from(vec![b'a'; SHOWN_BYTES + 10]);
        let shown = bytes_view(Ok(&big)).into_string();
        assert!(shown.contains("the first 65536 shown"), "{shown}");
        assert!(bytes_view(Ok(&Bytes::new()))
            .into_string()
            .contains("empty"));
        assert!(bytes_view(Err("gone".into()))
            .into_string()
            .contains("gone"));
    }
}
