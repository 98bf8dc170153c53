//! Times, durations and rates as the pages write them; [`duration`] and [`relative`]
//! are the `durq` command line's too.

use std::time::Duration;

use durq::Timestamp;

/// `2026-05-01 12:34:56 UTC`.
pub(crate) fn timestamp(ts: Timestamp) -> String {
    match chrono::DateTime::from_timestamp_millis(ts.as_millis()) {
        Some(at) => at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        None => format!("{} ms after the epoch", ts.as_millis()),
    }
}

/// `12s ago`, `in 3m`, `now`: [`duration`] from `now` to `ts`.
pub fn relative(now: Timestamp, ts: Timestamp) -> String {
    let millis = now.as_millis().saturating_sub(ts.as_millis());
    let span = Duration::from_millis(millis.unsigned_abs());
    if span < Duration::from_secs(1) {
        "now".to_owned()
    } else if millis > 0 {
        format!("{} ago", duration(span))
    } else {
        format!("in {}", duration(span))
    }
}

/// A duration in its two largest units: `850ms`, `12s`, `3m 4s`, `15m`, `2h 5m`, `4d 3h`.
/// The one way both operator tools write a duration: the dashboard's pages, and the
/// `durq` command line's tables.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit} {small}{small_unit}")
        }
    };
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{secs}s"),
        60..3600 => two(secs / 60, "m", secs % 60, "s"),
        3600..86400 => two(secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => two(secs / 86400, "d", secs % 86400 / 3600, "h"),
    }
}

/// A number with at most three significant decimals, no trailing zeros: `0.25`,
/// `12.5`, `1200`.
pub(crate) fn number(value: f64) -> String {
    if !value.is_finite() {
        return "–".to_owned();
    }
    let text = if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_well() {
        let at = Timestamp::from_millis(1_777_000_000_000);
        assert_eq!(timestamp(at), "2026-04-24 03:06:40 UTC");
        let later = Timestamp::from_millis(1_777_000_012_500);
        assert_eq!(relative(later, at), "12s ago");
        assert_eq!(relative(at, later), "in 12s");
        assert_eq!(relative(at, at), "now");
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_secs(184)), "3m 4s");
        assert_eq!(duration(Duration::from_secs(900)), "15m");
        assert_eq!(duration(Duration::from_secs(3600)), "1h");
        assert_eq!(duration(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(duration(Duration::from_secs(4 * 86400 + 3 * 3600)), "4d 3h");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(12.5), "12.5");
        assert_eq!(number(1200.4), "1200");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(f64::NAN), "–");
    }
}
