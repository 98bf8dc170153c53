//! Rules A3, A4 and A7: a queue's counts, listing pages and filters, and the overview
//! of every queue.

use std::collections::HashSet;
use std::time::Duration;

use durq_core::{
    Clock, JobId, JobState, ListQuery, NewJob, QueueOverview, QueueStats, Retry, Store,
};

use super::support::{
    assert_stats, assert_stats_agree, claim, count, enqueue, expect_invalid, get, list_all, Must,
    Together,
};
use crate::{Harness, TestEnv};

/// A3: queues whose names are prefixes of each other, or differ only past a
/// separator, are counted apart: a backend that matches keys or rows by prefix would
/// add one queue's jobs to another's.
pub async fn a3_stats_of_queues_sharing_a_prefix_are_apart(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let queues = ["a", "ab", "a.b", "a:b", "ba"];
    for (n, queue) in queues.iter().enumerate() {
        for _ in 0..=n {
            enqueue(&store, NewJob::new(*queue), "A3").await;
        }
    }
    for (n, queue) in queues.iter().enumerate() {
        assert_stats(
            &store,
            queue,
            QueueStats {
                ready: n as u64 + 1,
                ..QueueStats::default()
            },
            &format!("A3: queue {queue} counts its own jobs only"),
        )
        .await;
    }
}

/// Queue `name` as `queues` lists it now; the scenario fails if it is not listed.
async fn listed(store: &Store, name: &str) -> QueueOverview {
    let queues = store.queues().await.must("A7: queues");
    match queues.into_iter().find(|q| q.queue == name) {
        Some(found) => found,
        None => panic!("A7: queue {name} is listed"),
    }
}

/// A7: `queues` lists every queue holding a job or paused, by name, without being told
/// their names: counts as `stats` gives them, pause, and lag (the age of the oldest
/// ready job, whatever its priority); queues sharing a prefix apart; none listed for an
/// empty namespace.
pub async fn a7_queues_list_every_queue_with_counts_pause_and_lag(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert!(
        store.queues().await.must("A7: queues").is_empty(),
        "A7: an empty namespace lists no queue"
    );
    // The claim below expects the newer "b" job: both share one partition (CONTRACT §8).
    let together = Together::new(&store, "A7").await;
    let start = env.clock.now();
    // "b": an old job at a low priority, a newer one at a high priority (claimed first).
    let oldest = together
        .enqueue(&store, NewJob::new("b").priority(-5), "A7")
        .await;
    env.clock.advance(Duration::from_secs(2));
    let newer = together
        .enqueue(&store, NewJob::new("b").priority(7), "A7")
        .await;
    enqueue(&store, NewJob::new("b.x"), "A7").await;
    let later = env.clock.now().saturating_add(Duration::from_secs(100));
    enqueue(&store, NewJob::new("a").run_at(later), "A7").await;
    store.pause("c").await.must("A7: pause");
    env.clock.advance(Duration::from_secs(3));

    let mut queues = store.queues().await.must("A7: queues");
    queues.retain(|q| q.queue != Together::ANCHOR_QUEUE);
    let names: Vec<&str> = queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, ["a", "b", "b.x", "c"], "A7: every queue, by name");
    for overview in &queues {
        let mut stats = store.stats(&overview.queue).await.must("A7: stats");
        stats.paused = overview.queue == "c";
        assert_eq!(
            overview.stats, stats,
            "A7: {} counts as stats does",
            overview.queue
        );
    }
    let b = listed(&store, "b").await;
    assert_eq!(b.stats.ready, 2);
    assert_eq!(
        b.oldest_ready,
        Some(start),
        "A7: the oldest ready job, at any priority"
    );
    assert_eq!(b.lag, Some(Duration::from_secs(5)), "A7: its age now");
    assert_eq!(
        listed(&store, "b.x").await.lag,
        Some(Duration::from_secs(3))
    );
    let a = listed(&store, "a").await;
    assert_eq!(
        (a.stats.scheduled, a.lag),
        (1, None),
        "A7: nothing ready, no lag"
    );
    let c = listed(&store, "c").await;
    assert!(
        c.stats.paused && c.stats.total() == 0 && c.lag.is_none(),
        "A7: {c:?}"
    );
    assert!(!b.stats.paused);

    // The high-priority job is claimed first; the old one keeps the lag.
    let claimed = claim(&store, &["b"], 1, "A7").await;
    assert_eq!(claimed[0].id(), newer);
    env.clock.advance(Duration::from_secs(1));
    let b = listed(&store, "b").await;
    assert_eq!((b.stats.ready, b.stats.running), (1, 1));
    assert_eq!(b.lag, Some(Duration::from_secs(6)));
    // Once the old one is claimed too, nothing in "b" is ready: no lag.
    let claimed = claim(&store, &["b"], 1, "A7").await;
    assert_eq!(claimed[0].id(), oldest);
    let b = listed(&store, "b").await;
    assert_eq!((b.stats.ready, b.stats.running, b.lag), (0, 2, None));
    // A scheduled job that came due is ready, and its lag runs from its run time.
    env.clock.advance(Duration::from_secs(100));
    let a = listed(&store, "a").await;
    assert_eq!((a.stats.ready, a.oldest_ready), (1, Some(later)));
}

/// A3: `stats` counts jobs per state, queued split into ready and scheduled by the
/// store's clock, per queue; it agrees with the jobs `list` shows after every step;
/// an unused queue counts zero and a bad queue name is refused.
pub async fn a3_stats_count_every_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A3").await;
    assert_stats(&store, "q", QueueStats::default(), "A3: an unused queue").await;
    expect_invalid(
        store.stats("bad queue").await,
        "queue",
        "A3: a bad queue name",
    );
    let later = env.clock.now().saturating_add(Duration::from_secs(100));
    let mut ids = Vec::new();
    for i in 0..12 {
        let job = if i < 3 {
            NewJob::new("q").run_at(later)
        } else {
            NewJob::new("q").max_attempts(if i == 11 { 1 } else { 5 })
        };
        ids.push(together.enqueue(&store, job, "A3").await);
    }
    for _ in 0..4 {
        together.enqueue(&store, NewJob::new("other"), "A3").await;
    }
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 9,
            scheduled: 3,
            ..QueueStats::default()
        },
        "A3: enqueued",
    )
    .await;
    let held = claim(&store, &["q"], 6, "A3").await;
    store
        .complete(held[0].id(), held[0].token(), None)
        .await
        .must("A3");
    store
        .fail(held[1].id(), held[1].token(), "x", Retry::Never)
        .await
        .must("A3");
    store
        .release(held[2].id(), held[2].token())
        .await
        .must("A3");
    store.cancel(held[3].id()).await.must("A3");
    store
        .release(held[3].id(), held[3].token())
        .await
        .must("A3");
    store
        .fail(held[4].id(), held[4].token(), "y", Retry::At(later))
        .await
        .must("A3");
    store.cancel(ids[10]).await.must("A3");
    let expected = QueueStats {
        waiting: 0,
        ready: 9 - 6 + 1 - 1,
        scheduled: 3 + 1,
        running: 1,
        succeeded: 1,
        dead: 1,
        cancelled: 2,
        paused: false,
    };
    assert_stats(&store, "q", expected, "A3: every state").await;
    assert_stats_agree(&store, "q", "A3: every state").await;
    assert_stats(
        &store,
        "other",
        QueueStats {
            ready: 4,
            ..QueueStats::default()
        },
        "A3: per queue",
    )
    .await;
    // The clock moves: scheduled jobs become ready, the lease expires.
    env.clock.advance(Duration::from_secs(100));
    assert_stats(
        &store,
        "q",
        QueueStats {
            ready: 3 + 4,
            scheduled: 0,
            ..expected
        },
        "A3: scheduled jobs count as ready once due",
    )
    .await;
    store.reclaim(100).await.must("A3: reclaim");
    assert_stats_agree(&store, "q", "A3: after reclaim").await;
    store.retry(held[1].id()).await.must("A3: retry");
    let after = assert_stats_agree(&store, "q", "A3: after retry")
        .await
        .expect("A3 runs only where Inspect is declared");
    assert_eq!(after.total(), 12, "A3: every job counted once");
}

/// A4: `list` of a queue is newest first; pages of a given size join to the whole set
/// without repeats or gaps; each listed job equals `get`; other queues are not listed;
/// a bad page size or queue name is refused.
pub async fn a4_list_pages_join_to_the_whole_set_newest_first(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..25i16 {
        if i % 5 == 0 {
            env.clock.advance(Duration::from_millis(3));
        }
        ids.push(enqueue(&store, NewJob::new("q").priority(i % 3), "A4").await);
        enqueue(&store, NewJob::new("q2"), "A4").await;
    }
    let held = claim(&store, &["q"], 4, "A4").await;
    store
        .complete(held[0].id(), held[0].token(), None)
        .await
        .must("A4");
    let newest_first: Vec<JobId> = ids.iter().rev().copied().collect();
    for limit in [1, 7, 25, 1_000] {
        let mut seen = Vec::new();
        let mut cursor = None;
        let mut pages = 0;
        loop {
            let mut query = ListQuery::new("q").limit(limit);
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list");
            pages += 1;
            assert!(
                page.jobs.len() <= limit,
                "A4: a page holds at most its limit"
            );
            for job in &page.jobs {
                assert_eq!(
                    job,
                    &get(&store, job.id, "A4").await,
                    "A4: list shows jobs as get does"
                );
            }
            seen.extend(page.jobs.iter().map(|j| j.id));
            if page.jobs.len() == limit {
                assert_eq!(
                    page.next,
                    page.jobs.last().map(|j| j.id),
                    "A4: a full page's cursor is its last id"
                );
            } else {
                assert_eq!(page.next, None, "A4: a page that is not full is the last");
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(pages <= 100, "A4: paging never ends");
        }
        assert_eq!(
            seen, newest_first,
            "A4: pages of {limit} must join to every job of the queue, newest first, without repeats"
        );
    }
    // The cursor is exclusive and may be any listed id.
    let page = store
        .list(ListQuery::new("q").limit(3).after(ids[10]))
        .await
        .must("A4");
    assert_eq!(
        page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[9], ids[8], ids[7]],
        "A4: a page after a cursor starts just below it"
    );
    expect_invalid(
        store.list(ListQuery::new("q").limit(0)).await,
        "limit",
        "A4: limit 0",
    );
    expect_invalid(
        store.list(ListQuery::new("q").limit(1_001)).await,
        "limit",
        "A4: limit 1001",
    );
    expect_invalid(
        store.list(ListQuery::new("no such/queue")).await,
        "queue",
        "A4: a bad queue name",
    );
    assert!(
        store
            .list(ListQuery::new("empty"))
            .await
            .must("A4")
            .jobs
            .is_empty(),
        "A4: an unused queue lists nothing"
    );
}

/// A4: `list` filtered by state shows exactly the jobs in that state, newest first,
/// across pages.
pub async fn a4_list_filters_by_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // Claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "A").await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(together.enqueue(&store, NewJob::new("q"), "A4").await);
    }
    let held = claim(&store, &["q"], 20, "A4").await;
    for (i, job) in held.iter().enumerate() {
        match i % 4 {
            0 => store.complete(job.id(), job.token(), None).await.must("A4"),
            1 => {
                store
                    .fail(job.id(), job.token(), "x", Retry::Never)
                    .await
                    .must("A4");
            }
            2 => {
                store.cancel(job.id()).await.must("A4");
                store.release(job.id(), job.token()).await.must("A4");
            }
            _ => {}
        }
    }
    store.cancel(ids[29]).await.must("A4");
    let all = list_all(&store, "q", None, "A4").await;
    for state in JobState::ALL {
        let expected: Vec<JobId> = all
            .iter()
            .filter(|j| j.state == state)
            .map(|j| j.id)
            .collect();
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let mut query = ListQuery::new("q").state(state).limit(2);
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list by state");
            for job in &page.jobs {
                assert_eq!(
                    job.state, state,
                    "A4: a {state} page shows only {state} jobs"
                );
            }
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(
            seen, expected,
            "A4: list of {state} jobs must show exactly them, newest first"
        );
    }
    let counts = count(&all, env.clock.now());
    assert_eq!(
        (
            counts.succeeded,
            counts.dead,
            counts.cancelled,
            counts.running,
            counts.ready
        ),
        (5, 5, 6, 5, 9),
        "A4: the setup made the expected states"
    );
}

/// A4 with the decision: `next` is set whenever a page is full, so when the jobs fill
/// the pages exactly, the last page is empty with no cursor.
pub async fn a4_full_last_page_has_a_cursor_then_an_empty_page(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(enqueue(&store, NewJob::new("q"), "A4").await);
    }
    let first = store.list(ListQuery::new("q").limit(5)).await.must("A4");
    assert_eq!(first.next, Some(ids[5]), "A4: a full page has a cursor");
    let second = store
        .list(ListQuery::new("q").limit(5).after(ids[5]))
        .await
        .must("A4");
    assert_eq!(
        second.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[..5].iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        second.next,
        Some(ids[0]),
        "A4: a full last page still has a cursor"
    );
    let third = store
        .list(ListQuery::new("q").limit(5).after(ids[0]))
        .await
        .must("A4");
    assert!(
        third.jobs.is_empty(),
        "A4: the page after the oldest job is empty"
    );
    assert_eq!(third.next, None, "A4: an empty page has no cursor");
}

/// A4: while pages are read, new jobs are enqueued and other jobs change state
/// (claimed, cancelled, completed); every job that keeps its state throughout is
/// listed exactly once, no job is listed twice, and every listed job has the state
/// asked for.
pub async fn a4_jobs_keeping_state_are_never_skipped_while_paging(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for i in 0..60i16 {
        // Priorities spread the claims over the whole list, not just its oldest end.
        ids.push(enqueue(&store, NewJob::new("q").priority((i * 7) % 5), "A4").await);
    }
    for filter in [Some(JobState::Queued), None] {
        let mut seen: Vec<JobId> = Vec::new();
        let mut changed: HashSet<JobId> = HashSet::new();
        let mut cursor = None;
        let mut round = 0usize;
        loop {
            let mut query = ListQuery::new("q").limit(6);
            query.states = filter.into_iter().collect();
            query.cursor = cursor;
            let page = store.list(query).await.must("A4: list");
            for job in &page.jobs {
                if let Some(state) = filter {
                    assert_eq!(
                        job.state, state,
                        "A4: a filtered page holds only that state"
                    );
                }
                assert!(
                    !seen.contains(&job.id),
                    "A4: job {} listed twice while paging",
                    job.id
                );
                seen.push(job.id);
            }
            // Change the world between pages.
            round += 1;
            for _ in 0..3 {
                enqueue(
                    &store,
                    NewJob::new("q").priority(4),
                    "A4: enqueue between pages",
                )
                .await;
            }
            for job in claim(&store, &["q"], 2, "A4: claim between pages").await {
                changed.insert(job.id());
                if round % 2 == 0 {
                    store.complete(job.id(), job.token(), None).await.must("A4");
                }
            }
            // Cancel one job already seen and one not yet seen.
            for id in [seen.first().copied(), ids.get(round * 3).copied()]
                .into_iter()
                .flatten()
            {
                if store.cancel(id).await.must("A4: cancel between pages") == JobState::Cancelled {
                    changed.insert(id);
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(round < 100, "A4: paging never ends");
        }
        let now_queued: HashSet<JobId> = list_all(&store, "q", filter, "A4")
            .await
            .iter()
            .map(|j| j.id)
            .collect();
        let seen_set: HashSet<JobId> = seen.iter().copied().collect();
        for id in &ids {
            let kept_state = !changed.contains(id) && now_queued.contains(id);
            assert!(
                !kept_state || seen_set.contains(id),
                "A4: job {id} kept its state while the pages were read, but was skipped"
            );
        }
        assert!(
            ids.iter()
                .any(|id| !changed.contains(id) && seen_set.contains(id)),
            "A4: the scenario must list some unchanged jobs"
        );
    }
}
