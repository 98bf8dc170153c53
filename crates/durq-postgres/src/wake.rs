//! Wake-ups: LISTEN/NOTIFY on one channel per schema, with polling as the fallback.
//!
//! After a statement that made jobs ready now commits (enqueue, release, reclaim,
//! operator retry), the store hands `namespace '\n' queue` to this backend's sender
//! task, which sends every pending notice in one short transaction of its own (see
//! `sql::NOTIFY` for why not in the writing transaction). One listener connection per
//! backend receives every notice and bumps a counter per (namespace, queue) that
//! someone waits on; `wait_for_work` returns as soon as one of its counters moves.
//! A notice lost to a crash between the commit and the send only delays the job until
//! the next poll.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use durq_core::JobId;

use crate::error::is_connection_lost;
use crate::health::Health;
use crate::sql::Text;
use crate::warm::WarmConnections;

/// Counters of notices per (namespace, queue), for the keys someone waits on.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    state: Mutex<HubState>,
    notify: Notify,
    active: AtomicBool,
}

#[derive(Debug, Default)]
struct HubState {
    counters: HashMap<String, u64>,
    /// How many waits for an ending (CONTRACT O2) hold each ending's key in
    /// `counters`: the key goes when the last of them ends.
    ending_waits: HashMap<String, usize>,
    /// Bumped when notices may have been lost (listener reconnects): it moves every
    /// key's observed value, so every waiter wakes and claims.
    epoch: u64,
}

/// The payload of a notice, and the hub's key: `namespace '\n' queue`.
pub(crate) fn key(namespace: &str, queue: &str) -> String {
    format!("{namespace}\n{queue}")
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        // The state is counters only: a panic elsewhere cannot leave it inconsistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the listener runs, so that counters move at all.
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The current value of each queue's counter, registering interest in it.
    pub(crate) fn observe(&self, namespace: &str, queues: &[String]) -> Vec<u64> {
        let mut state = self.lock();
        let epoch = state.epoch;
        queues
            .iter()
            .map(|queue| {
                let counter = state.counters.entry(key(namespace, queue)).or_insert(0);
                *counter + epoch
            })
            .collect()
    }

    /// Something that resolves on the next counter move; enable it before re-reading
    /// the counters so that no move between the read and the wait is missed.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Registers a wait for the ending of job `id` of `namespace`: its notice (sent by
    /// the `announce_ending` trigger of migration 13) moves the watch's counter.
    pub(crate) fn watch_ending(self: &Arc<Self>, namespace: &str, id: JobId) -> EndingWatch {
        let key = key(namespace, &format!("~{id}"));
        let mut state = self.lock();
        state.counters.entry(key.clone()).or_insert(0);
        *state.ending_waits.entry(key.clone()).or_insert(0) += 1;
        drop(state);
        EndingWatch {
            hub: Arc::clone(self),
            key,
        }
    }

    fn on_notice(&self, payload: &str) {
        let moved = match self.lock().counters.get_mut(payload) {
            Some(counter) => {
                *counter += 1;
                true
            }
            None => false,
        };
        if moved {
            self.notify.notify_waiters();
        }
    }

    fn on_reset(&self) {
        self.lock().epoch += 1;
        self.notify.notify_waiters();
    }
}

/// One wait's registration for the notice of a job's ending, dropped when it ends.
#[derive(Debug)]
pub(crate) struct EndingWatch {
    hub: Arc<Hub>,
    key: String,
}

impl EndingWatch {
    /// The counter of the job's ending notices, moved also when notices may have been
    /// lost (the listener reconnected, or its LISTEN came into force).
    pub(crate) fn seen(&self) -> u64 {
        let state = self.hub.lock();
        state.counters.get(&self.key).copied().unwrap_or(0) + state.epoch
    }

    /// Resolves once [`seen`](Self::seen) is past `before`.
    pub(crate) async fn moved_past(&self, before: u64) {
        loop {
            let notified = self.hub.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.seen() > before {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for EndingWatch {
    fn drop(&mut self) {
        let mut state = self.hub.lock();
        let last = match state.ending_waits.get_mut(&self.key) {
            Some(waits) => {
                *waits = waits.saturating_sub(1);
                *waits == 0
            }
            None => true,
        };
        if last {
            state.ending_waits.remove(&self.key);
            state.counters.remove(&self.key);
        }
    }
}

/// Notices waiting to be sent.
#[derive(Debug, Default)]
struct Outbox {
    pending: Mutex<HashSet<String>>,
    signal: Notify,
}

/// The listener of one backend, started on the first `wait_for_work`, and the sender
/// of its notices, started on the first notice.
#[derive(Debug)]
pub(crate) struct Wake {
    pub(crate) hub: Arc<Hub>,
    channel: String,
    pool: PgPool,
    /// The store's parked connections, which send the notices too.
    warm: Arc<WarmConnections>,
    notify_sql: Text,
    task: tokio::sync::Mutex<ListenerTask>,
    outbox: Arc<Outbox>,
    sender: Mutex<Option<JoinHandle<()>>>,
    /// Told when the listener's connection or a notice's is found closed by the server.
    health: Arc<Health>,
}

#[derive(Debug, Default)]
struct ListenerTask {
    handle: Option<JoinHandle<()>>,
}

impl Wake {
    pub(crate) fn new(
        pool: PgPool,
        channel: String,
        notify_sql: Text,
        health: Arc<Health>,
        warm: Arc<WarmConnections>,
    ) -> Self {
        Wake {
            health,
            warm,
            hub: Arc::default(),
            channel,
            pool,
            notify_sql,
            task: tokio::sync::Mutex::default(),
            outbox: Arc::default(),
            sender: Mutex::default(),
        }
    }

    /// The channel notices are sent on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Announces ready work on `queues` of `namespace` to every listening process.
    /// Call it after the change committed, so a woken worker finds the jobs.
    pub(crate) fn announce<'q>(&self, namespace: &str, queues: impl IntoIterator<Item = &'q str>) {
        {
            let mut pending = self
                .outbox
                .pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = pending.len();
            pending.extend(queues.into_iter().map(|queue| key(namespace, queue)));
            if pending.len() == before {
                return;
            }
        }
        let mut sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let running = sender.as_ref().is_some_and(|h| !h.is_finished());
        if !running && tokio::runtime::Handle::try_current().is_ok() {
            *sender = Some(tokio::spawn(send_notices(
                Arc::clone(&self.warm),
                Arc::clone(&self.health),
                self.channel.clone(),
                self.notify_sql.clone(),
                Arc::clone(&self.outbox),
            )));
        }
        drop(sender);
        self.outbox.signal.notify_one();
    }

    /// Makes sure the listener task runs, starting it if need be. The task connects
    /// (retrying with back-off) in the background, however short the caller's wait:
    /// a caller with a short deadline must not abort the start for the next caller.
    /// Once LISTEN is in force the task wakes every waiter, so a waiter that began
    /// before then claims and sees what it may have missed.
    pub(crate) async fn ensure_listening(&self) {
        let mut task = self.task.lock().await;
        if task.handle.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let (hub, pool, channel, health) = (
            Arc::clone(&self.hub),
            self.pool.clone(),
            self.channel.clone(),
            Arc::clone(&self.health),
        );
        task.handle = Some(tokio::spawn(async move {
            let listener = relisten(&pool, &channel).await;
            hub.active.store(true, Ordering::Release);
            // Notices sent before LISTEN took effect are lost: wake every waiter once.
            hub.on_reset();
            run(listener, hub, pool, channel, health).await;
        }));
    }
}

/// Opens a listener on `channel` over a connection of its own: LISTEN holds it for
/// good, which must not take one from the pool that serves claims.
async fn listen(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with((*pool.connect_options()).clone());
    let mut listener = PgListener::connect_with(&own).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

impl Drop for Wake {
    fn drop(&mut self) {
        if let Some(handle) = self.task.get_mut().handle.take() {
            handle.abort();
        }
        let sender = self
            .sender
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(handle) = sender.take() {
            handle.abort();
        }
    }
}

/// Sends pending notices, one transaction at a time; notices announced while one is
/// in flight go together in the next.
async fn send_notices(
    warm: Arc<WarmConnections>,
    health: Arc<Health>,
    channel: String,
    sql: Text,
    outbox: Arc<Outbox>,
) {
    // Set after a failed send: the notices go back into the outbox and are sent again
    // after this pause, without waiting for another announcement. The jobs they
    // announce are committed; a notice dropped here would leave a waiter asleep until
    // its poll, and after a server-side kill the pool may hand out a dead connection
    // or two before it has replaced them.
    let mut retry_pause: Option<Duration> = None;
    loop {
        match retry_pause {
            None => outbox.signal.notified().await,
            // A deliberate back-off while the server or the pool recovers.
            Some(pause) => tokio::time::sleep_until(Instant::now() + pause).await,
        }
        let payloads: Vec<String> = outbox
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .drain()
            .collect();
        if payloads.is_empty() {
            retry_pause = None;
            continue;
        }
        let sent = async {
            let mut conn = warm.acquire(&health).await?;
            sqlx::query(sql.sql())
                .bind(&channel)
                .bind(&payloads)
                .execute(&mut *conn)
                .await?;
            warm.park(conn);
            Ok::<(), sqlx::Error>(())
        };
        match sent.await {
            Ok(_) => retry_pause = None,
            Err(err) => {
                tracing::debug!(error = %err, "wake-up notices not sent; retrying");
                if is_connection_lost(&err) {
                    health.mark_lost();
                }
                outbox
                    .pending
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .extend(payloads);
                retry_pause = Some(retry_pause.map_or(Duration::from_millis(10), |pause| {
                    (pause * 2).min(Duration::from_secs(1))
                }));
            }
        }
    }
}

async fn run(
    mut listener: PgListener,
    hub: Arc<Hub>,
    pool: PgPool,
    channel: String,
    health: Arc<Health>,
) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notice)) => hub.on_notice(notice.payload()),
            // The connection dropped (`Ok(None)`) or failed. Notices sent until LISTEN is
            // back are lost, so reconnect here, and only once LISTEN is in force wake
            // every waiter to look for itself: a waiter woken earlier could go back to
            // sleep and miss a notice sent in the gap.
            //
            // Whatever closed this connection (a terminate round, a restart) has likely
            // closed the pool's idle ones too: have them checked before they go out.
            Ok(None) | Err(_) => {
                health.mark_lost();
                listener = relisten(&pool, &channel).await;
                hub.on_reset();
            }
        }
    }
}

/// Opens a new listener, retrying with a capped back-off while the server refuses.
async fn relisten(pool: &PgPool, channel: &str) -> PgListener {
    let mut pause = Duration::from_millis(50);
    loop {
        match listen(pool, channel).await {
            Ok(listener) => return listener,
            Err(err) => {
                tracing::warn!(error = %err, "wake-up listener failed; reconnecting");
                // A deliberate back-off: the server is down or refusing us.
                tokio::time::sleep_until(Instant::now() + pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}
