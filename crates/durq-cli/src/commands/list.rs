//! `durq list`: one page of jobs, newest first, and the cursor of the next.

use durq::{Job, ListQuery, Timestamp};
use serde::Serialize;

use crate::cli::ListArgs;
use crate::format::{self, clip, table};
use crate::view::JobJson;
use crate::{Context, Result};

/// The store's query for `args`: every filter the command line takes is turned into
/// the store's terms here, and only here.
pub fn query(args: &ListArgs) -> ListQuery {
    let mut query = ListQuery::all().limit(usize::from(args.limit));
    query.queue = args.queue.clone();
    query.queue_prefix = args.prefix.clone();
    query = query.states(args.state.iter().map(|&state| state.into()));
    if let Some(tenant) = &args.tenant {
        query = query.tenant(tenant.as_str());
    }
    for (key, value) in &args.tag {
        query = query.tag(key.as_str(), value.as_str());
    }
    if let Some(cursor) = args.after {
        query = query.after(cursor);
    }
    query
}

/// `durq list`: the page `args` asks for; then, when there are more, the cursor to pass
/// to `--after` for the next page.
pub async fn list(cx: &mut Context<'_>, args: &ListArgs) -> Result<()> {
    let page = cx.store.list(query(args)).await?;
    let now = cx.store.now();
    if cx.json {
        #[derive(Serialize)]
        struct Doc<'a> {
            jobs: Vec<JobJson<'a>>,
            next: Option<durq::JobId>,
        }
        let jobs = page.jobs.iter().map(|job| JobJson::new(job, now)).collect();
        return cx.print_json(&Doc {
            jobs,
            next: page.next,
        });
    }
    let mut text = if page.jobs.is_empty() {
        String::new()
    } else {
        jobs_table(&page.jobs, now)
    };
    let count = match page.jobs.len() {
        1 => "1 job".to_owned(),
        n => format!("{n} jobs"),
    };
    match page.next {
        Some(next) => text.push_str(&format!("({count}; next page: --after {next})\n")),
        None => text.push_str(&format!("({count})\n")),
    }
    cx.print(&text)
}

/// The table `list` and `inspect`'s children print.
pub(crate) fn jobs_table(jobs: &[Job], now: Timestamp) -> String {
    let rows = jobs
        .iter()
        .map(|job| {
            vec![
                job.id.to_string(),
                job.queue.clone(),
                state_text(job, now),
                job.priority.to_string(),
                format!("{}/{}", job.attempts, job.max_attempts),
                format::time(job.run_at),
                format::time(job.created_at),
                job.last_error
                    .as_deref()
                    .map_or_else(String::new, |e| clip(e, 50)),
            ]
        })
        .collect();
    let headers = [
        "ID",
        "QUEUE",
        "STATE",
        "PRIORITY",
        "ATTEMPTS",
        "RUN AT",
        "CREATED",
        "LAST ERROR",
    ];
    table(&headers, &[3, 4], rows)
}

/// The state, with `scheduled` for a queued job whose time has not come and a note on
/// a running job asked to stop.
pub(crate) fn state_text(job: &Job, now: Timestamp) -> String {
    match job.state {
        durq::JobState::Queued if job.run_at > now => "scheduled".to_owned(),
        durq::JobState::Running if job.cancel_requested => "running (cancel asked)".to_owned(),
        state => state.to_string(),
    }
}
