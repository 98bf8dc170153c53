//! Rule E7: invalid input is refused, naming its field, and writes nothing.

use std::time::Duration;

use durq_core::{Capability, Clock, JobId, NewJob, QueueStats, Store};

use super::support::{
    assert_nothing_claimable, assert_stats, binary, enqueue, expect_invalid, expect_too_large, get,
    list_all, Must,
};
use crate::{Harness, TestEnv};

/// Enqueues `job`, which must be refused naming `field`, and checks nothing was
/// written: the queue `q` stays empty and the job's (tenant, key), if any, stays free.
async fn assert_refused(store: &Store, job: NewJob, field: &str, what: &str) {
    let max = store.settings().max_payload_bytes;
    let result = store.enqueue(job.clone()).await;
    if field == "payload" {
        expect_too_large(result, field, job.payload.len(), max, what);
    } else {
        expect_invalid(result, field, what);
    }
    assert_stats(store, "q", QueueStats::default(), what).await;
    if store.supports(Capability::Inspect) {
        assert!(
            list_all(store, "q", None, what).await.is_empty(),
            "{what}: a refused job must not be listed"
        );
    }
    assert_nothing_claimable(store, &["q"], what).await;
    if let Some(key) = job
        .idempotency_key
        .filter(|k| !k.is_empty() && k.len() <= 512)
    {
        if job.tenant.len() <= 256 {
            let valid = NewJob::new("probe").tenant(job.tenant).idempotency_key(key);
            let answer = store.enqueue(valid.clone()).await.must(what);
            assert!(
                answer.created,
                "{what}: a refused job must not take its idempotency key"
            );
            let again = store.enqueue(valid).await.must(what);
            assert!(!again.created, "{what}: the probe key must deduplicate");
        }
    }
}

/// E7: an empty queue name is refused naming `queue`; nothing is written.
pub async fn e7_empty_queue_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_refused(
        &store,
        NewJob::new("").idempotency_key("e7-empty-queue"),
        "queue",
        "E7: empty queue",
    )
    .await;
}

/// E7: queue names with characters outside `[A-Za-z0-9._:-]`, or longer than 128
/// bytes, are refused naming `queue`; nothing is written.
pub async fn e7_bad_queue_name_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let too_long = "q".repeat(129);
    for (i, queue) in [
        "with space",
        "slash/queue",
        "ünïcode",
        "{q}",
        "q\0",
        "q\n",
        "q*",
        too_long.as_str(),
    ]
    .into_iter()
    .enumerate()
    {
        assert_refused(
            &store,
            NewJob::new(queue).idempotency_key(format!("e7-bad-queue-{i}")),
            "queue",
            &format!("E7: bad queue {queue:?}"),
        )
        .await;
    }
}

/// E7: a tenant over 256 bytes is refused naming `tenant`; nothing is written.
pub async fn e7_oversized_tenant_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_refused(
        &store,
        NewJob::new("q")
            .tenant("t".repeat(257))
            .idempotency_key("e7-tenant"),
        "tenant",
        "E7: 257-byte tenant",
    )
    .await;
    assert_refused(
        &store,
        NewJob::new("q").tenant("é".repeat(129)),
        "tenant",
        "E7: 258-byte tenant of 129 characters",
    )
    .await;
}

/// E7: an idempotency key that is empty or over 512 bytes is refused naming
/// `idempotency_key`; nothing is written.
pub async fn e7_bad_idempotency_key_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_refused(
        &store,
        NewJob::new("q").idempotency_key("k".repeat(513)),
        "idempotency_key",
        "E7: 513-byte key",
    )
    .await;
    // The limit is in bytes: 257 two-byte characters are 514 bytes.
    assert_refused(
        &store,
        NewJob::new("q").idempotency_key("é".repeat(257)),
        "idempotency_key",
        "E7: a key of 257 two-byte characters (514 bytes)",
    )
    .await;
    assert_refused(
        &store,
        NewJob::new("q").idempotency_key(""),
        "idempotency_key",
        "E7: empty key",
    )
    .await;
}

/// E7: a payload over `max_payload_bytes` is refused as too large, naming `payload`
/// with its size and the limit; nothing is written, its key stays free.
pub async fn e7_oversized_payload_is_refused(harness: &dyn Harness) {
    const MAX: usize = 1_024;
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.max_payload_bytes(MAX)).await;
    for size in [MAX + 1, 4 * MAX] {
        assert_refused(
            &store,
            NewJob::new("q")
                .payload(binary(size, 1))
                .tenant("t")
                .idempotency_key(format!("e7-payload-{size}")),
            "payload",
            &format!("E7: {size}-byte payload over a {MAX}-byte limit"),
        )
        .await;
    }
}

/// E7: `max_attempts = 0` is refused naming `max_attempts`; nothing is written.
pub async fn e7_zero_max_attempts_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    assert_refused(
        &store,
        NewJob::new("q")
            .max_attempts(0)
            .idempotency_key("e7-attempts"),
        "max_attempts",
        "E7: max_attempts = 0",
    )
    .await;
}

/// E7: a timeout of zero, or one that is not whole milliseconds, is refused naming
/// `timeout`; nothing is written.
pub async fn e7_bad_timeout_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    for (timeout, key) in [
        (Duration::ZERO, "e7-timeout-zero"),
        (Duration::from_micros(1_500), "e7-timeout-fraction"),
    ] {
        assert_refused(
            &store,
            NewJob::new("q").timeout(timeout).idempotency_key(key),
            "timeout",
            &format!("E7: timeout {timeout:?}"),
        )
        .await;
    }
}

/// E7: an unknown parent (never enqueued, or vanished) is refused naming `parent`;
/// nothing is written; a known parent is accepted.
pub async fn e7_unknown_parent_is_refused(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let never = JobId::mint(env.clock.now());
    assert_refused(
        &store,
        NewJob::new("q").parent(never).idempotency_key("e7-parent"),
        "parent",
        "E7: a parent that never existed",
    )
    .await;
    let gone = enqueue(&store, NewJob::new("parents"), "E7").await;
    env.vanish(gone).await;
    assert_refused(
        &store,
        NewJob::new("q").parent(gone).idempotency_key("e7-parent-2"),
        "parent",
        "E7: a parent whose record vanished",
    )
    .await;
    let live = enqueue(&store, NewJob::new("parents"), "E7").await;
    let child = enqueue(&store, NewJob::new("q").parent(live), "E7: a known parent").await;
    assert_eq!(
        get(&store, child, "E7").await.parent,
        Some(live),
        "E7: a known parent is accepted"
    );
}
