//! The faults a run draws from, the clock it stamps them with, and its seeded random
//! numbers.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The faults a backend gets, with their weights.
pub(super) fn fault_menu(backend: &str) -> Vec<(&'static str, u64)> {
    // A producer kill picked after the plan is done becomes a worker kill.
    let mut menu = vec![("kill_worker", 4), ("kill_producer", 3)];
    match backend {
        "redis" | "redis-partitioned" => menu.extend([("client_kill", 3), ("redis_kill", 1)]),
        "postgres" => menu.push(("pg_terminate", 3)),
        // Kills are SQLite's fault: its file outlives every process.
        _ => menu.push(("kill_worker", 3)),
    }
    menu
}

pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A seed from the clock and the process id.
pub fn seed_from_clock() -> u64 {
    now_us() ^ (u64::from(std::process::id()) << 32)
}

/// Waits `d` by spinning: a thread sleep is not finer than the scheduler's tick, and a
/// kill's moment should be random at the sub-millisecond scale.
pub(super) fn spin(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// xorshift64*: enough randomness to pick moments and faults, with a printable seed.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub(super) fn pick(&mut self, menu: &[(&'static str, u64)]) -> &'static str {
        let total: u64 = menu.iter().map(|(_, w)| w).sum();
        let mut roll = self.below(total);
        for (name, weight) in menu {
            if roll < *weight {
                return name;
            }
            roll -= weight;
        }
        menu.first().map_or("kill_worker", |(name, _)| name)
    }
}
