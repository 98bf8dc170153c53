-- Migration 13: waits for a job's ending (CONTRACT O1, O2).
--
-- A `wait` marks the job's row `awaited` before it reads the job, and a trigger
-- announces the ending of a marked row on the store's wake channel, which PostgreSQL
-- delivers at commit. Whatever ends a job is an UPDATE of its state (the G1 trigger's
-- note in migration 12 lists them), so one trigger covers every ending, the cascades
-- of G3 included, and no statement that ends jobs has to know about waits. Its WHEN
-- clause reads the row's own columns: a job nobody waits for queues no trigger event.
--
-- The mark and the ending are ordered by the row lock: a mark that comes first is
-- seen by the ending's UPDATE, which then announces; an ending that comes first is
-- seen by the read that follows the mark. The notice's payload is the wake hub's key
-- `namespace '\n' '~' id`: no queue name starts with `~`.
--
-- A nullable column without a default is added to the catalog only: no rewrite, no
-- scan. Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS awaited boolean;

CREATE OR REPLACE FUNCTION {schema}.announce_ending() RETURNS trigger
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.jobs_wake',
                      NEW.namespace || E'\n~' || NEW.id::text);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS announce_ending ON {schema}.jobs;
CREATE TRIGGER announce_ending
    AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.awaited AND OLD.state IS DISTINCT FROM NEW.state
          AND NEW.state IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION {schema}.announce_ending();
