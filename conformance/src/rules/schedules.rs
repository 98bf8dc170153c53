//! Rules S1–S3: schedules (periodic jobs).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use durq_core::{
    CatchUp, Clock, Error, JobId, NewJob, Schedule, ScheduleRecord, ScheduleUpdate, Store,
    Timestamp,
};
use tokio::sync::Barrier;

use super::support::{expect_invalid, join_all, list_all, Must};
use crate::{Harness, TestEnv};

fn every_second(name: &str, queue: &str) -> Schedule {
    Schedule::every(name, Duration::from_secs(1), NewJob::new(queue))
}

async fn record(store: &Store, name: &str, what: &str) -> ScheduleRecord {
    store
        .schedules()
        .await
        .must(what)
        .into_iter()
        .find(|r| r.schedule.name == name)
        .unwrap_or_else(|| panic!("{what}: schedule {name} is not listed"))
}

fn expect_unknown<T: std::fmt::Debug>(result: durq_core::Result<T>, name: &str, what: &str) {
    match result {
        Err(Error::ScheduleNotFound { name: named }) => assert_eq!(named, name, "{what}"),
        other => panic!("{what}: expected ScheduleNotFound, got {other:?}"),
    }
}

/// S1: schedules are stored by name with their definition; listing shows them sorted,
/// with enabled, last tick (the instant of a new one's put) and next tick; putting a
/// known name replaces its definition only; deleting answers whether it existed; a bad
/// definition is refused and writes nothing.
pub async fn s1_schedules_are_stored_by_name(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let put_at = env.clock.now();
    let nightly = Schedule::cron("nightly", "0 0 2 * * *", NewJob::new("reports").priority(3))
        .time_zone("Europe/Paris");
    store.put_schedule(&nightly).await.must("S1: put");
    store
        .put_schedule(&every_second("beat", "pings"))
        .await
        .must("S1: put");
    let listed = store.schedules().await.must("S1: list");
    let names: Vec<&str> = listed.iter().map(|r| r.schedule.name.as_str()).collect();
    assert_eq!(names, ["beat", "nightly"], "S1: listed by name");
    let beat = &listed[0];
    assert!(beat.enabled, "S1: a new schedule is enabled");
    assert_eq!(
        beat.last_tick, put_at,
        "S1: a new schedule fires from its put"
    );
    assert_eq!(
        beat.next_tick,
        Some(Timestamp::from_millis(
            (put_at.as_millis() / 1000 + 1) * 1000
        )),
        "S1: the next tick"
    );
    assert_eq!(
        listed[1].schedule, nightly,
        "S1: the definition round-trips"
    );

    // A put of a known name replaces the definition, and keeps enabled and last tick.
    store.disable_schedule("beat").await.must("S1: disable");
    store
        .backend()
        .require_schedules()
        .expect("the scenario runs only where Schedules is declared")
        .update_schedule(
            "beat",
            ScheduleUpdate {
                enabled: None,
                last_tick: Some(put_at.saturating_add(Duration::from_secs(5))),
            },
        )
        .await
        .must("S1: a firing");
    env.clock.advance(Duration::from_secs(60));
    let changed = every_second("beat", "other-queue");
    store.put_schedule(&changed).await.must("S1: put again");
    let beat = record(&store, "beat", "S1").await;
    assert_eq!(beat.schedule, changed, "S1: the definition is replaced");
    assert!(!beat.enabled, "S1: a put keeps the schedule disabled");
    assert_eq!(
        beat.last_tick,
        put_at.saturating_add(Duration::from_secs(5)),
        "S1: a put keeps the last tick"
    );

    expect_invalid(
        store
            .put_schedule(&Schedule::cron(
                "bad",
                "every now and then",
                NewJob::new("q"),
            ))
            .await,
        "cadence",
        "S1: a bad cron expression",
    );
    expect_invalid(
        store
            .put_schedule(
                &every_second("bad", "q")
                    .time_zone("UTC")
                    .catch_up(CatchUp::All { max: 0 }),
            )
            .await,
        "catch_up",
        "S1: a bad catch-up",
    );
    expect_invalid(
        store.put_schedule(&every_second("bad", "no queue!")).await,
        "queue",
        "S1: a bad job",
    );
    expect_invalid(
        store
            .put_schedule(
                &Schedule::cron("bad", "* * * * * *", NewJob::new("q")).time_zone("Mars/Base"),
            )
            .await,
        "time_zone",
        "S1: an unknown time zone",
    );
    expect_invalid(
        store
            .put_schedule(&Schedule::every(
                "bad",
                Duration::from_micros(1500),
                NewJob::new("q"),
            ))
            .await,
        "cadence",
        "S1: an interval that is not whole milliseconds",
    );
    expect_invalid(
        store
            .put_schedule(&Schedule::every(
                "bad",
                Duration::from_secs(1),
                NewJob::new("q").idempotency_key("mine"),
            ))
            .await,
        "schedule job",
        "S1: a job with its own key",
    );
    expect_invalid(
        store.put_schedule(&every_second("bad name!", "q")).await,
        "schedule name",
        "S1: a bad name",
    );
    expect_invalid(
        store.enable_schedule("bad name!").await,
        "schedule name",
        "S1: enable with a bad name",
    );
    assert_eq!(
        store.schedules().await.must("S1").len(),
        2,
        "S1: nothing written"
    );

    assert!(store.delete_schedule("beat").await.must("S1: delete"));
    assert!(!store.delete_schedule("beat").await.must("S1: delete again"));
    expect_unknown(store.enable_schedule("beat").await, "beat", "S1: enable");
    expect_unknown(store.disable_schedule("beat").await, "beat", "S1: disable");
    let names: Vec<String> = store
        .schedules()
        .await
        .must("S1")
        .into_iter()
        .map(|r| r.schedule.name)
        .collect();
    assert_eq!(names, ["nightly"]);
}

/// S2: enabling or disabling changes only `enabled`; a firing changes only the last
/// tick, and only forward, so a disable survives a firing that read the schedule
/// before it; a disabled schedule does not fire.
pub async fn s2_a_disable_survives_a_firing_that_races_it(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    store
        .put_schedule(&every_second("beat", "pings"))
        .await
        .must("S2: put");
    let start = env.clock.now();
    store.disable_schedule("beat").await.must("S2: disable");
    // The firing that read the schedule before the disable now records its tick.
    let tick = start.saturating_add(Duration::from_secs(1));
    store
        .backend()
        .require_schedules()
        .expect("the scenario runs only where Schedules is declared")
        .update_schedule(
            "beat",
            ScheduleUpdate {
                enabled: None,
                last_tick: Some(tick),
            },
        )
        .await
        .must("S2: the racing firing");
    let beat = record(&store, "beat", "S2").await;
    assert!(!beat.enabled, "S2: the firing did not enable it again");
    assert_eq!(beat.last_tick, tick, "S2: the firing moved the last tick");
    // The last tick never moves back.
    store
        .backend()
        .require_schedules()
        .expect("the scenario runs only where Schedules is declared")
        .update_schedule(
            "beat",
            ScheduleUpdate {
                enabled: None,
                last_tick: Some(start),
            },
        )
        .await
        .must("S2: a late firing");
    assert_eq!(record(&store, "beat", "S2").await.last_tick, tick);

    env.clock.advance(Duration::from_secs(10));
    let fired = store.fire_schedules().await.must("S2: fire while disabled");
    assert!(fired.is_empty(), "S2: a disabled schedule does not fire");
    assert_eq!(record(&store, "beat", "S2").await.last_tick, tick);

    store.enable_schedule("beat").await.must("S2: enable");
    let beat = record(&store, "beat", "S2").await;
    assert!(beat.enabled);
    assert_eq!(
        beat.last_tick, tick,
        "S2: enabling leaves the last tick alone"
    );
    let fired = store.fire_schedules().await.must("S2: fire");
    assert_eq!(fired.len(), 1, "S2: enabled again, the latest tick fires");
}

/// S3: schedulers on four handles fire at every one of 30 ticks at once; each tick is
/// enqueued exactly once, ready at its tick, under the tick's key.
pub async fn s3_concurrent_schedulers_fire_each_tick_once(harness: &dyn Harness) {
    const SCHEDULERS: usize = 4;
    const TICKS: i64 = 30;
    let env = TestEnv::new(harness);
    let mut stores = Vec::new();
    for _ in 0..SCHEDULERS {
        stores.push(env.store().await);
    }
    // Start on a whole second, so the ticks are the seconds that follow.
    let start = Timestamp::from_millis((env.clock.now().as_millis() / 1000 + 1) * 1000);
    env.clock.set(start);
    let schedule = every_second("beat", "beats");
    stores[0].put_schedule(&schedule).await.must("S3: put");
    let mut created = 0;
    for step in 1..=TICKS {
        env.clock
            .set(start.saturating_add(Duration::from_secs(step.unsigned_abs())));
        let barrier = Arc::new(Barrier::new(SCHEDULERS));
        let handles = stores
            .iter()
            .map(|store| {
                let store = store.clone();
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.fire_schedules().await.must("S3: fire")
                })
            })
            .collect();
        created += join_all(handles).await.iter().map(Vec::len).sum::<usize>();
    }
    let jobs = list_all(&stores[0], "beats", None, "S3").await;
    assert_eq!(jobs.len(), 30, "S3: one job per tick, {TICKS} ticks");
    assert_eq!(created, 30, "S3: the firings report each job once");
    let expected: HashSet<Timestamp> = (1..=TICKS)
        .map(|s| start.saturating_add(Duration::from_secs(s.unsigned_abs())))
        .collect();
    let ticks: HashSet<Timestamp> = jobs.iter().map(|j| j.run_at).collect();
    assert_eq!(ticks, expected, "S3: each job is ready at its tick");
    for job in &jobs {
        assert_eq!(
            job.idempotency_key.as_deref(),
            Some(schedule.tick_key(job.run_at).as_str()),
            "S3: each job carries its tick's key"
        );
    }
}

/// S3: after downtime the catch-up policy decides: the latest tick once, each of the
/// latest `max`, or nothing older than the grace; the last tick moves to the latest
/// either way.
pub async fn s3_missed_ticks_follow_the_catch_up_policy(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let start = Timestamp::from_millis((env.clock.now().as_millis() / 1000 + 1) * 1000);
    env.clock.set(start);
    let policies = [
        ("latest", CatchUp::Latest, 1u64),
        ("all", CatchUp::All { max: 3 }, 3),
        (
            "skip",
            CatchUp::Skip {
                grace: Duration::from_millis(500),
            },
            0,
        ),
    ];
    for (name, catch_up, _) in &policies {
        let schedule =
            Schedule::every(*name, Duration::from_secs(1), NewJob::new(*name)).catch_up(*catch_up);
        store.put_schedule(&schedule).await.must("S3: put");
    }
    // Ten ticks missed, the last one 700 ms ago.
    env.clock
        .set(start.saturating_add(Duration::from_millis(10_700)));
    store.fire_schedules().await.must("S3: fire after downtime");
    let latest = start.saturating_add(Duration::from_secs(10));
    for (name, _, jobs) in &policies {
        let listed = list_all(&store, name, None, "S3").await;
        assert_eq!(
            listed.len() as u64,
            *jobs,
            "S3: {name} enqueues {jobs} jobs"
        );
        let mut ticks: Vec<Timestamp> = listed.iter().map(|j| j.run_at).collect();
        ticks.sort_unstable();
        let expected: Vec<Timestamp> = (0..*jobs)
            .rev()
            .map(|back| latest.saturating_sub(Duration::from_secs(back)))
            .collect();
        assert_eq!(ticks, expected, "S3: {name} fires the latest ticks");
        assert_eq!(
            record(&store, name, "S3").await.last_tick,
            latest,
            "S3: {name} moves the last tick to the latest"
        );
    }
    let ids: HashSet<JobId> = store
        .fire_schedules()
        .await
        .must("S3: fire again")
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert!(ids.is_empty(), "S3: nothing is due twice");
}

/// S3: a schedule that cannot fire (here, its stored definition is unreadable) holds up
/// no other: the pass fires the rest, then reports the error.
pub async fn s3_a_schedule_that_cannot_fire_holds_up_no_other(harness: &dyn Harness) {
    let env = TestEnv::new(harness);
    let store = env.store().await;
    let start = Timestamp::from_millis((env.clock.now().as_millis() / 1000 + 1) * 1000);
    env.clock.set(start);
    store
        .backend()
        .require_schedules()
        .expect("the scenario runs only where Schedules is declared")
        .put_schedule("broken", "{ not a schedule", start)
        .await
        .must("S3: store an unreadable definition");
    store
        .put_schedule(&every_second("sound", "sound"))
        .await
        .must("S3: put");
    env.clock.advance(Duration::from_secs(1));
    match store.fire_schedules().await {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("S3: expected the unreadable schedule's error, got {other:?}"),
    }
    let jobs = list_all(&store, "sound", None, "S3").await;
    assert_eq!(jobs.len(), 1, "S3: the sound schedule fired all the same");
}
