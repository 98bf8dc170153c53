-- Migration 1: the job table, the dedup table and their indexes.
--
-- `{schema}` is replaced by the quoted schema name before this runs. Every table keeps
-- all namespaces apart by a leading `namespace` column (see docs/postgres.md).
-- Times are milliseconds since the Unix epoch taken from the store's clock, never
-- from the server's `now()`.

-- The claim order's tie-breaker (CONTRACT C3): drawn whenever a job enters `queued`.
CREATE SEQUENCE {schema}.seq AS bigint;

CREATE TABLE {schema}.jobs (
    namespace        text     NOT NULL,
    id               uuid     NOT NULL,
    queue            text     NOT NULL,
    -- Tenant, key, worker and error are any UTF-8, NUL included, which `text` cannot
    -- hold; they are stored as their exact bytes.
    tenant           bytea    NOT NULL,
    idempotency_key  bytea,
    priority         smallint NOT NULL,
    run_at           bigint   NOT NULL,
    seq              bigint   NOT NULL,
    max_attempts     bigint   NOT NULL,
    parent           uuid,
    state            text     NOT NULL
        CHECK (state IN ('queued', 'running', 'succeeded', 'dead', 'cancelled')),
    attempts         bigint   NOT NULL DEFAULT 0,
    lease_worker     bytea,
    -- The last fencing token issued; the current one while the job is running.
    lease_token      bigint   NOT NULL DEFAULT 0,
    lease_expires_at bigint,
    created_at       bigint   NOT NULL,
    started_at       bigint,
    heartbeat_at     bigint,
    finished_at      bigint,
    last_error       bytea,
    result           bytea,
    cancel_requested boolean  NOT NULL DEFAULT false,
    payload          bytea    NOT NULL,
    PRIMARY KEY (namespace, id)
);

-- Claims: only ready-or-scheduled jobs are in it, in claim order per queue.
CREATE INDEX jobs_ready ON {schema}.jobs (namespace, queue, priority DESC, run_at, seq)
    WHERE state = 'queued';

-- Reclaim: only running jobs, by lease expiry, so its cost follows the expired ones (R6).
CREATE INDEX jobs_leases ON {schema}.jobs (namespace, lease_expires_at)
    WHERE state = 'running';

-- Listing (newest first per state, merged), and stats per state.
CREATE INDEX jobs_listing ON {schema}.jobs (namespace, queue, state, id);

-- Retention: only terminal jobs, oldest finish first.
CREATE INDEX jobs_finished ON {schema}.jobs (namespace, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

-- Fan-out: children of a parent, oldest first.
CREATE INDEX jobs_children ON {schema}.jobs (namespace, parent, id)
    WHERE parent IS NOT NULL;

-- Idempotency keys: the unique index is where concurrent enqueues of one key meet.
CREATE TABLE {schema}.dedup (
    namespace  text   NOT NULL,
    tenant     bytea  NOT NULL,
    key        bytea  NOT NULL,
    job_id     uuid   NOT NULL,
    created_at bigint NOT NULL,
    PRIMARY KEY (namespace, tenant, key)
);

CREATE INDEX dedup_created ON {schema}.dedup (namespace, created_at);

-- Whether a job row exists, seen with a fresh snapshot.
--
-- The enqueue statement calls this from `ON CONFLICT DO UPDATE` on the dedup row it
-- has just locked. That row may have been written by a transaction that committed
-- after the statement's snapshot was taken; a plain subquery would not see that
-- transaction's job row and would wrongly call the job gone. A VOLATILE function
-- takes a new snapshot for each query it runs, so it sees every committed job.
CREATE FUNCTION {schema}.job_alive(ns text, job uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.jobs WHERE namespace = ns AND id = job);
END
$$;
