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

fn step_run(t: u64, id: JobId, token: u64, step: &str) -> Event {
    Event::StepRun {
        t,
        id,
        token,
        step: step.into(),
    }
}

fn step_saved(t: u64, id: JobId, token: u64, step: &str) -> Event {
    Event::StepSaved {
        t,
        id,
        token,
        step: step.into(),
    }
}

fn step_replayed(t: u64, id: JobId, token: u64, step: &str, saved_by: u64) -> Event {
    Event::StepReplayed {
        t,
        id,
        token,
        step: step.into(),
        saved_by,
    }
}

fn step_failed(t: u64, id: JobId, token: u64, step: &str) -> Event {
    Event::StepFailed {
        t,
        id,
        token,
        step: step.into(),
        err: "lease lost".into(),
    }
}

/// A first run (pid 10, token 1) that saved `load` and began `work`, and whatever
/// `rest` a second run (pid 11, token 2) logged after it.
fn two_step_runs(a: JobId, rest: Vec<Event>) -> Vec<ProcessHistory> {
    let mut second = vec![claim(5_000_000, a, 2), start(5_000_010, a, 2)];
    second.extend(rest);
    vec![
        worker(
            10,
            vec![
                claim(100, a, 1),
                start(110, a, 1),
                step_run(120, a, 1, "load"),
                step_saved(130, a, 1, "load"),
                step_run(140, a, 1, "work"),
            ],
        ),
        worker(11, second),
    ]
}

#[test]
fn a_step_rerun_after_a_kill_is_explained() {
    let a = id(40);
    let histories = two_step_runs(
        a,
        vec![
            step_replayed(5_000_020, a, 2, "load", 1),
            step_run(5_000_030, a, 2, "work"),
            step_saved(5_000_040, a, 2, "work"),
            outcome(5_000_100, Op::Complete, a, 2, true),
        ],
    );
    let verdict = judge_history("t", &histories, &[kill(200, 10)]);
    assert_eq!(
        (
            verdict.step_jobs,
            verdict.step_runs,
            verdict.steps_saved,
            verdict.steps_replayed
        ),
        (1, 3, 2, 1)
    );
    assert_eq!(
        (verdict.step_reruns_after_kill, verdict.step_violations),
        (1, 0),
        "{verdict:?}"
    );
    assert!(verdict.passed(), "{verdict:?}");
}

#[test]
fn a_saved_step_run_again_is_a_violation_even_after_a_kill() {
    let a = id(41);
    // The second run ran `load`, which the first had saved: its read of the job's
    // steps came after its claim, which came after that save.
    let histories = two_step_runs(
        a,
        vec![
            step_run(5_000_020, a, 2, "load"),
            step_saved(5_000_025, a, 2, "load"),
            step_run(5_000_030, a, 2, "work"),
            step_saved(5_000_040, a, 2, "work"),
            outcome(5_000_100, Op::Complete, a, 2, true),
        ],
    );
    let verdict = judge_history("t", &histories, &[kill(200, 10)]);
    assert_eq!(
        (verdict.step_violations, verdict.step_reruns_after_kill),
        (1, 1),
        "{verdict:?}"
    );
    assert!(
        verdict
            .examples
            .iter()
            .any(|e| e.contains("\"load\" ran again")),
        "{verdict:?}"
    );
    assert!(!verdict.passed());
}

#[test]
fn a_replay_proves_a_save_the_history_did_not_log() {
    let a = id(42);
    // Token 1 saved `work` but died before logging it; token 2 was answered from
    // that save; token 3 then ran `work` again: a violation, known from the replay.
    let mut histories = two_step_runs(
        a,
        vec![
            step_replayed(5_000_020, a, 2, "load", 1),
            step_replayed(5_000_030, a, 2, "work", 1),
        ],
    );
    histories.push(worker(
        12,
        vec![
            claim(9_000_000, a, 3),
            start(9_000_010, a, 3),
            step_replayed(9_000_020, a, 3, "load", 1),
            step_run(9_000_030, a, 3, "work"),
            step_saved(9_000_040, a, 3, "work"),
            outcome(9_000_100, Op::Complete, a, 3, true),
        ],
    ));
    let verdict = judge_history("t", &histories, &[kill(200, 10), kill(5_000_050, 11)]);
    assert_eq!(verdict.step_violations, 1, "{verdict:?}");
    // A replay of a save no run of the step made is one too.
    let forged = two_step_runs(a, vec![step_replayed(5_000_020, a, 2, "work", 7)]);
    let verdict = judge_history("t", &forged, &[kill(200, 10)]);
    assert_eq!(verdict.step_violations, 1, "{verdict:?}");
    assert!(
        verdict.examples[0].contains("never ran the step"),
        "{verdict:?}"
    );
}

#[test]
fn a_step_rerun_needs_a_kill_a_store_fault_or_a_failed_save() {
    let a = id(43);
    let rest = vec![
        step_replayed(5_000_020, a, 2, "load", 1),
        step_run(5_000_030, a, 2, "work"),
        step_saved(5_000_040, a, 2, "work"),
    ];
    // No kill, no fault, no failed save: the first run's `work` simply vanished.
    let histories = two_step_runs(a, rest.clone());
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!(verdict.step_violations, 1, "{verdict:?}");
    assert!(verdict
        .examples
        .iter()
        .any(|e| e.contains("unexplained rerun of step")));
    assert!(!verdict.passed());

    // The first run's save was refused or its answer lost.
    let mut failed = two_step_runs(a, rest.clone());
    failed[0].events.push(step_failed(150, a, 1, "work"));
    let verdict = judge_history("t", &failed, &[]);
    assert_eq!(
        (
            verdict.step_reruns_after_failed_save,
            verdict.step_save_failures,
            verdict.step_violations
        ),
        (1, 1, 0),
        "{verdict:?}"
    );

    // A store fault between the first run of `work` (less a second) and the rerun.
    let verdict = judge_history(
        "t",
        &histories,
        &[Fault {
            t: 2_000_000,
            kind: "client_kill".into(),
            pid: None,
            end: Some(2_000_100),
            hits: Some(3),
        }],
    );
    assert_eq!(
        (
            verdict.step_reruns_after_store_fault,
            verdict.step_violations
        ),
        (1, 0),
        "{verdict:?}"
    );
}

#[test]
fn a_stale_run_may_run_a_step_a_newer_run_saved_if_its_save_is_refused() {
    let a = id(44);
    // Token 1 lost its lease while in `work` and, still running, began `finish` after
    // token 2 had saved it: the fence refused token 1's save.
    let histories = vec![
        worker(
            10,
            vec![
                claim(100, a, 1),
                start(110, a, 1),
                step_run(120, a, 1, "finish"),
                step_failed(8_000_000, a, 1, "finish"),
            ],
        ),
        worker(
            11,
            vec![
                claim(5_000_000, a, 2),
                start(5_000_010, a, 2),
                step_run(5_000_030, a, 2, "finish"),
                step_saved(5_000_040, a, 2, "finish"),
            ],
        ),
    ];
    let verdict = judge_history("t", &histories, &[]);
    assert_eq!(
        (
            verdict.step_reruns_after_failed_save,
            verdict.step_violations
        ),
        (1, 0),
        "{verdict:?}"
    );
    // Had its save been accepted (no fence), nothing would explain the rerun.
    let mut unfenced = histories;
    unfenced[0].events[3] = step_saved(8_000_000, a, 1, "finish");
    let verdict = judge_history("t", &unfenced, &[]);
    assert_eq!(verdict.step_violations, 1, "{verdict:?}");
}

/// A step log as the store answers it: `steps` saved by the tokens given.
fn step_log(steps: &[(&str, u64)]) -> durq::StepLog {
    durq::StepLog {
        generation: 0,
        steps: steps
            .iter()
            .map(|(name, token)| durq::SavedStep {
                name: (*name).to_owned(),
                output: serde_json::to_vec(&crate::worker::StepOutput { token: *token })
                    .expect("encode")
                    .into(),
                saved_at: durq::Timestamp::from_millis(1),
            })
            .collect(),
    }
}

#[test]
fn saved_steps_at_the_end_must_agree_with_the_history() {
    let a = id(45);
    let events = vec![
        claim(100, a, 1),
        start(110, a, 1),
        step_run(120, a, 1, "load"),
        step_saved(130, a, 1, "load"),
        step_run(140, a, 1, "work"),
        // Killed after the store took `work`, before the line: token 2 should have
        // been answered from it, yet ran it.
        claim(5_000_000, a, 2),
        step_replayed(5_000_020, a, 2, "load", 1),
        step_run(5_000_030, a, 2, "work"),
        step_saved(5_000_040, a, 2, "work"),
        step_run(5_000_050, a, 2, "finish"),
        step_saved(5_000_060, a, 2, "finish"),
    ];
    let steps = collect_steps(&[worker(10, events)]);
    let judge = |log: durq::StepLog| {
        let mut verdict = Verdict::default();
        judge_saved_steps(&mut verdict, &steps, &[(a, log)].into_iter().collect());
        verdict
    };
    let honest = judge(step_log(&[("load", 1), ("work", 2), ("finish", 2)]));
    assert_eq!(
        (honest.steps_checked_in_store, honest.step_violations),
        (3, 0),
        "{honest:?}"
    );
    let rerun = judge(step_log(&[("load", 1), ("work", 1), ("finish", 2)]));
    assert_eq!(rerun.step_violations, 1, "{rerun:?}");
    assert!(rerun.examples[0].contains("ran it again"), "{rerun:?}");
    let missing = judge(step_log(&[("load", 1), ("work", 2)]));
    assert_eq!(missing.step_violations, 1, "{missing:?}");
    let forged = judge(step_log(&[("load", 1), ("work", 2), ("finish", 9)]));
    assert_eq!(forged.step_violations, 1, "{forged:?}");
    assert!(forged.examples[0].contains("never ran it"), "{forged:?}");
}

/// A stream event of `job`, the `n`-th of the stream.
fn recorded(n: u64, job: JobId, kind: durq::stream::EventKind) -> durq::stream::Event {
    durq::stream::Event {
        cursor: durq::stream::EventCursor::new(n, 0),
        job,
        queue: "chaos".into(),
        kind,
        attempt: 1,
        name: None,
        data: None,
        recorded_at: durq::Timestamp::from_millis(1),
    }
}

/// The stream check's verdict on `stream`, the history's `claims` (job, token) and the
/// final reads `finals`.
fn judge_recorded(
    stream: &[durq::stream::Event],
    claims: &[(JobId, u64)],
    finals: impl IntoIterator<Item = (JobId, Option<Job>)>,
) -> Verdict {
    let events = claims
        .iter()
        .enumerate()
        .map(|(t, (id, token))| claim(t as u64, *id, *token))
        .collect();
    let (_, jobs) = collect(&[worker(1, events)]);
    let finals: HashMap<JobId, Option<Job>> = finals.into_iter().collect();
    let mut verdict = Verdict::default();
    judge_stream(&mut verdict, stream, &jobs, &finals);
    verdict
}

#[test]
fn a_stream_that_replays_into_each_final_state_passes() {
    use durq::stream::EventKind::*;
    let (a, b, c) = (id(1), id(2), id(3));
    let stream = [
        recorded(1, a, Enqueued),
        recorded(2, b, Enqueued),
        recorded(3, c, Enqueued),
        recorded(4, a, Started),
        recorded(5, a, Failed),
        recorded(6, a, Started),
        recorded(7, a, Emitted),
        recorded(8, a, Succeeded),
        recorded(9, b, Cancelled),
        recorded(10, c, Ready),
        recorded(11, c, Started),
        recorded(12, c, Released),
    ];
    let verdict = judge_recorded(
        &stream,
        &[(a, 1), (a, 2), (c, 1)],
        [
            waited(a, JobState::Succeeded, vec![]),
            waited(b, JobState::Cancelled, vec![]),
            waited(c, JobState::Queued, vec![]),
        ],
    );
    assert_eq!(verdict.stream_violations, 0, "{:?}", verdict.examples);
    assert_eq!(verdict.stream_events, 12);
}

#[test]
fn impossible_changes_missing_starts_and_wrong_ends_are_stream_violations() {
    use durq::stream::EventKind::*;
    let (a, b, c, d, e) = (id(1), id(2), id(3), id(4), id(5));
    let stream = [
        recorded(1, a, Enqueued),
        // Succeeded without a start.
        recorded(2, a, Succeeded),
        recorded(3, b, Enqueued),
        recorded(4, b, Started),
        recorded(5, c, Enqueued),
        recorded(6, c, Started),
        recorded(7, c, Succeeded),
        // Out of cursor order.
        recorded(6, e, Enqueued),
    ];
    let verdict = judge_recorded(
        &stream,
        // c was claimed twice, the stream started it once.
        &[(b, 1), (c, 1), (c, 2)],
        [
            waited(a, JobState::Succeeded, vec![]),
            // b's events leave it running; its record says succeeded.
            waited(b, JobState::Succeeded, vec![]),
            waited(c, JobState::Succeeded, vec![]),
            // d has a record and no events.
            waited(d, JobState::Queued, vec![]),
            waited(e, JobState::Queued, vec![]),
        ],
    );
    assert_eq!(
        verdict.stream_violations, 5,
        "a, b, c, d and the cursor: {:?}",
        verdict.examples
    );
}
