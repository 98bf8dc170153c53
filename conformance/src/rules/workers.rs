//! Rules W1–W4: live workers.

use std::time::Duration;

use durq_core::{Clock, Error, JobState, NewJob, WorkerInfo};

use super::support::{claim, enqueue, get, Must};
use crate::{unique_namespace, Harness, TestEnv};

fn info(id: &str, queues: &[&str], concurrency: u32, in_flight: u32) -> WorkerInfo {
    let mut info = WorkerInfo::new(
        id,
        "host-7.example",
        4242,
        queues.iter().map(|q| (*q).to_owned()).collect(),
        concurrency,
    );
    info.in_flight = in_flight;
    info
}

fn expect_worker_not_found<T: std::fmt::Debug>(result: durq_core::Result<T>, what: &str) {
    match result {
        Err(Error::WorkerNotFound { .. }) => {}
        other => panic!("{what}: expected WorkerNotFound, got {other:?}"),
    }
}

/// W1: every field reads back as registered, through `worker` and `workers`; a second
/// registration of an id replaces its record whole; an unknown id is not found; bad
/// input is refused; another namespace sees none of it.
pub async fn w1_registered_workers_read_back_every_field(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert!(store.workers().await.must("W1").is_empty(), "W1: none yet");
    expect_worker_not_found(store.worker("w-1").await, "W1: an unknown worker");

    let started = env.clock.now();
    store
        .register_worker(&info("w-2", &["b"], 8, 0))
        .await
        .must("W1: register");
    store
        .register_worker(&info("w-1", &["a", "b.x"], 32, 5))
        .await
        .must("W1: register");
    let one = store.worker("w-1").await.must("W1: worker");
    assert_eq!(
        one,
        WorkerInfo {
            in_flight: 5,
            started_at: started,
            last_seen: started,
            ..info("w-1", &["a", "b.x"], 32, 5)
        },
        "W1: every field"
    );
    let all = store.workers().await.must("W1: workers");
    assert_eq!(
        all.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        ["w-1", "w-2"],
        "W1: sorted by id"
    );
    assert_eq!(all[0], one);

    env.clock.advance(Duration::from_secs(7));
    store
        .register_worker(&info("w-1", &["c"], 4, 0))
        .await
        .must("W1: register again");
    let again = store.worker("w-1").await.must("W1: worker");
    assert_eq!(
        (again.queues.clone(), again.concurrency, again.in_flight),
        (vec!["c".to_owned()], 4, 0),
        "W1: a second registration replaces the record"
    );
    assert_eq!(again.started_at, env.clock.now());
    assert_eq!(store.workers().await.must("W1").len(), 2);

    for bad in [info("", &["a"], 1, 0), info("w", &["no spaces"], 1, 0)] {
        assert!(
            matches!(
                store.register_worker(&bad).await,
                Err(Error::InvalidInput { .. })
            ),
            "W1: {bad:?} is refused"
        );
    }
    assert_eq!(
        store.workers().await.must("W1").len(),
        2,
        "W1: nothing written"
    );

    let elsewhere = env
        .store_with(|settings| settings.namespace(unique_namespace("w")))
        .await;
    assert!(
        elsewhere.workers().await.must("W1").is_empty(),
        "W1: workers are per namespace"
    );
    expect_worker_not_found(elsewhere.worker("w-1").await, "W1: per namespace");
}

/// W2: a heartbeat moves `last_seen` to now and sets `in_flight`, nothing else; one for
/// an unknown worker is not found and registers nothing.
pub async fn w2_heartbeats_advance_last_seen(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let started = env.clock.now();
    store
        .register_worker(&info("w", &["a"], 16, 0))
        .await
        .must("W2: register");
    env.clock.advance(Duration::from_secs(3));
    store.worker_heartbeat("w", 9).await.must("W2: heartbeat");
    let seen = store.worker("w").await.must("W2");
    assert_eq!(
        seen,
        WorkerInfo {
            in_flight: 9,
            started_at: started,
            last_seen: env.clock.now(),
            ..info("w", &["a"], 16, 0)
        }
    );
    expect_worker_not_found(
        store.worker_heartbeat("ghost", 1).await,
        "W2: an unknown worker",
    );
    expect_worker_not_found(store.worker("ghost").await, "W2: not registered by it");
}

/// W3: deregistering removes the record and says whether there was one.
pub async fn w3_deregistered_workers_are_gone(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    store
        .register_worker(&info("w", &["a"], 1, 0))
        .await
        .must("W3: register");
    store
        .register_worker(&info("v", &["a"], 1, 0))
        .await
        .must("W3: register");
    assert!(store.deregister_worker("w").await.must("W3"));
    assert!(!store.deregister_worker("w").await.must("W3"), "W3: once");
    expect_worker_not_found(store.worker("w").await, "W3: gone");
    let left: Vec<String> = store
        .workers()
        .await
        .must("W3")
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, ["v"]);
}

/// W4: reaping removes exactly the workers silent for longer than the threshold (one
/// seen exactly at the cut-off stays), a heartbeat keeps a worker, and a reaped
/// worker's running job is left to reclaim.
pub async fn w4_silent_workers_are_reaped_and_their_jobs_left(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let job = enqueue(&store, NewJob::new("a"), "W4").await;
    claim(&store, &["a"], 1, "W4").await;
    for id in ["old", "edge", "alive"] {
        store
            .register_worker(&info(id, &["a"], 1, 0))
            .await
            .must("W4: register");
        if id == "old" {
            env.clock.advance(Duration::from_secs(1));
        }
    }
    env.clock.advance(Duration::from_secs(5));
    store.worker_heartbeat("alive", 1).await.must("W4");
    // now - 5 s is exactly when "edge" was last seen; "old" a second before that.
    let reaped = store
        .reap_workers(Duration::from_secs(5))
        .await
        .must("W4: reap");
    assert_eq!(reaped, ["old"], "W4: strictly older than the threshold");
    let left: Vec<String> = store
        .workers()
        .await
        .must("W4")
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, ["alive", "edge"]);
    assert!(store
        .reap_workers(Duration::from_secs(5))
        .await
        .must("W4")
        .is_empty());
    assert_eq!(
        get(&store, job, "W4").await.state,
        JobState::Running,
        "W4: reaping leaves jobs alone"
    );
}
