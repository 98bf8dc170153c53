-- Migration 7: claims that fit the worker (CONTRACT F1–F6).
--
-- `jobs.placement` holds a job's needs and locality as durq-core encodes them
-- (`durq_core::fit::encode_placement`: `{"a":{name:amount},"c":[key],"l":locality}`,
-- empty parts left out), NULL when the job declares neither. A nullable column
-- without a default is added to the catalog only: no rewrite. Older builds keep
-- working on a migrated schema: their jobs get NULL, which fits every budget, and
-- their plain claims ignore the column.
--
-- Every statement here is safe to run twice.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS placement jsonb;

-- A claim that prefers localities (F5) looks up, per queue and preferred locality,
-- the first ready jobs in claim order; without this index each lookup would walk the
-- queue's whole ready range when the locality has few or no jobs. Only queued jobs
-- with a locality are in it, so jobs that declare none cost it nothing. Building it
-- reads the table once under a lock that holds writes back (no row has a placement
-- yet, so it stays empty); migration 2 rebuilt two indexes the same way.
CREATE INDEX IF NOT EXISTS jobs_ready_locality
    ON {schema}.jobs (namespace, queue, (placement ->> 'l'), priority DESC, run_at, seq)
    WHERE state = 'queued' AND placement ? 'l';

-- `Budget::admits` (F2, F3) transcribed: the budget (`Budget::to_json`) as a JSON
-- path predicate that a stored placement matches (`placement @@ …`) exactly when
-- the budget admits the job's needs. NULL, no budget, admits every job.
--
-- For each amount the budget names, a job needing more of it does not fit; amounts
-- it does not name are not looked at (a missing member is an empty sequence in lax
-- mode, and a comparison with nothing is false). Each capability the job needs must
-- equal one the budget offers, whole string to whole string; a budget offering none
-- admits only jobs needing none. Numbers compare as `numeric`: exact for every
-- amount up to 2^53 - 1. Names are written as JSON strings (`to_json`), which is the
-- quoting a JSON path takes, so no name can change the predicate's shape.
--
-- A path rather than a boolean function of (placement, budget): a claim builds it
-- once (an uncorrelated subquery) and `@@` tests each row in C, about 1 µs a row,
-- where a function walking the job's amounts with `jsonb_each` costs about 10 µs a
-- row; a claim whose budget admits few of the jobs ahead of it tests many rows.
-- PL/pgSQL rather than SQL: a session keeps the compiled function and its queries'
-- plans, where a SQL function's body is parsed and planned again by every claim
-- (about 0.05 ms a call against 0.25 ms). STABLE, though its answer depends on its
-- argument alone: the server plans each claim with its parameters, and would run an
-- IMMUTABLE function of the budget while planning, at every place a statement names
-- it, every claim.
CREATE OR REPLACE FUNCTION {schema}.budget_admits(budget jsonb) RETURNS jsonpath
    LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    amounts text;
    offered text;
BEGIN
    IF budget IS NULL THEN
        RETURN 'true';
    END IF;
    SELECT string_agg(format('@.%s > %s', to_json(name), amount), ' || ')
    INTO amounts
    FROM jsonb_each(budget -> 'a') AS offer(name, amount);
    SELECT string_agg(format('@ != %s', key), ' && ')
    INTO offered
    FROM jsonb_array_elements(budget -> 'c') AS offer(key);
    RETURN (COALESCE('!exists($.a ? (' || amounts || ')) && ', '')
            || COALESCE('!exists($.c[*] ? (' || offered || '))', '!exists($.c[*])'))::jsonpath;
END
$$;
