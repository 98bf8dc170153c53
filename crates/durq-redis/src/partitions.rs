//! Where a job of a partitioned namespace lives (CONTRACT §8): partition `p` of `K` is
//! a slot group of its own, and a job's partition is a function of its id alone, so
//! every call naming an id (get, the lease calls, cancel, retry, attempts, children)
//! goes straight to one partition without a lookup.
//!
//! The id's lowest 32 bits are random in every id `JobId::mint` hands out, so
//! `low32 mod K` spreads ids evenly. A job that must live in a given partition (its
//! idempotency key's, so dedup stays one atomic script; its parent's, so a family
//! stays in one slot) gets a minted id whose low bits are moved to that partition:
//! the bits above them, which order ids, are untouched, so the id still sorts as
//! minted and stays unique.

use durq_core::JobId;

/// The most partitions a namespace may have: more than any cluster has masters, and
/// few enough that a claim visiting every partition of an idle namespace stays cheap.
pub const MAX_PARTITIONS: usize = 256;

/// The partition of `id` among `count` (at least 1).
pub(crate) fn of_id(id: JobId, count: usize) -> usize {
    // The low 32 bits, so the cast is exact; `count` is at most MAX_PARTITIONS.
    (id.as_u128() as u32 as usize) % count.max(1)
}

/// The partition an idempotency key (with its tenant) places its jobs in: a stable
/// FNV-1a hash, so every process of every version agrees. The tenant's length comes
/// first, so ("ab", "c") and ("a", "bc") are different inputs.
pub(crate) fn of_key(tenant: &str, key: &str, count: usize) -> usize {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let tenant_len = (tenant.len() as u64).to_le_bytes();
    let hash = tenant_len
        .iter()
        .chain(tenant.as_bytes())
        .chain(key.as_bytes())
        .fold(OFFSET, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
        });
    // Below `count`, so the cast is exact.
    (hash % count.max(1) as u64) as usize
}

/// The partition a concurrency key of `queue` places its jobs in (CONTRACT P3): the
/// same hash as [`of_key`]'s, over the queue and the key, as limits count a key per
/// queue.
pub(crate) fn of_concurrency_key(queue: &str, key: &str, count: usize) -> usize {
    of_key(queue, key, count)
}

/// `id` moved into partition `partition` of `count`: only its low 32 (random) bits
/// change, by less than `count`, so it keeps its place among other ids.
pub(crate) fn pin(id: JobId, partition: usize, count: usize) -> JobId {
    let count = count.max(1) as u64;
    let partition = partition as u64 % count;
    let low = u64::from(id.as_u128() as u32);
    let mut moved = low - low % count + partition;
    if moved > u64::from(u32::MAX) {
        moved -= count;
    }
    let raw = (id.as_u128() & !u128::from(u32::MAX)) | u128::from(moved);
    // Only the low 32 bits changed; the version and variant bits are above them.
    JobId::from_u128(raw).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use durq_core::Timestamp;

    fn minted(n: usize) -> Vec<JobId> {
        (0..n)
            .map(|_| JobId::mint(Timestamp::from_millis(1_700_000_000_000)))
            .collect()
    }

    #[test]
    fn a_pinned_id_lands_in_its_partition_and_keeps_its_order() {
        let ids = minted(2_000);
        for (n, id) in ids.iter().enumerate() {
            for count in [1, 2, 3, 12, 255, MAX_PARTITIONS] {
                let partition = n % count;
                let pinned = pin(*id, partition, count);
                assert_eq!(of_id(pinned, count), partition, "{id} in {count}");
                assert_eq!(pinned.as_u128() >> 32, id.as_u128() >> 32);
                assert_eq!(pinned.timestamp(), id.timestamp());
            }
        }
        // Ids minted one after another still sort as minted once pinned anywhere.
        let pinned: Vec<JobId> = ids
            .iter()
            .enumerate()
            .map(|(n, id)| pin(*id, n * 7 % 12, 12))
            .collect();
        assert!(pinned.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_top_of_the_low_bits_stays_in_range() {
        let id = minted(1)[0];
        let top = JobId::from_u128(id.as_u128() | u128::from(u32::MAX)).expect("a v7 id");
        for count in [3, 7, 12, 100] {
            for partition in 0..count {
                assert_eq!(of_id(pin(top, partition, count), count), partition);
            }
        }
    }

    #[test]
    fn minted_ids_spread_evenly() {
        let count = 12;
        let mut seen = [0usize; 12];
        for id in minted(12_000) {
            seen[of_id(id, count)] += 1;
        }
        // 1,000 expected each; a fair spread stays well within ±25 %.
        assert!(seen.iter().all(|n| (750..=1_250).contains(n)), "{seen:?}");
    }

    #[test]
    fn keys_place_stably_and_tenants_are_separate_inputs() {
        // Fixed values (FNV-1a 64, computed independently): a change of the hash would
        // move every stored key's jobs away from their dedup keys.
        assert_eq!(of_key("", "order-1", 12), 1);
        assert_eq!(of_key("", "order-1", 256), 141);
        assert_eq!(of_key("acme", "invoice-42", 12), 7);
        assert_eq!(of_key("acme", "invoice-42", 256), 43);
        assert_eq!(of_key("t", "", 256), 112);
        assert_eq!(of_key("", "", 1), 0);
        let spread: std::collections::HashSet<usize> = (0..200)
            .map(|n| of_key("acme", &format!("k{n}"), 12))
            .collect();
        assert_eq!(spread.len(), 12);
        let moved = (0..200)
            .filter(|n| of_key("ab", &format!("c{n}"), 97) != of_key("a", &format!("bc{n}"), 97))
            .count();
        assert!(moved > 150, "{moved}");
    }
}
