//! `GET /events`: the namespace's event stream (CONTRACT V1–V3), as a live tail that
//! follows the newest events (newest first), or a page at a time from a cursor (oldest
//! first, as a consumer reads it).
//!
//! The stream is read forwards only (V2 has no read from the end), so the tail walks
//! from the cursor it is given to the end, keeping the last [`SHOWN`] events, and
//! reloads from the cursor just before them: each reload reads what arrived since,
//! plus the events on screen. The first visit walks from the oldest event kept, which
//! the worker's trim bounds (V3); [`WALK_PAGES`] bounds one request's walk whatever the
//! retention, and the next reload goes on from where it stopped.

use std::collections::VecDeque;

use axum::http::Uri;
use axum::response::Response;
use durq::stream::{Event, EventCursor, MAX_EVENTS_PAGE};
use maud::{html, Markup};

use crate::app::Ctx;
use crate::format;
use crate::input::Params;
use crate::layout::{self, View};
use crate::pages::{job_href, queue_href};
use crate::problem::Problem;

/// Events on one page.
const SHOWN: usize = 100;
/// Events per read of the tail's walk: the most one read may ask for (V2).
const WALK_PAGE: usize = MAX_EVENTS_PAGE;
/// Reads of one request's walk: 50,000 events at most.
const WALK_PAGES: usize = 50;
/// The characters of an emitted event's data shown in the table.
const DATA_SHOWN: usize = 200;

/// `GET /events`.
pub(crate) async fn page(ctx: Ctx, uri: Uri) -> Response {
    let view = view(&ctx, uri.query()).await;
    layout::render(&ctx, view)
}

async fn view(ctx: &Ctx, query: Option<&str>) -> Result<View, Problem> {
    let params = Params::query(query, &["after", "tail"])?;
    let after = params.get("after").map(cursor).transpose()?;
    let tail = params.get("tail").map(cursor).transpose()?;
    match (after, tail) {
        (Some(_), Some(_)) => Err(Problem::bad_request(
            "give after (a page from a cursor) or tail (the newest events), not both",
        )),
        (Some(after), None) => from_cursor(ctx, after).await,
        (None, tail) => live_tail(ctx, tail.unwrap_or(EventCursor::START)).await,
    }
}

/// A cursor as a page prints it (`N-N`).
fn cursor(text: &str) -> Result<EventCursor, Problem> {
    text.parse().map_err(|_| {
        Problem::bad_request("a cursor is two whole numbers joined by '-', as the pages print it")
    })
}

/// The newest events: what a walk from `from` to the end of the stream found last.
async fn live_tail(ctx: &Ctx, from: EventCursor) -> Result<View, Problem> {
    let tail = walk(&ctx.app.store, from).await?;
    let reload = ctx.href_query("/events", &[("tail", &tail.before.to_string())]);
    let body = html! {
        h1 { "Events" " " span class="muted" { "the newest first, as they come" } }
        (intro())
        @if !tail.reached_end {
            p class="notice" id="catching-up" {
                "The stream holds more events than one visit reads ("
                (WALK_PAGES * WALK_PAGE) "), so these are not the newest yet: each reload "
                "reads on from them."
            }
        }
        // Newest first: the page reloads at its top, where what just happened is.
        (table(ctx, tail.events.iter().rev()))
        p {
            a href=(ctx.href_query("/events", &[("after", &EventCursor::START.to_string())])) {
                "From the oldest event kept"
            }
        }
    };
    Ok(View::live("Events", body).refresh_to(reload))
}

/// Up to [`SHOWN`] events after `after`, oldest first, with the link to the next page;
/// the last page, which new events extend, reloads itself.
async fn from_cursor(ctx: &Ctx, after: EventCursor) -> Result<View, Problem> {
    let page = ctx.app.store.events(after, SHOWN).await?;
    let full = page.events.len() == SHOWN;
    let body = html! {
        h1 { "Events" " " span class="muted" { "after " (after) } }
        (intro())
        @if page.trimmed {
            p class="notice" id="trimmed" {
                "Events after this cursor were trimmed away before this read: the worker "
                "keeps only the newest (its store's record_events bound)."
            }
        }
        (table(ctx, page.events.iter()))
        p {
            @if full {
                a href=(ctx.href_query("/events", &[("after", &page.next.to_string())]))
                    id="next-page" {
                    "Newer events"
                }
                " · "
            }
            a href=(ctx.href("/events")) { "The newest events" }
        }
    };
    Ok(if full {
        View::still("Events", body)
    } else {
        View::live("Events", body)
    })
}

fn intro() -> Markup {
    html! {
        p class="muted" {
            "Every change of state of the jobs enqueued by stores that record events, and "
            "the events their handlers emit, in the stream's order."
        }
    }
}

/// What a walk to the end of the stream keeps.
#[derive(Debug)]
struct Tail {
    /// The last [`SHOWN`] events it read, oldest first.
    events: VecDeque<Event>,
    /// The cursor just before the first of them: where the next walk starts.
    before: EventCursor,
    /// Whether it read to the end, rather than stopping after [`WALK_PAGES`] reads.
    reached_end: bool,
}

/// Reads from `from` to the end of the stream, or for [`WALK_PAGES`] reads.
async fn walk(store: &durq::Store, from: EventCursor) -> durq::Result<Tail> {
    let mut events: VecDeque<Event> = VecDeque::with_capacity(SHOWN + 1);
    let mut before = from;
    let mut at = from;
    for _ in 0..WALK_PAGES {
        let page = store.events(at, WALK_PAGE).await?;
        let last_read = page.events.len() < WALK_PAGE;
        for event in page.events {
            events.push_back(event);
            if events.len() > SHOWN {
                if let Some(dropped) = events.pop_front() {
                    before = dropped.cursor;
                }
            }
        }
        at = page.next;
        if last_read {
            return Ok(Tail {
                events,
                before,
                reached_end: true,
            });
        }
    }
    Ok(Tail {
        events,
        before,
        reached_end: false,
    })
}

/// A table of `events`, in the order given.
fn table<'a>(ctx: &Ctx, events: impl ExactSizeIterator<Item = &'a Event>) -> Markup {
    if events.len() == 0 {
        return html! {
            p class="muted" id="no-events" {
                "No event recorded here yet. Jobs record their events when the store that "
                "enqueues them is opened with StoreSettings::record_events."
            }
        };
    }
    let now = ctx.app.store.now();
    html! {
        table id="events" {
            thead { tr {
                th { "Cursor" } th { "Recorded" } th { "Job" } th { "Queue" } th { "Event" }
                th class="num" { "Attempt" } th { "Data" }
            } }
            tbody {
                @for event in events {
                    tr data-event=(event.cursor) data-kind=(event.kind) {
                        td class="mono" { (event.cursor) }
                        td title=(format::timestamp(event.recorded_at)) {
                            (format::relative(now, event.recorded_at))
                        }
                        td class="mono" { a href=(job_href(ctx, event.job)) { (event.job) } }
                        td { a href=(queue_href(ctx, &event.queue)) { (event.queue) } }
                        td {
                            (event.kind)
                            @if let Some(name) = &event.name { " " span class="mono" { (name) } }
                        }
                        td class="num" { (event.attempt) }
                        td class="mono" {
                            @if let Some(data) = &event.data { (data_text(data)) }
                        }
                    }
                }
            }
        }
    }
}

/// An emitted event's data as the table shows it: its text, cut at [`DATA_SHOWN`]
/// characters, or its size when it is not text.
fn data_text(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(text) => {
            let mut chars = text.chars();
            let shown: String = chars.by_ref().take(DATA_SHOWN).collect();
            if chars.next().is_some() {
                format!("{shown}…")
            } else {
                shown
            }
        }
        Err(_) => format!("{} bytes, not text", data.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_shown_as_text_cut_or_as_its_size() {
        assert_eq!(data_text(b"{\"ok\":true}"), "{\"ok\":true}");
        let long = "é".repeat(DATA_SHOWN + 5);
        let shown = data_text(long.as_bytes());
        assert_eq!(shown.chars().count(), DATA_SHOWN + 1, "cut on a character");
        assert!(shown.ends_with('…'));
        assert_eq!(data_text(&[0xff, 0x00]), "2 bytes, not text");
    }
}
