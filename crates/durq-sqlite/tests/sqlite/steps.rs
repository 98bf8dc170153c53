//! Durable steps in the file (CONTRACT D1–D4): a reopen is one write transaction
//! whichever connection it comes through, and a job's steps go wherever its record
//! goes (purge, `vanish`, `drop_namespace`).

use super::*;

use durq_core::{Bytes, StepLog};

fn must<T, E: std::fmt::Display>(result: std::result::Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{what}: {err}"),
    }
}

/// How many rows of `jobq_steps` job `id` has, read from the file itself.
fn steps_stored(path: &Path, id: JobId) -> i64 {
    must(
        raw(path).query_row(
            "SELECT COUNT(*) FROM jobq_steps WHERE job_id = ?1",
            [id.to_bytes()],
            |row| row.get(0),
        ),
        "count a job's steps",
    )
}

fn names(log: &StepLog) -> Vec<&str> {
    log.steps.iter().map(|step| step.name.as_str()).collect()
}

/// A job of `queue` enqueued and claimed by `store`: its id and lease token.
async fn running(store: &Store, queue: &str) -> (JobId, LeaseToken) {
    let id = must(store.enqueue(NewJob::new(queue)).await, "enqueue").id;
    let claimed = must(
        store
            .claim_one(&[queue], "w", Duration::from_secs(30))
            .await,
        "claim",
    );
    match claimed {
        Some(job) if job.id() == id => (id, job.token()),
        other => panic!("claimed {other:?}, not job {id}"),
    }
}

async fn save(store: &Store, id: JobId, token: LeaseToken, name: &str) {
    must(
        store
            .save_step(id, token, name, Bytes::copy_from_slice(name.as_bytes()))
            .await,
        "save a step",
    );
}

/// CONTRACT D4 across writer connections: each of 16 backends is opened with a
/// configuration of its own, so each has its own engine and writer connection on the
/// file (the engine is shared only by equal configurations), and the reopens race on
/// SQLite's write lock, not on one writer thread's queue. Exactly one wins per round;
/// the others see its generation or the job it queued; the job is queued once (one
/// sequence value drawn) and its steps cut once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopens_through_separate_writer_connections_have_one_winner() {
    const REOPENS: usize = 16;
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let config = || {
        SqliteConfig::default()
            .synchronous(Synchronous::Normal)
            // Sixteen writers queue on one lock; the test checks who wins, not how fast.
            .busy_timeout(Duration::from_secs(60))
    };
    let store = open(&path, settings(&clock), config()).await;
    let mut handles = Vec::with_capacity(REOPENS);
    for n in 1..=REOPENS {
        // Distinct from `store`'s (two readers, groups of 1024) and from each other.
        let config = config().readers(1).max_group(n);
        handles.push(open(&path, settings(&clock), config).await);
    }

    let (id, _) = running(&store, "reopen").await;
    for round in 0..2u64 {
        let token = match store.get(id).await {
            Ok(job) => match job.lease {
                Some(lease) => lease.token,
                None => panic!("round {round}: job {id} is not running"),
            },
            Err(err) => panic!("get failed: {err}"),
        };
        for name in ["a", "b", "c"] {
            save(&store, id, token, name).await;
        }
        must(store.complete(id, token, None).await, "complete");
        let seq_before = meta(&path, "seq");

        let start = Arc::new(tokio::sync::Barrier::new(REOPENS));
        let reopens: Vec<_> = handles
            .iter()
            .map(|handle| {
                let (handle, start) = (handle.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    handle.retry_from(id, "b", round).await
                })
            })
            .collect();
        let mut won = 0;
        for reopen in reopens {
            match reopen.await {
                Ok(Ok(())) => won += 1,
                Ok(Err(Error::StaleGeneration {
                    expected, current, ..
                })) => assert_eq!((expected, current), (round, round + 1)),
                Ok(Err(Error::InvalidState { state, .. })) => {
                    assert_eq!(state, JobState::Queued)
                }
                Ok(Err(err)) => panic!("round {round}: a reopen failed otherwise: {err}"),
                Err(err) => panic!("a reopen panicked: {err}"),
            }
        }
        assert_eq!(won, 1, "round {round}: exactly one reopen wins");

        let log = must(store.steps(id).await, "steps");
        assert_eq!((log.generation, names(&log)), (round + 1, vec!["a"]));
        assert_eq!(steps_stored(&path, id), 1, "round {round}: steps cut once");
        let generation = count(&path, "SELECT generation FROM jobq_jobs");
        assert_eq!(generation, i64::try_from(round + 1).unwrap_or(i64::MAX));
        let seq_after = meta(&path, "seq");
        assert_eq!(
            (seq_before.len(), seq_after.len()),
            (1, 1),
            "one sequence row"
        );
        assert_eq!(
            seq_after[0],
            seq_before[0] + 1,
            "round {round}: the job was queued once"
        );
        // The reopened job runs again: claimed once, then nothing is left.
        let claimed = must(
            store
                .claim_one(&["reopen"], "w", Duration::from_secs(30))
                .await,
            "claim the reopened job",
        );
        assert_eq!(claimed.map(|job| job.id()), Some(id));
        assert!(must(
            store
                .claim_one(&["reopen"], "w", Duration::from_secs(30))
                .await,
            "claim again",
        )
        .is_none());
    }
}

/// Rule A5 with D1: a purge deletes the steps of exactly the jobs it deletes, a batch
/// at a time (here two, then one), and leaves those of jobs still running; `vanish`
/// takes a job's steps with its record.
#[tokio::test]
async fn purge_and_vanish_delete_the_steps_of_the_jobs_they_delete() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let backend = open_backend(&path, settings(&clock), SqliteConfig::default()).await;
    let store = Store::new(backend.clone());

    let mut jobs = Vec::new();
    for _ in 0..4 {
        let (id, token) = running(&store, "purge").await;
        save(&store, id, token, "first").await;
        save(&store, id, token, "second").await;
        jobs.push((id, token));
    }
    // Jobs 0, 1 and 2 end in that order; job 3 keeps running.
    for (id, token) in &jobs[..3] {
        must(store.complete(*id, *token, None).await, "complete");
        clock.advance(Duration::from_millis(1));
    }
    let stored = |jobs: &[(JobId, LeaseToken)]| {
        jobs.iter()
            .map(|(id, _)| steps_stored(&path, *id))
            .collect::<Vec<_>>()
    };
    assert_eq!(stored(&jobs), [2, 2, 2, 2]);

    let cutoff = clock.now();
    assert!(matches!(
        durq_core::Admin::purge(&backend, 2, cutoff).await,
        Ok(2)
    ));
    assert_eq!(stored(&jobs), [0, 0, 2, 2], "the first batch's steps only");
    assert!(matches!(
        durq_core::Admin::purge(&backend, 10, cutoff).await,
        Ok(1)
    ));
    assert_eq!(stored(&jobs), [0, 0, 0, 2], "a running job keeps its steps");
    for (id, _) in &jobs[..3] {
        assert!(matches!(
            store.steps(*id).await,
            Err(Error::NotFound { .. })
        ));
    }

    must(backend.vanish(jobs[3].0).await, "vanish");
    assert_eq!(count(&path, "SELECT COUNT(*) FROM jobq_steps"), 0);
}
