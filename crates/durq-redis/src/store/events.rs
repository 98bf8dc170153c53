//! The event stream (CONTRACT V1–V4), on an unpartitioned namespace: one Redis stream
//! per namespace, `…:events` ([`crate::keys::Keys::events`]), in the namespace's slot.
//!
//! Recording is the scripts' (`lua/core.lua`, `record_change`): every script that
//! changes the state of a job carrying the mark `ev` appends the change with one `XADD
//! … *` in the same script, so the stream holds exactly the changes that happened, in
//! the order they happened (scripts run one at a time, and the server draws each id
//! above the last). This module holds the three calls of [`durq_core::Events`]: a read
//! (`events.lua`: the range after a cursor and the trim marker, in one step), an emit
//! fenced by the lease (`emit.lua`), and a trim that remembers the newest id it
//! deleted, in one step too (`trim_events.lua`).
//!
//! A cursor is a stream entry id: [`EventCursor`]'s text `high-low` is exactly
//! `MS-SEQ`, so the cursor a consumer saves is the id it read last.

use durq_core::events::{self, Event, EventCursor, EventKind, EventPage};
use durq_core::{Bytes, Error, JobId, LeaseToken, Result, Timestamp};
use redis::Value;

use super::{status, RedisBackend};
use crate::codec::{int, into_opt_bytes};
use crate::scripts::{self, Eval};

/// What the reads name in the errors of an unreadable stream.
const WHAT: &str = "event stream";

impl RedisBackend {
    /// Rule V2: the entries after `after` (at most `limit`), oldest first, and whether
    /// a trim deleted any of them (V3), read in one script.
    pub(crate) async fn read_events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        let keys = self.keys();
        let start = range_start(after);
        let mut invocation = scripts::EVENTS.prepare_invoke();
        invocation
            .key(&keys.events)
            .key(&keys.events_trimmed)
            .arg(start)
            .arg(limit);
        let reply = self.invoke(&invocation, "events").await?;
        decode_page(after, reply)
    }

    /// Rule V1: `emit.lua` records an `emitted` event for the job running under
    /// `token`, or answers why not, writing nothing.
    pub(crate) async fn emit_event(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let keys = self.keys();
        // The data goes into the command's buffer as it is added (`Eval`).
        let mut eval = Eval::new(&scripts::EMIT);
        eval.job_key(keys, id)
            .key(&keys.events)
            .id_arg(id)
            .arg(token.get())
            .arg(name)
            .arg(data.as_ref())
            .arg(now.as_millis());
        let reply = self.eval(&eval, "emit").await?;
        match status(&reply, "emit reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "emit reply")),
        }
    }

    /// Rule V3: `trim_events.lua` deletes every entry but the newest `keep` and moves
    /// the trim marker to the newest it deleted, in one step. Answers how many it
    /// deleted.
    pub(crate) async fn trim_stream(&self, keep: u64) -> Result<u64> {
        let keys = self.keys();
        let mut invocation = scripts::TRIM_EVENTS.prepare_invoke();
        invocation
            .key(&keys.events)
            .key(&keys.events_trimmed)
            .arg(keep);
        let reply = self.invoke(&invocation, "trim_events").await?;
        u64::try_from(int(&reply, "trim_events reply")?)
            .map_err(|_| Error::corrupt("trim_events reply", "a negative count"))
    }
}

/// Where the range after `after` starts, as `XRANGE` takes it: `-` for
/// [`EventCursor::START`], else the smallest id above `after`, inclusive (`MS-SEQ+1`),
/// which reads what the exclusive `(MS-SEQ` of Redis 6.2 would on every version this
/// crate supports. Only the largest cursor of all has no such id: it takes the
/// exclusive form.
fn range_start(after: EventCursor) -> String {
    if after == EventCursor::START {
        return "-".to_owned();
    }
    match after.low().checked_add(1) {
        Some(low) => format!("{}-{low}", after.high()),
        None => match after.high().checked_add(1) {
            Some(high) => format!("{high}-0"),
            None => format!("({after}"),
        },
    }
}

/// `events.lua`'s reply, `{marker or nil, entries}`, as the page of a read after
/// `after`. Takes the reply by value, so each emitted event's data is moved, not
/// copied.
fn decode_page(after: EventCursor, reply: Value) -> Result<EventPage> {
    let Value::Array(items) = reply else {
        return Err(Error::corrupt(
            "events reply",
            format!("expected an array, got {reply:?}"),
        ));
    };
    let Ok([marker, entries]) = <[Value; 2]>::try_from(items) else {
        return Err(Error::corrupt("events reply", "two items expected"));
    };
    let trimmed_through = match marker {
        Value::Nil => EventCursor::START,
        other => cursor_of(other, "event trim marker")?,
    };
    let Value::Array(entries) = entries else {
        return Err(Error::corrupt(
            "events reply",
            "expected an array of entries",
        ));
    };
    let events = entries
        .into_iter()
        .map(decode_event)
        .collect::<Result<Vec<_>>>()?;
    Ok(events::page(after, events, trimmed_through))
}

/// A stream entry id (`MS-SEQ`) as a cursor.
fn cursor_of(value: Value, what: &str) -> Result<EventCursor> {
    let text = utf8(value, what, "id")?;
    text.parse()
        .map_err(|_| Error::corrupt(what, format!("{text:?} is not a stream id")))
}

/// The text of a stored value, or `Corrupt` naming `field`.
fn utf8(value: Value, what: &str, field: &str) -> Result<String> {
    into_opt_bytes(value)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| Error::corrupt(what, format!("field {field} is not text")))
}

/// A decimal number as the scripts write it: an optional `-` (when `signed`), then
/// digits only (no `+`, no spaces), that fits `T`.
fn number<T: std::str::FromStr>(text: &str, signed: bool) -> Option<T> {
    let digits = match text.strip_prefix('-') {
        Some(rest) if signed => rest,
        _ => text,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// One entry, `{id, {field, value, ...}}`, strictly: each of `j q k a t` once and
/// readable, and `n`, `d` exactly on an `emitted` event. A field this build does not
/// write is left alone (a later build may add one); anything else is `Corrupt`, naming
/// the entry.
fn decode_event(entry: Value) -> Result<Event> {
    let Value::Array(parts) = entry else {
        return Err(Error::corrupt(WHAT, "an entry that is not an array"));
    };
    let Ok([id, fields]) = <[Value; 2]>::try_from(parts) else {
        return Err(Error::corrupt(WHAT, "an entry without its id and fields"));
    };
    let cursor = cursor_of(id, WHAT)?;
    let what = format!("event {cursor}");
    let bad = |reason: String| Error::corrupt(what.clone(), reason);
    let Value::Array(fields) = fields else {
        return Err(bad("fields that are not an array".to_owned()));
    };
    if fields.len() % 2 != 0 {
        return Err(bad("a field without its value".to_owned()));
    }
    let mut job = None;
    let mut queue = None;
    let mut kind = None;
    let mut attempt = None;
    let mut recorded_at = None;
    let mut name = None;
    let mut data = None;
    let mut fields = fields.into_iter();
    while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
        let field =
            into_opt_bytes(field).ok_or_else(|| bad("a field name that is not text".to_owned()))?;
        let once = |seen: bool, field: &str| {
            if seen {
                Err(bad(format!("field {field} twice")))
            } else {
                Ok(())
            }
        };
        match field.as_slice() {
            b"j" => {
                once(job.is_some(), "j")?;
                let text = utf8(value, &what, "j")?;
                job = Some(
                    JobId::parse_canonical(text.as_bytes())
                        .map_err(|_| bad(format!("field j {text:?} is not a job id")))?,
                );
            }
            b"q" => {
                once(queue.is_some(), "q")?;
                queue = Some(utf8(value, &what, "q")?);
            }
            b"k" => {
                once(kind.is_some(), "k")?;
                let text = utf8(value, &what, "k")?;
                kind = Some(
                    text.parse::<EventKind>()
                        .map_err(|_| bad(format!("field k {text:?} is not an event kind")))?,
                );
            }
            b"a" => {
                once(attempt.is_some(), "a")?;
                let text = utf8(value, &what, "a")?;
                attempt = Some(
                    number::<u32>(&text, false)
                        .ok_or_else(|| bad(format!("field a {text:?} is not a count")))?,
                );
            }
            b"t" => {
                once(recorded_at.is_some(), "t")?;
                let text = utf8(value, &what, "t")?;
                let ms = number::<i64>(&text, true)
                    .ok_or_else(|| bad(format!("field t {text:?} is not a time")))?;
                recorded_at = Some(Timestamp::from_millis(ms));
            }
            b"n" => {
                once(name.is_some(), "n")?;
                name = Some(utf8(value, &what, "n")?);
            }
            b"d" => {
                once(data.is_some(), "d")?;
                data = Some(Bytes::from(
                    into_opt_bytes(value).ok_or_else(|| bad("field d is not bytes".to_owned()))?,
                ));
            }
            _ => {}
        }
    }
    let missing = |field: &str| bad(format!("field {field} missing"));
    let kind = kind.ok_or_else(|| missing("k"))?;
    let (name, data) = match (kind, name, data) {
        (EventKind::Emitted, Some(name), Some(data)) => (Some(name), Some(data)),
        (EventKind::Emitted, None, _) => return Err(missing("n")),
        (EventKind::Emitted, _, None) => return Err(missing("d")),
        (_, None, None) => (None, None),
        (kind, _, _) => return Err(bad(format!("a name or data on a {kind} event"))),
    };
    Ok(Event {
        cursor,
        job: job.ok_or_else(|| missing("j"))?,
        queue: queue.ok_or_else(|| missing("q"))?,
        kind,
        attempt: attempt.ok_or_else(|| missing("a"))?,
        name,
        data,
        recorded_at: recorded_at.ok_or_else(|| missing("t"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(fields.iter().map(|text| bulk(text)).collect()),
        ])
    }

    fn reply(marker: Option<&str>, entries: Vec<Value>) -> Value {
        Value::Array(vec![marker.map_or(Value::Nil, bulk), Value::Array(entries)])
    }

    const ID: &str = "01890a5d-ac96-774b-bcce-b302099a8057";

    #[test]
    fn entries_decode_into_events_and_the_marker_into_trimmed() {
        let page = decode_page(
            EventCursor::new(5, 0),
            reply(
                Some("7-1"),
                vec![
                    entry(
                        "9-0",
                        &["j", ID, "q", "mail", "k", "started", "a", "2", "t", "-3"],
                    ),
                    entry(
                        "9-1",
                        &[
                            "j",
                            ID,
                            "q",
                            "",
                            "k",
                            "emitted",
                            "a",
                            "2",
                            "t",
                            "12",
                            "n",
                            "x.y",
                            "d",
                            "",
                            "z",
                            "a field of a later build",
                        ],
                    ),
                ],
            ),
        )
        .expect("readable");
        assert!(page.trimmed, "5-0 is older than the newest deleted, 7-1");
        assert_eq!(page.next, EventCursor::new(9, 1));
        let [started, emitted] = page.events.as_slice() else {
            panic!("two events: {:?}", page.events);
        };
        assert_eq!(started.kind, EventKind::Started);
        assert_eq!(started.job.to_string(), ID);
        assert_eq!((started.queue.as_str(), started.attempt), ("mail", 2));
        assert_eq!(started.recorded_at, Timestamp::from_millis(-3));
        assert_eq!(
            (started.name.as_deref(), started.data.as_ref()),
            (None, None)
        );
        assert_eq!(emitted.name.as_deref(), Some("x.y"));
        assert_eq!(emitted.data, Some(Bytes::new()));
        let empty =
            decode_page(EventCursor::new(7, 1), reply(Some("7-1"), Vec::new())).expect("readable");
        assert!(!empty.trimmed);
        assert_eq!(empty.next, EventCursor::new(7, 1));
    }

    #[test]
    fn a_range_starts_just_after_its_cursor() {
        assert_eq!(range_start(EventCursor::START), "-");
        assert_eq!(range_start(EventCursor::new(0, 1)), "0-2");
        assert_eq!(range_start(EventCursor::new(7, 3)), "7-4");
        assert_eq!(range_start(EventCursor::new(7, u64::MAX)), "8-0");
        let last = EventCursor::new(u64::MAX, u64::MAX);
        assert_eq!(range_start(last), format!("({last}"));
    }

    #[test]
    fn an_unreadable_entry_or_marker_is_corrupt() {
        let good = ["j", ID, "q", "q", "k", "failed", "a", "1", "t", "1"];
        let mut cases: Vec<(Option<&str>, Vec<Value>)> = vec![
            (Some("x"), Vec::new()),
            (Some("1-2-3"), Vec::new()),
            (None, vec![entry("one", &good)]),
            (None, vec![bulk("9-0")]),
        ];
        let broken: [&[&str]; 12] = [
            &["j", ID, "q", "q", "k", "failed", "a", "1"],
            &[
                "j",
                "not an id",
                "q",
                "q",
                "k",
                "failed",
                "a",
                "1",
                "t",
                "1",
            ],
            &["j", ID, "q", "q", "k", "exploded", "a", "1", "t", "1"],
            &["j", ID, "q", "q", "k", "failed", "a", "-1", "t", "1"],
            &["j", ID, "q", "q", "k", "failed", "a", "+1", "t", "1"],
            &[
                "j",
                ID,
                "q",
                "q",
                "k",
                "failed",
                "a",
                "4294967296",
                "t",
                "1",
            ],
            &["j", ID, "q", "q", "k", "failed", "a", "1", "t", "soon"],
            &[
                "j", ID, "q", "q", "k", "failed", "a", "1", "t", "1", "t", "2",
            ],
            &[
                "j", ID, "q", "q", "k", "emitted", "a", "1", "t", "1", "d", "",
            ],
            &[
                "j", ID, "q", "q", "k", "emitted", "a", "1", "t", "1", "n", "x",
            ],
            &[
                "j", ID, "q", "q", "k", "failed", "a", "1", "t", "1", "n", "x",
            ],
            &["j", ID, "q", "q", "k", "failed", "a", "1", "t"],
        ];
        for fields in broken {
            cases.push((None, vec![entry("9-0", fields)]));
        }
        for (marker, entries) in cases {
            let shown = format!("{marker:?} {entries:?}");
            let err =
                decode_page(EventCursor::START, reply(marker, entries)).expect_err("unreadable");
            assert!(matches!(err, Error::Corrupt { .. }), "{shown}: {err}");
        }
    }
}
