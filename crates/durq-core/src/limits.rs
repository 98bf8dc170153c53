//! Flow control: the limits a queue declares on its running jobs and its starts
//! (CONTRACT K1–K4), enforced inside the claim by backends with the
//! [`FlowControl`](crate::FlowControl) capability.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::time::Timestamp;

/// The most starts a rate may allow per window, so a start log stays small.
pub const MAX_RATE_STARTS: u32 = 10_000;

/// The longest window a rate may count over: one week.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);

/// At most `starts` starts in any window of `per`, on the store's clock (CONTRACT K4).
///
/// The window is exact, not a token bucket: no interval `[t, t + per)` ever holds more
/// than `starts` starts, whether they came one by one or in one claim.
///
/// ```
/// use std::time::Duration;
/// use durq_core::Rate;
/// let rate = Rate::new(10, Duration::from_secs(1));
/// assert_eq!(rate.to_string(), "10/1s");
/// assert_eq!("10/1s".parse::<Rate>().ok(), Some(rate));
/// assert_eq!("600/1m".parse::<Rate>().ok(), Some(Rate::new(600, Duration::from_secs(60))));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    /// The starts the window admits.
    pub starts: u32,
    /// The window's length (whole milliseconds count; the store's clock has no finer).
    pub per: Duration,
}

impl Rate {
    /// At most `starts` starts per `per`.
    pub const fn new(starts: u32, per: Duration) -> Self {
        Rate { starts, per }
    }

    /// Starts at or before this instant have left the window of a claim at `now`: the
    /// window is `(now - per, now]`.
    pub fn window_opens_after(&self, now: Timestamp) -> Timestamp {
        now.saturating_sub(self.per)
    }

    /// Whether `in_window` starts inside the window leave room for one more.
    pub fn admits(&self, in_window: u64) -> bool {
        in_window < u64::from(self.starts)
    }

    /// When the window admits a start again, given the `starts`-th most recent start
    /// inside it: the instant that start leaves the window.
    pub fn frees_at(&self, blocking_start: Timestamp) -> Timestamp {
        blocking_start.saturating_add(self.per)
    }

    fn validate(&self, field: &'static str) -> Result<()> {
        if self.starts == 0 {
            return Err(Error::invalid(
                field,
                "must allow at least 1 start; pause the queue to start none of its jobs",
            ));
        }
        if self.starts > MAX_RATE_STARTS {
            return Err(Error::invalid(
                field,
                format!("allows at most {MAX_RATE_STARTS} starts per window"),
            ));
        }
        if self.per < Duration::from_millis(1) || self.per > MAX_RATE_PERIOD {
            return Err(Error::invalid(
                field,
                "its period must be between 1 ms and 7 days",
            ));
        }
        Ok(())
    }
}

/// `10/1s`: the starts, a slash, the period as `humantime` writes it.
impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            self.starts,
            humantime::format_duration(self.per)
        )
    }
}

/// Reads `STARTS/PERIOD` (`10/1s`, `600/1m`, `5/250ms`), as [`Rate`]'s `Display` writes
/// it; a rate out of range is refused as [`QueueLimits::validate`] refuses it.
impl std::str::FromStr for Rate {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let malformed = || {
            Error::invalid(
                "rate",
                format!("`{text}` is not STARTS/PERIOD, such as 10/1s"),
            )
        };
        let (starts, per) = text.split_once('/').ok_or_else(malformed)?;
        let starts: u32 = starts.trim().parse().map_err(|_| malformed())?;
        let per = humantime::parse_duration(per.trim()).map_err(|_| malformed())?;
        let rate = Rate::new(starts, per);
        rate.validate("rate")?;
        Ok(rate)
    }
}

/// How many of a queue's jobs may run at once, across every worker and process of the
/// namespace. Limits are data: set with [`Store::set_limits`](crate::Store::set_limits)
/// and changed at any time; the next claim applies them. The default limits nothing.
///
/// ```
/// use durq_core::QueueLimits;
/// // At most 20 invoices rendering at once, and one at a time per customer.
/// let limits = QueueLimits::new().max_running(20).max_running_per_key(1);
/// assert_eq!(limits.max_running, Some(20));
/// assert!(!limits.is_unlimited());
/// assert!(QueueLimits::new().is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct QueueLimits {
    /// CONTRACT K2: most jobs of the queue running at once; `None` for no limit.
    pub max_running: Option<u32>,
    /// CONTRACT K1: most jobs of one concurrency key of the queue running at once;
    /// `None` for no limit. Jobs without a key are not limited by it.
    pub max_running_per_key: Option<u32>,
    /// CONTRACT K4: most starts of the queue's jobs in any window; `None` for no limit.
    pub max_starts: Option<Rate>,
    /// CONTRACT K4: most starts of one concurrency key's jobs in any window; `None` for
    /// no limit. Jobs without a key are not limited by it.
    pub max_starts_per_key: Option<Rate>,
    /// CONTRACT K5: claims take the queue's ready jobs by turns of concurrency key
    /// within each priority, so a key with a deep backlog cannot starve the others.
    pub fair_shares: bool,
}

impl QueueLimits {
    /// No limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`QueueLimits::max_running`].
    pub fn max_running(mut self, jobs: u32) -> Self {
        self.max_running = Some(jobs);
        self
    }

    /// Sets [`QueueLimits::max_running_per_key`].
    pub fn max_running_per_key(mut self, jobs: u32) -> Self {
        self.max_running_per_key = Some(jobs);
        self
    }

    /// Sets [`QueueLimits::max_starts`].
    pub fn max_starts(mut self, rate: Rate) -> Self {
        self.max_starts = Some(rate);
        self
    }

    /// Sets [`QueueLimits::max_starts_per_key`].
    pub fn max_starts_per_key(mut self, rate: Rate) -> Self {
        self.max_starts_per_key = Some(rate);
        self
    }

    /// Sets [`QueueLimits::fair_shares`].
    pub fn fair_shares(mut self, fair: bool) -> Self {
        self.fair_shares = fair;
        self
    }

    /// Whether a claim must count the starts of this queue's jobs (K4).
    pub fn limits_starts(&self) -> bool {
        self.max_starts.is_some() || self.max_starts_per_key.is_some()
    }

    /// The first of these limits that counts a whole queue (`max_running`,
    /// `max_starts`, `fair_shares`), if any (CONTRACT P3).
    fn queue_wide_field(&self) -> Option<&'static str> {
        [
            ("max_running", self.max_running.is_some()),
            ("max_starts", self.max_starts.is_some()),
            ("fair_shares", self.fair_shares),
        ]
        .into_iter()
        .find_map(|(field, set)| set.then_some(field))
    }

    /// CONTRACT P3: `InvalidInput` naming the first limit of `self` that counts a whole
    /// queue, for a store that keeps only per-key limits
    /// ([`Capabilities::queue_wide_limits`](crate::Capabilities::queue_wide_limits)).
    pub fn refuse_queue_wide(&self) -> Result<()> {
        match self.queue_wide_field() {
            Some(field) => Err(Error::invalid(
                field,
                "this store keeps a queue's jobs in several partitions and counts only \
                 what one partition holds: a concurrency key's jobs (max_running_per_key, \
                 max_starts_per_key); CONTRACT P3",
            )),
            None => Ok(()),
        }
    }

    /// Whether a claim must count this queue's jobs by concurrency key (K1, K4).
    pub fn counts_keys(&self) -> bool {
        self.max_running_per_key.is_some() || self.max_starts_per_key.is_some()
    }

    /// Whether these limits limit nothing: what a queue without limits has, and what
    /// [`Store::set_limits`](crate::Store::set_limits) stores by removing the queue's.
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `running` jobs of the queue leave room for one more (K2).
    pub fn admits_queue(&self, running: u64) -> bool {
        self.max_running
            .is_none_or(|limit| running < u64::from(limit))
    }

    /// Whether `running` jobs of one concurrency key leave room for one more (K1).
    pub fn admits_key(&self, running: u64) -> bool {
        self.max_running_per_key
            .is_none_or(|limit| running < u64::from(limit))
    }

    /// CONTRACT K3: a limit of 0 is refused, naming its field: a queue that should run
    /// nothing is paused (Q1), which says so everywhere a limit would not. A rate must
    /// allow 1 to [`MAX_RATE_STARTS`] starts per 1 ms to [`MAX_RATE_PERIOD`].
    pub fn validate(&self) -> Result<()> {
        for (field, rate) in [
            ("max_starts", self.max_starts),
            ("max_starts_per_key", self.max_starts_per_key),
        ] {
            if let Some(rate) = rate {
                rate.validate(field)?;
            }
        }
        for (field, limit) in [
            ("max_running", self.max_running),
            ("max_running_per_key", self.max_running_per_key),
        ] {
            if limit == Some(0) {
                return Err(Error::invalid(
                    field,
                    "must be at least 1; pause the queue to run none of its jobs",
                ));
            }
        }
        Ok(())
    }
}

/// The most keys [`FlowStatus`] lists in each of its lists.
pub const FLOW_KEYS_SHOWN: usize = 100;

/// What a queue's limits hold back at one instant (CONTRACT K3): read with
/// [`Store::flow_status`](crate::Store::flow_status), shown by `durq limits status` and
/// the dashboard's queue page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowStatus {
    /// The queue's running jobs (K2 counts them).
    pub running: u64,
    /// The concurrency keys whose running jobs are at or above `max_running_per_key`,
    /// by key, each with its running jobs: at most [`FLOW_KEYS_SHOWN`], the first by
    /// key. Empty without that limit.
    pub keys_at_limit: Vec<(String, u64)>,
    /// When the queue's own rate (`max_starts`) admits a start again, if it admits none
    /// at the instant read; `None` otherwise, or without a rate.
    pub next_start: Option<Timestamp>,
    /// The concurrency keys whose rate (`max_starts_per_key`) admits no start at the
    /// instant read, by key, each with when it admits one again: at most
    /// [`FLOW_KEYS_SHOWN`], the first by key.
    pub keys_rate_limited: Vec<(String, Timestamp)>,
}

impl FlowStatus {
    /// The status read from a queue's counts: `running` jobs in all.
    pub fn new(running: u64) -> Self {
        FlowStatus {
            running,
            ..FlowStatus::default()
        }
    }
}

/// The limits in words, as the CLI and the dashboard show them: `at most 20 running, at
/// most 1 running per concurrency key, at most 10 starts per 1s`, or `none`.
impl std::fmt::Display for QueueLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(all) = self.max_running {
            parts.push(format!("at most {all} running"));
        }
        if let Some(per_key) = self.max_running_per_key {
            parts.push(format!("at most {per_key} running per concurrency key"));
        }
        let per = |rate: Rate| humantime::format_duration(rate.per);
        if let Some(rate) = self.max_starts {
            parts.push(format!("at most {} starts per {}", rate.starts, per(rate)));
        }
        if let Some(rate) = self.max_starts_per_key {
            parts.push(format!(
                "at most {} starts per {} per concurrency key",
                rate.starts,
                per(rate)
            ));
        }
        if self.fair_shares {
            parts.push("fair shares by concurrency key".to_owned());
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&parts.join(", "))
    }
}

/// A queue's limits as a SQL backend stores them (CONTRACT K3): each count and each
/// window (in milliseconds) a number, `None` for none. Written from [`QueueLimits`] and
/// read back, checked, into them, so every backend stores and checks a row alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredLimits {
    /// [`QueueLimits::max_running`].
    pub max_running: Option<i64>,
    /// [`QueueLimits::max_running_per_key`].
    pub max_running_per_key: Option<i64>,
    /// The starts of [`QueueLimits::max_starts`].
    pub max_starts: Option<i64>,
    /// The window of [`QueueLimits::max_starts`], in milliseconds.
    pub max_starts_ms: Option<i64>,
    /// The starts of [`QueueLimits::max_starts_per_key`].
    pub max_starts_per_key: Option<i64>,
    /// The window of [`QueueLimits::max_starts_per_key`], in milliseconds.
    pub max_starts_per_key_ms: Option<i64>,
    /// [`QueueLimits::fair_shares`].
    pub fair_shares: bool,
}

impl From<QueueLimits> for StoredLimits {
    fn from(limits: QueueLimits) -> Self {
        let starts = |rate: Option<Rate>| rate.map(|rate| i64::from(rate.starts));
        let window = |rate: Option<Rate>| {
            rate.map(|rate| i64::try_from(rate.per.as_millis()).unwrap_or(i64::MAX))
        };
        StoredLimits {
            max_running: limits.max_running.map(i64::from),
            max_running_per_key: limits.max_running_per_key.map(i64::from),
            max_starts: starts(limits.max_starts),
            max_starts_ms: window(limits.max_starts),
            max_starts_per_key: starts(limits.max_starts_per_key),
            max_starts_per_key_ms: window(limits.max_starts_per_key),
            fair_shares: limits.fair_shares,
        }
    }
}

impl StoredLimits {
    /// The stored limits of one row whose six counts and windows come in field order
    /// (`max_running`, `max_running_per_key`, `max_starts`, `max_starts_ms`,
    /// `max_starts_per_key`, `max_starts_per_key_ms`): `count(i)` reads the `i`-th, so
    /// each backend writes only how it reads a column.
    pub fn from_columns(
        mut count: impl FnMut(usize) -> Result<Option<i64>>,
        fair_shares: bool,
    ) -> Result<Self> {
        Ok(StoredLimits {
            max_running: count(0)?,
            max_running_per_key: count(1)?,
            max_starts: count(2)?,
            max_starts_ms: count(3)?,
            max_starts_per_key: count(4)?,
            max_starts_per_key_ms: count(5)?,
            fair_shares,
        })
    }

    /// The limits of `queue` this row holds. A count that is not a positive `u32`, or a
    /// rate without a positive window, is [`Error::Corrupt`], naming the queue and the
    /// field.
    pub fn into_limits(self, queue: &str) -> Result<QueueLimits> {
        let corrupt = |field: &str, value: i64| {
            Error::corrupt(
                format!("limits of queue {queue}"),
                format!("{field} {value}"),
            )
        };
        let count = |field: &str, value: Option<i64>| -> Result<Option<u32>> {
            value
                .map(|n| {
                    u32::try_from(n)
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| corrupt(field, n))
                })
                .transpose()
        };
        let rate = |field: &str, starts: Option<i64>, ms: Option<i64>| -> Result<Option<Rate>> {
            let Some(starts) = count(field, starts)? else {
                return Ok(None);
            };
            let ms = ms.unwrap_or(0);
            let per = u64::try_from(ms)
                .ok()
                .filter(|ms| *ms > 0)
                .ok_or_else(|| corrupt(field, ms))?;
            Ok(Some(Rate::new(starts, Duration::from_millis(per))))
        };
        Ok(QueueLimits {
            max_running: count("max_running", self.max_running)?,
            max_running_per_key: count("max_running_per_key", self.max_running_per_key)?,
            max_starts: rate("max_starts", self.max_starts, self.max_starts_ms)?,
            max_starts_per_key: rate(
                "max_starts_per_key",
                self.max_starts_per_key,
                self.max_starts_per_key_ms,
            )?,
            fair_shares: self.fair_shares,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_admit_below_them_and_none_admit_all() {
        let limits = QueueLimits::new().max_running(2).max_running_per_key(1);
        assert!(limits.admits_queue(1));
        assert!(!limits.admits_queue(2));
        assert!(limits.admits_key(0));
        assert!(!limits.admits_key(1));
        let none = QueueLimits::new();
        assert!(none.admits_queue(u64::MAX) && none.admits_key(u64::MAX));
    }

    #[test]
    fn limits_read_as_words() {
        assert_eq!(QueueLimits::new().to_string(), "none");
        assert_eq!(
            QueueLimits::new().max_running(3).to_string(),
            "at most 3 running"
        );
        assert_eq!(
            QueueLimits::new()
                .max_running(3)
                .max_running_per_key(1)
                .to_string(),
            "at most 3 running, at most 1 running per concurrency key"
        );
    }

    #[test]
    fn rates_read_and_refuse_what_they_cannot_hold() {
        let limits = QueueLimits::new()
            .max_starts("10/1s".parse().expect("a rate"))
            .max_starts_per_key("1/1m".parse().expect("a rate"));
        assert_eq!(
            limits.to_string(),
            "at most 10 starts per 1s, at most 1 starts per 1m per concurrency key"
        );
        assert!(limits.limits_starts() && limits.counts_keys());
        let fair = QueueLimits::new().fair_shares(true);
        assert!(!fair.is_unlimited() && !fair.limits_starts());
        assert_eq!(fair.to_string(), "fair shares by concurrency key");
        for bad in [
            "10", "x/1s", "10/x", "0/1s", "10/0s", "10/8days", "10001/1s",
        ] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} was read");
        }
        let field = QueueLimits::new()
            .max_starts_per_key(Rate::new(0, Duration::from_secs(1)))
            .validate()
            .err()
            .and_then(|e| e.invalid_field().map(str::to_owned));
        assert_eq!(field.as_deref(), Some("max_starts_per_key"));
    }

    #[test]
    fn a_rate_window_is_half_open_at_its_start() {
        let rate = Rate::new(2, Duration::from_secs(1));
        let now = Timestamp::from_millis(5_000);
        assert_eq!(rate.window_opens_after(now), Timestamp::from_millis(4_000));
        assert!(rate.admits(1) && !rate.admits(2));
        assert_eq!(
            rate.frees_at(Timestamp::from_millis(4_200)),
            Timestamp::from_millis(5_200)
        );
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        let field = |limits: QueueLimits| {
            limits
                .validate()
                .err()
                .and_then(|e| e.invalid_field().map(str::to_owned))
        };
        assert_eq!(
            field(QueueLimits::new().max_running(0)).as_deref(),
            Some("max_running")
        );
        assert_eq!(
            field(QueueLimits::new().max_running_per_key(0)).as_deref(),
            Some("max_running_per_key")
        );
        assert_eq!(
            field(QueueLimits::new().max_running(1).max_running_per_key(1)),
            None
        );
    }

    #[test]
    fn stored_limits_read_back_as_written_and_bad_rows_are_corrupt() {
        let limits = QueueLimits::new()
            .max_running(4)
            .max_running_per_key(1)
            .max_starts(Rate::new(10, Duration::from_secs(1)))
            .max_starts_per_key(Rate::new(2, Duration::from_millis(250)))
            .fair_shares(true);
        let stored = StoredLimits::from(limits);
        assert_eq!(stored.max_starts_ms, Some(1_000));
        assert_eq!(stored.into_limits("q").expect("a good row"), limits);
        // Read back column by column, in field order, as a backend reads its row.
        let columns = [Some(4), Some(1), Some(10), Some(1_000), Some(2), Some(250)];
        let read = StoredLimits::from_columns(|i| Ok(columns[i]), true).expect("columns");
        assert_eq!(read, stored);
        let failing = StoredLimits::from_columns(|_| Err(Error::corrupt("row", "x")), false);
        assert!(
            failing.is_err(),
            "a column that cannot be read fails the row"
        );
        for bad in [
            StoredLimits {
                max_running: Some(0),
                ..stored
            },
            StoredLimits {
                max_running_per_key: Some(-1),
                ..stored
            },
            StoredLimits {
                max_starts_ms: None,
                ..stored
            },
            StoredLimits {
                max_starts_per_key: Some(i64::from(u32::MAX) + 1),
                ..stored
            },
        ] {
            assert!(
                matches!(bad.into_limits("q"), Err(Error::Corrupt { .. })),
                "{bad:?}"
            );
        }
    }
}
