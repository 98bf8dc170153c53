//! Rules E1, E8, E9, E11 and E12: enqueue and get, fan-out, batches, tags, trace context
//! (idempotency is in `idempotency.rs`, refusals in `validation.rs`).

use std::collections::HashMap;
use std::time::Duration;

use durq_core::{
    Bytes, Clock, Enqueued, Job, JobId, JobState, Needs, NewJob, QueueStats, Tags, Timestamp,
    DEFAULT_MAX_ATTEMPTS,
};

use super::support::{
    assert_claim_order, assert_stats, binary, claim, claim_expecting, drain, enqueue,
    expect_invalid, expect_too_large, get, ids_of, list_all, Must, Together,
};
use crate::{Harness, TestEnv};

/// E1: `enqueue` reports a new job; `get` shows it `queued` with every given field
/// exactly, every lifecycle field empty, `created_at` = now; unset fields take their
/// defaults; ids of later jobs are greater (time-ordered).
pub async fn e1_enqueue_then_get_shows_every_field(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let now = env.clock.now();
    let parent = enqueue(&store, NewJob::new("parents"), "E1: enqueue the parent").await;
    let run_at = now.saturating_add(Duration::from_secs(90));
    let payload = Bytes::from_static(b"{\"to\":\"ada@example.com\"}");
    let answer = store
        .enqueue(
            NewJob::new("emails.v2")
                .payload(payload.clone())
                .tenant("acme")
                .idempotency_key("welcome-42")
                .priority(7)
                .run_at(run_at)
                .max_attempts(3)
                .parent(parent)
                .timeout(Duration::from_millis(90_500)),
        )
        .await
        .must("E1: enqueue");
    assert!(answer.created, "E1: a new job must report created = true");
    assert!(
        answer.id > parent,
        "E1: ids are time-ordered: a later job must have a greater id"
    );
    let expected = Job {
        id: answer.id,
        queue: "emails.v2".to_owned(),
        tenant: "acme".to_owned(),
        idempotency_key: Some("welcome-42".to_owned()),
        priority: 7,
        run_at,
        max_attempts: 3,
        parent: Some(parent),
        timeout: Some(Duration::from_millis(90_500)),
        state: JobState::Queued,
        attempts: 0,
        lease: None,
        created_at: now,
        started_at: None,
        heartbeat_at: None,
        finished_at: None,
        last_error: None,
        result: None,
        cancel_requested: false,
        needs: Needs::new(),
        locality: None,
        tags: Tags::new(),
        trace_context: None,
        concurrency_key: None,
        depends_on: Vec::new(),
        on_dependency_failure: Default::default(),
    };
    assert_eq!(
        get(&store, answer.id, "E1: get").await,
        expected,
        "E1: get must show the job queued with every field as given"
    );
    assert_eq!(
        store.payload(answer.id).await.must("E1: payload"),
        payload,
        "E1: payload must return the exact bytes"
    );

    env.clock.advance(Duration::from_millis(1_234));
    let later = env.clock.now();
    let plain = enqueue(&store, NewJob::new("plain"), "E1: enqueue with defaults").await;
    assert!(plain > answer.id, "E1: ids must increase with creation");
    assert_eq!(
        get(&store, plain, "E1: get the default job").await,
        Job {
            id: plain,
            queue: "plain".to_owned(),
            tenant: String::new(),
            idempotency_key: None,
            priority: 0,
            run_at: later,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            parent: None,
            timeout: None,
            state: JobState::Queued,
            attempts: 0,
            lease: None,
            created_at: later,
            started_at: None,
            heartbeat_at: None,
            finished_at: None,
            last_error: None,
            result: None,
            cancel_requested: false,
            needs: Needs::new(),
            locality: None,
            tags: Tags::new(),
            trace_context: None,
            concurrency_key: None,
            depends_on: Vec::new(),
            on_dependency_failure: Default::default(),
        },
        "E1: unset fields take their defaults: empty tenant, no key, priority 0, run_at = now, 25 attempts"
    );
    assert!(
        store.payload(plain).await.must("E1: payload").is_empty(),
        "E1: the default payload is empty"
    );
}

/// E1: a job's timeout is stored exactly and shown by `get`, `claim`, `list` and
/// `children`, whether it was enqueued alone or in a batch; a job without one shows none.
pub async fn e1_timeout_round_trips(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let parent = enqueue(&store, NewJob::new("parents"), "E1: parent").await;
    let alone = Duration::from_millis(1);
    let batched = Duration::from_secs(366 * 24 * 60 * 60);
    let single = enqueue(
        &store,
        NewJob::new("q").timeout(alone).parent(parent),
        "E1: enqueue with a timeout",
    )
    .await;
    let answers = store
        .enqueue_batch(vec![
            NewJob::new("q").timeout(batched).parent(parent),
            NewJob::new("q").parent(parent),
        ])
        .await
        .must("E1: enqueue_batch with timeouts");
    let expected = [
        (single, Some(alone)),
        (answers[0].id, Some(batched)),
        (answers[1].id, None),
    ];
    for (id, timeout) in expected {
        assert_eq!(
            get(&store, id, "E1 timeout").await.timeout,
            timeout,
            "E1: get shows the timeout as enqueued"
        );
    }
    let listed = list_all(&store, "q", None, "E1 timeout").await;
    for (id, timeout) in expected {
        let job = listed.iter().find(|job| job.id == id);
        assert_eq!(
            job.map(|job| job.timeout),
            Some(timeout),
            "E1: list shows the timeout as enqueued"
        );
    }
    let children = store.children(parent).await.must("E1: children");
    assert_eq!(
        children.iter().map(|job| job.timeout).collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(_, timeout)| *timeout)
            .collect::<Vec<_>>(),
        "E1: children show the timeout as enqueued"
    );
    let claimed = drain(&store, &["q"], "E1 timeout").await;
    assert_eq!(claimed.len(), 3, "E1: every job is claimable");
    for (id, timeout) in expected {
        let job = claimed.iter().find(|job| job.id() == id);
        assert_eq!(
            job.map(|job| job.job.timeout),
            Some(timeout),
            "E1: claim hands the timeout to the worker"
        );
    }
}

/// E1: an empty payload is stored and returned as empty, by `payload` and by `claim`.
pub async fn e1_payload_empty(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let id = enqueue(&store, NewJob::new("q").payload(Vec::new()), "E1").await;
    assert_eq!(
        store.payload(id).await.must("E1: payload"),
        Bytes::new(),
        "E1: an empty payload must come back empty"
    );
    let claimed = claim_expecting(&store, "q", id, "E1: claim").await;
    assert!(
        claimed.payload.is_empty(),
        "E1: claim must hand out the empty payload"
    );
}

/// E1: binary payloads (every byte value, NUL bytes, invalid UTF-8, trailing NULs) come
/// back byte for byte, by `payload` and by `claim`.
pub async fn e1_payload_binary_with_nul_bytes(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "E1").await;
    let mut every_byte: Vec<u8> = (0..=255u8).collect();
    every_byte.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28, 0x00, 0x00]);
    let payloads: Vec<Vec<u8>> = vec![
        vec![0],
        vec![0, 0, 0, 0],
        b"\0leading NUL".to_vec(),
        b"trailing NUL\0".to_vec(),
        b"mid\0dle".to_vec(),
        every_byte,
        binary(4_099, 7),
        "ünïcödé ✓ \u{1F980}".as_bytes().to_vec(),
        b"'\"; DROP TABLE jobs; --\r\n\t{}[]%s%d\\".to_vec(),
    ];
    let mut ids = Vec::new();
    for payload in &payloads {
        ids.push(
            together
                .enqueue(&store, NewJob::new("bin").payload(payload.clone()), "E1")
                .await,
        );
    }
    for (id, payload) in ids.iter().zip(&payloads) {
        assert_eq!(
            store.payload(*id).await.must("E1: payload").as_ref(),
            payload.as_slice(),
            "E1: payload must return the exact bytes"
        );
    }
    let claimed = drain(&store, &["bin"], "E1: claim").await;
    assert_eq!(ids_of(&claimed), ids, "E1: every binary job is claimable");
    for (job, payload) in claimed.iter().zip(&payloads) {
        assert_eq!(
            job.payload.as_ref(),
            payload.as_slice(),
            "E1: claim must hand out the exact payload bytes"
        );
    }
}

/// E1: a payload of exactly `max_payload_bytes` is accepted and returned whole; one
/// byte more is refused (E7).
pub async fn e1_payload_exactly_max_size(harness: &dyn Harness) {
    const MAX: usize = 64 * 1024;
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(MAX)).await;
    let payload = binary(MAX, 3);
    let id = enqueue(&store, NewJob::new("big").payload(payload.clone()), "E1").await;
    assert_eq!(
        store.payload(id).await.must("E1: payload").as_ref(),
        payload.as_slice(),
        "E1: a payload of exactly max_payload_bytes must come back whole"
    );
    let claimed = claim_expecting(&store, "big", id, "E1: claim").await;
    assert_eq!(
        claimed.payload.as_ref(),
        payload.as_slice(),
        "E1: claim must hand out the whole max-size payload"
    );
    expect_too_large(
        store
            .enqueue(NewJob::new("big").payload(binary(MAX + 1, 3)))
            .await,
        "payload",
        MAX + 1,
        MAX,
        "E1/E7: one byte over max_payload_bytes",
    );
    assert_stats(
        &store,
        "big",
        QueueStats {
            running: 1,
            ..QueueStats::default()
        },
        "E1/E7: the refused payload wrote nothing",
    )
    .await;
}

/// E1: fields at the edges of their ranges round-trip exactly: longest queue name with
/// every allowed character, longest tenant and key, any UTF-8 in them (NUL included),
/// extreme priorities, the largest `max_attempts`, a far-future `run_at`.
pub async fn e1_extreme_field_values_round_trip(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let now = env.clock.now();
    let alphabet = "ABCXYZabcxyz0189._:-";
    let long_queue: String = alphabet.chars().cycle().take(128).collect();
    let long_tenant: String = "é".repeat(128); // 256 bytes
    let long_key: String = "\u{1F980}".repeat(128); // 512 bytes
    let far_future = Timestamp::from_millis(253_402_300_799_999); // 9999-12-31T23:59:59.999Z
    let cases: Vec<NewJob> = vec![
        NewJob::new(long_queue.clone())
            .tenant(long_tenant.clone())
            .idempotency_key(long_key.clone())
            .priority(i16::MAX)
            .max_attempts(u32::MAX),
        NewJob::new("q")
            .tenant("tenant with spaces, \"quotes\", 'apostrophes', \\ and \n newlines")
            .idempotency_key("key\0with\0NUL {hash}:tag* ?[]")
            .priority(i16::MIN)
            .max_attempts(1)
            .run_at(far_future),
        NewJob::new("q")
            .tenant("\0")
            .idempotency_key("\u{10FFFF}\u{FEFF}\u{200B}")
            .priority(-1),
        NewJob::new("a")
            .idempotency_key("k")
            .run_at(now.saturating_sub(Duration::from_secs(86_400 * 365))),
    ];
    for job in cases {
        let id = enqueue(&store, job.clone(), "E1").await;
        let stored = get(&store, id, "E1: get").await;
        assert_eq!(stored.queue, job.queue, "E1: queue must round-trip");
        assert_eq!(stored.tenant, job.tenant, "E1: tenant must round-trip");
        assert_eq!(
            stored.idempotency_key, job.idempotency_key,
            "E1: idempotency key must round-trip"
        );
        assert_eq!(
            stored.priority, job.priority,
            "E1: priority must round-trip"
        );
        assert_eq!(
            stored.max_attempts, job.max_attempts,
            "E1: max_attempts must round-trip"
        );
        assert_eq!(
            stored.run_at,
            job.run_at.unwrap_or(now),
            "E1: run_at must round-trip"
        );
        let again = store.enqueue(job.clone()).await.must("E1: enqueue again");
        assert_eq!(
            again,
            Enqueued { id, created: false },
            "E1/E2: the stored key must still match the same key"
        );
    }
}

/// E8: `children(parent)` lists exactly the jobs enqueued with that parent, oldest
/// first, whatever their queue, priority, schedule or state; other parents' children
/// and unrelated jobs are not listed; a job without children has none.
pub async fn e8_children_lists_jobs_of_parent_oldest_first(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let parent = enqueue(&store, NewJob::new("fan"), "E8").await;
    let other = enqueue(&store, NewJob::new("fan"), "E8").await;
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..12i16 {
        if i % 4 == 1 {
            env.clock.advance(Duration::from_millis(5));
        }
        let queue = if i % 2 == 0 { "kids-a" } else { "kids-b" };
        let job = NewJob::new(queue)
            .priority(if i % 3 == 0 { 10 - i } else { -i })
            .run_at(
                env.clock
                    .now()
                    .saturating_add(Duration::from_secs(u64::from(12 - i as u16))),
            );
        mine.push(enqueue(&store, job.clone().parent(parent), "E8").await);
        if i % 3 == 0 {
            theirs.push(enqueue(&store, job.clone().parent(other), "E8").await);
            enqueue(&store, job, "E8: an unrelated job").await;
        }
    }
    let batch = store
        .enqueue_batch(vec![
            NewJob::new("kids-a").parent(parent),
            NewJob::new("kids-a").parent(other),
        ])
        .await
        .must("E8: batch");
    mine.push(batch[0].id);
    theirs.push(batch[1].id);
    // Children change state; they stay children.
    env.clock.advance(Duration::from_secs(60));
    let claimed = claim(&store, &["kids-a"], 2, "E8: claim").await;
    store
        .complete(claimed[0].id(), claimed[0].token(), None)
        .await
        .must("E8: complete");
    store.cancel(mine[3]).await.must("E8: cancel");

    let listed: Vec<JobId> = store
        .children(parent)
        .await
        .must("E8: children")
        .iter()
        .map(|job| job.id)
        .collect();
    assert_eq!(
        listed, mine,
        "E8: children must list exactly the parent's jobs, oldest first"
    );
    let listed: Vec<JobId> = store
        .children(other)
        .await
        .must("E8: children")
        .iter()
        .map(|job| job.id)
        .collect();
    assert_eq!(listed, theirs, "E8: another parent's children");
    for job in store.children(parent).await.must("E8: children") {
        assert_eq!(
            job,
            get(&store, job.id, "E8: get").await,
            "E8: children shows the jobs as get does"
        );
    }
    assert!(
        store
            .children(mine[0])
            .await
            .must("E8: children of a leaf")
            .is_empty(),
        "E8: a job without children has none"
    );
}

/// The jobs of the E9 comparison, for one queue and tenant.
fn e9_jobs(queue: &str, tenant: &str, now: Timestamp, parent: JobId) -> Vec<NewJob> {
    let job = || NewJob::new(queue).tenant(tenant);
    vec![
        job().idempotency_key("k1").payload("a"),
        job().payload(&b"\0b\xff"[..]).priority(3),
        job()
            .idempotency_key("k1")
            .payload("duplicate inside the batch"),
        job()
            .idempotency_key("pre")
            .payload("duplicate of an older job"),
        job()
            .run_at(now.saturating_add(Duration::from_secs(10)))
            .max_attempts(2),
        job().payload("c"),
        job().parent(parent).idempotency_key("k2"),
        job().priority(3).payload("d"),
    ]
}

/// E9: a batch enqueue behaves exactly like the same enqueues one by one: the same
/// answers in order (duplicates inside the batch and of older jobs included), the same
/// stored jobs, the same claim order, the same counts.
pub async fn e9_batch_behaves_like_one_by_one(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let now = env.clock.now();
    let parent = enqueue(&store, NewJob::new("parents"), "E9").await;
    let mut pre = HashMap::new();
    for tenant in ["solo", "batch"] {
        let id = enqueue(
            &store,
            NewJob::new("elsewhere")
                .tenant(tenant)
                .idempotency_key("pre"),
            "E9",
        )
        .await;
        pre.insert(tenant, id);
    }
    assert!(
        store
            .enqueue_batch(Vec::new())
            .await
            .must("E9: empty batch")
            .is_empty(),
        "E9: an empty batch enqueues nothing and answers nothing"
    );

    let mut solo = Vec::new();
    for job in e9_jobs("solo", "solo", now, parent) {
        solo.push(store.enqueue(job).await.must("E9: one by one"));
    }
    let batch = store
        .enqueue_batch(e9_jobs("batch", "batch", now, parent))
        .await
        .must("E9: batch");
    assert_eq!(batch.len(), solo.len(), "E9: a batch answers once per job");
    let created: Vec<bool> = batch.iter().map(|a| a.created).collect();
    assert_eq!(
        created,
        solo.iter().map(|a| a.created).collect::<Vec<_>>(),
        "E9: the batch must report created exactly as one-by-one enqueues do"
    );
    assert_eq!(
        created,
        vec![true, true, false, false, true, true, true, true],
        "E9: duplicates inside the batch and of older jobs report created = false"
    );
    assert_eq!(
        batch[2].id, batch[0].id,
        "E9: a duplicate inside the batch returns the first job"
    );
    assert_eq!(
        batch[3].id, pre["batch"],
        "E9: a duplicate of an older job returns it"
    );
    assert_eq!(solo[3].id, pre["solo"]);

    for (s, b) in solo.iter().zip(&batch).filter(|(s, _)| s.created) {
        let mut one = get(&store, s.id, "E9: get").await;
        let mut other = get(&store, b.id, "E9: get").await;
        assert_eq!(
            store.payload(s.id).await.must("E9"),
            store.payload(b.id).await.must("E9"),
            "E9: the batch stores the same payload"
        );
        for job in [&mut one, &mut other] {
            job.id = parent;
            job.queue.clear();
            job.tenant.clear();
        }
        assert_eq!(
            one, other,
            "E9: a batch-enqueued job must be stored as the same job enqueued alone"
        );
    }
    assert_eq!(
        store.stats("solo").await.must("E9"),
        store.stats("batch").await.must("E9"),
        "E9: the batch counts as the one-by-one jobs do"
    );
    assert_eq!(
        store.stats("batch").await.must("E9").total(),
        6,
        "E9: six distinct new jobs"
    );

    env.clock.advance(Duration::from_secs(10));
    // Priority, then ready time, then position: the same for the batch as one by one.
    let in_claim_order = |answers: &[Enqueued]| -> Vec<JobId> {
        [1, 7, 0, 5, 6, 4].map(|at| answers[at].id).to_vec()
    };
    let solo_claimed = ids_of(&drain(&store, &["solo"], "E9: drain").await);
    let batch_claimed = ids_of(&drain(&store, &["batch"], "E9: drain").await);
    assert_claim_order(
        &store,
        &solo_claimed,
        &in_claim_order(&solo),
        "E9: claim order of the one-by-one jobs",
    );
    assert_claim_order(
        &store,
        &batch_claimed,
        &in_claim_order(&batch),
        "E9: batch jobs must be claimed in the order one-by-one jobs are: priority, then ready time, then position in the batch",
    );
    let children: Vec<JobId> = store
        .children(parent)
        .await
        .must("E9: children")
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(
        children,
        vec![solo[6].id, batch[6].id],
        "E9: a batch child is a child"
    );
}

/// E9 with the decision "refused whole": a batch holding one invalid job (bad field,
/// unknown parent) or more than 10,000 jobs is refused with that field's error and
/// writes nothing, not even its valid jobs or their keys.
pub async fn e9_invalid_batch_is_refused_whole(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(100)).await;
    let valid = |i: usize| {
        NewJob::new("q")
            .tenant("t")
            .idempotency_key(format!("k{i}"))
            .payload(format!("{i}"))
    };
    let unknown_parent = JobId::mint(env.clock.now());
    let cases: Vec<(&str, NewJob)> = vec![
        ("max_attempts", NewJob::new("q").max_attempts(0)),
        ("queue", NewJob::new("bad queue")),
        ("payload", NewJob::new("q").payload(vec![0u8; 101])),
        ("parent", NewJob::new("q").parent(unknown_parent)),
    ];
    for (field, bad) in cases {
        let mut jobs: Vec<NewJob> = (0..3).map(valid).collect();
        jobs.push(bad);
        jobs.extend((3..5).map(valid));
        let result = store.enqueue_batch(jobs).await;
        let what = format!("E9: a batch with a bad {field}");
        if field == "payload" {
            expect_too_large(result, field, 101, 100, &what);
        } else {
            expect_invalid(result, field, &what);
        }
        assert_stats(&store, "q", QueueStats::default(), &what).await;
    }
    let huge: Vec<NewJob> = (0..10_001).map(|_| NewJob::new("q")).collect();
    expect_invalid(
        store.enqueue_batch(huge).await,
        "jobs",
        "E9: a batch of 10,001 jobs",
    );
    assert_stats(
        &store,
        "q",
        QueueStats::default(),
        "E9: refused batches write nothing",
    )
    .await;
    for i in 0..5 {
        let answer = store.enqueue(valid(i)).await.must("E9: enqueue alone");
        assert!(
            answer.created,
            "E9: a refused batch must not take the keys of its valid jobs"
        );
    }
}

/// E11: a job's tags round-trip exactly with every read (`get`, `claim`, `list`,
/// `children`), with any UTF-8 value; a job without tags shows none; bad tags are
/// refused naming `tags` and write nothing, in a batch too.
pub async fn e11_tags_round_trip_and_are_checked(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let parent = enqueue(&store, NewJob::new("parents"), "E11").await;
    let mut tags = Tags::new();
    tags.insert("customer".into(), "42".into());
    tags.insert("a.b:c-d_e".into(), String::new());
    tags.insert(
        "note".into(),
        "ünïcödé, \"quotes\", commas; = and {json}".into(),
    );
    let mut job = NewJob::new("q").parent(parent);
    job.tags = tags.clone();
    let id = enqueue(&store, job, "E11: enqueue with tags").await;
    let plain = enqueue(&store, NewJob::new("q"), "E11: enqueue without tags").await;
    assert_eq!(
        get(&store, id, "E11").await.tags,
        tags,
        "E11: get shows the tags"
    );
    assert!(
        get(&store, plain, "E11").await.tags.is_empty(),
        "E11: a job without tags shows none"
    );
    let children = store.children(parent).await.must("E11: children");
    assert_eq!(children[0].tags, tags, "E11: children show the tags");
    let listed = list_all(&store, "q", None, "E11: list").await;
    let listed = listed.iter().find(|j| j.id == id).expect("E11: listed");
    assert_eq!(listed.tags, tags, "E11: list shows the tags");
    let claimed = claim(&store, &["q"], 2, "E11: claim").await;
    // Found by id: on a partitioned store the two may come in either order (CONTRACT §8).
    let tagged = claimed.iter().find(|job| job.id() == id);
    assert_eq!(
        tagged.map(|job| &job.job.tags),
        Some(&tags),
        "E11: claim shows the tags"
    );

    let too_many: Tags = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let bad_tags = [
        Tags::from([("has space".to_owned(), "v".to_owned())]),
        Tags::from([(String::new(), "v".to_owned())]),
        Tags::from([("k".to_owned(), "x".repeat(257))]),
        Tags::from([("k".to_owned(), "line\nbreak".to_owned())]),
        too_many,
    ];
    for bad in bad_tags {
        let mut job = NewJob::new("refused");
        job.tags = bad;
        expect_invalid(store.enqueue(job.clone()).await, "tags", "E11: bad tags");
        expect_invalid(
            store.enqueue_batch(vec![NewJob::new("refused"), job]).await,
            "tags",
            "E11: a batch with bad tags",
        );
    }
    assert_stats(
        &store,
        "refused",
        QueueStats::default(),
        "E11: nothing written",
    )
    .await;
}

/// E12: a job's trace context (a W3C `traceparent`) round-trips exactly with every
/// read; one that is not a version-00 traceparent is refused naming `trace_context`
/// and writes nothing.
pub async fn e12_trace_context_round_trips_and_is_checked(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    // The claims below expect given jobs: they share one partition (CONTRACT §8).
    let together = Together::new(&store, "E12").await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = together
        .enqueue(
            &store,
            NewJob::new("q").trace_context(traceparent),
            "E12: enqueue with a trace context",
        )
        .await;
    let plain = together.enqueue(&store, NewJob::new("q"), "E12").await;
    assert_eq!(
        get(&store, id, "E12").await.trace_context.as_deref(),
        Some(traceparent),
        "E12: get shows the trace context"
    );
    assert_eq!(get(&store, plain, "E12").await.trace_context, None);
    let claimed = claim(&store, &["q"], 1, "E12: claim").await;
    assert_eq!(
        claimed[0].job.trace_context.as_deref(),
        Some(traceparent),
        "E12: claim hands the handler the trace context"
    );
    let listed = list_all(&store, "q", None, "E12: list").await;
    assert!(
        listed
            .iter()
            .any(|j| j.id == id && j.trace_context.as_deref() == Some(traceparent)),
        "E12: list shows the trace context"
    );
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    ] {
        expect_invalid(
            store
                .enqueue(NewJob::new("refused").trace_context(bad))
                .await,
            "trace_context",
            "E12: a bad trace context",
        );
    }
    assert_stats(
        &store,
        "refused",
        QueueStats::default(),
        "E12: nothing written",
    )
    .await;
}
