//! Rule A4's filters: across queues, by several states, by tenant and tag, by a literal
//! queue prefix; cursors that outlive their job, and cursors that are not ids.

use std::collections::HashSet;
use std::time::Duration;

use durq_core::{Job, JobId, JobState, ListQuery, NewJob, Retry, Store};

use super::support::{claim, enqueue, expect_invalid, Must};
use crate::{Harness, TestEnv};

/// Every job `query` lists, page after page of `page` jobs, checking that each page
/// keeps its limit and that no job comes twice.
async fn list_pages(store: &Store, query: ListQuery, page: usize, what: &str) -> Vec<Job> {
    let mut all: Vec<Job> = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor = None;
    for _ in 0..10_000 {
        let mut query = query.clone().limit(page);
        query.cursor = cursor;
        let got = store.list(query).await.must(what);
        assert!(
            got.jobs.len() <= page,
            "{what}: a page holds at most its limit"
        );
        for job in &got.jobs {
            assert!(seen.insert(job.id), "{what}: job {} listed twice", job.id);
        }
        all.extend(got.jobs);
        match got.next {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
    panic!("{what}: paging never ends");
}

fn ids(jobs: &[Job]) -> Vec<JobId> {
    jobs.iter().map(|job| job.id).collect()
}

/// A4: without a queue, `list` shows every queue's jobs, newest first by id; several
/// states are one filter (a job in any of them); the pages of any size join to the
/// whole set.
pub async fn a4_list_spans_queues_and_several_states_newest_first(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut all = Vec::new();
    for i in 0..18 {
        let queue = ["a", "b", "c.d"][i % 3];
        all.push((enqueue(&store, NewJob::new(queue), "A4").await, queue));
        if i % 4 == 0 {
            env.clock.advance(Duration::from_millis(2));
        }
    }
    // Some of each state: b's jobs die, two of a's run, one of c.d's is cancelled.
    for held in claim(&store, &["b"], 6, "A4: claim b").await {
        store
            .fail(held.id(), held.token(), "x", Retry::Never)
            .await
            .must("A4: fail");
    }
    claim(&store, &["a"], 2, "A4: claim a").await;
    store.cancel(all[2].0).await.must("A4: cancel");
    let newest_first: Vec<JobId> = all.iter().rev().map(|(id, _)| *id).collect();
    for page in [1, 4, 18, 100] {
        let listed = list_pages(&store, ListQuery::all(), page, "A4: every queue").await;
        assert_eq!(
            ids(&listed),
            newest_first,
            "A4: pages of {page} across queues join to every job, newest first"
        );
    }
    let states = [JobState::Dead, JobState::Running];
    let listed = list_pages(
        &store,
        ListQuery::all().states(states),
        5,
        "A4: dead or running",
    )
    .await;
    let expected: Vec<JobId> = {
        let mut wanted = Vec::new();
        for id in &newest_first {
            let state = store.get(*id).await.must("A4: get").state;
            if states.contains(&state) {
                wanted.push(*id);
            }
        }
        wanted
    };
    assert_eq!(
        expected.len(),
        8,
        "A4: the setup made 6 dead and 2 running jobs"
    );
    assert_eq!(
        ids(&listed),
        expected,
        "A4: a filter of several states lists the jobs in any of them"
    );
    let listed = list_pages(
        &store,
        ListQuery::new("c.d").state(JobState::Queued),
        2,
        "A4",
    )
    .await;
    assert_eq!(listed.len(), 5, "A4: a queue and a state filter combine");
}

/// A4: the tenant filter is exact: none given lists every tenant, the empty tenant
/// given lists the default tenant's jobs only; tag filters match key and value exactly,
/// all of them; a value or name that is a prefix of another does not match it.
pub async fn a4_list_filters_by_tenant_and_tags_exactly(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let acme_pro = enqueue(
        &store,
        NewJob::new("q")
            .tenant("acme")
            .tag("plan", "pro")
            .tag("region", "eu"),
        "A4",
    )
    .await;
    let acme_free = enqueue(
        &store,
        NewJob::new("q").tenant("acme").tag("plan", "free"),
        "A4",
    )
    .await;
    let acmes_pro = enqueue(
        &store,
        NewJob::new("q").tenant("acmes").tag("plan", "pro"),
        "A4",
    )
    .await;
    let untagged = enqueue(&store, NewJob::new("q2"), "A4").await;
    let prefixed = enqueue(&store, NewJob::new("q").tag("plan", "professional"), "A4").await;
    let cases: Vec<(ListQuery, Vec<JobId>, &str)> = vec![
        (
            ListQuery::all(),
            vec![prefixed, untagged, acmes_pro, acme_free, acme_pro],
            "no tenant given lists every tenant",
        ),
        (
            ListQuery::all().tenant(""),
            vec![prefixed, untagged],
            "the empty tenant lists the default tenant's jobs only",
        ),
        (
            ListQuery::all().tenant("").tag("plan", "professional"),
            vec![prefixed],
            "the default tenant and tags combine",
        ),
        (
            ListQuery::all().tenant("acme"),
            vec![acme_free, acme_pro],
            "the tenant filter is exact",
        ),
        (
            ListQuery::all().tag("plan", "pro"),
            vec![acmes_pro, acme_pro],
            "a tag matches its whole value",
        ),
        (
            ListQuery::all().tag("plan", "pro").tag("region", "eu"),
            vec![acme_pro],
            "every tag given must match",
        ),
        (
            ListQuery::all().tenant("acme").tag("plan", "pro"),
            vec![acme_pro],
            "tenant and tags combine",
        ),
        (
            ListQuery::all().tenant("acmes").tag("plan", "free"),
            vec![],
            "an empty intersection lists nothing",
        ),
        (
            ListQuery::all().tag("pla", "pro"),
            vec![],
            "a tag key is matched whole",
        ),
        (
            ListQuery::all().tenant("acm"),
            vec![],
            "a tenant is matched whole",
        ),
        (
            ListQuery::new("q").tag("region", "eu"),
            vec![acme_pro],
            "queue and tag filters combine",
        ),
    ];
    for (query, expected, why) in cases {
        for page in [1, 3] {
            let listed = list_pages(&store, query.clone(), page, "A4").await;
            assert_eq!(ids(&listed), expected, "A4: {why} (pages of {page})");
        }
    }
    let job = store.get(acme_pro).await.must("A4: get");
    assert_eq!(
        job.tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
        vec![("plan", "pro"), ("region", "eu")],
        "A4: listed jobs carry their tags"
    );
}

/// A4: a queue prefix is compared byte for byte: `_` and `.` are not wildcards, case
/// counts, and a prefix with a byte no queue name may hold is refused.
pub async fn a4_queue_prefix_is_literal_and_case_sensitive(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut by_queue = Vec::new();
    for queue in ["a_b", "A_b", "aXb", "a_b.c", "a.b", "aYb", "a_", "b_a_b"] {
        by_queue.push((queue, enqueue(&store, NewJob::new(queue), "A4").await));
    }
    for (prefix, matching) in [
        ("a_b", vec!["a_b", "a_b.c"]),
        ("a_", vec!["a_b", "a_b.c", "a_"]),
        ("A_", vec!["A_b"]),
        ("a.", vec!["a.b"]),
        ("aX", vec!["aXb"]),
        ("a_b.c", vec!["a_b.c"]),
        ("zzz", vec![]),
    ] {
        let expected: Vec<JobId> = by_queue
            .iter()
            .rev()
            .filter(|(queue, _)| matching.contains(queue))
            .map(|(_, id)| *id)
            .collect();
        let listed = list_pages(&store, ListQuery::all().queue_prefix(prefix), 2, "A4").await;
        assert_eq!(
            ids(&listed),
            expected,
            "A4: prefix {prefix:?} lists exactly the queues {matching:?}"
        );
    }
    for bad in ["a%", "a*", "a(", "a\\", "^a", ""] {
        expect_invalid(
            store.list(ListQuery::all().queue_prefix(bad)).await,
            "queue_prefix",
            "A4: a prefix no queue name can start with",
        );
    }
}

/// A4: a cursor is a position, not a row: after the job it names is purged, the next
/// page still starts just below it. A cursor that is not a job id is refused naming
/// `cursor`.
pub async fn a4_cursor_survives_the_deletion_of_its_job(harness: &dyn Harness) {
    const RETENTION: Duration = Duration::from_secs(60);
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.retention(RETENTION)).await;
    let mut ids_made = Vec::new();
    for _ in 0..6 {
        ids_made.push(enqueue(&store, NewJob::new("q"), "A4").await);
    }
    let first = store.list(ListQuery::new("q").limit(3)).await.must("A4");
    let cursor = first.next.expect("A4: a full page has a cursor");
    assert_eq!(cursor, ids_made[3], "A4: the cursor is the page's last id");
    // Finish and purge exactly the cursor's job.
    let held = store
        .claim(durq_core::ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(6))
        .await
        .must("A4: claim");
    for job in &held {
        if job.id() == cursor {
            store
                .complete(job.id(), job.token(), None)
                .await
                .must("A4: complete");
        } else {
            store
                .release(job.id(), job.token())
                .await
                .must("A4: release");
        }
    }
    env.clock.advance(RETENTION);
    assert_eq!(store.purge(10).await.must("A4: purge"), 1);
    let next = store
        .list(ListQuery::new("q").limit(3).after(cursor))
        .await
        .must("A4: the page after a purged cursor");
    assert_eq!(
        ids(&next.jobs),
        vec![ids_made[2], ids_made[1], ids_made[0]],
        "A4: the page after a deleted cursor starts just below it"
    );
    let from_text = ListQuery::new("q")
        .limit(3)
        .after_cursor(&cursor.to_string())
        .must("A4: a printed cursor parses");
    assert_eq!(
        ids(&store.list(from_text).await.must("A4").jobs),
        ids(&next.jobs),
        "A4: a cursor printed and parsed back is the same position"
    );
    for bad in ["not-an-id", "", "0190c7c4-1d2e-7000-8000-00000000000g"] {
        expect_invalid(
            ListQuery::all().after_cursor(bad),
            "cursor",
            "A4: a bad cursor",
        );
    }
}
