//! The chaos suite's verdicts as the table `cargo xtask chaos` prints.

use std::collections::BTreeMap;

/// One row of the results table: the numbers of `durq-chaos check`'s verdict.
#[derive(Debug, Default)]
pub(super) struct Row {
    pub(super) backend: String,
    pub(super) passed: bool,
    pub(super) jobs: u64,
    pub(super) faults: u64,
    pub(super) fault_kinds: String,
    pub(super) connections_killed: u64,
    pub(super) store_errors_seen: u64,
    pub(super) lost: u64,
    pub(super) double: u64,
    pub(super) stale: u64,
    pub(super) stuck: u64,
    pub(super) other: u64,
    /// Leases of one concurrency key known to overlap (CONTRACT K1; 0 on backends
    /// without flow control, whose runs carry no keys).
    pub(super) limit_violations: u64,
    /// Jobs that waited for jobs (CONTRACT G1), and those claimed before a job they
    /// wait for had succeeded or left waiting (0 and 0 where no job waits).
    pub(super) dependent_jobs: u64,
    pub(super) dependency_violations: u64,
    /// Jobs that ran durable steps (CONTRACT D1, D2; 0 on a backend without them),
    /// the step works begun and the steps answered from a saved output.
    pub(super) step_jobs: u64,
    pub(super) step_runs: u64,
    pub(super) steps_replayed: u64,
    /// Steps run again, explained by a worker kill, a store fault, or a save that
    /// failed; and the step violations (a finished step run again, a rerun nothing
    /// explains, saved steps that disagree with the history).
    pub(super) step_reruns_kill: u64,
    pub(super) step_reruns_store: u64,
    pub(super) step_reruns_failed_save: u64,
    pub(super) step_violations: u64,
    /// Events read back from the stream, and the stream violations (CONTRACT V1, V2;
    /// 0 and 0 on a backend without the stream).
    pub(super) stream_events: u64,
    pub(super) stream_violations: u64,
    pub(super) extra_kill: u64,
    pub(super) extra_store: u64,
    pub(super) extra_unexplained: u64,
    pub(super) planned: u64,
    pub(super) worker_kills: u64,
    pub(super) claims_in_flight: u64,
    pub(super) runs_in_flight: u64,
    pub(super) throughput_faults: f64,
    pub(super) throughput_overall: f64,
    pub(super) drained: bool,
    pub(super) graceful: bool,
    pub(super) seconds: f64,
}

impl Row {
    pub(super) fn failures(&self) -> String {
        let mut parts = Vec::new();
        for (name, n) in [
            ("lost", self.lost),
            ("double completions", self.double),
            ("stale completions accepted", self.stale),
            ("stuck", self.stuck),
            ("unexplained extra runs", self.extra_unexplained),
            ("other violations", self.other),
            ("per-key limit violations", self.limit_violations),
            ("dependency violations", self.dependency_violations),
            ("durable step violations", self.step_violations),
            ("event stream violations", self.stream_violations),
        ] {
            if n > 0 {
                parts.push(format!("{n} {name}"));
            }
        }
        if !self.drained {
            parts.push("the queue did not drain in time".to_owned());
        }
        if !self.graceful {
            parts.push("a worker did not shut down gracefully".to_owned());
        }
        parts.join(", ")
    }
}

pub(super) fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| backend | jobs | faults | lost | double completions | stale accepted | stuck | jobs that waited: violations | step jobs: step runs / replayed; reruns after kill / store fault / failed save; violations | events: violations | extra runs: worker kill / store fault / unexplained | worker kills: claims / runs in flight | planned reruns | jobs/s under faults | jobs/s overall | verdict |\n\
         |---|---:|---|---:|---:|---:|---:|---|---|---|---|---|---:|---:|---:|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} ({}{}) | {} | {} | {} | {} | {}: {} | {}: {} / {}; {} / {} / {}; {} | {}: {} | {} / {} / {} | {} kills: {} / {} | {} | {:.0} | {:.0} | {} |\n",
            r.backend,
            r.jobs,
            r.faults,
            r.fault_kinds,
            if r.connections_killed > 0 {
                format!(
                    "; {} connections closed; {} failed store calls in workers",
                    r.connections_killed, r.store_errors_seen
                )
            } else {
                format!("; {} failed store calls in workers", r.store_errors_seen)
            },
            r.lost,
            r.double,
            r.stale,
            r.stuck,
            r.dependent_jobs,
            r.dependency_violations,
            r.step_jobs,
            r.step_runs,
            r.steps_replayed,
            r.step_reruns_kill,
            r.step_reruns_store,
            r.step_reruns_failed_save,
            r.step_violations,
            r.stream_events,
            r.stream_violations,
            r.extra_kill,
            r.extra_store,
            r.extra_unexplained,
            r.worker_kills,
            r.claims_in_flight,
            r.runs_in_flight,
            r.planned,
            r.throughput_faults,
            r.throughput_overall,
            if r.passed { "pass".to_owned() } else { format!("FAIL: {}", r.failures()) },
        ));
    }
    out
}

/// What the results table reads of `durq-chaos check`'s verdict (its JSON `Verdict`;
/// the fields not listed here are ignored).
#[derive(Debug, serde::Deserialize)]
pub(super) struct Verdict {
    pub(super) jobs: u64,
    /// Faults injected, by kind.
    #[serde(default)]
    pub(super) faults: BTreeMap<String, u64>,
    pub(super) connections_killed: u64,
    pub(super) store_errors_seen: u64,
    pub(super) lost: u64,
    pub(super) double_completions: u64,
    pub(super) stale_accepted: u64,
    pub(super) stuck: u64,
    pub(super) other_violations: u64,
    /// Absent from the verdicts of runs before flow control.
    #[serde(default)]
    pub(super) limit_violations: u64,
    /// Absent from the verdicts of runs before dependencies.
    #[serde(default)]
    pub(super) dependent_jobs: u64,
    #[serde(default)]
    pub(super) dependency_violations: u64,
    /// Absent from the verdicts of runs before durable steps.
    #[serde(default)]
    pub(super) step_jobs: u64,
    #[serde(default)]
    pub(super) step_runs: u64,
    #[serde(default)]
    pub(super) steps_replayed: u64,
    #[serde(default)]
    pub(super) step_reruns_after_kill: u64,
    #[serde(default)]
    pub(super) step_reruns_after_store_fault: u64,
    #[serde(default)]
    pub(super) step_reruns_after_failed_save: u64,
    #[serde(default)]
    pub(super) step_violations: u64,
    /// Absent from the verdicts of runs before the event stream.
    #[serde(default)]
    pub(super) stream_events: u64,
    #[serde(default)]
    pub(super) stream_violations: u64,
    pub(super) extra_runs_worker_kill: u64,
    pub(super) extra_runs_store_fault: u64,
    pub(super) extra_runs_unexplained: u64,
    pub(super) planned_reruns: u64,
    pub(super) worker_kills: u64,
    pub(super) claims_in_flight_at_kills: u64,
    pub(super) runs_in_flight_at_kills: u64,
    pub(super) throughput_under_faults: f64,
    pub(super) throughput_overall: f64,
    /// A few examples of each failure.
    #[serde(default)]
    pub(super) examples: Vec<String>,
}

impl Verdict {
    /// The verdict `durq-chaos check` printed.
    pub(super) fn parse(text: &str) -> Result<Verdict, String> {
        serde_json::from_str(text)
            .map_err(|err| format!("cannot read the verdict of durq-chaos check ({err}): {text}"))
    }
}

/// The table row of a verdict.
pub(super) fn row_from(verdict: &Verdict, backend: &str) -> Row {
    let kinds: Vec<String> = verdict
        .faults
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let mut row = Row {
        backend: backend.to_owned(),
        jobs: verdict.jobs,
        faults: verdict.faults.values().sum(),
        fault_kinds: kinds.join(", "),
        connections_killed: verdict.connections_killed,
        store_errors_seen: verdict.store_errors_seen,
        lost: verdict.lost,
        double: verdict.double_completions,
        stale: verdict.stale_accepted,
        stuck: verdict.stuck,
        other: verdict.other_violations,
        limit_violations: verdict.limit_violations,
        dependent_jobs: verdict.dependent_jobs,
        dependency_violations: verdict.dependency_violations,
        step_jobs: verdict.step_jobs,
        step_runs: verdict.step_runs,
        steps_replayed: verdict.steps_replayed,
        step_reruns_kill: verdict.step_reruns_after_kill,
        step_reruns_store: verdict.step_reruns_after_store_fault,
        step_reruns_failed_save: verdict.step_reruns_after_failed_save,
        step_violations: verdict.step_violations,
        stream_events: verdict.stream_events,
        stream_violations: verdict.stream_violations,
        extra_kill: verdict.extra_runs_worker_kill,
        extra_store: verdict.extra_runs_store_fault,
        extra_unexplained: verdict.extra_runs_unexplained,
        planned: verdict.planned_reruns,
        worker_kills: verdict.worker_kills,
        claims_in_flight: verdict.claims_in_flight_at_kills,
        runs_in_flight: verdict.runs_in_flight_at_kills,
        throughput_faults: verdict.throughput_under_faults,
        throughput_overall: verdict.throughput_overall,
        ..Row::default()
    };
    row.passed = row.lost == 0
        && row.double == 0
        && row.stale == 0
        && row.stuck == 0
        && row.other == 0
        && row.limit_violations == 0
        && row.dependency_violations == 0
        && row.step_violations == 0
        && row.stream_violations == 0
        && row.extra_unexplained == 0;
    row
}
