//! Rules E2–E6 and E10: idempotency keys, their tenants, races, windows and uniqueness
//! while active.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    Bytes, Clock, Enqueued, JobId, JobState, NewJob, QueueStats, Retry, Store, Uniqueness,
};
use tokio::sync::Barrier;

use super::support::{
    assert_claim_order, assert_nothing_claimable, assert_stats, assert_stats_agree,
    assert_unchanged, claim, claim_expecting, enqueue, expect_invalid, expect_not_found, get,
    ids_of, join_all, Must,
};
use crate::{Harness, TestEnv};

/// E2: a second enqueue with the same (tenant, key) returns the first id with
/// `created = false` and changes nothing: not the payload, not the fields, and nothing
/// new becomes claimable, even when it names another queue.
pub async fn e2_duplicate_key_returns_first_id_and_changes_nothing(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let first = enqueue(
        &store,
        NewJob::new("dedup")
            .tenant("t")
            .idempotency_key("once")
            .payload("first"),
        "E2",
    )
    .await;
    let before = get(&store, first, "E2: get").await;
    env.clock.advance(Duration::from_secs(5));
    for duplicate in [
        NewJob::new("dedup")
            .tenant("t")
            .idempotency_key("once")
            .payload("second"),
        NewJob::new("other-queue")
            .tenant("t")
            .idempotency_key("once")
            .payload("third")
            .priority(9)
            .max_attempts(2),
    ] {
        let answer = store.enqueue(duplicate).await.must("E2: duplicate enqueue");
        assert_eq!(
            answer,
            Enqueued {
                id: first,
                created: false
            },
            "E2: a duplicate key must return the first id with created = false"
        );
    }
    assert_unchanged(&store, &before, "E2: a duplicate must not change the job").await;
    assert_eq!(
        store.payload(first).await.must("E2: payload"),
        Bytes::from_static(b"first"),
        "E2: a duplicate must not overwrite the payload"
    );
    assert_stats(
        &store,
        "other-queue",
        QueueStats::default(),
        "E2: a duplicate naming another queue must write nothing there",
    )
    .await;
    let claimed = claim(&store, &["dedup", "other-queue"], 10, "E2: claim").await;
    assert_eq!(
        ids_of(&claimed),
        vec![first],
        "E2: exactly the first job is claimable"
    );
    assert_eq!(claimed[0].payload, Bytes::from_static(b"first"));
}

/// E2: the key deduplicates whatever the first job's state, while its record exists
/// and the window runs: running, succeeded, dead, cancelled.
pub async fn e2_duplicate_key_dedups_in_every_state(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let keyed = |key: &str| NewJob::new("q").idempotency_key(key).max_attempts(1);
    let running = enqueue(&store, keyed("running"), "E2").await;
    let succeeded = enqueue(&store, keyed("succeeded"), "E2").await;
    let dead = enqueue(&store, keyed("dead"), "E2").await;
    let cancelled = enqueue(&store, keyed("cancelled"), "E2").await;
    store.cancel(cancelled).await.must("E2: cancel");
    let claimed = claim(&store, &["q"], 3, "E2: claim").await;
    // Keyed jobs live in their keys' partitions on a partitioned store: the order is
    // asserted per partition there, and each lease found by its job.
    assert_claim_order(
        &store,
        &ids_of(&claimed),
        &[running, succeeded, dead],
        "E2: the three ready jobs are claimed in order",
    );
    let token = |id: JobId| {
        claimed
            .iter()
            .find(|job| job.id() == id)
            .map(|job| job.token())
            .expect("E2: the job was claimed")
    };
    store
        .complete(succeeded, token(succeeded), None)
        .await
        .must("E2: complete");
    store
        .fail(dead, token(dead), "boom", Retry::Never)
        .await
        .must("E2: fail");
    env.clock.advance(Duration::from_secs(60));
    for (key, id, state) in [
        ("running", running, JobState::Running),
        ("succeeded", succeeded, JobState::Succeeded),
        ("dead", dead, JobState::Dead),
        ("cancelled", cancelled, JobState::Cancelled),
    ] {
        let before = get(&store, id, "E2: get").await;
        assert_eq!(before.state, state);
        let answer = store
            .enqueue(keyed(key).payload("again"))
            .await
            .must("E2: duplicate");
        assert_eq!(
            answer,
            Enqueued { id, created: false },
            "E2: a key must deduplicate while its job is {state}"
        );
        assert_unchanged(&store, &before, "E2: a duplicate must not change the job").await;
    }
    assert_nothing_claimable(&store, &["q"], "E2: duplicates made nothing claimable").await;
    assert_stats_agree(&store, "q", "E2").await;
}

/// E3: the same key under another tenant is another job, the empty tenant included.
pub async fn e3_same_key_other_tenant_is_another_job(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let mut ids = Vec::new();
    for tenant in ["", "a", "b", "A"] {
        let id = enqueue(
            &store,
            NewJob::new("q").tenant(tenant).idempotency_key("shared"),
            "E3: the same key under another tenant must create a job",
        )
        .await;
        ids.push((tenant, id));
    }
    let distinct: HashSet<JobId> = ids.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len(), 4, "E3: each tenant gets its own job");
    for (tenant, id) in ids {
        let again = store
            .enqueue(NewJob::new("q").tenant(tenant).idempotency_key("shared"))
            .await
            .must("E3: enqueue again");
        assert_eq!(
            again,
            Enqueued { id, created: false },
            "E3: tenant {tenant:?} must find its own job"
        );
    }
    assert_eq!(
        claim(&store, &["q"], 10, "E3: claim").await.len(),
        4,
        "E3: four tenants, four claimable jobs"
    );
}

/// E3: (tenant, key) pairs that a naive concatenation or escaping would confuse never
/// collide: separators moved between tenant and key, NUL, hash-tag braces, case,
/// Unicode normalisation forms, and prefixes.
pub async fn e3_distinct_pairs_never_collide(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let pairs: Vec<(&str, &str)> = vec![
        ("a:b", "c"),
        ("a", "b:c"),
        ("a|b", "c"),
        ("a", "b|c"),
        ("a\0b", "c"),
        ("a", "b\0c"),
        ("", "a:b:c"),
        ("a:b:c", "x"),
        ("", "ab"),
        ("a", "b"),
        ("ab", "c"),
        ("a", "bc"),
        ("{t}", "k"),
        ("t", "{t}k"),
        ("t", "k"),
        ("T", "k"),
        ("t", "K"),
        ("t", "k "),
        (" t", "k"),
        ("\u{e9}", "k"),
        ("e\u{301}", "k"),
        ("t", "k\n"),
        ("t/", "k"),
        ("t", "/k"),
        ("t", "k%"),
        ("t", "k_"),
        ("t", "k*"),
        ("t\\", "k"),
        ("t", "\\k"),
    ];
    let mut seen: HashMap<JobId, (&str, &str)> = HashMap::new();
    let mut ids = Vec::new();
    for (tenant, key) in &pairs {
        let id = enqueue(
            &store,
            NewJob::new("q").tenant(*tenant).idempotency_key(*key),
            "E3: a distinct (tenant, key) pair must create its own job",
        )
        .await;
        if let Some(other) = seen.insert(id, (tenant, key)) {
            panic!("E3: ({tenant:?}, {key:?}) collided with {other:?}");
        }
        ids.push(id);
    }
    for ((tenant, key), id) in pairs.iter().zip(ids) {
        let again = store
            .enqueue(NewJob::new("q").tenant(*tenant).idempotency_key(*key))
            .await
            .must("E3: enqueue again");
        assert_eq!(
            again,
            Enqueued { id, created: false },
            "E3: ({tenant:?}, {key:?}) must find its own job again"
        );
        let job = get(&store, id, "E3: get").await;
        assert_eq!(
            (job.tenant.as_str(), job.idempotency_key.as_deref()),
            (*tenant, Some(*key)),
            "E3: the job must keep its own tenant and key"
        );
    }
}

/// E4: 32 concurrent enqueues of one key, from four connections, create exactly one
/// job; all return its id; exactly one job is claimable, with the creator's payload.
pub async fn e4_concurrent_enqueues_of_one_key_create_one_job(harness: &dyn Harness) {
    const TASKS: usize = 32;
    const ROUNDS: usize = 3;
    let env = TestEnv::new(harness);
    let mut stores: Vec<Store> = Vec::new();
    for _ in 0..4 {
        stores.push(env.store().await);
    }
    for round in 0..ROUNDS {
        let key = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(TASKS));
        let mut handles = Vec::new();
        for task in 0..TASKS {
            let store = stores[task % stores.len()].clone();
            let barrier = Arc::clone(&barrier);
            let job = NewJob::new("race")
                .tenant("e4")
                .idempotency_key(key.clone())
                .payload(format!("from task {task}"));
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                let answer = store.enqueue(job).await.must("E4: concurrent enqueue");
                (task, answer)
            }));
        }
        let answers = join_all(handles).await;
        let creators: Vec<usize> = answers
            .iter()
            .filter(|(_, a)| a.created)
            .map(|(task, _)| *task)
            .collect();
        assert_eq!(
            creators.len(),
            1,
            "E4: exactly one of {TASKS} concurrent enqueues must create the job (creators: {creators:?})"
        );
        let ids: HashSet<JobId> = answers.iter().map(|(_, a)| a.id).collect();
        assert_eq!(
            ids.len(),
            1,
            "E4: every concurrent enqueue must return the one job's id, got {ids:?}"
        );
        let claimed = claim(&stores[0], &["race"], 100, "E4: claim").await;
        assert_eq!(
            claimed.len(),
            1,
            "E4: exactly one job is claimable after {TASKS} concurrent enqueues of one key"
        );
        assert_eq!(
            claimed[0].payload,
            Bytes::from(format!("from task {}", creators[0])),
            "E4: the job holds the creator's payload"
        );
    }
    assert_stats(
        &stores[1],
        "race",
        QueueStats {
            running: ROUNDS as u64,
            ..QueueStats::default()
        },
        "E4: one job per key",
    )
    .await;
}

/// E5: once a key's job is purged, the next enqueue with the key creates a new job and
/// the key points to it (retention shorter than the dedup window, so the window is not
/// what frees the key).
pub async fn e5_key_of_purged_job_creates_new_job(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env
        .store_with(|s| {
            s.retention(Duration::from_secs(60))
                .dedup_window(Duration::from_secs(86_400))
        })
        .await;
    let keyed = || NewJob::new("q").tenant("t").idempotency_key("k");
    let old = enqueue(&store, keyed().payload("old"), "E5").await;
    let claimed = claim_expecting(&store, "q", old, "E5: claim").await;
    store
        .complete(old, claimed.token(), None)
        .await
        .must("E5: complete");
    env.clock.advance(Duration::from_secs(61));
    assert_eq!(store.purge(100).await.must("E5: purge"), 1, "E5: purge");
    expect_not_found(store.get(old).await, old, "E5: the purged job is gone");
    let new = store
        .enqueue(keyed().payload("new"))
        .await
        .must("E5: enqueue after purge");
    assert!(
        new.created && new.id != old,
        "E5: the key of a purged job must create a new job, got {new:?}"
    );
    let again = store.enqueue(keyed()).await.must("E5: enqueue again");
    assert_eq!(
        again,
        Enqueued {
            id: new.id,
            created: false
        },
        "E5: the key must now point to the new job"
    );
    let job = claim_expecting(&store, "q", new.id, "E5: claim the new job").await;
    assert_eq!(job.payload, Bytes::from_static(b"new"));
}

/// E5: once a key's job record vanishes (eviction, loss), the next enqueue with the key
/// creates a new job and the key points to it; the vanished id stays not found.
pub async fn e5_key_of_vanished_job_creates_new_job(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let keyed = || NewJob::new("q").tenant("t").idempotency_key("k");
    let old = enqueue(&store, keyed().payload("old"), "E5").await;
    env.vanish(old).await;
    let new = store
        .enqueue(keyed().payload("new"))
        .await
        .must("E5: enqueue after the record vanished");
    assert!(
        new.created && new.id != old,
        "E5: the key of a vanished job must create a new job, got {new:?}"
    );
    let again = store.enqueue(keyed()).await.must("E5: enqueue again");
    assert_eq!(
        again,
        Enqueued {
            id: new.id,
            created: false
        },
        "E5: the key must now point to the new job"
    );
    expect_not_found(store.get(old).await, old, "E5: the vanished job stays gone");
    let job = claim_expecting(&store, "q", new.id, "E5: claim the new job").await;
    assert_eq!(job.payload, Bytes::from_static(b"new"));
    assert_nothing_claimable(&store, &["q"], "E5: only the new job").await;
}

/// E6: the dedup window runs from the first job's creation and is half-open: a
/// duplicate 1 ms before its end is deduplicated (and does not extend it); at its end
/// the key creates a new job, and then points to it.
pub async fn e6_dedup_window_runs_from_first_creation(harness: &dyn Harness) {
    const WINDOW: Duration = Duration::from_secs(3_600);
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.dedup_window(WINDOW)).await;
    let keyed = || NewJob::new("q").tenant("t").idempotency_key("k");
    let first = enqueue(&store, keyed(), "E6").await;
    env.clock.advance(WINDOW / 2);
    let mid = store.enqueue(keyed()).await.must("E6: inside the window");
    assert_eq!(
        mid,
        Enqueued {
            id: first,
            created: false
        },
        "E6: inside the window the key deduplicates"
    );
    env.clock.advance(WINDOW / 2 - Duration::from_millis(1));
    let last = store.enqueue(keyed()).await.must("E6: 1 ms before the end");
    assert_eq!(
        last,
        Enqueued {
            id: first,
            created: false
        },
        "E6: 1 ms before the window ends the key still deduplicates"
    );
    env.clock.advance(Duration::from_millis(1));
    let second = store.enqueue(keyed()).await.must("E6: at the window's end");
    assert!(
        second.created && second.id != first,
        "E6: the window runs from the first creation, is half-open, and is not extended by duplicates: at its end the key must create a new job, got {second:?}"
    );
    env.clock.advance(Duration::from_millis(1));
    let again = store.enqueue(keyed()).await.must("E6: after");
    assert_eq!(
        again,
        Enqueued {
            id: second.id,
            created: false
        },
        "E6: the key must now point to the new job"
    );
    assert_eq!(
        get(&store, first, "E6: get").await.state,
        JobState::Queued,
        "E6: the first job is untouched"
    );
    assert_eq!(
        ids_of(&claim(&store, &["q"], 10, "E6: claim").await),
        vec![first, second.id],
        "E6: both jobs are claimable"
    );
}

/// E10: a key unique while active returns its job while that job is queued, scheduled
/// or running, past the dedup window too, and makes a new job once it has succeeded,
/// died or been cancelled.
pub async fn e10_unique_while_active_holds_until_the_job_finishes(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    // A window of zero: the key holds by the job's state alone.
    let store = env
        .store_with(|settings| settings.dedup_window(Duration::ZERO))
        .await;
    let unique = || NewJob::new("q").unique_while_active("nightly");
    let first = store.enqueue(unique()).await.must("E10");
    assert!(first.created);
    let again = store.enqueue(unique().payload("other")).await.must("E10");
    assert_eq!(
        (again.id, again.created),
        (first.id, false),
        "E10: a queued job holds its key"
    );
    let held = claim_expecting(&store, "q", first.id, "E10").await;
    // Past the window and past retention, so a purge would drop a window key this old.
    env.clock.advance(Duration::from_secs(8 * 24 * 3600));
    let again = store.enqueue(unique()).await.must("E10");
    assert_eq!(
        (again.id, again.created),
        (first.id, false),
        "E10: a running job holds its key, past any window"
    );
    // Retention's clean-up of old keys leaves a key whose job is active.
    store.purge(10_000).await.must("E10: purge");
    assert_eq!(
        store.enqueue(unique()).await.must("E10").id,
        first.id,
        "E10: a purge keeps the key of an active job, however old"
    );
    expect_invalid(
        store
            .enqueue(NewJob {
                uniqueness: Uniqueness::WhileActive,
                ..NewJob::new("q")
            })
            .await,
        "uniqueness",
        "E10: unique while active without a key",
    );
    assert_eq!(
        store.payload(first.id).await.must("E10"),
        Bytes::new(),
        "E10: a duplicate changes nothing"
    );
    store
        .complete(first.id, held.token(), None)
        .await
        .must("E10: complete");

    // Succeeded: the next enqueue makes a new job, which then holds the key.
    let second = store.enqueue(unique()).await.must("E10");
    assert!(
        second.created && second.id != first.id,
        "E10: after success"
    );
    assert_eq!(store.enqueue(unique()).await.must("E10").id, second.id);
    // Dead.
    let held = claim_expecting(&store, "q", second.id, "E10").await;
    store
        .fail(second.id, held.token(), "no", Retry::Never)
        .await
        .must("E10: fail for good");
    let third = store.enqueue(unique()).await.must("E10");
    assert!(third.created && third.id != second.id, "E10: after death");
    // Cancelled while queued.
    store.cancel(third.id).await.must("E10: cancel");
    let fourth = store.enqueue(unique()).await.must("E10");
    assert!(fourth.created && fourth.id != third.id, "E10: after cancel");
    // Scheduled counts as active.
    let later = env.clock.now().saturating_add(Duration::from_secs(3600));
    let scheduled = store
        .enqueue(NewJob::new("q").unique_while_active("later").run_at(later))
        .await
        .must("E10");
    let again = store
        .enqueue(NewJob::new("q").unique_while_active("later"))
        .await
        .must("E10");
    assert_eq!(
        (again.id, again.created),
        (scheduled.id, false),
        "E10: a scheduled job holds its key"
    );
    let claimed = claim(&store, &["q"], 10, "E10: what is claimable").await;
    assert_eq!(
        ids_of(&claimed),
        vec![fourth.id],
        "E10: exactly the one active due job is claimable"
    );
}

/// E10 with E4: 16 concurrent enqueues of one key unique while active, through four
/// handles, leave exactly one active job; after it finishes, another 16 leave one more.
pub async fn e10_concurrent_unique_enqueues_leave_one_active_job(harness: &dyn Harness) {
    const TASKS: usize = 16;
    let env = TestEnv::new(harness);
    let mut stores: Vec<Store> = Vec::new();
    for _ in 0..4 {
        stores.push(env.store().await);
    }
    let mut previous: Option<JobId> = None;
    for round in 0..3 {
        let barrier = Arc::new(Barrier::new(TASKS));
        let mut handles = Vec::new();
        for task in 0..TASKS {
            let store = stores[task % stores.len()].clone();
            let barrier = Arc::clone(&barrier);
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store
                    .enqueue(NewJob::new("race").unique_while_active("only-one"))
                    .await
                    .must("E10: concurrent enqueue")
            }));
        }
        let answers = join_all(handles).await;
        let created = answers.iter().filter(|a| a.created).count();
        let ids: HashSet<JobId> = answers.iter().map(|a| a.id).collect();
        assert_eq!(created, 1, "E10: round {round}: one creator of {TASKS}");
        assert_eq!(
            ids.len(),
            1,
            "E10: round {round}: one id for all, got {ids:?}"
        );
        let id = answers[0].id;
        assert_ne!(Some(id), previous, "E10: round {round} made a new job");
        let claimed = claim(&stores[0], &["race"], 100, "E10: claim").await;
        assert_eq!(ids_of(&claimed), vec![id], "E10: one active job");
        stores[1]
            .complete(id, claimed[0].token(), None)
            .await
            .must("E10: complete");
        previous = Some(id);
    }
}
