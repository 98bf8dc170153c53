//! Resource-aware workers: jobs say what they need, workers say what they have, and a
//! worker only claims what fits what it has free right now (CONTRACT F1–F6).
//!
//! ```text
//! cargo run --example resource_aware
//! ```
//!
//! Two workers share one queue in an SQLite file (nothing to install): a GPU box with
//! two GPUs and CUDA, and a CPU box with four cores and no GPU. Render jobs need a GPU;
//! thumbnail jobs need a core. The GPU box never runs more than two renders at once
//! though its slots would allow eight, and the CPU box never takes a render: it names
//! `gpu` with an amount of zero, which is a limit (a budget that did not name `gpu` at
//! all would leave it unconstrained). Renders carry the locality of the box that holds
//! their textures; the GPU box prefers its own, which reorders within a priority and
//! never filters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use durq::{Budget, Bytes, JobContext, JobState, Needs, NewJob, Worker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("jobs.db").display());
    let store = durq::connect(&url).await?;

    let mut jobs = Vec::new();
    for frame in 0..6 {
        let render = NewJob::new("media")
            .payload(format!("render frame {frame}"))
            .needs(Needs::new().amount("gpu", 1).capability("cuda"))
            .locality(if frame % 2 == 0 {
                "gpu-box"
            } else {
                "elsewhere"
            });
        jobs.push(render);
        let thumbnail = NewJob::new("media")
            .payload(format!("thumbnail {frame}"))
            .needs(Needs::new().amount("cpu_milli", 1_000).amount("gpu", 0));
        jobs.push(thumbnail);
    }
    let ids: Vec<_> = store
        .enqueue_batch(jobs)
        .await?
        .into_iter()
        .map(|e| e.id)
        .collect();

    // Who ran what, and the most GPUs in use at once.
    let ran: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let gpus_in_use = Arc::new(AtomicUsize::new(0));
    let most_gpus = Arc::new(AtomicUsize::new(0));
    let (finished, mut finishes) = tokio::sync::mpsc::unbounded_channel();
    let handler = {
        let (ran, gpus_in_use, most_gpus) = (ran.clone(), gpus_in_use.clone(), most_gpus.clone());
        move |ctx: JobContext, payload: Bytes| {
            let (ran, gpus_in_use, most_gpus, finished) = (
                ran.clone(),
                gpus_in_use.clone(),
                most_gpus.clone(),
                finished.clone(),
            );
            async move {
                let gpus = ctx.job().needs.amounts().get("gpu").copied().unwrap_or(0) as usize;
                let now = gpus_in_use.fetch_add(gpus, Ordering::SeqCst) + gpus;
                most_gpus.fetch_max(now, Ordering::SeqCst);
                // Stands in for the job's work (a render takes a while), so that jobs
                // overlap and the capacity shows.
                tokio::time::sleep(Duration::from_millis(50)).await;
                gpus_in_use.fetch_sub(gpus, Ordering::SeqCst);
                ran.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(ctx.worker_id().to_owned())
                    .or_default()
                    .push(String::from_utf8_lossy(&payload).into_owned());
                let _ = finished.send(ctx.id());
                Ok(())
            }
        }
    };

    let gpu_box = Worker::builder(durq::connect(&url).await?)
        .worker_id("gpu-box")
        .concurrency(8)
        .capacity(Budget::new().amount("gpu", 2).capability("cuda"))
        .prefer(["gpu-box"])
        .handler("media", handler.clone())
        .build()?
        .spawn();
    let cpu_box = Worker::builder(durq::connect(&url).await?)
        .worker_id("cpu-box")
        .concurrency(8)
        .capacity(Budget::new().amount("cpu_milli", 4_000).amount("gpu", 0))
        .handler("media", handler)
        .build()?
        .spawn();

    for _ in &ids {
        if finishes.recv().await.is_none() {
            return Err("the workers stopped before every job ran".into());
        }
    }
    // Shutting down waits for the last outcomes to be stored.
    gpu_box.shutdown().await;
    cpu_box.shutdown().await;
    for id in &ids {
        if store.get(*id).await?.state != JobState::Succeeded {
            return Err(format!("job {id} did not succeed").into());
        }
    }

    let ran = ran.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (worker, jobs) in &ran {
        println!("{worker} ran {} jobs: {}", jobs.len(), jobs.join(", "));
    }
    let most = most_gpus.load(Ordering::SeqCst);
    println!("at most {most} GPUs were in use at once");
    let renders_on_cpu = ran
        .get("cpu-box")
        .is_some_and(|jobs| jobs.iter().any(|job| job.starts_with("render")));
    if renders_on_cpu || most > 2 {
        return Err("a worker ran a job that did not fit it".into());
    }
    Ok(())
}
