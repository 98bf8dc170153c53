//! `WorkerBuilder::build` refuses bad settings naming the field, and `run_until` stops
//! the worker when its signal resolves.

use std::time::Duration;

use durq::{Backoff, JobState, NewJob, Store, StoreSettings, Worker, WorkerBuilder};

fn store() -> Store {
    Store::new(durq_memory::MemoryBackend::new(StoreSettings::default()).expect("store"))
}

fn with_handler(builder: WorkerBuilder) -> WorkerBuilder {
    builder.handler("q", |_ctx, _payload| async { Ok(()) })
}

fn refused_field(builder: WorkerBuilder) -> Option<&'static str> {
    match builder.build() {
        Ok(worker) => panic!("built {worker:?}"),
        Err(err) => err.invalid_field(),
    }
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let s = store();
    assert_eq!(refused_field(Worker::builder(s.clone())), Some("queues"));
    assert_eq!(
        refused_field(with_handler(with_handler(Worker::builder(s.clone())))),
        Some("queues"),
        "two handlers for one queue"
    );
    assert_eq!(
        refused_field(Worker::builder(s.clone()).handler("bad queue", |_ctx, _p| async { Ok(()) })),
        Some("queue")
    );
    let b = || with_handler(Worker::builder(s.clone()));
    assert_eq!(refused_field(b().concurrency(0)), Some("concurrency"));
    assert_eq!(
        refused_field(b().capacity(durq::Budget::new().amount("no spaces", 1))),
        Some("capacity")
    );
    assert_eq!(
        refused_field(b().capacity(durq::Budget::new().amount("gpu", u64::MAX))),
        Some("capacity")
    );
    assert_eq!(refused_field(b().prefer([""])), Some("prefer"));
    assert!(b()
        .capacity(durq::Budget::new().amount("gpu", 2).capability("fpga"))
        .prefer(["host-1"])
        .build()
        .is_ok());
    assert_eq!(refused_field(b().claim_batch(0)), Some("claim_batch"));
    assert_eq!(refused_field(b().claim_batch(10_001)), Some("claim_batch"));
    assert_eq!(refused_field(b().worker_id("")), Some("worker"));
    assert_eq!(refused_field(b().lease(Duration::ZERO)), Some("lease_ttl"));
    assert_eq!(
        refused_field(
            b().lease(Duration::from_secs(10))
                .heartbeat_interval(Duration::from_secs(10))
        ),
        Some("heartbeat_interval")
    );
    assert_eq!(
        refused_field(b().poll_interval(Duration::ZERO)),
        Some("poll_interval")
    );
    assert_eq!(
        refused_field(b().reclaim_interval(Duration::ZERO)),
        Some("reclaim_interval")
    );
    assert_eq!(
        refused_field(b().backoff(Backoff {
            initial: Duration::from_secs(2),
            max: Duration::from_secs(1),
            jitter: 0.0
        })),
        Some("backoff")
    );
    assert_eq!(
        refused_field(b().backoff(Backoff {
            jitter: 1.5,
            ..Backoff::default()
        })),
        Some("backoff")
    );
    let worker = b().worker_id("w-1").build().expect("valid settings build");
    assert_eq!(worker.worker_id(), "w-1");
    let default_id = b().build().expect("build");
    assert!(default_id.worker_id().starts_with("worker-"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_until_stops_when_the_signal_resolves_and_children_run() {
    let s = store();
    // The handler fans out: the parent job enqueues one child through its context.
    let worker = Worker::builder(s.clone())
        .handler(
            "q",
            |ctx: durq::JobContext, payload: durq::Bytes| async move {
                if payload == "parent" {
                    ctx.enqueue_child(NewJob::new("q").payload("child")).await?;
                }
                Ok(())
            },
        )
        .poll_interval(Duration::from_millis(10))
        .build()
        .expect("build");
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = signal.await;
    }));
    let id = s
        .enqueue(NewJob::new("q").payload("parent"))
        .await
        .expect("enqueue")
        .id;
    let mut ticker = tokio::time::interval(Duration::from_millis(5));
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            ticker.tick().await;
            let children = s.children(id).await.expect("children");
            if s.get(id).await.expect("get").state == JobState::Succeeded
                && children.len() == 1
                && children[0].state == JobState::Succeeded
            {
                return;
            }
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "the worker ran the job and the child it enqueued"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("run_until returns after its signal")
        .expect("the worker task did not panic");
}
