//! The shared group-commit batcher: every bound it promises, under real concurrency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use durq_core::batch::{Batch, Batcher, Limits};
use durq_core::{Error, Result};
use futures_util::FutureExt as _;
use tokio::sync::watch;

/// A call: its number, its size in bytes and an optional exclusivity key.
#[derive(Debug, Clone, Copy)]
struct Call {
    n: usize,
    bytes: usize,
    key: Option<u8>,
}

fn call(n: usize) -> Call {
    Call {
        n,
        bytes: 1,
        key: None,
    }
}

/// What the batches saw.
#[derive(Default)]
struct Seen {
    batches: Mutex<Vec<Vec<Call>>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// The answers handed back because their callers had stopped waiting.
    undelivered: Mutex<Vec<usize>>,
}

/// Answers each call with its number doubled, once the gate is open.
struct Doubler<const CALLS: usize, const BYTES: usize, const IN_FLIGHT: usize, const QUEUED: usize>
{
    seen: Arc<Seen>,
    gate: watch::Receiver<bool>,
    /// A batch holding this call number fails as a whole.
    poison: Option<usize>,
    /// Answers one call fewer than asked.
    short: bool,
}

impl<const CALLS: usize, const BYTES: usize, const IN_FLIGHT: usize, const QUEUED: usize> Batch
    for Doubler<CALLS, BYTES, IN_FLIGHT, QUEUED>
{
    type Call = Call;
    type Answer = usize;
    type Key = u8;

    const LIMITS: Limits = Limits {
        max_calls: CALLS,
        max_bytes: BYTES,
        in_flight: IN_FLIGHT,
        queued: QUEUED,
    };

    fn key(call: &Call) -> Option<u8> {
        call.key
    }

    fn size(call: &Call) -> usize {
        call.bytes
    }

    async fn run(&self, calls: &[Call]) -> Result<Vec<usize>> {
        let running = self.seen.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.most_running.fetch_max(running, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        self.seen
            .batches
            .lock()
            .expect("batches lock")
            .push(calls.to_vec());
        self.seen.running.fetch_sub(1, Ordering::SeqCst);
        if calls.iter().any(|c| Some(c.n) == self.poison) {
            return Err(Error::Unavailable {
                message: "poisoned batch".to_owned(),
                source: None,
            });
        }
        let take = if self.short {
            calls.len() - 1
        } else {
            calls.len()
        };
        Ok(calls.iter().take(take).map(|c| c.n * 2).collect())
    }

    async fn undelivered(&self, answer: usize) {
        self.seen
            .undelivered
            .lock()
            .expect("undelivered lock")
            .push(answer);
    }
}

fn doubler<const C: usize, const B: usize, const F: usize, const Q: usize>(
    open: bool,
) -> (Batcher<Doubler<C, B, F, Q>>, Arc<Seen>, watch::Sender<bool>) {
    let seen = Arc::new(Seen::default());
    let (gate, rx) = watch::channel(open);
    let batcher = Batcher::new(Doubler {
        seen: Arc::clone(&seen),
        gate: rx,
        poison: None,
        short: false,
    });
    (batcher, seen, gate)
}

fn batches(seen: &Seen) -> Vec<Vec<Call>> {
    seen.batches.lock().expect("batches lock").clone()
}

/// Starts `calls` concurrent callers and returns their answers, by call number.
async fn call_all<B>(batcher: &Arc<Batcher<B>>, calls: Vec<Call>) -> Vec<Result<usize>>
where
    B: Batch<Call = Call, Answer = usize>,
{
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|c| {
            let batcher = Arc::clone(batcher);
            tokio::spawn(async move { batcher.call(c).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("caller task"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_call_goes_out_alone() {
    let (batcher, seen, _gate) = doubler::<8, 100, 2, 16>(true);
    assert_eq!(batcher.call(call(21)).await.expect("answer"), 42);
    let batches = batches(&seen);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_waiting_behind_a_batch_share_the_next_up_to_max_calls() {
    let (batcher, seen, gate) = doubler::<8, 1000, 1, 200>(false);
    let batcher = Arc::new(batcher);
    let callers = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { call_all(&batcher, (0..100).map(call).collect()).await })
    };
    // The first batch holds its slot until the gate opens, so the rest pile up.
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gate.send_replace(true);
    let answers = callers.await.expect("callers");
    for (n, answer) in answers.into_iter().enumerate() {
        assert_eq!(
            answer.expect("answer"),
            n * 2,
            "call {n} got another's answer"
        );
    }
    let batches = batches(&seen);
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        100,
        "every call ran once: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&s| s <= 8),
        "a batch over max_calls: {sizes:?}"
    );
    assert!(
        sizes.contains(&8),
        "calls that waited were not gathered: {sizes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_stays_within_max_bytes_but_a_larger_call_goes_alone() {
    let (batcher, seen, gate) = doubler::<100, 10, 1, 100>(false);
    let batcher = Arc::new(batcher);
    let first = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { batcher.call(call(0)).await })
    };
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let mut calls: Vec<Call> = (1..20)
        .map(|n| Call {
            n,
            bytes: 4,
            key: None,
        })
        .collect();
    calls.push(Call {
        n: 20,
        bytes: 25,
        key: None,
    });
    let rest = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { call_all(&batcher, calls).await })
    };
    gate.send_replace(true);
    first.await.expect("first").expect("answer");
    for answer in rest.await.expect("rest") {
        answer.expect("answer");
    }
    for batch in batches(&seen) {
        let bytes: usize = batch.iter().map(|c| c.bytes).sum();
        assert!(
            bytes <= 10 || batch.len() == 1,
            "a batch of {} calls carried {bytes} bytes",
            batch.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_with_one_key_never_share_a_batch() {
    let (batcher, seen, gate) = doubler::<50, 1000, 2, 200>(false);
    let batcher = Arc::new(batcher);
    let calls: Vec<Call> = (0..120)
        .map(|n| Call {
            n,
            bytes: 1,
            key: u8::try_from(n % 3).ok(),
        })
        .collect();
    let callers = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { call_all(&batcher, calls).await })
    };
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gate.send_replace(true);
    for answer in callers.await.expect("callers") {
        answer.expect("answer");
    }
    let batches = batches(&seen);
    assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 120);
    for batch in &batches {
        let mut keys: Vec<u8> = batch.iter().filter_map(|c| c.key).collect();
        let all = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), all, "one key twice in a batch: {batch:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_in_flight_reach_but_never_pass_the_limit() {
    let (batcher, seen, gate) = doubler::<1, 1000, 3, 200>(false);
    let batcher = Arc::new(batcher);
    let callers = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { call_all(&batcher, (0..40).map(call).collect()).await })
    };
    // Every slot fills while the gate is closed; a fourth batch would be a bug.
    while seen.running.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(seen.running.load(Ordering::SeqCst), 3);
    gate.send_replace(true);
    for answer in callers.await.expect("callers") {
        answer.expect("answer");
    }
    assert_eq!(seen.most_running.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_holds_callers_back() {
    // One batch of one call runs; behind it at most two gathered and two queued.
    let (batcher, seen, gate) = doubler::<1, 1000, 1, 2>(false);
    let batcher = Arc::new(batcher);
    let callers: Vec<_> = (0..30)
        .map(|n| {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.call(call(n)).await })
        })
        .collect();
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    // A caller dropped while it waits for room leaves nothing queued; one dropped after
    // it was queued still runs. So what runs after the gate opens is what was let in.
    for caller in &callers {
        caller.abort();
    }
    for caller in callers {
        let _ = caller.await;
    }
    gate.send_replace(true);
    // Batches run one at a time in arrival order, so this one runs after the rest.
    assert_eq!(batcher.call(call(1000)).await.expect("last call"), 2000);
    let ran: usize = batches(&seen)
        .iter()
        .flatten()
        .filter(|c| c.n != 1000)
        .count();
    assert!(
        (1..=5).contains(&ran),
        "{ran} of 30 calls were let in past a queue of 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_batch_fails_each_of_its_callers_and_no_other() {
    let seen = Arc::new(Seen::default());
    let (gate, rx) = watch::channel(false);
    let batcher = Arc::new(Batcher::new(Doubler::<4, 1000, 1, 100> {
        seen: Arc::clone(&seen),
        gate: rx,
        poison: Some(5),
        short: false,
    }));
    let callers = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { call_all(&batcher, (0..20).map(call).collect()).await })
    };
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gate.send_replace(true);
    let answers = callers.await.expect("callers");
    let poisoned: Vec<usize> = batches(&seen)
        .into_iter()
        .find(|b| b.iter().any(|c| c.n == 5))
        .expect("the poisoned batch ran")
        .iter()
        .map(|c| c.n)
        .collect();
    for (n, answer) in answers.into_iter().enumerate() {
        match answer {
            Err(Error::Unavailable { message, .. }) if poisoned.contains(&n) => {
                assert_eq!(message, "poisoned batch");
            }
            Ok(doubled) if !poisoned.contains(&n) => assert_eq!(doubled, n * 2),
            other => panic!("call {n} (poisoned batch {poisoned:?}) got {other:?}"),
        }
    }
}

/// A caller that stops waiting after its call was queued leaves its answer to
/// `Batch::undelivered` (where a batch of claims gives the jobs back); an answer its
/// caller took never goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_whose_caller_left_is_handed_back() {
    let (batcher, seen, gate) = doubler::<8, 100, 1, 16>(false);
    let batcher = Arc::new(batcher);
    let gone = {
        let batcher = Arc::clone(&batcher);
        tokio::spawn(async move { batcher.call(call(3)).await })
    };
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    gone.abort();
    assert!(gone.await.is_err_and(|err| err.is_cancelled()));
    gate.send_replace(true);
    let handed_back = async {
        while seen
            .undelivered
            .lock()
            .expect("undelivered lock")
            .is_empty()
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), handed_back)
        .await
        .expect("the answer is handed back");
    assert_eq!(batcher.call(call(4)).await.expect("answer"), 8);
    assert_eq!(
        *seen.undelivered.lock().expect("undelivered lock"),
        vec![6],
        "only the abandoned call's answer is handed back"
    );
}

#[tokio::test]
async fn a_batch_that_answers_too_few_fails_as_corrupt() {
    let (_gate, rx) = watch::channel(true);
    let batcher = Batcher::new(Doubler::<4, 1000, 1, 100> {
        seen: Arc::default(),
        gate: rx,
        poison: None,
        short: true,
    });
    match batcher.call(call(1)).await {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("expected a corrupt batch, got {other:?}"),
    }
}

#[test]
fn a_batcher_outlives_its_runtime_and_starts_again_on_the_next() {
    let (batcher, seen, _gate) = doubler::<8, 100, 2, 16>(true);
    for n in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let answer = runtime.block_on(batcher.call(call(n)));
        assert_eq!(answer.expect("answer"), n * 2);
        drop(runtime);
    }
    assert_eq!(batches(&seen).len(), 3);
}

#[test]
fn a_call_outside_a_runtime_is_refused_not_a_panic() {
    let (batcher, seen, _gate) = doubler::<8, 100, 2, 16>(true);
    match batcher.call(call(1)).now_or_never() {
        Some(Err(Error::Unavailable { message, .. })) => {
            assert!(message.contains("Tokio runtime"), "{message}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(batches(&seen).is_empty());
}
