//! The event stream (CONTRACT V1–V4): a namespace's ordered, durable record of its
//! jobs' state changes and of the events handlers emit, read from a cursor and resumed
//! after a restart from the last cursor a consumer saved.
//!
//! Which change is which event is decided once, here ([`EventKind::of_change`]); the
//! backends that record changes in SQL triggers or Lua scripts mirror it and name it.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::id::JobId;
use crate::model::JobState;
use crate::time::Timestamp;

/// The most events one read answers.
pub const MAX_EVENTS_PAGE: usize = 1_000;

/// The largest data an emitted event carries, in bytes: events are a stream to
/// follow, not a store of outputs (a job's result or steps hold those).
pub const MAX_EVENT_DATA_BYTES: usize = 64 * 1024;

/// A position in a namespace's event stream: an event's own cursor, or where a
/// consumer has read to. Cursors are ordered; [`EventCursor::START`] is before every
/// event.
///
/// Two numbers, compared in order, so each backend can use its own ordering: a
/// counter (memory, SQLite: `N-0`), a transaction id and a sequence (PostgreSQL), a
/// stream entry id (Redis, where the text form is the entry id). A consumer stores the
/// text form ([`fmt::Display`]) and parses it back ([`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventCursor {
    high: u64,
    low: u64,
}

impl EventCursor {
    /// Before every event: reading after it reads from the oldest event kept.
    pub const START: EventCursor = EventCursor { high: 0, low: 0 };

    /// The cursor `high-low`.
    pub const fn new(high: u64, low: u64) -> Self {
        EventCursor { high, low }
    }

    /// The first, more significant number.
    pub const fn high(self) -> u64 {
        self.high
    }

    /// The second number, which orders cursors of equal `high`.
    pub const fn low(self) -> u64 {
        self.low
    }
}

impl fmt::Display for EventCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.high, self.low)
    }
}

impl FromStr for EventCursor {
    type Err = Error;

    /// Parses `high-low`, as [`fmt::Display`] writes it; anything else is
    /// `InvalidInput { field: "cursor" }`.
    fn from_str(text: &str) -> Result<Self> {
        let invalid = || Error::invalid("cursor", format!("{text:?} is not a cursor (`N-N`)"));
        let (high, low) = text.split_once('-').ok_or_else(invalid)?;
        let number = |part: &str| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            part.parse::<u64>().map_err(|_| invalid())
        };
        Ok(EventCursor::new(number(high)?, number(low)?))
    }
}

/// What happened to a job (CONTRACT V1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// The job was enqueued, whatever its first state.
    Enqueued,
    /// A claim started an attempt.
    Started,
    /// The attempt succeeded.
    Succeeded,
    /// The attempt ended without success and the job will run again (a failure with a
    /// retry, a reclaim of its expired lease): running → queued, the attempt counted.
    Failed,
    /// The holder gave the job back (release, snooze): running → queued, the attempt
    /// taken back.
    Released,
    /// Every job it waited for succeeded (or ended, for a job that runs anyway):
    /// waiting → queued.
    Ready,
    /// The job died: its last attempt failed, or it was buried.
    Dead,
    /// The job was cancelled, by an operator or by the failure of a job it waited for.
    Cancelled,
    /// An ended job was queued again by an operator (retry, retry from a step).
    Retried,
    /// The running job's handler emitted an event of its own.
    Emitted,
}

impl EventKind {
    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 10] = [
        EventKind::Enqueued,
        EventKind::Started,
        EventKind::Succeeded,
        EventKind::Failed,
        EventKind::Released,
        EventKind::Ready,
        EventKind::Dead,
        EventKind::Cancelled,
        EventKind::Retried,
        EventKind::Emitted,
    ];

    /// The kind's name, as backends store it and the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Started => "started",
            EventKind::Succeeded => "succeeded",
            EventKind::Failed => "failed",
            EventKind::Released => "released",
            EventKind::Ready => "ready",
            EventKind::Dead => "dead",
            EventKind::Cancelled => "cancelled",
            EventKind::Retried => "retried",
            EventKind::Emitted => "emitted",
        }
    }

    /// The event a change of a job's state records (CONTRACT V1), or `None` for a
    /// change that records none (the state stays as it was). `was` is the state before
    /// (`None` for an enqueue), `attempts_before` and `attempts_after` the job's
    /// attempts before and after: a running job that goes back to `queued` with fewer
    /// attempts was released, with as many it failed.
    ///
    /// Mirrored by PostgreSQL's and SQLite's `record_event` triggers and Redis's
    /// `event_of` in `core.lua`.
    pub fn of_change(
        was: Option<JobState>,
        now: JobState,
        attempts_before: u32,
        attempts_after: u32,
    ) -> Option<EventKind> {
        let Some(was) = was else {
            return Some(EventKind::Enqueued);
        };
        if was == now {
            return None;
        }
        Some(match now {
            JobState::Running => EventKind::Started,
            JobState::Succeeded => EventKind::Succeeded,
            JobState::Dead => EventKind::Dead,
            JobState::Cancelled => EventKind::Cancelled,
            JobState::Queued => match was {
                JobState::Running if attempts_after < attempts_before => EventKind::Released,
                JobState::Running => EventKind::Failed,
                JobState::Waiting => EventKind::Ready,
                _ => EventKind::Retried,
            },
            // No change moves a job back into `waiting`: an enqueue is the only way in.
            JobState::Waiting => return None,
        })
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventKind {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| Error::invalid("kind", format!("{text:?} is not an event kind")))
    }
}

/// One event of the stream (CONTRACT V1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its place in the stream.
    pub cursor: EventCursor,
    /// The job it is about.
    pub job: JobId,
    /// The job's queue.
    pub queue: String,
    /// What happened.
    pub kind: EventKind,
    /// The job's attempts after the change (for `started`, the attempt that began; for
    /// `emitted`, the attempt that emitted it).
    pub attempt: u32,
    /// An emitted event's name; `None` for the others.
    pub name: Option<String>,
    /// An emitted event's data; `None` for the others.
    pub data: Option<Bytes>,
    /// When the event was recorded: informational, never ordering (the cursor orders).
    /// The store's clock of the write that made the change (memory, SQLite, Redis, and
    /// every `emitted`), the database server's where a PostgreSQL trigger records a
    /// change.
    pub recorded_at: Timestamp,
}

/// One read of the stream (CONTRACT V2, V3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPage {
    /// The events after the read's cursor, oldest first.
    pub events: Vec<Event>,
    /// Where the next read starts: the last event's cursor, or the read's own cursor
    /// when it found none.
    pub next: EventCursor,
    /// Whether events after the read's cursor were trimmed away before it read them
    /// (V3): the consumer missed them.
    pub trimmed: bool,
}

/// The page a backend answers for `after` from the events it found past it (oldest
/// first) and the newest cursor it ever trimmed (V2, V3).
pub fn page(after: EventCursor, events: Vec<Event>, trimmed_through: EventCursor) -> EventPage {
    let next = events.last().map_or(after, |event| event.cursor);
    EventPage {
        events,
        next,
        trimmed: after < trimmed_through,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_order_by_both_numbers_and_round_trip_as_text() {
        let a = EventCursor::new(7, 3);
        assert!(EventCursor::START < a);
        assert!(a < EventCursor::new(7, 4));
        assert!(EventCursor::new(7, u64::MAX) < EventCursor::new(8, 0));
        assert_eq!(a.to_string(), "7-3");
        assert_eq!("7-3".parse::<EventCursor>().ok(), Some(a));
        for bad in [
            "",
            "7",
            "7-",
            "-3",
            "a-3",
            "7-3-1",
            "+7-3",
            "99999999999999999999-0",
        ] {
            assert!(bad.parse::<EventCursor>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn each_change_records_its_kind() {
        use EventKind as K;
        use JobState as S;
        let of = EventKind::of_change;
        assert_eq!(of(None, S::Waiting, 0, 0), Some(K::Enqueued));
        assert_eq!(of(Some(S::Queued), S::Running, 0, 1), Some(K::Started));
        assert_eq!(of(Some(S::Running), S::Succeeded, 1, 1), Some(K::Succeeded));
        assert_eq!(of(Some(S::Running), S::Queued, 1, 1), Some(K::Failed));
        assert_eq!(of(Some(S::Running), S::Queued, 1, 0), Some(K::Released));
        assert_eq!(of(Some(S::Waiting), S::Queued, 0, 0), Some(K::Ready));
        assert_eq!(of(Some(S::Dead), S::Queued, 3, 0), Some(K::Retried));
        assert_eq!(of(Some(S::Succeeded), S::Queued, 1, 0), Some(K::Retried));
        assert_eq!(of(Some(S::Waiting), S::Cancelled, 0, 0), Some(K::Cancelled));
        assert_eq!(of(Some(S::Running), S::Dead, 3, 3), Some(K::Dead));
        assert_eq!(of(Some(S::Running), S::Running, 1, 1), None);
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>().ok(), Some(kind));
        }
    }

    #[test]
    fn a_page_continues_from_its_last_event_and_says_what_was_trimmed() {
        let empty = page(EventCursor::new(5, 0), Vec::new(), EventCursor::new(2, 0));
        assert_eq!(empty.next, EventCursor::new(5, 0));
        assert!(!empty.trimmed);
        let behind = page(EventCursor::new(1, 0), Vec::new(), EventCursor::new(2, 0));
        assert!(behind.trimmed);
        assert!(!page(EventCursor::new(2, 0), Vec::new(), EventCursor::new(2, 0)).trimmed);
    }
}
