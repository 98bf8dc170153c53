//! The Lua scripts, one per state transition, each prefixed with the shared helpers of
//! `lua/lib.lua`. `redis::Script` runs them with EVALSHA and loads them again when the
//! server answers NOSCRIPT (after a restart or SCRIPT FLUSH).

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("lua/lib.lua"),
                include_str!(concat!("lua/", $file))
            ))
        });
    };
}

script!(ENQUEUE, "enqueue.lua");
script!(CLAIM, "claim.lua");
script!(CLAIM_FIT, "claim_fit.lua");
script!(HEARTBEAT, "heartbeat.lua");
script!(COMPLETE, "complete.lua");
script!(FAIL, "fail.lua");
script!(RELEASE, "release.lua");
script!(RECLAIM, "reclaim.lua");
script!(CANCEL, "cancel.lua");
script!(RETRY, "retry.lua");
script!(PURGE, "purge.lua");
script!(STATS, "stats.lua");
script!(QUEUES, "queues.lua");
script!(LIST, "list.lua");
script!(LIST_ROWS, "list_rows.lua");
script!(BURY, "bury.lua");
script!(UNSTAGE, "unstage.lua");
script!(UNKEY, "unkey.lua");
script!(SCHEDULE, "schedule.lua");
script!(WORKERS, "workers.lua");

/// Every script, so a new connection can load them all up front.
pub(crate) fn all() -> [&'static Script; 20] {
    [
        &ENQUEUE, &CLAIM, &CLAIM_FIT, &HEARTBEAT, &COMPLETE, &FAIL, &RELEASE, &RECLAIM, &CANCEL,
        &RETRY, &PURGE, &STATS, &QUEUES, &LIST, &LIST_ROWS, &BURY, &UNSTAGE, &UNKEY, &SCHEDULE,
        &WORKERS,
    ]
}
