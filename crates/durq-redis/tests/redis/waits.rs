//! Waits for a job's ending on Redis (CONTRACT O1, O2) beyond the conformance suite:
//! the `awt` mark, and a job a claim script buries, whose ending `settle.lua`
//! announces (the claim scripts announce nothing; a wait would otherwise hear of it
//! only at its 15 s poll).

use super::*;

/// A wait marks its job (`awt`) and is woken when a claim buries the job as corrupt:
/// the follow-up `settle.lua` announces it, and the wait reads the record, which
/// answers `Corrupt` as `get` does. Well within the 15 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_claim_buries_wakes_its_waits() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = env.store().await;
    let id = store
        .enqueue(NewJob::new("bury-me"))
        .await
        .expect("enqueue")
        .id;
    let key = durq_redis::job_key(&env.settings.namespace, id);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.wait(id, Duration::from_secs(3600)).await })
    };
    // The wait's first read marks the job; only then is the record spoiled.
    let mut marked = false;
    for _ in 0..10_000 {
        let awt: Option<String> = env.admin.hget(&key, "awt").await.expect("HGET");
        if awt.as_deref() == Some("1") {
            marked = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(marked, "the wait marks the job it waits for");
    let _: () = env.admin.hset(&key, "att", "x").await.expect("HSET");
    let claimed = store
        .claim(ClaimRequest::new(["bury-me"], "w", Duration::from_secs(30)))
        .await
        .expect("claim");
    assert!(
        claimed.is_empty(),
        "the unreadable job is buried, not handed out"
    );
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait is woken by settle.lua's announcement, not its poll")
        .expect("join");
    assert!(
        matches!(answer, Err(durq_core::Error::Corrupt { .. })),
        "an unreadable record is answered Corrupt: {answer:?}"
    );
    let state: String = env.admin.hget(&key, "state").await.expect("HGET");
    assert_eq!(state, "dead");
}
