-- Migration 8: fenced completion in the caller's transaction (CONTRACT §7, T3).
--
-- `fence` ends the statement that completes a job inside a transaction the caller
-- opened (`PostgresBackend::complete_in`). When the completion did not take effect (a
-- stale token, a job that is no longer running, no such job) it raises, and the error
-- aborts the caller's whole transaction: nothing written in it can commit beside a
-- completion that did not happen. SQLSTATE JB001 is a lost lease, JB002 a job not
-- found; the store maps them back to its errors. (`job_exists`, not `found`: that name
-- is PL/pgSQL's own FOUND variable, false here.) Safe to run twice.
CREATE OR REPLACE FUNCTION {schema}.fence(completed boolean, job_exists boolean, job uuid)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF completed THEN
        RETURN true;
    ELSIF job_exists THEN
        RAISE EXCEPTION 'lease lost: job % is not running under this lease', job
            USING ERRCODE = 'JB001';
    ELSE
        RAISE EXCEPTION 'job % not found', job USING ERRCODE = 'JB002';
    END IF;
END
$$;
