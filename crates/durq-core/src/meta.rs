//! What a job carries for the people and tools around it, not for the store: its tags
//! (CONTRACT E11) and the trace context of the request that enqueued it (E12).

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::validate::validate_name;

/// A job's tags: a small map of strings, for filtering and for people to read
/// (`list` filters by them, CONTRACT A4). Sorted by key.
pub type Tags = BTreeMap<String, String>;

/// The most tags one job carries.
pub const MAX_TAGS: usize = 16;
/// The longest tag key, in bytes; keys are `[A-Za-z0-9._:-]`.
pub const MAX_TAG_KEY_BYTES: usize = 64;
/// The longest tag value, in bytes; any UTF-8 without control characters.
pub const MAX_TAG_VALUE_BYTES: usize = 256;

/// Checks a set of tags (CONTRACT E11): at most [`MAX_TAGS`], keys 1..=64 bytes of
/// `[A-Za-z0-9._:-]`, values 0..=256 bytes without control characters.
pub fn validate_tags(field: &'static str, tags: &Tags) -> Result<()> {
    if tags.len() > MAX_TAGS {
        return Err(Error::invalid(
            field,
            format!("{} tags, the limit is {MAX_TAGS}", tags.len()),
        ));
    }
    for (key, value) in tags {
        validate_name(field, key, MAX_TAG_KEY_BYTES)?;
        if value.len() > MAX_TAG_VALUE_BYTES {
            return Err(Error::invalid(
                field,
                format!(
                    "the value of {key} is {} bytes, the limit is {MAX_TAG_VALUE_BYTES}",
                    value.len()
                ),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(Error::invalid(
                field,
                format!("the value of {key} holds a control character"),
            ));
        }
    }
    Ok(())
}

/// The text a backend stores for a job's tags: a JSON object, keys sorted; `None` for
/// no tags, so a job without tags stores nothing.
pub fn encode_tags(tags: &Tags) -> Option<String> {
    if tags.is_empty() {
        return None;
    }
    // A map of strings always encodes; the fallback is never taken.
    serde_json::to_string(tags).ok()
}

/// Reads back what [`encode_tags`] stored; a backend reports an error as a corrupt
/// record.
pub fn decode_tags(text: &str) -> std::result::Result<Tags, String> {
    serde_json::from_str(text).map_err(|err| format!("tags are not a JSON map of strings: {err}"))
}

/// Checks a trace context (CONTRACT E12): a W3C `traceparent` of version `00`,
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lower case, neither id all
/// zeros.
pub fn validate_trace_context(traceparent: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid(
            "trace_context",
            format!("is not a W3C traceparent (00-<trace id>-<parent id>-<flags>): {why}"),
        ))
    };
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace_id, parent_id, flags] = parts.as_slice() else {
        return bad("it has not four fields");
    };
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if *version != "00" {
        return bad("only version 00 is known");
    }
    if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
        return bad("the trace id must be 32 lower-case hex digits, not all zero");
    }
    if !hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
        return bad("the parent id must be 16 lower-case hex digits, not all zero");
    }
    if !hex(flags, 2) {
        return bad("the flags must be 2 lower-case hex digits");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_none_stores_nothing() {
        let mut tags = Tags::new();
        assert_eq!(encode_tags(&tags), None);
        tags.insert("customer".into(), "ünïcode \"quoted\"".into());
        tags.insert("a.b:c-d".into(), String::new());
        let text = encode_tags(&tags).unwrap_or_default();
        assert_eq!(decode_tags(&text), Ok(tags));
        assert!(decode_tags("[1]").is_err());
    }

    #[test]
    fn tags_are_checked() {
        let one = |k: &str, v: &str| Tags::from([(k.to_owned(), v.to_owned())]);
        assert!(validate_tags("tags", &one("ok", "any value ✓")).is_ok());
        assert!(validate_tags("tags", &one("", "v")).is_err());
        assert!(validate_tags("tags", &one("a b", "v")).is_err());
        assert!(validate_tags("tags", &one("k", "line\nbreak")).is_err());
        assert!(validate_tags("tags", &one("k", &"x".repeat(257))).is_err());
        assert!(validate_tags("tags", &one(&"k".repeat(65), "v")).is_err());
        let many: Tags = (0..17).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(validate_tags("tags", &many).is_err());
    }

    #[test]
    fn trace_contexts_are_w3c_traceparents() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(validate_trace_context(good).is_ok());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(validate_trace_context(bad).is_err(), "{bad:?} is refused");
        }
    }
}
