//! Flow control (CONTRACT K1–K5): each queue's limits, and the claim of queues that
//! have some.
//!
//! A plain claim stays one statement, whose per-queue lookup of the queue's pause also
//! reads whether it has limits (`open_queues!`, `queue_controls`): it refuses a queue
//! with limits (SQLSTATE `JB010`), so a handle that has not seen limits set by another
//! process still never takes a limited queue's jobs without counting. Each handle
//! remembers which queues had limits when it last looked, and sends the claims that
//! name one here directly.
//!
//! Here a claim is one transaction: it takes the advisory lock of each queue it names
//! (claims of one limited queue run one at a time, so each counts what the one before
//! it leased; which of its queues have limits is read only under the locks), reads
//! their limits, and walks each queue's ready jobs in claim order (or by turns of key,
//! K5), passing over those the limits do not admit. The chosen jobs are leased, their
//! starts logged and the turns moved, and it all commits together. The claims of one
//! handle that wait for the same queues at the same time share that transaction
//! ([`LimitedClaims`]): claims that run one at a time are paid per transaction, not
//! per claim.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Weak};

use durq_core::fair::{in_turn_places, turns_left, Found, Look, Turn, NO_KEY};
use durq_core::fit::FitOrder;
use durq_core::{Budget, FlowStatus, QueueLimits, Rate, StoredLimits, FLOW_KEYS_SHOWN};
use sqlx::{Postgres, Transaction};
use std::future::Future;

use durq_core::batch::{Batch, Limits};

use crate::backend::Inner;

use super::claim;
use super::*;

/// The SQLSTATE of a plain claim statement that met a queue with limits.
pub(crate) const LIMITED_QUEUE: &str = "JB010";

/// The key of a queue's own start log (no concurrency key is empty, CONTRACT K1).
const QUEUE_LOG: &str = "";

/// How many ready rows of a limited queue one statement reads: enough that a claim
/// passing over a few keys at their limit reads them in one round trip.
const PAGE: i64 = 256;

/// The most ready rows one statement reads for claims that ask for more than [`PAGE`]
/// jobs together ([`LimitedClaims`]).
const MAX_PAGE: i64 = LimitedClaims::LIMITS.max_bytes as i64;

/// The queues of the namespace that had limits when this handle last read them; `None`
/// before the first read, or after a claim found the memory stale.
#[derive(Debug, Default)]
pub(crate) struct LimitedQueues(std::sync::Mutex<Option<Arc<HashSet<String>>>>);

impl LimitedQueues {
    fn get(&self) -> Option<Arc<HashSet<String>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set(&self, queues: Option<Arc<HashSet<String>>>) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = queues;
    }

    /// Notes that `queue` has limits now, or has none.
    fn note(&self, queue: &str, limited: bool) {
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(queues) = known.as_mut() {
            let queues = Arc::make_mut(queues);
            if limited {
                queues.insert(queue.to_owned());
            } else {
                queues.remove(queue);
            }
        }
    }
}

/// The turns of a process's limited claims, per namespace and queue: a claim of a
/// limited queue waits here for the claims of that queue before it, holding no
/// connection, then takes the queue's advisory lock, which only claims of other
/// processes still hold. Without the gates, every claimer waiting for the lock holds a
/// connection of the pool, and a pool smaller than the claimers runs dry.
#[derive(Debug, Default)]
pub(crate) struct FlowGates(std::sync::Mutex<HashMap<(String, String), Weak<Gate>>>);

/// One queue's gate in [`FlowGates`].
type Gate = tokio::sync::Mutex<()>;

/// The gates of a claim's queues, held ([`FlowGates::enter`]).
type QueueTurn = Vec<tokio::sync::OwnedMutexGuard<()>>;

impl FlowGates {
    /// Waits for the turn of each of `queues` of `namespace`, in name order (so two
    /// claims of overlapping queues never wait for each other in a cycle).
    async fn enter(&self, namespace: &str, queues: &[String]) -> QueueTurn {
        let gates: Vec<Arc<Gate>> = {
            let mut map = self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            map.retain(|_, gate| gate.strong_count() > 0);
            queues
                .iter()
                .map(|queue| {
                    let key = (namespace.to_owned(), queue.clone());
                    match map.get(&key).and_then(Weak::upgrade) {
                        Some(gate) => gate,
                        None => {
                            let gate = Arc::new(Gate::new(()));
                            map.insert(key, Arc::downgrade(&gate));
                            gate
                        }
                    }
                })
                .collect()
        };
        let mut held = Vec::with_capacity(gates.len());
        for gate in gates {
            held.push(gate.lock_owned().await);
        }
        held
    }
}

impl PostgresBackend {
    /// The queues of `queues` this handle knows to have limits, by name.
    fn known_limited(&self, queues: &[String]) -> Vec<String> {
        let known = self.inner.limited.get();
        let mut limited: Vec<String> = queues
            .iter()
            .filter(|queue| known.as_ref().is_some_and(|known| known.contains(*queue)))
            .cloned()
            .collect();
        limited.sort_unstable();
        limited.dedup();
        limited
    }

    /// Whether `queues` name a queue with limits, as far as this handle knows; read
    /// from the store the first time.
    pub(crate) async fn names_limited_queue(&self, queues: &[String]) -> Result<bool> {
        let known = self.limited_queues().await?;
        Ok(queues.iter().any(|queue| known.contains(queue)))
    }

    /// Whether any queue of the namespace has limits, as far as this handle knows.
    pub(crate) async fn has_limited_queues(&self) -> Result<bool> {
        Ok(!self.limited_queues().await?.is_empty())
    }

    /// The queues with limits as this handle last read them, read now if it has not.
    async fn limited_queues(&self) -> Result<Arc<HashSet<String>>> {
        if let Some(known) = self.inner.limited.get() {
            return Ok(known);
        }
        let rows = self
            .shared()
            .fetch_all_again("read the limited queues", |_| {
                sqlx::query(self.sql().limits.limits.sql()).bind(self.namespace())
            })
            .await?;
        let mut known = HashSet::with_capacity(rows.len());
        for row in &rows {
            known.insert(column::<String>(row, 0, &|| "limits row".to_owned())?);
        }
        let known = Arc::new(known);
        self.inner.limited.set(Some(Arc::clone(&known)));
        Ok(known)
    }

    /// Forgets which queues have limits: a plain claim met one it did not know of.
    pub(crate) fn forget_limited_queues(&self) {
        self.inner.limited.set(None);
    }
}

/// Whether `err` is a plain claim's refusal of a queue with limits.
pub(crate) fn is_limited_refusal(err: &Error) -> bool {
    let Error::Backend {
        source: Some(source),
        ..
    } = err
    else {
        return false;
    };
    match source.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => db.code().as_deref() == Some(LIMITED_QUEUE),
        _ => false,
    }
}

/// Rule K3: stores `queue`'s limits; unlimited ones delete its row. Waits for the
/// writes in flight on the jobs table first (`sql::LOCK_JOBS`), so a claim that took
/// jobs without these limits has committed before any claim counts under them.
pub(crate) async fn set_limits(
    store: &PostgresBackend,
    queue: &str,
    limits: QueueLimits,
) -> Result<()> {
    let shared = store.shared();
    let sql = &store.sql().limits;
    let error = |err| shared.error("set a queue's limits", err);
    let mut tx = shared.begin("set a queue's limits").await?;
    sqlx::query(sql.lock_jobs.sql())
        .execute(&mut *tx)
        .await
        .map_err(error)?;
    if !limits.is_unlimited() {
        let stored = StoredLimits::from(limits);
        sqlx::query(sql.put_limits.sql())
            .bind(store.namespace())
            .bind(queue)
            .bind(stored.max_running)
            .bind(stored.max_running_per_key)
            .bind(stored.max_starts)
            .bind(stored.max_starts_ms)
            .bind(stored.max_starts_per_key)
            .bind(stored.max_starts_per_key_ms)
            .bind(stored.fair_shares)
            .execute(&mut *tx)
            .await
            .map_err(error)?;
    }
    sqlx::query(sql.remove_limits.sql())
        .bind(store.namespace())
        .bind(queue)
        .bind(limits.max_starts.is_none())
        .bind(!limits.fair_shares)
        .bind(limits.is_unlimited())
        .bind(limits.max_starts_per_key.is_none())
        .execute(&mut *tx)
        .await
        .map_err(error)?;
    tx.commit().await.map_err(error)?;
    store.inner.limited.note(queue, !limits.is_unlimited());
    // Jobs the old limits held back may be admitted now.
    shared.wake.announce(store.namespace(), [queue]);
    Ok(())
}

/// Rule K3: every queue's limits, by name.
pub(crate) async fn all_limits(store: &PostgresBackend) -> Result<Vec<(String, QueueLimits)>> {
    let rows = store
        .shared()
        .fetch_all_again("read the limits", |_| {
            sqlx::query(store.sql().limits.limits.sql()).bind(store.namespace())
        })
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let queue: String = column(row, 0, &|| "limits row".to_owned())?;
        let limits = limits_from(&queue, row, 1)?;
        out.push((queue, limits));
    }
    Ok(out)
}

/// Limits as stored (`sql::limits_columns!`) from column `first` of `row` on, checked
/// ([`StoredLimits::into_limits`]).
fn limits_from(queue: &str, row: &PgRow, first: usize) -> Result<QueueLimits> {
    let what = || format!("limits of queue {queue}");
    StoredLimits::from_columns(
        |index| column::<Option<i64>>(row, first + index, &what),
        column(row, first + 6, &what)?,
    )?
    .into_limits(queue)
}

/// A concurrency key read from a `bytea` column: UTF-8, or the row is corrupt.
fn key_text(bytes: Vec<u8>, what: &dyn Fn() -> String) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::corrupt(what(), "concurrency_key is not UTF-8"))
}

/// The advisory lock class of a schema's flow control: its queues' locks never meet
/// another schema's (or the migrations' lock, which takes the one-number form).
fn lock_class(schema: &str) -> i32 {
    let key = crate::schema::lock_key(&format!("{schema}/flow control"));
    // The high half of a stable 64-bit hash.
    i32::try_from(key >> 32).unwrap_or(i32::MAX)
}

/// The starts of one log in the window of a claim at `now` (K4): how many (at most
/// `rate.starts`, more cannot change a verdict), and when the window admits a start
/// again if it is full. One statement for every log of `keys`.
async fn windows(
    tx: &mut Transaction<'static, Postgres>,
    store: &PostgresBackend,
    queue: &str,
    keys: &[&str],
    rate: Rate,
    now: Timestamp,
) -> Result<HashMap<String, (u64, Option<Timestamp>)>> {
    let rows = sqlx::query(store.sql().limits.windows.sql())
        .bind(store.namespace())
        .bind(queue)
        .bind(keys.iter().map(|key| key.as_bytes()).collect::<Vec<_>>())
        .bind(rate.window_opens_after(now).as_millis())
        .bind(i64::from(rate.starts))
        .fetch_all(&mut **tx)
        .await
        .map_err(|err| store.shared().error("read a start log", err))?;
    let what = || format!("start log of queue {queue}");
    let mut out = HashMap::with_capacity(rows.len());
    for row in &rows {
        let key = key_text(column(row, 0, &what)?, &what)?;
        let count = u64::try_from(column::<i64>(row, 1, &what)?).unwrap_or(0);
        let oldest: Option<i64> = column(row, 2, &what)?;
        let frees_at = oldest
            .filter(|_| !rate.admits(count))
            .map(|at| rate.frees_at(Timestamp::from_millis(at)));
        out.insert(key, (count, frees_at));
    }
    Ok(out)
}

/// What one claim may still take of one queue with limits: the running jobs and starts
/// it counted (in all, and per key as it meets them) and those it took (K1, K2, K4
/// count both).
struct Admission {
    limits: QueueLimits,
    /// The queue's running jobs, this claim's included, once counted.
    running: Option<u64>,
    /// The queue's starts in its rate window, those this claim took included (K4).
    started: u64,
    now: Timestamp,
    /// Per key met: what this claim knows of it.
    by_key: HashMap<String, KeyCounts>,
}

/// One key's counts in a claim, this claim's takes included.
#[derive(Default)]
struct KeyCounts {
    /// Running jobs: the stored ones (once read, unless the queue runs fewer jobs in
    /// all than the per-key limit) plus this claim's.
    running: u64,
    /// Starts in the key's window (once read) plus this claim's (K4).
    started: u64,
}

impl Admission {
    /// The queue's admission at the start of a claim: its running jobs counted when it
    /// has a limit on them (`running`, when the claim read them already), its starts
    /// when it has a rate.
    async fn start(
        tx: &mut Transaction<'static, Postgres>,
        store: &PostgresBackend,
        queue: &str,
        limits: QueueLimits,
        running: Option<u64>,
        now: Timestamp,
    ) -> Result<Self> {
        let started = match limits.max_starts {
            Some(rate) => windows(tx, store, queue, &[QUEUE_LOG], rate, now)
                .await?
                .get(QUEUE_LOG)
                .map_or(0, |(count, _)| *count),
            None => 0,
        };
        // A per-key limit may be met without reading each key (see `prepare`) while
        // the queue runs fewer jobs in all: counted once here.
        let running = match running {
            Some(running) => Some(running),
            None if limits.max_running.is_some() || limits.max_running_per_key.is_some() => {
                Some(count_running(tx, store, queue).await?)
            }
            None => None,
        };
        Ok(Admission {
            limits,
            running,
            started,
            now,
            by_key: HashMap::new(),
        })
    }

    /// Whether the queue admits no job at all now (K2, K4).
    fn queue_full(&self) -> bool {
        !self.limits.admits_queue(self.running.unwrap_or(0))
            || self
                .limits
                .max_starts
                .is_some_and(|rate| !rate.admits(self.started))
    }

    /// Reads the counts of the keys of `keys` this claim has not met yet, in one
    /// statement per kind of count.
    async fn prepare(
        &mut self,
        tx: &mut Transaction<'static, Postgres>,
        store: &PostgresBackend,
        queue: &str,
        keys: &[&str],
    ) -> Result<()> {
        if !self.limits.counts_keys() {
            return Ok(());
        }
        let mut new: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|key| *key != NO_KEY && !self.by_key.contains_key(*key))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return Ok(());
        }
        let mut counts: HashMap<String, KeyCounts> = new
            .iter()
            .map(|key| ((*key).to_owned(), KeyCounts::default()))
            .collect();
        if let Some(limit) = self.limits.max_running_per_key {
            // A key runs no more jobs than its queue: below the limit in all, no key
            // is at it, and the keys' own counts are not read.
            let below_in_all = self
                .running
                .is_some_and(|running| running < u64::from(limit));
            if !below_in_all {
                let what = || format!("running keys of queue {queue}");
                let rows = sqlx::query(store.sql().limits.count_keys_running.sql())
                    .bind(store.namespace())
                    .bind(queue)
                    .bind(new.iter().map(|key| key.as_bytes()).collect::<Vec<_>>())
                    .fetch_all(&mut **tx)
                    .await
                    .map_err(|err| store.shared().error("count a key's running jobs", err))?;
                for row in &rows {
                    let key = key_text(column(row, 0, &what)?, &what)?;
                    let running = u64::try_from(column::<i64>(row, 1, &what)?).unwrap_or(0);
                    if let Some(counts) = counts.get_mut(&key) {
                        counts.running = running;
                    }
                }
            }
        }
        if let Some(rate) = self.limits.max_starts_per_key {
            for (key, (started, _)) in windows(tx, store, queue, &new, rate, self.now).await? {
                if let Some(counts) = counts.get_mut(&key) {
                    counts.started = started;
                }
            }
        }
        self.by_key.extend(counts);
        Ok(())
    }

    /// Whether a job with concurrency key `key` may be taken; if so, counts it. The
    /// key's counts were read by [`Admission::prepare`].
    fn take(&mut self, key: Option<&str>) -> bool {
        if self.queue_full() {
            return false;
        }
        if let Some(key) = key.filter(|_| self.limits.counts_keys()) {
            let counts = self.by_key.entry(key.to_owned()).or_default();
            if !self.limits.admits_key(counts.running) {
                return false;
            }
            if let Some(rate) = self.limits.max_starts_per_key {
                if !rate.admits(counts.started) {
                    return false;
                }
            }
            counts.started += 1;
            counts.running += 1;
        }
        if let Some(running) = self.running.as_mut() {
            *running += 1;
        }
        self.started += 1;
        true
    }
}

/// The queue's running jobs, on `jobs_listing`.
async fn count_running(
    tx: &mut Transaction<'static, Postgres>,
    store: &PostgresBackend,
    queue: &str,
) -> Result<u64> {
    let running: i64 = sqlx::query_scalar(store.sql().limits.count_running.sql())
        .bind(store.namespace())
        .bind(queue)
        .fetch_one(&mut **tx)
        .await
        .map_err(|err| store.shared().error("count a queue's running jobs", err))?;
    Ok(u64::try_from(running).unwrap_or(0))
}

/// A job a limited claim chose: its place in the claim's order, and its queue and key
/// for the start log.
struct Chosen {
    order: FitOrder,
    id: Uuid,
    queue: String,
    key: Option<String>,
}

/// The limited claims of one handle, answered by one transaction per set of queues
/// (the handle's [`Batcher`] of them, `Inner::limited_claims`).
///
/// Claims of one limited queue run one at a time (its advisory lock), and each costs
/// about nine round trips under that lock, so one at a time they would cap a queue at
/// one claim per few milliseconds however many workers claim. The claims of a handle
/// that wait together go in one batch instead: the claims of each set of queues in it
/// are answered by one transaction, which walks the queues once for all they ask and
/// hands each claim its share in claim order. That is what the claims would have got
/// one after another, the first waiting the first jobs, because they name the same
/// queues and nothing else that shapes a claim's choice (budget, preferences and
/// reservations claim alone, [`groups_with_others`]).
pub(crate) struct LimitedClaims {
    /// The handle whose claims these are; weak, as the handle holds the batcher.
    backend: Weak<Inner>,
}

impl LimitedClaims {
    pub(crate) fn new(backend: Weak<Inner>) -> Self {
        LimitedClaims { backend }
    }

    fn backend(&self) -> Result<PostgresBackend> {
        let inner = self.backend.upgrade().ok_or_else(|| Error::Unavailable {
            message: "the store handle of a limited claim was dropped".to_owned(),
            source: None,
        })?;
        Ok(PostgresBackend { inner })
    }
}

impl Batch for LimitedClaims {
    type Call = (ClaimRequest, Timestamp);
    /// A claim's own outcome: what failed after its transaction committed (a job that
    /// does not decode and could not be buried) fails that claim alone.
    type Answer = Result<Vec<ClaimedJob>>;
    type Key = ();

    /// One batch at a time, up to 64 claims asking for 4,096 jobs in all (a first
    /// claim asking for more goes alone): a claim's size is the jobs it asks for.
    const LIMITS: Limits = Limits {
        max_calls: 64,
        max_bytes: 4_096,
        in_flight: 1,
        queued: 1_024,
    };

    fn size(call: &Self::Call) -> usize {
        call.0.limit
    }

    async fn run(&self, calls: &[Self::Call]) -> Result<Vec<Self::Answer>> {
        let store = self.backend()?;
        // The claims of each set of queues, in arrival order; each set's transaction
        // runs beside the others'.
        let mut sets: Vec<(&[String], Vec<usize>)> = Vec::new();
        for (n, (request, _)) in calls.iter().enumerate() {
            match sets
                .iter_mut()
                .find(|(queues, _)| *queues == &request.queues[..])
            {
                Some((_, members)) => members.push(n),
                None => sets.push((&request.queues, vec![n])),
            }
        }
        let runs = sets.iter().map(|(queues, members)| {
            let store = &store;
            async move {
                let turn = store
                    .shared()
                    .flow_gates
                    .enter(store.namespace(), &store.known_limited(queues))
                    .await;
                let set: Vec<(&ClaimRequest, Timestamp)> = members
                    .iter()
                    .map(|n| (&calls[*n].0, calls[*n].1))
                    .collect();
                claim_together(store, &set, turn).await
            }
        });
        let outcomes = futures::future::join_all(runs).await;
        let mut answers: Vec<Option<Self::Answer>> = calls.iter().map(|_| None).collect();
        for ((_, members), outcome) in sets.iter().zip(outcomes) {
            match outcome {
                Ok(set_answers) => {
                    for (n, answer) in members.iter().zip(set_answers) {
                        answers[*n] = Some(answer);
                    }
                }
                Err(err) => {
                    for n in members {
                        answers[*n] = Some(Err(err.clone()));
                    }
                }
            }
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Ok(Vec::new())))
            .collect())
    }

    /// The jobs of a claim whose caller stopped waiting go back to their queue at once
    /// (L8), instead of waiting for their lease to expire. Best effort: a job not given
    /// back runs again after its lease expires, as after any lost answer.
    fn undelivered(&self, answer: Self::Answer) -> impl Future<Output = ()> + Send {
        let store = self.backend().ok();
        async move {
            let (Some(store), Ok(jobs)) = (store, answer) else {
                return;
            };
            for job in jobs {
                let at = job.job.started_at.unwrap_or(Timestamp::from_millis(0));
                let _ = super::lease::release(&store, job.id(), job.token(), at, at).await;
            }
        }
    }
}

/// Whether a claim may share its transaction with other claims of the same queues:
/// only what it names (queues, how many jobs) shapes what it may get, so a share of a
/// walk for all of them is what it would have got alone.
fn groups_with_others(request: &ClaimRequest) -> bool {
    request.budget.is_none() && request.prefer.is_empty() && request.reserved.is_none()
}

/// The claim of `request`, which names at least one queue this handle believes has
/// limits (see the module documentation), answered together with the handle's other
/// claims waiting at the same time ([`LimitedClaims`]).
pub(crate) async fn claim(
    store: &PostgresBackend,
    request: ClaimRequest,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    if groups_with_others(&request) {
        return store.inner.limited_claims.call((request, now)).await?;
    }
    let limited = store.known_limited(&request.queues);
    let turn = store
        .shared()
        .flow_gates
        .enter(store.namespace(), &limited)
        .await;
    let mut answers = claim_together(store, &[(&request, now)], turn).await?;
    answers.pop().unwrap_or_else(|| Ok(Vec::new()))
}

/// The claims `calls` of the same queues (one claim of any kind, or several that
/// [`groups_with_others`]), in one transaction: it takes the advisory lock of each
/// queue, reads their pauses and limits, walks their ready jobs for the jobs all the
/// claims ask for, and leases each claim its share, in claim order and in the order
/// of `calls`. Answers in the order of `calls`: each claim's jobs, or what failed
/// after the commit for that claim alone (a job that does not decode and could not be
/// buried, C10). Holds the queues' `turn` in this process until the commit.
async fn claim_together(
    store: &PostgresBackend,
    calls: &[(&ClaimRequest, Timestamp)],
    turn: QueueTurn,
) -> Result<Vec<Result<Vec<ClaimedJob>>>> {
    let Some(((first, _), rest)) = calls.split_first() else {
        return Ok(Vec::new());
    };
    // One walk for all: the first claim's shape, every claim's jobs, the latest clock.
    let mut whole: ClaimRequest = (*first).clone();
    whole.limit = calls.iter().map(|(request, _)| request.limit).sum();
    let request = &whole;
    let now = calls
        .iter()
        .map(|(_, now)| *now)
        .max()
        .unwrap_or(calls[0].1);
    debug_assert!(rest.iter().all(|(other, _)| other.queues == first.queues));
    let shared = store.shared();
    let error = |err| shared.error("claim", err);
    let mut tx = shared.begin("claim").await?;
    sqlx::query(store.sql().limits.lock_queues.sql())
        .bind(store.namespace())
        .bind(&request.queues[..])
        .bind(lock_class(&shared.schema))
        .execute(&mut *tx)
        .await
        .map_err(error)?;
    // Read under the locks, in one statement: what the claims before this one
    // committed (pauses, limits, the running jobs the limits count).
    let control_rows = sqlx::query(store.sql().limits.controls_of.sql())
        .bind(store.namespace())
        .bind(&request.queues[..])
        .fetch_all(&mut *tx)
        .await
        .map_err(error)?;
    let what = || "queue controls row".to_owned();
    let mut limits: HashMap<String, QueueLimits> = HashMap::with_capacity(control_rows.len());
    let mut running: HashMap<String, u64> = HashMap::with_capacity(control_rows.len());
    let mut paused = HashSet::new();
    for row in &control_rows {
        let queue: String = column(row, 0, &what)?;
        if column::<bool>(row, 1, &what)? {
            paused.insert(queue.clone());
        }
        if column::<bool>(row, 2, &what)? {
            limits.insert(queue.clone(), limits_from(&queue, row, 3)?);
        }
        if let Some(count) = column::<Option<i64>>(row, 10, &what)? {
            running.insert(queue, u64::try_from(count).unwrap_or(0));
        }
    }
    if limits.is_empty() {
        // This handle's memory of the limits is stale: read it again next time.
        store.forget_limited_queues();
    }
    let open: Vec<&String> = request
        .queues
        .iter()
        .filter(|queue| !paused.contains(*queue))
        .collect();
    let budget = request.budget.as_ref().map(Budget::to_json);
    let mut chosen: Vec<Chosen> = Vec::new();
    let mut turns: Vec<Turn<Uuid>> = Vec::new();
    if let Some(reserved) = request.reserved {
        let candidate = Reservation {
            store,
            request,
            open: &open,
            limits: &limits,
            running: &running,
            budget: budget.as_deref(),
            now,
        };
        candidate.choose(&mut tx, reserved, &mut chosen).await?;
    } else {
        for queue in open {
            let queue_limits = limits.get(queue).copied();
            let walk = Walk {
                store,
                request,
                queue,
                budget: budget.as_deref(),
                now,
                running: running.get(queue.as_str()).copied(),
            };
            match queue_limits {
                Some(queue_limits) if queue_limits.fair_shares && !request.is_fitted() => {
                    walk.fair(&mut tx, queue_limits, &mut chosen, &mut turns)
                        .await?;
                }
                _ => {
                    walk.in_claim_order(&mut tx, queue_limits, &mut chosen)
                        .await?
                }
            }
        }
    }
    chosen.sort_by_key(|c| c.order);
    chosen.truncate(request.limit);
    // Each claim's share, in claim order: the first claim the first jobs.
    let mut shares: Vec<usize> = Vec::with_capacity(chosen.len());
    for (call, (claim, _)) in calls.iter().enumerate() {
        let room = chosen.len() - shares.len();
        shares.extend(std::iter::repeat_n(call, claim.limit.min(room)));
    }
    let ids: Vec<Uuid> = chosen.iter().map(|c| c.id).collect();
    let workers: Vec<&[u8]> = shares
        .iter()
        .map(|call| calls[*call].0.worker.as_bytes())
        .collect();
    let expiries: Vec<i64> = shares
        .iter()
        .map(|call| now.saturating_add(calls[*call].0.lease_ttl).as_millis())
        .collect();
    let rows = if ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query(store.sql().limits.lease_chosen.sql())
            .bind(store.namespace())
            .bind(&ids[..])
            .bind(now.as_millis())
            .bind(i64::try_from(ids.len()).unwrap_or(i64::MAX))
            .bind(&workers[..])
            .bind(&expiries[..])
            .fetch_all(&mut *tx)
            .await
            .map_err(error)?
    };
    // Each chosen job's claim and place in the walk's order (turns of fair queues
    // included, not each job's own order).
    let place: HashMap<Uuid, (usize, usize)> = ids
        .iter()
        .zip(&shares)
        .enumerate()
        .map(|(n, (id, call))| (*id, (*call, n)))
        .collect();
    // The jobs leased (those still queued when the lease wrote them), each row read
    // once, to its claim.
    let count = u64::try_from(rows.len()).unwrap_or(u64::MAX);
    let mut leased: HashSet<Uuid> = HashSet::with_capacity(rows.len());
    let mut rows_of: Vec<Vec<PgRow>> = calls.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let id: Uuid = column(&row, 0, &|| "claimed row".to_owned())?;
        if let Some((call, _)) = place.get(&id) {
            rows_of[*call].push(row);
        }
        leased.insert(id);
    }
    chosen.retain(|job| leased.contains(&job.id));
    log_starts(&mut tx, store, &limits, &chosen, now).await?;
    let kept: Vec<Uuid> = chosen.iter().map(|job| job.id).collect();
    let left = turns_left(&turns, &kept);
    if !left.is_empty() {
        sqlx::query(store.sql().limits.put_turns.sql())
            .bind(store.namespace())
            .bind(left.iter().map(|t| t.queue.as_str()).collect::<Vec<_>>())
            .bind(left.iter().map(|t| t.priority).collect::<Vec<_>>())
            .bind(left.iter().map(|t| t.key.as_bytes()).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .map_err(error)?;
    }
    tx.commit().await.map_err(error)?;
    drop(turn);
    shared.growth.passed(count, &shared.pool, &shared.sql);
    let mut answers = Vec::with_capacity(calls.len());
    for ((claim, _), rows) in calls.iter().zip(rows_of) {
        answers.push(deliver(store, claim, rows, &place, now).await);
    }
    Ok(answers)
}

/// One claim's leased `rows` as its answer: in the walk's order (`place`), those that
/// do not decode buried (C10).
async fn deliver(
    store: &PostgresBackend,
    request: &ClaimRequest,
    rows: Vec<PgRow>,
    place: &HashMap<Uuid, (usize, usize)>,
    now: Timestamp,
) -> Result<Vec<ClaimedJob>> {
    let (mut claimed, unreadable) = claim::claim_order(rows, request)?;
    claimed.sort_by_key(|job| {
        place
            .get(&Uuid::from(job.job.id))
            .map_or(usize::MAX, |(_, n)| *n)
    });
    for job in unreadable {
        store.bury(job, now).await?;
    }
    Ok(claimed)
}

/// The reservation of a claim (CONTRACT F6), on the claim's `open` queues.
struct Reservation<'a> {
    store: &'a PostgresBackend,
    request: &'a ClaimRequest,
    open: &'a [&'a String],
    limits: &'a HashMap<String, QueueLimits>,
    /// The running jobs of the queues whose limits count them, read with the controls.
    running: &'a HashMap<String, u64>,
    budget: Option<&'a str>,
    now: Timestamp,
}

impl Reservation<'_> {
    /// Job `reserved`, if it is ready in one of the open queues, fits, and its queue's
    /// limits admit it.
    async fn choose(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        reserved: JobId,
        chosen: &mut Vec<Chosen>,
    ) -> Result<()> {
        let store = self.store;
        let open: Vec<&str> = self.open.iter().map(|queue| queue.as_str()).collect();
        let row = sqlx::query(store.sql().limits.reserved.sql())
            .bind(store.namespace())
            .bind(&open[..])
            .bind(Uuid::from(reserved))
            .bind(self.now.as_millis())
            .bind(self.budget)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|err| store.shared().error("claim", err))?;
        let Some(row) = row else { return Ok(()) };
        let what = || format!("job {reserved}");
        let queue: String = column(&row, 6, &what)?;
        let key = column::<Option<Vec<u8>>>(&row, 4, &what)?
            .map(|key| key_text(key, &what))
            .transpose()?;
        if let Some(limits) = self.limits.get(&queue).copied() {
            let running = self.running.get(&queue).copied();
            let mut admission =
                Admission::start(tx, store, &queue, limits, running, self.now).await?;
            let keys: Vec<&str> = key.as_deref().into_iter().collect();
            admission.prepare(tx, store, &queue, &keys).await?;
            if !admission.take(key.as_deref()) {
                return Ok(());
            }
        }
        let ready = ReadyOrder::new(
            column(&row, 1, &what)?,
            Timestamp::from_millis(column(&row, 2, &what)?),
            u64::try_from(column::<i64>(&row, 3, &what)?).unwrap_or(0),
        );
        let locality: Option<String> = column(&row, 5, &what)?;
        chosen.push(Chosen {
            order: self.request.fit_order(ready, locality.as_deref()),
            id: Uuid::from(reserved),
            queue,
            key,
        });
        Ok(())
    }
}

/// One queue's part of a limited claim.
struct Walk<'a> {
    store: &'a PostgresBackend,
    request: &'a ClaimRequest,
    queue: &'a str,
    budget: Option<&'a str>,
    now: Timestamp,
    /// The queue's running jobs, when the claim read them with its controls.
    running: Option<u64>,
}

/// A job in a fair walk: id, run_at, seq.
type KeyJob = (Uuid, i64, i64);

/// A key in a fair walk, with its first ready job if it has one.
type KeyTurn = (String, Option<KeyJob>);

/// One ready row of a band page (`sql::BAND_PAGE`): id, run_at, seq, key, locality.
type BandRow = (Uuid, i64, i64, Option<String>, Option<String>);

impl Walk<'_> {
    fn error(&self, err: sqlx::Error) -> Error {
        self.store.shared().error("claim", err)
    }

    /// The highest priority below `below` with queued jobs, if any.
    async fn next_band(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        below: i32,
    ) -> Result<Option<i16>> {
        sqlx::query_scalar(self.store.sql().limits.next_band.sql())
            .bind(self.store.namespace())
            .bind(self.queue)
            .bind(below)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|err| self.error(err))
    }

    /// The queue's ready jobs, band by band, in claim order (the fitted order within a
    /// band for a claim that prefers localities, F5), as many as can be among the
    /// claim's first `limit`; with `limits`, only those they admit (K1, K2, K4).
    ///
    /// A band is read in pages from where the last one ended. Without a preference the
    /// walk ends at the `limit`-th job taken; with one, the band where that happens is
    /// read to its end, where a preferred job may still outrank the ones in hand. With
    /// a preference and limits, a band is read twice, its preferred jobs first, so the
    /// limits' slots go in the claim's order (K1 with F5).
    async fn in_claim_order(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        limits: Option<QueueLimits>,
        chosen: &mut Vec<Chosen>,
    ) -> Result<()> {
        let mut admission = match limits {
            Some(limits) => {
                let admission =
                    Admission::start(tx, self.store, self.queue, limits, self.running, self.now)
                        .await?;
                if admission.queue_full() {
                    return Ok(());
                }
                Some(admission)
            }
            None => None,
        };
        let limit = self.request.limit;
        let prefers = !self.request.prefer.is_empty();
        // A page holds the jobs asked for, and room to pass over a few when limits or
        // a preference may pass some over.
        let wanted = i64::try_from(limit).unwrap_or(i64::MAX);
        let page = if admission.is_some() || prefers {
            wanted.clamp(PAGE, MAX_PAGE)
        } else {
            wanted
        };
        let mut below = i32::from(i16::MAX) + 1;
        let mut taken = 0usize;
        // A preferring claim spends the limits' slots in its own order (K1 with F5):
        // each band is read twice, its preferred jobs first. Otherwise once, each job
        // admitted as met.
        let scans: &[Option<bool>] = if prefers && admission.is_some() {
            &[Some(true), Some(false)]
        } else {
            &[None]
        };
        // No lower band can outrank a job of a higher one: once a band filled the cut,
        // the walk ends with it.
        'bands: while taken < limit {
            let Some(priority) = self.next_band(tx, below).await? else {
                break;
            };
            below = i32::from(priority);
            let mut preferred_in_band = 0usize;
            for only in scans {
                let mut after = (i64::MIN, i64::MIN);
                loop {
                    let rows = self
                        .band_page(tx, priority, after, page, admission.is_none())
                        .await?;
                    if let Some(admission) = admission.as_mut() {
                        let keys: Vec<&str> = rows.iter().filter_map(|r| r.3.as_deref()).collect();
                        admission.prepare(tx, self.store, self.queue, &keys).await?;
                    }
                    let read = rows.len();
                    for (id, run_at, seq, key, locality) in rows {
                        after = (run_at, seq);
                        let preferred =
                            durq_core::fit::is_preferred(&self.request.prefer, locality.as_deref());
                        if only.is_some_and(|only| only != preferred) {
                            continue;
                        }
                        // Past the cut of one scan of both kinds, only a preferred job
                        // can still outrank one in hand, and no more of them than the
                        // cut holds.
                        if taken >= limit && !(preferred && preferred_in_band < limit) {
                            continue;
                        }
                        if let Some(admission) = admission.as_mut() {
                            if !admission.take(key.as_deref()) {
                                if admission.queue_full() {
                                    break 'bands;
                                }
                                continue;
                            }
                        }
                        let ready = ReadyOrder::new(
                            priority,
                            Timestamp::from_millis(run_at),
                            u64::try_from(seq).unwrap_or(0),
                        );
                        chosen.push(Chosen {
                            order: self.request.fit_order(ready, locality.as_deref()),
                            id,
                            queue: self.queue.to_owned(),
                            key,
                        });
                        taken += 1;
                        if preferred {
                            preferred_in_band += 1;
                        }
                        // A scan in the claim's order ends at the cut.
                        let done = match only {
                            Some(_) => taken >= limit,
                            None => taken >= limit && (!prefers || preferred_in_band >= limit),
                        };
                        if done {
                            break 'bands;
                        }
                    }
                    if i64::try_from(read).unwrap_or(0) < page {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// A page of a band's ready jobs, locked (skipping rows others hold) when
    /// `locked`: the queue has no limits, and plain claims take its jobs meanwhile.
    async fn band_page(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        priority: i16,
        after: (i64, i64),
        page: i64,
        locked: bool,
    ) -> Result<Vec<BandRow>> {
        let statements = &self.store.sql().limits;
        let statement = if locked {
            &statements.band_page_locked
        } else {
            &statements.band_page
        };
        let rows = sqlx::query(statement.sql())
            .bind(self.store.namespace())
            .bind(self.queue)
            .bind(priority)
            .bind(self.now.as_millis())
            .bind(after.0)
            .bind(after.1)
            .bind(page)
            .bind(self.budget)
            .fetch_all(&mut **tx)
            .await
            .map_err(|err| self.error(err))?;
        let what = || format!("a ready job of queue {}", self.queue);
        rows.iter()
            .map(|row| {
                Ok((
                    column(row, 0, &what)?,
                    column(row, 1, &what)?,
                    column(row, 2, &what)?,
                    column::<Option<Vec<u8>>>(row, 3, &what)?
                        .map(|key| key_text(key, &what))
                        .transpose()?,
                    column(row, 4, &what)?,
                ))
            })
            .collect()
    }

    /// Up to `limit` ready jobs of a fair queue by turns of key (K5), priorities
    /// highest first; within one, the first admitted job of each key in turn from the
    /// one after the queue's turn, round after round. Appended to `chosen` with the
    /// places in claim order that the queue's first jobs hold, so the merge across
    /// queues treats them as it would the queue's first jobs; noted in `turns`.
    async fn fair(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        limits: QueueLimits,
        chosen: &mut Vec<Chosen>,
        turns: &mut Vec<Turn<Uuid>>,
    ) -> Result<()> {
        let mut admission =
            Admission::start(tx, self.store, self.queue, limits, self.running, self.now).await?;
        let limit = self.request.limit;
        // In turn order, with the key whose turn each was.
        let mut taken: Vec<(ReadyOrder, Uuid)> = Vec::new();
        let mut keys_taken: Vec<String> = Vec::new();
        let mut below = i32::from(i16::MAX) + 1;
        'bands: while taken.len() < limit && !admission.queue_full() {
            let Some(priority) = self.next_band(tx, below).await? else {
                break;
            };
            below = i32::from(priority);
            let served = self.turn_of(tx, priority).await?;
            let mut ring = Ring::new(served);
            // Keys that had a turn this claim and may have another, with where their
            // jobs taken so far end.
            let mut again: VecDeque<(String, (i64, i64))> = VecDeque::new();
            loop {
                if taken.len() >= limit {
                    break 'bands;
                }
                let room = limit - taken.len();
                let (key, job) = match ring.next(self, tx, priority, room).await? {
                    Some((key, job)) => (key, job),
                    None => match again.pop_front() {
                        Some((key, after)) => {
                            let job = self
                                .key_jobs(tx, priority, &key, after, 1)
                                .await?
                                .pop_front();
                            (key, job)
                        }
                        None => break,
                    },
                };
                let Some((id, run_at, seq)) = job else {
                    continue;
                };
                let job_key = (key != NO_KEY).then_some(key.as_str());
                admission
                    .prepare(
                        tx,
                        self.store,
                        self.queue,
                        &job_key.into_iter().collect::<Vec<_>>(),
                    )
                    .await?;
                if !admission.take(job_key) {
                    if admission.queue_full() {
                        break 'bands;
                    }
                    // The key is at a limit: it has no more turns in this claim.
                    continue;
                }
                let order = ReadyOrder::new(
                    priority,
                    Timestamp::from_millis(run_at),
                    u64::try_from(seq).unwrap_or(0),
                );
                taken.push((order, id));
                keys_taken.push(key.clone());
                again.push_back((key, (run_at, seq)));
            }
        }
        for ((order, id), key) in in_turn_places(&taken).into_iter().zip(keys_taken) {
            chosen.push(Chosen {
                order: self.request.fit_order(order, None),
                id,
                queue: self.queue.to_owned(),
                key: (key != NO_KEY).then(|| key.clone()),
            });
            turns.push(Turn {
                id,
                queue: self.queue.to_owned(),
                priority: order.priority,
                key,
            });
        }
        Ok(())
    }

    /// The key the queue's claims served last at `priority`, if any.
    async fn turn_of(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        priority: i16,
    ) -> Result<Option<String>> {
        let key: Option<Vec<u8>> = sqlx::query_scalar(self.store.sql().limits.turn.sql())
            .bind(self.store.namespace())
            .bind(self.queue)
            .bind(priority)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|err| self.error(err))?;
        let what = || format!("turn of queue {}", self.queue);
        key.map(|key| key_text(key, &what)).transpose()
    }

    /// Up to `room` ready jobs of `key` (of no key for [`NO_KEY`]) at `priority` after
    /// `after` in claim order, locked.
    async fn key_jobs(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        priority: i16,
        key: &str,
        after: (i64, i64),
        room: usize,
    ) -> Result<VecDeque<KeyJob>> {
        let statements = &self.store.sql().limits;
        let query = if key == NO_KEY {
            sqlx::query(statements.unkeyed_jobs.sql())
                .bind(self.store.namespace())
                .bind(self.queue)
                .bind(priority)
        } else {
            sqlx::query(statements.key_jobs.sql())
                .bind(self.store.namespace())
                .bind(self.queue)
                .bind(priority)
                .bind(key.as_bytes())
        };
        let rows = query
            .bind(self.now.as_millis())
            .bind(after.0)
            .bind(after.1)
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .fetch_all(&mut **tx)
            .await
            .map_err(|err| self.error(err))?;
        let what = || format!("a ready job of queue {}", self.queue);
        rows.iter()
            .map(|row| {
                Ok((
                    column(row, 0, &what)?,
                    column(row, 1, &what)?,
                    column(row, 2, &what)?,
                ))
            })
            .collect()
    }

    /// The keys after `after` with queued jobs at `priority`, up to `room`, each with
    /// its first ready job (none when its first job is scheduled).
    async fn next_keys(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        priority: i16,
        after: &str,
        room: usize,
    ) -> Result<VecDeque<KeyTurn>> {
        let rows = sqlx::query(self.store.sql().limits.next_keys.sql())
            .bind(self.store.namespace())
            .bind(self.queue)
            .bind(priority)
            .bind(after.as_bytes())
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .fetch_all(&mut **tx)
            .await
            .map_err(|err| self.error(err))?;
        let what = || format!("a ready key of queue {}", self.queue);
        let now = self.now.as_millis();
        rows.iter()
            .map(|row| {
                let key = key_text(column(row, 0, &what)?, &what)?;
                let id: Uuid = column(row, 1, &what)?;
                let run_at: i64 = column(row, 2, &what)?;
                let seq: i64 = column(row, 3, &what)?;
                Ok((key, (run_at <= now).then_some((id, run_at, seq))))
            })
            .collect()
    }
}

/// The keys of one priority in turn order ([`durq_core::fair::Ring`]), read a few keys
/// at a time, each with its first ready job.
struct Ring {
    turns: durq_core::fair::Ring,
    /// Keys read ahead, in order after the last one handed out.
    ahead: VecDeque<KeyTurn>,
    /// Whether the keys after the last one handed out were all read ahead.
    ahead_ends: bool,
}

impl Ring {
    fn new(served: Option<String>) -> Self {
        Ring {
            turns: durq_core::fair::Ring::new(served),
            ahead: VecDeque::new(),
            ahead_ends: false,
        }
    }

    /// The next key in turn order with its first ready job, or `None` once every key
    /// had its turn. `room` bounds how many keys are read ahead.
    async fn next(
        &mut self,
        walk: &Walk<'_>,
        tx: &mut Transaction<'static, Postgres>,
        priority: i16,
        room: usize,
    ) -> Result<Option<KeyTurn>> {
        loop {
            let next = match self.turns.look() {
                Look::Done => return Ok(None),
                Look::NoKey => {
                    let job = walk
                        .key_jobs(tx, priority, NO_KEY, (i64::MIN, i64::MIN), 1)
                        .await?
                        .pop_front();
                    Some((NO_KEY.to_owned(), job))
                }
                Look::After(after) => {
                    if self.ahead.is_empty() && !self.ahead_ends {
                        let wanted = room.clamp(1, 64);
                        self.ahead = walk.next_keys(tx, priority, after, wanted).await?;
                        self.ahead_ends = self.ahead.len() < wanted;
                    }
                    self.ahead.pop_front()
                }
            };
            match self.turns.found(next.as_ref().map(|(key, _)| key.as_str())) {
                Found::Take => return Ok(next),
                // Round to the first key: the keys read ahead ended at the last.
                Found::Again => self.ahead_ends = false,
                Found::Done => return Ok(None),
            }
        }
    }
}

/// Logs the starts of the jobs a claim leased, for the queues with a rate (K4), and
/// trims what left their windows.
async fn log_starts(
    tx: &mut Transaction<'static, Postgres>,
    store: &PostgresBackend,
    limits: &HashMap<String, QueueLimits>,
    chosen: &[Chosen],
    now: Timestamp,
) -> Result<()> {
    let (mut queues, mut keys, mut cuts): (Vec<&str>, Vec<&[u8]>, Vec<i64>) = Default::default();
    for job in chosen {
        let Some(queue_limits) = limits.get(&job.queue) else {
            continue;
        };
        let logs = [
            queue_limits.max_starts.map(|rate| (QUEUE_LOG, rate)),
            queue_limits
                .max_starts_per_key
                .zip(job.key.as_deref())
                .map(|(rate, key)| (key, rate)),
        ];
        for (key, rate) in logs.into_iter().flatten() {
            queues.push(&job.queue);
            keys.push(key.as_bytes());
            cuts.push(rate.window_opens_after(now).as_millis());
        }
    }
    if queues.is_empty() {
        return Ok(());
    }
    sqlx::query(store.sql().limits.log_starts.sql())
        .bind(store.namespace())
        .bind(&queues[..])
        .bind(&keys[..])
        .bind(&cuts[..])
        .bind(now.as_millis())
        .execute(&mut **tx)
        .await
        .map_err(|err| store.shared().error("log the starts", err))?;
    Ok(())
}

/// Deletes the starts that left their windows (reclaim's housekeeping).
pub(crate) async fn forget_old_starts(store: &PostgresBackend, now: Timestamp) -> Result<()> {
    store
        .shared()
        .fetch_all_again("forget old starts", |_| {
            sqlx::query(store.sql().limits.forget_old_starts.sql())
                .bind(store.namespace())
                .bind(now.as_millis())
        })
        .await?;
    Ok(())
}

/// Rule K3: what `queue`'s limits hold back at `now`.
pub(crate) async fn flow_status(
    store: &PostgresBackend,
    queue: &str,
    now: Timestamp,
) -> Result<FlowStatus> {
    let shared = store.shared();
    let error = |err| shared.error("read the flow status", err);
    // One snapshot for every count.
    let mut tx = shared.begin("read the flow status").await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(error)?;
    let mut status = FlowStatus::new(count_running(&mut tx, store, queue).await?);
    let queues = [queue];
    let row = sqlx::query(store.sql().limits.limits_of.sql())
        .bind(store.namespace())
        .bind(&queues[..])
        .fetch_optional(&mut *tx)
        .await
        .map_err(error)?;
    let Some(row) = row else {
        return Ok(status);
    };
    let limits = limits_from(queue, &row, 1)?;
    let shown = i64::try_from(FLOW_KEYS_SHOWN).unwrap_or(i64::MAX);
    let what = || format!("flow status of queue {queue}");
    if let Some(limit) = limits.max_running_per_key {
        let rows = sqlx::query(store.sql().limits.keys_at_limit.sql())
            .bind(store.namespace())
            .bind(queue)
            .bind(i64::from(limit))
            .bind(shown)
            .fetch_all(&mut *tx)
            .await
            .map_err(error)?;
        for row in &rows {
            let key = key_text(column(row, 0, &what)?, &what)?;
            let running = u64::try_from(column::<i64>(row, 1, &what)?).unwrap_or(0);
            status.keys_at_limit.push((key, running));
        }
    }
    if let Some(rate) = limits.max_starts {
        status.next_start = windows(&mut tx, store, queue, &[QUEUE_LOG], rate, now)
            .await?
            .get(QUEUE_LOG)
            .and_then(|(_, frees_at)| *frees_at);
    }
    if let Some(rate) = limits.max_starts_per_key {
        let full = full_key_windows(&mut tx, store, queue, rate, now, Some(shown)).await?;
        let keys: Vec<&str> = full.iter().map(String::as_str).collect();
        let windows = windows(&mut tx, store, queue, &keys, rate, now).await?;
        for key in full {
            if let Some((_, Some(at))) = windows.get(&key) {
                status.keys_rate_limited.push((key, *at));
            }
        }
    }
    tx.commit().await.map_err(error)?;
    Ok(status)
}

/// The keys of `queue` whose rate window is full at `now`, by key; at most `shown`.
async fn full_key_windows(
    tx: &mut Transaction<'static, Postgres>,
    store: &PostgresBackend,
    queue: &str,
    rate: Rate,
    now: Timestamp,
    shown: Option<i64>,
) -> Result<Vec<String>> {
    let rows = sqlx::query(store.sql().limits.full_key_windows.sql())
        .bind(store.namespace())
        .bind(queue)
        .bind(rate.window_opens_after(now).as_millis())
        .bind(i64::from(rate.starts))
        .bind(shown)
        .fetch_all(&mut **tx)
        .await
        .map_err(|err| store.shared().error("read the full key windows", err))?;
    let what = || format!("start log of queue {queue}");
    rows.iter()
        .map(|row| key_text(column(row, 0, &what)?, &what))
        .collect()
}

/// The earliest instant after `now` at which a rate of one of `queues` admits a start
/// it holds back now (K4), if any holds one back.
pub(crate) async fn next_rate_free(
    store: &PostgresBackend,
    queues: &[String],
    now: Timestamp,
) -> Result<Option<Timestamp>> {
    let shared = store.shared();
    let error = |err| shared.error("read the rate windows", err);
    let mut tx = shared.begin("read the rate windows").await?;
    let rows = sqlx::query(store.sql().limits.limits_of.sql())
        .bind(store.namespace())
        .bind(queues)
        .fetch_all(&mut *tx)
        .await
        .map_err(error)?;
    let mut next: Option<Timestamp> = None;
    let mut sooner = |at: Timestamp| next = Some(next.map_or(at, |next| next.min(at)));
    for row in &rows {
        let queue: String = column(row, 0, &|| "limits row".to_owned())?;
        let limits = limits_from(&queue, row, 1)?;
        if let Some(rate) = limits.max_starts {
            if let Some((_, Some(at))) = windows(&mut tx, store, &queue, &[QUEUE_LOG], rate, now)
                .await?
                .get(QUEUE_LOG)
            {
                sooner(*at);
            }
        }
        if let Some(rate) = limits.max_starts_per_key {
            let full = full_key_windows(&mut tx, store, &queue, rate, now, None).await?;
            let keys: Vec<&str> = full.iter().map(String::as_str).collect();
            for (_, frees_at) in windows(&mut tx, store, &queue, &keys, rate, now)
                .await?
                .into_values()
            {
                if let Some(at) = frees_at {
                    sooner(at);
                }
            }
        }
    }
    tx.commit().await.map_err(error)?;
    Ok(next)
}
