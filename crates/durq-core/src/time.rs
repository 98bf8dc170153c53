//! Time as every store sees it: an injected clock in milliseconds since the Unix epoch.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (CONTRACT §1). An `i64`, so it is exact in a Lua
/// double and in every SQL integer type.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant moved forward by `duration`, saturating instead of overflowing.
    pub fn saturating_add(self, duration: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(duration)))
    }

    /// This instant moved back by `duration`, saturating instead of overflowing.
    pub fn saturating_sub(self, duration: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(duration)))
    }

    /// The time from `earlier` to this instant, zero if `earlier` is later.
    pub fn duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }

    /// This instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        let offset = Duration::from_millis(self.0.unsigned_abs());
        if self.0 >= 0 {
            UNIX_EPOCH + offset
        } else {
            UNIX_EPOCH - offset
        }
    }
}

/// To whole milliseconds (sub-millisecond parts are dropped, toward the past), saturating
/// at the ends of `i64`.
impl From<SystemTime> for Timestamp {
    fn from(time: SystemTime) -> Self {
        match time.duration_since(UNIX_EPOCH) {
            Ok(after) => Timestamp(duration_millis(after)),
            Err(before) => {
                let before = before.duration();
                // Toward the past: 1.5 ms before the epoch is -2 ms.
                let whole = duration_millis(before);
                let partial = before.subsec_nanos() % 1_000_000 != 0;
                Timestamp(whole.saturating_neg().saturating_sub(i64::from(partial)))
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(time: Timestamp) -> Self {
        time.to_system_time()
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The source of "now" for every time-dependent decision a store makes (CONTRACT §3).
///
/// Stores never ask the server for the time; they take it from here, so tests drive
/// expiry by moving a [`ManualClock`] instead of sleeping.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The wall clock of this machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_millis(since_epoch))
    }
}

/// A clock that moves only when told to: what tests use to drive leases, schedules,
/// dedup windows and retention without waiting.
///
/// Clones share one instant.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            now: Arc::new(AtomicI64::new(start.0)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_millis(by), Ordering::SeqCst);
    }

    /// Sets the clock to `to` (it may go backwards, as a real clock sometimes does).
    pub fn set(&self, to: Timestamp) {
        self.now.store(to.0, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    /// A manual clock at 2023-11-14T22:13:20Z, a fixed, realistic instant.
    fn default() -> Self {
        ManualClock::new(Timestamp::from_millis(1_700_000_000_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.now.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_time_round_trips_in_whole_milliseconds() {
        let at = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(Timestamp::from(at.to_system_time()), at);
        let before_epoch = Timestamp::from_millis(-5);
        assert_eq!(
            Timestamp::from(SystemTime::from(before_epoch)),
            before_epoch
        );
        // Sub-millisecond parts go toward the past, on both sides of the epoch.
        let after = UNIX_EPOCH + Duration::from_micros(1_500);
        assert_eq!(Timestamp::from(after), Timestamp::from_millis(1));
        let before = UNIX_EPOCH - Duration::from_micros(1_500);
        assert_eq!(Timestamp::from(before), Timestamp::from_millis(-2));
    }

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        let shared = clock.clone();
        assert_eq!(clock.now().as_millis(), 1_000);
        shared.advance(Duration::from_millis(250));
        assert_eq!(clock.now().as_millis(), 1_250);
        clock.set(Timestamp::from_millis(10));
        assert_eq!(shared.now().as_millis(), 10);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now().as_millis() > 1_577_836_800_000);
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(i64::MAX - 1);
        assert_eq!(
            t.saturating_add(Duration::from_secs(10)).as_millis(),
            i64::MAX
        );
        assert_eq!(
            Timestamp::from_millis(5).duration_since(Timestamp::from_millis(9)),
            Duration::ZERO
        );
    }
}
