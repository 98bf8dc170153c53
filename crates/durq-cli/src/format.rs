//! How values are written for people: times in RFC 3339 UTC, ages like `3m 12s`,
//! aligned tables, and payloads shown as pretty JSON, escaped text or a hex dump.

use std::time::Duration;

use comfy_table::{presets, CellAlignment, Table};
use durq::Timestamp;
use serde::Serialize;
use serde_json::value::RawValue;

/// `ts` in RFC 3339, UTC, to the second: `2026-05-01T09:30:00Z`.
pub fn time(ts: Timestamp) -> String {
    rfc3339(ts, chrono::SecondsFormat::Secs)
}

/// `ts` in RFC 3339, UTC, to the millisecond: what JSON output carries.
pub fn time_ms(ts: Timestamp) -> String {
    rfc3339(ts, chrono::SecondsFormat::Millis)
}

fn rfc3339(ts: Timestamp, precision: chrono::SecondsFormat) -> String {
    match chrono::DateTime::from_timestamp_millis(ts.as_millis()) {
        Some(time) => time.to_rfc3339_opts(precision, true),
        // Beyond chrono's years: still an honest answer.
        None => format!("{}ms since the epoch", ts.as_millis()),
    }
}

/// An optional time, `-` when absent.
pub fn maybe_time(ts: Option<Timestamp>) -> String {
    ts.map_or_else(|| "-".to_owned(), time)
}

/// A duration in its two largest units, as the dashboard writes it: `450ms`, `12s`,
/// `3m 12s`, `2h 5m`, `3d 4h`.
pub fn age(d: Duration) -> String {
    durq_dashboard::format::duration(d)
}

/// How long ago `then` was, at `now`; `in 5m` for a time still to come.
pub fn ago(then: Timestamp, now: Timestamp) -> String {
    if then > now {
        format!("in {}", age(then.duration_since(now)))
    } else {
        format!("{} ago", age(now.duration_since(then)))
    }
}

/// A table of `headers` over `rows`, columns aligned, numbers right-aligned, no
/// borders: each line `grep`s and `awk`s as it is. `numeric` lists the columns to
/// align right.
pub fn table(headers: &[&str], numeric: &[usize], rows: Vec<Vec<String>>) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_header(headers.to_vec());
    table.add_rows(rows);
    let last = headers.len().saturating_sub(1);
    for (index, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, if index == last { 0 } else { 2 }));
        if numeric.contains(&index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut text = table.trim_fmt();
    text.push('\n');
    text
}

/// `key: value` lines, the keys aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .map(|(key, value)| format!("{:width$} {value}\n", format!("{key}:")))
        .collect()
}

/// `text` cut to `max` characters, with `…` when cut; line breaks become spaces.
pub fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The most bytes of a binary payload `durq inspect` dumps in hex (`--json` has all).
pub const HEX_DUMP_LIMIT: usize = 4096;

/// A payload (or result) as it is shown: what kind of bytes they are decides how.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// No bytes.
    Empty,
    /// Valid JSON.
    Json(&'a RawValue),
    /// UTF-8 that is not JSON.
    Text(&'a str),
    /// Anything else.
    Binary(&'a [u8]),
}

impl<'a> Payload<'a> {
    /// Looks at `bytes`.
    pub fn of(bytes: &'a [u8]) -> Self {
        if bytes.is_empty() {
            return Payload::Empty;
        }
        if let Ok(json) = serde_json::from_slice::<&RawValue>(bytes) {
            return Payload::Json(json);
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => Payload::Text(text),
            Err(_) => Payload::Binary(bytes),
        }
    }

    /// For people: pretty JSON in its own key order, escaped text in quotes, or a hex
    /// dump of at most [`HEX_DUMP_LIMIT`] bytes. Always ends with a line break.
    pub fn human(self) -> String {
        match self {
            Payload::Empty => "(empty)\n".to_owned(),
            Payload::Json(json) => {
                let mut out = Vec::new();
                let mut reader = serde_json::Deserializer::from_str(json.get());
                let mut writer = serde_json::Serializer::pretty(&mut out);
                match serde_transcode::transcode(&mut reader, &mut writer) {
                    Ok(()) => format!("{}\n", String::from_utf8_lossy(&out)),
                    // Valid JSON transcodes; should it not, show it as it came.
                    Err(_) => format!("{}\n", json.get()),
                }
            }
            Payload::Text(text) => format!("\"{}\"\n", text.escape_debug()),
            Payload::Binary(bytes) => hex_dump(bytes),
        }
    }

    /// For programs: the bytes exactly, with the way they are encoded.
    pub fn json(self) -> PayloadJson<'a> {
        match self {
            Payload::Empty => PayloadJson::Empty,
            Payload::Json(json) => PayloadJson::Json { json },
            Payload::Text(text) => PayloadJson::Text { text },
            Payload::Binary(bytes) => PayloadJson::Hex {
                hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            },
        }
    }
}

/// A payload in JSON output: `{"encoding": "json", "json": …}`, `{"encoding": "text",
/// "text": "…"}`, `{"encoding": "hex", "hex": "…"}` or `{"encoding": "empty"}`.
#[derive(Debug, Serialize)]
#[serde(tag = "encoding", rename_all = "lowercase")]
pub enum PayloadJson<'a> {
    /// No bytes.
    Empty,
    /// The JSON, as stored.
    Json {
        /// The value.
        json: &'a RawValue,
    },
    /// UTF-8 text.
    Text {
        /// The text.
        text: &'a str,
    },
    /// Other bytes, in lower-case hex.
    Hex {
        /// The bytes.
        hex: String,
    },
}

/// `xxd`-style lines: offset, 16 bytes in hex, and the printable ones.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (line, chunk) in bytes.chunks(16).take(HEX_DUMP_LIMIT / 16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let shown: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    char::from(b)
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  {shown}\n",
            line * 16,
            hex.join(" ")
        ));
    }
    if bytes.len() > HEX_DUMP_LIMIT {
        out.push_str(&format!(
            "… {} more bytes (--json shows them all)\n",
            bytes.len() - HEX_DUMP_LIMIT
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_show_their_two_largest_units() {
        assert_eq!(age(Duration::from_millis(450)), "450ms");
        assert_eq!(age(Duration::from_secs(12)), "12s");
        assert_eq!(age(Duration::from_secs(192)), "3m 12s");
        assert_eq!(age(Duration::from_secs(2 * 3600 + 5 * 60 + 9)), "2h 5m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 4h");
        let now = Timestamp::from_millis(1_000_000);
        assert_eq!(ago(Timestamp::from_millis(940_000), now), "1m ago");
        assert_eq!(ago(Timestamp::from_millis(1_005_000), now), "in 5s");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        let ts = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(time(ts), "2023-11-14T22:13:20Z");
        assert_eq!(time_ms(ts), "2023-11-14T22:13:20.123Z");
        assert_eq!(maybe_time(None), "-");
    }

    #[test]
    fn tables_align_and_trim() {
        let text = table(
            &["QUEUE", "READY"],
            &[1],
            vec![
                vec!["emails".into(), "3".into()],
                vec!["q".into(), "120".into()],
            ],
        );
        assert_eq!(text, "QUEUE   READY\nemails      3\nq         120\n");
    }

    #[test]
    fn payloads_show_as_what_they_are() {
        let json = br#"{"to":"ada","n":[1,2],"a":1}"#;
        assert_eq!(
            Payload::of(json).human(),
            "{\n  \"to\": \"ada\",\n  \"n\": [\n    1,\n    2\n  ],\n  \"a\": 1\n}\n",
            "pretty, in the payload's own key order"
        );
        let exact = serde_json::to_string(&Payload::of(json).json()).expect("json");
        assert_eq!(
            exact,
            r#"{"encoding":"json","json":{"to":"ada","n":[1,2],"a":1}}"#
        );
        assert_eq!(Payload::of(b"hi\tthere\n").human(), "\"hi\\tthere\\n\"\n");
        assert_eq!(Payload::of(b"").human(), "(empty)\n");
        let binary = [0u8, 159, 146, 150, b'A'];
        assert_eq!(
            Payload::of(&binary).human(),
            format!("00000000  {:<47}  ....A\n", "00 9f 92 96 41")
        );
        let hex = serde_json::to_string(&Payload::of(&binary).json()).expect("json");
        assert_eq!(hex, r#"{"encoding":"hex","hex":"009f929641"}"#);
        let big = vec![0xffu8; HEX_DUMP_LIMIT + 10];
        assert!(Payload::of(&big)
            .human()
            .ends_with("… 10 more bytes (--json shows them all)\n"));
    }

    #[test]
    fn clipping_keeps_one_line() {
        assert_eq!(clip("a\nb", 10), "a b");
        assert_eq!(clip("abcdef", 4), "abc…");
    }
}
