//! Jobs that wait for jobs (CONTRACT G1–G3): an order is charged, then an e-mail and
//! an invoice go out, then a report reads what both returned; the caller waits for each
//! report's outcome with `store.wait` (CONTRACT O1, O2). The charge takes durable
//! steps (CONTRACT D1–D3), so a charge job that runs again after a crash or a retry
//! never authorizes or captures twice. The store records its jobs' events (CONTRACT
//! V1–V4): at the end the example reads the paid order's graph back from the event
//! stream, the charge's own `charged` event between its start and its success.
//!
//! ```text
//! cargo run --example workflow
//! ```
//!
//! It needs nothing installed: the queue is an SQLite file in a fresh temporary
//! directory. Each order is one batch, a graph of four jobs whose later jobs name the
//! earlier ones by their place in the batch, so the whole graph is stored at once or
//! not at all. A second order's card is declined: its e-mail, invoice and report are
//! cancelled, each saying why, and never run. The example fails if a job ran before
//! the jobs it waits for had succeeded, or if the declined order ran anything after
//! its charge.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq::stream::{EventCursor, EventKind};
use durq::{Dependency, JobContext, JobError, JobState, Json, NewJob, StoreSettings, Worker};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u32,
    cents: u64,
    card_ok: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    // Every change of these jobs' states is recorded in the namespace's event stream.
    let store = durq::connect_with(&url, StoreSettings::default().record_events(10_000)).await?;

    // One graph per order: charge, then e-mail and invoice, then the report.
    let mut reports = Vec::new();
    let mut charges = Vec::new();
    let mut graphs = Vec::new();
    for order in [
        Order {
            id: 1001,
            cents: 4_200,
            card_ok: true,
        },
        Order {
            id: 1002,
            cents: 990,
            card_ok: false,
        },
    ] {
        let graph = store
            .enqueue_batch(vec![
                NewJob::new("charge").json(&order)?,
                NewJob::new("email")
                    .json(&order)?
                    .after(Dependency::Earlier(0)),
                NewJob::new("invoice")
                    .json(&order)?
                    .after(Dependency::Earlier(0)),
                NewJob::new("report")
                    .json(&order)?
                    .after(Dependency::Earlier(1))
                    .after(Dependency::Earlier(2)),
            ])
            .await?;
        charges.push(graph[0].id);
        graphs.push(graph.iter().map(|job| job.id).collect::<Vec<_>>());
        reports.push((order.id, graph[3].id));
    }

    // What ran, in order, for the checks at the end.
    let ran: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let note = |ran: &Arc<Mutex<Vec<(String, u32)>>>, step: &str, order: u32| {
        ran.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((step.to_owned(), order));
    };
    let worker = Worker::builder(store.clone())
        .concurrency(8)
        .poll_interval(Duration::from_millis(10))
        .json_handler("charge", {
            let ran = Arc::clone(&ran);
            move |ctx: JobContext, order: Order| {
                note(&ran, "charge", order.id);
                async move {
                    if !order.card_ok {
                        return Err(JobError::permanent(format!(
                            "card declined for order {}",
                            order.id
                        )));
                    }
                    // Each step's output is stored under the job's lease before the
                    // next begins: a run after a crash answers these from the store.
                    let authorization: String = ctx
                        .step("authorize", || async { Ok(format!("auth-{}", order.id)) })
                        .await?;
                    let captured: String = ctx
                        .step("capture", || async {
                            Ok(format!("captured {} cents ({authorization})", order.cents))
                        })
                        .await?;
                    // For whoever follows the stream: a dashboard, an audit log.
                    ctx.emit("charged", &order.cents).await?;
                    Ok(Json(captured))
                }
            }
        })
        .json_handler("email", {
            let ran = Arc::clone(&ran);
            move |_ctx: JobContext, order: Order| {
                note(&ran, "email", order.id);
                async move { Ok(Json(format!("mailed the receipt of order {}", order.id))) }
            }
        })
        .json_handler("invoice", {
            let ran = Arc::clone(&ran);
            move |_ctx: JobContext, order: Order| {
                note(&ran, "invoice", order.id);
                async move { Ok(Json(format!("invoice INV-{}", order.id))) }
            }
        })
        .json_handler("report", {
            let ran = Arc::clone(&ran);
            move |ctx: JobContext, order: Order| {
                note(&ran, "report", order.id);
                async move {
                    // The fan-in reads what the jobs it waited for returned.
                    let mut lines = Vec::new();
                    for dependency in ctx.dependencies().await? {
                        let said: String = dependency
                            .result
                            .as_deref()
                            .map(serde_json::from_slice)
                            .transpose()
                            .map_err(|err| JobError::permanent(err.to_string()))?
                            .unwrap_or_default();
                        lines.push(format!("{}: {said}", dependency.queue));
                    }
                    Ok(Json(format!("order {}: {}", order.id, lines.join("; "))))
                }
            }
        })
        .build()?;
    let running = worker.spawn();

    // The caller waits for each report's outcome, woken by its ending: the first
    // order's report succeeds with what it returned; the second order's is cancelled in
    // the same step that its declined charge ends dead.
    let mut declined_report = None;
    for (order, report) in reports {
        let Some(job) = store.wait(report, Duration::from_secs(30)).await? else {
            return Err(format!("order {order}'s report did not end within 30 s").into());
        };
        match job.state {
            JobState::Succeeded => {
                let said: String =
                    serde_json::from_slice(job.result.as_deref().unwrap_or(b"\"\""))?;
                println!("order {order}'s report: {said}");
            }
            state => println!(
                "order {order}'s report: {state}{}",
                job.last_error
                    .as_deref()
                    .map(|error| format!(" ({error})"))
                    .unwrap_or_default()
            ),
        }
        if order == 1002 {
            declined_report = Some(job.state);
        }
    }
    running.shutdown().await;

    // Every step ran after the steps it waits for, and the declined order stopped at
    // its charge, its report cancelled.
    let ran = ran.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let position = |step: &str| ran.iter().position(|r| *r == (step.to_owned(), 1001));
    let before =
        |a: &str, b: &str| matches!((position(a), position(b)), (Some(a), Some(b)) if a < b);
    let ordered = before("charge", "email")
        && before("charge", "invoice")
        && before("email", "report")
        && before("invoice", "report");
    let declined_stopped = ran
        .iter()
        .all(|(step, order)| *order != 1002 || step == "charge");
    // The paid order's charge kept its two steps, in the order it took them; the
    // declined one took none.
    let steps: Vec<String> = store
        .steps(charges[0])
        .await?
        .steps
        .into_iter()
        .map(|step| step.name)
        .collect();
    if steps != ["authorize", "capture"] || !store.steps(charges[1]).await?.steps.is_empty() {
        return Err(format!("the charge's steps were not kept: {steps:?}").into());
    }
    println!("order 1001's charge took its steps: {}", steps.join(", "));
    // The paid order's graph as the event stream tells it, in the order it happened.
    let stream = store.events(EventCursor::START, 1_000).await?;
    let mut told = Vec::new();
    println!("order 1001 as the event stream tells it:");
    for event in stream.events.iter().filter(|e| graphs[0].contains(&e.job)) {
        told.push(format!("{} {}", event.queue, event.kind));
        println!(
            "  {:>6}  {:<8} {}",
            event.cursor.to_string(),
            event.queue,
            event.kind
        );
    }
    let kinds_of = |queue: &str| {
        stream
            .events
            .iter()
            .filter(|e| graphs[0].contains(&e.job) && e.queue == queue)
            .map(|e| e.kind)
            .collect::<Vec<_>>()
    };
    use EventKind::{Emitted, Enqueued, Ready, Started, Succeeded};
    if kinds_of("charge") != [Enqueued, Started, Emitted, Succeeded]
        || kinds_of("report") != [Enqueued, Ready, Started, Succeeded]
    {
        return Err(format!("the stream does not tell the graph: {told:?}").into());
    }
    if !ordered || !declined_stopped || declined_report != Some(JobState::Cancelled) {
        return Err(format!("the graph ran out of order: {ran:?}").into());
    }
    println!(
        "every step ran after the ones it waits for; the declined order stopped at its charge"
    );
    Ok(())
}
