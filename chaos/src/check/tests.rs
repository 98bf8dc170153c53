//! The verdicts of recorded histories: what a history must show to pass, and what
//! fails it.

use super::*;

fn id(n: i64) -> JobId {
    JobId::mint(durq::Timestamp::from_millis(1_000 + n))
}

fn worker(pid: u32, events: Vec<Event>) -> ProcessHistory {
    ProcessHistory {
        role: "worker".into(),
        pid,
        events,
        bad_lines: 0,
        bad_inner_line: false,
    }
}

fn claim(t: u64, id: JobId, token: u64) -> Event {
    Event::Claim { t, id, token }
}

fn start(t: u64, id: JobId, token: u64) -> Event {
    Event::RunStart {
        t,
        id,
        token,
        attempt: 1,
    }
}

fn outcome(t: u64, op: Op, id: JobId, token: u64, ok: bool) -> Event {
    Event::Outcome {
        t0: t,
        t: t + 1,
        op,
        id,
        token,
        ok,
        lease_lost: !ok,
        err: None,
    }
}

fn kill(t: u64, pid: u32) -> Fault {
    Fault {
        t,
        kind: "kill_worker".into(),
        pid: Some(pid),
        end: None,
        hits: None,
    }
}

#[test]
fn a_rerun_after_a_kill_is_explained_and_counted_in_flight() {
    let a = id(1);
    let histories = vec![
        worker(10, vec![claim(100, a, 1), start(110, a, 1)]),
        worker(
            11,
            vec![
                claim(5_000_000, a, 2),
                start(5_000_010, a, 2),
                outcome(5_000_100, Op::Complete, a, 2, true),
            ],
        ),
    ];
    let verdict = judge_history("t", &histories, &[kill(200, 10)]);
    assert_eq!(verdict.extra_runs_worker_kill, 1);
    assert_eq!(
        (
            verdict.claims_in_flight_at_kills,
            verdict.runs_in_flight_at_kills
        ),
        (1, 1)
    );
    assert!(verdict.passed(), "{verdict:?}");
}

#[test]
fn a_rerun_with_no_kill_and_no_fault_is_unexplained() {
    let a = id(2);
    let histories = vec![
        worker(
            10,
            vec![
                claim(100, a, 1),
                start(110, a, 1),
                outcome(200, Op::Complete, a, 1, false),
            ],
        ),
        worker(
            11,
            vec![
                claim(5_000_000, a, 2),
                start(5_000_010, a, 2),
                outcome(5_000_100, Op::Complete, a, 2, true),
            ],
        ),
    ];
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!(verdict.extra_runs_unexplained, 1);
    assert!(!verdict.passed());
    let faulted = judge_history(
        "t",
        &histories,
        &[Fault {
            t: 3_000_000,
            kind: "pg_terminate".into(),
            pid: None,
            end: None,
            hits: Some(1),
        }],
    );
    assert_eq!(
        (
            faulted.extra_runs_store_fault,
            faulted.extra_runs_unexplained
        ),
        (1, 0)
    );
}

#[test]
fn planned_retries_are_not_extra() {
    let a = id(3);
    let histories = vec![worker(
        10,
        vec![
            claim(100, a, 1),
            start(110, a, 1),
            outcome(120, Op::Fail, a, 1, true),
            claim(300, a, 2),
            start(310, a, 2),
            outcome(320, Op::Complete, a, 2, true),
        ],
    )];
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!((verdict.planned_reruns, verdict.runs), (1, 2));
    assert!(verdict.passed(), "{verdict:?}");
}

#[test]
fn stale_and_double_completions_are_caught() {
    let a = id(4);
    let histories = vec![
        worker(
            10,
            vec![
                claim(100, a, 1),
                start(110, a, 1),
                outcome(9_000, Op::Complete, a, 1, true),
            ],
        ),
        worker(
            11,
            vec![
                claim(5_000, a, 2),
                start(5_010, a, 2),
                outcome(6_000, Op::Complete, a, 2, true),
            ],
        ),
    ];
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!(verdict.double_completions, 1);
    assert_eq!(verdict.stale_accepted, 1);
    assert!(!verdict.passed());
}

#[test]
fn a_reused_token_and_a_twice_run_claim_are_violations() {
    let a = id(5);
    let histories = vec![
        worker(
            10,
            vec![claim(100, a, 1), start(110, a, 1), start(120, a, 1)],
        ),
        worker(11, vec![claim(200, a, 1)]),
    ];
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!(verdict.other_violations, 2);
}

#[test]
fn leases_of_one_key_known_to_overlap_are_limit_violations() {
    let (a, b, c, d, e, f) = (id(1), id(2), id(3), id(4), id(5), id(6));
    let histories = vec![
        worker(
            10,
            vec![
                claim(100, a, 1),
                outcome(200, Op::Complete, a, 1, true),
                // d after a and b ended: no overlap.
                claim(300, d, 1),
                outcome(350, Op::Complete, d, 1, true),
                // e's worker was killed: its lease is known only at its claim.
                claim(400, e, 1),
            ],
        ),
        worker(
            11,
            vec![
                // b while a holds key k: a violation.
                claim(150, b, 1),
                outcome(250, Op::Complete, b, 1, true),
                // c while a holds k, but c has another key.
                claim(150, c, 1),
                outcome(160, Op::Complete, c, 1, true),
                claim(401, f, 1),
                outcome(450, Op::Complete, f, 1, true),
            ],
        ),
    ];
    let (_, jobs) = collect(&histories);
    let keys: HashMap<JobId, &str> = [
        (a, "k"),
        (b, "k"),
        (c, "other"),
        (d, "k"),
        (e, "k"),
        (f, "k"),
    ]
    .into_iter()
    .collect();
    let mut verdict = Verdict::default();
    judge_limits(&mut verdict, &jobs, &keys);
    assert_eq!(verdict.keyed_leases, 6);
    assert_eq!(verdict.limit_violations, 1, "{:?}", verdict.examples);
    assert!(verdict.examples[0].contains(&b.to_string()));
    verdict.passed = verdict.passed();
    assert!(!verdict.passed);
}

/// A job in `state` that waited for `depends_on`, as the final read shows it.
fn waited(id: JobId, state: JobState, depends_on: Vec<JobId>) -> (JobId, Option<Job>) {
    let (mut job, _) = Job::enqueued(
        durq::NewJob::new("chaos"),
        id,
        durq::Timestamp::from_millis(1),
    );
    job.state = state;
    job.depends_on = depends_on;
    (id, Some(job))
}

/// The dependency check's verdict on one worker's `events` and the final reads
/// `finals` (see [`waited`]).
fn judge_waits(
    events: Vec<Event>,
    finals: impl IntoIterator<Item = (JobId, Option<Job>)>,
) -> Verdict {
    let (_, jobs) = collect(&[worker(10, events)]);
    let finals: HashMap<JobId, Option<Job>> = finals.into_iter().collect();
    let mut verdict = Verdict::default();
    judge_dependencies(&mut verdict, &jobs, &finals);
    verdict
}

#[test]
fn a_job_claimed_before_its_dependency_succeeded_is_a_violation() {
    let (root, early, late) = (id(20), id(21), id(22));
    let verdict = judge_waits(
        vec![
            claim(100, root, 1),
            start(110, root, 1),
            // Claimed at 150, before the root's completion call began (200): its
            // release cannot have happened yet.
            claim(150, early, 1),
            outcome(200, Op::Complete, root, 1, true),
            claim(300, late, 1),
            outcome(400, Op::Complete, early, 1, true),
            outcome(500, Op::Complete, late, 1, true),
        ],
        [
            waited(root, JobState::Succeeded, vec![]),
            waited(early, JobState::Succeeded, vec![root]),
            waited(late, JobState::Succeeded, vec![root]),
        ],
    );
    assert_eq!(
        (verdict.dependent_jobs, verdict.dependency_violations),
        (2, 1)
    );
    assert!(
        verdict.examples[0].contains(&early.to_string()),
        "{verdict:?}"
    );
    assert!(!verdict.passed());
}

#[test]
fn a_job_left_waiting_is_a_violation_and_a_dependency_without_an_answer_bounds_by_its_run() {
    let (root, after, stuck) = (id(30), id(31), id(32));
    let verdict = judge_waits(
        vec![
            claim(100, root, 1),
            start(110, root, 1),
            // The root's completion answer was lost: its last run began at 110, so a
            // claim at 120 is no violation, and one before 110 would be.
            outcome(115, Op::Complete, root, 1, false),
            claim(120, after, 1),
            outcome(130, Op::Complete, after, 1, true),
        ],
        [
            waited(root, JobState::Succeeded, vec![]),
            waited(after, JobState::Succeeded, vec![root]),
            waited(stuck, JobState::Waiting, vec![root]),
        ],
    );
    assert_eq!(
        (verdict.dependent_jobs, verdict.dependency_violations),
        (2, 1),
        "{verdict:?}"
    );
    assert!(verdict.examples[0].contains("still waiting"), "{verdict:?}");
}
