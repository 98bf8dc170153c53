//! The machine-readable result lines `cargo xtask bench` collects, and the small
//! statistics they need.

use std::time::Duration;

use serde_json::{Map, Value};

/// One result line: a flat JSON object on stdout, so `xtask` (std only) can read it
/// with a small parser. Every value is a string or a number.
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

/// The `q`-quantile (0..=1) of `sorted` by the nearest-rank method, 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds as a float.
pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&values, 1.0), 100.0);
        assert_eq!(quantile(&values, 0.0), 1.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn rate_of_nothing_is_zero() {
        assert_eq!(rate(10, Duration::ZERO), 0.0);
        assert_eq!(rate(10, Duration::from_millis(500)), 20.0);
    }
}
