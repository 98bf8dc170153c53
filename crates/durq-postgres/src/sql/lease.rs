//! The lease calls (CONTRACT L1–L10, H1–H4): heartbeats, completions (one, a batch, in
//! the caller's transaction), failures and releases.

/// Rule L1. `$3` token, `$4` new expiry, `$5` now.
pub(super) const HEARTBEAT: &str = r#"
UPDATE {schema}.jobs SET lease_expires_at = $4, heartbeat_at = $5
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING cancel_requested
"#;

/// Rules L4, L5 for many jobs at once: `$2` ids, `$3` tokens, `$4` results, `$5` now.
///
/// Each input row reports whether it completed its job and, when it did not, whether
/// the job exists at all (lease lost versus not found). An id appears at most once
/// per batch; the batcher holds a second call for the same id back for the next one.
///
/// `{again}` is `false` in the statement sent first. When its connection broke, the
/// store cannot know whether it committed, and sends it again with `{again}` =
/// [`COMPLETED_BEFORE`]: a job found succeeded with this token, this result and this
/// very `finished_at` (the first run's `$5`, reused) was completed by the first run,
/// and is answered as completed, not as a lost lease (L5 is about a second call).
pub(super) const COMPLETE: &str = r#"
WITH input AS (
    SELECT * FROM unnest($2::uuid[], $3::int8[], $4::bytea[]) AS t(id, token, result)
),
done AS (
    -- `lease_worker` stays: with `lease_token`, `started_at` and `finished_at` it is
    -- the attempt that succeeded (CONTRACT H4), which nothing else records. An earlier
    -- attempt's error is in the attempt history, not on a succeeded job (L4).
    UPDATE {schema}.jobs j SET
        state = 'succeeded', result = input.result, finished_at = $5,
        lease_expires_at = NULL, last_error = NULL
    FROM input
    -- `j.id = ANY($2)` repeats the join as an index condition: the scan of `jobs` then
    -- reads the batch's rows only, whatever the planner believes of the table's size.
    -- Joined on `input.id` alone, a namespace whose statistics lag its growth (any new
    -- one) was hash-joined against every row of the namespace, per batch.
    WHERE j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id
      AND (j.state = 'running' AND j.lease_token = input.token) IS TRUE
    RETURNING j.id
)
SELECT input.id, (done.id IS NOT NULL OR {again}) AS completed,
       CASE WHEN done.id IS NOT NULL THEN true
            ELSE EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = input.id)
       END AS found
FROM input LEFT JOIN done ON done.id = input.id
WHERE {relax}
"#;

/// `{again}` in [`COMPLETE`] when it is sent a second time: this entry's job was
/// completed by the first run.
pub(super) const COMPLETED_BEFORE: &str = "EXISTS (SELECT 1 FROM {schema}.jobs y \
     WHERE y.namespace = $1 AND y.id = input.id \
       AND (y.state = 'succeeded' AND y.lease_token = input.token AND y.finished_at = $5 \
            AND y.result IS NOT DISTINCT FROM input.result) IS TRUE)";

/// Rules L4, L5 and T3 (CONTRACT §7) for one job, inside the caller's transaction:
/// `$2` id, `$3` token, `$4` result, `$5` now.
///
/// The `UPDATE` holds the job's row until the caller's transaction ends, so no reclaim
/// takes the job back in between. When it matched no row, `fence` raises (migration
/// 8), which aborts the caller's transaction: its own writes cannot commit beside a
/// completion that did not happen. No `{relax}`: the caller's transaction keeps its
/// own `synchronous_commit`.
pub(super) const COMPLETE_IN: &str = r#"
WITH done AS (
    -- `lease_worker` stays, as in [`COMPLETE`]: it names the attempt that succeeded.
    UPDATE {schema}.jobs j SET
        state = 'succeeded', result = $4, finished_at = $5,
        lease_expires_at = NULL, last_error = NULL
    WHERE j.namespace = $1 AND j.id = $2
      AND (j.state = 'running' AND j.lease_token = $3) IS TRUE
    RETURNING j.id
)
SELECT {schema}.fence(
    EXISTS (SELECT 1 FROM done),
    EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = $2),
    $2)
"#;

/// Rule L1 for many leases at once: `$2` ids, `$3` tokens (parallel, sorted by id),
/// `$4` the new expiry, `$5` now.
///
/// One row per input row, with its position: whether its lease was extended (and
/// then whether cancellation was requested) and, when it was not, whether the job
/// exists at all (lease lost versus not found, L2, L3). The join back is on id and
/// token, so of two entries for one job only the one holding its lease is extended;
/// an entry repeated whole is answered twice alike. Running it twice sets the same
/// expiry twice, so a broken connection's statement is simply sent again.
pub(super) const HEARTBEAT_BATCH: &str = r#"
WITH input AS (
    SELECT * FROM unnest($2::uuid[], $3::int8[]) WITH ORDINALITY AS t(id, token, ord)
),
beat AS (
    UPDATE {schema}.jobs j SET lease_expires_at = $4, heartbeat_at = $5
    FROM input
    -- The batch's ids as an index condition, as in `COMPLETE`.
    WHERE j.namespace = $1 AND j.id = ANY($2::uuid[]) AND j.id = input.id
      AND (j.state = 'running' AND j.lease_token = input.token) IS TRUE
    RETURNING j.id, j.lease_token, j.cancel_requested
)
SELECT input.ord, (beat.id IS NOT NULL) AS extended,
       COALESCE(beat.cancel_requested, false) AS cancel_requested,
       CASE WHEN beat.id IS NOT NULL THEN true
            ELSE EXISTS (SELECT 1 FROM {schema}.jobs x WHERE x.namespace = $1 AND x.id = input.id)
       END AS found
FROM input LEFT JOIN beat ON beat.id = input.id AND beat.lease_token = input.token
WHERE {relax}
"#;

/// Rules L6, L7, H2 and the cancel-while-running decision.
///
/// `$3` token, `$4` retry time (NULL: never), `$5` now, `$6` error text, `$7` how many
/// of its bytes the attempt's record keeps (H2: 4 KiB, cut on a character boundary by
/// the caller, which knows the text is UTF-8; bytea's `substring` counts bytes). Every `SET`
/// expression reads the row as it was, so the requeue test is repeated rather than
/// stored: cancel requested wins, then a retry with attempts left, else dead. The
/// attempt is recorded as failed, with the error, whatever the new state
/// (`record_attempt!`). `lease_worker` is left as it was: the record reads it back
/// from `RETURNING`, which shows the row as updated, and a non-running job's lease
/// reads as none whatever the column holds.
pub(super) const FAIL: &str = concat!(
    r#"
WITH ended AS (
UPDATE {schema}.jobs SET
    -- Mirrors durq_core::transition::after_failure (attempts counts the one ending).
    -- CONTRACT A1 (cancel while running): a cancel-requested job that fails ends
    -- cancelled, never requeued; L6: a retry time with attempts left requeues it;
    -- L7: the last attempt, or no retry, is dead.
    state = CASE WHEN cancel_requested THEN 'cancelled'
                 WHEN $4::int8 IS NOT NULL AND attempts < max_attempts THEN 'queued'
                 ELSE 'dead' END,
    -- L6: requeued at the retry time, behind the jobs already ready then (C3).
    run_at = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
                  THEN $4::int8 ELSE run_at END,
    seq = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
               THEN nextval('{schema}.seq') ELSE seq END,
    -- CONTRACT §2 (every terminal state sets finished_at, A5): cancelled and dead
    -- (L7) are terminal; a requeued job (L6) is not.
    finished_at = CASE WHEN NOT cancel_requested AND $4::int8 IS NOT NULL AND attempts < max_attempts
                       THEN NULL ELSE $5 END,
    last_error = $6, lease_expires_at = NULL
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING id, state, lease_token, lease_worker, started_at
),"#,
    record_attempt!("$5", "failed", "substring($6 FROM 1 FOR $7::int4)"),
    "SELECT state FROM ended
"
);

/// Rules L8, L10: back to `queued`, ready at `$5` (now for a release, later for a
/// snooze), behind the ready jobs, the attempt taken back and `last_error` untouched;
/// `cancelled` instead when cancellation was requested, with the attempt still counted
/// (decided under A1). `$3` token, `$4` now, `$5` ready time. The attempt is recorded
/// as released either way (H2), as [`FAIL`] records its own.
pub(super) const RELEASE: &str = concat!(
    r#"
WITH ended AS (
UPDATE {schema}.jobs SET
    -- Mirrors durq_core::transition::after_release.
    -- CONTRACT A1 (cancel while running): a cancel-requested job that is released
    -- ends cancelled; otherwise L8: queued again.
    state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
    -- L8 takes the attempt back only from a job that goes back to queued (A1).
    attempts = CASE WHEN cancel_requested THEN attempts ELSE GREATEST(attempts - 1, 0) END,
    -- L8, L10: ready at $5, behind the jobs already ready (C3); a cancelled job keeps
    -- its run_at.
    run_at = CASE WHEN cancel_requested THEN run_at ELSE $5 END,
    seq = CASE WHEN cancel_requested THEN seq ELSE nextval('{schema}.seq') END,
    -- CONTRACT §2 (every terminal state sets finished_at): only the cancelled end.
    finished_at = CASE WHEN cancel_requested THEN $4 ELSE NULL END,
    lease_expires_at = NULL
WHERE namespace = $1 AND id = $2 AND (state = 'running' AND lease_token = $3) IS TRUE
  AND {relax}
RETURNING id, state, queue, lease_token, lease_worker, started_at
),"#,
    record_attempt!("$4", "released", "NULL::bytea"),
    "SELECT state, queue FROM ended
"
);
