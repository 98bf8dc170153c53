-- Migration 14: durable steps (CONTRACT D1-D4).
--
-- A running job saves what it has done, step by step, in `steps`: one row per step of
-- its current generation, keyed as the job is (namespace, job) and by the step's name,
-- so the first save of a name stands (`ON CONFLICT DO NOTHING`) and a job's steps are
-- one range of the primary key. `seq` orders them: a step saved after another has a
-- larger one, which is what `retry_from` cuts at (D3) and `steps` sorts by (D2). A job
-- holds at most 1,000 steps (durq_core::steps::MAX_STEPS), so the sort is of a few
-- rows and needs no index of its own: every save writes one index entry, no more.
--
-- `jobs.generation` counts the job's reopens (D3): NULL until the first, read as 0.
-- NULL rather than a default of 0, because a default is stored in every row inserted
-- (eight bytes more in each enqueue's heap tuple and WAL record), while a NULL is a
-- bit of the null bitmap the row already carries. Added to the catalog only: no
-- rewrite, no scan. Every statement names its columns, so enqueues, claims and
-- completions neither write nor read it.
--
-- No foreign key to `jobs`, as for `attempts` (migration 10): its check would cost
-- every save, its cascade every job deleted. Purge and `drop_namespace` delete a job's
-- steps in the statement that deletes the job, and nothing on the hot path deletes
-- jobs.
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS generation bigint;

CREATE TABLE IF NOT EXISTS {schema}.steps (
    namespace text   NOT NULL,
    job       uuid   NOT NULL,
    name      text   NOT NULL,
    seq       bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
    output    bytea  NOT NULL,
    saved_at  bigint NOT NULL,
    PRIMARY KEY (namespace, job, name)
);

-- D3 keeps a reopened job's attempt history (H3), the attempt that succeeded
-- included. That attempt lives on the job's own row (its last lease, migration 10),
-- which the reopen clears to queue the job, so the reopen records it here first: the
-- outcome check gains 'succeeded'. NOT VALID: no scan, every row there holds one of
-- the old outcomes. Builds from before this migration read such a record as any other
-- (their `AttemptOutcome` has `succeeded`).
ALTER TABLE {schema}.attempts DROP CONSTRAINT IF EXISTS attempts_outcome_check;
ALTER TABLE {schema}.attempts ADD CONSTRAINT attempts_outcome_check
    CHECK (outcome IN ('failed', 'released', 'expired', 'succeeded')) NOT VALID;

-- D1: whether step `step` of job `job_id` may be saved: it is saved already (the save
-- then changes nothing) or the job holds fewer than `most` steps. Read with a fresh
-- snapshot, like `job_alive` (migration 1): `save_step` calls it once it holds the
-- job's row lock, which every save of the job takes, so it counts the steps of the
-- saves that held the lock before, committed after the statement's own snapshot was
-- taken; a plain subquery would miss them, and concurrent saves could pass the limit.
CREATE OR REPLACE FUNCTION {schema}.step_fits(ns text, job_id uuid, step text, most bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {schema}.steps
                   WHERE namespace = ns AND job = job_id AND name = step)
        OR (SELECT count(*) FROM (SELECT 1 FROM {schema}.steps
                                  WHERE namespace = ns AND job = job_id
                                  LIMIT most) saved) < most;
END
$$;
