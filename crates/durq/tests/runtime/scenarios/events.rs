use durq::stream::{EventCursor, EventKind};

use super::*;

/// The event stream from a worker (CONTRACT V1, V3): a handler's `ctx.emit` lands
/// between its job's `started` and `succeeded`, with the data it gave, and a worker
/// whose store records events trims the stream to its `keep` after a purge round.
pub async fn handlers_emit_into_the_stream_and_the_worker_trims_it(env: Env) {
    let recording = env
        .server
        .open(env.settings.clone().record_events(100))
        .await;
    let worker = test_worker(recording.clone(), "w")
        .disable_purge()
        .json_handler("import", |ctx: JobContext, rows: u64| async move {
            for done in [rows / 2, rows] {
                ctx.emit("progress", &serde_json::json!({ "done": done }))
                    .await?;
            }
            Ok(Json(rows))
        });
    let handle = build(worker).spawn();
    let id = enqueue(
        &recording,
        NewJob::new("import").json(&10u64).expect("encode"),
    )
    .await;
    wait_for(&recording, id, "success", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    handle.shutdown().await;

    let page = recording
        .events(EventCursor::START, 100)
        .await
        .expect("read the stream");
    let of_job: Vec<_> = page.events.iter().filter(|e| e.job == id).collect();
    let kinds: Vec<EventKind> = of_job.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::Enqueued,
            EventKind::Started,
            EventKind::Emitted,
            EventKind::Emitted,
            EventKind::Succeeded
        ],
        "the handler's events come between its start and its success"
    );
    let data: Vec<serde_json::Value> = of_job
        .iter()
        .filter_map(|e| e.data.as_deref())
        .map(|d| serde_json::from_slice(d).expect("the data is JSON"))
        .collect();
    assert_eq!(
        data,
        [
            serde_json::json!({ "done": 5 }),
            serde_json::json!({ "done": 10 })
        ]
    );

    // A worker whose store keeps two trims the stream after its purge round.
    let keeping_two = env.server.open(env.settings.clone().record_events(2)).await;
    let trimmer = test_worker(keeping_two.clone(), "trimmer").json_handler(
        "unused",
        |_: JobContext, (): ()| async move { Ok(Json(())) },
    );
    let handle = build(trimmer).spawn();
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    let trimmed = tokio::time::timeout(PATIENCE, async {
        loop {
            ticker.tick().await;
            let read = keeping_two.events(EventCursor::START, 100).await;
            if let Ok(read) = read.as_ref() {
                if read.trimmed {
                    return read.events.clone();
                }
            }
        }
    })
    .await
    .expect("the worker trims the stream within its purge interval");
    handle.shutdown().await;
    assert_eq!(
        trimmed,
        page.events[page.events.len() - 2..],
        "the newest two events are kept"
    );
}
