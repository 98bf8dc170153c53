//! What the claimers of one store know of the head of each queue set's ready order.
//!
//! A claim script leases only jobs whose hashes it was given in KEYS (a script touches
//! only its declared keys, so it is ready for Redis Cluster), so a call must name the
//! jobs it will find at the head before it runs. Each call answers with a hint: the ids
//! at the head after it ran. The claimers of one store share one prediction per queue
//! set, built from those hints, and each call takes the next slice of it:
//!
//! - A call takes its slice and is put on the connection while it holds the head's
//!   *turn*, so calls reach the server in the order they took their slices, and a call
//!   sent behind another holds the jobs the other will leave at the head. Several calls
//!   are in flight at once and the server never waits for a client's round trip.
//! - An answer replaces the prediction with its hint, less the slices of the calls sent
//!   after it (they are on their way to lease those jobs).
//! - A claimer that finds less than it wants predicted waits for the next answer while a
//!   call is in flight, rather than send a call that would lease nothing.
//! - A wake-up that names the jobs an enqueue made ready ([`Heads::seed`]) is the
//!   prediction of a queue whose claims have none: a claimer woken on an empty queue
//!   leases the new jobs in its first call.
//!
//! All of it only saves calls: the script decides every claim alone and leases only
//! what is at the head when it runs. A slice that is no longer the head (another
//! process claimed it, a call was cancelled, the connection reordered two calls) makes
//! one call lease less, and its answer sets the prediction right again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use durq_core::JobId;
use tokio::sync::{Notify, OwnedMutexGuard};

/// Calls of one queue set a hint covers when several claims of this store run at once:
/// the answer of one call feeds the call sent behind it and the one after, so a call is
/// always on its way while the server runs another.
const CALLS_AHEAD: usize = 2;
/// Extra ids a hint names beyond the claims it feeds: the next claim usually needs one
/// call even when a few entries at the head turn out stale.
const HINT_SLACK: usize = 16;
/// Queue sets whose state is kept before the ones no claim uses are dropped.
const MAX_HEADS: usize = 256;

/// The heads of every queue set this store claims from, by key.
#[derive(Default)]
pub(crate) struct Heads {
    heads: Mutex<HashMap<String, Arc<Head>>>,
}

impl Heads {
    /// The head of `key` (a queue set, with the kind of claim), with this claim counted
    /// among its claimers until the returned handle is dropped.
    pub(super) fn claimer(&self, key: String) -> Claimer {
        let head = {
            let mut heads = lock(&self.heads);
            if heads.len() > MAX_HEADS {
                heads.retain(|_, head| Arc::strong_count(head) > 1);
            }
            Arc::clone(heads.entry(key).or_default())
        };
        lock(&head.plan).claimers += 1;
        Claimer { head }
    }
}

impl Heads {
    /// Whether the plain claims of `queues` (joined by `,`) hold a prediction of ready
    /// jobs: a wake-up or the last call's hint named some. A partitioned store visits
    /// such partitions first, so a woken claimer goes straight to the new jobs.
    pub(crate) fn predicts(&self, queues: &str) -> bool {
        let head = lock(&self.heads).get(queues).cloned();
        head.is_some_and(|head| !lock(&head.plan).ahead.is_empty())
    }

    /// What a wake-up says of `queue`'s head: the jobs `ids` (space-separated) were just
    /// made ready there. Taken as the prediction of the plain claims of that queue alone
    /// when they have none and no call is in flight (after the queue ran dry, the usual
    /// case of a wake-up), so the next call holds those jobs and leases them at once;
    /// otherwise the hints of the calls know better. Text that is no id is left out.
    pub(crate) fn seed(&self, queue: &str, ids: &str) {
        let Some(head) = lock(&self.heads).get(queue).cloned() else {
            return;
        };
        let mut plan = lock(&head.plan);
        if plan.ahead.is_empty() && plan.in_flight.is_empty() {
            plan.ahead = ids
                .split(' ')
                .filter_map(|id| JobId::parse_canonical(id.as_bytes()).ok())
                .collect();
        }
    }
}

/// One queue set's head: its prediction, its turn and the calls in flight.
#[derive(Default)]
struct Head {
    /// Held from taking a slice until its call is on the connection.
    turn: Arc<tokio::sync::Mutex<()>>,
    plan: Mutex<Plan>,
    /// Signalled when a call in flight is answered or abandoned.
    answered: Notify,
}

#[derive(Default)]
struct Plan {
    /// The ids predicted at the head once every call in flight has run, in order.
    ahead: VecDeque<JobId>,
    /// Calls sent and not answered yet, oldest first, with the ids each holds.
    in_flight: Vec<(u64, Vec<JobId>)>,
    /// Number of the next call.
    next_call: u64,
    /// The newest call whose answer set `ahead`; an older answer is stale.
    newest_answer: Option<u64>,
    /// Claims under way on this head.
    claimers: usize,
}

/// A claim under way on one head; see [`Heads::claimer`].
pub(super) struct Claimer {
    head: Arc<Head>,
}

impl Claimer {
    /// How many ids a call of a claim wanting `wanted` jobs should ask the script to
    /// hint: enough for the next call alone, or for [`CALLS_AHEAD`] calls while other
    /// claims of this store share the head.
    pub(super) fn hint_size(&self, wanted: usize) -> usize {
        let calls = if lock(&self.head.plan).claimers > 1 {
            CALLS_AHEAD
        } else {
            1
        };
        wanted.saturating_mul(calls).saturating_add(HINT_SLACK)
    }

    /// Takes the turn and the next `wanted` predicted ids (fewer when the prediction
    /// holds fewer and no call is in flight to extend it; none before the first answer;
    /// all of it, up to the hint's slack more, for a lone claim). The turn is held
    /// until [`Call::sent`].
    pub(super) async fn next_call(&self, wanted: usize) -> Call {
        let turn = Arc::clone(&self.head.turn).lock_owned().await;
        loop {
            let answered = self.head.answered.notified();
            tokio::pin!(answered);
            // Registered before the plan is read, so an answer in between still wakes it.
            answered.as_mut().enable();
            {
                let mut plan = lock(&self.head.plan);
                if plan.ahead.len() >= wanted || plan.in_flight.is_empty() {
                    // A lone claim holds all that is predicted: were a few jobs at the
                    // head taken by another process meanwhile, it still leases the ones
                    // behind them in this call.
                    let take = if plan.claimers > 1 {
                        wanted
                    } else {
                        wanted.saturating_add(HINT_SLACK)
                    }
                    .min(plan.ahead.len());
                    let held: Vec<JobId> = plan.ahead.drain(..take).collect();
                    let number = plan.next_call;
                    plan.next_call += 1;
                    plan.in_flight.push((number, held.clone()));
                    return Call {
                        head: Arc::clone(&self.head),
                        number,
                        held,
                        turn: Some(turn),
                        answered: false,
                    };
                }
            }
            answered.await;
        }
    }
}

impl Drop for Claimer {
    fn drop(&mut self) {
        let mut plan = lock(&self.head.plan);
        plan.claimers = plan.claimers.saturating_sub(1);
    }
}

/// One claim script call and the slice of the prediction it holds.
pub(super) struct Call {
    head: Arc<Head>,
    number: u64,
    held: Vec<JobId>,
    turn: Option<OwnedMutexGuard<()>>,
    answered: bool,
}

impl Call {
    /// The ids whose hashes this call passes.
    pub(super) fn held(&self) -> &[JobId] {
        &self.held
    }

    /// The call is on the connection: the next claimer may take its slice.
    pub(super) fn sent(&mut self) {
        self.turn = None;
    }

    /// The call's answer: `hint` is the head after it ran.
    pub(super) fn answered(mut self, hint: &[JobId]) {
        self.answered = true;
        let number = self.number;
        let mut plan = lock(&self.head.plan);
        plan.in_flight.retain(|(n, _)| *n != number);
        if plan.newest_answer.is_none_or(|newest| newest < number) {
            plan.newest_answer = Some(number);
            let on_their_way =
                |id: &JobId| plan.in_flight.iter().any(|(_, held)| held.contains(id));
            let ahead = hint
                .iter()
                .copied()
                .filter(|id| !on_their_way(id))
                .collect();
            plan.ahead = ahead;
        }
        drop(plan);
        self.head.answered.notify_waiters();
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Failed or cancelled: whether it ran is unknown, so the prediction is kept as
        // it is (an answer sets it right), and a claimer waiting for this call goes on.
        if !self.answered {
            let number = self.number;
            lock(&self.head.plan)
                .in_flight
                .retain(|(n, _)| *n != number);
            self.head.answered.notify_waiters();
        }
    }
}

/// The plan's state stays consistent at every step, so a panic elsewhere while it was
/// locked leaves nothing to repair.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    /// UUIDv7 ids numbered `range` (version 7 and the RFC variant set, `n` in the low bits).
    fn ids(range: std::ops::Range<u128>) -> Vec<JobId> {
        const V7: u128 = 0x0000_0000_0000_7000_8000_0000_0000_0000;
        range
            .map(|n| JobId::from_u128(V7 | n).expect("a valid id"))
            .collect()
    }

    /// The next call of `claimer`, on the connection (its turn given up).
    async fn sent(claimer: &Claimer, wanted: usize) -> Call {
        let mut call = claimer.next_call(wanted).await;
        call.sent();
        call
    }

    /// Whether `future` waits: nothing it waits for can happen while the test polls it.
    async fn waits<F: std::future::Future>(future: F) -> bool {
        futures::poll!(pin!(future)).is_pending()
    }

    #[tokio::test]
    async fn calls_take_consecutive_slices_and_an_answer_skips_the_slices_on_their_way() {
        let heads = Heads::default();
        let a = heads.claimer("q".into());
        let b = heads.claimer("q".into());
        let c = heads.claimer("q".into());
        assert_eq!(
            a.hint_size(32),
            2 * 32 + HINT_SLACK,
            "three claims share the head"
        );

        // Nothing known yet: the first call holds nothing, and learns the head.
        let first = sent(&a, 32).await;
        assert!(first.held().is_empty());
        first.answered(&ids(1..81));

        let second = sent(&b, 32).await;
        assert_eq!(second.held(), ids(1..33));
        let third = sent(&c, 32).await;
        assert_eq!(
            third.held(),
            ids(33..65),
            "the slice behind the one on its way"
        );
        // 16 ids are left, two calls are in flight: the next claimer waits for an answer
        // rather than send a short call.
        assert!(waits(a.next_call(32)).await);

        // The second call's answer names the head after it ran: the third call's slice,
        // then what follows. Only what follows the third call's slice is left to take.
        second.answered(&ids(33..113));
        let fourth = sent(&a, 32).await;
        assert_eq!(fourth.held(), ids(65..97));
        third.answered(&ids(65..145));
        fourth.answered(&ids(97..177));
        assert_eq!(b.next_call(32).await.held(), ids(97..129));
    }

    #[tokio::test]
    async fn an_answer_older_than_one_already_applied_changes_nothing() {
        let heads = Heads::default();
        let a = heads.claimer("q".into());
        let b = heads.claimer("q".into());
        let first = sent(&a, 8).await;
        first.answered(&ids(1..41));
        let second = sent(&b, 8).await;
        let third = sent(&a, 8).await;
        third.answered(&ids(100..120));
        // Out of order (a cluster retry, say): the second call's answer is older news.
        second.answered(&ids(1..20));
        assert_eq!(b.next_call(8).await.held(), ids(100..108));
    }

    #[tokio::test]
    async fn a_call_dropped_unanswered_lets_the_waiting_claimer_go_on() {
        let heads = Heads::default();
        let a = heads.claimer("q".into());
        let b = heads.claimer("q".into());
        let first = sent(&a, 8).await;
        let mut waiting = pin!(b.next_call(8));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "it waits for the call in flight"
        );
        // Cancelled or failed: no answer comes, and the waiter must not wait for one.
        drop(first);
        let futures::task::Poll::Ready(call) = futures::poll!(waiting.as_mut()) else {
            panic!("the waiter did not go on");
        };
        assert!(
            call.held().is_empty(),
            "nothing is predicted: it sends a call to learn the head"
        );
    }

    #[tokio::test]
    async fn the_turn_is_held_until_the_call_is_sent() {
        let heads = Heads::default();
        let a = heads.claimer("q".into());
        let b = heads.claimer("q".into());
        let first = sent(&a, 8).await;
        first.answered(&ids(1..41));
        let mut second = a.next_call(8).await;
        // The prediction has room for another call, but the turn is not given up yet:
        // a call taking a later slice must not overtake this one on the connection.
        assert!(waits(b.next_call(8)).await);
        second.sent();
        assert_eq!(b.next_call(8).await.held(), ids(9..17));
    }

    #[tokio::test]
    async fn a_lone_claim_takes_the_whole_prediction_and_asks_for_one_call_ahead() {
        let heads = Heads::default();
        let only = heads.claimer("q".into());
        assert_eq!(only.hint_size(10), 10 + HINT_SLACK);
        let first = sent(&only, 10).await;
        first.answered(&ids(1..27));
        // Nobody else needs the rest: holding it all lets the call lease past entries
        // another process took meanwhile.
        assert_eq!(only.next_call(10).await.held(), ids(1..27));
        drop(only);
        let again = heads.claimer("q".into());
        let other = heads.claimer("q".into());
        assert_eq!(again.hint_size(10), 2 * 10 + HINT_SLACK);
        drop(other);
        assert_eq!(again.hint_size(10), 10 + HINT_SLACK);
    }

    /// The text of `ids` as a wake-up names them.
    fn named(ids: &[JobId]) -> String {
        ids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[tokio::test]
    async fn a_wake_up_seeds_only_an_empty_prediction_with_no_call_in_flight() {
        let heads = Heads::default();
        let claimer = heads.claimer("q".into());
        // The queue ran dry: the jobs a wake-up names are the next call's.
        heads.seed("q", &named(&ids(1..3)));
        let call = sent(&claimer, 8).await;
        assert_eq!(call.held(), ids(1..3));
        // A call is in flight, and its answer knows the head better than a wake-up.
        heads.seed("q", &named(&ids(5..7)));
        call.answered(&ids(10..12));
        heads.seed("q", &named(&ids(5..7)));
        assert_eq!(claimer.next_call(8).await.held(), ids(10..12));
        // Other queue sets, and text that is no id, change nothing.
        heads.seed("other", &named(&ids(1..3)));
        assert!(lock(&heads.heads).get("other").is_none());
        heads.seed("q", "not-an-id x");
        assert!(sent(&claimer, 8).await.held().is_empty());
    }

    #[tokio::test]
    async fn queue_sets_have_heads_of_their_own() {
        let heads = Heads::default();
        let a = heads.claimer("a".into());
        let b = heads.claimer("b".into());
        let first = sent(&a, 4).await;
        first.answered(&ids(1..10));
        let other = sent(&b, 4).await;
        assert!(other.held().is_empty(), "nothing is known of b's head");
    }
}
