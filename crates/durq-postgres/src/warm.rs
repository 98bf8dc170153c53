//! Connections kept checked out between statements, so that a busy store pays sqlx's
//! on-release ping once per idle spell instead of once per statement.
//!
//! sqlx 0.9 pings every connection on its way back into the pool, whatever the pool's
//! options (`Floating::return_to_pool` sends a `Sync` and waits for the server's
//! `ReadyForQuery`), so that a connection left mid-statement by a dropped future is
//! never handed out. That is a round trip, a task spawned to run it, two system calls
//! and a wake-up of the server process per statement: 8 % of the client's CPU samples
//! on an end-to-end run (docs/benchmarks.md), and a share of the server's.
//!
//! A connection whose statement ran to its answer is in a known state and needs no such
//! check, so the store parks it here instead, and the next statement takes it back
//! without asking the pool. What the pool would have done for it is kept:
//! - A connection left mid-statement (its future dropped, its statement failed) is
//!   never parked: it goes back to the pool, which pings it.
//! - A parked connection is given back to the pool once it has been idle for
//!   [`PARK_AT_MOST`], by a task that runs only while something is parked: then the
//!   pool's own idle rules apply (the same second after which `before_acquire` pings an
//!   idle connection, see `config::PING_AFTER_IDLE`).
//! - A connection is given back at its first park after [`HOLD_AT_MOST`] out of the
//!   pool, so the pool's lifetime limits still reach connections that never go idle.
//! - A connection parked before a sibling was found closed by the server is given back
//!   (and so pinged) instead of being used (see `health`).
//! - Nothing is parked while the pool is at its size with nothing idle: whoever waits
//!   for a connection, the store's own transactions or an application sharing the pool
//!   (`PostgresPool::from_pool`), gets the next one returned. A connection parked while
//!   the pool had room waits at most [`PARK_AT_MOST`] before a waiter can have it, and
//!   the store's own waiters take one back at once ([`WarmConnections::make_room`]).
//! - A closed pool gets every parked connection back, so `PgPool::close` completes.
//!
//! Transactions still take their connection from the pool and give it back to it:
//! sqlx rolls back a transaction dropped halfway on that way back.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::health::Health;

/// How long a parked connection waits for the next statement before it goes back to
/// the pool.
const PARK_AT_MOST: Duration = Duration::from_secs(1);

/// How long a connection may stay out of the pool, parked and used in turn, before it
/// goes back at its next park.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// A connection out of the pool, with the moment it left it.
#[derive(Debug)]
pub(crate) struct Checkout {
    conn: PoolConnection<Postgres>,
    since: Instant,
}

impl Checkout {
    /// A connection just taken from the pool.
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Checkout {
        Checkout {
            conn,
            since: Instant::now(),
        }
    }

    /// The connection, to drop it from the pool for good or to give it back.
    pub(crate) fn into_inner(self) -> PoolConnection<Postgres> {
        self.conn
    }
}

impl Deref for Checkout {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for Checkout {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// Items parked at given moments, oldest first: the bookkeeping of
/// [`WarmConnections`], apart from connections and clocks so its rules can be tested
/// with any moments.
#[derive(Debug)]
struct Parking<T> {
    parked: VecDeque<(T, Instant)>,
    /// Whether the task giving back idle connections is running.
    sweeping: bool,
}

impl<T> Default for Parking<T> {
    fn default() -> Self {
        Parking {
            parked: VecDeque::new(),
            sweeping: false,
        }
    }
}

impl<T> Parking<T> {
    /// Parks `item` at `now`; true when nothing was sweeping, so a sweep must start.
    fn park(&mut self, item: T, now: Instant) -> bool {
        self.parked.push_back((item, now));
        !std::mem::replace(&mut self.sweeping, true)
    }

    /// The most recently parked item that `unusable` (given how long it has been
    /// idle) does not refuse, and the items it refused on the way. Taking the newest
    /// keeps a few connections busy and lets the rest age out.
    fn take(&mut self, now: Instant, unusable: impl Fn(Duration) -> bool) -> (Option<T>, Vec<T>) {
        let mut refused = Vec::new();
        while let Some((item, at)) = self.parked.pop_back() {
            if unusable(now.saturating_duration_since(at)) {
                refused.push(item);
            } else {
                return (Some(item), refused);
            }
        }
        (None, refused)
    }

    /// The items idle for [`PARK_AT_MOST`] at `now` (every item when `all`), and how
    /// long until the next one is; `None` when nothing is left parked, and then the
    /// sweep is over.
    fn expire(&mut self, now: Instant, all: bool) -> (Vec<T>, Option<Duration>) {
        let mut expired = Vec::new();
        while let Some((_, at)) = self.parked.front() {
            let idle = now.saturating_duration_since(*at);
            if !all && idle < PARK_AT_MOST {
                return (expired, Some(PARK_AT_MOST - idle));
            }
            expired.extend(self.parked.pop_front().map(|(item, _)| item));
        }
        self.sweeping = false;
        (expired, None)
    }

    /// The item parked longest ago.
    fn oldest(&mut self) -> Option<T> {
        self.parked.pop_front().map(|(item, _)| item)
    }

    fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.parked.drain(..).map(|(item, _)| item)
    }
}

/// The parked connections, and the task giving them back once idle.
#[derive(Debug, Default)]
struct Parked {
    parking: Parking<Checkout>,
    /// The sweep last started. A sweep whose runtime shut down ended without saying
    /// so in `parking`; its handle tells.
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

type State = Mutex<Parked>;

/// The parked connections of one pool (see the module documentation).
#[derive(Debug)]
pub(crate) struct WarmConnections {
    pool: PgPool,
    state: Arc<State>,
}

impl WarmConnections {
    /// None parked yet, for connections of `pool`.
    pub(crate) fn new(pool: PgPool) -> WarmConnections {
        WarmConnections {
            pool,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        lock(&self.state)
    }

    /// A connection for one or more statements: the most recently parked one that may
    /// be used as it is, else one from the pool.
    pub(crate) async fn acquire(&self, health: &Health) -> Result<Checkout, sqlx::Error> {
        match self.take(health) {
            Some(conn) => Ok(conn),
            None => Ok(Checkout::new(self.pool.acquire().await?)),
        }
    }

    /// The most recently parked connection that may be used as it is, if any; those
    /// that may not go back to the pool on the way.
    fn take(&self, health: &Health) -> Option<Checkout> {
        let closed = self.pool.is_closed();
        let (found, refused) = self.lock().parking.take(Instant::now(), |idle| {
            closed || idle >= PARK_AT_MOST || health.is_suspect(idle)
        });
        // Outside the lock: each drop spawns the pool's return, with its ping.
        drop(refused);
        found
    }

    /// Parks `checkout`, whose last statement ran to its answer; or gives it back to
    /// the pool when it has been out long enough, or when the pool has nothing idle
    /// and no room to open a connection for a caller that may be waiting.
    pub(crate) fn park(&self, checkout: Checkout) {
        let now = Instant::now();
        if self.pool.is_closed()
            || self.pool_is_short()
            || now.saturating_duration_since(checkout.since) >= HOLD_AT_MOST
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Not from the store's calls, which all run in a runtime; but dropped here,
            // the connection's return would need one.
            close_outside_a_runtime(checkout, &self.pool);
            return;
        };
        let mut state = self.lock();
        let idle_sweep = state.parking.park(checkout, now);
        let lost_sweep = state.sweeper.as_ref().is_some_and(|s| s.is_finished());
        if idle_sweep || lost_sweep {
            let sweep = sweep(Arc::downgrade(&self.state), self.pool.clone());
            state.sweeper = Some(runtime.spawn(sweep));
        }
    }

    /// Gives the longest-parked connection back to the pool when the pool has nothing
    /// idle and no room, so that a caller about to wait for one gets it at once.
    pub(crate) fn make_room(&self) {
        if self.pool_is_short() {
            let oldest = self.lock().parking.oldest();
            drop(oldest);
        }
    }

    /// Whether a caller asking the pool for a connection now would wait.
    fn pool_is_short(&self) -> bool {
        self.pool.num_idle() == 0 && self.pool.size() >= self.pool.options().get_max_connections()
    }
}

impl Drop for WarmConnections {
    fn drop(&mut self) {
        // Dropped in a runtime, each parked connection goes back to the pool as usual.
        if tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let parked: Vec<Checkout> = self.lock().parking.drain().collect();
        for checkout in parked {
            close_outside_a_runtime(checkout, &self.pool);
        }
    }
}

/// Lets go of `checkout` where no runtime runs. Dropped as it is, sqlx would spawn its
/// return to `pool` with no runtime to spawn on, which panics: it is detached and
/// closed instead. A pool keeping a minimum of connections spawns even for a detached
/// one, so there it is leaked: that is a pool dropped outside its runtime, whose
/// connections go with the process.
fn close_outside_a_runtime(checkout: Checkout, pool: &PgPool) {
    if pool.options().get_min_connections() > 0 {
        std::mem::forget(checkout);
    } else {
        drop(checkout.into_inner().detach());
    }
}

fn lock(state: &State) -> MutexGuard<'_, Parked> {
    // The state is a queue, a flag and a task's handle, whole after every step: a
    // panic elsewhere while the lock was held leaves nothing half-done.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Gives back each parked connection once it has been idle for [`PARK_AT_MOST`], and
/// every one when the pool closes; ends when nothing is parked, or the store is gone.
async fn sweep(weak: Weak<State>, pool: PgPool) {
    let mut wait = PARK_AT_MOST;
    loop {
        let closed = tokio::time::timeout(wait, pool.close_event()).await.is_ok();
        let Some(state) = weak.upgrade() else {
            return;
        };
        let (expired, next) = lock(&state).parking.expire(Instant::now(), closed);
        // Outside the lock: each drop spawns the pool's return, with its ping.
        drop(expired);
        match next {
            Some(next) => wait = next,
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_newest_usable_item_is_taken_and_the_unusable_on_the_way_given_back() {
        let t0 = Instant::now();
        let mut parking = Parking::default();
        assert!(parking.park(1, t0), "the first park starts a sweep");
        assert!(!parking.park(2, t0 + 10 * MS), "one sweep at a time");
        assert!(!parking.park(3, t0 + 20 * MS));
        // At 30 ms: item 3 idle 10 ms, 2 idle 20 ms, 1 idle 30 ms.
        let (taken, refused) = parking.take(t0 + 30 * MS, |idle| idle < 15 * MS);
        assert_eq!((taken, refused), (Some(2), vec![3]));
        let (taken, refused) = parking.take(t0 + 30 * MS, |_| false);
        assert_eq!((taken, refused), (Some(1), vec![]));
        assert_eq!(parking.take(t0 + 30 * MS, |_| false), (None, vec![]));
    }

    #[test]
    fn a_sweep_gives_back_what_has_idled_its_time_and_ends_when_nothing_is_left() {
        let t0 = Instant::now();
        let mut parking = Parking::default();
        parking.park('a', t0);
        parking.park('b', t0 + 400 * MS);
        // Nothing idle long enough: the next is due when `a` is.
        assert_eq!(
            parking.expire(t0 + 100 * MS, false),
            (vec![], Some(900 * MS))
        );
        assert_eq!(
            parking.expire(t0 + PARK_AT_MOST, false),
            (vec!['a'], Some(400 * MS))
        );
        assert!(parking.sweeping, "b is still parked");
        assert_eq!(
            parking.expire(t0 + PARK_AT_MOST + 400 * MS, false),
            (vec!['b'], None)
        );
        assert!(!parking.sweeping, "the sweep is over");
        assert!(
            parking.park('c', t0 + 2 * PARK_AT_MOST),
            "a park starts another"
        );
    }

    #[test]
    fn a_closing_pool_gets_everything_back_at_once() {
        let t0 = Instant::now();
        let mut parking = Parking::default();
        parking.park(1, t0);
        parking.park(2, t0);
        assert_eq!(parking.expire(t0, true), (vec![1, 2], None));
        assert!(!parking.sweeping);
    }

    #[test]
    fn room_is_made_with_the_longest_parked() {
        let t0 = Instant::now();
        let mut parking = Parking::default();
        parking.park(1, t0);
        parking.park(2, t0 + MS);
        assert_eq!(parking.oldest(), Some(1));
        assert_eq!(parking.oldest(), Some(2));
        assert_eq!(parking.oldest(), None);
    }
}
