-- Migration 2: lookups by primary key only, and storage settings for a table whose
-- rows are updated several times each.
--
-- Every statement here is safe to run twice (it runs once, under the migration lock,
-- but a hand-run repair must not fail half way).

-- The partial indexes' predicates name a column only their own statement filters on.
--
-- With `WHERE state = 'running'`, every lease call (`… AND id = $2 AND state =
-- 'running'`) satisfied the predicate too, and the planner could, and did, choose a
-- bitmap scan of `jobs_leases` filtered by id over the primary key: that index holds
-- running jobs, so it looks tiny, but until a vacuum it also holds one dead entry per
-- job ever run, and a bitmap scan never marks them dead, so each lookup walked all of
-- them (a drain slowing down job after job). A plan chosen while the index was small
-- is also kept by the connection's prepared statement. `lease_expires_at` is set
-- exactly while a job is running; reclaim filters on `lease_expires_at < $now`,
-- which implies the new predicate, and no lease call does, so they can only use the
-- primary key.
DROP INDEX IF EXISTS {schema}.jobs_leases;
CREATE INDEX jobs_leases ON {schema}.jobs (namespace, lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- The same for retention: `finished_at` is set exactly in the terminal states; purge
-- filters on `finished_at <= $cutoff`, while `retry` (`state IN ('dead',
-- 'cancelled')`) no longer satisfies the predicate and looks the job up by key.
DROP INDEX IF EXISTS {schema}.jobs_finished;
CREATE INDEX jobs_finished ON {schema}.jobs (namespace, finished_at)
    WHERE finished_at IS NOT NULL;

-- Each job row is written three times or more (enqueue, claim, finish). Free space
-- in every page lets the new version of a row go into the page of the old one (one
-- page dirtied instead of two); the autovacuum thresholds are a share of the table,
-- and a queue table turns over its whole content, so vacuum it after 2 % of dead
-- rows rather than the default 20 %, and keep its statistics fresh.
ALTER TABLE {schema}.jobs SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
