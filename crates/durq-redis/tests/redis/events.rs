//! The event stream (CONTRACT V1–V4) on Redis beyond the conformance suite: the mark
//! (`ev`) and the stream's entries as the scripts write them, each kind recorded by its
//! real path (G3's cascade, reclaim, the buries of unreadable records), nothing at all
//! for jobs without the mark, emits fenced by the lease, trims and their marker,
//! unreadable entries and markers, `drop_namespace`, partitioned namespaces (no
//! `Events`, no mark), the stream's slot on a cluster, and many writers on several
//! connections followed by a reader.

use super::*;
use durq_core::events::MAX_EVENTS_PAGE;
use durq_core::graph::DependencyFailure;
use durq_core::{Capability, Event, EventCursor, EventKind, LeaseToken, QueueLimits};
use std::collections::BTreeMap;

/// How many events the recording stores of these tests keep.
const KEEP: u64 = 1_000_000;

/// A store of the test's namespace that records events (its jobs carry the mark).
async fn recording(env: &Env) -> TestStore {
    let settings = env.settings.clone().record_events(KEEP);
    TestStore::new(
        RedisBackend::connect(&url(), settings)
            .await
            .expect("connect"),
    )
}

/// Every event of the namespace, read page by page from `after` with pages of `limit`,
/// and whether any read said events were trimmed.
async fn read_from(store: &Store, mut after: EventCursor, limit: usize) -> (Vec<Event>, bool) {
    let mut events = Vec::new();
    let mut trimmed = false;
    loop {
        let page = store.events(after, limit).await.expect("events");
        trimmed |= page.trimmed;
        if page.events.is_empty() {
            return (events, trimmed);
        }
        after = page.next;
        events.extend(page.events);
    }
}

/// The whole stream.
async fn read_all(store: &Store) -> Vec<Event> {
    read_from(store, EventCursor::START, MAX_EVENTS_PAGE)
        .await
        .0
}

/// The kinds recorded for `job`, in stream order.
fn kinds_of(events: &[Event], job: JobId) -> Vec<EventKind> {
    events
        .iter()
        .filter(|event| event.job == job)
        .map(|event| event.kind)
        .collect()
}

/// The one event of `kind` recorded for `job`.
fn event_of(events: &[Event], job: JobId, kind: EventKind) -> &Event {
    let mut found = events
        .iter()
        .filter(|event| event.job == job && event.kind == kind);
    let event = found.next().expect("the event");
    assert!(found.next().is_none(), "{kind} recorded twice for {job}");
    event
}

/// A stream entry as the server holds it: its id and its fields in order.
type RawEntry = (String, Vec<(String, Vec<u8>)>);

/// The stream's entries as the server holds them, oldest first.
async fn raw_stream(env: &mut Env) -> Vec<RawEntry> {
    let key = env.key("events");
    let entries: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut env.admin)
        .await
        .expect("XRANGE");
    entries
}

/// How many entries the stream holds (0 when it does not exist).
async fn stream_len(env: &mut Env) -> u64 {
    let key = env.key("events");
    let n: u64 = redis::cmd("XLEN")
        .arg(&key)
        .query_async(&mut env.admin)
        .await
        .expect("XLEN");
    n
}

/// Whether the namespace's key `name` exists.
async fn exists(env: &mut Env, name: &str) -> bool {
    let key = env.key(name);
    env.admin.exists(&key).await.expect("EXISTS")
}

/// The one ready job of `queue`, which must be `id`, claimed by worker `w`.
async fn claim(store: &Store, queue: &str, id: JobId) -> durq_core::ClaimedJob {
    let claimed = store
        .claim_one(&[queue], "w", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("the job is ready");
    assert_eq!(claimed.id(), id, "the ready job of {queue}");
    claimed
}

/// The mark is a field of the job's hash, written by its enqueue; each entry is
/// `j q k a t` as the scripts write it, dated by the store's clock, and its id is the
/// event's cursor.
#[tokio::test]
async fn the_mark_is_a_field_and_each_entry_names_job_queue_kind_attempt_and_time() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let plain = env.store().await;
    let marked = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let unmarked = plain.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    assert!(hash_fields(&mut env, marked)
        .await
        .contains(&"ev".to_owned()));
    assert!(!hash_fields(&mut env, unmarked)
        .await
        .contains(&"ev".to_owned()));
    let enqueued_at = env.clock.now().as_millis().to_string();
    env.clock.advance(Duration::from_millis(5));
    let run = claim(&plain, "q", marked).await;
    plain
        .emit(
            marked,
            run.token(),
            "step.one",
            Bytes::from_static(b"\x00\xffdata"),
        )
        .await
        .expect("emit");
    let started_at = env.clock.now().as_millis().to_string();

    let raw = raw_stream(&mut env).await;
    let id = id_text(marked);
    let fields = |pairs: &[(&str, &[u8])]| -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(field, value)| ((*field).to_owned(), value.to_vec()))
            .collect()
    };
    assert_eq!(
        raw.iter()
            .map(|(_, fields)| fields.clone())
            .collect::<Vec<_>>(),
        [
            fields(&[
                ("j", id.as_bytes()),
                ("q", b"q"),
                ("k", b"enqueued"),
                ("a", b"0"),
                ("t", enqueued_at.as_bytes()),
            ]),
            fields(&[
                ("j", id.as_bytes()),
                ("q", b"q"),
                ("k", b"started"),
                ("a", b"1"),
                ("t", started_at.as_bytes()),
            ]),
            fields(&[
                ("j", id.as_bytes()),
                ("q", b"q"),
                ("k", b"emitted"),
                ("a", b"1"),
                ("t", started_at.as_bytes()),
                ("n", b"step.one"),
                ("d", b"\x00\xffdata"),
            ]),
        ]
    );
    let events = read_all(&store).await;
    let cursors: Vec<String> = events.iter().map(|e| e.cursor.to_string()).collect();
    let ids: Vec<String> = raw.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(cursors, ids, "a cursor is its entry's id");
    assert_eq!(
        events[2].data.as_deref(),
        Some(&b"\x00\xffdata"[..]),
        "data is bytes, as emitted"
    );
    assert_eq!(
        events[1].recorded_at,
        Timestamp::from_millis(started_at.parse().expect("ms"))
    );
}

/// Each kind by its real path, on jobs marked at enqueue and changed by a store that
/// does not record: G3's cascade two levels deep (a failure, and a reclaim that ends a
/// job dead), `ready` through `complete_graph`, a reclaim with attempts left and one of a
/// job asked to stop, the fitted and the limited claims, a reopen, the buries of records
/// a claim (Lua) and `bury.lua` (Rust's decoder) cannot read, and a waiting job settling
/// buries because its `meta` is unreadable (its event names no queue).
#[tokio::test]
async fn each_kind_is_recorded_by_the_script_that_makes_the_change() {
    use EventKind::*;
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let plain = env.store().await;
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);

    // G3, two levels deep: a dies on its one attempt; b waits for a, c for b.
    let graph = store
        .enqueue_batch(vec![
            NewJob::new("g").max_attempts(1),
            NewJob::new("g").after(durq_core::Dependency::Earlier(0)),
            NewJob::new("g").after(durq_core::Dependency::Earlier(1)),
            NewJob::new("g")
                .after(durq_core::Dependency::Earlier(0))
                .on_dependency_failure(DependencyFailure::Run),
        ])
        .await
        .expect("enqueue graph");
    let [a, b, c, runs] = [graph[0].id, graph[1].id, graph[2].id, graph[3].id];
    let run = claim(&plain, "g", a).await;
    assert_eq!(
        plain
            .fail(a, run.token(), "boom", Retry::Never)
            .await
            .expect("fail"),
        JobState::Dead
    );

    // `ready` through complete_graph: y waits for x.
    let x = store.enqueue(NewJob::new("r")).await.expect("x").id;
    let y = store
        .enqueue(NewJob::new("r").after(x))
        .await
        .expect("y")
        .id;
    let run = claim(&plain, "r", x).await;
    plain
        .complete(x, run.token(), None)
        .await
        .expect("complete");

    // Reclaims: one with attempts left (failed), one on its last attempt whose
    // dependent is cancelled (dead, G3), one asked to stop (cancelled).
    let again = store
        .enqueue(NewJob::new("rc").max_attempts(3))
        .await
        .expect("enqueue")
        .id;
    claim(&plain, "rc", again).await;
    let last = store
        .enqueue(NewJob::new("rl").max_attempts(1))
        .await
        .expect("enqueue")
        .id;
    let after_last = store
        .enqueue(NewJob::new("rl").after(last))
        .await
        .expect("enqueue")
        .id;
    claim(&plain, "rl", last).await;
    let stopped = store.enqueue(NewJob::new("rs")).await.expect("enqueue").id;
    claim(&plain, "rs", stopped).await;
    assert_eq!(
        plain.cancel(stopped).await.expect("cancel"),
        JobState::Running
    );
    env.clock.advance(Duration::from_secs(31));
    let mut reclaimed = plain.reclaim(10).await.expect("reclaim");
    reclaimed.sort_by_key(|job| job.id);
    let mut expected = vec![
        durq_core::ReclaimedJob {
            id: again,
            state: JobState::Queued,
        },
        durq_core::ReclaimedJob {
            id: last,
            state: JobState::Dead,
        },
        durq_core::ReclaimedJob {
            id: stopped,
            state: JobState::Cancelled,
        },
    ];
    expected.sort_by_key(|job| job.id);
    assert_eq!(reclaimed, expected);

    // The fitted claim (a budget) and the limited claim (a queue with limits).
    let fitted = store
        .enqueue(NewJob::new("q").needs(Needs::new().amount("gpu", 1)))
        .await
        .expect("enqueue")
        .id;
    let got = plain.claim(gpu_claim(1, 1)).await.expect("fitted claim");
    assert_eq!(got.iter().map(|c| c.id()).collect::<Vec<_>>(), [fitted]);
    plain
        .set_limits("lim", QueueLimits::new().max_running(5))
        .await
        .expect("limits");
    let limited = store.enqueue(NewJob::new("lim")).await.expect("enqueue").id;
    let run = claim(&plain, "lim", limited).await;
    plain
        .complete(limited, run.token(), None)
        .await
        .expect("complete");
    // And its reopen from a step (D3): `retried`, attempts back to 0.
    let run = claim(&plain, "lim", {
        let save = store.enqueue(NewJob::new("lim")).await.expect("enqueue").id;
        save
    })
    .await;
    let reopened = run.id();
    plain
        .save_step(reopened, run.token(), "s", Bytes::new())
        .await
        .expect("save_step");
    plain
        .complete(reopened, run.token(), None)
        .await
        .expect("complete");
    plain
        .retry_from(reopened, "s", 0)
        .await
        .expect("retry_from");

    // A record a claim script cannot read (att no number): buried dead by the claim.
    let spoiled = store.enqueue(NewJob::new("bad")).await.expect("enqueue").id;
    let _: () = env
        .admin
        .hset(key(spoiled), "att", "x")
        .await
        .expect("HSET");
    assert!(plain
        .claim(ClaimRequest::new(["bad"], "w", Duration::from_secs(30)))
        .await
        .expect("claim")
        .is_empty());
    // One only Rust's decoder refuses (a timeout no number): leased, then `bury.lua`.
    let decoded = store
        .enqueue(NewJob::new("bad2"))
        .await
        .expect("enqueue")
        .id;
    let _: () = env
        .admin
        .hset(key(decoded), "timeout", "soon")
        .await
        .expect("HSET");
    assert!(plain
        .claim(ClaimRequest::new(["bad2"], "w", Duration::from_secs(30)))
        .await
        .expect("claim")
        .is_empty());
    // A waiting job whose meta cannot be read: settling buries it, naming no queue.
    let head = store.enqueue(NewJob::new("w")).await.expect("enqueue").id;
    let waiting = store
        .enqueue(NewJob::new("w").after(head))
        .await
        .expect("enqueue")
        .id;
    let _: () = env
        .admin
        .hset(key(waiting), "meta", "not meta")
        .await
        .expect("HSET");
    let run = claim(&plain, "w", head).await;
    plain
        .complete(head, run.token(), None)
        .await
        .expect("complete");

    let events = read_all(&store).await;
    for pair in events.windows(2) {
        assert!(
            pair[0].cursor < pair[1].cursor,
            "in cursor order, each once"
        );
    }
    assert_eq!(kinds_of(&events, a), [Enqueued, Started, Dead]);
    assert_eq!(kinds_of(&events, b), [Enqueued, Cancelled], "G3");
    assert_eq!(kinds_of(&events, c), [Enqueued, Cancelled], "G3's cascade");
    assert_eq!(kinds_of(&events, runs), [Enqueued, Ready], "runs anyway");
    assert_eq!(kinds_of(&events, x), [Enqueued, Started, Succeeded]);
    assert_eq!(kinds_of(&events, y), [Enqueued, Ready]);
    assert_eq!(kinds_of(&events, again), [Enqueued, Started, Failed]);
    assert_eq!(event_of(&events, again, Failed).attempt, 1);
    assert_eq!(kinds_of(&events, last), [Enqueued, Started, Dead]);
    assert_eq!(kinds_of(&events, after_last), [Enqueued, Cancelled]);
    assert_eq!(
        kinds_of(&events, stopped),
        [Enqueued, Started, Cancelled],
        "a cancel request records nothing; the reclaim that ends it does"
    );
    assert_eq!(kinds_of(&events, fitted), [Enqueued, Started]);
    assert_eq!(kinds_of(&events, limited), [Enqueued, Started, Succeeded]);
    assert_eq!(
        kinds_of(&events, reopened),
        [Enqueued, Started, Succeeded, Retried]
    );
    assert_eq!(event_of(&events, reopened, Retried).attempt, 0);
    assert_eq!(kinds_of(&events, spoiled), [Enqueued, Dead]);
    let dead = event_of(&events, spoiled, Dead);
    assert_eq!(
        (dead.queue.as_str(), dead.attempt),
        ("bad", 0),
        "the queue of its ready entry; the unreadable counter reads 0"
    );
    assert_eq!(kinds_of(&events, decoded), [Enqueued, Started, Dead]);
    assert_eq!(kinds_of(&events, head), [Enqueued, Started, Succeeded]);
    assert_eq!(kinds_of(&events, waiting), [Enqueued, Dead]);
    assert_eq!(
        event_of(&events, waiting, Dead).queue,
        "",
        "no queue to name"
    );
    // The jobs' own states agree with what the stream says.
    for (id, state) in [
        (b, JobState::Cancelled),
        (c, JobState::Cancelled),
        (runs, JobState::Queued),
        (y, JobState::Queued),
        (after_last, JobState::Cancelled),
        (reopened, JobState::Queued),
    ] {
        assert_eq!(store.get(id).await.expect("get").state, state, "{id}");
    }
}

/// A job enqueued through a store that does not record carries no mark, and no path of
/// any script writes the stream for it: after enqueues (single, batch, graph), every
/// claim script, completions, failures, releases, reclaims, cancels, retries, a reopen
/// and the buries, the stream key does not exist. Only an emit writes it.
#[tokio::test]
async fn jobs_without_the_mark_never_write_the_stream() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let plain = env.store().await;
    let key = |id: JobId| durq_redis::job_key(&env.settings.namespace, id);
    let graph = plain
        .enqueue_batch(vec![
            NewJob::new("g").max_attempts(1),
            NewJob::new("g").after(durq_core::Dependency::Earlier(0)),
            NewJob::new("g").after(durq_core::Dependency::Earlier(1)),
        ])
        .await
        .expect("graph");
    let run = claim(&plain, "g", graph[0].id).await;
    plain
        .fail(graph[0].id, run.token(), "boom", Retry::Never)
        .await
        .expect("fail");
    let x = plain.enqueue(NewJob::new("r")).await.expect("x").id;
    let y = plain
        .enqueue(NewJob::new("r").after(x))
        .await
        .expect("y")
        .id;
    let run = claim(&plain, "r", x).await;
    plain
        .complete(x, run.token(), None)
        .await
        .expect("complete");
    let run = claim(&plain, "r", y).await;
    plain
        .fail(y, run.token(), "again", Retry::At(env.clock.now()))
        .await
        .expect("fail");
    let run = claim(&plain, "r", y).await;
    plain.release(y, run.token()).await.expect("release");
    let run = claim(&plain, "r", y).await;
    plain
        .save_step(y, run.token(), "s", Bytes::new())
        .await
        .expect("save_step");
    plain
        .complete(y, run.token(), None)
        .await
        .expect("complete");
    plain.retry_from(y, "s", 0).await.expect("retry_from");
    assert_eq!(plain.cancel(y).await.expect("cancel"), JobState::Cancelled);
    plain.retry(y).await.expect("retry");
    claim(&plain, "r", y).await;
    env.clock.advance(Duration::from_secs(31));
    assert_eq!(plain.reclaim(10).await.expect("reclaim").len(), 1);
    let fitted = plain
        .enqueue(NewJob::new("q").needs(Needs::new().amount("gpu", 1)))
        .await
        .expect("enqueue")
        .id;
    assert_eq!(plain.claim(gpu_claim(1, 1)).await.expect("claim").len(), 1);
    plain
        .set_limits("lim", QueueLimits::new().max_running(5))
        .await
        .expect("limits");
    let limited = plain.enqueue(NewJob::new("lim")).await.expect("enqueue").id;
    claim(&plain, "lim", limited).await;
    let spoiled = plain.enqueue(NewJob::new("bad")).await.expect("enqueue").id;
    let _: () = env
        .admin
        .hset(key(spoiled), "att", "x")
        .await
        .expect("HSET");
    let decoded = plain.enqueue(NewJob::new("bad")).await.expect("enqueue").id;
    let _: () = env
        .admin
        .hset(key(decoded), "timeout", "soon")
        .await
        .expect("HSET");
    assert!(plain
        .claim(ClaimRequest::new(["bad"], "w", Duration::from_secs(30)).limit(2))
        .await
        .expect("claim")
        .is_empty());
    for id in [
        graph[0].id,
        graph[1].id,
        x,
        y,
        fitted,
        limited,
        spoiled,
        decoded,
    ] {
        assert!(
            !hash_fields(&mut env, id).await.contains(&"ev".to_owned()),
            "{id} carries no mark"
        );
    }
    assert!(
        !exists(&mut env, "events").await,
        "no script wrote the stream"
    );
    assert!(read_all(&plain).await.is_empty());

    // An emit writes it, mark or none (V1).
    let run = claim(&plain, "lim", {
        plain.enqueue(NewJob::new("lim")).await.expect("enqueue").id
    })
    .await;
    plain
        .emit(run.id(), run.token(), "note", Bytes::new())
        .await
        .expect("emit");
    assert_eq!(stream_len(&mut env).await, 1);
}

/// An emit is fenced by the lease as a saved step is (D1): a token that does not hold
/// it, a job that ended, an unknown job, and a record whose `meta` cannot be read are
/// refused, and nothing is written.
#[tokio::test]
async fn an_emit_without_the_lease_writes_nothing() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let run = claim(&store, "q", id).await;
    let before = raw_stream(&mut env).await;
    assert_eq!(before.len(), 2);
    let stale = LeaseToken::new(run.token().get() + 1);
    let err = store
        .emit(id, stale, "x", Bytes::new())
        .await
        .expect_err("another token");
    assert!(err.is_lease_lost(), "{err}");
    let unknown = JobId::mint(env.clock.now());
    let err = store
        .emit(unknown, run.token(), "x", Bytes::new())
        .await
        .expect_err("an unknown job");
    assert!(
        matches!(err, Error::NotFound { id } if id == unknown),
        "{err}"
    );
    let key = durq_redis::job_key(&env.settings.namespace, id);
    let meta: String = env.admin.hget(&key, "meta").await.expect("HGET");
    let _: () = env
        .admin
        .hset(&key, "meta", "not meta")
        .await
        .expect("HSET");
    let err = store
        .emit(id, run.token(), "x", Bytes::new())
        .await
        .expect_err("an unreadable record");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let _: () = env.admin.hset(&key, "meta", meta).await.expect("HSET");
    assert_eq!(raw_stream(&mut env).await, before, "nothing was written");
    store
        .complete(id, run.token(), None)
        .await
        .expect("complete");
    let err = store
        .emit(id, run.token(), "x", Bytes::new())
        .await
        .expect_err("a job that ended");
    assert!(err.is_lease_lost(), "{err}");
    assert_eq!(stream_len(&mut env).await, 3, "only its success");
}

/// The ids of the stream's entries, oldest first.
async fn stream_ids(env: &mut Env) -> Vec<String> {
    raw_stream(env)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// The trim marker as the server holds it.
async fn marker(env: &mut Env) -> Option<String> {
    let key = env.key("events:trimmed");
    env.admin.get(&key).await.expect("GET")
}

/// A trim deletes every entry but the newest `keep` in one step, and its marker holds
/// the newest id it deleted, which a read compares its cursor with. The marker only
/// moves forward, and one that cannot be read refuses the trim (nothing deleted) and
/// the reads.
#[tokio::test]
async fn a_trim_deletes_the_oldest_and_its_marker_names_the_newest_deleted() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    enqueue_all(&store, (0..2_500).map(|_| NewJob::new("q")).collect()).await;
    let ids = stream_ids(&mut env).await;
    assert_eq!(ids.len(), 2_500);
    assert_eq!(marker(&mut env).await, None);

    // 2,400 to delete, 100 to keep.
    assert_eq!(store.trim_events(100).await.expect("trim"), 2_400);
    assert_eq!(stream_ids(&mut env).await, ids[2_400..]);
    assert_eq!(marker(&mut env).await.as_deref(), Some(ids[2_399].as_str()));
    let at = |id: &str| id.parse::<EventCursor>().expect("an id");
    let (kept, trimmed) = read_from(&store, EventCursor::START, 37).await;
    assert!(trimmed);
    assert_eq!(
        kept.iter()
            .map(|e| e.cursor.to_string())
            .collect::<Vec<_>>(),
        ids[2_400..]
    );
    assert!(read_from(&store, at(&ids[0]), 100).await.1);
    assert!(read_from(&store, at(&ids[2_398]), 100).await.1);
    let (rest, trimmed) = read_from(&store, at(&ids[2_399]), 100).await;
    assert!(!trimmed, "a consumer at the newest deleted missed nothing");
    assert_eq!(rest, kept);
    assert_eq!(store.trim_events(100).await.expect("trim"), 0);

    // Again after more events: 60 to delete, 100 to keep.
    enqueue_all(&store, (0..60).map(|_| NewJob::new("q")).collect()).await;
    let ids = stream_ids(&mut env).await;
    assert_eq!(store.trim_events(100).await.expect("trim"), 60);
    assert_eq!(stream_ids(&mut env).await, ids[60..]);
    assert_eq!(marker(&mut env).await.as_deref(), Some(ids[59].as_str()));

    // The marker only moves forward.
    let ahead = "99999999999999-0";
    let _: () = env
        .admin
        .set(env.key("events:trimmed"), ahead)
        .await
        .expect("SET");
    assert_eq!(store.trim_events(99).await.expect("trim"), 1);
    assert_eq!(marker(&mut env).await.as_deref(), Some(ahead));

    // An unreadable marker: the trim deletes nothing, reads answer Corrupt.
    let _: () = env
        .admin
        .set(env.key("events:trimmed"), "yesterday")
        .await
        .expect("SET");
    let err = store.trim_events(1).await.expect_err("unreadable marker");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(stream_len(&mut env).await, 99);
    let err = store
        .events(EventCursor::START, 10)
        .await
        .expect_err("unreadable marker");
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

/// The newest deleted is the entry the first `XTRIM` leaves at the head, whatever its id:
/// in a millisecond of its own or not, with a sequence past what a Lua number holds
/// exactly (the marker keeps its text), with one entry to delete or all but one. Ids
/// written by hand, so each case is certain.
#[tokio::test]
async fn a_trim_finds_the_newest_deleted_whatever_its_id() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let job = id_text(JobId::mint(env.clock.now()));
    let cases: [(&[&str], u64, &str); 6] = [
        (&["4-0", "5-0", "5-1", "6-0", "7-0"], 2, "5-1"),
        (&["4-0", "5-0", "5-1", "6-0", "7-0"], 3, "5-0"),
        (&["4-0", "5-0", "5-1", "6-0", "7-0"], 4, "4-0"),
        (&["4-0", "5-0", "5-1", "6-0", "7-0"], 1, "6-0"),
        (
            &["1-0", "1-9007199254740993", "2-0"],
            1,
            "1-9007199254740993",
        ),
        (
            &["1-9007199254740993", "1-9007199254740995", "3-0", "4-0"],
            2,
            "1-9007199254740995",
        ),
    ];
    for (entries, keep, newest_deleted) in cases {
        let _: () = env.admin.del(env.key("events")).await.expect("DEL");
        let _: () = env.admin.del(env.key("events:trimmed")).await.expect("DEL");
        for id in entries {
            let _: String = redis::cmd("XADD")
                .arg(env.key("events"))
                .arg(id)
                .arg(&["j", &job, "q", "q", "k", "enqueued", "a", "0", "t", "1"])
                .query_async(&mut env.admin)
                .await
                .expect("XADD");
        }
        let deleted = store.trim_events(keep).await.expect("trim");
        let shown = format!("{entries:?} keep {keep}");
        assert_eq!(deleted, entries.len() as u64 - keep, "{shown}");
        assert_eq!(
            marker(&mut env).await.as_deref(),
            Some(newest_deleted),
            "{shown}"
        );
        let kept = read_all(&store).await;
        assert_eq!(
            kept.iter()
                .map(|e| e.cursor.to_string())
                .collect::<Vec<_>>(),
            entries[entries.len() - keep as usize..],
            "{shown}"
        );
    }
}

/// An entry the stream holds that this build cannot read (a missing field, an unknown
/// kind, a count that is no number) makes a read that reaches it answer `Corrupt`, and
/// changes nothing: the entries stay, the writes go on, and a read past it works.
#[tokio::test]
async fn an_unreadable_entry_answers_corrupt_and_changes_nothing() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let first = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let id = id_text(first);
    let broken: [&[&str]; 3] = [
        &["j", &id, "q", "q", "k", "started", "a", "1"],
        &["j", &id, "q", "q", "k", "exploded", "a", "1", "t", "1"],
        &["j", &id, "q", "q", "k", "started", "a", "one", "t", "1"],
    ];
    for fields in broken {
        let key = env.key("events");
        let bad: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg(fields)
            .query_async(&mut env.admin)
            .await
            .expect("XADD");
        let before = raw_stream(&mut env).await;
        let err = store
            .events(EventCursor::START, 10)
            .await
            .expect_err("an unreadable entry");
        assert!(matches!(err, Error::Corrupt { .. }), "{fields:?}: {err}");
        assert!(err.to_string().contains(&bad), "names the entry: {err}");
        assert_eq!(raw_stream(&mut env).await, before, "a read changes nothing");
        // The writes go on, and a read past the entry reads what follows.
        let next = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
        let page = store
            .events(bad.parse().expect("an id"), 10)
            .await
            .expect("events past it");
        assert_eq!(
            page.events
                .iter()
                .map(|e| (e.job, e.kind))
                .collect::<Vec<_>>(),
            [(next, EventKind::Enqueued)]
        );
        // A trim deletes it like any other entry.
        store.trim_events(1).await.expect("trim");
        assert!(
            store
                .events(EventCursor::START, 10)
                .await
                .expect("events")
                .trimmed
        );
    }
}

/// `drop_namespace` deletes the stream and the trim marker with the namespace's other
/// keys; purging jobs leaves their events.
#[tokio::test]
async fn drop_namespace_deletes_the_stream_and_its_marker_and_purge_keeps_them() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let store = recording(&env).await;
    let id = store.enqueue(NewJob::new("q")).await.expect("enqueue").id;
    let run = claim(&store, "q", id).await;
    store
        .complete(id, run.token(), None)
        .await
        .expect("complete");
    assert_eq!(store.trim_events(2).await.expect("trim"), 1);
    env.clock.advance(Duration::from_secs(30 * 24 * 3600));
    assert_eq!(store.purge(10).await.expect("purge"), 1);
    assert!(exists(&mut env, "events").await);
    assert_eq!(stream_len(&mut env).await, 2, "purge leaves the events");
    assert!(exists(&mut env, "events:trimmed").await);
    store.redis.drop_namespace().await.expect("drop");
    assert!(!exists(&mut env, "events").await);
    assert!(!exists(&mut env, "events:trimmed").await);
}

/// A partitioned namespace declares no `Events` (CONTRACT §8): the handle answers
/// `Unsupported`, the backend called directly too, and a store set to record events
/// marks no job and writes no stream in any partition.
#[tokio::test]
async fn a_partitioned_namespace_declares_no_events_and_marks_no_job() {
    let Some(mut env) = Env::new().await else {
        return;
    };
    let backend = RedisConfig::new(url())
        .partitions(12)
        .open(env.settings.clone().record_events(KEEP))
        .await
        .expect("partitioned");
    assert!(durq_core::Backend::as_events(&backend).is_none());
    let store = Store::new(backend.clone());
    assert!(!store.supports(Capability::Events));
    for err in [
        store
            .events(EventCursor::START, 10)
            .await
            .expect_err("events"),
        store.trim_events(1).await.map(drop).expect_err("trim"),
    ] {
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    }
    let direct = durq_core::Events::trim_events(&backend, 1)
        .await
        .expect_err("the backend directly");
    assert!(matches!(direct, Error::Unsupported { .. }), "{direct}");
    let ids = enqueue_all(&store, (0..24).map(|_| NewJob::new("q")).collect()).await;
    let claimed = store
        .claim(ClaimRequest::new(["q"], "w", Duration::from_secs(30)).limit(24))
        .await
        .expect("claim");
    for job in &claimed {
        store
            .complete(job.id(), job.token(), None)
            .await
            .expect("complete");
        let err = store
            .emit(job.id(), job.token(), "x", Bytes::new())
            .await
            .expect_err("emit");
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    }
    for id in ids {
        let key = durq_redis::job_key_in(&env.settings.namespace, 12, id);
        let fields: Vec<String> = env.admin.hkeys(&key).await.expect("HKEYS");
        assert!(!fields.contains(&"ev".to_owned()), "{id} carries no mark");
    }
    let pattern = format!("jobs:{{{}[}}#]*events*", env.settings.namespace);
    let found: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut env.admin)
        .await
        .expect("KEYS");
    assert!(found.is_empty(), "streams written: {found:?}");
}

/// On a cluster (`JOBS_REDIS_CLUSTER_URLS`): the stream and its marker are in the
/// namespace's slot by the cluster's own reckoning (`CLUSTER KEYSLOT`), and every
/// script that writes them runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_the_stream_in_the_namespaces_slot() {
    let Ok(urls) = std::env::var("JOBS_REDIS_CLUSTER_URLS") else {
        eprintln!("cluster test skipped: JOBS_REDIS_CLUSTER_URLS is not set");
        return;
    };
    let urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
    let namespace = durq_conformance::unique_namespace("clevents");
    let _cleanup = Cleanup::new(urls.clone(), &namespace);
    let store = Store::new(
        RedisConfig::cluster(urls.iter().cloned())
            .open(
                StoreSettings::default()
                    .namespace(namespace.clone())
                    .record_events(KEEP),
            )
            .await
            .expect("connect cluster"),
    );
    let graph = store
        .enqueue_batch(vec![
            NewJob::new("q"),
            NewJob::new("q").after(durq_core::Dependency::Earlier(0)),
        ])
        .await
        .expect("enqueue");
    let run = claim(&store, "q", graph[0].id).await;
    store
        .emit(run.id(), run.token(), "x", Bytes::new())
        .await
        .expect("emit");
    store
        .complete(run.id(), run.token(), None)
        .await
        .expect("complete");
    let run = claim(&store, "q", graph[1].id).await;
    store
        .fail(run.id(), run.token(), "no", Retry::Never)
        .await
        .expect("fail");
    store.retry(run.id()).await.expect("retry");
    assert_eq!(store.trim_events(3).await.expect("trim"), 6);
    let page = store.events(EventCursor::START, 100).await.expect("events");
    assert!(page.trimmed);
    assert_eq!(
        page.events.iter().map(|e| e.kind).collect::<Vec<_>>(),
        [EventKind::Started, EventKind::Dead, EventKind::Retried]
    );
    let node = redis::Client::open(urls[0].as_str()).expect("url");
    let mut conn = node
        .get_multiplexed_async_connection()
        .await
        .expect("a node");
    let mut slots = Vec::new();
    for key in [
        durq_redis::job_key(&namespace, graph[0].id),
        format!("jobs:{{{namespace}}}:events"),
        format!("jobs:{{{namespace}}}:events:trimmed"),
    ] {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("KEYSLOT");
        slots.push(slot);
    }
    assert!(slots.windows(2).all(|w| w[0] == w[1]), "{slots:?}");
}

/// CONTRACT V4 under load: 24 tasks on 6 stores (each its own connection, so grouped
/// enqueues and completions of different tasks share script calls) run jobs through
/// failures, releases and emits, while a reader on a store of its own follows the
/// stream from `next` in pages of 50. Its history holds each event once, in cursor
/// order, skips none (it is the whole stream read afterwards), and holds each job's
/// events in the order its task made them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_and_a_reader_following_next_see_each_event_once_in_order() {
    use EventKind::*;
    const STORES: usize = 6;
    const TASKS: usize = 24;
    const JOBS: usize = 15;
    let Some(env) = Env::new().await else {
        return;
    };
    let mut stores = Vec::new();
    for _ in 0..STORES {
        stores.push(recording(&env).await);
    }
    let reader_store = recording(&env).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let store = reader_store.clone();
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut history: Vec<Event> = Vec::new();
            let mut after = EventCursor::START;
            loop {
                let last_round = done.load(std::sync::atomic::Ordering::SeqCst);
                let page = store.events(after, 50).await.expect("events");
                assert!(!page.trimmed, "nothing was trimmed");
                let empty = page.events.is_empty();
                after = page.next;
                history.extend(page.events);
                if empty && last_round {
                    return history;
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = stores[task % STORES].clone();
        tasks.push(tokio::spawn(async move {
            let queue = format!("v4-{task}");
            let mut expected: Vec<(JobId, Vec<EventKind>)> = Vec::new();
            for job in 0..JOBS {
                let id = store
                    .enqueue(NewJob::new(queue.as_str()))
                    .await
                    .expect("enqueue")
                    .id;
                let run = claim(&store, &queue, id).await;
                let kinds = match job % 3 {
                    0 => vec![Enqueued, Started, Succeeded],
                    1 => {
                        store
                            .fail(id, run.token(), "again", Retry::At(store.now()))
                            .await
                            .expect("fail");
                        vec![Enqueued, Started, Failed, Started, Succeeded]
                    }
                    _ => {
                        store.release(id, run.token()).await.expect("release");
                        vec![Enqueued, Started, Released, Started, Emitted, Succeeded]
                    }
                };
                let run = if job % 3 == 0 {
                    run
                } else {
                    claim(&store, &queue, id).await
                };
                if job % 3 == 2 {
                    store
                        .emit(id, run.token(), "half", Bytes::from_static(b"50"))
                        .await
                        .expect("emit");
                }
                store
                    .complete(id, run.token(), None)
                    .await
                    .expect("complete");
                expected.push((id, kinds));
            }
            expected
        }));
    }
    let mut expected: BTreeMap<JobId, Vec<EventKind>> = BTreeMap::new();
    for task in tasks {
        expected.extend(task.await.expect("writer"));
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let history = reader.await.expect("reader");

    for pair in history.windows(2) {
        assert!(
            pair[0].cursor < pair[1].cursor,
            "each event once, in cursor order: {} then {}",
            pair[0].cursor,
            pair[1].cursor
        );
    }
    let whole = read_all(&reader_store).await;
    assert_eq!(history.len(), whole.len(), "the reader skipped events");
    assert_eq!(history, whole, "the reader's history is the stream");
    let mut per_job: BTreeMap<JobId, Vec<EventKind>> = BTreeMap::new();
    for event in &history {
        per_job.entry(event.job).or_default().push(event.kind);
    }
    assert_eq!(
        per_job, expected,
        "each job's events in the order of its changes"
    );
    assert_eq!(
        history.len(),
        expected.values().map(Vec::len).sum::<usize>()
    );
}
