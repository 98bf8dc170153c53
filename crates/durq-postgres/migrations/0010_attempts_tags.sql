-- Migration 10: tags and trace context on jobs (CONTRACT E11, E12), and the attempts
-- that ended other than by success (H1-H4).
--
-- `jobs.tags` is the text `durq_core::meta::encode_tags` writes (a JSON object of
-- strings, keys sorted), NULL for no tags; `jobs.trace_context` a W3C traceparent,
-- NULL for none. Both are `text`, not `jsonb`: an enqueue stores the text it is given
-- and a claim or `get` returns it as stored, so neither pays a JSON parse or render on
-- the hot path. Only `list` with a tag filter reads the tags as JSON (`tags_json`).
-- Nullable columns without a default are added to the catalog only: no rewrite, no
-- scan, however many jobs the table holds.
--
-- No index on either: nothing on the hot path looks them up, and an index would cost
-- every enqueue a write. `list` filters the rows its index walk reaches (see
-- `sql::LIST_QUEUE`).
--
-- Older builds keep working on a migrated schema: every statement names its columns,
-- their jobs get no tags, they write no attempts, and their completions clear the
-- worker, so a job they complete shows no succeeded attempt.
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS tags text;
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS trace_context text;

-- One row per attempt that ended by `fail`, `release` (or snooze) or `reclaim`, in the
-- same statement as the job's change of state. A job keeps `ATTEMPTS_KEPT` (32) slots,
-- `slot = token % 32` (`durq_core::attempts::slot`): the newest attempt overwrites the
-- one 32 claims older (`ON CONFLICT ... DO UPDATE`), so a job never holds more than 32
-- rows and nothing trims them. The running attempt and the one that succeeded are not
-- here: they are the job's own lease columns (`lease_worker` is kept after the lease
-- ends), so claims and completions write nothing more than before.
--
-- The primary key serves everything: `attempts(id)` reads a job's range of it, purge
-- deletes that range with the job. No foreign key: its checks would run on every
-- insert and, through the jobs table's triggers, on every job deleted; purge and
-- `drop_namespace` delete the rows themselves. Worker and error are any UTF-8, NUL
-- included, stored as bytes like the jobs table's.
CREATE TABLE IF NOT EXISTS {schema}.attempts (
    namespace  text     NOT NULL,
    job        uuid     NOT NULL,
    slot       smallint NOT NULL,
    token      bigint   NOT NULL,
    worker     bytea    NOT NULL,
    started_at bigint   NOT NULL,
    ended_at   bigint   NOT NULL,
    outcome    text     NOT NULL CHECK (outcome IN ('failed', 'released', 'expired')),
    error      bytea,
    PRIMARY KEY (namespace, job, slot)
);

-- The tags of a job as `jsonb`, for `list`'s tag filter (`tags_json(tags) @> filter`);
-- NULL when the stored text is not a JSON object of strings (written by hand, or by a
-- foreign writer). The filter lets such a row through, so `list` decodes it and
-- answers `Corrupt` naming the job, as it would without a filter, instead of failing
-- the whole statement with a cast error. The exception block costs a subtransaction
-- per call, paid only by a tag-filtered `list`, per tagged row it reaches.
CREATE OR REPLACE FUNCTION {schema}.tags_json(tags text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    parsed jsonb;
BEGIN
    parsed := tags::jsonb;
    IF jsonb_typeof(parsed) = 'object'
       AND NOT jsonb_path_exists(parsed, '$.* ? (@.type() != "string")') THEN
        RETURN parsed;
    END IF;
    RETURN NULL;
EXCEPTION WHEN data_exception THEN
    RETURN NULL;
END
$$;
