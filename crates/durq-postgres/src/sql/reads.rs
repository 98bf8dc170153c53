//! Reads: get, payload, children, attempts, stats, queues and list (CONTRACT A3, A4, A7).

/// Whether a job exists: tells "not found" from "lease lost" after a missed update.
pub(super) const EXISTS: &str = "SELECT state FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

pub(super) const GET: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {schema}.jobs WHERE namespace = $1 AND id = $2"
);

/// Marks a job that has not ended as awaited, so its ending is announced (migration 13,
/// CONTRACT O2). Writes only a row not marked yet.
pub(super) const MARK_AWAITED: &str = "UPDATE {schema}.jobs SET awaited = true \
     WHERE namespace = $1 AND id = $2 AND awaited IS NOT TRUE \
     AND state IN ('waiting', 'queued', 'running')";

pub(super) const PAYLOAD: &str =
    "SELECT payload FROM {schema}.jobs WHERE namespace = $1 AND id = $2";

pub(super) const CHILDREN: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM {schema}.jobs WHERE namespace = $1 AND parent = $2 ORDER BY id"
);

/// Rules H1–H4: the job's own record of its last claim (state, worker, token, start,
/// finish) and its stored attempts, one row per attempt (the attempt columns NULL when
/// it has none), none when the job does not exist. One statement, so one snapshot:
/// the records and the job agree (`durq_core::attempts::history` joins them). Both
/// lookups are primary-key ranges.
pub(super) const ATTEMPTS: &str = r#"
SELECT j.state, j.lease_worker, j.lease_token, j.started_at, j.finished_at,
       a.token, a.worker, a.started_at, a.ended_at, a.outcome, a.error
FROM {schema}.jobs j
LEFT JOIN {schema}.attempts a ON a.namespace = $1 AND a.job = $2
WHERE j.namespace = $1 AND j.id = $2
"#;

/// Rule A3: counts per state, queued split by `run_at <= $3`, from `jobs_listing`.
pub(super) const STATS: &str = r#"
SELECT state, count(*) FILTER (WHERE run_at <= $3) AS due, count(*) AS total
FROM {schema}.jobs WHERE namespace = $1 AND queue = $2
GROUP BY state
"#;

/// Rule A7: per queue and state of namespace `$1`, the counts as [`STATS`] gives them
/// and, of the ready jobs (`run_at <= $2`), the earliest ready time; by queue name.
/// One pass over the namespace's rows of the `jobs_listing` index's leading columns.
pub(super) const QUEUES: &str = r#"
SELECT queue, state, count(*) FILTER (WHERE run_at <= $2) AS due, count(*) AS total,
       min(run_at) FILTER (WHERE state = 'queued' AND run_at <= $2) AS oldest
FROM {schema}.jobs WHERE namespace = $1
GROUP BY queue, state
ORDER BY queue
"#;

/// The filters of `list` every walk applies to the rows it reaches (CONTRACT A4):
/// the tenant (`$tenant`, NULL for every tenant) and the tags (`$tags`, the filter's
/// JSON object, NULL for none), all of which a job's tags must contain (`@>`, whole
/// keys and whole values). Neither has an index (nothing on the hot path needs one,
/// and every enqueue would pay for it), so a selective one makes the walk read past
/// the rows it leaves out. A row whose stored tags do not read as JSON passes the tag
/// filter (`tags_json` is NULL, migration 10), so its decoding reports it `Corrupt`.
macro_rules! list_filters {
    ($tenant:literal, $tags:literal) => {
        concat!(
            "
      AND (",
            $tenant,
            "::bytea IS NULL OR tenant = ",
            $tenant,
            ")
      AND (",
            $tags,
            "::jsonb IS NULL
           OR (tags IS NOT NULL AND ({schema}.tags_json(tags) @> ",
            $tags,
            "::jsonb) IS NOT FALSE))"
        )
    };
}

/// Rule A4 for one queue: one page, newest first. `$2` the queue, `$3` the states to
/// list (every state when the query names none), `$4` the exclusive cursor (the
/// largest uuid for the first page), `$5` the page size, `$6` and `$7` the
/// `list_filters!`, `$8` the lowest id the page may hold (NULL: none; see
/// `PostgresBackend::list` for the bound on the rows one filtered page examines). One range of `jobs_listing` (namespace, queue, state, id) per
/// state, walked newest first and cut at `$5` matches, then merged: a page costs its
/// size (and the rows the filters leave out), not its depth.
pub(super) const LIST_QUEUE: &str = concat!(
    "SELECT ",
    "{columns}",
    r#" FROM unnest($3::text[]) AS s(st),
LATERAL (
    SELECT "#,
    "{columns}",
    r#" FROM {schema}.jobs
    WHERE namespace = $1 AND queue = $2 AND state = s.st AND id < $4
      AND id >= COALESCE($8::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$6", "$7"),
    r#"
    ORDER BY id DESC
    LIMIT $5
) page
ORDER BY id DESC
LIMIT $5
"#
);

/// Rule A4 across queues, for a query naming states or a queue prefix but no queue:
/// [`LIST_QUEUE`]'s walk for every queue of the namespace whose name starts with `$2`
/// (NULL: every queue), merged. `$3` to `$8` as in [`LIST_QUEUE`].
///
/// The namespace's queues come from a skip scan of `jobs_listing`: each step one
/// descent to the next queue name, so their number, not the jobs', sets its cost. The
/// prefix is compared with `starts_with`, byte for byte (no pattern, so `_` and `%`
/// are themselves), on each name found: index order follows the database's collation,
/// in which the names sharing a prefix need not be adjacent, so no range of it is
/// taken for the prefix. Per queue and state the walk stops at `$5` matches, so a page
/// reads at most queues × states × `$5` rows however deep it is.
pub(super) const LIST_QUEUES: &str = concat!(
    r#"
WITH RECURSIVE queues(name) AS (
    SELECT min(queue) FROM {schema}.jobs WHERE namespace = $1
    UNION ALL
    SELECT (SELECT min(queue) FROM {schema}.jobs WHERE namespace = $1 AND queue > q.name)
    FROM queues q
    WHERE q.name IS NOT NULL
)
SELECT "#,
    "{columns}",
    r#" FROM queues q
CROSS JOIN unnest($3::text[]) AS s(st),
LATERAL (
    SELECT "#,
    "{columns}",
    r#" FROM {schema}.jobs
    WHERE namespace = $1 AND queue = q.name AND state = s.st AND id < $4
      AND id >= COALESCE($8::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$6", "$7"),
    r#"
    ORDER BY id DESC
    LIMIT $5
) page
WHERE q.name IS NOT NULL AND ($2::text IS NULL OR starts_with(q.name, $2::text))
ORDER BY id DESC
LIMIT $5
"#
);

/// Rule A4 over every job of the namespace (no queue, prefix or state named): the
/// primary key (namespace, id) walked newest first from the exclusive cursor `$2`,
/// `$3` the page size, `$4` and `$5` the `list_filters!`, `$6` the lowest id the page
/// may hold (NULL: none), as in [`LIST_QUEUE`]. Without filters a page reads its own
/// rows and no more.
pub(super) const LIST_ALL: &str = concat!(
    "SELECT ",
    "{columns}",
    r#" FROM {schema}.jobs
WHERE namespace = $1 AND id < $2
  AND id >= COALESCE($6::uuid, '00000000-0000-0000-0000-000000000000')"#,
    list_filters!("$4", "$5"),
    r#"
ORDER BY id DESC
LIMIT $3
"#
);
