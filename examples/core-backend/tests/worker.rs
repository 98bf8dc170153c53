//! The worker runtime runs jobs on a backend with the core alone: it leaves undone
//! what the backend does not declare (the worker registry, purge, queue gauges) and
//! refuses what it cannot do (stored schedules) when it is built.

use std::time::Duration;

use durq::{Capability, Error, JobContext, JobError, JobState, NewJob, Schedule, Store, Worker};
use durq_example_core_backend::CoreBackend;
use durq_memory::MemoryBackend;
use tokio::sync::mpsc;

fn core_store() -> Store {
    let storage = MemoryBackend::new(durq::StoreSettings::default()).expect("open memory");
    Store::new(CoreBackend::new(storage))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_every_job_on_a_core_only_backend() {
    let store = core_store();
    assert!(Capability::ALL.iter().all(|&c| !store.supports(c)));
    let mut ids = Vec::new();
    for n in 0..20u32 {
        let job = NewJob::new("core").payload(n.to_be_bytes().to_vec());
        ids.push(store.enqueue(job).await.expect("enqueue").id);
    }
    // Every stored outcome, heard from the worker: no polling, no sleeping.
    let (heard, mut outcomes) = mpsc::unbounded_channel();
    let worker = Worker::builder(store.clone())
        .handler("core", |_ctx: JobContext, payload| async move {
            match payload.len() {
                4 => Ok::<_, JobError>(()),
                _ => Err(JobError::permanent("not a u32")),
            }
        })
        .on_event(move |event| {
            let _ = heard.send(event.id());
        })
        // Asked for explicitly: still left undone, the backend cannot purge.
        .purge_interval(Duration::from_millis(10))
        .build()
        .expect("a core-only backend builds a worker")
        .spawn();
    for _ in &ids {
        outcomes
            .recv()
            .await
            .expect("the worker stopped before every outcome");
    }
    worker.shutdown().await;
    for id in &ids {
        assert_eq!(
            store.get(*id).await.expect("get").state,
            JobState::Succeeded
        );
    }
}

#[tokio::test]
async fn a_worker_with_schedules_is_refused_on_a_backend_without_them() {
    let schedule = Schedule::every("tick", Duration::from_secs(60), NewJob::new("core"));
    let built = Worker::builder(core_store())
        .handler("core", |_ctx: JobContext, _payload| async {
            Ok::<_, JobError>(())
        })
        .schedule(schedule)
        .build();
    match built {
        Err(Error::Unsupported { capability }) => assert_eq!(capability, Capability::Schedules),
        Err(other) => panic!("expected Unsupported, got {other}"),
        Ok(_) => panic!("a worker storing schedules was built on a backend without them"),
    }
}

/// CONTRACT K3: a backend without flow control would drop a job's concurrency key, so
/// the handle refuses such a job, naming the field, and writes nothing; its limits
/// calls answer `Unsupported`.
#[tokio::test]
async fn a_concurrency_key_is_refused_by_a_backend_without_flow_control() {
    let store = core_store();
    for refused in [
        store
            .enqueue(NewJob::new("core").concurrency_key("customer-1"))
            .await
            .map(drop),
        store
            .enqueue_batch(vec![
                NewJob::new("core"),
                NewJob::new("core").concurrency_key("customer-1"),
            ])
            .await
            .map(drop),
    ] {
        match refused {
            Err(err) => assert_eq!(err.invalid_field(), Some("concurrency_key"), "{err}"),
            Ok(()) => panic!("a job with a concurrency key was accepted"),
        }
    }
    let claimed = store
        .claim(
            durq::worker_calls::ClaimRequest::new(["core"], "w", Duration::from_secs(5)).limit(10),
        )
        .await
        .expect("claim");
    assert!(claimed.is_empty(), "nothing was written");
    assert!(matches!(
        store
            .set_limits("core", durq::QueueLimits::new().max_running(1))
            .await,
        Err(Error::Unsupported {
            capability: Capability::FlowControl
        })
    ));
    assert!(matches!(
        store.limits("core").await,
        Err(Error::Unsupported { .. })
    ));
}
