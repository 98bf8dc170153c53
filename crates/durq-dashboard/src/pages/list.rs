//! `GET /jobs?queue=Q&prefix=P&state=S&state=T&tenant=X&tag=K=V&limit=N&after=ID`:
//! jobs newest first, one page at a time, across every queue or one, filtered as the
//! store's list is (CONTRACT A4): a queue-name prefix, any set of states, a tenant, and
//! tags that must all match. `state` and `tag` repeat; every other field is given at
//! most once, and every one is checked before the store is called.

use axum::http::Uri;
use axum::response::Response;
use durq::{Job, JobId, JobState, ListPage, ListQuery, Tags};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::{self, Params, DEFAULT_PAGE};
use crate::layout::{self, View};
use crate::pages::{job_href, queue_href, state_badge, tag_chips};
use crate::problem::Problem;

/// The page sizes the form offers (any of 1..=1000 is taken from a link).
const PAGE_SIZES: [usize; 4] = [20, 50, 100, 200];

/// The most store reads one page takes to fill itself. A backend may end a page early
/// with a cursor (Redis, under tenant and tag filters, after examining 4,096 index
/// entries): the page reads on from there, this many times at most, then shows what
/// it has with a link to the rest.
const MAX_READS: usize = 8;

/// The fields of the list's query string; `state` and `tag` repeat.
const FIELDS: [&str; 5] = ["queue", "prefix", "tenant", "limit", "after"];
const REPEATING: [&str; 2] = ["state", "tag"];

/// What a list shows, as its query string gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    /// One queue, by whole name; `None`: every queue.
    pub queue: Option<String>,
    /// Only queues whose name starts with this, byte for byte.
    pub prefix: Option<String>,
    /// Only jobs in one of these states, in [`JobState::ALL`]'s order; empty: every
    /// state.
    pub states: Vec<JobState>,
    /// Only this tenant's jobs; `None`: every tenant.
    pub tenant: Option<String>,
    /// Only jobs carrying every one of these tags.
    pub tags: Tags,
    pub limit: usize,
    pub after: Option<JobId>,
}

impl Filter {
    /// Parses and checks the query: each field as the store checks it, then the whole
    /// query as the store would, so the store is only called with one it takes.
    pub fn parse(query: Option<&str>) -> Result<Filter, Problem> {
        let params = Params::query_repeating(query, &FIELDS, &REPEATING)?;
        let mut states = Vec::new();
        for text in params.all("state") {
            states.push(input::state(text)?);
        }
        let mut tags = Tags::new();
        for text in params.all("tag") {
            if tags.len() == durq_core::meta::MAX_TAGS {
                return Err(Problem::bad_request(format!(
                    "at most {} tag filters, as many as a job may carry",
                    durq_core::meta::MAX_TAGS
                )));
            }
            let (key, value) = input::tag(text)?;
            match tags.get(&key) {
                Some(other) if *other != value => {
                    return Err(Problem::bad_request(format!(
                        "tag {key:?} is filtered on twice, with different values: no job matches"
                    )))
                }
                _ => {
                    tags.insert(key, value);
                }
            }
        }
        let filter = Filter {
            queue: params.get("queue").map(input::queue).transpose()?,
            prefix: params.get("prefix").map(input::queue_prefix).transpose()?,
            states: JobState::ALL
                .into_iter()
                .filter(|state| states.contains(state))
                .collect(),
            tenant: params.get("tenant").map(input::tenant).transpose()?,
            tags,
            limit: params
                .get("limit")
                .map(input::page_size)
                .transpose()?
                .unwrap_or(DEFAULT_PAGE),
            after: params.get("after").map(input::job_id).transpose()?,
        };
        input::list_query(&filter.query())?;
        Ok(filter)
    }

    /// The store's query for this filter.
    pub fn query(&self) -> ListQuery {
        let mut query = ListQuery::all()
            .states(self.states.iter().copied())
            .limit(self.limit);
        query.queue = self.queue.clone();
        query.queue_prefix = self.prefix.clone();
        query.tenant = self.tenant.clone();
        query.tags = self.tags.clone();
        query.cursor = self.after;
        query
    }

    /// Whether any filter narrows the list (paging aside).
    fn narrows(&self) -> bool {
        self.queue.is_some()
            || self.prefix.is_some()
            || !self.states.is_empty()
            || self.tenant.is_some()
            || !self.tags.is_empty()
    }

    /// The link to this list, every filter kept, starting after `after`.
    fn href(&self, ctx: &Ctx, after: Option<JobId>) -> String {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(queue) = &self.queue {
            params.push(("queue", queue.clone()));
        }
        if let Some(prefix) = &self.prefix {
            params.push(("prefix", prefix.clone()));
        }
        for state in &self.states {
            params.push(("state", state.as_str().to_owned()));
        }
        if let Some(tenant) = &self.tenant {
            params.push(("tenant", tenant.clone()));
        }
        for (key, value) in &self.tags {
            params.push(("tag", format!("{key}={value}")));
        }
        if self.limit != DEFAULT_PAGE {
            params.push(("limit", self.limit.to_string()));
        }
        if let Some(after) = after {
            params.push(("after", after.to_string()));
        }
        let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ctx.href_query("/jobs", &params)
    }

    /// The page's title: what it lists, in words.
    fn title(&self) -> String {
        let mut title = match &self.queue {
            Some(queue) => format!("Jobs of {queue}"),
            None => "Jobs of every queue".to_owned(),
        };
        if !self.states.is_empty() {
            let states: Vec<&str> = self.states.iter().map(|s| s.as_str()).collect();
            title.push_str(" · ");
            title.push_str(&states.join(", "));
        }
        title
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
    let (page, ended_early) = read_page(store, filter.query()).await?;
    let body = html! {
        h1 {
            @match &filter.queue {
                Some(queue) => { "Jobs of " a class="mono" href=(queue_href(ctx, queue)) { (queue) } },
                None => "Jobs of every queue",
            }
            @if !filter.states.is_empty() {
                " · "
                @for (i, state) in filter.states.iter().enumerate() {
                    @if i > 0 { ", " }
                    (state.as_str())
                }
            }
        }
        (scope(&filter))
        (filter_form(ctx, &filter, &known))
        (table(ctx, &page.jobs, filter.queue.is_none()))
        @if ended_early {
            p class="muted" id="ended-early" {
                "The store stopped this page early (it bounds the work of one read); "
                "the next page reads on."
            }
        }
        (pager(ctx, &filter, &page))
    };
    Ok(View::live(filter.title(), body))
}

/// Reads one page of `query`, reading on while the store ends a page early with a
/// cursor, [`MAX_READS`] times at most. Whether the page is short with more to come.
async fn read_page(store: &durq::Store, mut query: ListQuery) -> Result<(ListPage, bool), Problem> {
    let limit = query.limit;
    let mut jobs = Vec::new();
    for _ in 0..MAX_READS {
        let page = store.list(query.clone()).await?;
        jobs.extend(page.jobs);
        match page.next {
            Some(next) if jobs.len() < limit => {
                query.cursor = Some(next);
                query.limit = limit - jobs.len();
            }
            next => return Ok((ListPage { jobs, next }, false)),
        }
    }
    Ok((
        ListPage {
            jobs,
            next: query.cursor,
        },
        true,
    ))
}

/// The filters other than queue and state, in words.
fn scope(filter: &Filter) -> Markup {
    html! {
        @if filter.prefix.is_some() || filter.tenant.is_some() || !filter.tags.is_empty() {
            p class="scope" id="scope" {
                @if let Some(prefix) = &filter.prefix {
                    span { "queues starting with " code { (prefix) } }
                }
                @if let Some(tenant) = &filter.tenant {
                    span { "tenant " code { (tenant) } }
                }
                @if !filter.tags.is_empty() {
                    span { "tagged " (tag_chips(None, &filter.tags)) }
                }
            }
        }
    }
}

fn filter_form(ctx: &Ctx, filter: &Filter, known: &[String]) -> Markup {
    let current = filter.queue.as_deref();
    let unlisted = current.filter(|q| !known.iter().any(|k| k == q));
    html! {
        form class="filters" method="get" action=(ctx.href("/jobs")) {
            label { "Queue"
                select name="queue" {
                    option value="" selected[current.is_none()] { "all queues" }
                    @for queue in known {
                        option value=(queue) selected[current == Some(queue.as_str())] { (queue) }
                    }
                    @if let Some(queue) = unlisted { option value=(queue) selected { (queue) } }
                }
            }
            label { "Queue prefix"
                input type="text" name="prefix" value=[filter.prefix.as_deref()] placeholder="emails." size="12";
            }
            fieldset class="states" {
                legend { "States (none: all)" }
                @for state in JobState::ALL {
                    label class="check" {
                        input type="checkbox" name="state" value=(state.as_str()) checked[filter.states.contains(&state)];
                        (state.as_str())
                    }
                }
            }
            label { "Tenant"
                input type="text" name="tenant" value=[filter.tenant.as_deref()] size="12";
            }
            @for (key, value) in &filter.tags {
                label { "Tag"
                    input type="text" name="tag" value={ (key) "=" (value) } size="16";
                }
            }
            @if filter.tags.len() < durq_core::meta::MAX_TAGS {
                label { @if filter.tags.is_empty() { "Tag" } @else { "And tag" }
                    input type="text" name="tag" placeholder="key=value" size="16";
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
            @if filter.narrows() { a href=(ctx.href("/jobs")) { "Clear" } }
        }
    }
}

fn table(ctx: &Ctx, jobs: &[Job], queue_column: bool) -> Markup {
    if jobs.is_empty() {
        return html! { p class="muted" id="no-jobs" { "No job here." } };
    }
    let now = ctx.app.store.now();
    html! {
        table id="jobs" {
            thead { tr {
                th { "Job" } @if queue_column { th { "Queue" } } th { "State" }
                th class="num" { "Priority" } th class="num" { "Attempts" }
                th { "Created" } th { "Runs at" } th { "Finished" } th { "Tags" } th { "Last error" }
            } }
            tbody {
                @for job in jobs {
                    tr data-job=(job.id) {
                        td class="mono id" { a href=(job_href(ctx, job.id)) { (job.id) } }
                        @if queue_column {
                            td class="mono" { a href=(queue_href(ctx, &job.queue)) { (job.queue) } }
                        }
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
                        td { (tag_chips(Some(ctx), &job.tags)) }
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
        let id = JobId::mint(durq::Timestamp::from_millis(1_700_000_000_000));
        let query = format!(
            "queue=emails&prefix=em&state=dead&state=queued&state=dead&tenant=acme\
             &tag=customer%3D42&tag=flag%3D&limit=20&after={id}"
        );
        let filter = Filter::parse(Some(&query)).expect("a filter");
        assert_eq!(
            filter,
            Filter {
                queue: Some("emails".into()),
                prefix: Some("em".into()),
                states: vec![JobState::Queued, JobState::Dead],
                tenant: Some("acme".into()),
                tags: Tags::from([
                    ("customer".into(), "42".into()),
                    ("flag".into(), String::new())
                ]),
                limit: 20,
                after: Some(id),
            }
        );
        let query = filter.query();
        assert_eq!(query.queue.as_deref(), Some("emails"));
        assert_eq!(query.queue_prefix.as_deref(), Some("em"));
        assert_eq!(query.states, [JobState::Queued, JobState::Dead]);
        assert_eq!(query.tenant.as_deref(), Some("acme"));
        assert_eq!(query.tags, filter.tags);
        assert_eq!((query.limit, query.cursor), (20, Some(id)));
        let empty = Filter::parse(Some("queue=&state=&prefix=&tenant=&tag="))
            .expect("empty fields are unset");
        assert_eq!(empty.queue, None);
        assert_eq!(empty.limit, DEFAULT_PAGE);
        assert!(!empty.narrows());
        assert_eq!(empty.query(), ListQuery::all().limit(DEFAULT_PAGE));
        let same_twice = Filter::parse(Some("tag=k%3Dv&tag=k%3Dv")).expect("one tag");
        assert_eq!(same_twice.tags.len(), 1);
        let too_many: String = (0..17)
            .map(|i| format!("tag=k{i}%3Dv&"))
            .collect::<String>();
        for bad in [
            "queue=a b",
            "state=zombie",
            "limit=0",
            "limit=5000",
            "after=123",
            "page=2",
            "queue=a&queue=b",
            "prefix=a*",
            "prefix=a&prefix=b",
            "tenant=a&tenant=b",
            "tag=novalue",
            "tag=%3Dv",
            "tag=a%20b%3Dv",
            "tag=k%3Dline%0Abreak",
            "tag=k%3D1&tag=k%3D2",
            too_many.as_str(),
        ] {
            assert!(Filter::parse(Some(bad)).is_err(), "{bad}");
        }
        let long_tenant = format!("tenant={}", "t".repeat(257));
        assert!(Filter::parse(Some(&long_tenant)).is_err());
    }

    #[test]
    fn first_lines_are_cut() {
        assert_eq!(first_line("boom", 10), "boom");
        assert_eq!(first_line("boom\nat line 2", 10), "boom…");
        assert_eq!(first_line("abcdefghijkl", 4), "abcd…");
    }
}
