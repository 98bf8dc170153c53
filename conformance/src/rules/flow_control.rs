//! Rules K1–K4: flow control, limits on a queue's running jobs and on its starts,
//! enforced by the claim.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use durq_core::{Clock, JobId, JobState, NewJob, QueueLimits, Rate, Store};

use super::support::{
    assert_nothing_claimable, claim, enqueue, expect_invalid, get, ids_of, join_all,
    keeps_queue_wide_limits, request, Must, TTL, WORKER,
};
use crate::{Harness, TestEnv};

fn ids(claimed: &[durq_core::ClaimedJob]) -> HashSet<JobId> {
    ids_of(claimed).into_iter().collect()
}

/// K1: a job whose key is at its limit stays ready and is passed over; the claim goes
/// on with the jobs behind it (other keys, jobs without a key), and the same key on
/// another queue is counted apart. Once the key's running job ends, its next job is
/// claimed.
pub async fn k1_a_key_at_its_limit_is_passed_over_for_the_jobs_behind_it(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let one_per_key = QueueLimits::new().max_running_per_key(1);
    for queue in ["q", "other"] {
        store
            .set_limits(queue, one_per_key)
            .await
            .must("K1: set_limits");
    }
    let keyed = |queue: &str, key: &str| NewJob::new(queue).concurrency_key(key);
    let a1 = enqueue(&store, keyed("q", "a"), "K1").await;
    let a2 = enqueue(&store, keyed("q", "a"), "K1").await;
    let b1 = enqueue(&store, keyed("q", "b"), "K1").await;
    let plain = enqueue(&store, NewJob::new("q"), "K1").await;
    let elsewhere = enqueue(&store, keyed("other", "a"), "K1").await;
    assert_eq!(
        get(&store, a1, "K1").await.concurrency_key.as_deref(),
        Some("a"),
        "K1: get reads the concurrency key back"
    );

    let claimed = claim(&store, &["q", "other"], 10, "K1: the first claim").await;
    assert_eq!(
        ids(&claimed),
        HashSet::from([a1, b1, plain, elsewhere]),
        "K1: the claim takes a's first job, passes over its second, and goes on with b, \
         the job without a key and the other queue's job of key a"
    );
    assert_eq!(
        get(&store, a2, "K1").await.state,
        JobState::Queued,
        "K1: a job passed over stays ready"
    );
    assert_nothing_claimable(&store, &["q"], "K1: a's second job while its first runs").await;

    let first = claimed.iter().find(|job| job.id() == a1).must("K1");
    store
        .complete(a1, first.token(), None)
        .await
        .must("K1: complete a's first job");
    let next = claim(&store, &["q"], 10, "K1: after a's first job ended").await;
    assert_eq!(
        ids_of(&next),
        vec![a2],
        "K1: a's next job once a slot is free"
    );
}

/// One event of a recorded history: a job a claimer holds, from just after its claim
/// returned to just before its completion was sent, so the interval lies inside the
/// store's own `running` interval of the job.
#[derive(Debug, Clone, Copy)]
struct Event {
    at: u64,
    job: JobId,
    key: usize,
    start: bool,
}

/// K1, K2 with real concurrency: 16 claimers, each on a store of its own, race for 96
/// jobs of 6 keys (enqueued a key at a time, so one claim meets several jobs of a key)
/// and 16 without a key, under at most 2 running per key and 9 in the queue. Each
/// claimer records when it holds a job; replayed in order, the history never shows
/// more than 2 of one key or 9 in all held at once, and every job ran exactly once.
pub async fn k1_concurrent_claimers_never_run_more_of_a_key_than_its_limit(harness: &dyn Harness) {
    const KEYS: usize = 6;
    const PER_KEY: usize = 16;
    const UNKEYED: usize = 16;
    const PER_KEY_LIMIT: usize = 2;
    const QUEUE_LIMIT: usize = 9;
    const CLAIMERS: usize = 16;
    let env = TestEnv::new(harness);
    let admin = env.store().await;
    // A store that keeps per-key limits only (CONTRACT P3) is checked per key alone.
    let queue_limit =
        keeps_queue_wide_limits(&admin, "K1's queue-wide part (K2)").then_some(QUEUE_LIMIT);
    let mut limits = QueueLimits::new().max_running_per_key(PER_KEY_LIMIT as u32);
    if let Some(queue_limit) = queue_limit {
        limits = limits.max_running(queue_limit as u32);
    }
    admin.set_limits("q", limits).await.must("K1: set_limits");
    let mut key_of: HashMap<JobId, usize> = HashMap::new();
    let mut jobs = Vec::new();
    for key in 0..KEYS {
        for _ in 0..PER_KEY {
            jobs.push(NewJob::new("q").concurrency_key(format!("key-{key}")));
        }
    }
    jobs.extend((0..UNKEYED).map(|_| NewJob::new("q")));
    let enqueued = admin.enqueue_batch(jobs.clone()).await.must("K1: enqueue");
    for (answer, job) in enqueued.iter().zip(&jobs) {
        let key = match &job.concurrency_key {
            Some(key) => key
                .strip_prefix("key-")
                .and_then(|n| n.parse().ok())
                .must("K1: a key of this test"),
            None => KEYS, // no key: its own bucket, never limited per key
        };
        key_of.insert(answer.id, key);
    }
    let total = key_of.len();
    let key_of = Arc::new(key_of);
    let history: Arc<Mutex<Vec<Event>>> = Arc::new(Mutex::new(Vec::new()));
    let clock = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    // Told each time a claimer completed jobs: what a claimer that found nothing waits
    // for, since every job is enqueued already and an empty claim means the rest are
    // held back by running ones (or done).
    let completed = Arc::new(tokio::sync::Notify::new());
    let mut claimers = Vec::new();
    for _ in 0..CLAIMERS {
        let store: Store = env.store().await;
        let (key_of, history, clock, finished, completed) = (
            key_of.clone(),
            history.clone(),
            clock.clone(),
            finished.clone(),
            completed.clone(),
        );
        claimers.push(tokio::spawn(async move {
            while finished.load(Ordering::SeqCst) < total {
                // Registered before the claim, so a completion during it is not missed.
                let next_completion = completed.notified();
                let claimed = claim(&store, &["q"], 4, "K1: a racing claim").await;
                if claimed.is_empty() {
                    if finished.load(Ordering::SeqCst) < total {
                        next_completion.await;
                    }
                    continue;
                }
                let record = |job: JobId, start: bool| {
                    let event = Event {
                        at: clock.fetch_add(1, Ordering::SeqCst),
                        job,
                        key: key_of[&job],
                        start,
                    };
                    history
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .push(event);
                };
                for job in &claimed {
                    record(job.id(), true);
                }
                // Hold the jobs a while, so other claimers run meanwhile.
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                for job in &claimed {
                    record(job.id(), false);
                    store
                        .complete(job.id(), job.token(), None)
                        .await
                        .must("K1: complete");
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                completed.notify_waiters();
            }
        }));
    }
    join_all(claimers).await;
    let mut events = history
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    events.sort_by_key(|event| event.at);
    let mut held_per_key = [0usize; KEYS + 1];
    let mut held = 0usize;
    let mut started = HashSet::new();
    for event in &events {
        if event.start {
            assert!(started.insert(event.job), "K1: job {} ran twice", event.job);
            held_per_key[event.key] += 1;
            held += 1;
            if event.key < KEYS {
                assert!(
                    held_per_key[event.key] <= PER_KEY_LIMIT,
                    "K1: {} jobs of key-{} ran at once (event {}), above its limit of \
                     {PER_KEY_LIMIT}",
                    held_per_key[event.key],
                    event.key,
                    event.at
                );
            }
            if let Some(queue_limit) = queue_limit {
                assert!(
                    held <= queue_limit,
                    "K2: {held} jobs of the queue ran at once (event {}), above its limit of \
                     {queue_limit}",
                    event.at
                );
            }
        } else {
            held_per_key[event.key] -= 1;
            held -= 1;
        }
    }
    assert_eq!(started.len(), total, "K1: every job ran");
}

/// K2: a queue at its running limit gives no more jobs, while the other queues the
/// claim names still give theirs; a job that ends frees a slot for the next.
pub async fn k2_a_queue_at_its_running_limit_gives_no_more_jobs(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_queue_wide_limits(&store, "K2") {
        return;
    }
    store
        .set_limits("q", QueueLimits::new().max_running(2))
        .await
        .must("K2: set_limits");
    let mut queued = Vec::new();
    for _ in 0..4 {
        queued.push(enqueue(&store, NewJob::new("q"), "K2").await);
    }
    let open = enqueue(&store, NewJob::new("r"), "K2").await;
    let claimed = claim(&store, &["q", "r"], 10, "K2: the first claim").await;
    assert_eq!(
        ids(&claimed),
        HashSet::from([queued[0], queued[1], open]),
        "K2: two of the limited queue's jobs, in order, and the other queue's"
    );
    assert_nothing_claimable(&store, &["q"], "K2: the queue at its limit").await;
    let first = &claimed[ids_of(&claimed)
        .iter()
        .position(|id| *id == queued[0])
        .must("K2")];
    store
        .fail(queued[0], first.token(), "boom", durq_core::Retry::Never)
        .await
        .must("K2: fail");
    let next = claim(&store, &["q"], 10, "K2: after a job ended").await;
    assert_eq!(
        ids_of(&next),
        vec![queued[2]],
        "K2: one slot freed, one job"
    );
}

/// K3: limits are stored per queue, read back through any handle, listed by name (and
/// shown by `queues()`), refused at 0, removed by unlimited limits, and applied by the next claim; lowering
/// a limit below the jobs running stops none of them but holds back the next.
pub async fn k3_limits_are_stored_per_queue_and_applied_by_the_next_claim(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let operator = env.store().await;
    if !keeps_queue_wide_limits(&operator, "K3") {
        return;
    }
    let worker = env.store().await;
    assert_eq!(
        worker.limits("q").await.must("K3: limits"),
        QueueLimits::new(),
        "K3: a queue without limits is unlimited"
    );
    assert!(worker.all_limits().await.must("K3").is_empty());
    expect_invalid(
        operator
            .set_limits("q", QueueLimits::new().max_running(0))
            .await,
        "max_running",
        "K3: a limit of 0",
    );
    expect_invalid(
        operator
            .set_limits("q", QueueLimits::new().max_running_per_key(0))
            .await,
        "max_running_per_key",
        "K3: a per-key limit of 0",
    );
    expect_invalid(
        operator
            .set_limits("no queue!", QueueLimits::new().max_running(1))
            .await,
        "queue",
        "K3: a bad queue name",
    );
    assert!(
        worker.all_limits().await.must("K3").is_empty(),
        "K3: a refused call writes nothing"
    );
    let two_per_key = QueueLimits::new().max_running_per_key(2).max_running(50);
    operator.set_limits("q", two_per_key).await.must("K3");
    operator
        .set_limits("p", QueueLimits::new().max_running(3))
        .await
        .must("K3");
    assert_eq!(worker.limits("q").await.must("K3"), two_per_key);
    assert_eq!(
        worker.all_limits().await.must("K3"),
        vec![
            ("p".to_owned(), QueueLimits::new().max_running(3)),
            ("q".to_owned(), two_per_key),
        ],
        "K3: every handle sees the limits, listed by queue name"
    );

    let keyed = || NewJob::new("q").concurrency_key("k");
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(enqueue(&worker, keyed(), "K3").await);
    }
    let listed = worker.queues().await.must("K3: queues");
    let row = listed
        .iter()
        .find(|row| row.queue == "q")
        .must("K3: the queue in queues()");
    assert_eq!(
        row.limits, two_per_key,
        "K3: queues() shows a queue's limits"
    );
    let running = claim(&worker, &["q"], 10, "K3: two per key").await;
    assert_eq!(
        ids_of(&running),
        jobs[..2].to_vec(),
        "K3: the limit applies"
    );
    operator
        .set_limits("q", QueueLimits::new().max_running_per_key(1))
        .await
        .must("K3: lower the limit");
    for job in &running {
        assert_eq!(
            get(&worker, job.id(), "K3").await.state,
            JobState::Running,
            "K3: lowering a limit stops no running job"
        );
    }
    worker
        .complete(running[0].id(), running[0].token(), None)
        .await
        .must("K3");
    assert_nothing_claimable(&worker, &["q"], "K3: one of k still runs, at the new limit").await;
    operator
        .set_limits("q", QueueLimits::new())
        .await
        .must("K3: remove the limits");
    assert_eq!(
        worker.all_limits().await.must("K3"),
        vec![("p".to_owned(), QueueLimits::new().max_running(3))],
        "K3: unlimited limits remove the queue's"
    );
    let freed = claim(&worker, &["q"], 10, "K3: without limits").await;
    assert_eq!(
        ids_of(&freed),
        vec![jobs[2]],
        "K3: the next claim applies the change"
    );
}

/// K4: a rate admits at most its starts in any window of its period, counted on the
/// store's clock: a claim stops at the rate (the jobs behind stay ready), starts of
/// jobs that finished still count, the window frees a start exactly `per` after it
/// began (not a millisecond sooner), a key's rate holds back only that key, and other
/// queues are untouched.
pub async fn k4_a_rate_admits_at_most_its_starts_in_any_window(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_queue_wide_limits(&store, "K4") {
        return;
    }
    let per = Duration::from_secs(10);
    store
        .set_limits("q", QueueLimits::new().max_starts(Rate::new(3, per)))
        .await
        .must("K4: set_limits");
    assert_eq!(
        store.limits("q").await.must("K4: limits"),
        QueueLimits::new().max_starts(Rate::new(3, per)),
        "K4: a rate reads back as set"
    );
    expect_invalid(
        store
            .set_limits("q", QueueLimits::new().max_starts(Rate::new(0, per)))
            .await,
        "max_starts",
        "K4: a rate of 0 starts",
    );
    let mut queued = Vec::new();
    for _ in 0..7 {
        queued.push(enqueue(&store, NewJob::new("q"), "K4").await);
    }
    let open = enqueue(&store, NewJob::new("r"), "K4").await;
    let first = claim(&store, &["q", "r"], 10, "K4: the first claim").await;
    assert_eq!(
        ids(&first),
        HashSet::from([queued[0], queued[1], queued[2], open]),
        "K4: three starts of the rated queue, in order, and the other queue's job"
    );
    for job in &first {
        store
            .complete(job.id(), job.token(), None)
            .await
            .must("K4: complete");
    }
    assert_nothing_claimable(&store, &["q"], "K4: finished jobs' starts still count").await;
    env.clock.advance(per - Duration::from_millis(1));
    assert_nothing_claimable(&store, &["q"], "K4: a millisecond before the window ends").await;
    env.clock.advance(Duration::from_millis(1));
    let second = claim(&store, &["q"], 10, "K4: the window has moved on").await;
    assert_eq!(
        ids_of(&second),
        queued[3..6].to_vec(),
        "K4: `per` after the first starts, three more"
    );

    // A key's rate: one start per key per window; jobs without a key are not held.
    store
        .set_limits(
            "k",
            QueueLimits::new().max_starts_per_key(Rate::new(1, per)),
        )
        .await
        .must("K4: set_limits");
    let keyed = |key: &str| NewJob::new("k").concurrency_key(key);
    let a1 = enqueue(&store, keyed("a"), "K4").await;
    let a2 = enqueue(&store, keyed("a"), "K4").await;
    let b1 = enqueue(&store, keyed("b"), "K4").await;
    let plain = enqueue(&store, NewJob::new("k"), "K4").await;
    let plain2 = enqueue(&store, NewJob::new("k"), "K4").await;
    let keyed_claim = claim(&store, &["k"], 10, "K4: the keyed queue").await;
    assert_eq!(
        ids(&keyed_claim),
        HashSet::from([a1, b1, plain, plain2]),
        "K4: one start of each key; jobs without a key are not held by a key's rate"
    );
    env.clock.advance(per);
    let later = claim(&store, &["k"], 10, "K4: the key's window has moved on").await;
    assert_eq!(ids_of(&later), vec![a2], "K4: a's next start");
}

/// K4 (decided): `set_limits` forgets the starts of each rate its limits no longer
/// have before it returns, so a rate set again counts only the starts after it. The
/// queue's rate and a key's rate are each used up, taken away and set again within
/// their window, with the clock standing still: the next claim starts one job of each
/// again. With both rates, taking the key's away alone forgets the key's starts and
/// keeps the queue's.
pub async fn k4_limits_without_a_rate_forget_the_starts(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // A store with per-key limits only (CONTRACT P3) is checked on the key's rate.
    let queue_wide = keeps_queue_wide_limits(&store, "K4's queue-rate parts");
    let per = Duration::from_secs(3_600);
    let mut rates = vec![QueueLimits::new().max_starts_per_key(Rate::new(1, per))];
    if queue_wide {
        rates.insert(0, QueueLimits::new().max_starts(Rate::new(1, per)));
    }
    for rated in rates {
        let queue = if rated.max_starts.is_some() {
            "q0"
        } else {
            "q1"
        }
        .to_owned();
        store.set_limits(&queue, rated).await.must("K4: set a rate");
        let mut queued = Vec::new();
        for _ in 0..3 {
            let job = NewJob::new(queue.as_str()).concurrency_key("a");
            queued.push(enqueue(&store, job, "K4").await);
        }
        let first = claim(&store, &[&queue], 10, "K4: under the rate").await;
        assert_eq!(ids_of(&first), vec![queued[0]], "K4 {queue}: one start");
        assert_nothing_claimable(&store, &[&queue], "K4: the rate is used up").await;

        // Taken away and set again, the clock where it was: the start is forgotten.
        store
            .set_limits(&queue, QueueLimits::new())
            .await
            .must("K4: take the rate away");
        store
            .set_limits(&queue, rated)
            .await
            .must("K4: set the rate again");
        let again = claim(&store, &[&queue], 10, "K4: the rate set again").await;
        assert_eq!(
            ids_of(&again),
            vec![queued[1]],
            "K4 {queue}: the start taken under the old rate no longer counts"
        );
        assert_nothing_claimable(&store, &[&queue], "K4: the new rate is used up").await;

        // Limits that keep no rate but keep others forget the starts too.
        store
            .set_limits(&queue, QueueLimits::new().max_running_per_key(100))
            .await
            .must("K4: limits without a rate");
        store
            .set_limits(&queue, rated)
            .await
            .must("K4: set the rate again");
        let third = claim(&store, &[&queue], 10, "K4: the rate set once more").await;
        assert_eq!(
            ids_of(&third),
            vec![queued[2]],
            "K4 {queue}: limits without a rate forgot the starts as well"
        );
    }

    if !queue_wide {
        return;
    }
    // Both rates, and the key's taken away alone: its starts go, the queue's stay.
    let both = QueueLimits::new()
        .max_starts(Rate::new(3, per))
        .max_starts_per_key(Rate::new(1, per));
    store
        .set_limits("both", both)
        .await
        .must("K4: set both rates");
    let keyed = |key: &str| NewJob::new("both").concurrency_key(key);
    let a1 = enqueue(&store, keyed("a"), "K4").await;
    let a2 = enqueue(&store, keyed("a"), "K4").await;
    let b1 = enqueue(&store, keyed("b"), "K4").await;
    let first = claim(&store, &["both"], 10, "K4: under both rates").await;
    assert_eq!(
        ids(&first),
        HashSet::from([a1, b1]),
        "K4: one start of each key"
    );
    store
        .set_limits("both", QueueLimits::new().max_starts(Rate::new(3, per)))
        .await
        .must("K4: take the key's rate away");
    store
        .set_limits("both", both)
        .await
        .must("K4: set both rates again");
    let again = claim(&store, &["both"], 10, "K4: the key's rate set again").await;
    assert_eq!(
        ids_of(&again),
        vec![a2],
        "K4: the key's start under its old rate no longer counts"
    );
    enqueue(&store, keyed("c"), "K4").await;
    assert_nothing_claimable(
        &store,
        &["both"],
        "K4: the queue's rate stayed, and its three starts still count",
    )
    .await;
}

/// K4 with real concurrency: 16 claimers, each on a store of its own, race for 60
/// jobs of 6 keys under at most 6 starts per second and 2 per key per second; the
/// store's clock moves on 250 ms at a time once every claimer has come back empty.
/// Every start is recorded at the clock's instant; no window of a second holds more
/// starts than a rate allows, and the rate is used: every job has started once the
/// clock has moved through the windows the jobs need.
pub async fn k4_concurrent_claimers_never_start_more_than_the_rate_in_any_window(
    harness: &dyn Harness,
) {
    const KEYS: usize = 6;
    const PER_KEY: usize = 10;
    const QUEUE_RATE: usize = 6;
    const KEY_RATE: usize = 2;
    const CLAIMERS: usize = 16;
    const STEP_MS: i64 = 250;
    const WINDOW_MS: i64 = 1_000;
    let env = TestEnv::new(harness);
    let admin = env.store().await;
    if !keeps_queue_wide_limits(&admin, "K4") {
        return;
    }
    let per = Duration::from_millis(WINDOW_MS as u64);
    admin
        .set_limits(
            "q",
            QueueLimits::new()
                .max_starts(Rate::new(QUEUE_RATE as u32, per))
                .max_starts_per_key(Rate::new(KEY_RATE as u32, per)),
        )
        .await
        .must("K4: set_limits");
    let jobs: Vec<NewJob> = (0..KEYS * PER_KEY)
        .map(|n| NewJob::new("q").concurrency_key(format!("key-{}", n % KEYS)))
        .collect();
    let enqueued = admin.enqueue_batch(jobs).await.must("K4: enqueue");
    let key_of: Arc<HashMap<JobId, usize>> = Arc::new(
        enqueued
            .iter()
            .enumerate()
            .map(|(n, answer)| (answer.id, n % KEYS))
            .collect(),
    );
    let total = key_of.len();
    let mut stores = Vec::new();
    for _ in 0..CLAIMERS {
        stores.push(Arc::new(env.store().await));
    }
    // (instant in ms since the scenario began, job, key)
    let history: Arc<Mutex<Vec<(i64, JobId, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    // The windows the jobs need at the rate, and one more step of slack.
    let steps_needed = (total / QUEUE_RATE) as i64 * (WINDOW_MS / STEP_MS) + 1;
    let mut step = 0i64;
    while history.lock().unwrap_or_else(|p| p.into_inner()).len() < total {
        assert!(
            step <= steps_needed,
            "K4: {} of {total} jobs started after {step} steps of {STEP_MS} ms: the \
             rate admits fewer starts than it allows",
            history.lock().unwrap_or_else(|p| p.into_inner()).len()
        );
        let at = step * STEP_MS;
        let mut claimers = Vec::new();
        for store in &stores {
            let (store, key_of, history) = (store.clone(), key_of.clone(), history.clone());
            claimers.push(tokio::spawn(async move {
                loop {
                    let claimed = claim(&store, &["q"], 2, "K4: a racing claim").await;
                    if claimed.is_empty() {
                        return;
                    }
                    for job in &claimed {
                        history.lock().unwrap_or_else(|p| p.into_inner()).push((
                            at,
                            job.id(),
                            key_of[&job.id()],
                        ));
                        store
                            .complete(job.id(), job.token(), None)
                            .await
                            .must("K4: complete");
                    }
                }
            }));
        }
        join_all(claimers).await;
        env.clock.advance(Duration::from_millis(STEP_MS as u64));
        step += 1;
    }
    let mut starts = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    starts.sort_by_key(|(at, _, _)| *at);
    let distinct: HashSet<JobId> = starts.iter().map(|(_, job, _)| *job).collect();
    assert_eq!(distinct.len(), total, "K4: every job started exactly once");
    for (n, (from, _, _)) in starts.iter().enumerate() {
        let window: Vec<&(i64, JobId, usize)> = starts[n..]
            .iter()
            .take_while(|(at, _, _)| *at < from + WINDOW_MS)
            .collect();
        assert!(
            window.len() <= QUEUE_RATE,
            "K4: {} starts in the second from {from} ms, above the queue's rate of \
             {QUEUE_RATE}",
            window.len()
        );
        for key in 0..KEYS {
            let of_key = window.iter().filter(|(_, _, k)| *k == key).count();
            assert!(
                of_key <= KEY_RATE,
                "K4: {of_key} starts of key-{key} in the second from {from} ms, above its \
                 rate of {KEY_RATE}"
            );
        }
    }
}

/// K5 (decided): limits without fair shares forget the queue's turns before
/// `set_limits` returns, so fair shares set again start with the first key. Key `a`
/// holds three jobs and `b`, `c` one each; after each claim of one job (which leaves
/// the turn at `a`) fair shares are taken away (by unlimited limits, then by limits
/// that keep only a running limit) and set again: the next claim starts at `a` again,
/// not at `b`.
pub async fn k5_limits_without_fair_shares_forget_the_turns(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_queue_wide_limits(&store, "K5") {
        return;
    }
    let fair = QueueLimits::new().fair_shares(true);
    store
        .set_limits("q", fair)
        .await
        .must("K5: set fair shares");
    let keyed = |key: &str| NewJob::new("q").concurrency_key(key);
    let mut a = Vec::new();
    for _ in 0..3 {
        a.push(enqueue(&store, keyed("a"), "K5").await);
    }
    let b = enqueue(&store, keyed("b"), "K5").await;
    enqueue(&store, keyed("c"), "K5").await;
    let first = claim(&store, &["q"], 1, "K5: the first turn").await;
    assert_eq!(ids_of(&first), vec![a[0]], "K5: the first key's first job");

    let without = [QueueLimits::new(), QueueLimits::new().max_running(100)];
    for (round, limits) in without.into_iter().enumerate() {
        store
            .set_limits("q", limits)
            .await
            .must("K5: take fair shares away");
        store
            .set_limits("q", fair)
            .await
            .must("K5: set fair shares again");
        let next = claim(&store, &["q"], 1, "K5: fair shares set again").await;
        assert_ne!(
            ids_of(&next),
            vec![b],
            "K5 round {round}: the turn left at `a` was kept through limits without fair shares"
        );
        assert_eq!(
            ids_of(&next),
            vec![a[round + 1]],
            "K5 round {round}: fair shares set again start with the first key"
        );
    }
}

/// K5: a fair queue's claims take its keys in turn within a priority, jobs without a
/// key first, each key's jobs in claim order, round after round; the turn is the
/// queue's, kept across claims and handles. A higher priority still goes first, a key
/// at its running limit loses its turn, and the same jobs on a queue without fair
/// shares come out in plain claim order.
pub async fn k5_claims_take_turns_over_the_keys_of_a_fair_queue(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let first = env.store().await;
    if !keeps_queue_wide_limits(&first, "K5") {
        return;
    }
    let second = env.store().await;
    let fair = QueueLimits::new().fair_shares(true);
    for store in [&first, &second] {
        assert!(store.limits("q").await.must("K5").is_unlimited());
    }
    first.set_limits("q", fair).await.must("K5: set_limits");
    assert_eq!(
        second.limits("q").await.must("K5: limits"),
        fair,
        "K5: fair shares read back"
    );
    let keyed = |queue: &str, key: &str| NewJob::new(queue).concurrency_key(key);
    let mut enqueued: HashMap<&str, Vec<JobId>> = HashMap::new();
    // Enqueued a key at a time: claim order alone would take all of a's first.
    for (key, count) in [("a", 5), ("b", 2), ("c", 2)] {
        for _ in 0..count {
            let id = enqueue(&first, keyed("q", key), "K5").await;
            enqueued.entry(key).or_default().push(id);
        }
    }
    for _ in 0..2 {
        let id = enqueue(&first, NewJob::new("q"), "K5").await;
        enqueued.entry("").or_default().push(id);
    }
    let job = |key: &str, n: usize| enqueued[key][n];
    // One job per claim, through both handles in turn.
    let expected = [
        job("", 0),
        job("a", 0),
        job("b", 0),
        job("c", 0),
        job("", 1),
        job("a", 1),
        job("b", 1),
    ];
    for (n, want) in expected.iter().enumerate() {
        let store = if n % 2 == 0 { &first } else { &second };
        let got = claim(store, &["q"], 1, "K5: one job per claim").await;
        assert_eq!(
            ids_of(&got),
            vec![*want],
            "K5: claim {n} takes the next key's turn (jobs without a key, then a, b, c, \
             round after round)"
        );
    }
    // A fitted claim (a budget admitting everything) keeps its own order, claim order,
    // and leaves the turn where it was (at b).
    let fitted = first
        .claim(request(&["q"], WORKER, TTL, 1).budget(durq_core::Budget::new()))
        .await
        .must("K5: a fitted claim");
    assert_eq!(
        ids_of(&fitted),
        vec![job("a", 2)],
        "K5: a fitted claim takes claim order (a's oldest job left), not the turn"
    );
    // A batch goes on from the turn, round after round: c, then a twice (b and the
    // jobs without a key are done).
    let batch = claim(&second, &["q"], 3, "K5: a batch").await;
    assert_eq!(
        ids_of(&batch),
        vec![job("c", 1), job("a", 3), job("a", 4)],
        "K5: a batch takes the keys in turn from where the last plain claim stopped"
    );
    // A higher priority first; then the turns go on.
    let urgent = enqueue(&first, keyed("q", "b").priority(5), "K5").await;
    let late_c = enqueue(&first, keyed("q", "c"), "K5").await;
    let late_a = enqueue(&first, keyed("q", "a"), "K5").await;
    let got = claim(&first, &["q"], 2, "K5: with a higher priority").await;
    assert_eq!(
        ids_of(&got),
        vec![urgent, late_c],
        "K5: priority first, then the turns (after a: c before a)"
    );
    assert_eq!(get(&first, late_a, "K5").await.state, JobState::Queued);

    // A key at its running limit loses its turn, holding back no other key.
    first
        .set_limits("p", fair.max_running_per_key(1))
        .await
        .must("K5: set_limits");
    let x1 = enqueue(&first, keyed("p", "x"), "K5").await;
    let x2 = enqueue(&first, keyed("p", "x"), "K5").await;
    let y1 = enqueue(&first, keyed("p", "y"), "K5").await;
    let y2 = enqueue(&first, keyed("p", "y"), "K5").await;
    let got = claim(&first, &["p"], 4, "K5: with a running limit").await;
    assert_eq!(
        ids_of(&got),
        vec![x1, y1],
        "K5: one of each key, their second jobs held back by the limit"
    );
    assert_eq!(get(&first, x2, "K5").await.state, JobState::Queued);
    assert_eq!(get(&first, y2, "K5").await.state, JobState::Queued);

    // The same jobs without fair shares: plain claim order.
    let plain: Vec<JobId> = {
        let mut ids = Vec::new();
        for key in ["a", "a", "b"] {
            ids.push(enqueue(&first, keyed("r", key), "K5").await);
        }
        ids
    };
    let got = claim(&first, &["r"], 3, "K5: a queue without fair shares").await;
    assert_eq!(ids_of(&got), plain, "K5: claim order without fair shares");
}

/// K5 at scale: one key holds 100,000 ready jobs, enqueued first, and 50 keys hold 10
/// each. 16 claimers, each on a store of its own, race for them 32 at a time (as a
/// worker's claim loop does) and record the order of what they took; every small
/// key's jobs have all started before the big key's 2,000th start.
pub async fn k5_a_deep_key_does_not_starve_the_keys_behind_it(harness: &dyn Harness) {
    const BIG: usize = 100_000;
    const SMALL_KEYS: usize = 50;
    const PER_SMALL_KEY: usize = 10;
    const CLAIMERS: usize = 16;
    const BOUND: usize = 2_000;
    let env = TestEnv::new(harness);
    let admin = env.store().await;
    if !keeps_queue_wide_limits(&admin, "K5") {
        return;
    }
    admin
        .set_limits("q", QueueLimits::new().fair_shares(true))
        .await
        .must("K5: set_limits");
    let big: Vec<NewJob> = (0..BIG)
        .map(|_| NewJob::new("q").concurrency_key("a-big"))
        .collect();
    for chunk in big.chunks(5_000) {
        admin
            .enqueue_batch(chunk.to_vec())
            .await
            .must("K5: enqueue the big key");
    }
    let small: Vec<NewJob> = (0..SMALL_KEYS * PER_SMALL_KEY)
        .map(|n| NewJob::new("q").concurrency_key(format!("k-{:02}", n % SMALL_KEYS)))
        .collect();
    let small_ids: HashSet<JobId> = admin
        .enqueue_batch(small)
        .await
        .must("K5: enqueue the small keys")
        .into_iter()
        .map(|answer| answer.id)
        .collect();
    let small_ids = Arc::new(small_ids);
    // (the order a claim returned in, started a small key's job)
    let history: Arc<Mutex<Vec<(u64, bool)>>> = Arc::new(Mutex::new(Vec::new()));
    let order = Arc::new(AtomicU64::new(0));
    let small_left = Arc::new(AtomicUsize::new(small_ids.len()));
    // Past the bound the outcome is known: the claimers stop there.
    let big_started = Arc::new(AtomicUsize::new(0));
    let mut claimers = Vec::new();
    for _ in 0..CLAIMERS {
        let store = env.store().await;
        let (small_ids, history, order, small_left, big_started) = (
            small_ids.clone(),
            history.clone(),
            order.clone(),
            small_left.clone(),
            big_started.clone(),
        );
        claimers.push(tokio::spawn(async move {
            while small_left.load(Ordering::SeqCst) > 0
                && big_started.load(Ordering::SeqCst) < BOUND
            {
                let claimed = claim(&store, &["q"], 32, "K5: a racing claim").await;
                assert!(!claimed.is_empty(), "K5: jobs are left to claim");
                let mut history = history.lock().unwrap_or_else(|p| p.into_inner());
                for job in &claimed {
                    let is_small = small_ids.contains(&job.id());
                    if is_small {
                        small_left.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        big_started.fetch_add(1, Ordering::SeqCst);
                    }
                    history.push((order.fetch_add(1, Ordering::SeqCst), is_small));
                }
            }
        }));
    }
    join_all(claimers).await;
    let mut history = history
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    history.sort_by_key(|(at, _)| *at);
    let small_started = history.iter().filter(|(_, is_small)| *is_small).count();
    assert_eq!(
        small_started,
        SMALL_KEYS * PER_SMALL_KEY,
        "K5: {small_started} of the small keys' jobs started (each once) before the big \
         key's {BOUND}th start; fair shares start them all first"
    );
    let last_small = history
        .iter()
        .rposition(|(_, is_small)| *is_small)
        .unwrap_or(0);
    let big_before = history[..last_small]
        .iter()
        .filter(|(_, is_small)| !is_small)
        .count();
    assert!(
        big_before < BOUND,
        "K5: the big key started {big_before} jobs before the small keys' last; fair \
         shares allow fewer than {BOUND}"
    );
}

/// K3: `flow_status` shows what a queue's limits hold back at the store's now: its
/// running jobs, the keys at their running limit, when its rate admits a start again
/// and which keys' rates are used up (until when); a queue without limits shows its
/// running jobs alone.
pub async fn k3_flow_status_shows_what_the_limits_hold_back(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_queue_wide_limits(&store, "K3") {
        return;
    }
    let per = Duration::from_secs(10);
    store
        .set_limits(
            "q",
            QueueLimits::new()
                .max_running_per_key(1)
                .max_starts(Rate::new(3, per))
                .max_starts_per_key(Rate::new(1, per)),
        )
        .await
        .must("K3: set_limits");
    let empty = store.flow_status("q").await.must("K3: flow_status");
    assert_eq!(
        (
            empty.running,
            empty.keys_at_limit.len(),
            empty.next_start,
            empty.keys_rate_limited.len()
        ),
        (0, 0, None, 0),
        "K3: nothing held back before any job"
    );
    let keyed = |key: &str| NewJob::new("q").concurrency_key(key);
    let a1 = enqueue(&store, keyed("a"), "K3").await;
    enqueue(&store, keyed("a"), "K3").await;
    enqueue(&store, keyed("b"), "K3").await;
    enqueue(&store, keyed("c"), "K3").await;
    enqueue(&store, NewJob::new("q"), "K3").await;
    let started_at = env.clock.now();
    let running = claim(&store, &["q"], 10, "K3: the claim").await;
    assert_eq!(running.len(), 3, "K3: the queue's rate admits three starts");
    let status = store.flow_status("q").await.must("K3: flow_status");
    let frees = started_at.saturating_add(per);
    assert_eq!(status.running, 3, "K3: the queue's running jobs");
    assert_eq!(
        status.keys_at_limit,
        vec![
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("c".to_owned(), 1)
        ],
        "K3: the keys at their running limit, by key"
    );
    assert_eq!(
        status.next_start,
        Some(frees),
        "K3: the queue's rate admits a start again `per` after the first"
    );
    assert_eq!(
        status.keys_rate_limited,
        vec![
            ("a".to_owned(), frees),
            ("b".to_owned(), frees),
            ("c".to_owned(), frees)
        ],
        "K3: the keys whose rate is used up, and until when"
    );

    env.clock.advance(per);
    let first = running
        .iter()
        .find(|job| job.id() == a1)
        .must("K3: a's first job runs");
    store
        .complete(a1, first.token(), None)
        .await
        .must("K3: complete");
    let later = store.flow_status("q").await.must("K3: flow_status");
    assert_eq!(later.running, 2);
    assert_eq!(
        later.keys_at_limit,
        vec![("b".to_owned(), 1), ("c".to_owned(), 1)],
        "K3: a key whose job ended is no longer at its limit"
    );
    assert_eq!(
        (later.next_start, later.keys_rate_limited.len()),
        (None, 0),
        "K3: the windows have moved on"
    );

    enqueue(&store, NewJob::new("plain"), "K3").await;
    claim(&store, &["plain"], 1, "K3: a queue without limits").await;
    let plain = store.flow_status("plain").await.must("K3: flow_status");
    assert_eq!(
        (
            plain.running,
            plain.keys_at_limit.len(),
            plain.next_start,
            plain.keys_rate_limited.len()
        ),
        (1, 0, None, 0),
        "K3: a queue without limits shows its running jobs alone"
    );
}

/// K4: a claimer waiting for work on a queue whose rate (or, on a store with per-key
/// limits only, whose key's rate) holds its jobs back is told when to look again: with
/// the rate's window 1 ms long and the clock moved past it,
/// `wait_for_work` with a minute's timeout returns at once (well inside 20 s), and the
/// next claim takes the job.
pub async fn k4_a_wait_ends_when_the_rate_frees_a_start(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The queue's rate; on a store with per-key limits only (CONTRACT P3), a key's.
    let rate = Rate::new(1, Duration::from_millis(1));
    let (limits, job) = if keeps_queue_wide_limits(&store, "K4's queue rate") {
        (QueueLimits::new().max_starts(rate), NewJob::new("q"))
    } else {
        (
            QueueLimits::new().max_starts_per_key(rate),
            NewJob::new("q").concurrency_key("a"),
        )
    };
    store.set_limits("q", limits).await.must("K4: set_limits");
    enqueue(&store, job.clone(), "K4").await;
    let held = enqueue(&store, job, "K4").await;
    assert_eq!(
        claim(&store, &["q"], 10, "K4: the first start").await.len(),
        1
    );
    assert_nothing_claimable(&store, &["q"], "K4: the window is used up").await;
    let queues = vec!["q".to_owned()];
    let wait = store.wait_for_work(&queues, Duration::from_secs(60));
    let moved = async {
        env.clock.advance(Duration::from_millis(1));
    };
    let Ok((waited, ())) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(wait, moved) }).await
    else {
        panic!("K4: the wait ends when the rate frees a start, not at its timeout");
    };
    waited.must("K4: wait_for_work");
    let next = claim(&store, &["q"], 10, "K4: after the window").await;
    assert_eq!(ids_of(&next), vec![held], "K4: the held-back job starts");
}

/// K3: each list of `flow_status` holds at most `FLOW_KEYS_SHOWN` (100) keys, the first
/// by key (byte order), however many keys are held back: 120 keys at their running
/// limit and their rate, enqueued in reverse key order so that neither the order of
/// the jobs nor that of the starts gives the answer.
pub async fn k3_flow_status_shows_the_first_keys_by_key(harness: &dyn Harness) {
    const KEYS: usize = 120;
    let env = TestEnv::new(harness);
    let store = env.store().await;
    store
        .set_limits(
            "q",
            QueueLimits::new()
                .max_running_per_key(1)
                .max_starts_per_key(Rate::new(1, Duration::from_secs(60))),
        )
        .await
        .must("K3: set_limits");
    let key = |n: usize| format!("key-{n:03}");
    let jobs: Vec<NewJob> = (0..KEYS)
        .rev()
        .map(|n| NewJob::new("q").concurrency_key(key(n)))
        .collect();
    store
        .enqueue_batch(jobs)
        .await
        .must("K3: enqueue one job per key");
    let running = claim(&store, &["q"], KEYS, "K3: start every key").await;
    assert_eq!(running.len(), KEYS, "K3: every key starts its one job");
    let status = store.flow_status("q").await.must("K3: flow_status");
    let shown: Vec<String> = (0..durq_core::FLOW_KEYS_SHOWN).map(key).collect();
    assert_eq!(
        status
            .keys_at_limit
            .iter()
            .map(|(key, _)| key.clone())
            .collect::<Vec<_>>(),
        shown,
        "K3: the first {} keys at their running limit, by key",
        durq_core::FLOW_KEYS_SHOWN
    );
    assert_eq!(
        status
            .keys_rate_limited
            .iter()
            .map(|(key, _)| key.clone())
            .collect::<Vec<_>>(),
        shown,
        "K3: the first {} keys whose rate is used up, by key",
        durq_core::FLOW_KEYS_SHOWN
    );
    assert_eq!(status.running, KEYS as u64, "K3: every running job counts");
}

/// K1, K2 with F5: a claim that prefers a locality spends its keys' and its queue's
/// slots in its own order, the preferred jobs of a priority first. A preferred job
/// behind a job of the same key at its limit of one is the one taken, and so is a
/// preferred job behind another of a queue limited to one running job; what the claim
/// passes over stays queued for the next.
pub async fn k1_a_preferring_claim_admits_in_its_own_order(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    store
        .set_limits("q", QueueLimits::new().max_running_per_key(1))
        .await
        .must("K1: set_limits");
    let near = enqueue(&store, NewJob::new("q").concurrency_key("a"), "K1").await;
    let here = enqueue(
        &store,
        NewJob::new("q").concurrency_key("a").locality("here"),
        "K1",
    )
    .await;
    let first = store
        .claim(request(&["q"], WORKER, TTL, 10).prefer(["here"]))
        .await
        .must("K1: a claim preferring a locality");
    assert_eq!(
        ids_of(&first),
        vec![here],
        "K1, F5: key a's one slot goes to the job the claim prefers, not to the older one"
    );
    assert_nothing_claimable(&store, &["q"], "K1: key a is at its limit").await;
    assert_eq!(get(&store, near, "K1").await.state, JobState::Queued);

    if !keeps_queue_wide_limits(&store, "K1's queue-wide part (K2)") {
        return;
    }
    store
        .set_limits("r", QueueLimits::new().max_running(1))
        .await
        .must("K2: set_limits");
    let older = enqueue(&store, NewJob::new("r"), "K2").await;
    let local = enqueue(&store, NewJob::new("r").locality("here"), "K2").await;
    let claimed = store
        .claim(request(&["r"], WORKER, TTL, 10).prefer(["here"]))
        .await
        .must("K2: a claim preferring a locality");
    assert_eq!(
        ids_of(&claimed),
        vec![local],
        "K2, F5: the queue's one slot goes to the job the claim prefers"
    );
    assert_eq!(get(&store, older, "K2").await.state, JobState::Queued);
}

/// K1, K2, K4 hold for fitted claims too (F2–F6): a claim with a budget, one with a
/// preferred locality and a reservation each pass over a job whose key is at its
/// running limit, take none of a queue at its running limit, and start no more than
/// its rate admits, as a plain claim does.
pub async fn k1_fitted_claims_keep_the_limits(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    if !keeps_queue_wide_limits(&store, "K1") {
        return;
    }
    store
        .set_limits(
            "q",
            QueueLimits::new().max_running_per_key(1).max_running(3),
        )
        .await
        .must("K1: set_limits");
    let keyed = |key: &str| NewJob::new("q").concurrency_key(key);
    let a1 = enqueue(&store, keyed("a"), "K1").await;
    let a2 = enqueue(&store, keyed("a"), "K1").await;
    let b1 = enqueue(&store, keyed("b"), "K1").await;
    let plain = enqueue(&store, NewJob::new("q"), "K1").await;
    let extra = enqueue(&store, NewJob::new("q"), "K1").await;
    let budget = durq_core::Budget::new();
    let fitted = store
        .claim(request(&["q"], WORKER, TTL, 10).budget(budget.clone()))
        .await
        .must("K1: a fitted claim");
    assert_eq!(
        ids_of(&fitted),
        vec![a1, b1, plain],
        "K1, K2: a fitted claim passes over a's second job and stops at the queue's limit of 3"
    );
    let reserved = store
        .claim(request(&["q"], WORKER, TTL, 1).reserved(a2))
        .await
        .must("K1: a reserved claim");
    assert!(
        reserved.is_empty(),
        "K1: a reservation of a job whose key is at its limit takes nothing"
    );
    let preferring = store
        .claim(request(&["q"], WORKER, TTL, 10).prefer(["here"]))
        .await
        .must("K2: a claim preferring a locality");
    assert!(
        preferring.is_empty(),
        "K2: a claim with a preference takes nothing of a queue at its running limit"
    );
    assert_eq!(get(&store, a2, "K1").await.state, JobState::Queued);
    assert_eq!(get(&store, extra, "K1").await.state, JobState::Queued);

    store
        .set_limits(
            "r",
            QueueLimits::new().max_starts(Rate::new(2, Duration::from_secs(60))),
        )
        .await
        .must("K4: set_limits");
    for _ in 0..4 {
        enqueue(&store, NewJob::new("r"), "K4").await;
    }
    let first = store
        .claim(request(&["r"], WORKER, TTL, 10).budget(budget.clone()))
        .await
        .must("K4: a fitted claim");
    assert_eq!(
        first.len(),
        2,
        "K4: a fitted claim starts what the rate admits"
    );
    let second = store
        .claim(request(&["r"], WORKER, TTL, 10).budget(budget))
        .await
        .must("K4: a fitted claim");
    assert!(
        second.is_empty(),
        "K4: the window is used up for fitted claims too"
    );
}
