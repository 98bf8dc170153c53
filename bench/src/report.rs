//! The machine-readable result lines `cargo xtask bench` collects, and the statistics
//! they need: rates, and latency quantiles from an HDR histogram.

use std::time::Duration;

use hdrhistogram::{CreationError, Histogram};
use serde_json::{Map, Value};

/// One result line: a flat JSON object on stdout, which `xtask` reads with serde_json.
/// Its numbers are the metrics of the report's tables; its strings describe the run.
#[derive(Debug, Default)]
pub struct Line {
    fields: Map<String, Value>,
}

impl Line {
    /// A line for `workload` on `backend`, measured on our implementation.
    pub fn new(workload: &str, backend: &str) -> Self {
        Line::default()
            .text("impl", "jobs")
            .text("workload", workload)
            .text("backend", backend)
    }

    /// Adds a string field.
    pub fn text(mut self, key: &str, value: impl Into<String>) -> Self {
        self.fields
            .insert(key.to_owned(), Value::String(value.into()));
        self
    }

    /// Adds a numeric field (NaN and infinities become 0, which JSON cannot hold).
    pub fn num(mut self, key: &str, value: f64) -> Self {
        let number = serde_json::Number::from_f64(value).unwrap_or_else(|| 0.into());
        self.fields.insert(key.to_owned(), Value::Number(number));
        self
    }

    /// Adds an integer field.
    pub fn int(mut self, key: &str, value: u64) -> Self {
        self.fields.insert(key.to_owned(), Value::from(value));
        self
    }

    /// Adds every field of `other`.
    pub fn merge(mut self, other: Line) -> Self {
        self.fields.extend(other.fields);
        self
    }

    /// Prints the line on stdout.
    pub fn emit(self) {
        println!("{}", Value::Object(self.fields));
    }
}

/// Jobs per second for `count` jobs in `elapsed`.
pub fn rate(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    count as f64 / secs
}

/// Significant decimal digits the latency histograms keep: a quantile is within 0.1% of
/// the sample it stands for, finer than the report's three decimals of a millisecond.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Nanoseconds in a millisecond: the histograms count whole nanoseconds.
const NANOS_PER_MILLI: f64 = 1_000_000.0;

/// The longest latency a histogram tells apart, in nanoseconds: an hour, far past any
/// run's time limit. A longer one counts as an hour.
const HIGHEST_NANOS: u64 = 3_600 * 1_000_000_000;

/// The latencies `millis` (in milliseconds, in any order) as an HDR histogram of
/// nanoseconds.
fn histogram(millis: &[f64]) -> Result<Histogram<u64>, CreationError> {
    let mut histogram = Histogram::new_with_max(HIGHEST_NANOS, SIGNIFICANT_DIGITS)?;
    for &ms in millis {
        // A float-to-integer `as` saturates: a negative (or NaN) latency counts as 0;
        // the histogram clamps one above HIGHEST_NANOS.
        histogram.saturating_record((ms * NANOS_PER_MILLI).round() as u64);
    }
    Ok(histogram)
}

/// The `q`-quantile (0..=1) of the latencies `millis`, in milliseconds, by the
/// nearest-rank method of an HDR histogram (within 0.1%); 0 when there are none.
pub fn quantile(millis: &[f64], q: f64) -> f64 {
    match histogram(millis) {
        Ok(histogram) if !histogram.is_empty() => {
            histogram.value_at_quantile(q) as f64 / NANOS_PER_MILLI
        }
        // No samples. (Creating the histogram fails only for bounds or a precision
        // out of range, and the constants are in range.)
        _ => 0.0,
    }
}

/// Milliseconds as a float.
pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `got` is `want` within the histogram's precision.
    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= want.abs() * 1e-3
    }

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        for (q, want) in [(0.5, 50.0), (0.99, 99.0), (1.0, 100.0), (0.0, 1.0)] {
            let got = quantile(&values, q);
            assert!(close(got, want), "q {q}: {got}, not {want}");
        }
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn quantiles_keep_microseconds_and_clamp_negatives() {
        // Pickup latencies of a fast backend are tens of microseconds.
        let values = [0.042, 0.050, 0.051, 0.300, 12.5];
        assert!(close(quantile(&values, 0.5), 0.051));
        assert!(close(quantile(&values, 1.0), 12.5));
        assert_eq!(quantile(&[0.0, -1.0], 1.0), 0.0);
        // An hour is the longest latency told apart; a longer one counts as an hour.
        assert!(close(quantile(&[3_600_000.0], 0.5), 3_600_000.0));
        assert!(close(quantile(&[7_200_000.0], 0.5), 3_600_000.0));
    }

    #[test]
    fn rate_of_nothing_is_zero() {
        assert_eq!(rate(10, Duration::ZERO), 0.0);
        assert_eq!(rate(10, Duration::from_millis(500)), 20.0);
    }
}
