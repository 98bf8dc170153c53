//! The claim order of CONTRACT C3, written once for every backend.

use std::cmp::Ordering;

use crate::time::Timestamp;

/// Where a queued job stands in the claim order: priority descending, then the time
/// it became ready ascending, then enqueue sequence ascending.
///
/// `seq` is a store-wide counter drawn each time a job enters `queued` (enqueue,
/// release, retry, reclaim, failure with retry), so jobs enqueued one after another at
/// one clock instant come out first-in, first-out, and a requeued job goes behind
/// the jobs that were already ready (CONTRACT R1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadyOrder {
    /// Higher runs first.
    pub priority: i16,
    /// When the job became, or becomes, ready.
    pub ready_at: Timestamp,
    /// The store's enqueue sequence.
    pub seq: u64,
}

impl ReadyOrder {
    /// The order of a job.
    pub fn new(priority: i16, ready_at: Timestamp, seq: u64) -> Self {
        ReadyOrder {
            priority,
            ready_at,
            seq,
        }
    }

    /// A fixed-width (36 hex digits) string that sorts byte-wise exactly as
    /// [`Ord`] sorts this value. Backends with only lexical or float ordering
    /// (Redis sorted sets) index by it, so the order is kept with integers alone.
    pub fn sort_key(&self) -> String {
        // Priority descending: invert it into an unsigned value so the highest sorts first.
        let priority = (i32::from(i16::MAX) - i32::from(self.priority)) as u16;
        // Shift the signed time into unsigned space so negative instants sort first.
        let ready_at = (self.ready_at.as_millis() as u64) ^ (1 << 63);
        format!("{priority:04x}{ready_at:016x}{:016x}", self.seq)
    }
}

impl ReadyOrder {
    /// The ready time a [`ReadyOrder::sort_key`] holds (its digits 5 to 20), or `None`
    /// when `key` is not such a key.
    pub fn ready_at_of_sort_key(key: &str) -> Option<Timestamp> {
        if key.len() != 36 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let shifted = u64::from_str_radix(key.get(4..20)?, 16).ok()?;
        Some(Timestamp::from_millis((shifted ^ (1 << 63)) as i64))
    }
}

impl Ord for ReadyOrder {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .priority
            .cmp(&self.priority)
            .then(self.ready_at.cmp(&other.ready_at))
            .then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for ReadyOrder {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(priority: i16, ready_at: i64, seq: u64) -> ReadyOrder {
        ReadyOrder::new(priority, Timestamp::from_millis(ready_at), seq)
    }

    #[test]
    fn priority_then_time_then_sequence() {
        let mut orders = vec![
            order(0, 10, 3),
            order(5, 20, 9),
            order(0, 10, 1),
            order(-3, 0, 0),
            order(0, 5, 7),
        ];
        orders.sort();
        assert_eq!(
            orders,
            vec![
                order(5, 20, 9),
                order(0, 5, 7),
                order(0, 10, 1),
                order(0, 10, 3),
                order(-3, 0, 0),
            ]
        );
    }

    #[test]
    fn the_ready_time_reads_back_from_a_sort_key() {
        for at in [i64::MIN, -1, 0, 1, 1_700_000_000_000, i64::MAX] {
            let key = order(-3, at, 9).sort_key();
            assert_eq!(
                ReadyOrder::ready_at_of_sort_key(&key),
                Some(Timestamp::from_millis(at))
            );
        }
        assert_eq!(ReadyOrder::ready_at_of_sort_key("xyz"), None);
        assert_eq!(ReadyOrder::ready_at_of_sort_key(&"g".repeat(36)), None);
    }

    #[test]
    fn sort_key_sorts_like_ord_at_the_extremes() {
        let samples = [
            order(i16::MAX, i64::MIN, 0),
            order(i16::MAX, -1, u64::MAX),
            order(1, 0, 0),
            order(0, 1_700_000_000_000, 1),
            order(0, 1_700_000_000_000, 2),
            order(0, i64::MAX, 0),
            order(-1, 0, 0),
            order(i16::MIN, i64::MAX, u64::MAX),
        ];
        for a in &samples {
            for b in &samples {
                assert_eq!(a.cmp(b), a.sort_key().cmp(&b.sort_key()), "{a:?} vs {b:?}");
            }
            assert_eq!(a.sort_key().len(), 36);
        }
    }
}
