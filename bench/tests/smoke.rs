//! Runs every workload of the `durq-bench` binary at a small size on the backends that
//! need no server, and checks each prints one well-formed result: the harness behind
//! `cargo xtask bench` must keep working between benchmark runs. No timing is asserted.

use std::process::Command;

use serde_json::Value;

const WORKLOADS: &[(&str, &[&str])] = &[
    ("enqueue-one", &["--jobs", "300"]),
    (
        "enqueue-batch",
        &["--jobs", "300", "--enqueue-batch", "100"],
    ),
    ("e2e-backlog", &["--jobs", "300"]),
    ("e2e-backlog", &["--jobs", "300", "--driver", "loop"]),
    ("e2e-producer", &["--jobs", "300", "--enqueue-batch", "50"]),
    ("e2e-graphs", &["--jobs", "300", "--enqueue-batch", "50"]),
    ("latency", &["--jobs", "50", "--rate", "1000"]),
    ("reclaim", &["--jobs", "300"]),
];

fn run(workload: &str, backend: &str, args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_durq-bench"))
        .arg(workload)
        .args(["--backend", backend, "--stall-secs", "30"])
        .args(args)
        .output()
        .expect("the durq-bench binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{workload} on {backend} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one result line, got {stdout:?}");
    serde_json::from_str(lines[0]).expect("the result line is JSON")
}

fn check_backend(backend: &str) {
    for (workload, args) in WORKLOADS {
        let result = run(workload, backend, args);
        assert_eq!(result["workload"], *workload);
        assert_eq!(result["backend"], backend);
        assert_eq!(result["impl"], "jobs");
        assert!(result.get("error").is_none(), "{result}");
        let value = result["value"].as_f64().expect("a numeric value");
        match *workload {
            // Latencies and reclaim times may round to zero on a fast machine.
            "latency" | "latency-tx" => {
                let p50 = result["p50_ms"].as_f64().expect("p50");
                let p99 = result["p99_ms"].as_f64().expect("p99");
                assert!(p50 >= 0.0 && p99 >= p50, "{result}");
            }
            "reclaim" => assert!(value >= 0.0, "{result}"),
            _ => assert!(value > 0.0, "a throughput above zero: {result}"),
        }
        if *workload == "e2e-graphs" {
            // 300 jobs are 25 graphs of 12, all drained: the root, the ten after it,
            // and the one after those.
            assert_eq!(result["jobs"], 300, "{result}");
            assert_eq!(result["drained"], 300, "{result}");
        }
        if workload.starts_with("e2e") {
            assert!(
                result["client_cpu_us_per_job"].as_f64().is_some(),
                "the CPU counter is reported: {result}"
            );
        }
    }
}

#[cfg(feature = "memory")]
#[test]
fn every_workload_reports_on_memory() {
    check_backend("memory");
}

#[cfg(feature = "sqlite")]
#[test]
fn every_workload_reports_on_sqlite() {
    check_backend("sqlite");
    // Jobs enqueued in the caller's own transactions: only the SQL backends have them.
    let result = run("latency-tx", "sqlite", &["--jobs", "50", "--rate", "1000"]);
    assert_eq!(result["workload"], "latency-tx");
    assert!(result.get("error").is_none(), "{result}");
    for field in ["p50_ms", "p99_ms", "max_ms", "value", "rate", "concurrency"] {
        assert!(result[field].as_f64().is_some(), "{field} in {result}");
    }
    assert_eq!(result["unit"], "ms");
}

/// A backend without transactions refuses `latency-tx`, saying why, instead of
/// measuring plain enqueues under its name.
#[cfg(feature = "memory")]
#[test]
fn latency_tx_is_refused_without_transactions() {
    let output = Command::new(env!("CARGO_BIN_EXE_durq-bench"))
        .args(["latency-tx", "--backend", "memory", "--jobs", "10"])
        .output()
        .expect("the durq-bench binary runs");
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    let error = result["error"].as_str().expect("an error field");
    assert!(
        error.contains("transaction") && error.contains("memory"),
        "{error}"
    );
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    let output = Command::new(env!("CARGO_BIN_EXE_durq-bench"))
        .args(["e2e-backlog", "--backend", "memory", "--jobs", "0"])
        .output()
        .expect("the durq-bench binary runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("positive integer"));
    let output = Command::new(env!("CARGO_BIN_EXE_durq-bench"))
        .args(["nonsense", "--backend", "memory"])
        .output()
        .expect("the durq-bench binary runs");
    assert_eq!(output.status.code(), Some(2));
    // An unknown workload is named, with the workloads there are.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("'nonsense'") && stderr.contains("e2e-backlog"),
        "{stderr}"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_durq-bench"))
        .args(["e2e-backlog", "--jobs", "10"])
        .output()
        .expect("the durq-bench binary runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--backend"));
}
