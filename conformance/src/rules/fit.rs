//! Rules F1–F6: claims that fit the worker.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq_core::validate::{MAX_AMOUNT, MAX_FIT_KEYS};
use durq_core::{
    Budget, ClaimRequest, ClaimedJob, JobId, JobState, ListQuery, Needs, NewJob, Store,
};
use tokio::sync::Barrier;

use super::support::{
    assert_unchanged, enqueue, expect_invalid, get, ids_of, join_all, request, Must, Together, TTL,
    WORKER,
};
use crate::{Harness, TestEnv};

const GIB: u64 = 1 << 30;

fn fitted(queues: &[&str], limit: usize) -> ClaimRequest {
    request(queues, WORKER, TTL, limit)
}

async fn claim_with(store: &Store, request: ClaimRequest, what: &str) -> Vec<JobId> {
    ids_of(&store.claim(request).await.must(what))
}

/// Asserts `ids` are untouched by the claims so far: still queued with no attempt, and
/// then that an unconstrained claim takes exactly them (the no claim-then-filter rule).
async fn assert_left_for_others(store: &Store, queue: &str, ids: &[JobId], what: &str) {
    for id in ids {
        let job = get(store, *id, what).await;
        assert_eq!(
            (job.state, job.attempts, job.lease),
            (JobState::Queued, 0, None),
            "{what}: a job that did not fit must be left untouched"
        );
    }
    let mut rest = claim_with(store, fitted(&[queue], 1_000), what).await;
    rest.sort();
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(
        rest, expected,
        "{what}: the jobs that did not fit stay claimable by an unconstrained claim"
    );
}

/// F1: a job's needs and locality round-trip through every read, and bad needs, a bad
/// locality, a bad budget or a bad preference are refused.
pub async fn f1_needs_and_locality_round_trip(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let needs = Needs::new()
        .amount("cpu_milli", 1_500)
        .amount("mem_bytes", MAX_AMOUNT)
        .amount("gpu", 0)
        .capability("fpga")
        .capability("nvme.v2:x-1");
    let locality = "eu-west/host 7 \u{1F980}";
    let rich = enqueue(
        &store,
        NewJob::new("f1").needs(needs.clone()).locality(locality),
        "F1",
    )
    .await;
    let plain = enqueue(&store, NewJob::new("f1"), "F1").await;
    let only_locality = enqueue(&store, NewJob::new("f1").locality("x"), "F1").await;
    let parent_of = enqueue(
        &store,
        NewJob::new("f1")
            .needs(Needs::new().capability("tpu"))
            .parent(rich),
        "F1",
    )
    .await;

    let expect = |id: JobId| -> (Needs, Option<String>) {
        if id == rich {
            (needs.clone(), Some(locality.to_owned()))
        } else if id == only_locality {
            (Needs::new(), Some("x".to_owned()))
        } else if id == parent_of {
            (Needs::new().capability("tpu"), None)
        } else {
            (Needs::new(), None)
        }
    };
    for id in [rich, plain, only_locality, parent_of] {
        let job = get(&store, id, "F1: get").await;
        assert_eq!(
            (job.needs, job.locality),
            expect(id),
            "F1: get must show the needs and locality as enqueued"
        );
    }
    let page = store
        .list(ListQuery::new("f1").limit(10))
        .await
        .must("F1: list");
    assert_eq!(page.jobs.len(), 4);
    for job in page.jobs {
        assert_eq!(
            (job.needs, job.locality),
            expect(job.id),
            "F1: list must show the needs and locality"
        );
    }
    let children = store.children(rich).await.must("F1: children");
    assert_eq!(
        children.iter().map(|j| j.needs.clone()).collect::<Vec<_>>(),
        vec![Needs::new().capability("tpu")],
        "F1: children must show the needs"
    );
    let claimed = store.claim(fitted(&["f1"], 10)).await.must("F1: claim");
    assert_eq!(claimed.len(), 4);
    for job in &claimed {
        assert_eq!(
            (job.job.needs.clone(), job.job.locality.clone()),
            expect(job.id()),
            "F1: claim must return the needs and locality"
        );
    }
    let batch = store
        .enqueue_batch(vec![
            NewJob::new("f1b").needs(Needs::new().amount("gpu", 2)),
            NewJob::new("f1b").locality("here"),
        ])
        .await
        .must("F1: batch");
    let first = get(&store, batch[0].id, "F1").await;
    let second = get(&store, batch[1].id, "F1").await;
    assert_eq!(
        first.needs,
        Needs::new().amount("gpu", 2),
        "F1: batch needs"
    );
    assert_eq!(
        second.locality.as_deref(),
        Some("here"),
        "F1: batch locality"
    );

    let too_many = (0..=MAX_FIT_KEYS).fold(Needs::new(), |n, i| n.capability(format!("k{i}")));
    let bad_jobs = [
        ("needs", NewJob::new("f1").needs(Needs::new().amount("", 1))),
        (
            "needs",
            NewJob::new("f1").needs(Needs::new().amount("mem bytes", 1)),
        ),
        (
            "needs",
            NewJob::new("f1").needs(Needs::new().amount("gpu", MAX_AMOUNT + 1)),
        ),
        (
            "needs",
            NewJob::new("f1").needs(Needs::new().capability("x".repeat(65))),
        ),
        ("needs", NewJob::new("f1").needs(too_many)),
        ("locality", NewJob::new("f1").locality("")),
        ("locality", NewJob::new("f1").locality("a\nb")),
        ("locality", NewJob::new("f1").locality("l".repeat(257))),
    ];
    for (field, job) in bad_jobs {
        expect_invalid(store.enqueue(job).await, field, "F1: bad needs");
    }
    let bad_claims = [
        (
            "budget",
            fitted(&["f1"], 1).budget(Budget::new().capability("a/b")),
        ),
        (
            "budget",
            fitted(&["f1"], 1).budget(Budget::new().amount("gpu", MAX_AMOUNT + 1)),
        ),
        ("prefer", fitted(&["f1"], 1).prefer([""])),
        (
            "prefer",
            fitted(&["f1"], 1).prefer((0..65).map(|i| format!("l{i}"))),
        ),
    ];
    for (field, claim) in bad_claims {
        expect_invalid(store.claim(claim).await, field, "F1: bad claim");
    }
    let stats = store.stats("f1").await.must("F1: stats");
    assert_eq!(stats.ready, 0, "F1: refused input writes nothing");
}

/// F2: a budget's named amounts are limits (zero included, an exact fit admitted, one
/// unit over refused); an amount it does not name is unconstrained; a job that does not
/// fit is left untouched for others.
pub async fn f2_budget_amounts_filter(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "F2").await;

    // Each dimension: the small job fits, the big one stays.
    for (i, name) in ["cpu_milli", "mem_bytes", "disk_bytes", "gpu"]
        .into_iter()
        .enumerate()
    {
        let queue = format!("f2-{i}");
        let small = together
            .enqueue(
                &store,
                NewJob::new(queue.clone()).needs(Needs::new().amount(name, 2 * GIB)),
                "F2",
            )
            .await;
        let big = together
            .enqueue(
                &store,
                NewJob::new(queue.clone()).needs(Needs::new().amount(name, 8 * GIB)),
                "F2",
            )
            .await;
        let budget = Budget::new().amount(name, 4 * GIB);
        let claimed = claim_with(&store, fitted(&[&queue], 10).budget(budget), "F2: budget").await;
        assert_eq!(claimed, vec![small], "F2: {name} within the budget only");
        assert_left_for_others(&store, &queue, &[big], "F2").await;
    }

    // An amount the budget does not name is unconstrained.
    let gpus = together
        .enqueue(
            &store,
            NewJob::new("f2-absent").needs(Needs::new().amount("mem_bytes", GIB).amount("gpu", 8)),
            "F2",
        )
        .await;
    let too_much_memory = together
        .enqueue(
            &store,
            NewJob::new("f2-absent")
                .needs(Needs::new().amount("mem_bytes", 64 * GIB).amount("gpu", 1)),
            "F2",
        )
        .await;
    let claimed = claim_with(
        &store,
        fitted(&["f2-absent"], 10).budget(Budget::new().amount("mem_bytes", 4 * GIB)),
        "F2: absent key",
    )
    .await;
    assert_eq!(
        claimed,
        vec![gpus],
        "F2: an amount the budget does not name is unconstrained"
    );
    assert_left_for_others(&store, "f2-absent", &[too_much_memory], "F2").await;

    // A named zero is a limit; a job needing nothing (or zero) fits it.
    let one_byte = together
        .enqueue(
            &store,
            NewJob::new("f2-zero").needs(Needs::new().amount("mem_bytes", 1)),
            "F2",
        )
        .await;
    let nothing = together.enqueue(&store, NewJob::new("f2-zero"), "F2").await;
    let zero = together
        .enqueue(
            &store,
            NewJob::new("f2-zero").needs(Needs::new().amount("gpu", 0)),
            "F2",
        )
        .await;
    let all_zero = ["cpu_milli", "mem_bytes", "disk_bytes", "gpu"]
        .into_iter()
        .fold(Budget::new(), |b, name| b.amount(name, 0));
    let claimed = claim_with(
        &store,
        fitted(&["f2-zero"], 10).budget(all_zero),
        "F2: zero budget",
    )
    .await;
    assert_eq!(
        claimed,
        vec![nothing, zero],
        "F2: an explicit zero still filters, and needing nothing always fits"
    );
    assert_left_for_others(&store, "f2-zero", &[one_byte], "F2").await;

    // Exact fit, and one unit over.
    let exact = together
        .enqueue(
            &store,
            NewJob::new("f2-exact").needs(Needs::new().amount("mem_bytes", 4 * GIB)),
            "F2",
        )
        .await;
    let over = together
        .enqueue(
            &store,
            NewJob::new("f2-exact").needs(Needs::new().amount("mem_bytes", 4 * GIB + 1)),
            "F2",
        )
        .await;
    let claimed = claim_with(
        &store,
        fitted(&["f2-exact"], 10).budget(Budget::new().amount("mem_bytes", 4 * GIB)),
        "F2: exact",
    )
    .await;
    assert_eq!(claimed, vec![exact], "F2: an exact fit is claimable");
    assert_left_for_others(&store, "f2-exact", &[over], "F2: one unit over").await;
}

/// F3: capability keys match whole keys, as a subset of what the worker offers; a
/// budget offering none admits no job that needs one; such a job stays claimable by a
/// worker that offers it.
pub async fn f3_capabilities_match_exactly(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let plain = enqueue(&store, NewJob::new("f3"), "F3").await;
    let tpu = enqueue(
        &store,
        NewJob::new("f3").needs(Needs::new().capability("tpu").amount("tpu_count", 9)),
        "F3",
    )
    .await;
    let fpga = enqueue(
        &store,
        NewJob::new("f3").needs(Needs::new().capability("fpga")),
        "F3",
    )
    .await;
    let fpga_large = enqueue(
        &store,
        NewJob::new("f3").needs(Needs::new().capability("fpga-large")),
        "F3",
    )
    .await;
    let both = enqueue(
        &store,
        NewJob::new("f3").needs(Needs::new().capability("fpga").capability("tpu")),
        "F3",
    )
    .await;

    let claimed = claim_with(
        &store,
        fitted(&["f3"], 10).budget(Budget::new().amount("mem_bytes", 8 * GIB)),
        "F3: no capabilities offered",
    )
    .await;
    assert_eq!(
        claimed,
        vec![plain],
        "F3: a budget offering no capability admits no job needing one"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f3"], 10).budget(Budget::new().capability("tpu")),
        "F3: tpu",
    )
    .await;
    assert_eq!(
        claimed,
        vec![tpu],
        "F3: an offered key admits its jobs (amounts not named in the budget are free)"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f3"], 10).budget(Budget::new().capability("fpga-large")),
        "F3: fpga-large",
    )
    .await;
    assert_eq!(
        claimed,
        vec![fpga_large],
        "F3: offering fpga-large does not satisfy fpga"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f3"], 10).budget(Budget::new().capability("fpga")),
        "F3: fpga alone",
    )
    .await;
    assert_eq!(
        claimed,
        vec![fpga],
        "F3: a job needing fpga and tpu does not fit an offer of fpga alone"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f3"], 10).budget(
            Budget::new()
                .capability("fpga")
                .capability("nvme")
                .capability("tpu"),
        ),
        "F3: subset",
    )
    .await;
    assert_eq!(
        claimed,
        vec![both],
        "F3: needs that are a subset of the offer fit"
    );
}

/// F4: among the jobs that fit, the claim order holds (priority, then ready time, then
/// FIFO) across the named queues, paused queues and future jobs are left out, and the
/// limit cuts after the filter and the order, never before.
pub async fn f4_order_then_truncate_among_fitting_jobs(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "F").await;
    let small = Needs::new().amount("mem_bytes", GIB);
    let oversized = together
        .enqueue(
            &store,
            NewJob::new("f4")
                .priority(100)
                .needs(Needs::new().amount("mem_bytes", 512 * GIB)),
            "F4",
        )
        .await;
    let oversized_before = get(&store, oversized, "F4").await;
    let low = together
        .enqueue(&store, NewJob::new("f4").priority(1), "F4")
        .await;
    let mid_early = together
        .enqueue(
            &store,
            NewJob::new("f4").priority(5).needs(small.clone()),
            "F4",
        )
        .await;
    let high = together
        .enqueue(&store, NewJob::new("f4-other").priority(9), "F4")
        .await;
    let mid_late = together
        .enqueue(
            &store,
            NewJob::new("f4").priority(5).needs(small.clone()),
            "F4",
        )
        .await;
    let paused = together
        .enqueue(&store, NewJob::new("f4-paused").priority(50), "F4")
        .await;
    let future = together
        .enqueue(
            &store,
            NewJob::new("f4")
                .priority(60)
                .delay(Duration::from_secs(60)),
            "F4",
        )
        .await;
    let lowest = together
        .enqueue(&store, NewJob::new("f4").priority(0), "F4")
        .await;
    store.pause("f4-paused").await.must("F4: pause");

    let budget = Budget::new().amount("mem_bytes", 4 * GIB);
    let claimed = claim_with(
        &store,
        fitted(&["f4", "f4-other", "f4-paused"], 4).budget(budget.clone()),
        "F4: limit 4",
    )
    .await;
    assert_eq!(
        claimed,
        vec![high, mid_early, mid_late, low],
        "F4: the fitting jobs in claim order, across queues, cut to the limit after the filter"
    );
    assert_unchanged(
        &store,
        &oversized_before,
        "F4: the oversized job was never written",
    )
    .await;

    let claimed = claim_with(
        &store,
        fitted(&["f4", "f4-other", "f4-paused"], 4).budget(budget.clone()),
        "F4: the rest",
    )
    .await;
    assert_eq!(
        claimed,
        vec![lowest],
        "F4: paused queues and future jobs are left out"
    );
    store.resume("f4-paused").await.must("F4: resume");
    env.clock.advance(Duration::from_secs(60));
    let claimed = claim_with(
        &store,
        fitted(&["f4", "f4-paused"], 10).budget(budget),
        "F4: after resume",
    )
    .await;
    assert_eq!(claimed, vec![future, paused], "F4: once due and resumed");
    assert_left_for_others(&store, "f4", &[oversized], "F4").await;

    // Six fitting jobs enqueued lowest priority first: limit 2 takes the top two each
    // time, which a claim that cut before ordering would miss.
    let mut by_priority = Vec::new();
    for p in 0..6 {
        by_priority.push(
            together
                .enqueue(
                    &store,
                    NewJob::new("f4-limit").priority(p).needs(small.clone()),
                    "F4",
                )
                .await,
        );
    }
    let budget = Budget::new().amount("mem_bytes", GIB);
    for pair in [[5, 4], [3, 2], [1, 0]] {
        let claimed = claim_with(
            &store,
            fitted(&["f4-limit"], 2).budget(budget.clone()),
            "F4: limit 2",
        )
        .await;
        assert_eq!(
            claimed,
            vec![by_priority[pair[0]], by_priority[pair[1]]],
            "F4: the limit truncates after ordering"
        );
    }
}

/// F5: preferred localities come first within a priority band, never across bands,
/// and never filter, even under a tight limit.
pub async fn f5_locality_reorders_within_a_priority_band(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "F").await;
    let early_remote = together
        .enqueue(
            &store,
            NewJob::new("f5").priority(1).locality("remote"),
            "F5",
        )
        .await;
    let mid_plain = together
        .enqueue(&store, NewJob::new("f5").priority(1), "F5")
        .await;
    let late_local = together
        .enqueue(
            &store,
            NewJob::new("f5").priority(1).locality("local"),
            "F5",
        )
        .await;
    let urgent_remote = together
        .enqueue(
            &store,
            NewJob::new("f5").priority(5).locality("remote"),
            "F5",
        )
        .await;
    let exotic = together
        .enqueue(
            &store,
            NewJob::new("f5").needs(
                Needs::new()
                    .amount("mem_bytes", 512 * GIB)
                    .capability("fpga"),
            ),
            "F5",
        )
        .await;

    // A tight limit within one band: the preferred job survives the cut.
    let claimed = claim_with(
        &store,
        fitted(&["f5"], 2).prefer(["elsewhere", "local"]),
        "F5: tight limit",
    )
    .await;
    assert_eq!(
        claimed,
        vec![urgent_remote, late_local],
        "F5: priority first, then the preferred locality even though it became ready later"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f5"], 10).prefer(["local"]),
        "F5: the rest",
    )
    .await;
    assert_eq!(
        claimed,
        vec![early_remote, mid_plain, exotic],
        "F5: a preference never filters: jobs elsewhere, without a locality or with needs \
         all come"
    );
}

/// F6: a reservation claims only the job it names, and only if that job is ready in a
/// named queue and fits the budget; it leaves every other job alone.
pub async fn f6_reserved_claims_only_that_job(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let first = enqueue(&store, NewJob::new("f6").priority(9), "F6").await;
    let target = enqueue(&store, NewJob::new("f6"), "F6").await;
    let third = enqueue(
        &store,
        NewJob::new("f6").needs(Needs::new().amount("mem_bytes", 1)),
        "F6",
    )
    .await;
    let elsewhere = enqueue(&store, NewJob::new("f6-other"), "F6").await;
    let later = enqueue(
        &store,
        NewJob::new("f6").delay(Duration::from_secs(5)),
        "F6",
    )
    .await;

    let claimed = claim_with(&store, fitted(&["f6"], 10).reserved(target), "F6").await;
    assert_eq!(claimed, vec![target], "F6: only the reserved job");
    let claimed = claim_with(&store, fitted(&["f6"], 10).reserved(target), "F6: again").await;
    assert!(
        claimed.is_empty(),
        "F6: a reserved job already running is not claimed"
    );
    let claimed = claim_with(
        &store,
        fitted(&["f6"], 10)
            .reserved(third)
            .budget(Budget::new().amount("mem_bytes", 0)),
        "F6: reserved but too big",
    )
    .await;
    assert!(
        claimed.is_empty(),
        "F6: a reservation does not bypass the budget"
    );
    let claimed = claim_with(&store, fitted(&["f6"], 10).reserved(elsewhere), "F6").await;
    assert!(
        claimed.is_empty(),
        "F6: a job of a queue not named is not claimed"
    );
    let claimed = claim_with(&store, fitted(&["f6"], 10).reserved(later), "F6").await;
    assert!(claimed.is_empty(), "F6: a job not yet due is not claimed");
    let missing = JobId::mint(durq_core::Clock::now(&env.clock));
    let claimed = claim_with(&store, fitted(&["f6"], 10).reserved(missing), "F6").await;
    assert!(claimed.is_empty(), "F6: an unknown job claims nothing");

    assert_left_for_others(&store, "f6", &[first, third], "F6").await;
}

/// C2 under budgets: concurrent claimers with different budgets and preferences drain
/// a mixed queue, each job exactly once, each to a claimer it fits.
pub async fn c2_claim_once_under_budgets(harness: &dyn Harness) {
    const JOBS: usize = 120;
    const CLAIMERS: usize = 6;
    let env = TestEnv::new(harness);
    let seed = env.store().await;
    let mut sizes = HashMap::new();
    let mut batch = Vec::new();
    for i in 0..JOBS {
        let size = (i % 4) as u64;
        batch.push(
            NewJob::new("f-race")
                .priority((i % 3) as i16)
                .needs(Needs::new().amount("gpu", size))
                .locality(format!("host-{}", i % 5)),
        );
    }
    for (job, answer) in batch
        .iter()
        .zip(seed.enqueue_batch(batch.clone()).await.must("C2"))
    {
        sizes.insert(answer.id, job.needs.amounts()["gpu"]);
    }
    let sizes = Arc::new(sizes);
    let claimed: Arc<Mutex<HashSet<JobId>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(CLAIMERS));
    let mut handles = Vec::new();
    for c in 0..CLAIMERS {
        let store = env.store().await;
        let (claimed, barrier, sizes) = (claimed.clone(), barrier.clone(), sizes.clone());
        handles.push(tokio::spawn(async move {
            // Claimers 0 and 1 fit everything; the others fit sizes up to c % 4.
            let gpus = if c < 2 { 3 } else { (c % 4) as u64 };
            let worker = format!("claimer-{c}");
            barrier.wait().await;
            let mut idle = 0;
            while idle < 3 {
                let batch: Vec<ClaimedJob> = store
                    .claim(
                        ClaimRequest::new(["f-race"], worker.clone(), TTL)
                            .limit(1 + c % 3)
                            .budget(Budget::new().amount("gpu", gpus))
                            .prefer([format!("host-{c}")]),
                    )
                    .await
                    .must("C2: fitted claim");
                if batch.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                for job in batch {
                    assert!(
                        sizes[&job.id()] <= gpus,
                        "C2: {worker} (gpu {gpus}) was handed a job needing {}",
                        sizes[&job.id()]
                    );
                    let fresh = claimed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(job.id());
                    assert!(fresh, "C2: job {} was handed out twice", job.id());
                    store
                        .complete(job.id(), job.token(), None)
                        .await
                        .must("C2: complete");
                }
            }
        }));
    }
    join_all(handles).await;
    let claimed = claimed.lock().unwrap_or_else(|p| p.into_inner()).len();
    assert_eq!(claimed, JOBS, "C2: every job is claimed exactly once");
}
