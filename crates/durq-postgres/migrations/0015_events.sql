-- Migration 15: the event stream (CONTRACT V1-V4).
--
-- The mark (V1). `jobs.records_events` is true on a job enqueued by a store that
-- records events (`StoreSettings::record_events`) and NULL on every other: the
-- enqueue statements of such a store write it (their own rendered shapes, see
-- `sql/enqueue.rs`), those of any other store leave the column out, as before. So a
-- namespace where no store records pays nothing: a NULL is a bit of the null bitmap
-- the row already carries (no default, so the column is added to the catalog only:
-- no rewrite, no scan), and the triggers below test it in their WHEN clauses, which
-- are false for it.
--
-- Recording by triggers. Whatever changes a job's state is an INSERT of its row (an
-- enqueue) or an UPDATE of its `state` (the notes of migrations 12 and 13 list them:
-- claims, completions batched or in the caller's transaction, failures, releases,
-- reclaims, cancels, the G3 cascade of `settle_dependents`, retries, reopens, bury),
-- so two row triggers on `jobs` record every change in the transaction that makes
-- it, whichever store or process makes it, and no statement of the hot path has to
-- know about events. `record_enqueued` fires on an INSERT of a marked row;
-- `record_change` on an UPDATE OF state of a marked row whose state changed (a
-- heartbeat sets no state and queues nothing; a cancel request to a running job sets
-- it to what it was and its WHEN is false).
--
-- AFTER, not BEFORE. A BEFORE ROW UPDATE trigger costs every UPDATE of the table,
-- whatever its WHEN says: PostgreSQL fetches and locks the row for the trigger before
-- it evaluates the WHEN (which may read OLD), so each updated row that the statement
-- had not locked already takes a tuple lock of its own first, with its WAL record.
-- Measured on 200,000 rows (`UPDATE … SET state = …`, WHEN false for every row):
-- 10 MB more WAL (about 52 bytes a row) and 10-50 % more time than with no trigger;
-- with the same trigger AFTER, no difference at all (a false WHEN queues no trigger
-- event). Completions, failures and releases are such updates, so a BEFORE trigger
-- would tax every store, recording or not. An AFTER trigger cannot change the row,
-- so the key below is not kept on it: it is computed so as not to need it.
--
-- Order without serializing writers (V2, V4). A sequence alone would not do: `seq`
-- is drawn when the row is written, not when it commits, so a reader could see seq 11
-- committed before seq 10 and, once past 11, never read 10. Each event's cursor is
-- instead (`xid`, `seq`): `xid` a key derived from transaction ids (`event_key`,
-- below), `seq` drawn from `event_seq`. A read answers only the events whose key is
-- below `pg_snapshot_xmin(pg_current_snapshot())` of its own statement's snapshot,
-- ordered by (xid, seq). Why that is safe: a transaction writes every event with a
-- key at or above its own top-level id, and while it runs its id is at or above the
-- xmin of any snapshot taken meanwhile (xmin is the oldest id still running; a
-- transaction that gets its id later gets one at or above the snapshot's xmax). So
-- every event with a key below a read's xmin was written by a transaction that had
-- ended when the read's snapshot was taken: it is visible to the read if it
-- committed, and no event can appear later with a smaller cursor than one a read
-- answered. A reader that resumes from `next` therefore never skips one. The price:
-- an event becomes readable only once every transaction that was running when it was
-- written has ended; a long transaction anywhere in the cluster holds the stream back
-- (never reorders it).
--
-- A job's events in the order of its changes. The ids of the transactions that change
-- one job need not follow the order of the changes: a transaction gets its id before
-- it waits for a row lock, and a caller's transaction that wrote something can
-- complete a job long after a younger transaction claimed it. So an event's key is
-- not the writer's id alone but `greatest(the writer's id, the newest id that had
-- ended)`, the second read from a snapshot taken once the writer holds the job's row
-- lock (`event_key`, called from the AFTER trigger or, for `emit`, after the row is
-- locked; in READ COMMITTED each call takes a fresh snapshot). Every change of a job
-- holds its row lock (an enqueue: the row is not visible before its commit), and a
-- writer gets the lock only once the job's previous writer has ended; so the newest
-- ended id it reads is at or above that writer's id and at or above the newest ended
-- id that one read: its key is at or above the previous event's, and of equal keys
-- it draws the larger `seq` (drawn after the other committed). Under REPEATABLE READ
-- the snapshot is the transaction's, but such a transaction can change a job only if
-- the job's last change is visible to it (else a serialization failure), so it was
-- taken after that change's commit, and the same holds. The key stays at or above
-- the writer's own id, so the argument above holds, and at or below ids already
-- handed out, so an event becomes readable once they have ended. No key is kept
-- anywhere: nothing more is written per change.
--
-- `recorded_at` is the server's clock (`clock_timestamp()`), informational (V1,
-- decided): the trigger has no store clock to read. `emit` writes its own event with
-- the store's `now`.
--
-- Trimming (V3) deletes the oldest events of a namespace and remembers the newest
-- cursor it deleted in `events_trimmed`, one row per namespace. Purge (A5) leaves a
-- purged job's events: the stream outlives the jobs it tells of. `drop_namespace`
-- deletes both.
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS records_events boolean;

CREATE SEQUENCE IF NOT EXISTS {schema}.event_seq AS bigint;

-- One row per event. The primary key is the read's order within a namespace: a read
-- and a trim are ranges of it. No foreign key to `jobs` (as for `attempts`): the
-- events outlive their jobs.
CREATE TABLE IF NOT EXISTS {schema}.events (
    namespace   text   NOT NULL,
    xid         xid8   NOT NULL,
    seq         bigint NOT NULL,
    job         uuid   NOT NULL,
    queue       text   NOT NULL,
    kind        text   NOT NULL
        CHECK (kind IN ('enqueued', 'started', 'succeeded', 'failed', 'released', 'ready',
                        'dead', 'cancelled', 'retried', 'emitted')),
    attempt     bigint NOT NULL,
    name        text,
    data        bytea,
    recorded_at bigint NOT NULL,
    PRIMARY KEY (namespace, xid, seq)
);

-- V3: the newest cursor a trim deleted, per namespace.
CREATE TABLE IF NOT EXISTS {schema}.events_trimmed (
    namespace text   NOT NULL PRIMARY KEY,
    xid       xid8   NOT NULL,
    seq       bigint NOT NULL
);

-- The event a change of a job's state records, or NULL for none. Mirrors
-- durq_core::events::EventKind::of_change (`was` NULL for an enqueue): a running job
-- back in `queued` with fewer attempts was released, with as many it failed; a
-- waiting one is ready; any other (an ended one) is retried. Nothing moves a job back
-- into `waiting`. A test calls it with every pair of states and holds it to
-- `of_change`'s answers.
CREATE OR REPLACE FUNCTION {schema}.event_kind(was text, now_state text,
                                               attempts_before bigint, attempts_after bigint)
    RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN was IS NULL THEN 'enqueued'
        WHEN was = now_state THEN NULL
        WHEN now_state = 'running' THEN 'started'
        WHEN now_state = 'succeeded' THEN 'succeeded'
        WHEN now_state = 'dead' THEN 'dead'
        WHEN now_state = 'cancelled' THEN 'cancelled'
        WHEN now_state = 'queued' THEN
            CASE WHEN was = 'running' AND attempts_after < attempts_before THEN 'released'
                 WHEN was = 'running' THEN 'failed'
                 WHEN was = 'waiting' THEN 'ready'
                 ELSE 'retried' END
    END
$$;

-- The key of an event its caller is about to write (see above): the greatest of the
-- transaction's own id and the newest transaction id that had ended, read from a
-- snapshot taken now (a VOLATILE function's expression takes a fresh one in READ
-- COMMITTED). Its caller holds the job's row lock. `xid8` has no arithmetic: the
-- snapshot's xmax, one past the newest ended id, is brought down by one as a number.
CREATE OR REPLACE FUNCTION {schema}.event_key() RETURNS xid8
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN greatest(pg_current_xact_id(),
                    (pg_snapshot_xmax(pg_current_snapshot())::text::numeric - 1)::text::xid8);
END
$$;

-- V1: records the change of the marked row NEW (an INSERT: its enqueue) under the key
-- `event_key()`. `attempt` is the job's attempts after the change.
--
-- The start of a job that waits for jobs (`START_DEPENDENTS`, sql/graph.rs) is part of
-- its enqueue, in the enqueue's own transaction: it moves the row just inserted
-- `queued` to how it starts (waiting, queued, or cancelled at once), and is the only
-- write of `depends_on`. Its enqueue recorded `enqueued` ("whatever its first state",
-- V1), so it records nothing, as the other backends, which store the job in its first
-- state at once, record nothing more.
CREATE OR REPLACE FUNCTION {schema}.record_event() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    change_kind text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        change_kind := 'enqueued';
    ELSE
        IF OLD.depends_on IS NULL AND NEW.depends_on IS NOT NULL THEN
            RETURN NULL;
        END IF;
        change_kind := {schema}.event_kind(OLD.state, NEW.state, OLD.attempts, NEW.attempts);
        IF change_kind IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO {schema}.events (namespace, xid, seq, job, queue, kind, attempt, recorded_at)
    VALUES (NEW.namespace, {schema}.event_key(), nextval('{schema}.event_seq'), NEW.id,
            NEW.queue, change_kind, NEW.attempts,
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS record_enqueued ON {schema}.jobs;
CREATE TRIGGER record_enqueued
    AFTER INSERT ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.records_events)
    EXECUTE FUNCTION {schema}.record_event();

DROP TRIGGER IF EXISTS record_change ON {schema}.jobs;
CREATE TRIGGER record_change
    AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.records_events AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION {schema}.record_event();
