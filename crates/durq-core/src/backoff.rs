//! Retry delays: exponential, capped, with jitter. Shared by the worker runtime and
//! anything else that reschedules failed jobs.

use std::time::Duration;

/// Exponential backoff with a cap and proportional jitter.
///
/// The delay before retry `n` (1-based: the retry after the first failed attempt is
/// `n = 1`) is `initial × 2^(n-1)`, capped at `max`, then lowered by a random share of
/// at most `jitter` of itself, so a burst of failures does not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The delay before the first retry, before jitter.
    pub initial: Duration,
    /// The largest delay, before jitter.
    pub max: Duration,
    /// The share of each delay that may be taken off at random, in `0.0..=1.0`.
    pub jitter: f64,
}

impl Default for Backoff {
    /// 1 s, doubling, capped at 1 hour, with 20 % jitter.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60 * 60),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// The delay before retry `attempt`, with fresh randomness.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }

    /// The delay before retry `attempt`, with `unit_random` in `0.0..1.0` as the
    /// random draw (deterministic, for tests).
    pub fn delay_with(&self, attempt: u32, unit_random: f64) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63);
        let uncapped = self
            .initial
            .checked_mul(1u32.checked_shl(exponent.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.max);
        let capped = uncapped.min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit_random.clamp(0.0, 1.0);
        capped.mul_f64(1.0 - jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.0,
        };
        let delays: Vec<u128> = (1..=6)
            .map(|n| backoff.delay_with(n, 0.5).as_millis())
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.delay_with(u32::MAX, 0.5), Duration::from_secs(1));
    }

    #[test]
    fn jitter_only_lowers_the_delay_within_its_share() {
        let backoff = Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(10),
            jitter: 0.5,
        };
        assert_eq!(backoff.delay_with(1, 0.0), Duration::from_secs(10));
        assert_eq!(backoff.delay_with(1, 1.0), Duration::from_secs(5));
        for _ in 0..1000 {
            let d = backoff.delay(1);
            assert!(d >= Duration::from_secs(5) && d <= Duration::from_secs(10));
        }
    }
}
