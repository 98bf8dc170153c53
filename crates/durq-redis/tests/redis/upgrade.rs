//! Key layout 2 and the upgrade from layout 1 (docs/redis.md, "Layout versions"):
//! finished jobs are recorded in an append-only log instead of a sorted set, a
//! namespace of layout 1 is upgraded in place by the first open, with jobs in flight and
//! stores of layout 1 possibly still running on it, and purge reads both places.
//!
//! The two layouts write every key alike but one: where a job that finishes is
//! recorded. Layout 1 added `QUEUE C ID PARENT` to the sorted set `done` (score: the
//! finish time) and wrote no layout record for an unpartitioned namespace; layout 2
//! appends `FINISHED QUEUE C ID PARENT` to the list `finished` and records
//! `{partitions, version}`. So [`as_layout_1`] turns a namespace this build wrote into
//! exactly what a layout-1 store leaves, by rewriting those two keys.

use super::*;

/// Rewrites the namespace's finished log as layout 1's finished index and deletes its
/// layout record: the namespace as a store of layout 1 would have written it.
async fn as_layout_1(env: &mut Env) {
    move_log_to_index(env).await;
    let _: () = env.admin.del(env.key("layout")).await.expect("DEL layout");
}

/// Moves every entry of the finished log into layout 1's finished index: what a store of
/// layout 1 writes for the same finishes.
async fn move_log_to_index(env: &mut Env) {
    let entries: Vec<String> = env
        .admin
        .lrange(env.key("finished"), 0, -1)
        .await
        .expect("LRANGE");
    for entry in entries {
        let (at, member) = entry.split_once(' ').expect("FINISHED QUEUE C ID PARENT");
        let at: i64 = at.parse().expect("finish time");
        let _: () = env
            .admin
            .zadd(env.key("done"), member, at)
            .await
            .expect("ZADD");
    }
    let _: () = env.admin.del(env.key("finished")).await.expect("DEL log");
}

async fn layout_record(env: &mut Env) -> Vec<Option<String>> {
    redis::cmd("HMGET")
        .arg(env.key("layout"))
        .arg("partitions")
        .arg("version")
        .query_async(&mut env.admin)
        .await
        .expect("HMGET")
}

fn lease() -> Duration {
    Duration::from_secs(30)
}

/// A populated namespace of layout 1, with jobs queued, running and finished in every
/// terminal state (children, a job unique while active), is upgraded by the first open
/// of this build while its jobs are in flight: the leases taken before the upgrade are
/// completed after it, a store of layout 1 still running finishes a job after it (its
/// entry lands in the old index), retry takes a job back out of the old index, every
/// count and listing stays right, and purge deletes every finished job of both places,
/// leaving nothing behind.
#[tokio::test]
async fn a_layout_1_namespace_is_upgraded_in_place_with_jobs_in_flight() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let before = env.store().await;
    let parent = before
        .enqueue(NewJob::new("orders"))
        .await
        .expect("enqueue")
        .id;
    let mut queued = Vec::new();
    for i in 0..6 {
        let job = NewJob::new("orders").parent(parent).payload(vec![i]);
        queued.push(before.enqueue(job).await.expect("enqueue").id);
    }
    let unique = before
        .enqueue(NewJob::new("orders").unique_while_active("order-7"))
        .await
        .expect("enqueue")
        .id;
    // parent, queued[0..6], unique: claim eight, finish five of them in three ways.
    let claimed = before
        .claim(ClaimRequest::new(["orders"], "w-old", lease()).limit(8))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 8);
    let by_id = |id: JobId| {
        claimed
            .iter()
            .find(|c| c.id() == id)
            .map(|c| c.token())
            .expect("claimed")
    };
    before
        .complete(parent, by_id(parent), None)
        .await
        .expect("complete");
    before
        .complete(unique, by_id(unique), Some(Bytes::from_static(b"ok")))
        .await
        .expect("complete");
    let dead = queued[0];
    assert_eq!(
        before
            .fail(dead, by_id(dead), "boom", Retry::Never)
            .await
            .expect("fail"),
        JobState::Dead
    );
    before
        .complete(queued[1], by_id(queued[1]), None)
        .await
        .expect("complete");
    let scheduled_later = before
        .enqueue(NewJob::new("orders").delay(Duration::from_secs(60)))
        .await
        .expect("enqueue")
        .id;
    let cancelled = before
        .enqueue(NewJob::new("orders"))
        .await
        .expect("enqueue")
        .id;
    assert_eq!(
        before.cancel(cancelled).await.expect("cancel"),
        JobState::Cancelled
    );
    // In flight across the upgrade: queued[2..6] (running under w-old's leases).
    as_layout_1(&mut env).await;
    assert_eq!(env.zcard("done").await, 5);
    assert_eq!(layout_record(&mut env).await, [None, None]);

    env.clock.advance(Duration::from_secs(1));
    let after = env.store().await;
    assert_eq!(
        layout_record(&mut env).await,
        [Some("1".to_owned()), Some("2".to_owned())],
        "the first open records layout 2"
    );
    // Leases taken before the upgrade hold after it.
    after
        .complete(queued[2], by_id(queued[2]), None)
        .await
        .expect("complete a job leased before the upgrade");
    assert_eq!(
        after
            .fail(queued[3], by_id(queued[3]), "again", Retry::Never)
            .await
            .expect("fail a job leased before the upgrade"),
        JobState::Dead
    );
    // A store of layout 1 still running finishes queued[4]: its entry lands in the old
    // index. (This build writes the log; moving its entry is what the old store writes.)
    before
        .complete(queued[4], by_id(queued[4]), None)
        .await
        .expect("complete");
    move_log_to_index(&mut env).await;
    assert_eq!(env.zcard("done").await, 8);
    assert_eq!(env.llen("finished").await, 0);
    // Retry takes a job finished under layout 1 out of the old index.
    after.retry(dead).await.expect("retry");
    assert_eq!(env.zcard("done").await, 7);
    let stats = after.stats("orders").await.expect("stats");
    assert_eq!(
        (
            stats.ready,
            stats.scheduled,
            stats.running,
            stats.succeeded,
            stats.dead,
            stats.cancelled
        ),
        (1, 1, 1, 5, 1, 1)
    );
    let listed = after
        .list(ListQuery::new("orders").state(JobState::Succeeded))
        .await
        .expect("list");
    let listed: HashSet<JobId> = listed.jobs.iter().map(|job| job.id).collect();
    assert_eq!(
        listed,
        HashSet::from([parent, unique, queued[1], queued[2], queued[4]])
    );
    // Everything still alive finishes under layout 2.
    let again = after
        .claim(ClaimRequest::new(["orders"], "w-new", lease()).limit(10))
        .await
        .expect("claim");
    assert_eq!(
        again.iter().map(|c| c.id()).collect::<Vec<_>>(),
        [dead],
        "the retried job is the one ready job"
    );
    after
        .complete(dead, again[0].token(), None)
        .await
        .expect("complete");
    after
        .complete(queued[5], by_id(queued[5]), None)
        .await
        .expect("complete a job leased before the upgrade");
    assert_eq!(
        after.cancel(scheduled_later).await.expect("cancel"),
        JobState::Cancelled
    );
    assert_eq!(env.llen("finished").await, 3);

    // Nothing is due before its retention has passed, in either place.
    assert_eq!(after.purge(100).await.expect("purge"), 0);
    env.clock
        .advance(env.settings.retention + Duration::from_secs(1));
    assert_eq!(after.purge(100).await.expect("purge"), 10);
    assert!(
        env.namespace_keys().await.is_empty(),
        "purge left {:?}",
        env.namespace_keys().await
    );
    // The key unique while active went with its job: a new job may take it.
    let fresh = after
        .enqueue(NewJob::new("orders").unique_while_active("order-7"))
        .await
        .expect("enqueue");
    assert_ne!(fresh.id, unique);
}

/// The finished log is never edited in the middle, so a job that finished, was retried
/// and finished again has two entries. The older one deletes nothing: purge at a cutoff
/// between the two finishes keeps the job (its retention runs from its last finish) and
/// drops the entry; the newer one deletes it once due. Finishing twice in one
/// millisecond (a driven clock) counts the job once.
#[tokio::test]
async fn purge_keeps_a_job_finished_again_until_its_last_finish_is_due() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let first = store
        .claim_one(&["q"], "w", lease())
        .await
        .expect("claim")
        .expect("a job");
    store
        .fail(id, first.token(), "boom", Retry::Never)
        .await
        .expect("fail");
    env.clock.advance(Duration::from_secs(10));
    store.retry(id).await.expect("retry");
    let second = store
        .claim_one(&["q"], "w", lease())
        .await
        .expect("claim")
        .expect("a job");
    store
        .complete(id, second.token(), None)
        .await
        .expect("complete");
    assert_eq!(env.llen("finished").await, 2);
    // Past the first finish's retention, not the second's.
    env.clock
        .advance(env.settings.retention - Duration::from_secs(5));
    assert_eq!(store.purge(100).await.expect("purge"), 0);
    assert_eq!(
        store.get(id).await.expect("kept").state,
        JobState::Succeeded
    );
    assert_eq!(env.llen("finished").await, 1, "the stale entry is dropped");
    env.clock.advance(Duration::from_secs(6));
    assert_eq!(store.purge(100).await.expect("purge"), 1);
    assert!(store.get(id).await.expect_err("purged").is_not_found());

    // Two finishes in one millisecond: two entries, one job counted.
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    for outcome in ["dead", "succeeded"] {
        let claimed = store
            .claim_one(&["q"], "w", lease())
            .await
            .expect("claim")
            .expect("a job");
        if outcome == "dead" {
            store
                .fail(id, claimed.token(), "boom", Retry::Never)
                .await
                .expect("fail");
            store.retry(id).await.expect("retry");
        } else {
            store
                .complete(id, claimed.token(), None)
                .await
                .expect("complete");
        }
    }
    assert_eq!(env.llen("finished").await, 2);
    env.clock
        .advance(env.settings.retention + Duration::from_secs(1));
    assert_eq!(store.purge(100).await.expect("purge"), 1);
    assert!(env.namespace_keys().await.is_empty());
}

/// Purges racing over one finished log: 8 stores on connections of their own purge at
/// once, a few entries at a time, while the log holds 2,000 due jobs. Each job is
/// deleted by exactly one of them (the counts add up to 2,000), and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purges_delete_each_finished_job_once() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    const JOBS: usize = 2000;
    enqueue_all(&store, (0..JOBS).map(|_| NewJob::new("q")).collect()).await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", lease()).limit(JOBS))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), JOBS);
    let completions = claimed
        .iter()
        .map(|c| durq_core::Completion::new(c.id(), c.token(), None))
        .collect();
    for outcome in store
        .complete_batch(completions)
        .await
        .expect("complete_batch")
    {
        outcome.expect("completed");
    }
    env.clock
        .advance(env.settings.retention + Duration::from_secs(1));
    let mut purgers = Vec::new();
    for _ in 0..8 {
        let purger = env.store().await;
        purgers.push(tokio::spawn(async move {
            let mut deleted = 0;
            loop {
                let n = purger.purge(7).await.expect("purge");
                if n == 0 {
                    return deleted;
                }
                deleted += n;
            }
        }));
    }
    let mut total = 0;
    for purger in purgers {
        total += purger.await.expect("purger");
    }
    assert_eq!(total, JOBS as u64);
    assert!(env.namespace_keys().await.is_empty());
}
