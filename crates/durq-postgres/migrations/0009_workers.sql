-- Migration 9: live workers (CONTRACT W1-W4). `spec` is the worker's description as
-- durq-core encodes it, read and written whole; `in_flight` and `last_seen` sit beside
-- it because a heartbeat changes them. `in_flight` is a bigint so every u32 a worker
-- reports is stored as it is. Reaping walks a namespace's workers by `last_seen`, so
-- its cost follows the silent ones (W4).
--
-- A new, empty table: nothing is rewritten. Older builds keep working on a migrated
-- schema and do not see it. Safe to run twice (`IF NOT EXISTS`).
CREATE TABLE IF NOT EXISTS {schema}.workers (
    namespace text   NOT NULL,
    id        text   NOT NULL,
    spec      text   NOT NULL,
    in_flight bigint NOT NULL,
    last_seen bigint NOT NULL,
    PRIMARY KEY (namespace, id)
);
CREATE INDEX IF NOT EXISTS workers_seen ON {schema}.workers (namespace, last_seen);
