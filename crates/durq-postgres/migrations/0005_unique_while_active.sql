-- Migration 5: idempotency keys unique while their job is active (CONTRACT E10).
--
-- `dedup.while_active` marks a key that deduplicates while its job is queued or
-- running, whatever its age, instead of within the dedup window. A column with a
-- constant default is added to the catalog only: no rewrite, no scan. Older builds
-- write `false`, the meaning every key had before.
--
-- `job_active` is `job_alive` with the state: VOLATILE for the same reason (the
-- enqueue statement calls it on a dedup row another transaction may have committed
-- after the statement's snapshot). Safe to run twice.
ALTER TABLE {schema}.dedup ADD COLUMN IF NOT EXISTS while_active boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION {schema}.job_active(ns text, job uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.jobs
                   WHERE namespace = ns AND id = job AND state IN ('queued', 'running'));
END
$$;
