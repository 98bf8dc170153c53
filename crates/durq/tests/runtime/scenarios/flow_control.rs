//! Flow control under the runtime (CONTRACT K1, K2): workers of one fleet keep a
//! queue's limits, checked on a recorded history of the handlers' runs.

use super::*;

/// One event of the recorded history: a handler of job `id` (of concurrency key `key`)
/// started or ended, at instant `at` of a counter both workers share.
#[derive(Debug, Clone)]
struct Held {
    at: usize,
    id: JobId,
    key: String,
    start: bool,
}

/// Two workers of eight slots each run 24 jobs of four concurrency keys, under one
/// running job per key and three in all. Each handler records when it starts and ends
/// (on one counter across both workers), yielding meanwhile so others run; replayed in
/// order, the history never shows two jobs of one key, or more than three jobs, at
/// once, and every job ran once. Skipped, saying so, on a backend without flow control.
pub async fn workers_keep_a_queues_limits(env: Env) {
    const KEYS: usize = 4;
    const PER_KEY: usize = 6;
    let store = env.store().await;
    if !store.supports(durq::Capability::FlowControl) {
        eprintln!("skipped: the backend does not declare FlowControl");
        return;
    }
    store
        .set_limits(
            "keyed",
            durq::QueueLimits::new()
                .max_running_per_key(1)
                .max_running(3),
        )
        .await
        .expect("set_limits");
    let mut ids = Vec::new();
    for n in 0..KEYS * PER_KEY {
        let job = NewJob::new("keyed").concurrency_key(format!("k{}", n % KEYS));
        ids.push(enqueue(&store, job).await);
    }
    let history: Arc<Mutex<Vec<Held>>> = Arc::default();
    let clock = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (history, clock) = (history.clone(), clock.clone());
        move |ctx: JobContext, _payload: Bytes| {
            let (history, clock) = (history.clone(), clock.clone());
            async move {
                let key = ctx.job().concurrency_key.clone().unwrap_or_default();
                let record = |start: bool| {
                    let at = clock.fetch_add(1, Ordering::SeqCst);
                    history
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .push(Held {
                            at,
                            id: ctx.id(),
                            key: key.clone(),
                            start,
                        });
                };
                record(true);
                for _ in 0..5 {
                    tokio::task::yield_now().await;
                }
                record(false);
                Ok(())
            }
        }
    };
    let workers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let store = store.clone();
            let handler = handler.clone();
            async move {
                build(
                    test_worker(store, name)
                        .concurrency(8)
                        .handler("keyed", handler),
                )
                .spawn()
            }
        })
        .collect();
    let mut handles = Vec::new();
    for worker in workers {
        handles.push(worker.await);
    }
    wait_all_succeeded(&store, &ids).await;
    for handle in handles {
        handle.shutdown().await;
    }
    let mut events = history
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    events.sort_by_key(|held| held.at);
    let mut running: HashMap<String, usize> = HashMap::new();
    let mut in_all = 0usize;
    let mut ran = Vec::new();
    for Held { at, id, key, start } in &events {
        let of_key = running.entry(key.clone()).or_default();
        if *start {
            *of_key += 1;
            in_all += 1;
            ran.push(*id);
            assert!(
                *of_key <= 1,
                "K1: two jobs of key {key} ran at once (event {at})"
            );
            assert!(in_all <= 3, "K2: {in_all} jobs ran at once (event {at})");
        } else {
            *of_key -= 1;
            in_all -= 1;
        }
    }
    ran.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(ran, expected, "every job ran once");
}
