//! The event stream on PostgreSQL (CONTRACT V1–V4, migration 15): each kind recorded by
//! the statement that really makes the change (the trigger's mirror of
//! `EventKind::of_change` held to it for every pair of states), the mark deciding and
//! not the store, `emit` fenced by the lease, trims, the (xid, seq) cursor against
//! transactions that commit out of order, many writers on many pools followed by a
//! reader, and the upgrade of a schema at version 14.

use super::*;
use durq_core::{Bytes, Event, EventCursor, EventKind, QueueLimits};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

/// How many events a recording store's purge loop would keep: never reached here.
const KEEP: u64 = 1_000_000;

/// Settings of a store that records events (`settings`, with the mark).
fn recording(clock: &ManualClock) -> StoreSettings {
    settings(clock).record_events(KEEP)
}

/// A job's events as (kind, attempt), in stream order.
type Story = Vec<(EventKind, u32)>;

/// Each job's story in `events`.
fn stories<'e>(events: impl IntoIterator<Item = &'e Event>) -> HashMap<JobId, Story> {
    let mut stories: HashMap<JobId, Story> = HashMap::new();
    for event in events {
        stories
            .entry(event.job)
            .or_default()
            .push((event.kind, event.attempt));
    }
    stories
}

/// Claims the one ready job of `queue`; answers its token.
async fn take(store: &Store, queue: &str) -> LeaseToken {
    let held = store
        .claim(ClaimRequest::new([queue], "w", TTL))
        .await
        .expect("claim");
    assert_eq!(held.len(), 1, "one job of {queue} is claimed");
    held[0].token()
}

async fn enqueue(store: &Store, job: NewJob) -> JobId {
    store.enqueue(job).await.expect("enqueue").id
}

/// The event rows of `namespace` in the default schema, read from the table itself
/// (whatever the read's horizon).
async fn event_rows(backend: &PostgresPool, namespace: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs.events WHERE namespace = $1")
        .bind(namespace)
        .fetch_one(backend.pool())
        .await
        .expect("count event rows")
}

/// The trim record of `namespace`, as a cursor.
async fn trimmed_through(backend: &PostgresPool, namespace: &str) -> Option<EventCursor> {
    let row: Option<(String, i64)> =
        sqlx::query_as("SELECT xid::text, seq FROM jobs.events_trimmed WHERE namespace = $1")
            .bind(namespace)
            .fetch_optional(backend.pool())
            .await
            .expect("read the trim record");
    row.map(|(xid, seq)| {
        EventCursor::new(
            xid.parse().expect("an xid8"),
            u64::try_from(seq).expect("positive"),
        )
    })
}

/// The jobs of `namespace` that carry the mark (anything but NULL).
async fn marked_rows(backend: &PostgresPool, namespace: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM jobs.jobs WHERE namespace = $1 AND records_events IS NOT NULL",
    )
    .bind(namespace)
    .fetch_one(backend.pool())
    .await
    .expect("count marked rows")
}

/// The whole stream of the store's namespace as it reads now, from the start.
async fn read_all(store: &Store) -> Vec<Event> {
    let mut all = Vec::new();
    let mut after = EventCursor::START;
    loop {
        let page = store.events(after, 1_000).await.expect("read events");
        if page.events.is_empty() {
            return all;
        }
        after = page.next;
        all.extend(page.events);
    }
}

/// A consumer of a namespace's stream: each read from the last read's `next`, every
/// event kept in `history`.
struct Follower {
    store: Store,
    next: EventCursor,
    history: Vec<Event>,
    /// The jobs `catch_up` enqueued to know where the stream stood.
    sentinels: HashSet<JobId>,
}

/// The pause between two empty reads of [`Follower::catch_up`] while another
/// transaction of the cluster holds the read horizon back (CONTRACT V2).
const HORIZON_BACK_OFF: Duration = Duration::from_millis(2);

impl Follower {
    /// Follows the stream of `store`'s namespace from its start; `store` records events
    /// (its sentinels must be recorded).
    fn new(store: Store) -> Self {
        assert!(store.settings().records_events());
        Follower {
            store,
            next: EventCursor::START,
            history: Vec::new(),
            sentinels: HashSet::new(),
        }
    }

    /// One read of up to `limit` events from `next`; none was trimmed.
    async fn read(&mut self, limit: usize) -> usize {
        let page = self
            .store
            .events(self.next, limit)
            .await
            .expect("read events");
        assert!(!page.trimmed, "nothing was trimmed");
        assert!(page.next >= self.next, "next never goes back");
        let read = page.events.len();
        self.next = page.next;
        self.history.extend(page.events);
        read
    }

    /// Reads until every event committed before the call has been read, and answers
    /// the events this call read, the sentinel's left out. The sentinel: a job enqueued
    /// now, whose transaction gets its id after every one that committed before, so its
    /// event's key is above all of theirs; once it is read, so is every one of theirs.
    async fn catch_up(&mut self) -> Vec<Event> {
        let sentinel = enqueue(&self.store, NewJob::new("sentinel")).await;
        self.sentinels.insert(sentinel);
        let from = self.history.len();
        let reading = async {
            while !self.history[from..].iter().any(|e| e.job == sentinel) {
                if self.read(1_000).await == 0 {
                    // Another test's transaction may hold the horizon back for a moment:
                    // a deliberate back-off while it ends, not a wait for an expiry.
                    tokio::time::sleep(HORIZON_BACK_OFF).await;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), reading)
            .await
            .expect("the sentinel's event became readable");
        self.history[from..]
            .iter()
            .filter(|e| !self.sentinels.contains(&e.job))
            .cloned()
            .collect()
    }
}

/// CONTRACT V1: every kind, each by the statement that really makes the change: the
/// gathered and the batched enqueue, the graph's, the caller's transaction's; a plain
/// and a limited claim; completion (batched and in the caller's transaction), failure
/// with and without a retry, release, snooze, reclaim with an attempt left and on the
/// last, cancel of a queued job and of a running one its holder then fails, the G1
/// release of a waiting job, the G3 cascade down a chain, retry (A2) and reopen (D3).
/// A heartbeat, a cancel request to a running job and a saved step record nothing; a
/// job cancelled at its enqueue records its enqueue only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_records_its_kind_by_its_own_statement() {
    use EventKind as K;
    let Some(backend) = backend("durq-postgres-events-kinds", 4).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = recording(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings.clone());
    let mut expected: HashMap<JobId, Story> = HashMap::new();

    // Completed, through what records nothing: a heartbeat and a saved step. An
    // emitted event; then a reopen from the step (D3).
    let ok = enqueue(&store, NewJob::new("ok")).await;
    let token = take(&store, "ok").await;
    store.heartbeat(ok, token, TTL).await.expect("heartbeat");
    store
        .save_step(ok, token, "s", Bytes::from_static(b"1"))
        .await
        .expect("save a step");
    let emitted_at = clock.now();
    store
        .emit(ok, token, "progress", Bytes::from_static(b"half"))
        .await
        .expect("emit");
    store.complete(ok, token, None).await.expect("complete");
    store.retry_from(ok, "s", 0).await.expect("reopen");
    expected.insert(
        ok,
        vec![
            (K::Enqueued, 0),
            (K::Started, 1),
            (K::Emitted, 1),
            (K::Succeeded, 1),
            (K::Retried, 0),
        ],
    );

    // A failure with a retry, then the last attempt's; then an operator's retry (A2).
    let fails = enqueue(&store, NewJob::new("fails").max_attempts(2)).await;
    for expect in [JobState::Queued, JobState::Dead] {
        let token = take(&store, "fails").await;
        let state = store
            .fail(fails, token, "boom", Retry::At(clock.now()))
            .await
            .expect("fail");
        assert_eq!(state, expect);
    }
    store.retry(fails).await.expect("retry");
    expected.insert(
        fails,
        vec![
            (K::Enqueued, 0),
            (K::Started, 1),
            (K::Failed, 1),
            (K::Started, 2),
            (K::Dead, 2),
            (K::Retried, 0),
        ],
    );

    // A release and a snooze give the attempt back.
    let given_back = enqueue(&store, NewJob::new("given-back")).await;
    let token = take(&store, "given-back").await;
    store.release(given_back, token).await.expect("release");
    let token = take(&store, "given-back").await;
    store
        .snooze(given_back, token, Duration::from_secs(1))
        .await
        .expect("snooze");
    clock.advance(Duration::from_secs(1));
    let token = take(&store, "given-back").await;
    store
        .complete(given_back, token, None)
        .await
        .expect("complete");
    expected.insert(
        given_back,
        vec![
            (K::Enqueued, 0),
            (K::Started, 1),
            (K::Released, 0),
            (K::Started, 1),
            (K::Released, 0),
            (K::Started, 1),
            (K::Succeeded, 1),
        ],
    );

    // Reclaim: an expired lease with an attempt left fails, on the last it dies. The
    // clock is driven past the lease; nothing else runs meanwhile.
    let lost = enqueue(&store, NewJob::new("lost").max_attempts(2)).await;
    for expect in [JobState::Queued, JobState::Dead] {
        take(&store, "lost").await;
        clock.advance(TTL + Duration::from_millis(1));
        let reclaimed = store.reclaim(10).await.expect("reclaim");
        assert_eq!(
            reclaimed
                .iter()
                .map(|r| (r.id, r.state))
                .collect::<Vec<_>>(),
            [(lost, expect)]
        );
    }
    expected.insert(
        lost,
        vec![
            (K::Enqueued, 0),
            (K::Started, 1),
            (K::Failed, 1),
            (K::Started, 2),
            (K::Dead, 2),
        ],
    );

    // Cancel: a queued job at once (then retried); a running one only when its holder
    // ends it, its cancel request recording nothing.
    let cancelled = enqueue(&store, NewJob::new("cancelled")).await;
    assert_eq!(
        store.cancel(cancelled).await.expect("cancel"),
        JobState::Cancelled
    );
    store.retry(cancelled).await.expect("retry");
    expected.insert(
        cancelled,
        vec![(K::Enqueued, 0), (K::Cancelled, 0), (K::Retried, 0)],
    );
    let stopped = enqueue(&store, NewJob::new("stopped")).await;
    let token = take(&store, "stopped").await;
    assert_eq!(
        store.cancel(stopped).await.expect("cancel"),
        JobState::Running
    );
    let state = store
        .fail(stopped, token, "stopped", Retry::At(clock.now()))
        .await
        .expect("fail");
    assert_eq!(state, JobState::Cancelled);
    expected.insert(
        stopped,
        vec![(K::Enqueued, 0), (K::Started, 1), (K::Cancelled, 1)],
    );

    // G1: a waiting job is ready once its dependency succeeds.
    let first = enqueue(&store, NewJob::new("dep-first")).await;
    let then = enqueue(&store, NewJob::new("dep-then").after(first)).await;
    let token = take(&store, "dep-first").await;
    store.complete(first, token, None).await.expect("complete");
    expected.insert(
        first,
        vec![(K::Enqueued, 0), (K::Started, 1), (K::Succeeded, 1)],
    );
    expected.insert(then, vec![(K::Enqueued, 0), (K::Ready, 0)]);

    // G3: a dead dependency cancels the chain waiting for it, by the trigger's cascade;
    // a job enqueued after, waiting for it, starts cancelled: its enqueue only.
    let root = enqueue(&store, NewJob::new("dep-root")).await;
    let middle = enqueue(&store, NewJob::new("dep-middle").after(root)).await;
    let leaf = enqueue(&store, NewJob::new("dep-leaf").after(middle)).await;
    let token = take(&store, "dep-root").await;
    store
        .fail(root, token, "no", Retry::Never)
        .await
        .expect("fail");
    let late = enqueue(&store, NewJob::new("dep-late").after(root)).await;
    assert_eq!(
        store.get(late).await.expect("get").state,
        JobState::Cancelled
    );
    expected.insert(root, vec![(K::Enqueued, 0), (K::Started, 1), (K::Dead, 1)]);
    expected.insert(middle, vec![(K::Enqueued, 0), (K::Cancelled, 0)]);
    expected.insert(leaf, vec![(K::Enqueued, 0), (K::Cancelled, 0)]);
    expected.insert(late, vec![(K::Enqueued, 0)]);

    // A batch (the checked statement: a key), one of its jobs waiting for the other
    // (the graph's statements); a limited claim, by flow control's own statement.
    let batch = store
        .enqueue_batch(vec![
            NewJob::new("limited").idempotency_key("k"),
            NewJob::new("batch-waits").after(durq_core::Dependency::Earlier(0)),
        ])
        .await
        .expect("enqueue a batch");
    store
        .set_limits("limited", QueueLimits::new().max_running(1))
        .await
        .expect("set limits");
    take(&store, "limited").await;
    expected.insert(batch[0].id, vec![(K::Enqueued, 0), (K::Started, 1)]);
    expected.insert(batch[1].id, vec![(K::Enqueued, 0)]);

    // The caller's transaction: enqueued in one, completed in another.
    let handle = backend.backend(settings.clone()).expect("backend");
    let mut tx = backend.pool().begin().await.expect("begin");
    let in_tx = handle
        .enqueue_in(&mut tx, NewJob::new("in-tx"))
        .await
        .expect("enqueue in a transaction")
        .id;
    let both = handle
        .enqueue_batch_in(&mut tx, vec![NewJob::new("in-tx-batch")])
        .await
        .expect("enqueue a batch in a transaction");
    tx.commit().await.expect("commit");
    let token = take(&store, "in-tx").await;
    let mut tx = backend.pool().begin().await.expect("begin");
    let _completed = handle
        .complete_in(&mut tx, in_tx, token, None)
        .await
        .expect("complete in a transaction");
    tx.commit().await.expect("commit");
    expected.insert(
        in_tx,
        vec![(K::Enqueued, 0), (K::Started, 1), (K::Succeeded, 1)],
    );
    expected.insert(both[0].id, vec![(K::Enqueued, 0)]);

    let mut follower = Follower::new(store.clone());
    let events = follower.catch_up().await;
    assert_eq!(stories(&events), expected);
    for event in &events {
        let job = store.get(event.job).await.expect("get");
        assert_eq!(event.queue, job.queue);
        if event.kind == K::Emitted {
            assert_eq!(event.name.as_deref(), Some("progress"));
            assert_eq!(event.data, Some(Bytes::from_static(b"half")));
            assert_eq!(event.recorded_at, emitted_at, "the store's clock");
        } else {
            assert_eq!((&event.name, &event.data), (&None, &None), "{event:?}");
            // The server's clock: later than 2020, whatever the manual clock says.
            assert!(
                event.recorded_at.as_millis() > 1_577_836_800_000,
                "{event:?}"
            );
        }
        assert_eq!(
            event.cursor.to_string().parse::<EventCursor>().ok(),
            Some(event.cursor),
            "the cursor's text reads back"
        );
    }
    assert!(
        events.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "in cursor order"
    );

    clean_up(&backend, &namespace).await;
}

/// CONTRACT V1: the mark is the job's, from its enqueue: a store that does not record
/// events writes nothing of the stream (no event, no mark, no key on its jobs, every
/// enqueue path), a job it enqueued records nothing when a recording store changes it,
/// and a job a recording store enqueued records every change, whichever store makes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_records_by_its_mark_not_by_the_store_that_changes_it() {
    use EventKind as K;
    let Some(backend) = backend("durq-postgres-events-mark", 3).await else {
        return;
    };
    let clock = ManualClock::default();
    let plain_settings = settings(&clock);
    let namespace = plain_settings.namespace.clone();
    let plain = open(&backend, plain_settings.clone());
    let recorder = open(&backend, plain_settings.clone().record_events(KEEP));

    // Everything a store that does not record does, on every enqueue path.
    let unmarked = enqueue(&plain, NewJob::new("plain")).await;
    enqueue(&plain, NewJob::new("plain").idempotency_key("k")).await;
    let waits = enqueue(&plain, NewJob::new("plain-waits").after(unmarked)).await;
    plain
        .enqueue_batch(vec![NewJob::new("plain-batch"), NewJob::new("plain-batch")])
        .await
        .expect("enqueue a batch");
    let handle = backend.backend(plain_settings.clone()).expect("backend");
    let mut tx = backend.pool().begin().await.expect("begin");
    let in_tx = handle
        .enqueue_in(&mut tx, NewJob::new("plain-tx"))
        .await
        .expect("enqueue in a transaction")
        .id;
    tx.commit().await.expect("commit");
    let token = take(&plain, "plain-tx").await;
    plain
        .fail(in_tx, token, "x", Retry::Never)
        .await
        .expect("fail");
    assert_eq!(
        (
            event_rows(&backend, &namespace).await,
            marked_rows(&backend, &namespace).await
        ),
        (0, 0),
        "no event, no mark, no key"
    );

    // A recording store changes unmarked jobs: nothing either.
    plain.cancel(waits).await.expect("cancel");
    let claimed = recorder
        .claim(ClaimRequest::new(["plain"], "w", TTL).limit(2))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    for job in &claimed {
        recorder
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
    }
    assert_eq!(event_rows(&backend, &namespace).await, 0);

    // A marked job, changed by the store that does not record.
    let marked = enqueue(&recorder, NewJob::new("marked")).await;
    let token = take(&plain, "marked").await;
    plain.complete(marked, token, None).await.expect("complete");

    let mut follower = Follower::new(recorder.clone());
    let events = follower.catch_up().await;
    assert_eq!(
        stories(&events),
        HashMap::from([(
            marked,
            vec![(K::Enqueued, 0), (K::Started, 1), (K::Succeeded, 1)]
        )])
    );
    assert_eq!(
        marked_rows(&backend, &namespace).await,
        2,
        "the marked job and the sentinel"
    );

    clean_up(&backend, &namespace).await;
}

/// CONTRACT V1: `emit` is fenced by the lease as a saved step is (D1): a stale token
/// is `LeaseLost` and an unknown job `NotFound`, writing nothing (no event, no key
/// moved); so is a token whose lease ended (a completion, a reclaim), and an emit
/// that waited for the row lock of a completion in flight finds the lease gone once
/// it commits. A job that does not record its changes emits all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emit_is_fenced_by_the_lease_and_writes_nothing_when_refused() {
    const APP: &str = "durq-postgres-events-emit";
    let (Some(backend), Some(admin)) = (backend(APP, 3).await, admin().await) else {
        return;
    };
    let clock = ManualClock::default();
    let plain_settings = settings(&clock);
    let namespace = plain_settings.namespace.clone();
    let store = open(&backend, plain_settings.clone());
    let data = Bytes::from_static(b"{\"done\":1}");

    let job = enqueue(&store, NewJob::new("emit")).await;
    let token = take(&store, "emit").await;
    let stale = LeaseToken::new(token.get() + 1);
    let answer = store.emit(job, stale, "e", data.clone()).await;
    assert!(matches!(answer, Err(Error::LeaseLost { .. })), "{answer:?}");
    let answer = store
        .emit(JobId::mint(clock.now()), token, "e", data.clone())
        .await;
    assert!(
        answer.as_ref().is_err_and(Error::is_not_found),
        "{answer:?}"
    );
    assert_eq!(
        (
            event_rows(&backend, &namespace).await,
            marked_rows(&backend, &namespace).await
        ),
        (0, 0),
        "a refused emit writes nothing"
    );
    let answer = store.emit(job, token, "bad name", data.clone()).await;
    assert_eq!(
        answer.err().and_then(|e| e.invalid_field()),
        Some("event"),
        "refused by the handle"
    );

    let emitted_at = clock.now();
    store
        .emit(job, token, "half:way", data.clone())
        .await
        .expect("emit");
    store.complete(job, token, None).await.expect("complete");
    let answer = store.emit(job, token, "late", data.clone()).await;
    assert!(matches!(answer, Err(Error::LeaseLost { .. })), "{answer:?}");

    // A lease reclaimed: its token emits nothing more.
    let reclaimed = enqueue(&store, NewJob::new("reclaimed")).await;
    let old = take(&store, "reclaimed").await;
    clock.advance(TTL + Duration::from_millis(1));
    assert_eq!(store.reclaim(10).await.expect("reclaim").len(), 1);
    let answer = store.emit(reclaimed, old, "late", data.clone()).await;
    assert!(matches!(answer, Err(Error::LeaseLost { .. })), "{answer:?}");

    // An emit that waits for a completion in the caller's transaction.
    let fenced = enqueue(&store, NewJob::new("fenced")).await;
    let token = take(&store, "fenced").await;
    let mut holder = backend.pool().begin().await.expect("begin");
    let _completed = backend
        .backend(plain_settings.clone())
        .expect("backend")
        .complete_in(&mut holder, fenced, token, None)
        .await
        .expect("complete in the transaction");
    let emitting = {
        let store = store.clone();
        let data = data.clone();
        tokio::spawn(async move { store.emit(fenced, token, "late", data).await })
    };
    until_waiting_for_a_lock(&admin, APP).await;
    holder.commit().await.expect("commit the completion");
    let answer = emitting.await.expect("the emit's task");
    assert!(matches!(answer, Err(Error::LeaseLost { .. })), "{answer:?}");

    assert_eq!(event_rows(&backend, &namespace).await, 1, "the one emitted");
    let recorder = open(&backend, plain_settings.record_events(KEEP));
    let mut follower = Follower::new(recorder);
    let events = follower.catch_up().await;
    assert_eq!(events.len(), 1, "{events:?}");
    let emitted = &events[0];
    assert_eq!(
        (
            emitted.job,
            emitted.queue.as_str(),
            emitted.kind,
            emitted.attempt,
            emitted.name.as_deref(),
            emitted.data.as_ref(),
            emitted.recorded_at
        ),
        (
            job,
            "emit",
            EventKind::Emitted,
            1,
            Some("half:way"),
            Some(&data),
            emitted_at
        ),
        "the store's clock, for the event the backend writes itself"
    );

    clean_up(&backend, &namespace).await;
}

/// CONTRACT V3 on PostgreSQL: a trim deletes the oldest so the newest `keep` stay,
/// records the newest it deleted, and answers the count; a read after a cursor before
/// that record says `trimmed` and goes on from the oldest kept, any other does not.
/// Purge (A5) leaves the events of the jobs it deletes; `drop_namespace` deletes the
/// namespace's events and its trim record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trims_keep_the_newest_and_reads_say_what_was_trimmed() {
    let Some(backend) = backend("durq-postgres-events-trim", 2).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = recording(&clock).retention(Duration::from_secs(60));
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    for _ in 0..9 {
        enqueue(&store, NewJob::new("t")).await;
    }
    let mut follower = Follower::new(store.clone());
    assert_eq!(follower.catch_up().await.len(), 9);
    let all = read_all(&store).await;
    assert_eq!(all, follower.history, "nine enqueues and the sentinel's");
    assert_eq!(all.len(), 10);
    assert_eq!(trimmed_through(&backend, &namespace).await, None);

    assert_eq!(store.trim_events(4).await.expect("trim"), 6);
    assert_eq!(
        trimmed_through(&backend, &namespace).await,
        Some(all[5].cursor)
    );
    let from_start = store.events(EventCursor::START, 100).await.expect("read");
    assert!(from_start.trimmed);
    assert_eq!(from_start.events, all[6..], "from the oldest kept");
    let from_last_deleted = store.events(all[5].cursor, 100).await.expect("read");
    assert!(!from_last_deleted.trimmed, "nothing after it was deleted");
    assert_eq!(from_last_deleted.events, all[6..]);
    let from_before = store.events(all[4].cursor, 2).await.expect("read");
    assert!(from_before.trimmed);
    assert_eq!(from_before.events, all[6..8]);
    assert_eq!(from_before.next, all[7].cursor);

    assert_eq!(
        store.trim_events(4).await.expect("trim"),
        0,
        "no more than 4"
    );
    assert_eq!(
        trimmed_through(&backend, &namespace).await,
        Some(all[5].cursor),
        "a trim that deletes nothing leaves the record"
    );
    assert_eq!(store.trim_events(1).await.expect("trim"), 3);
    assert_eq!(
        trimmed_through(&backend, &namespace).await,
        Some(all[8].cursor)
    );
    assert!(store.events(all[5].cursor, 10).await.expect("read").trimmed);
    assert_eq!(read_all(&store).await, all[9..]);

    // Purge deletes a job, not its events.
    let held = store
        .claim(ClaimRequest::new(["t"], "w", TTL))
        .await
        .expect("claim");
    let done = held[0].id();
    store
        .complete(done, held[0].token(), None)
        .await
        .expect("complete");
    let before = event_rows(&backend, &namespace).await;
    clock.advance(Duration::from_secs(60));
    assert_eq!(store.purge(10).await.expect("purge"), 1);
    assert!(store.get(done).await.is_err_and(|e| e.is_not_found()));
    assert_eq!(event_rows(&backend, &namespace).await, before);

    clean_up(&backend, &namespace).await;
    assert_eq!(event_rows(&backend, &namespace).await, 0);
    assert_eq!(trimmed_through(&backend, &namespace).await, None);
}

/// CONTRACT V2, the case that motivates the key: a transaction that got its id first
/// (a caller's transaction that wrote something) changes a job after a younger one
/// did. Keyed by its own id, its event would come before the younger one's; the key
/// is the greatest of its id and the newest id that had ended once it held the job's
/// row (`event_key`, migration 15), the younger one's included, so the job's events
/// read in the order of its changes. Twice: after a claim (keyed by the trigger) and
/// after an emitted event (keyed by `emit`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_transaction_that_changes_a_job_later_orders_after_its_changes() {
    use EventKind as K;
    let Some(backend) = backend("durq-postgres-events-order", 3).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = recording(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings.clone());
    let handle = backend.backend(settings).expect("backend");

    let mut expected = HashMap::new();
    let mut old_ids = HashMap::new();
    for emits in [false, true] {
        let job = enqueue(&store, NewJob::new("order")).await;
        // The caller's transaction gets its id, as its first write does.
        let mut old = backend.pool().begin().await.expect("begin");
        let old_id: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
            .fetch_one(&mut *old)
            .await
            .expect("the transaction's id");
        let old_id: u64 = old_id.parse().expect("an xid8");
        // Younger transactions change the job.
        let token = take(&store, "order").await;
        if emits {
            store
                .emit(job, token, "young", Bytes::new())
                .await
                .expect("emit");
        }
        // The old transaction completes it.
        let _completed = handle
            .complete_in(&mut old, job, token, None)
            .await
            .expect("complete in the old transaction");
        old.commit().await.expect("commit");

        let mut story = vec![(K::Enqueued, 0), (K::Started, 1)];
        if emits {
            story.push((K::Emitted, 1));
        }
        story.push((K::Succeeded, 1));
        expected.insert(job, story);
        old_ids.insert(job, old_id);
    }

    let mut follower = Follower::new(store.clone());
    let events = follower.catch_up().await;
    assert_eq!(stories(&events), expected, "each job's events in order");
    for (job, old_id) in &old_ids {
        let of_job: Vec<&Event> = events.iter().filter(|e| e.job == *job).collect();
        let [.., younger, succeeded] = of_job[..] else {
            panic!("too few events: {of_job:?}");
        };
        assert!(
            younger.cursor.high() > *old_id,
            "the younger change's key is above the old transaction's id"
        );
        assert!(
            succeeded.cursor.high() >= younger.cursor.high(),
            "the old transaction's event is keyed past its own id: {} after {}",
            succeeded.cursor,
            younger.cursor
        );
        assert!(younger.cursor < succeeded.cursor);
    }

    clean_up(&backend, &namespace).await;
}

/// CONTRACT V2: a read answers no event of an open transaction, nor any event after it,
/// even committed: the events of three enqueues that commit while a transaction that
/// wrote an event before them is open are held back; once it commits, all four appear,
/// its own first (its key is the lowest), each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_holds_back_every_event_after_its_own() {
    let Some(backend) = backend("durq-postgres-events-open", 3).await else {
        return;
    };
    let clock = ManualClock::default();
    let settings = recording(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings.clone());
    let mut follower = Follower::new(store.clone());
    let before = enqueue(&store, NewJob::new("before")).await;
    let read = follower.catch_up().await;
    assert_eq!(
        read.iter().map(|e| e.job).collect::<Vec<_>>(),
        [before],
        "what committed before is readable once it is final"
    );

    let mut open_tx = backend.pool().begin().await.expect("begin");
    let in_open = backend
        .backend(settings)
        .expect("backend")
        .enqueue_in(&mut open_tx, NewJob::new("open"))
        .await
        .expect("enqueue in the open transaction")
        .id;
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(enqueue(&store, NewJob::new("after")).await);
    }
    let committed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs.events WHERE namespace = $1 AND queue = 'after'",
    )
    .bind(&namespace)
    .fetch_one(backend.pool())
    .await
    .expect("count");
    assert_eq!(committed, 3, "the later events are committed");
    for _ in 0..5 {
        assert_eq!(follower.read(1_000).await, 0, "held back while it is open");
    }

    open_tx.commit().await.expect("commit");
    let read = follower.catch_up().await;
    let mut expected = vec![in_open];
    expected.extend(&after);
    assert_eq!(
        read.iter().map(|e| e.job).collect::<Vec<_>>(),
        expected,
        "all of them, the open transaction's first"
    );
    assert_eq!(read_all(&store).await, follower.history, "each once");

    clean_up(&backend, &namespace).await;
}

/// CONTRACT V4 on PostgreSQL: 16 writers, four to a pool (so on 16 connections of four
/// pools, as processes would be), each running its jobs through a cycle of paths
/// (completion, failure and retry, release, and completion in a caller's transaction
/// that got its id before the claim), emitting on the way, while a reader on a pool of
/// its own follows the stream from `next` in small pages. The reader's history holds
/// each event once, in cursor order, equals a read of the whole stream afterwards,
/// and holds each job's events in the order of its changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_following_many_writers_sees_each_event_once_in_order() {
    use EventKind as K;
    const POOLS: usize = 4;
    const WRITERS: usize = 16;
    const JOBS: usize = 12;
    let Some(reader_pool) = backend("durq-postgres-events-v4", 2).await else {
        return;
    };
    let mut pools = Vec::new();
    for _ in 0..POOLS {
        let Some(pool) = backend("durq-postgres-events-v4", 5).await else {
            return;
        };
        pools.push(pool);
    }
    let clock = ManualClock::default();
    let settings = recording(&clock);
    let namespace = settings.namespace.clone();

    let start = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut writers = JoinSet::new();
    for writer in 0..WRITERS {
        let pool = pools[writer % POOLS].clone();
        let settings = settings.clone();
        let clock = clock.clone();
        let start = Arc::clone(&start);
        writers.spawn(async move {
            let store = open(&pool, settings.clone());
            let handle = pool.backend(settings).expect("backend");
            let queue = format!("w{writer}");
            let mut expected: HashMap<JobId, Story> = HashMap::new();
            start.wait().await;
            for round in 0..JOBS {
                let job = enqueue(&store, NewJob::new(queue.as_str())).await;
                let data = Bytes::from(format!("{writer}-{round}"));
                let story = match round % 4 {
                    0 => {
                        let token = take(&store, &queue).await;
                        store.emit(job, token, "e", data).await.expect("emit");
                        store.complete(job, token, None).await.expect("complete");
                        vec![(K::Started, 1), (K::Emitted, 1), (K::Succeeded, 1)]
                    }
                    1 => {
                        let token = take(&store, &queue).await;
                        store
                            .fail(job, token, "again", Retry::At(clock.now()))
                            .await
                            .expect("fail");
                        let token = take(&store, &queue).await;
                        store.complete(job, token, None).await.expect("complete");
                        vec![
                            (K::Started, 1),
                            (K::Failed, 1),
                            (K::Started, 2),
                            (K::Succeeded, 2),
                        ]
                    }
                    2 => {
                        let token = take(&store, &queue).await;
                        store.release(job, token).await.expect("release");
                        let token = take(&store, &queue).await;
                        store.emit(job, token, "e", data).await.expect("emit");
                        store.complete(job, token, None).await.expect("complete");
                        vec![
                            (K::Started, 1),
                            (K::Released, 0),
                            (K::Started, 1),
                            (K::Emitted, 1),
                            (K::Succeeded, 1),
                        ]
                    }
                    _ => {
                        let mut tx = pool.pool().begin().await.expect("begin");
                        sqlx::query("SELECT pg_current_xact_id()")
                            .execute(&mut *tx)
                            .await
                            .expect("take an id");
                        let token = take(&store, &queue).await;
                        store.emit(job, token, "e", data).await.expect("emit");
                        let _completed = handle
                            .complete_in(&mut tx, job, token, None)
                            .await
                            .expect("complete in the transaction");
                        tx.commit().await.expect("commit");
                        vec![(K::Started, 1), (K::Emitted, 1), (K::Succeeded, 1)]
                    }
                };
                let mut whole = vec![(K::Enqueued, 0)];
                whole.extend(story);
                expected.insert(job, whole);
            }
            expected
        });
    }

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let store = open(&reader_pool, settings.clone());
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut follower = Follower::new(store);
            let mut reads = 0_u64;
            while !done.load(Ordering::Acquire) {
                reads += 1;
                if follower.read(7).await == 0 {
                    tokio::task::yield_now().await;
                }
            }
            follower.catch_up().await;
            (follower, reads)
        })
    };
    let mut expected: HashMap<JobId, Story> = HashMap::new();
    for written in join(writers).await {
        expected.extend(written);
    }
    done.store(true, Ordering::Release);
    let (follower, reads) = reader.await.expect("the reader's task");
    assert!(reads > 1, "the reader read while the writers wrote");

    let history = &follower.history;
    assert!(
        history.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "each event once, in cursor order"
    );
    let whole = read_all(&open(&reader_pool, settings)).await;
    assert_eq!(history.len(), whole.len(), "none skipped");
    assert!(*history == whole, "the history is the whole stream");
    let mut told = stories(
        history
            .iter()
            .filter(|e| !follower.sentinels.contains(&e.job)),
    );
    assert_eq!(told.len(), WRITERS * JOBS);
    for (job, story) in &expected {
        assert_eq!(told.remove(job).as_ref(), Some(story), "job {job}");
    }

    clean_up(&reader_pool, &namespace).await;
}

/// The trigger's kinds are `EventKind::of_change`'s: `event_kind` (migration 15)
/// answers as it does for every state before (none, for an enqueue) and after, with
/// attempts that stay, go up and go down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_triggers_kinds_mirror_of_change() {
    let Some(backend) = backend("durq-postgres-events-kinds-mirror", 1).await else {
        return;
    };
    let befores = std::iter::once(None).chain(JobState::ALL.map(Some));
    let mut checked = 0;
    for was in befores {
        for now in JobState::ALL {
            for (before, after) in [(0, 0), (1, 1), (1, 0), (0, 1), (3, 3), (3, 2)] {
                let kind: Option<String> =
                    sqlx::query_scalar("SELECT jobs.event_kind($1, $2, $3, $4)")
                        .bind(was.map(JobState::as_str))
                        .bind(now.as_str())
                        .bind(i64::from(before))
                        .bind(i64::from(after))
                        .fetch_one(backend.pool())
                        .await
                        .expect("event_kind");
                let expected = EventKind::of_change(was, now, before, after);
                assert_eq!(
                    kind.as_deref(),
                    expected.map(EventKind::as_str),
                    "{was:?} -> {now:?}, attempts {before} -> {after}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 7 * 6 * 6);
}

/// A schema an older build left at version 14, with jobs queued, running and done in
/// it, takes migration 15 in place: the jobs from before carry no mark and record
/// nothing whatever store changes them; the lease taken before the upgrade emits; a
/// job a recording store enqueues after it records its changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_15_upgrades_a_schema_with_jobs_in_flight() {
    use EventKind as K;
    let Some(admin) = admin().await else {
        return;
    };
    let JobsInFlight {
        schema,
        clock,
        settings,
        queued,
        running,
        running_token,
        ..
    } = JobsInFlight::new("jobs_upgrade15").await;
    // The schema as a build of version 14 left it.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TRIGGER record_enqueued ON \"{schema}\".jobs;
         DROP TRIGGER record_change ON \"{schema}\".jobs;
         DROP FUNCTION \"{schema}\".record_event();
         DROP FUNCTION \"{schema}\".event_kind(text, text, bigint, bigint);
         DROP FUNCTION \"{schema}\".event_key();
         DROP TABLE \"{schema}\".events;
         DROP TABLE \"{schema}\".events_trimmed;
         DROP SEQUENCE \"{schema}\".event_seq;
         ALTER TABLE \"{schema}\".jobs DROP COLUMN records_events;
         DELETE FROM \"{schema}\".migrations WHERE version >= 15;"
    )))
    .execute(&admin)
    .await
    .expect("back to version 14");

    let upgraded = PostgresPool::connect(schema_config(&schema))
        .await
        .expect("upgrade");
    assert_eq!(
        upgraded.schema_version().await.expect("version"),
        LATEST_VERSION
    );
    let store = open(&upgraded, settings.record_events(KEEP));
    let emitted_at = clock.now();
    store
        .emit(running, running_token, "after-upgrade", Bytes::new())
        .await
        .expect("the lease of before the upgrade emits");
    store
        .complete(running, running_token, None)
        .await
        .expect("complete");
    let old = take(&store, "q").await;
    store.complete(queued, old, None).await.expect("complete");
    let new = enqueue(&store, NewJob::new("new")).await;
    let token = take(&store, "new").await;
    store.complete(new, token, None).await.expect("complete");

    let mut follower = Follower::new(store);
    let events = follower.catch_up().await;
    assert_eq!(
        stories(&events),
        HashMap::from([
            (running, vec![(K::Emitted, 1)]),
            (
                new,
                vec![(K::Enqueued, 0), (K::Started, 1), (K::Succeeded, 1)]
            ),
        ])
    );
    assert_eq!(events[0].recorded_at, emitted_at);

    drop(follower);
    drop(upgraded);
    drop_schema(&admin, &schema).await;
}

/// CONTRACT V2 for `emit`: an emit that waited for the job's row orders after the
/// event written by the transaction it waited for, though that transaction's key is
/// above the emit's own id. Here the holder locks the row as an emit does, a younger
/// transaction ends meanwhile, and the holder then writes its event (by hand, as an
/// emit committed at that moment would, `event_key()` and all): its key is the younger
/// transaction's id. The waiting emit, keyed once it holds the row, comes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emit_that_waited_for_the_row_orders_after_the_event_it_waited_for() {
    const APP: &str = "durq-postgres-events-emit-wait";
    let (Some(backend), Some(admin)) = (backend(APP, 3).await, admin().await) else {
        return;
    };
    let clock = ManualClock::default();
    let settings = recording(&clock);
    let namespace = settings.namespace.clone();
    let store = open(&backend, settings);
    let job = enqueue(&store, NewJob::new("emit-wait")).await;
    let token = take(&store, "emit-wait").await;

    let mut holder = backend.pool().begin().await.expect("begin");
    sqlx::query(
        "SELECT 1 FROM jobs.jobs WHERE namespace = $1 AND id = $2::text::uuid
         FOR NO KEY UPDATE",
    )
    .bind(&namespace)
    .bind(job.to_string())
    .execute(&mut *holder)
    .await
    .expect("hold the job's row");
    let emitting = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .emit(job, token, "waited", Bytes::from_static(b"2"))
                .await
        })
    };
    until_waiting_for_a_lock(&admin, APP).await;
    // A younger transaction takes an id and ends.
    let younger: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(&admin)
        .await
        .expect("a younger transaction");
    sqlx::query(
        "INSERT INTO jobs.events
             (namespace, xid, seq, job, queue, kind, attempt, name, data, recorded_at)
         VALUES ($1, jobs.event_key(), nextval('jobs.event_seq'), $2::text::uuid,
                 'emit-wait', 'emitted', 1, 'held', '\\x31'::bytea, 0)",
    )
    .bind(&namespace)
    .bind(job.to_string())
    .execute(&mut *holder)
    .await
    .expect("the holder's event");
    holder.commit().await.expect("commit");
    emitting
        .await
        .expect("the emit's task")
        .expect("the emit, once it holds the row");

    let mut follower = Follower::new(store);
    let events = follower.catch_up().await;
    let emitted: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| e.kind == EventKind::Emitted)
        .map(|e| (e.name.as_deref().unwrap_or(""), e.cursor.high()))
        .collect();
    let younger: u64 = younger.parse().expect("an xid8");
    assert_eq!(
        emitted.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        ["held", "waited"],
        "in the order they held the row: {emitted:?}, a younger transaction {younger}"
    );
    assert!(
        emitted[0].1 >= younger,
        "the holder's key is past the younger id"
    );

    clean_up(&backend, &namespace).await;
}
