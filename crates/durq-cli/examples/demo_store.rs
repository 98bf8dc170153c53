//! Fills a store with something to look at through the `durq` command line: queued,
//! scheduled, running, succeeded and dead jobs, a live worker and two schedules. It is
//! how the examples of `docs/operations.md` were made.
//!
//! ```sh
//! cargo run -p durq-cli --example demo_store -- sqlite://demo.db
//! cargo run -p durq-cli --bin jobs -- --url sqlite://demo.db queues
//! ```
//!
//! The worker it registers stands for a real one: this program claims a job under the
//! worker's id and exits, leaving the job running until its lease (an hour) expires.

use std::time::Duration;

use durq::worker_calls::{ClaimRequest, Retry};
use durq::{JobId, NewJob, Schedule, Store, WorkerInfo};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: demo_store URL (sqlite://demo.db, redis://…, postgres://…)")?;
    let store = durq::connect(&url).await?;

    for to in ["ada@example.com", "grace@example.com"] {
        store
            .enqueue_json("emails", &serde_json::json!({ "to": to }))
            .await?;
    }
    let welcome = NewJob::new("emails")
        .json(&serde_json::json!({ "to": "bob@example.com", "template": "welcome" }))?
        .idempotency_key("welcome-bob")
        .priority(5);
    store.enqueue(welcome).await?;
    for (to, error) in [
        ("nobody@example.com", "smtp: 550 5.1.1 no such user"),
        ("typo@exmaple.com", "dns: no MX record for exmaple.com"),
    ] {
        let id = enqueue(&store, "emails", serde_json::json!({ "to": to })).await?;
        fail_for_good(&store, id, "emails", error).await?;
    }

    let running = enqueue(
        &store,
        "emails",
        serde_json::json!({ "to": "eve@example.com" }),
    )
    .await?;
    claim(&store, running, "emails", "mailer-1").await?;
    let mut worker = WorkerInfo::new("mailer-1", "box-7", 4242, vec!["emails".into()], 16);
    worker.in_flight = 1;
    store.register_worker(&worker).await?;

    let report = enqueue(&store, "reports", serde_json::json!({ "day": "yesterday" })).await?;
    let claimed = claim(&store, report, "reports", "reporter-1").await?;
    store.complete(report, claimed, None).await?;
    let later = NewJob::new("reports")
        .json(&serde_json::json!({ "day": "today" }))?
        .delay(Duration::from_secs(3600));
    store.enqueue(later).await?;

    let nightly = Schedule::cron("nightly-report", "0 0 2 * * *", NewJob::new("reports"))
        .time_zone("Europe/Paris");
    store.put_schedule(&nightly).await?;
    let ping = Schedule::every("ping", Duration::from_secs(300), NewJob::new("pings"));
    store.put_schedule(&ping).await?;
    println!("filled {url}");
    Ok(())
}

/// Enqueues `payload` on `queue`; the job's id.
async fn enqueue(
    store: &Store,
    queue: &str,
    payload: serde_json::Value,
) -> Result<JobId, Box<dyn std::error::Error>> {
    Ok(store.enqueue_json(queue, &payload).await?.id)
}

/// Claims job `id` as `worker` for an hour; its lease token.
async fn claim(
    store: &Store,
    id: JobId,
    queue: &str,
    worker: &str,
) -> Result<durq::LeaseToken, Box<dyn std::error::Error>> {
    let request = ClaimRequest::new([queue], worker, Duration::from_secs(3600)).reserved(id);
    let claimed = store.claim(request).await?;
    let job = claimed.first().ok_or("the job was not claimed")?;
    Ok(job.token())
}

async fn fail_for_good(
    store: &Store,
    id: JobId,
    queue: &str,
    error: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let token = claim(store, id, queue, "mailer-0").await?;
    store.fail(id, token, error, Retry::Never).await?;
    Ok(())
}
