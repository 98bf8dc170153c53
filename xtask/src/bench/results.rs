//! The figures a benchmark collects: each run's result line, and the table of cells
//! (values per run, or why a run failed) the report shows as medians.

use std::collections::{BTreeMap, BTreeSet};

/// One measurement (or failure) as a bench binary reported it: the JSON object of its
/// result line.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    fields: serde_json::Map<String, serde_json::Value>,
}

impl Sample {
    /// The result in `line`, if it is a JSON object (a binary may print other lines).
    pub(super) fn parse(line: &str) -> Result<Sample, serde_json::Error> {
        serde_json::from_str(line.trim()).map(|fields| Sample { fields })
    }
    /// The number under `key`, if it is one.
    pub(super) fn num(&self, key: &str) -> Option<f64> {
        self.fields.get(key).and_then(serde_json::Value::as_f64)
    }
    /// The string under `key`, if it is one.
    pub(super) fn text(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(serde_json::Value::as_str)
    }
    /// The numeric fields: the metrics of the table. Strings, booleans and the rest
    /// describe the run and are not tabulated.
    pub(super) fn metrics(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.fields
            .iter()
            .filter_map(|(key, value)| Some((key.as_str(), value.as_f64()?)))
    }
}

/// What a cell of the table is made of: the values of each run, or why it failed.
#[derive(Debug, Default, Clone)]
pub(super) struct Cell {
    pub(super) values: Vec<f64>,
    pub(super) failures: Vec<String>,
}

impl Cell {
    /// The median of the runs: the figure the report shows (a few runs, not samples
    /// of a distribution).
    pub(super) fn median(&self) -> Option<f64> {
        median(self.values.clone())
    }
    /// The range of the runs.
    pub(super) fn min_max(&self) -> Option<(f64, f64)> {
        let min = self.values.iter().copied().min_by(f64::total_cmp)?;
        let max = self.values.iter().copied().max_by(f64::total_cmp)?;
        Some((min, max))
    }
    /// Whether every run of the cell failed.
    pub(super) fn failed(&self) -> bool {
        self.values.is_empty() && !self.failures.is_empty()
    }

    /// This cell against `other`, where each run measured the two back to back: the
    /// median of the runs' ratios, which the machine's drift from one run to the next
    /// moves less than the ratio of the medians does. Where a run of either failed, the
    /// runs no longer pair up and the ratio of the medians is all there is.
    pub(super) fn ratio_per_run(&self, other: &Cell) -> Option<f64> {
        let paired = self.failures.is_empty()
            && other.failures.is_empty()
            && self.values.len() == other.values.len();
        if !paired {
            let (a, b) = (self.median()?, other.median()?);
            return (b > 0.0).then(|| a / b);
        }
        median(
            self.values
                .iter()
                .zip(&other.values)
                .filter(|(_, b)| **b > 0.0)
                .map(|(a, b)| a / b)
                .collect(),
        )
    }
}

/// The median of some figures (the mean of the middle two of an even count).
pub(super) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// Key of a cell: (impl, backend, workload, jobs, metric).
type Key = (String, String, String, u64, String);

/// Every figure of one `cargo xtask bench`.
#[derive(Default)]
pub(super) struct Results {
    cells: BTreeMap<Key, Cell>,
    /// (impl or note, backend) → text: server versions and apalis fallback sizes.
    pub(super) info: BTreeMap<(String, String), String>,
    /// (backend, workload, jobs) of apalis measurements run once for taking too long.
    pub(super) slow_peers: BTreeSet<(String, String, u64)>,
}

impl Results {
    /// The cell of a metric, empty if nothing was recorded for it.
    pub(super) fn cell(
        &self,
        imp: &str,
        backend: &str,
        workload: &str,
        jobs: u64,
        metric: &str,
    ) -> Cell {
        self.cells
            .get(&(
                imp.to_owned(),
                backend.to_owned(),
                workload.to_owned(),
                jobs,
                metric.to_owned(),
            ))
            .cloned()
            .unwrap_or_default()
    }

    /// Adds one run's outcome: each numeric field of its result line is a metric; a
    /// failure counts against the cell's `value`.
    pub(super) fn record(
        &mut self,
        imp: &str,
        backend: &str,
        workload: &str,
        jobs: u64,
        outcome: &Outcome,
    ) {
        let key = |metric: &str| {
            (
                imp.to_owned(),
                backend.to_owned(),
                workload.to_owned(),
                jobs,
                metric.to_owned(),
            )
        };
        match outcome {
            Outcome::Ok(sample) => {
                for (metric, value) in sample.metrics() {
                    self.cells
                        .entry(key(metric))
                        .or_default()
                        .values
                        .push(value);
                }
            }
            Outcome::Failed(message) => {
                self.cells
                    .entry(key("value"))
                    .or_default()
                    .failures
                    .push(message.clone());
            }
        }
    }

    /// Remembers the size apalis survived for `workload` after failing at the
    /// comparison size.
    pub(super) fn note_peer_fallback(&mut self, backend: &str, workload: &str, size: u64) {
        self.info.insert(
            (format!("fallback:{workload}"), backend.to_owned()),
            size.to_string(),
        );
    }

    /// The size noted by [`Self::note_peer_fallback`], if any.
    pub(super) fn peer_fallback(&self, backend: &str, workload: &str) -> Option<u64> {
        self.info
            .get(&(format!("fallback:{workload}"), backend.to_owned()))
            .and_then(|s| s.parse().ok())
    }
}

/// What one run of a workload came to.
pub(super) enum Outcome {
    Ok(Sample),
    Failed(String),
}

impl Outcome {
    /// Whether the run reported a result.
    pub(super) fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_result_lines() {
        let line = r#"{"backend":"redis","impl":"jobs","jobs":100000,"value":61234.5,"vacuum":true,"error":"a \"quoted\" \u00e9"}"#;
        let sample = Sample::parse(line).expect("valid line");
        assert_eq!(sample.text("backend"), Some("redis"));
        assert_eq!(sample.num("jobs"), Some(100_000.0));
        assert_eq!(sample.num("value"), Some(61_234.5));
        assert_eq!(sample.text("error"), Some("a \"quoted\" é"));
        // Only numbers are metrics; a boolean no longer makes the line unreadable.
        let mut metrics: Vec<(&str, f64)> = sample.metrics().collect();
        metrics.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(metrics, [("jobs", 100_000.0), ("value", 61_234.5)]);
        assert!(Sample::parse("not json").is_err());
        assert!(Sample::parse(r#"{"a":1"#).is_err());
        assert!(Sample::parse("[1, 2]").is_err());
    }

    #[test]
    fn medians_and_ranges() {
        let cell = Cell {
            values: vec![3.0, 1.0, 2.0],
            failures: vec![],
        };
        assert_eq!(cell.median(), Some(2.0));
        assert_eq!(cell.min_max(), Some((1.0, 3.0)));
        let even = Cell {
            values: vec![4.0, 1.0],
            failures: vec![],
        };
        assert_eq!(even.median(), Some(2.5));
    }

    #[test]
    fn ratios_pair_the_runs_unless_one_failed() {
        let fitted = Cell {
            values: vec![80.0, 45.0, 90.0],
            failures: vec![],
        };
        let plain = Cell {
            values: vec![100.0, 50.0, 120.0],
            failures: vec![],
        };
        // Runs 0.8, 0.9, 0.75: their median, not 80 / 100.
        assert_eq!(fitted.ratio_per_run(&plain), Some(0.8));
        let with_a_failure = Cell {
            values: vec![100.0, 120.0],
            failures: vec!["killed".into()],
        };
        assert_eq!(fitted.ratio_per_run(&with_a_failure), Some(80.0 / 110.0));
        assert_eq!(fitted.ratio_per_run(&Cell::default()), None);
    }
}
