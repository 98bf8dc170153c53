//! Rules V1–V4: the event stream, a namespace's ordered record of its jobs' state
//! changes and of the events their handlers emit, read from a cursor and resumed from
//! the last one a consumer saved.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use durq_core::events::{MAX_EVENTS_PAGE, MAX_EVENT_DATA_BYTES};
use durq_core::graph::Dependency;
use durq_core::{
    Bytes, Clock, Event, EventCursor, EventKind, JobId, JobState, NewJob, Retry, Store,
};

use super::support::{
    claim_expecting, enqueue, expect_invalid, expect_lease_lost, expect_not_found,
    expect_too_large, join_all, Must, TTL,
};
use crate::{Harness, TestEnv};

/// The queue the scenarios run their jobs in.
const QUEUE: &str = "v-events";

/// How many events the stores of these scenarios keep when they trim.
const KEEP: u64 = 100_000;

/// Every event of the namespace, read page by page from `after`, and whether any read
/// said events were trimmed.
async fn read_from(store: &Store, mut after: EventCursor, what: &str) -> (Vec<Event>, bool) {
    let mut events = Vec::new();
    let mut trimmed = false;
    loop {
        let page = store.events(after, MAX_EVENTS_PAGE).await.must(what);
        assert_page_after(&page.events, after, what);
        trimmed |= page.trimmed;
        if page.events.is_empty() {
            assert_eq!(
                page.next, after,
                "{what}: an empty page's next is its cursor"
            );
            return (events, trimmed);
        }
        after = page.next;
        events.extend(page.events);
    }
}

/// A page read after `after` holds only events after it, in cursor order.
fn assert_page_after(events: &[Event], after: EventCursor, what: &str) {
    if let Some(first) = events.first() {
        assert!(
            first.cursor > after,
            "{what}: a read after {after} answered {}, which is not after it",
            first.cursor
        );
    }
    assert_in_cursor_order(events, what);
}

/// The whole stream, from its start.
async fn read_all(store: &Store, what: &str) -> Vec<Event> {
    read_from(store, EventCursor::START, what).await.0
}

/// How long [`read_until`] waits for events to become readable.
const PATIENCE: Duration = Duration::from_secs(30);
/// The pause between two reads of [`read_until`]: a deliberate back-off, not a wait
/// for an expiry.
const POLL: Duration = Duration::from_millis(5);

/// The whole stream once `settled` holds of it, or as it stands after [`PATIENCE`].
///
/// V2 lets a backend answer an event only once no event with a smaller cursor can
/// still appear: PostgreSQL holds back what any older transaction of the cluster
/// might still precede, so an event may become readable a moment after the write that
/// made it returned. Once the last event a scenario waits for is readable, every
/// earlier one is (V2), so the assertions that follow see the whole stream.
async fn read_until(store: &Store, what: &str, settled: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let events = read_all(store, what).await;
        if settled(&events) || tokio::time::Instant::now() >= deadline {
            return events;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether `events` hold an event of `kind` for `job`.
fn has(events: &[Event], job: JobId, kind: EventKind) -> bool {
    events
        .iter()
        .any(|event| event.job == job && event.kind == kind)
}

/// The kinds recorded for `job`, in stream order.
fn kinds_of(events: &[Event], job: JobId) -> Vec<EventKind> {
    events
        .iter()
        .filter(|event| event.job == job)
        .map(|event| event.kind)
        .collect()
}

/// The kinds recorded for `job` with the attempt each carries, in stream order.
fn history_of(events: &[Event], job: JobId) -> Vec<(EventKind, u32)> {
    events
        .iter()
        .filter(|event| event.job == job)
        .map(|event| (event.kind, event.attempt))
        .collect()
}

/// Cursors strictly increasing, each event once.
fn assert_in_cursor_order(events: &[Event], what: &str) {
    for pair in events.windows(2) {
        assert!(
            pair[0].cursor < pair[1].cursor,
            "{what}: events must come in cursor order, each once: {} then {}",
            pair[0].cursor,
            pair[1].cursor
        );
    }
}

/// V1: every change of a recording job's state is recorded, with its kind and attempt,
/// whichever store makes it; a write that leaves the state records nothing; a job
/// enqueued through a store that does not record records nothing, ever; `emit` is
/// fenced by the lease and its name and data are checked, writing nothing when refused.
pub async fn v1_each_change_of_a_recording_job_is_recorded_in_order(harness: &dyn Harness) {
    use EventKind::*;
    let what = "V1";
    let env = TestEnv::new(harness);
    let recording = env.store_with(|s| s.record_events(KEEP)).await;
    // A second handle that does not record: the changes it makes to recording jobs are
    // recorded all the same, the jobs it enqueues never.
    let plain = env.store().await;

    // One job through a failure, a release and a success, with an emitted event.
    let a = enqueue(&recording, NewJob::new(QUEUE), what).await;
    let run = claim_expecting(&plain, QUEUE, a, what).await;
    plain.heartbeat(a, run.token(), TTL).await.must(what);
    plain
        .fail(a, run.token(), "first try", Retry::At(env.clock.now()))
        .await
        .must(what);
    let run = claim_expecting(&recording, QUEUE, a, what).await;
    recording.release(a, run.token()).await.must(what);
    let run = claim_expecting(&recording, QUEUE, a, what).await;
    recording
        .emit(a, run.token(), "progress.half", Bytes::from_static(b"50%"))
        .await
        .must(what);
    // A cancel request to a running job changes no state: nothing is recorded.
    assert_eq!(
        plain.cancel(a).await.must(what),
        JobState::Running,
        "{what}: a running job stays running when asked to stop"
    );
    recording.complete(a, run.token(), None).await.must(what);

    // One job cancelled while queued, retried, then dead on its one attempt.
    let b = enqueue(&recording, NewJob::new(QUEUE).max_attempts(1), what).await;
    assert_eq!(plain.cancel(b).await.must(what), JobState::Cancelled);
    plain.retry(b).await.must(what);
    let run = claim_expecting(&plain, QUEUE, b, what).await;
    plain
        .fail(b, run.token(), "no luck", Retry::Never)
        .await
        .must(what);

    // One job whose lease expires: reclaimed with attempts left, then snoozed.
    let c = enqueue(&recording, NewJob::new(QUEUE).max_attempts(5), what).await;
    claim_expecting(&plain, QUEUE, c, what).await;
    env.clock.advance(TTL + Duration::from_secs(1));
    let reclaimed = plain.reclaim(100).await.must(what);
    assert!(
        reclaimed.iter().any(|job| job.id == c),
        "{what}: the expired lease is reclaimed"
    );
    let run = claim_expecting(&plain, QUEUE, c, what).await;
    plain
        .snooze(c, run.token(), Duration::from_secs(3_600))
        .await
        .must(what);

    // A job enqueued through the store that does not record: nothing, through both.
    let quiet = enqueue(&plain, NewJob::new(QUEUE), what).await;
    let run = claim_expecting(&recording, QUEUE, quiet, what).await;
    recording
        .complete(quiet, run.token(), None)
        .await
        .must(what);

    // Emitting is fenced by the lease and checked; a refusal writes nothing.
    let before = read_until(&recording, what, |events| has(events, c, Released)).await;
    let stale = run.token();
    expect_lease_lost(
        recording
            .emit(a, stale, "late", Bytes::from_static(b"x"))
            .await,
        a,
        what,
    );
    let unknown = JobId::mint(env.clock.now());
    expect_not_found(
        recording
            .emit(unknown, stale, "late", Bytes::from_static(b"x"))
            .await,
        unknown,
        what,
    );
    let d = enqueue(&recording, NewJob::new(QUEUE), what).await;
    let run = claim_expecting(&recording, QUEUE, d, what).await;
    expect_invalid(
        recording
            .emit(d, run.token(), "has space", Bytes::new())
            .await,
        "event",
        what,
    );
    expect_too_large(
        recording
            .emit(
                d,
                run.token(),
                "big",
                Bytes::from(vec![1u8; MAX_EVENT_DATA_BYTES + 1]),
            )
            .await,
        "data",
        MAX_EVENT_DATA_BYTES + 1,
        MAX_EVENT_DATA_BYTES,
        what,
    );
    // A job that does not record its changes may still emit.
    let e = enqueue(&plain, NewJob::new(QUEUE), what).await;
    let e_run = claim_expecting(&plain, QUEUE, e, what).await;
    plain
        .emit(e, e_run.token(), "note", Bytes::new())
        .await
        .must(what);

    let events = read_until(&recording, what, |events| has(events, e, Emitted)).await;
    assert_in_cursor_order(&events, what);
    assert_eq!(
        history_of(&events, a),
        [
            (Enqueued, 0),
            (Started, 1),
            (Failed, 1),
            (Started, 2),
            (Released, 1),
            (Started, 2),
            (Emitted, 2),
            (Succeeded, 2),
        ],
        "{what}: a failure, a release and a success, each with the attempt after it"
    );
    assert_eq!(
        kinds_of(&events, b),
        [Enqueued, Cancelled, Retried, Started, Dead],
        "{what}: a cancel of a queued job, a retry and a death"
    );
    assert_eq!(
        kinds_of(&events, c),
        [Enqueued, Started, Failed, Started, Released],
        "{what}: a reclaim is a failure, a snooze a release"
    );
    assert!(
        kinds_of(&events, quiet).is_empty(),
        "{what}: a job enqueued by a store that does not record records nothing"
    );
    assert_eq!(
        kinds_of(&events, d),
        [Enqueued, Started],
        "{what}: refused emits record nothing"
    );
    assert_eq!(
        kinds_of(&events, e),
        [Emitted],
        "{what}: a job that does not record its changes records what it emits"
    );
    assert_eq!(
        &events[..before.len()],
        &before[..],
        "{what}: refused emits change nothing already recorded"
    );
    for event in &events {
        assert_eq!(event.queue, QUEUE, "{what}: each event carries its queue");
        let emitted = event.kind == Emitted;
        assert_eq!(
            event.name.is_some() && event.data.is_some(),
            emitted,
            "{what}: only emitted events carry a name and data: {event:?}"
        );
    }
    let half = events
        .iter()
        .find(|event| event.kind == Emitted && event.job == a)
        .must(what);
    assert_eq!(half.name.as_deref(), Some("progress.half"), "{what}");
    assert_eq!(half.data.as_deref(), Some(&b"50%"[..]), "{what}");

    // Dependencies: `ready` when what a job waits for succeeded, `cancelled` by G3's
    // cascade when it died.
    if recording.capabilities().dependencies {
        let jobs = recording
            .enqueue_batch(vec![
                NewJob::new(QUEUE),
                NewJob::new(QUEUE).after(Dependency::Earlier(0)),
                NewJob::new(QUEUE).max_attempts(1),
                NewJob::new(QUEUE).after(Dependency::Earlier(2)),
            ])
            .await
            .must(what);
        let ids: Vec<JobId> = jobs.iter().map(|job| job.id).collect();
        for (index, id) in [(0, ids[0]), (2, ids[2])] {
            let run = claim_expecting(&plain, QUEUE, id, what).await;
            if index == 0 {
                plain.complete(id, run.token(), None).await.must(what);
            } else {
                plain
                    .fail(id, run.token(), "gone", Retry::Never)
                    .await
                    .must(what);
            }
        }
        let events = read_until(&recording, what, |events| {
            has(events, ids[1], Ready) && has(events, ids[3], Cancelled)
        })
        .await;
        assert_eq!(
            kinds_of(&events, ids[1]),
            [Enqueued, Ready],
            "{what}: a waiting job becomes ready"
        );
        assert_eq!(
            kinds_of(&events, ids[3]),
            [Enqueued, Cancelled],
            "{what}: a waiting job is cancelled by the death of what it waits for"
        );
    } else {
        eprintln!("{what}: dependencies part skipped: the store does not keep them");
    }
}

/// V2: pages after a cursor come oldest first, in cursor order, and `next` resumes
/// exactly where a page ended, also from its text form on another handle; `limit` is
/// checked.
pub async fn v2_events_are_read_in_order_and_resumed_from_next(harness: &dyn Harness) {
    let what = "V2";
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.record_events(KEEP)).await;

    let mut ids = Vec::new();
    for _ in 0..25 {
        ids.push(enqueue(&store, NewJob::new(QUEUE), what).await);
    }
    read_until(&store, what, |events| events.len() >= 25).await;
    let first = store.events(EventCursor::START, 10).await.must(what);
    assert_eq!(
        first.events.len(),
        10,
        "{what}: a page holds `limit` events"
    );
    assert!(!first.trimmed, "{what}: nothing was trimmed");
    assert_eq!(
        first.next, first.events[9].cursor,
        "{what}: next is the last event's cursor"
    );
    let saved = first.next.to_string();

    // "After a restart": a new handle resumes from the saved text.
    let resumed = env.store_with(|s| s.record_events(KEEP)).await;
    let after: EventCursor = saved.parse().must(what);
    assert_eq!(
        after, first.next,
        "{what}: a cursor's text parses back to it"
    );
    let second = resumed.events(after, 10).await.must(what);
    let third = resumed.events(second.next, 10).await.must(what);
    assert_eq!(
        third.events.len(),
        5,
        "{what}: the last page holds the rest"
    );
    let empty = resumed.events(third.next, 10).await.must(what);
    assert!(
        empty.events.is_empty(),
        "{what}: nothing after the last event"
    );
    assert_eq!(
        empty.next, third.next,
        "{what}: an empty page keeps its cursor"
    );

    let read: Vec<Event> = [first.events, second.events, third.events].concat();
    assert_in_cursor_order(&read, what);
    assert_eq!(
        read.iter().map(|event| event.job).collect::<Vec<_>>(),
        ids,
        "{what}: each enqueue once, in the order they were made"
    );
    assert!(
        read.iter()
            .all(|event| event.kind == EventKind::Enqueued && event.cursor > EventCursor::START),
        "{what}: 25 enqueues, every cursor after START"
    );

    // A job's later changes come after its earlier ones, and after the cursor read.
    let run = claim_expecting(&store, QUEUE, ids[0], what).await;
    store.complete(ids[0], run.token(), None).await.must(what);
    read_until(&store, what, |events| {
        has(events, ids[0], EventKind::Succeeded)
    })
    .await;
    let later = store.events(third.next, 10).await.must(what);
    assert_eq!(
        later
            .events
            .iter()
            .map(|event| (event.job, event.kind))
            .collect::<Vec<_>>(),
        [(ids[0], EventKind::Started), (ids[0], EventKind::Succeeded)],
        "{what}: a consumer resuming from next sees each later event once, in order"
    );

    for limit in [0, MAX_EVENTS_PAGE + 1] {
        expect_invalid(store.events(EventCursor::START, limit).await, "limit", what);
    }
    expect_invalid("7".parse::<EventCursor>(), "cursor", what);
}

/// V3: a trim keeps the newest `keep` events; a read from before the newest deleted
/// one says it was trimmed and goes on from the oldest kept; any other read does not.
pub async fn v3_a_trim_keeps_the_newest_and_says_what_was_lost(harness: &dyn Harness) {
    let what = "V3";
    let env = TestEnv::new(harness);
    let store = env.store_with(|s| s.record_events(KEEP)).await;

    for _ in 0..10 {
        enqueue(&store, NewJob::new(QUEUE), what).await;
    }
    let all = read_until(&store, what, |events| events.len() >= 10).await;
    assert_eq!(all.len(), 10, "{what}: ten enqueues");
    expect_invalid(store.trim_events(0).await, "keep", what);
    assert_eq!(
        read_all(&store, what).await,
        all,
        "{what}: a refused trim deletes nothing"
    );

    assert_eq!(
        store.trim_events(4).await.must(what),
        6,
        "{what}: six deleted"
    );
    let (kept, trimmed) = read_from(&store, EventCursor::START, what).await;
    assert_eq!(kept, all[6..], "{what}: the newest four stay");
    assert!(
        trimmed,
        "{what}: a read from the start missed the trimmed events"
    );
    // A consumer that had read three events missed three.
    let (rest, trimmed) = read_from(&store, all[2].cursor, what).await;
    assert!(trimmed, "{what}: a consumer behind the trim is told");
    assert_eq!(rest, all[6..], "{what}: and goes on from the oldest kept");
    // One that had read up to the newest deleted event missed nothing.
    let (rest, trimmed) = read_from(&store, all[5].cursor, what).await;
    assert!(!trimmed, "{what}: a consumer past the trim missed nothing");
    assert_eq!(rest, all[6..], "{what}");

    assert_eq!(
        store.trim_events(4).await.must(what),
        0,
        "{what}: a trim with nothing to delete deletes nothing"
    );
    assert_eq!(
        store.trim_events(u64::MAX).await.must(what),
        0,
        "{what}: a trim keeping more than there are deletes nothing"
    );
    assert_eq!(store.trim_events(1).await.must(what), 3, "{what}");
    let (kept, _) = read_from(&store, all[5].cursor, what).await;
    assert_eq!(kept, all[9..], "{what}: the newest event stays");
    assert!(
        read_from(&store, all[5].cursor, what).await.1,
        "{what}: the second trim moved what counts as missed"
    );
}

/// The writers of [`v4_writers_and_a_reader_see_each_event_once_in_order`].
const WRITERS: usize = 16;
/// The jobs each writer runs to success.
const JOBS_PER_WRITER: usize = 6;
/// The events the writers record: three per job.
const EVENTS: usize = WRITERS * JOBS_PER_WRITER * 3;

/// V4: 16 writers enqueue, claim and complete jobs at once, each on a handle of its
/// own, while a reader follows the stream from `next`. The reader's recorded history
/// holds each event once, skips none (it equals a read of the whole stream
/// afterwards), and holds each job's events in the order of its changes.
pub async fn v4_writers_and_a_reader_see_each_event_once_in_order(harness: &dyn Harness) {
    let what = "V4";
    let env = TestEnv::new(harness);
    let reader_store = env.store_with(|s| s.record_events(KEEP)).await;

    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let store = reader_store.clone();
        let finished = finished.clone();
        tokio::spawn(async move {
            let mut history: Vec<Event> = Vec::new();
            let mut after = EventCursor::START;
            let give_up = std::sync::OnceLock::new();
            loop {
                // Read once more after the writers finished, so the history ends with
                // the stream's end.
                let last_round = finished.load(std::sync::atomic::Ordering::SeqCst);
                let page = store.events(after, 64).await.must(what);
                assert_page_after(&page.events, after, what);
                let empty = page.events.is_empty();
                after = page.next;
                history.extend(page.events);
                if empty && last_round {
                    // Events may still become readable (see `read_until`): the reader
                    // stops once it has seen them all, or once patience runs out.
                    let deadline = *give_up.get_or_init(|| tokio::time::Instant::now() + PATIENCE);
                    if history.len() >= EVENTS || tokio::time::Instant::now() >= deadline {
                        return history;
                    }
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                // Not a sleep: the next turn of the scheduler, so the writers run.
                tokio::task::yield_now().await;
            }
        })
    };

    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let store = env.store_with(|s| s.record_events(KEEP)).await;
        let queue = format!("{QUEUE}-{writer}");
        writers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..JOBS_PER_WRITER {
                let id = enqueue(&store, NewJob::new(queue.as_str()), what).await;
                tokio::task::yield_now().await;
                let run = claim_expecting(&store, &queue, id, what).await;
                tokio::task::yield_now().await;
                store.complete(id, run.token(), None).await.must(what);
                tokio::task::yield_now().await;
                ids.push(id);
            }
            ids
        }));
    }
    let ids: Vec<JobId> = join_all(writers).await.into_iter().flatten().collect();
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    let history = join_all(vec![reader]).await.remove(0);

    let seen: BTreeSet<EventCursor> = history.iter().map(|event| event.cursor).collect();
    assert_eq!(
        seen.len(),
        history.len(),
        "{what}: the reader saw an event twice"
    );
    assert_in_cursor_order(&history, what);
    let whole = read_until(&reader_store, what, |events| events.len() >= EVENTS).await;
    assert_eq!(
        history.len(),
        whole.len(),
        "{what}: the reader skipped {} events the stream holds",
        whole.len().saturating_sub(history.len())
    );
    assert_eq!(history, whole, "{what}: the reader's history is the stream");
    assert_eq!(whole.len(), EVENTS, "{what}: three events per job");
    let mut per_job: BTreeMap<JobId, Vec<EventKind>> = BTreeMap::new();
    for event in &history {
        per_job.entry(event.job).or_default().push(event.kind);
    }
    for id in ids {
        assert_eq!(
            per_job.get(&id).map(Vec::as_slice),
            Some(
                &[
                    EventKind::Enqueued,
                    EventKind::Started,
                    EventKind::Succeeded
                ][..]
            ),
            "{what}: job {id}'s events in the order of its changes"
        );
    }
}
