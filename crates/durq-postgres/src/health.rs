//! When a connection of the pool was last found closed by the server, so that its
//! siblings that went idle before then are checked before they are handed out (see
//! `conn`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a connection of the pool was last found closed by the server.
#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    /// Nanoseconds from `base` to the last loss, plus one; 0: none seen.
    lost_at: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            base: Instant::now(),
            lost_at: AtomicU64::new(0),
        }
    }
}

impl Health {
    fn nanos_since_base(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records that a connection was found closed now.
    pub(crate) fn mark_lost(&self) {
        let now = self.nanos_since_base().saturating_add(1);
        self.lost_at.fetch_max(now, Ordering::Relaxed);
    }

    /// Whether a connection idle for `idle_for` went idle before the last loss was
    /// seen, so it may have been closed by the same cause and must be checked.
    pub(crate) fn is_suspect(&self, idle_for: Duration) -> bool {
        let lost_at = self.lost_at.load(Ordering::Relaxed);
        // The common case, every acquire of a pool that never lost a connection: one
        // atomic load, not even a clock read.
        lost_at != 0
            && went_idle_before(lost_at, self.nanos_since_base().saturating_add(1), idle_for)
    }
}

/// Whether a connection idle for `idle_for` at `now` went idle at or before `lost_at`
/// (both in `Health`'s units; `lost_at` 0: no loss seen).
fn went_idle_before(lost_at: u64, now: u64, idle_for: Duration) -> bool {
    if lost_at == 0 {
        return false;
    }
    let idle_nanos = u64::try_from(idle_for.as_nanos()).unwrap_or(u64::MAX);
    now.saturating_sub(idle_nanos) <= lost_at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_idle_since_before_the_loss_are_suspect() {
        let ms = |n: u64| n * 1_000_000;
        // No loss seen: nothing is suspect, however long idle.
        assert!(!went_idle_before(0, ms(10_000), Duration::from_secs(9)));
        // A loss at 5 s; now is 8 s.
        let (lost, now) = (ms(5_000), ms(8_000));
        assert!(
            went_idle_before(lost, now, Duration::from_secs(4)),
            "idle since 4 s"
        );
        assert!(
            went_idle_before(lost, now, Duration::from_secs(3)),
            "idle since 5 s"
        );
        assert!(
            !went_idle_before(lost, now, Duration::from_secs(2)),
            "idle since 6 s"
        );
        assert!(
            !went_idle_before(lost, now, Duration::ZERO),
            "returned just now"
        );
        assert!(went_idle_before(lost, now, Duration::MAX), "idle forever");

        let health = Health::default();
        assert!(!health.is_suspect(Duration::from_secs(3600)), "no loss yet");
        health.mark_lost();
        assert!(
            health.is_suspect(Duration::from_secs(3600)),
            "idle since before it"
        );
    }
}
