//! What each operation of [`RedisBackend`] does on Redis, one Lua script per state
//! change, split by job: [`enqueue`], [`claim`] (with [`heads`], what the store's claims
//! know of each queue set's head), [`lease`] (heartbeat, complete and its grouping,
//! fail, release), [`sweep`] (reclaim, purge, and the sweep of a whole namespace),
//! [`reads`] (get, payload, children, attempts, stats, queues, list), [`admin`] (cancel,
//! retry, pause), [`schedules`], [`workers`] (the live workers of CONTRACT W1–W4),
//! [`steps`] (a job's durable steps and its reopen from one, D1–D4) and [`events`] (the
//! event stream's read, emit and trim, V1–V4; the scripts record the changes).
//!
//! This module holds what they share: the reading of a script's status reply, and the
//! backend's connection, keys and script calls.

use durq_core::{Error, JobState, Result};
use redis::{ScriptInvocation, Value};

use crate::backend::RedisBackend;
use crate::codec::{array, text};
use crate::conn::{map_err, Conn};
use crate::keys::Keys;

mod admin;
mod claim;
pub(crate) mod enqueue;
mod events;
pub(crate) mod flow;
pub(crate) mod graph;
pub(crate) mod heads;
pub(crate) mod lease;
pub(crate) mod partitioned;
mod reads;
mod schedules;
mod steps;
mod sweep;
mod workers;

/// Due scheduled entries one script call moves to the ready index. Bounds the work of a
/// call when a large batch of scheduled jobs falls due at once.
const PROMOTE_BOUND: usize = 1000;
/// Script calls a claim or stats may spend promoting due jobs before it reports the
/// scheduled index as corrupt: ten million due entries, far beyond any real backlog.
const PROMOTE_ROUNDS: usize = 10_000_000 / PROMOTE_BOUND;

/// The status word a script answered with, and the rest of its reply.
fn status<'a>(reply: &'a Value, what: &str) -> Result<(String, &'a [Value])> {
    let items = array(reply, what)?;
    let (first, rest) = items
        .split_first()
        .ok_or_else(|| Error::corrupt(what, "empty script reply"))?;
    Ok((text(first, what)?, rest))
}

fn unexpected(what: &str, word: &str) -> Error {
    Error::corrupt(what, format!("unexpected script reply {word:?}"))
}

fn parse_state(text: &str, what: &str) -> Result<JobState> {
    text.parse()
        .map_err(|_| Error::corrupt(what, format!("unknown state {text:?}")))
}

impl RedisBackend {
    pub(crate) fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    async fn eval(&self, eval: &crate::scripts::Eval, what: &str) -> Result<Value> {
        eval.invoke(&mut self.conn())
            .await
            .map_err(|err| map_err(what, err))
    }

    async fn invoke(&self, invocation: &ScriptInvocation<'_>, what: &str) -> Result<Value> {
        invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(|err| map_err(what, err))
    }
}
