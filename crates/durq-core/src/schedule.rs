//! Periodic jobs (CONTRACT S1–S3): a schedule names a cadence (a cron expression in a
//! time zone, or a fixed interval) and the job each tick enqueues.
//!
//! Ticks fire once however many schedulers run: each tick is enqueued with the
//! idempotency key [`Schedule::tick_key`], derived from the schedule's name and the
//! tick's instant, so schedulers in any number of processes agree without a leader.
//! The store keeps each schedule's definition, whether it is enabled, and its last
//! tick; a firing moves the last tick forward and never touches `enabled`, so a
//! disable is never undone by a firing that races it.

use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use chrono::TimeZone;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{NewJob, Uniqueness};
use crate::time::{duration_millis, Timestamp};

/// When a schedule's ticks fall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cadence {
    /// A cron expression with a seconds field (`sec min hour day-of-month month
    /// day-of-week [year]`, as the `cron` crate reads it), in an IANA time zone
    /// (`"UTC"`, `"Europe/Paris"`): `"0 30 9 * * Mon-Fri"` is 09:30 on weekdays there.
    Cron {
        /// The expression.
        expression: String,
        /// The time zone it is read in.
        time_zone: String,
    },
    /// Every this long, counted from the Unix epoch (so every scheduler agrees on the
    /// ticks): whole milliseconds, at least one.
    Every(Duration),
}

/// What a scheduler does with ticks it missed (the store was down, no scheduler ran).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CatchUp {
    /// Fire only the latest due tick, and only if it is at most `grace` old; older
    /// ticks are skipped.
    Skip {
        /// How late a tick may still fire.
        grace: Duration,
    },
    /// Fire the latest due tick, once, however many were missed (the default).
    #[default]
    Latest,
    /// Fire each missed tick, oldest first, but at most the `max` latest.
    All {
        /// The most ticks one firing enqueues for one schedule.
        max: u32,
    },
}

/// A periodic job: its name (unique in the namespace), its cadence, its catch-up policy
/// and the job each tick enqueues.
///
/// ```
/// use std::time::Duration;
/// use durq_core::{NewJob, Schedule};
/// let nightly = Schedule::cron("nightly-report", "0 0 2 * * *", NewJob::new("reports"))
///     .time_zone("Europe/Paris");
/// let heartbeat = Schedule::every("ping", Duration::from_secs(30), NewJob::new("pings"));
/// # let _ = (nightly, heartbeat);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// `[A-Za-z0-9._:-]`, 1..=128 bytes.
    pub name: String,
    /// When it ticks.
    pub cadence: Cadence,
    /// What it does with missed ticks.
    pub catch_up: CatchUp,
    /// The job of each tick: queue, payload, tenant, priority, attempts, timeout. It
    /// may not carry a `run_at`, `delay`, `parent` or idempotency key: each tick's job
    /// is ready at its tick and keyed by it.
    pub job: NewJob,
}

impl Schedule {
    /// A schedule on a cron expression (with seconds), read in UTC until
    /// [`Schedule::time_zone`] says otherwise.
    pub fn cron(name: impl Into<String>, expression: impl Into<String>, job: NewJob) -> Self {
        Schedule {
            name: name.into(),
            cadence: Cadence::Cron {
                expression: expression.into(),
                time_zone: "UTC".to_owned(),
            },
            catch_up: CatchUp::default(),
            job,
        }
    }

    /// A schedule ticking every `interval`, counted from the Unix epoch.
    pub fn every(name: impl Into<String>, interval: Duration, job: NewJob) -> Self {
        Schedule {
            name: name.into(),
            cadence: Cadence::Every(interval),
            catch_up: CatchUp::default(),
            job,
        }
    }

    /// Reads the cron expression in `time_zone` (an IANA name); no effect on an
    /// interval.
    pub fn time_zone(mut self, time_zone: impl Into<String>) -> Self {
        if let Cadence::Cron {
            time_zone: zone, ..
        } = &mut self.cadence
        {
            *zone = time_zone.into();
        }
        self
    }

    /// Sets the catch-up policy.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The idempotency key of the job of the tick at `tick`: every scheduler derives
    /// the same one, so the tick is enqueued once (CONTRACT S3).
    pub fn tick_key(&self, tick: Timestamp) -> String {
        format!("jobs.cron/{}/{}", self.name, tick.as_millis())
    }

    /// The job of the tick at `tick`: the schedule's job, ready at the tick, keyed by it.
    pub fn tick_job(&self, tick: Timestamp) -> NewJob {
        let mut job = self.job.clone();
        job.run_at = Some(tick);
        job.idempotency_key = Some(self.tick_key(tick));
        job.uniqueness = Uniqueness::Window;
        job
    }

    /// Checks everything but the job's own fields (the `Store` checks those as it
    /// checks any job): the cadence parses, the interval is whole milliseconds, the
    /// job carries none of the fields a tick sets.
    pub fn validate(&self) -> Result<()> {
        crate::validate::validate_name("schedule name", &self.name, 128)?;
        Ticks::new(&self.cadence)?;
        let job = &self.job;
        if job.run_at.is_some() || job.delay.is_some() {
            return Err(Error::invalid(
                "schedule job",
                "a schedule's job is ready at its tick: no run_at or delay",
            ));
        }
        if job.parent.is_some() || job.idempotency_key.is_some() {
            return Err(Error::invalid(
                "schedule job",
                "a schedule's job has no parent and no idempotency key: each tick is keyed by the schedule",
            ));
        }
        if let CatchUp::All { max: 0 } = self.catch_up {
            return Err(Error::invalid("catch_up", "All needs max >= 1"));
        }
        Ok(())
    }

    /// The ticks to fire now, and how far the last tick moves: the ticks in
    /// `(last, now]`, cut by the catch-up policy. `None` when no tick is due.
    pub fn due(&self, last: Timestamp, now: Timestamp) -> Result<Option<Due>> {
        let keep = match self.catch_up {
            CatchUp::All { max } => usize::try_from(max).unwrap_or(usize::MAX).max(1),
            CatchUp::Latest | CatchUp::Skip { .. } => 1,
        };
        let ticks = Ticks::new(&self.cadence)?.between(last, now, keep);
        let Some(&latest) = ticks.last() else {
            return Ok(None);
        };
        let fire = match self.catch_up {
            CatchUp::Skip { grace } if latest < now.saturating_sub(grace) => Vec::new(),
            _ => ticks,
        };
        Ok(Some(Due { fire, latest }))
    }

    /// The first tick after `after`, if the cadence has one.
    pub fn next_after(&self, after: Timestamp) -> Result<Option<Timestamp>> {
        Ok(Ticks::new(&self.cadence)?.next_after(after))
    }

    /// The stored form of the schedule (its definition, without its name).
    pub fn to_spec(&self) -> Result<String> {
        serde_json::to_string(&Spec::from(self))
            .map_err(|err| Error::invalid("schedule", format!("cannot encode: {err}")))
    }

    /// Reads a schedule back from its name and stored form.
    pub fn from_spec(name: &str, spec: &str) -> Result<Self> {
        let spec: Spec = serde_json::from_str(spec)
            .map_err(|err| Error::corrupt(format!("schedule {name}"), err.to_string()))?;
        Ok(spec.into_schedule(name))
    }
}

/// What one firing of a schedule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The ticks to enqueue, oldest first (empty when the catch-up policy skips them).
    pub fire: Vec<Timestamp>,
    /// The latest due tick: the schedule's last tick afterwards.
    pub latest: Timestamp,
}

/// A schedule as the store holds it (CONTRACT S1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// The definition.
    pub schedule: Schedule,
    /// Whether schedulers fire it.
    pub enabled: bool,
    /// The latest tick fired (or skipped); a new schedule starts at the instant it was
    /// put, so it fires from then on.
    pub last_tick: Timestamp,
    /// The next tick after `last_tick`, if the cadence has one.
    pub next_tick: Option<Timestamp>,
}

/// A schedule as a backend stores it: the definition is opaque text to the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    /// The schedule's name.
    pub name: String,
    /// [`Schedule::to_spec`].
    pub spec: String,
    /// Whether schedulers fire it.
    pub enabled: bool,
    /// The latest tick fired.
    pub last_tick: Timestamp,
}

/// A change to a stored schedule: only the fields set change (CONTRACT S2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleUpdate {
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// Move the last tick here, if that is later than where it is.
    pub last_tick: Option<Timestamp>,
}

/// The ticks of a cadence.
enum Ticks {
    Cron(Box<cron::Schedule>, chrono_tz::Tz),
    Every(i64),
}

impl Ticks {
    fn new(cadence: &Cadence) -> Result<Self> {
        match cadence {
            Cadence::Cron {
                expression,
                time_zone,
            } => {
                let schedule = cron::Schedule::from_str(expression)
                    .map_err(|err| Error::invalid("cadence", format!("{expression:?}: {err}")))?;
                let zone = time_zone
                    .parse::<chrono_tz::Tz>()
                    .map_err(|err| Error::invalid("time_zone", format!("{time_zone:?}: {err}")))?;
                Ok(Ticks::Cron(Box::new(schedule), zone))
            }
            Cadence::Every(interval) => {
                let millis = duration_millis(*interval);
                if millis < 1 || Duration::from_millis(millis.unsigned_abs()) != *interval {
                    return Err(Error::invalid(
                        "cadence",
                        "an interval is whole milliseconds, at least 1",
                    ));
                }
                Ok(Ticks::Every(millis))
            }
        }
    }

    fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        match self {
            Ticks::Every(step) => {
                let next = after.as_millis().div_euclid(*step).checked_add(1)?;
                next.checked_mul(*step).map(Timestamp::from_millis)
            }
            Ticks::Cron(schedule, zone) => {
                let start = zone.timestamp_millis_opt(after.as_millis()).single()?;
                schedule
                    .after(&start)
                    .next()
                    .map(|t| Timestamp::from_millis(t.timestamp_millis()))
            }
        }
    }

    /// The last `keep` ticks in `(last, now]`, oldest first.
    fn between(&self, last: Timestamp, now: Timestamp, keep: usize) -> Vec<Timestamp> {
        if now <= last {
            return Vec::new();
        }
        match self {
            Ticks::Every(step) => {
                let newest = now.as_millis().div_euclid(*step);
                let oldest = last.as_millis().div_euclid(*step) + 1;
                let count = (newest - oldest + 1).max(0);
                let keep = i64::try_from(keep).unwrap_or(i64::MAX).min(count);
                ((newest - keep + 1)..=newest)
                    .filter_map(|n| n.checked_mul(*step))
                    .map(Timestamp::from_millis)
                    .collect()
            }
            Ticks::Cron(schedule, zone) => {
                let Some(start) = zone.timestamp_millis_opt(last.as_millis()).single() else {
                    return Vec::new();
                };
                let mut kept = std::collections::VecDeque::with_capacity(keep.min(1024));
                for tick in schedule.after(&start) {
                    let tick = Timestamp::from_millis(tick.timestamp_millis());
                    if tick > now {
                        break;
                    }
                    if kept.len() == keep {
                        kept.pop_front();
                    }
                    kept.push_back(tick);
                }
                kept.into()
            }
        }
    }
}

/// The stored form: what a schedule is, without its name (the store's key).
#[derive(Serialize, Deserialize)]
struct Spec {
    cadence: Cadence,
    catch_up: CatchUp,
    queue: String,
    payload: Vec<u8>,
    tenant: String,
    priority: i16,
    max_attempts: u32,
    timeout_ms: Option<u64>,
}

impl From<&Schedule> for Spec {
    fn from(schedule: &Schedule) -> Self {
        let job = &schedule.job;
        Spec {
            cadence: schedule.cadence.clone(),
            catch_up: schedule.catch_up,
            queue: job.queue.clone(),
            payload: job.payload.to_vec(),
            tenant: job.tenant.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            timeout_ms: job
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

impl Spec {
    fn into_schedule(self, name: &str) -> Schedule {
        let mut job = NewJob::new(self.queue)
            .payload(Bytes::from(self.payload))
            .tenant(self.tenant)
            .priority(self.priority)
            .max_attempts(self.max_attempts);
        job.timeout = self.timeout_ms.map(Duration::from_millis);
        Schedule {
            name: name.to_owned(),
            cadence: self.cadence,
            catch_up: self.catch_up,
            job,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_millis(secs * 1000)
    }

    #[test]
    fn an_interval_ticks_on_multiples_from_the_epoch() {
        let s = Schedule::every("s", Duration::from_secs(10), NewJob::new("q"));
        let due = s.due(at(95), at(131)).expect("due").expect("ticks");
        assert_eq!(due.fire, vec![at(130)], "Latest fires the last tick only");
        assert_eq!(due.latest, at(130));
        assert_eq!(s.due(at(130), at(139)).expect("due"), None);
        let all = s.clone().catch_up(CatchUp::All { max: 3 });
        let due = all.due(at(95), at(161)).expect("due").expect("ticks");
        assert_eq!(due.fire, vec![at(140), at(150), at(160)]);
        assert_eq!(s.next_after(at(130)).expect("next"), Some(at(140)));
    }

    #[test]
    fn skip_fires_only_a_tick_within_its_grace() {
        let s = Schedule::every("s", Duration::from_secs(10), NewJob::new("q")).catch_up(
            CatchUp::Skip {
                grace: Duration::from_secs(5),
            },
        );
        let late = s.due(at(0), at(107)).expect("due").expect("ticks");
        assert!(late.fire.is_empty(), "a tick 7 s late is skipped");
        assert_eq!(late.latest, at(100), "and counted as done");
        let on_time = s.due(at(0), at(103)).expect("due").expect("ticks");
        assert_eq!(on_time.fire, vec![at(100)]);
    }

    #[test]
    fn a_cron_expression_is_read_in_its_time_zone() {
        // 09:00 in Paris is 08:00 UTC in winter.
        let s = Schedule::cron("s", "0 0 9 * * *", NewJob::new("q")).time_zone("Europe/Paris");
        let jan_1 = Timestamp::from_millis(1_704_067_200_000); // 2024-01-01T00:00Z
        let next = s.next_after(jan_1).expect("next").expect("a tick");
        assert_eq!(
            next,
            Timestamp::from_millis(1_704_067_200_000 + 8 * 3600 * 1000)
        );
        let every_second = Schedule::cron("s", "* * * * * *", NewJob::new("q"))
            .catch_up(CatchUp::All { max: 1000 });
        let due = every_second
            .due(jan_1, jan_1.saturating_add(Duration::from_secs(30)))
            .expect("due")
            .expect("ticks");
        assert_eq!(due.fire.len(), 30);
    }

    #[test]
    fn bad_definitions_are_refused() {
        let job = NewJob::new("q");
        let field = |s: Schedule| match s.validate() {
            Err(Error::InvalidInput { field, .. }) => Some(field),
            _ => None,
        };
        assert_eq!(
            field(Schedule::cron("s", "not cron", job.clone())),
            Some("cadence")
        );
        assert_eq!(
            field(Schedule::cron("s", "* * * * * *", job.clone()).time_zone("Mars/Base")),
            Some("time_zone")
        );
        assert_eq!(
            field(Schedule::every(
                "s",
                Duration::from_micros(1500),
                job.clone()
            )),
            Some("cadence")
        );
        assert_eq!(
            field(Schedule::every("s", Duration::ZERO, job.clone())),
            Some("cadence")
        );
        assert_eq!(
            field(Schedule::every(
                "s",
                Duration::from_secs(1),
                job.clone().idempotency_key("k")
            )),
            Some("schedule job")
        );
        assert_eq!(
            field(Schedule::every("bad name!", Duration::from_secs(1), job)),
            Some("schedule name")
        );
    }

    #[test]
    fn the_stored_form_round_trips() {
        let s = Schedule::cron(
            "nightly",
            "0 0 2 * * *",
            NewJob::new("reports")
                .payload(&b"\x00\xff"[..])
                .tenant("t")
                .priority(-3)
                .max_attempts(7)
                .timeout(Duration::from_millis(1500)),
        )
        .time_zone("Asia/Tokyo")
        .catch_up(CatchUp::All { max: 4 });
        let spec = s.to_spec().expect("encode");
        assert_eq!(Schedule::from_spec("nightly", &spec).expect("decode"), s);
        assert!(matches!(
            Schedule::from_spec("x", "{"),
            Err(Error::Corrupt { .. })
        ));
    }
}
