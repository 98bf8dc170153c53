use super::*;

/// A handler's durable steps (CONTRACT D1–D3) through `ctx.step`: a step that finished
/// in a failed run is answered from its saved output in the next run, not run again;
/// an operator's `retry_from` runs again the named step and those after it, and only
/// those.
pub async fn finished_steps_do_not_run_again(env: Env) {
    let store = env.store().await;
    // Runs of each step, by name.
    let runs: Arc<Mutex<HashMap<&'static str, u32>>> = Arc::default();
    let count = |runs: &Arc<Mutex<HashMap<&'static str, u32>>>, step: &'static str| {
        *runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(step)
            .or_default() += 1;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = test_worker(env.store().await, "w").json_handler("checkout", {
        let runs = runs.clone();
        move |ctx: JobContext, cents: u64| {
            let (runs, tx) = (runs.clone(), tx.clone());
            async move {
                let charge: String = ctx
                    .step("charge", || async {
                        count(&runs, "charge");
                        Ok(format!("ch-{cents}-{}", ctx.attempt()))
                    })
                    .await?;
                // The first run fails after its charge: the next must not charge again.
                if ctx.attempt() == 1 {
                    let _ = tx.send(ctx.attempt());
                    return Err(JobError::retry_after("mail server down", Duration::ZERO));
                }
                let receipt: String = ctx
                    .step("receipt", || async {
                        count(&runs, "receipt");
                        Ok(format!("receipt for {charge}"))
                    })
                    .await?;
                let _ = tx.send(ctx.attempt());
                Ok(Json(receipt))
            }
        }
    });
    let handle = build(worker).spawn();
    let id = enqueue(
        &store,
        NewJob::new("checkout").json(&4200u64).expect("encode"),
    )
    .await;

    assert_eq!(recv(&mut rx, "the first run").await, 1);
    assert_eq!(recv(&mut rx, "the second run").await, 2);
    let job = wait_for(&store, id, "success", |j| j.state == JobState::Succeeded).await;
    let expected = serde_json::to_vec("receipt for ch-4200-1").expect("encode");
    assert_eq!(
        job.result.as_deref(),
        Some(&expected[..]),
        "the second run read the first run's charge"
    );
    let ran = |runs: &Arc<Mutex<HashMap<&'static str, u32>>>| {
        runs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    };
    assert_eq!(
        ran(&runs),
        HashMap::from([("charge", 1), ("receipt", 1)]),
        "a finished step never runs again"
    );
    let log = store.steps(id).await.expect("steps");
    let names: Vec<_> = log.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((log.generation, names), (0, vec!["charge", "receipt"]));

    // The operator reopens the job from its receipt: only the receipt runs again.
    store.retry_from(id, "receipt", 0).await.expect("reopen");
    assert_eq!(recv(&mut rx, "the run after the reopen").await, 1);
    let job = wait_for(&store, id, "success again", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    assert_eq!(job.result.as_deref(), Some(&expected[..]));
    assert_eq!(
        ran(&runs),
        HashMap::from([("charge", 1), ("receipt", 2)]),
        "a reopen runs the named step and those after it, nothing before"
    );
    assert_eq!(store.steps(id).await.expect("steps").generation, 1);
    handle.shutdown().await;
}
