//! The Lua scripts, one per state transition, each prefixed with the shared helpers it
//! needs: `lua/core.lua` (the hot path's) and `lua/lib.lua` (the rest). [`Eval`] runs
//! them with EVALSHA and loads them again when the server answers NOSCRIPT (after a
//! restart or SCRIPT FLUSH).

use std::sync::LazyLock;

use durq_core::JobId;
use redis::{Arg, Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

use crate::conn::Conn;
use crate::keys::Keys;

macro_rules! script {
    // A script off the hot path: every helper.
    ($name:ident, $file:literal) => {
        script!($name, $file, "lua/core.lua", "lua/lib.lua");
    };
    // A script with the helper files named, in order.
    ($name:ident, $file:literal, $($lib:literal),*) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!($(include_str!($lib),)* include_str!(concat!("lua/", $file))))
        });
    };
}

// The hot path (a job's enqueue, claim and completion) includes only core.lua, whose
// definitions the server runs again on every call; see core.lua.
// enqueue.lua uses only core.lua's helpers: lib.lua's definitions cost every call
// about 31,000 server instructions (see core.lua), a third of a batched job's.
script!(ENQUEUE, "enqueue.lua", "lua/core.lua");
script!(CLAIM, "claim.lua", "lua/core.lua");
script!(
    CLAIM_FIT,
    "claim_fit.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/flow.lua"
);
script!(
    CLAIM_LIMITED,
    "claim_limited.lua",
    "lua/core.lua",
    "lua/flow.lua"
);
script!(HEARTBEAT, "heartbeat.lua");
script!(
    COMPLETE,
    "complete.lua",
    "lua/core.lua",
    "lua/complete_plain.lua"
);
// The same completions when some job has jobs waiting for it (CONTRACT G1, G3): what
// complete.lua answers `graph` to, having written nothing.
script!(
    COMPLETE_GRAPH,
    "complete.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua",
    "lua/complete_graph.lua"
);
// The scripts that can end a job take a graph tail (graph.lua).
script!(
    FAIL,
    "fail.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
script!(
    RELEASE,
    "release.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
script!(
    RECLAIM,
    "reclaim.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
script!(
    CANCEL,
    "cancel.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
// A2's return of an ended job to `queued`, shared by retry and reopen (D3), is
// requeue_ended.lua: only these two scripts carry it.
script!(
    RETRY,
    "retry.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/requeue_ended.lua"
);
script!(
    REOPEN,
    "reopen.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/requeue_ended.lua"
);
// A save of a durable step (D1) checks a lease and writes one hash: core.lua's
// `is_int` and `abort_corrupt` are all it uses.
script!(SAVE_STEP, "save_step.lua", "lua/core.lua");
// No helpers: it reads two hashes.
script!(STEPS, "steps.lua",);
// The event stream (CONTRACT V1-V4). An emit checks a lease and appends one entry:
// core.lua's `meta_queue_parent` is all it uses; a trim checks its marker with
// `abort_corrupt`; a read uses nothing.
script!(EMIT, "emit.lua", "lua/core.lua");
script!(EVENTS, "events.lua",);
script!(TRIM_EVENTS, "trim_events.lua", "lua/core.lua");
// No helpers: it marks and reads one hash.
script!(AWAIT, "await.lua",);
script!(PURGE, "purge.lua");
script!(STATS, "stats.lua");
script!(QUEUES, "queues.lua");
script!(LIST, "list.lua");
script!(LIST_ROWS, "list_rows.lua");
script!(
    BURY,
    "bury.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
script!(
    SETTLE,
    "settle.lua",
    "lua/core.lua",
    "lua/lib.lua",
    "lua/graph.lua"
);
script!(UNSTAGE, "unstage.lua");
script!(UNKEY, "unkey.lua");
script!(
    FORGET_STARTS,
    "forget_starts.lua",
    "lua/core.lua",
    "lua/flow.lua"
);
script!(SCHEDULE, "schedule.lua");
script!(WORKERS, "workers.lua");
// Run once per open, before anything else: no helpers.
script!(LAYOUT, "layout.lua",);

/// Every script, so a new connection can load them all up front.
pub(crate) fn all() -> [&'static Script; 32] {
    [
        &ENQUEUE,
        &CLAIM,
        &CLAIM_FIT,
        &CLAIM_LIMITED,
        &HEARTBEAT,
        &COMPLETE,
        &COMPLETE_GRAPH,
        &FAIL,
        &RELEASE,
        &RECLAIM,
        &CANCEL,
        &RETRY,
        &REOPEN,
        &SAVE_STEP,
        &STEPS,
        &EMIT,
        &EVENTS,
        &TRIM_EVENTS,
        &AWAIT,
        &PURGE,
        &STATS,
        &QUEUES,
        &LIST,
        &LIST_ROWS,
        &BURY,
        &SETTLE,
        &UNSTAGE,
        &UNKEY,
        &FORGET_STARTS,
        &SCHEDULE,
        &WORKERS,
        &LAYOUT,
    ]
}

/// One call of a script, built the way the command goes on the wire: the keys and the
/// arguments each written into one buffer as they are added. A `redis::ScriptInvocation`
/// allocates a vector per argument and copies them all again into the command, which on
/// the hot path (a key and an id per job of a claim or a completion, a dozen values per
/// enqueued job) cost the client more than the rest of the call's encoding.
pub(crate) struct Eval {
    script: &'static Script,
    keys: Cmd,
    args: Cmd,
    /// Where job keys and ids are formatted before they are copied into a buffer.
    scratch: String,
}

impl Eval {
    /// A call of `script` with no keys and no arguments yet.
    pub(crate) fn new(script: &'static Script) -> Self {
        Eval {
            script,
            keys: Cmd::new(),
            args: Cmd::new(),
            scratch: String::with_capacity(96),
        }
    }

    /// Adds a key (`KEYS[n]`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.arg(key);
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// Adds the hash of job `id` as a key, without a string of its own.
    pub(crate) fn job_key(&mut self, keys: &Keys, id: JobId) -> &mut Self {
        self.scratch.clear();
        keys.push_job(&mut self.scratch, id);
        self.keys.arg(self.scratch.as_bytes());
        self
    }

    /// Adds the canonical text of `id` as an argument, without a string of its own.
    pub(crate) fn id_arg(&mut self, id: JobId) -> &mut Self {
        self.scratch.clear();
        id.push_canonical(&mut self.scratch);
        self.args.arg(self.scratch.as_bytes());
        self
    }

    /// Runs the call (EVALSHA), loading the script first when the server does not know
    /// it (after a restart or `SCRIPT FLUSH`), as `redis::Script` does.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> RedisResult<Value> {
        let mut cmd = Cmd::with_capacity(
            3 + self.keys.args_iter().len() + self.args.args_iter().len(),
            0,
        );
        cmd.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(self.keys.args_iter().len());
        for part in self.keys.args_iter().chain(self.args.args_iter()) {
            if let Arg::Simple(bytes) = part {
                cmd.arg(bytes);
            }
        }
        match cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(conn).await?;
                cmd.query_async(conn).await
            }
            reply => reply,
        }
    }
}
