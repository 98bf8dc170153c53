//! The event stream in the file (CONTRACT V1–V4): every change of a marked job is
//! recorded by the path that really makes it, a job enqueued without the mark records
//! nothing whoever changes it, `emit` is fenced by the lease, a trim keeps exactly the
//! newest events and says what a reader missed, and `drop_namespace` empties the
//! stream without ever handing a cursor out again.

use super::*;

use durq_core::{Bytes, Completion, EventCursor, EventKind, EventPage};

fn must<T, E: std::fmt::Display>(result: std::result::Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{what}: {err}"),
    }
}

/// The settings of a store that records events, keeping at most `keep` of them.
fn recording(clock: &ManualClock, keep: u64) -> StoreSettings {
    settings(clock).record_events(keep)
}

/// One event as the tests compare them: its job, kind and attempt.
type Seen = (JobId, EventKind, u32);

/// Reads the stream after `cursor` until a read comes back empty, checking each page
/// continues from the last, and answers every event read.
async fn read_all(store: &Store, mut cursor: EventCursor) -> Vec<durq_core::Event> {
    let mut events = Vec::new();
    loop {
        let page: EventPage = must(store.events(cursor, 3).await, "read the stream");
        assert!(page.events.len() <= 3);
        if page.events.is_empty() {
            assert_eq!(page.next, cursor, "an empty read stays where it was");
            return events;
        }
        assert!(
            page.events[0].cursor > cursor,
            "a read answers only later events"
        );
        cursor = page.next;
        events.extend(page.events);
        assert!(events.len() < 100_000, "the stream never ends");
    }
}

/// Follows the stream for the steps of a test: each step's events must be exactly
/// what it expected, in order, each after the last one read, each recorded at the
/// step's instant (V1: the store's instant of the change, see `schema.rs`). Every step
/// then moves the clock on a millisecond, so an event recorded with the instant of an
/// earlier change is caught.
struct Follower {
    store: Store,
    clock: ManualClock,
    cursor: EventCursor,
}

impl Follower {
    fn new(store: &Store, clock: &ManualClock) -> Self {
        Follower {
            store: store.clone(),
            clock: clock.clone(),
            cursor: EventCursor::START,
        }
    }

    async fn expect(&mut self, what: &str, expected: &[Seen]) {
        let events = read_all(&self.store, self.cursor).await;
        let seen: Vec<Seen> = events.iter().map(|e| (e.job, e.kind, e.attempt)).collect();
        assert_eq!(seen, expected, "{what}");
        for event in &events {
            assert!(event.cursor > self.cursor, "{what}: cursors grow");
            assert_eq!(event.cursor.low(), 0, "{what}: SQLite's cursors are N-0");
            self.cursor = event.cursor;
            match self.store.get(event.job).await {
                Ok(job) => assert_eq!(event.queue, job.queue, "{what}: the job's queue"),
                // The buried record cannot be read back; its queue is its name.
                Err(Error::Corrupt { .. }) => assert_eq!(event.queue, "l", "{what}"),
                Err(err) => panic!("{what}: get the event's job: {err}"),
            }
            assert_eq!(
                event.recorded_at,
                self.clock.now(),
                "{what}: {:?} recorded at the instant of its change",
                event.kind
            );
            if event.kind != EventKind::Emitted {
                assert_eq!((&event.name, &event.data), (&None, &None), "{what}");
            }
        }
        self.clock.advance(Duration::from_millis(1));
    }
}

/// Claims the one ready job of `queue`, which must be `id`, for `ttl`.
async fn claim_for(store: &Store, queue: &str, id: JobId, ttl: Duration) -> LeaseToken {
    match must(store.claim_one(&[queue], "w", ttl).await, "claim") {
        Some(job) if job.id() == id => job.token(),
        other => panic!("claimed {other:?}, not job {id}"),
    }
}

async fn claim(store: &Store, queue: &str, id: JobId) -> LeaseToken {
    claim_for(store, queue, id, Duration::from_secs(30)).await
}

async fn enqueue(store: &Store, job: NewJob) -> JobId {
    must(store.enqueue(job).await, "enqueue").id
}

/// Every kind of V1, each recorded by the path that really makes the change: the
/// claim, completion (single, batched, in a caller's transaction), failure with and
/// without a retry, release by snooze, reclaim to queued and to dead, the operator's
/// cancel and retry, a reopen from a step, the G3 cascade cancelling the jobs waiting
/// (two deep), a dependency met, an enqueue already cancelled by its dependency, and a
/// burial of an unreadable record. Writes that leave the state as it was (heartbeat,
/// saved step, a cancel request to a running job, a rolled back enqueue) record
/// nothing. Each step is read from where the last one ended, at an instant of its own,
/// so a step that recorded one event too many or too few, or with another instant,
/// fails there.
#[tokio::test]
async fn every_change_records_its_kind_through_its_real_path() {
    use durq_core::Retry;
    use EventKind::*;
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let backend = open_backend(&path, recording(&clock, 1_000), SqliteConfig::default()).await;
    let store = Store::new(backend.clone());
    let mut stream = Follower::new(&store, &clock);
    let ttl = Duration::from_secs(30);
    let short = Duration::from_secs(1);

    let a = enqueue(&store, NewJob::new("a")).await;
    stream.expect("enqueue", &[(a, Enqueued, 0)]).await;
    let token = claim(&store, "a", a).await;
    stream.expect("claim", &[(a, Started, 1)]).await;
    must(store.heartbeat(a, token, ttl).await, "heartbeat");
    must(
        store
            .save_step(a, token, "s1", Bytes::from_static(b"1"))
            .await,
        "save a step",
    );
    stream.expect("a heartbeat and a step", &[]).await;
    must(
        store
            .emit(a, token, "progress", Bytes::from_static(b"half"))
            .await,
        "emit",
    );
    stream.expect("emit", &[(a, Emitted, 1)]).await;
    must(store.complete(a, token, None).await, "complete");
    stream.expect("complete", &[(a, Succeeded, 1)]).await;
    must(store.retry_from(a, "s1", 0).await, "reopen from a step");
    stream.expect("reopen", &[(a, Retried, 0)]).await;
    let token = claim(&store, "a", a).await;
    stream.expect("claim", &[(a, Started, 1)]).await;
    must(
        store.fail(a, token, "boom", Retry::At(clock.now())).await,
        "fail with a retry",
    );
    stream.expect("fail with a retry", &[(a, Failed, 1)]).await;
    let token = claim(&store, "a", a).await;
    stream.expect("claim", &[(a, Started, 2)]).await;
    must(store.snooze(a, token, short).await, "snooze");
    stream.expect("snooze", &[(a, Released, 1)]).await;
    clock.advance(short);
    let token = claim(&store, "a", a).await;
    stream.expect("claim", &[(a, Started, 2)]).await;
    must(
        store.fail(a, token, "boom", Retry::Never).await,
        "fail for good",
    );
    stream.expect("fail for good", &[(a, Dead, 2)]).await;
    must(store.retry(a).await, "retry");
    stream.expect("retry", &[(a, Retried, 0)]).await;
    claim_for(&store, "a", a, short).await;
    stream.expect("claim", &[(a, Started, 1)]).await;
    clock.advance(short * 2);
    assert_eq!(must(store.reclaim(10).await, "reclaim").len(), 1);
    stream.expect("reclaim to queued", &[(a, Failed, 1)]).await;
    assert_eq!(must(store.cancel(a).await, "cancel"), JobState::Cancelled);
    stream
        .expect("cancel a queued job", &[(a, Cancelled, 1)])
        .await;

    let b = enqueue(&store, NewJob::new("b").max_attempts(1)).await;
    claim_for(&store, "b", b, short).await;
    stream
        .expect("enqueue and claim", &[(b, Enqueued, 0), (b, Started, 1)])
        .await;
    clock.advance(short * 2);
    assert_eq!(must(store.reclaim(10).await, "reclaim").len(), 1);
    stream.expect("reclaim to dead", &[(b, Dead, 1)]).await;

    let c = enqueue(&store, NewJob::new("c")).await;
    let token = claim(&store, "c", c).await;
    assert_eq!(must(store.cancel(c).await, "cancel"), JobState::Running);
    stream
        .expect(
            "a cancel request to a running job",
            &[(c, Enqueued, 0), (c, Started, 1)],
        )
        .await;
    let state = must(
        store
            .fail(c, token, "stopped", Retry::At(clock.now()))
            .await,
        "fail",
    );
    assert_eq!(state, JobState::Cancelled);
    stream
        .expect("the cancelled job's failure", &[(c, Cancelled, 1)])
        .await;

    // G3: a dead job cancels the job waiting for it, and that one the job after it.
    let d = enqueue(&store, NewJob::new("d")).await;
    let e = enqueue(&store, NewJob::new("e").after(d)).await;
    let f = enqueue(&store, NewJob::new("f").after(e)).await;
    let token = claim(&store, "d", d).await;
    stream
        .expect(
            "enqueues that wait, and a claim",
            &[
                (d, Enqueued, 0),
                (e, Enqueued, 0),
                (f, Enqueued, 0),
                (d, Started, 1),
            ],
        )
        .await;
    must(
        store.fail(d, token, "boom", Retry::Never).await,
        "fail the dependency",
    );
    stream
        .expect(
            "the G3 cascade",
            &[(d, Dead, 1), (e, Cancelled, 0), (f, Cancelled, 0)],
        )
        .await;
    // A job enqueued after its dependency died starts cancelled: its enqueue alone.
    let late = enqueue(&store, NewJob::new("late").after(d)).await;
    assert_eq!(
        must(store.get(late).await, "get").state,
        JobState::Cancelled
    );
    stream
        .expect("an enqueue cancelled at once", &[(late, Enqueued, 0)])
        .await;

    let g = enqueue(&store, NewJob::new("g")).await;
    let h = enqueue(&store, NewJob::new("h").after(g)).await;
    let token = claim(&store, "g", g).await;
    stream
        .expect(
            "an enqueue that waits, and a claim",
            &[(g, Enqueued, 0), (h, Enqueued, 0), (g, Started, 1)],
        )
        .await;
    must(
        store.complete(g, token, None).await,
        "complete the dependency",
    );
    stream
        .expect("a dependency met", &[(g, Succeeded, 1), (h, Ready, 0)])
        .await;

    // A batch, claimed together and completed in one batch.
    let batch = must(
        store
            .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
            .await,
        "enqueue a batch",
    );
    let (k1, k2) = (batch[0].id, batch[1].id);
    let claimed = must(
        store
            .claim(durq_core::ClaimRequest::new(["k"], "w", ttl).limit(2))
            .await,
        "claim the batch",
    );
    assert_eq!(
        claimed.iter().map(|job| job.id()).collect::<Vec<_>>(),
        [k1, k2]
    );
    stream
        .expect(
            "a batch and its claim",
            &[
                (k1, Enqueued, 0),
                (k2, Enqueued, 0),
                (k1, Started, 1),
                (k2, Started, 1),
            ],
        )
        .await;
    let completions = claimed
        .iter()
        .map(|job| Completion {
            id: job.id(),
            token: job.token(),
            result: None,
        })
        .collect();
    for answer in must(store.complete_batch(completions).await, "complete a batch") {
        must(answer, "complete one of the batch");
    }
    stream
        .expect(
            "a batch completed",
            &[(k1, Succeeded, 1), (k2, Succeeded, 1)],
        )
        .await;

    // The caller's transaction: an enqueue and a completion commit with it, a rolled
    // back enqueue leaves nothing.
    let mut conn = must(backend.connection(), "a connection");
    let mut tx = must(backend.transaction(&mut conn), "begin");
    must(tx.enqueue(NewJob::new("tx")), "enqueue in a transaction");
    must(tx.rollback(), "roll back");
    stream.expect("a rolled back enqueue", &[]).await;
    let mut tx = must(backend.transaction(&mut conn), "begin");
    let t = must(tx.enqueue(NewJob::new("tx")), "enqueue in a transaction").id;
    must(tx.commit(), "commit");
    let token = claim(&store, "tx", t).await;
    stream
        .expect(
            "an enqueue in the caller's transaction",
            &[(t, Enqueued, 0), (t, Started, 1)],
        )
        .await;
    let mut tx = must(backend.transaction(&mut conn), "begin");
    let receipt = must(tx.complete(t, token, None), "complete in a transaction");
    assert_eq!(receipt, durq_core::FencedCompletion::new(t, token));
    must(tx.commit(), "commit");
    stream
        .expect(
            "a completion in the caller's transaction",
            &[(t, Succeeded, 1)],
        )
        .await;

    // C10: a record a claim cannot read is buried, dead, by the claim.
    let l = enqueue(&store, NewJob::new("l")).await;
    stream.expect("enqueue", &[(l, Enqueued, 0)]).await;
    must(
        raw(&path).execute(
            "UPDATE jobq_jobs SET tags = '{' WHERE id = ?1",
            [l.to_bytes()],
        ),
        "damage the record",
    );
    assert!(must(store.claim_one(&["l"], "w", ttl).await, "claim").is_none());
    stream.expect("a burial", &[(l, Dead, 0)]).await;
}

/// A job enqueued through a store that does not record events records nothing,
/// whichever store changes it (one that records included), and its row carries no
/// mark; a job enqueued through a store that records does, whichever store changes it
/// (one that does not record included). `emit` records for both.
#[tokio::test]
async fn only_a_marked_job_records_its_changes_whoever_makes_them() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let plain = open(&path, settings(&clock), SqliteConfig::default()).await;
    // A file no recording store has opened has no event triggers, so its writes pay
    // nothing for them; a job run to the end prepares the writer's statements first.
    let warm = enqueue(&plain, NewJob::new("q")).await;
    let token = claim(&plain, "q", warm).await;
    must(plain.complete(warm, token, None).await, "complete");
    let triggers = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'
                    AND name LIKE 'jobq_record_event_%'";
    assert_eq!(count(&path, triggers), 0, "no store records events yet");
    let recorder = open(&path, recording(&clock, 100), SqliteConfig::default()).await;
    assert_eq!(
        count(&path, triggers),
        2,
        "the recording store created them"
    );

    let unmarked = enqueue(&plain, NewJob::new("q")).await;
    let marked = enqueue(&recorder, NewJob::new("q")).await;
    assert_eq!(
        count(
            &path,
            "SELECT COUNT(*) FROM jobq_jobs WHERE events_at IS NULL"
        ),
        2,
        "the unmarked jobs' rows store NULL"
    );
    // Each is changed by the store that did not enqueue it: the plain store's
    // statements, prepared before the triggers existed, fire them now.
    let token = claim(&recorder, "q", unmarked).await;
    must(recorder.complete(unmarked, token, None).await, "complete");
    let token = claim(&plain, "q", marked).await;
    must(
        plain.emit(marked, token, "note", Bytes::new()).await,
        "emit on the marked job",
    );
    must(plain.complete(marked, token, None).await, "complete");
    let again = enqueue(&plain, NewJob::new("r")).await;
    let token = claim(&plain, "r", again).await;
    must(
        plain
            .emit(again, token, "note", Bytes::from_static(b"x"))
            .await,
        "emit on an unmarked job",
    );
    must(
        plain
            .fail(again, token, "boom", durq_core::Retry::Never)
            .await,
        "fail",
    );
    must(recorder.retry(again).await, "retry");
    assert_eq!(
        must(recorder.cancel(again).await, "cancel"),
        JobState::Cancelled
    );

    let seen: Vec<Seen> = read_all(&plain, EventCursor::START)
        .await
        .iter()
        .map(|e| (e.job, e.kind, e.attempt))
        .collect();
    assert_eq!(
        seen,
        vec![
            (marked, EventKind::Enqueued, 0),
            (marked, EventKind::Started, 1),
            (marked, EventKind::Emitted, 1),
            (marked, EventKind::Succeeded, 1),
            (again, EventKind::Emitted, 1),
        ]
    );
}

/// V1: `emit` is fenced by the lease as a completion is. A token that no longer holds
/// it (the job was reclaimed, or it ended), an unknown job, writes nothing: the
/// table's rows are counted from the file, not only read through the stream.
#[tokio::test]
async fn an_emit_under_a_stale_token_writes_nothing() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, recording(&clock, 100), SqliteConfig::default()).await;
    let rows = || count(&path, "SELECT COUNT(*) FROM jobq_events");
    let id = enqueue(&store, NewJob::new("q")).await;
    let old = claim_for(&store, "q", id, Duration::from_secs(1)).await;
    must(
        store.emit(id, old, "first", Bytes::from_static(b"1")).await,
        "emit under the lease",
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(must(store.reclaim(10).await, "reclaim").len(), 1);
    let current = claim(&store, "q", id).await;
    let before = rows();
    assert!(matches!(
        store.emit(id, old, "late", Bytes::from_static(b"2")).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        store
            .emit(JobId::mint(clock.now()), current, "nobody", Bytes::new())
            .await,
        Err(Error::NotFound { .. })
    ));
    let never_issued = store
        .emit(id, LeaseToken::new(u64::MAX), "never-issued", Bytes::new())
        .await;
    assert!(
        matches!(never_issued, Err(Error::LeaseLost { .. })),
        "{never_issued:?}"
    );
    assert_eq!(rows(), before, "the refused emits wrote nothing");
    must(store.complete(id, current, None).await, "complete");
    let after_completion = rows();
    assert!(matches!(
        store.emit(id, current, "after", Bytes::new()).await,
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(rows(), after_completion);
    // The handle refuses a bad name or data before the backend sees it.
    let id = enqueue(&store, NewJob::new("q2")).await;
    let token = claim(&store, "q2", id).await;
    let refused = store.emit(id, token, "no spaces", Bytes::new()).await;
    assert_eq!(
        refused
            .err()
            .and_then(|e| e.invalid_field().map(str::to_owned))
            .as_deref(),
        Some("event")
    );
    let big = Bytes::from(vec![0u8; durq_core::events::MAX_EVENT_DATA_BYTES + 1]);
    let refused = store.emit(id, token, "big", big).await;
    assert_eq!(
        refused
            .err()
            .and_then(|e| e.invalid_field().map(str::to_owned))
            .as_deref(),
        Some("data")
    );

    let emitted: Vec<(Option<String>, Option<Bytes>)> = read_all(&store, EventCursor::START)
        .await
        .into_iter()
        .filter(|e| e.kind == EventKind::Emitted)
        .map(|e| (e.name, e.data))
        .collect();
    assert_eq!(
        emitted,
        vec![(Some("first".to_owned()), Some(Bytes::from_static(b"1")))]
    );
}

/// V3: a trim keeps exactly the newest `keep` events of its namespace (none of
/// another's), answers how many it deleted, and a read from before the newest it
/// deleted is `trimmed` and continues from the oldest kept; a read from that event or
/// later is not. V2: a cursor between two events (`N-L`, `L > 0`) reads on after `N`.
#[tokio::test]
async fn a_trim_keeps_the_newest_events_and_a_read_from_before_it_is_trimmed() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let store = open(&path, recording(&clock, 4), SqliteConfig::default()).await;
    let neighbour = open(
        &path,
        recording(&clock, 4).namespace("neighbour"),
        SqliteConfig::default(),
    )
    .await;
    for _ in 0..10 {
        enqueue(&store, NewJob::new("q")).await;
        enqueue(&neighbour, NewJob::new("q")).await;
    }
    let all = read_all(&store, EventCursor::START).await;
    let theirs = read_all(&neighbour, EventCursor::START).await;
    assert_eq!((all.len(), theirs.len()), (10, 10));

    assert!(matches!(
        store.trim_events(0).await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(must(store.trim_events(4).await, "trim"), 6);
    assert_eq!(must(store.trim_events(4).await, "trim again"), 0);
    assert_eq!(must(store.trim_events(100).await, "trim less"), 0);
    assert_eq!(
        count(&path, "SELECT COUNT(*) FROM jobq_events"),
        14,
        "the neighbour's ten and the newest four"
    );
    assert_eq!(read_all(&neighbour, EventCursor::START).await, theirs);

    let page = must(store.events(EventCursor::START, 1_000).await, "read");
    assert!(page.trimmed, "a read from the start missed six events");
    assert_eq!(page.events, all[6..].to_vec());
    for (after, trimmed) in [
        (all[4].cursor, true),
        (EventCursor::new(all[4].cursor.high(), 7), true),
        (all[5].cursor, false),
        (EventCursor::new(all[5].cursor.high(), 1), false),
        (all[7].cursor, false),
        (all[9].cursor, false),
    ] {
        let page = must(store.events(after, 1_000).await, "read");
        assert_eq!(page.trimmed, trimmed, "after {after}");
        let expected: Vec<_> = all[6..]
            .iter()
            .filter(|e| e.cursor > after)
            .cloned()
            .collect();
        assert_eq!(page.events, expected, "after {after}");
    }
    // Pages continue from their last event.
    let first = must(store.events(all[5].cursor, 2).await, "read");
    assert_eq!(first.events, all[6..8].to_vec());
    assert_eq!(first.next, all[7].cursor);
    let second = must(store.events(first.next, 2).await, "read on");
    assert_eq!(second.events, all[8..10].to_vec());
    let end = must(store.events(second.next, 2).await, "read at the end");
    assert!(end.events.is_empty() && !end.trimmed);
    assert_eq!(end.next, second.next);
    // A later trim moves the mark on, never back.
    for _ in 0..3 {
        enqueue(&store, NewJob::new("q")).await;
    }
    assert_eq!(must(store.trim_events(4).await, "trim"), 3);
    let page = must(store.events(all[7].cursor, 1_000).await, "read");
    assert!(page.trimmed);
    assert_eq!(page.events.len(), 4);
    assert!(!must(store.events(all[8].cursor, 1_000).await, "read").trimmed);
}

/// `drop_namespace` deletes the namespace's events and its trim record and nothing of
/// another namespace's stream; the namespace's next events take cursors after every
/// cursor handed out before, even when it held the file's newest event.
#[tokio::test]
async fn dropping_a_namespace_removes_its_events() {
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let backend = open_backend(&path, recording(&clock, 2), SqliteConfig::default()).await;
    let store = Store::new(backend.clone());
    let neighbour = open(
        &path,
        recording(&clock, 2).namespace("neighbour"),
        SqliteConfig::default(),
    )
    .await;
    enqueue(&neighbour, NewJob::new("q")).await;
    for _ in 0..5 {
        enqueue(&store, NewJob::new("q")).await;
    }
    assert_eq!(must(store.trim_events(2).await, "trim"), 3);
    let theirs = read_all(&neighbour, EventCursor::START).await;
    let mine = read_all(&store, EventCursor::START).await;
    let newest = mine[1].cursor;

    assert_eq!(must(backend.drop_namespace().await, "drop"), 5);
    let page = must(store.events(EventCursor::START, 1_000).await, "read");
    assert!(page.events.is_empty());
    assert!(!page.trimmed, "the trim record went with the events");
    assert_eq!(read_all(&neighbour, EventCursor::START).await, theirs);
    let mine_ns = "(SELECT id FROM jobq_namespaces WHERE name = 'sqlite-tests')";
    for table in ["jobq_events", "jobq_events_trimmed"] {
        assert_eq!(
            count(
                &path,
                &format!("SELECT COUNT(*) FROM {table} WHERE ns = {mine_ns}")
            ),
            0,
            "{table}"
        );
    }

    // The dropped namespace held the file's newest event; its number is not handed
    // out again, so a consumer that had read to it misses nothing new.
    let next = enqueue(&store, NewJob::new("q")).await;
    let page = must(
        store.events(newest, 1_000).await,
        "read after the old newest",
    );
    assert_eq!(
        page.events.iter().map(|e| e.job).collect::<Vec<_>>(),
        [next]
    );
    assert!(page.events[0].cursor > newest);
    // Dropping again leaves one placeholder at most, and the neighbour untouched.
    must(backend.drop_namespace().await, "drop again");
    enqueue(&neighbour, NewJob::new("q")).await;
    must(backend.drop_namespace().await, "drop a third time");
    assert!(count(&path, "SELECT COUNT(*) FROM jobq_events WHERE ns = 0") <= 1);
    assert_eq!(read_all(&neighbour, EventCursor::START).await.len(), 2);
}

/// V4 across writer connections in one process: eight stores, each with a writer
/// connection of its own (distinct configurations), none recording, change the jobs a
/// recording store enqueued, while a reader follows the stream from `next`. The
/// reader's history is the whole stream afterwards, each event once, and each job's
/// events in the order of its changes. (The same across processes is in
/// `tests/multiprocess.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_following_the_stream_sees_each_event_once_in_order() {
    const WRITERS: usize = 8;
    const JOBS: usize = 200;
    let (_dir, path) = temp_db();
    let clock = ManualClock::default();
    let config = || {
        SqliteConfig::default()
            .synchronous(Synchronous::Normal)
            .busy_timeout(Duration::from_secs(60))
    };
    let producer = open(&path, recording(&clock, 1_000_000), config()).await;
    let mut writers = Vec::with_capacity(WRITERS);
    for n in 1..=WRITERS {
        writers.push(open(&path, settings(&clock), config().readers(1).max_group(n)).await);
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, done) = (producer.clone(), done.clone());
        tokio::spawn(async move {
            let mut history = Vec::new();
            let mut cursor = EventCursor::START;
            let mut pages_while_writing = 0usize;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let page = must(store.events(cursor, 17).await, "follow the stream");
                assert!(!page.trimmed);
                if page.events.is_empty() {
                    if finished {
                        return (history, pages_while_writing);
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
                if !finished {
                    pages_while_writing += 1;
                }
                cursor = page.next;
                history.extend(page.events);
                assert!(history.len() <= 4 * JOBS, "the reader reads events again");
            }
        })
    };
    let tasks: Vec<_> = writers
        .iter()
        .enumerate()
        .map(|(n, store)| {
            let store = store.clone();
            tokio::spawn(async move {
                let queue = format!("w{n}");
                let mut done = 0;
                while done < JOBS / WRITERS {
                    let claimed = must(
                        store
                            .claim_one(&[queue.as_str()], "w", Duration::from_secs(600))
                            .await,
                        "claim",
                    );
                    let Some(job) = claimed else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    must(
                        store
                            .emit(job.id(), job.token(), "progress", Bytes::new())
                            .await,
                        "emit",
                    );
                    must(
                        store.complete(job.id(), job.token(), None).await,
                        "complete",
                    );
                    done += 1;
                }
            })
        })
        .collect();
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(10) {
        let jobs = chunk
            .iter()
            .map(|i| NewJob::new(format!("w{}", i % WRITERS)))
            .collect();
        must(producer.enqueue_batch(jobs).await, "enqueue");
    }
    for task in tasks {
        must(task.await, "a writer");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (history, pages_while_writing) = must(reader.await, "the reader");
    assert!(
        pages_while_writing > 0,
        "the reader read while the writers wrote"
    );
    check_history(
        &history,
        &read_all(&producer, EventCursor::START).await,
        JOBS,
    );
}

/// V2, V4 on a reader's history: each event once, none skipped (the history is the
/// whole stream, read afterwards), cursors growing, and each job's events exactly
/// `enqueued`, `started`, `emitted`, `succeeded`, in that order.
fn check_history(history: &[durq_core::Event], whole: &[durq_core::Event], jobs: usize) {
    let cursors: std::collections::HashSet<EventCursor> =
        history.iter().map(|e| e.cursor).collect();
    assert_eq!(cursors.len(), history.len(), "an event was read twice");
    assert!(history.windows(2).all(|w| w[0].cursor < w[1].cursor));
    assert_eq!(history.len(), whole.len(), "the reader skipped events");
    assert!(history == whole, "the reader's history is not the stream");
    let mut by_job: std::collections::HashMap<JobId, Vec<(EventKind, u32)>> =
        std::collections::HashMap::new();
    for event in history {
        by_job
            .entry(event.job)
            .or_default()
            .push((event.kind, event.attempt));
    }
    assert_eq!(by_job.len(), jobs);
    for (job, events) in by_job {
        assert_eq!(
            events,
            [
                (EventKind::Enqueued, 0),
                (EventKind::Started, 1),
                (EventKind::Emitted, 1),
                (EventKind::Succeeded, 1)
            ],
            "job {job}"
        );
    }
}
