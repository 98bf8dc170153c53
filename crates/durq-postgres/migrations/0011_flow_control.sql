-- Migration 11: flow control (CONTRACT K1-K5): concurrency keys on jobs, each queue's
-- controls (its pause and its limits), the start log of its rates and the turn of its
-- fair shares.
--
-- `jobs.concurrency_key` is any UTF-8 (NUL included), stored as its bytes like the
-- tenant; NULL for none. A nullable column without a default is added to the catalog
-- only: no rewrite, no scan.
--
-- Two partial indexes, on jobs with a key only, so a job without one enters neither:
-- * `jobs_running_key` counts one key's running jobs (K1) without reading the others;
-- * `jobs_ready_key` walks a fair queue's keys in byte order (K5): the next key after
--   the turn is one seek, and so is that key's first job in claim order.
--
-- The claim of a queue with limits is serialized per queue by a transaction-level
-- advisory lock (see `durq_postgres::store::limits`), so the tables below are written
-- by one claimer of a queue at a time. Older builds keep working on a migrated schema
-- (their pauses still reach `queue_controls` through the trigger), but they do not see
-- limits and would not enforce them: stop them before setting any.
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS concurrency_key bytea;

CREATE INDEX IF NOT EXISTS jobs_running_key
    ON {schema}.jobs (namespace, queue, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS jobs_ready_key
    ON {schema}.jobs (namespace, queue, priority DESC, concurrency_key, run_at, seq)
    WHERE state = 'queued' AND concurrency_key IS NOT NULL;

-- A queue's running jobs (K2, and `flow_status`) are counted on `jobs_listing`
-- (namespace, queue, state, id): an index of running jobs alone would cost every
-- claim one more index entry per job, limited queue or not.

-- What a claim must know of a queue before it takes its jobs, in one row per queue
-- that has any: whether it is paused (Q1) and its limits (K3); a queue with neither
-- has no row. The plain claim's guard reads this one row (`open_queues!`), so a
-- limited queue costs the claims of unlimited queues nothing more than the pause
-- check did. Rates are `starts` per `*_ms` milliseconds; `limited` says whether the
-- row holds any limit.
CREATE TABLE IF NOT EXISTS {schema}.queue_controls (
    namespace             text    NOT NULL,
    queue                 text    NOT NULL,
    paused                boolean NOT NULL DEFAULT false,
    max_running           bigint,
    max_running_per_key   bigint,
    max_starts            bigint,
    max_starts_ms         bigint,
    max_starts_per_key    bigint,
    max_starts_per_key_ms bigint,
    fair_shares           boolean NOT NULL DEFAULT false,
    limited               boolean NOT NULL GENERATED ALWAYS AS (
        max_running IS NOT NULL OR max_running_per_key IS NOT NULL
        OR max_starts IS NOT NULL OR max_starts_per_key IS NOT NULL OR fair_shares
    ) STORED,
    PRIMARY KEY (namespace, queue)
);

-- `paused_queues` stays where pauses are written and listed (older builds read and
-- write it too); a trigger keeps `queue_controls.paused` in step, in the same
-- transaction as the pause or resume. Created before the copy below, and both in this
-- migration's transaction, whose trigger creation holds writers of `paused_queues`
-- back until it commits: no pause falls between the two.
CREATE OR REPLACE FUNCTION {schema}.sync_paused() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {schema}.queue_controls (namespace, queue, paused)
        VALUES (NEW.namespace, NEW.queue, true)
        ON CONFLICT (namespace, queue) DO UPDATE SET paused = true;
        RETURN NEW;
    END IF;
    DELETE FROM {schema}.queue_controls
    WHERE namespace = OLD.namespace AND queue = OLD.queue AND NOT limited;
    UPDATE {schema}.queue_controls SET paused = false
    WHERE namespace = OLD.namespace AND queue = OLD.queue;
    RETURN OLD;
END
$$;

DROP TRIGGER IF EXISTS paused_queues_sync ON {schema}.paused_queues;
CREATE TRIGGER paused_queues_sync AFTER INSERT OR DELETE ON {schema}.paused_queues
    FOR EACH ROW EXECUTE FUNCTION {schema}.sync_paused();

INSERT INTO {schema}.queue_controls (namespace, queue, paused)
SELECT namespace, queue, true FROM {schema}.paused_queues
ON CONFLICT (namespace, queue) DO UPDATE SET paused = true;

-- The starts of a queue with a rate (K4), one row per start: `key` is the concurrency
-- key for a per-key rate's log, the empty string for the queue's own (no key is
-- empty). Claims trim the logs they write; reclaim's housekeeping trims the rest.
CREATE TABLE IF NOT EXISTS {schema}.queue_starts (
    namespace text   NOT NULL,
    queue     text   NOT NULL,
    key       bytea  NOT NULL,
    at        bigint NOT NULL
);

CREATE INDEX IF NOT EXISTS queue_starts_log
    ON {schema}.queue_starts (namespace, queue, key, at);

-- The key a fair queue's claims served last at each priority (K5); the empty string
-- for the jobs without a key.
CREATE TABLE IF NOT EXISTS {schema}.queue_turns (
    namespace text     NOT NULL,
    queue     text     NOT NULL,
    priority  smallint NOT NULL,
    key       bytea    NOT NULL,
    PRIMARY KEY (namespace, queue, priority)
);

-- What a plain claim statement calls for a queue that has limits, instead of taking
-- its jobs without counting them: it fails the statement with SQLSTATE `JB010`, and
-- the claim runs again as a limited claim (`durq_postgres::store::limits`). A handle
-- whose memory of the limits is stale thus costs one statement, never a limit.
CREATE OR REPLACE FUNCTION {schema}.refuse_limited_claim(queue text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'queue % has limits: its claims count them', queue
        USING ERRCODE = 'JB010';
END
$$;
