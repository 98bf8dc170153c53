//! `GET /jobs?queue=Q&state=S&limit=N&after=ID`: a queue's jobs, newest first, one
//! page at a time, optionally in one state.
//!
//! The store lists one queue at a time, in one state or all (CONTRACT A4); the filter
//! form offers exactly that. Lists across queues, in several states or by tag wait for
//! the store to offer them: they become more fields of [`Filter`].

use axum::http::Uri;
use axum::response::Response;
use jobs::{Job, JobId, JobState, ListPage, ListQuery};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::{self, Params, DEFAULT_PAGE};
use crate::layout::{self, View};
use crate::pages::{job_href, queue_href, state_badge};
use crate::problem::Problem;

/// The page sizes the form offers (any of 1..=1000 is taken from a link).
const PAGE_SIZES: [usize; 4] = [20, 50, 100, 200];

/// What a list shows, as its query string gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    /// `None` until one is chosen: the store lists one queue at a time.
    pub queue: Option<String>,
    pub state: Option<JobState>,
    pub limit: usize,
    pub after: Option<JobId>,
}

impl Filter {
    /// Parses and checks the query.
    pub fn parse(query: Option<&str>) -> Result<Filter, Problem> {
        let params = Params::query(query, &["queue", "state", "limit", "after"])?;
        Ok(Filter {
            queue: params.get("queue").map(input::queue).transpose()?,
            state: params.get("state").map(input::state).transpose()?,
            limit: params
                .get("limit")
                .map(input::page_size)
                .transpose()?
                .unwrap_or(DEFAULT_PAGE),
            after: params.get("after").map(input::job_id).transpose()?,
        })
    }

    /// The link to this list, starting after `after`.
    fn href(&self, ctx: &Ctx, after: Option<JobId>) -> String {
        let limit = self.limit.to_string();
        let after = after.map(|id| id.to_string());
        let mut params: Vec<(&str, &str)> = Vec::new();
        if let Some(queue) = &self.queue {
            params.push(("queue", queue));
        }
        if let Some(state) = self.state {
            params.push(("state", state.as_str()));
        }
        if self.limit != DEFAULT_PAGE {
            params.push(("limit", &limit));
        }
        if let Some(after) = &after {
            params.push(("after", after));
        }
        ctx.href_query("/jobs", &params)
    }
}

/// `GET /jobs`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    let filter = Filter::parse(query)?;
    let store = &ctx.app.store;
    let known: Vec<String> = store.queues().await?.into_iter().map(|q| q.queue).collect();
    let Some(queue) = filter.queue.clone() else {
        let body = html! {
            h1 { "Jobs" }
            (filter_form(ctx, &filter, &known))
            p class="muted" { "Choose a queue: the store lists one queue at a time." }
        };
        return Ok(View::live("Jobs", body));
    };
    let mut list = ListQuery::new(queue.clone()).limit(filter.limit);
    list.states = filter.state.into_iter().collect();
    list.cursor = filter.after;
    let page = store.list(list).await?;
    let title = match filter.state {
        Some(state) => format!("{} jobs of {queue}", state.as_str()),
        None => format!("Jobs of {queue}"),
    };
    let body = html! {
        h1 {
            "Jobs of " a class="mono" href=(queue_href(ctx, &queue)) { (queue) }
            @if let Some(state) = filter.state { " · " (state.as_str()) }
        }
        (filter_form(ctx, &filter, &known))
        (table(ctx, &page.jobs))
        (pager(ctx, &filter, &page))
    };
    Ok(View::live(title, body))
}

fn filter_form(ctx: &Ctx, filter: &Filter, known: &[String]) -> Markup {
    let current = filter.queue.as_deref();
    let unlisted = current.filter(|q| !known.iter().any(|k| k == q));
    html! {
        form class="filters" method="get" action=(ctx.href("/jobs")) {
            label { "Queue"
                select name="queue" {
                    @if current.is_none() { option value="" selected { "choose…" } }
                    @for queue in known {
                        option value=(queue) selected[current == Some(queue.as_str())] { (queue) }
                    }
                    @if let Some(queue) = unlisted { option value=(queue) selected { (queue) } }
                }
            }
            label { "State"
                select name="state" {
                    option value="" selected[filter.state.is_none()] { "any" }
                    @for state in JobState::ALL {
                        option value=(state.as_str()) selected[filter.state == Some(state)] { (state.as_str()) }
                    }
                }
            }
            label { "Per page"
                select name="limit" {
                    @for size in PAGE_SIZES {
                        option value=(size) selected[filter.limit == size] { (size) }
                    }
                    @if !PAGE_SIZES.contains(&filter.limit) {
                        option value=(filter.limit) selected { (filter.limit) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
    }
}

fn table(ctx: &Ctx, jobs: &[Job]) -> Markup {
    if jobs.is_empty() {
        return html! { p class="muted" id="no-jobs" { "No job here." } };
    }
    let now = ctx.app.store.now();
    html! {
        table id="jobs" {
            thead { tr {
                th { "Job" } th { "State" } th class="num" { "Priority" } th class="num" { "Attempts" }
                th { "Created" } th { "Runs at" } th { "Finished" } th { "Last error" }
            } }
            tbody {
                @for job in jobs {
                    tr data-job=(job.id) {
                        td class="mono" { a href=(job_href(ctx, job.id)) { (job.id) } }
                        td { (state_badge(job, now)) }
                        td class="num" { (job.priority) }
                        td class="num" { (job.attempts) " / " (job.max_attempts) }
                        td title=(format::timestamp(job.created_at)) { (format::relative(now, job.created_at)) }
                        td title=(format::timestamp(job.run_at)) { (format::relative(now, job.run_at)) }
                        td {
                            @if let Some(at) = job.finished_at {
                                span title=(format::timestamp(at)) { (format::relative(now, at)) }
                            }
                        }
                        td { @if let Some(error) = &job.last_error { (first_line(error, 120)) } }
                    }
                }
            }
        }
    }
}

fn pager(ctx: &Ctx, filter: &Filter, page: &ListPage) -> Markup {
    html! {
        div class="pager" {
            @if filter.after.is_some() { a href=(filter.href(ctx, None)) { "← First page" } }
            @if let Some(next) = page.next { a href=(filter.href(ctx, Some(next))) id="next-page" { "Next page →" } }
        }
    }
}

/// The first line of `text`, cut at `max` characters.
pub(crate) fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut cut: String = line.chars().take(max).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_refuse() {
        let id = JobId::mint(jobs::Timestamp::from_millis(1_700_000_000_000));
        let query = format!("queue=emails&state=dead&limit=20&after={id}");
        let filter = Filter::parse(Some(&query)).expect("a filter");
        assert_eq!(
            filter,
            Filter {
                queue: Some("emails".into()),
                state: Some(JobState::Dead),
                limit: 20,
                after: Some(id),
            }
        );
        let empty = Filter::parse(Some("queue=&state=")).expect("empty fields are unset");
        assert_eq!(empty.queue, None);
        assert_eq!(empty.limit, DEFAULT_PAGE);
        for bad in [
            "queue=a b",
            "state=zombie",
            "limit=0",
            "limit=5000",
            "after=123",
            "page=2",
            "queue=a&queue=b",
        ] {
            assert!(Filter::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn first_lines_are_cut() {
        assert_eq!(first_line("boom", 10), "boom");
        assert_eq!(first_line("boom\nat line 2", 10), "boom…");
        assert_eq!(first_line("abcdefghijkl", 4), "abcd…");
    }
}
