//! Jobs that wait for jobs on Redis (CONTRACT G1–G5) beyond the conformance suite:
//! what the layout keeps (edges leave with their dependency, no `wfor` after the wait),
//! settling a deep graph whose jobs the ending call was not given (the `need` rounds of
//! `lua/graph.lua`), and a dependency buried by a claim script, which settles through
//! `settle.lua`.

use durq_core::graph::{failed_dependency, Dependency};

use super::*;

/// A chain of `n` jobs, each waiting for the one before it, enqueued as one batch.
fn chain(queue: &str, n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| {
            let job = NewJob::new(queue);
            if i == 0 {
                job
            } else {
                job.after(Dependency::Earlier(i - 1))
            }
        })
        .collect()
}

/// Completing a fan-in's dependencies releases it and leaves nothing of the wait
/// behind: no edge in the dependents index, no `wfor` field.
#[tokio::test]
async fn edges_and_counts_leave_with_the_wait() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let a = store.enqueue(NewJob::new("deps")).await.expect("a").id;
    let b = store.enqueue(NewJob::new("deps")).await.expect("b").id;
    let fan_in = store
        .enqueue(NewJob::new("fan-in").after(a).after(b))
        .await
        .expect("fan-in")
        .id;
    assert_eq!(env.zcard("dependents").await, 2, "one edge per dependency");
    let key = durq_redis::job_key(&env.settings.namespace, fan_in);
    let wfor: Option<String> = env.admin.hget(&key, "wfor").await.expect("HGET");
    assert_eq!(wfor.as_deref(), Some("2"));

    let claimed = store
        .claim(ClaimRequest::new(["deps"], "w", Duration::from_secs(30)).limit(2))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .expect("first");
    assert_eq!(env.zcard("dependents").await, 1, "a met edge goes");
    let wfor: Option<String> = env.admin.hget(&key, "wfor").await.expect("HGET");
    assert_eq!(wfor.as_deref(), Some("1"), "one dependency left");
    store
        .complete(claimed[1].id(), claimed[1].token(), None)
        .await
        .expect("second");
    assert_eq!(env.zcard("dependents").await, 0, "every edge went");
    let wfor: Option<String> = env.admin.hget(&key, "wfor").await.expect("HGET");
    assert_eq!(wfor, None, "a released job keeps no count");
    assert_eq!(
        store.get(fan_in).await.expect("get").state,
        JobState::Queued
    );
}

/// Cancelling the head of a chain of 300 cancels every job of it in one `cancel`: the
/// script meets dependents it was not given, and the rounds that learn them (level by
/// level, from the dependents index) end with the whole chain settled and no edge left.
#[tokio::test]
async fn cancelling_the_head_of_a_deep_chain_cancels_all_of_it() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let ids: Vec<JobId> = store
        .enqueue_batch(chain("chain", 300))
        .await
        .expect("chain")
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(env.zcard("dependents").await, 299);
    assert_eq!(
        store.stats("chain").await.expect("stats").waiting,
        299,
        "every job but the head waits"
    );
    assert_eq!(
        store.cancel(ids[0]).await.expect("cancel"),
        JobState::Cancelled
    );
    for (i, id) in ids.iter().enumerate().skip(1) {
        let job = store.get(*id).await.expect("get");
        assert_eq!(
            (job.state, job.last_error),
            (
                JobState::Cancelled,
                Some(failed_dependency(ids[i - 1], JobState::Cancelled))
            ),
            "job {i} of the chain"
        );
    }
    assert_eq!(env.zcard("dependents").await, 0, "no edge is left");
    let stats = store.stats("chain").await.expect("stats");
    assert_eq!((stats.waiting, stats.cancelled), (0, 300));
    assert_eq!(
        env.llen("finished").await,
        300,
        "each cancelled job is in the finished log, for purge"
    );
}

/// A dependency whose record a claim script finds unreadable is buried there (dead),
/// and the jobs waiting for it are settled right after, by `settle.lua`: one that
/// cancels is cancelled naming it, one that runs regardless is released.
#[tokio::test]
async fn a_dependency_buried_by_a_claim_settles_its_dependents() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let bad = store.enqueue(NewJob::new("buried")).await.expect("bad").id;
    let cancels = store
        .enqueue(NewJob::new("after").after(bad))
        .await
        .expect("cancels")
        .id;
    let runs = store
        .enqueue(
            NewJob::new("after")
                .after(bad)
                .on_dependency_failure(durq_core::graph::DependencyFailure::Run),
        )
        .await
        .expect("runs")
        .id;
    // An attempt counter that is no number: claim.lua buries the job it cannot lease.
    let _: () = env
        .admin
        .hset(
            durq_redis::job_key(&env.settings.namespace, bad),
            "att",
            "x",
        )
        .await
        .expect("HSET");
    let claimed = store
        .claim(ClaimRequest::new(["buried"], "w", Duration::from_secs(30)))
        .await
        .expect("claim");
    assert!(claimed.is_empty(), "the unreadable job is not handed out");
    // `get` still reports the record corrupt; the state it was buried in is there.
    let state: String = env
        .admin
        .hget(durq_redis::job_key(&env.settings.namespace, bad), "state")
        .await
        .expect("HGET");
    assert_eq!(state, "dead");
    let cancelled = store.get(cancels).await.expect("get");
    assert_eq!(
        (cancelled.state, cancelled.last_error),
        (
            JobState::Cancelled,
            Some(failed_dependency(bad, JobState::Dead))
        )
    );
    assert_eq!(store.get(runs).await.expect("get").state, JobState::Queued);
    assert_eq!(env.zcard("dependents").await, 0);
}
