//! A background task fed through a channel, started on first use and started again if
//! it is gone: what the store's enqueue and completion groupers share.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::mpsc;

/// The sending side of a grouper's task. The task ends when this (and so its store)
/// drops; a task that ended with its runtime is started again on the next request.
pub(crate) struct Feeder<R> {
    sender: Mutex<Option<mpsc::UnboundedSender<R>>>,
}

impl<R: Send + 'static> Feeder<R> {
    pub(crate) fn new() -> Self {
        Feeder {
            sender: Mutex::new(None),
        }
    }

    /// Hands `request` to the task, first starting it with `start` if there is none.
    pub(crate) fn send<F, Fut>(&self, request: R, start: F)
    where
        F: FnOnce(mpsc::UnboundedReceiver<R>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let request = match sender.as_ref() {
            Some(live) => match live.send(request) {
                Ok(()) => return,
                // The task is gone (its runtime shut down): start a new one.
                Err(mpsc::error::SendError(request)) => request,
            },
            None => request,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(start(rx));
        // The receiver is alive: it was just created and moved into the task.
        let _ = tx.send(request);
        *sender = Some(tx);
    }
}
