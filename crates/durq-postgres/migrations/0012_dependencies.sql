-- Migration 12: jobs that wait for jobs (CONTRACT G1-G5).
--
-- A waiting job (state `waiting`) keeps the jobs it waits for in `depends_on`, as
-- enqueued, and in `waiting_for` how many have not settled it yet;
-- `dependency_policy` is 1 for `run` (NULL: cancel). A job some job waits for has
-- `has_dependents`, and `dependencies` holds one row per (dependency, dependent) until
-- the dependency ends. Nullable columns without a default are added to the catalog
-- only: no rewrite, no scan. The state check gains `waiting` without a scan
-- (NOT VALID: the rows already there hold one of the old states).
--
-- Whatever ends a job (a completion, a batch of them, the caller's fenced completion,
-- a failure, a reclaim, a cancel) is an UPDATE of its state, so one trigger settles
-- the jobs waiting for it in that same statement's transaction, and no statement that
-- ends jobs has to know about dependencies. Its WHEN clause reads the row's own
-- columns: a job nobody waits for queues no trigger event. Cancelling a dependent is
-- itself an UPDATE of a state, so a cancellation goes on down the graph by the same
-- trigger. A released job is announced on the store's wake channel, which
-- PostgreSQL delivers at commit.
--
-- An enqueue that waits for a job takes that job's row lock before it reads its
-- state and records the edge, so a dependency ending at the same time
-- either ended before the read (and is seen ended) or waits for the enqueue's commit
-- (and its trigger, whose queries take fresh snapshots, sees the edge): no edge is
-- ever missed (G5).
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS depends_on uuid[];
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS dependency_policy smallint;
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS waiting_for integer;
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS has_dependents boolean;

ALTER TABLE {schema}.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'succeeded', 'dead', 'cancelled'))
    NOT VALID;

CREATE TABLE IF NOT EXISTS {schema}.dependencies (
    namespace  text NOT NULL,
    dependency uuid NOT NULL,
    dependent  uuid NOT NULL,
    PRIMARY KEY (namespace, dependency, dependent)
);

-- A key unique while active holds while its job waits, too (E10).
CREATE OR REPLACE FUNCTION {schema}.job_active(ns text, job uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.jobs
                   WHERE namespace = ns AND id = job
                     AND state IN ('waiting', 'queued', 'running'));
END
$$;

-- G1, G3: settles the jobs waiting for the job that just ended. Mirrors
-- durq_core::graph::settle (cancel or met, by the policy) and its failed_dependency
-- (the error text); the conformance scenarios of G1-G5 hold both copies to the same
-- answers. `finished_at` is the
-- store's `now` of the call that ended it (every terminal state sets it, CONTRACT §2),
-- so the trigger reads no server clock.
CREATE OR REPLACE FUNCTION {schema}.settle_dependents() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    released record;
BEGIN
    IF NEW.state <> 'succeeded' THEN
        UPDATE {schema}.jobs j
        SET state = 'cancelled', finished_at = NEW.finished_at, waiting_for = NULL,
            last_error = convert_to(format('cancelled: dependency %s ended %s',
                                           NEW.id, NEW.state), 'UTF8')
        WHERE j.namespace = NEW.namespace AND j.state = 'waiting'
          AND j.dependency_policy IS NULL
          AND j.id IN (SELECT d.dependent FROM {schema}.dependencies d
                       WHERE d.namespace = NEW.namespace AND d.dependency = NEW.id);
    END IF;
    FOR released IN
        UPDATE {schema}.jobs j
        SET waiting_for = CASE WHEN j.waiting_for > 1 THEN j.waiting_for - 1 END,
            state = CASE WHEN j.waiting_for > 1 THEN 'waiting' ELSE 'queued' END,
            run_at = CASE WHEN j.waiting_for > 1 THEN j.run_at
                          ELSE greatest(j.run_at, NEW.finished_at) END,
            seq = CASE WHEN j.waiting_for > 1 THEN j.seq
                       ELSE nextval('{schema}.seq') END
        WHERE j.namespace = NEW.namespace AND j.state = 'waiting'
          AND (NEW.state = 'succeeded' OR j.dependency_policy = 1)
          AND j.id IN (SELECT d.dependent FROM {schema}.dependencies d
                       WHERE d.namespace = NEW.namespace AND d.dependency = NEW.id)
        RETURNING j.queue, j.state
    LOOP
        IF released.state = 'queued' THEN
            PERFORM pg_notify(TG_TABLE_SCHEMA || '.jobs_wake',
                              NEW.namespace || E'\n' || released.queue);
        END IF;
    END LOOP;
    DELETE FROM {schema}.dependencies
    WHERE namespace = NEW.namespace AND dependency = NEW.id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS settle_dependents ON {schema}.jobs;
CREATE TRIGGER settle_dependents
    AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.state IS DISTINCT FROM NEW.state
          AND NEW.state IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION {schema}.settle_dependents();
