//! Wake-ups for claimers waiting for work: every script that makes a job ready publishes
//! its queue on the namespace's channel; one subscriber task per store fans the messages
//! out to the waiting calls. A missed message only costs the waiter its timeout: polling
//! is the fallback. The scripts that end an awaited job announce it on the same channel
//! as `~ID` (CONTRACT O2), which the subscriber hands to the waits for endings alone.
//!
//! `enqueue.lua` names the jobs it made ready after the queue (`QUEUE ID ID...`; the other
//! scripts send the bare queue). The subscriber hands those ids to the store's claims
//! (its [`Seed`]) before it wakes anyone, so a claimer woken on an empty queue holds the
//! new jobs' hashes in its first call and leases them in one round trip instead of two.
//! The ids are only a prediction: the claim script decides alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq_core::JobId;
use futures::StreamExt;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::conn::{CONNECT_TIMEOUT, RECONNECT_CAP, RECONNECT_FIRST_DELAY};

/// What the subscriber does with the ids a wake-up names (queue, space-separated ids):
/// the store's claims take them as their prediction of the queue's head.
pub(crate) type Seed = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The subscriber of one store, started by the first wait.
pub(crate) struct Waker {
    /// Where to subscribe: one server, or any node of a cluster (tried in turn), with
    /// the store's TLS settings.
    nodes: Vec<redis::Client>,
    channel: String,
    sender: broadcast::Sender<String>,
    /// The announcements of awaited jobs' endings (`~ID`, CONTRACT O2), apart from the
    /// wake-ups for work so that neither kind of waiter reads the other's.
    endings: broadcast::Sender<String>,
    subscribed: watch::Sender<bool>,
    seed: Seed,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl Waker {
    pub(crate) fn new(nodes: Vec<redis::Client>, channel: String, seed: Seed) -> Self {
        let (sender, _) = broadcast::channel(1024);
        let (endings, _) = broadcast::channel(1024);
        let (subscribed, _) = watch::channel(false);
        Waker {
            nodes,
            channel,
            sender,
            endings,
            subscribed,
            seed,
            task: Mutex::new(None),
        }
    }

    /// The nodes the subscriber may listen on.
    pub(crate) fn nodes(&self) -> &[redis::Client] {
        &self.nodes
    }

    /// Starts the subscriber task unless it runs.
    fn ensure_started(&self) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let nodes = self.nodes.clone();
        let channel = self.channel.clone();
        let senders = Senders {
            work: self.sender.clone(),
            endings: self.endings.clone(),
        };
        let subscribed = self.subscribed.clone();
        let seed = Arc::clone(&self.seed);
        *task = Some(tokio::spawn(listen(
            nodes, channel, senders, subscribed, seed,
        )));
    }

    /// Waits until one of `queues` is published, or `timeout` passes.
    pub(crate) async fn wait(&self, queues: &[String], timeout: Duration) {
        self.ensure_started();
        let deadline = tokio::time::Instant::now() + timeout;
        // Listen before the subscription is confirmed: the channel buffers for us, and
        // a wake-up published before the subscriber was there is covered by the timeout.
        let mut receiver = self.sender.subscribe();
        let wait = async {
            loop {
                match receiver.recv().await {
                    // The empty name is sent when the subscription broke: wake everyone.
                    Ok(queue) if queue.is_empty() || queues.contains(&queue) => return,
                    Ok(_) => continue,
                    // Lagging behind means many wake-ups: one may be ours.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        let _ = tokio::time::timeout_at(deadline, wait).await;
    }

    /// A receiver of the endings announced from now on, for a wait for an ending
    /// (CONTRACT O2): made before the job is read, so an announcement after the read
    /// is not missed.
    pub(crate) fn listen_for_endings(&self) -> broadcast::Receiver<String> {
        self.ensure_started();
        self.endings.subscribe()
    }

    /// How many calls are waiting now.
    pub(crate) fn waiting(&self) -> usize {
        self.sender.receiver_count()
    }

    /// Resolves once the subscriber has confirmed its subscription, or after `timeout`.
    pub(crate) async fn subscribed(&self, timeout: Duration) -> bool {
        self.ensure_started();
        let mut watch = self.subscribed.subscribe();
        tokio::time::timeout(timeout, watch.wait_for(|ok| *ok))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        let task = self.task.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Subscribes and forwards messages until the store drops the task; when the connection
/// is lost, subscribes again, to the next node each time (on a cluster, pub/sub messages
/// reach every node, so any node serves). The pauses between attempts double from
/// [`RECONNECT_FIRST_DELAY`] to [`RECONNECT_CAP`], as the store's connection's do, so a
/// server that answers again is subscribed to within the cap however long it was down;
/// an attempt (connect and subscription) that gets no answer is given up after
/// [`CONNECT_TIMEOUT`] for a fresh one.
async fn listen(
    nodes: Vec<redis::Client>,
    channel: String,
    senders: Senders,
    subscribed: watch::Sender<bool>,
    seed: Seed,
) {
    let mut backoff = RECONNECT_FIRST_DELAY;
    for client in nodes.iter().cycle() {
        let subscribing = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        if let Ok(Ok(pubsub)) = tokio::time::timeout(CONNECT_TIMEOUT, subscribing).await {
            subscribed.send_replace(true);
            backoff = RECONNECT_FIRST_DELAY;
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if let Ok(mut queue) = message.get_payload::<String>() {
                    if queue.starts_with('~') {
                        let _ = senders.endings.send(queue);
                        continue;
                    }
                    if let Some(space) = queue.find(' ') {
                        seed(&queue[..space], &queue[space + 1..]);
                        queue.truncate(space);
                    }
                    let _ = senders.work.send(queue);
                }
            }
            subscribed.send_replace(false);
            // The connection is gone: wake every waiter, whose claim then finds out
            // whether the server is back, and every wait for an ending, which reads its
            // job again (an announcement may have been missed).
            let _ = senders.work.send(String::new());
            let _ = senders.endings.send(String::new());
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RECONNECT_CAP);
    }
}

/// Where the subscriber forwards what it hears.
struct Senders {
    work: broadcast::Sender<String>,
    endings: broadcast::Sender<String>,
}

/// Resolves when `receiver` brings the announcement of job `id`'s ending, or news that
/// an announcement may have been missed: the subscription broke, or the receiver fell
/// behind.
pub(crate) async fn ending_announced(mut receiver: broadcast::Receiver<String>, id: JobId) {
    let announcement = format!("~{id}");
    loop {
        match receiver.recv().await {
            Ok(heard) if heard.is_empty() || heard == announcement => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
