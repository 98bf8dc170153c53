//! `durq events`: one page of the namespace's event stream (CONTRACT V2), so an
//! operator can see what happened to the jobs in order, and a script can follow the
//! stream by passing each page's cursor to the next run.

use durq_core::{EventCursor, EventPage};
use serde::Serialize;

use crate::format::{self, Payload, PayloadJson};
use crate::{Context, Result};

/// `durq events [--after CURSOR] [--limit N]`: the events after `after`, oldest first,
/// one line each, then the cursor to read on from.
pub async fn events(cx: &mut Context<'_>, after: EventCursor, limit: usize) -> Result<()> {
    let page = cx.store.events(after, limit).await?;
    if cx.json {
        return cx.print_json(&PageJson::new(&page));
    }
    let mut text = String::new();
    if page.trimmed {
        text.push_str(
            "events after this cursor were trimmed away before they were read: \
             this page starts at the oldest kept\n",
        );
    }
    let rows = page
        .events
        .iter()
        .map(|event| {
            let emitted = match (&event.name, &event.data) {
                (Some(name), Some(data)) => {
                    let data = Payload::of(data).human();
                    format!("{name} {}", format::clip(data.trim_end(), 80))
                }
                _ => String::new(),
            };
            vec![
                event.cursor.to_string(),
                format::time_ms(event.recorded_at),
                event.kind.to_string(),
                event.job.to_string(),
                event.queue.clone(),
                event.attempt.to_string(),
                emitted,
            ]
        })
        .collect::<Vec<_>>();
    if rows.is_empty() {
        text.push_str("no events after this cursor\n");
    } else {
        text.push_str(&format::table(
            &[
                "CURSOR", "RECORDED", "KIND", "JOB", "QUEUE", "ATTEMPT", "EMITTED",
            ],
            &[5],
            rows,
        ));
    }
    text.push_str(&format!("next: {}\n", page.next));
    cx.print(&text)
}

/// The page as `--json` prints it.
#[derive(Serialize)]
struct PageJson<'a> {
    events: Vec<EventJson<'a>>,
    next: String,
    trimmed: bool,
}

#[derive(Serialize)]
struct EventJson<'a> {
    cursor: String,
    job: String,
    queue: &'a str,
    kind: &'static str,
    attempt: u32,
    recorded_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<PayloadJson<'a>>,
}

impl<'a> PageJson<'a> {
    fn new(page: &'a EventPage) -> Self {
        PageJson {
            events: page
                .events
                .iter()
                .map(|event| EventJson {
                    cursor: event.cursor.to_string(),
                    job: event.job.to_string(),
                    queue: &event.queue,
                    kind: event.kind.as_str(),
                    attempt: event.attempt,
                    recorded_at: format::time_ms(event.recorded_at),
                    name: event.name.as_deref(),
                    data: event.data.as_deref().map(|data| Payload::of(data).json()),
                })
                .collect(),
            next: page.next.to_string(),
            trimmed: page.trimmed,
        }
    }
}
