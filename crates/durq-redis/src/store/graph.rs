//! The graph tail of the scripts that can end a job (CONTRACT G1-G5, `lua/graph.lua`).
//!
//! Ending a job settles the jobs waiting for it in the same script, which writes their
//! hashes; only the dependents index names them, and a script declares every key it
//! touches, so the caller passes the hashes it knows of. A script that meets one it was
//! not given answers `need` with nothing written, and [`Dependents::send_settling`]
//! reads the jobs waiting for those, and for the jobs waiting for them in turn, before
//! it sends the call again: one more call for a graph found late, none for a job no
//! one waits for (the script then reads one empty range). Every caller that ends jobs
//! goes through `send_settling`, so the `need` rounds are written once.

use std::collections::HashSet;
use std::future::Future;

use durq_core::{Error, JobId, Result, Timestamp};
use redis::{RedisResult, ToRedisArgs, Value};

use crate::codec::{array, job_id, text};
use crate::conn::{map_err, Conn};
use crate::keys::Keys;
use crate::scripts::Eval;
use crate::store::enqueue::ready_hex;

/// The most dependents one call declares: a cancellation that reaches more jobs than
/// this (a graph of graphs, all waiting) is refused instead of sending one huge call.
const MAX_KNOWN: usize = 100_000;

/// A script call a graph tail is added to and that is then sent: [`Eval`] or a
/// `redis::ScriptInvocation`.
pub(crate) trait ScriptCall {
    /// Adds a key (`KEYS[n]`).
    fn push_key(&mut self, key: impl ToRedisArgs);
    /// Adds an argument (`ARGV[n]`).
    fn push_arg(&mut self, arg: impl ToRedisArgs);
    /// Runs the call.
    fn send<'a>(
        &'a self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a;
}

impl ScriptCall for Eval {
    fn push_key(&mut self, key: impl ToRedisArgs) {
        self.key(key);
    }
    fn push_arg(&mut self, arg: impl ToRedisArgs) {
        self.arg(arg);
    }
    fn send<'a>(
        &'a self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.invoke(conn)
    }
}

impl ScriptCall for redis::ScriptInvocation<'_> {
    fn push_key(&mut self, key: impl ToRedisArgs) {
        self.key(key);
    }
    fn push_arg(&mut self, arg: impl ToRedisArgs) {
        self.arg(arg);
    }
    fn send<'a>(
        &'a self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.invoke_async(conn)
    }
}

/// The dependents a call that ends jobs knows of, grown each time a script asks.
#[derive(Default)]
pub(crate) struct Dependents {
    known: Vec<JobId>,
    seen: HashSet<JobId>,
}

impl Dependents {
    /// Sends the call `build` makes, with the graph tail of these dependents and the
    /// instant `now`, until the script answers other than `need`; answers that reply.
    /// Each `need` answer wrote nothing, and teaches these dependents what the next
    /// call must carry.
    pub(crate) async fn send_settling<C: ScriptCall>(
        mut self,
        conn: &Conn,
        keys: &Keys,
        now: Timestamp,
        what: &str,
        build: impl Fn() -> C,
    ) -> Result<Value> {
        loop {
            let mut call = build();
            self.add_tail(&mut call, keys, now);
            let reply = call
                .send(&mut conn.clone())
                .await
                .map_err(|err| map_err(what, err))?;
            if !self.learn(&reply, conn, keys, what).await? {
                return Ok(reply);
            }
            self.check_size()?;
        }
    }

    /// Adds the graph tail to `call`, after its own keys and arguments: the keys the
    /// settling writes (the event stream among them: the tail's script records its own
    /// changes and the settled jobs' there, CONTRACT V1), the instant it settles at, and
    /// the dependents known so far.
    fn add_tail(&self, call: &mut impl ScriptCall, keys: &Keys, now: Timestamp) {
        call.push_key(&keys.dependents);
        call.push_key(&keys.ready);
        call.push_key(&keys.sched);
        call.push_key(&keys.list);
        call.push_key(&keys.finished);
        call.push_key(&keys.seq);
        call.push_key(&keys.kready);
        call.push_key(&keys.events);
        for id in &self.known {
            call.push_key(keys.job(*id));
        }
        call.push_arg(now.as_millis());
        call.push_arg(ready_hex(now));
        call.push_arg(&keys.wake);
        for id in &self.known {
            call.push_arg(id.to_string());
        }
        call.push_arg(self.known.len());
    }

    /// Whether `reply` is a script's `need` answer (nothing written); if so, learns the
    /// jobs it names and every job waiting for them, transitively, so the call can be
    /// sent again.
    async fn learn(&mut self, reply: &Value, conn: &Conn, keys: &Keys, what: &str) -> Result<bool> {
        let Some(ids) = needed(reply, what)? else {
            return Ok(false);
        };
        let frontier: Vec<JobId> = ids.into_iter().filter(|id| self.add(*id)).collect();
        if frontier.is_empty() {
            // The script names only jobs it was given: not the script this crate sent.
            return Err(Error::corrupt(
                what,
                "asked again for dependents it was given",
            ));
        }
        // A cancellation goes on down the graph: learn all of it at once.
        self.expand(frontier, None, conn, keys, what).await?;
        Ok(true)
    }

    /// Learns the jobs waiting for `succeeded` (which succeed in the call about to be
    /// sent), so complete_graph settles them in one call instead of two. Only those: a
    /// success releases or counts down the jobs waiting for it and goes no further, so
    /// one pipelined read is all it needs. Answers whether any job waits for one of
    /// them.
    pub(crate) async fn prefetch(
        &mut self,
        succeeded: Vec<JobId>,
        conn: &Conn,
        keys: &Keys,
        what: &str,
    ) -> Result<bool> {
        self.expand(succeeded, Some(1), conn, keys, what).await?;
        Ok(!self.known.is_empty())
    }

    /// Reads the jobs waiting for each of `frontier`, level by level (one pipelined
    /// `ZRANGEBYLEX` each), at most `levels` deep, adding every one not known yet.
    async fn expand(
        &mut self,
        mut frontier: Vec<JobId>,
        mut levels: Option<usize>,
        conn: &Conn,
        keys: &Keys,
        what: &str,
    ) -> Result<()> {
        while !frontier.is_empty() && levels != Some(0) {
            levels = levels.map(|n| n - 1);
            let mut pipe = redis::pipe();
            for id in &frontier {
                pipe.zrangebylex(&keys.dependents, format!("[{id} "), format!("({id}!"));
            }
            let ranges: Vec<Vec<String>> = pipe
                .query_async(&mut conn.clone())
                .await
                .map_err(|err| map_err(what, err))?;
            let mut next = Vec::new();
            for member in ranges.iter().flatten() {
                let dependent = member
                    .split_once(' ')
                    .map(|(_, dependent)| dependent)
                    .ok_or_else(|| Error::corrupt("dependents index", member.clone()))?;
                let id = job_id(dependent, "dependents index")?;
                if self.add(id) {
                    next.push(id);
                }
            }
            frontier = next;
            self.check_size()?;
        }
        Ok(())
    }

    fn add(&mut self, id: JobId) -> bool {
        if !self.seen.insert(id) {
            return false;
        }
        self.known.push(id);
        true
    }

    /// Refuses a graph too large for one call (see [`MAX_KNOWN`]).
    fn check_size(&self) -> Result<()> {
        if self.known.len() > MAX_KNOWN {
            return Err(Error::Backend {
                message: format!(
                    "settling would touch more than {MAX_KNOWN} waiting jobs in one call"
                ),
                source: None,
            });
        }
        Ok(())
    }
}

/// The ids of a `{'need', {id, ...}}` reply, `None` for any other reply.
fn needed(reply: &Value, what: &str) -> Result<Option<Vec<JobId>>> {
    let Value::Array(items) = reply else {
        return Ok(None);
    };
    let [first, ids] = items.as_slice() else {
        return Ok(None);
    };
    if !matches!(ids, Value::Array(_)) || text(first, what).ok().as_deref() != Some("need") {
        return Ok(None);
    }
    array(ids, what)?
        .iter()
        .map(|id| job_id(&text(id, what)?, what))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
