//! Key names: every key of a namespace shares the hash tag `{namespace}`, so every
//! script runs on Redis Cluster; strings that come from users are hex-encoded, so no two
//! distinct values share a key and none can change the hash slot or break out of its key.

use std::fmt::Write as _;

use durq_core::JobId;

/// The key names of one namespace. The namespace is validated
/// (`[A-Za-z0-9._:-]`, no braces), so `{namespace}` is the whole hash tag.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    /// Ready jobs of every queue (zset, score 0, member `queue order id`).
    pub ready: String,
    /// Scheduled jobs of every queue (zset, score run_at, member `queue order id`).
    pub sched: String,
    /// Running jobs (zset, score lease expiry, member `queue id`).
    pub leases: String,
    /// Every job by queue and state (zset, score 0, member `queue state-code id`).
    pub list: String,
    /// Lease entries per queue (hash, queue -> count): the running jobs of a queue.
    pub running: String,
    /// Terminal jobs in the order they finished (list, oldest first, entries
    /// `finished_at queue state-code id parent`), what purge reads (`purge.lua`).
    pub finished: String,
    /// Layout 1's index of terminal jobs (zset, score finished_at, member `queue
    /// state-code id parent`): no longer written, but read by purge and cleared by retry
    /// while a namespace upgraded from layout 1 (or a layout-1 store still running on
    /// it) holds entries there (docs/redis.md, "Layout versions").
    pub done_v1: String,
    /// Paused queues (set of queue names, CONTRACT Q1).
    pub paused: String,
    /// Schedules (CONTRACT S1): definitions, enabled flags and last ticks, three hashes
    /// keyed by schedule name.
    pub cron_specs: String,
    pub cron_enabled: String,
    pub cron_last: String,
    /// Live workers (CONTRACT W1-W4): each worker's spec (hash, id -> spec text).
    pub workers: String,
    /// Each worker's jobs in flight at its last report (hash, id -> integer).
    pub workers_busy: String,
    /// Each worker's last report (zset, score last_seen ms, member id), read by reap.
    pub workers_seen: String,
    /// Parent-to-child links (zset, score 0, member `parent child`).
    pub children: String,
    /// Jobs that wait for jobs (CONTRACT G1-G5): one member `DEPENDENCY DEPENDENT` per
    /// dependency not ended yet (zset, score 0), so the jobs waiting for one job are one
    /// `ZRANGEBYLEX`; see `lua/graph.lua`.
    pub dependents: String,
    /// The placement (needs and locality, CONTRACT F1) of every job that declares one
    /// (hash, id -> `Job::placement()` text), so a fitted claim can judge ready jobs
    /// whose hashes it was not given. Jobs that declare none have no entry.
    pub placement: String,
    /// The sequence counter of the claim order (string).
    pub seq: String,
    /// Flow control (CONTRACT K1-K5; see `lua/flow.lua`). Each queue's limits (hash,
    /// queue -> `lua/flow.lua`'s limits text); absent while no queue has any.
    pub limits: String,
    /// The state limits keep (hash): start logs (`s queue` for the queue's, `k queue
    /// hexkey` for a key's: fixed-width start times, oldest first) and fair turns (`t
    /// queue prio` -> the hex key served last at that priority).
    pub flow: String,
    /// The concurrency key of every job that has one (hash, id -> hex key), so a
    /// script given only an index entry finds its key. Jobs without one have no entry.
    pub ckeys: String,
    /// Ready jobs that have a concurrency key, by queue, priority and key (zset, score
    /// 0, member `queue prio hexkey order id`): a key's first ready jobs, and the next
    /// key with ready jobs, each one `ZRANGEBYLEX` (K1, K5). Kept with the ready index.
    pub kready: String,
    /// Leases of jobs with a concurrency key (zset, score 0, member `queue hexkey id`),
    /// written by every claim that leases one; an entry counts while the lease index
    /// holds `queue id`, and is dropped once read without it (K1 counts a key's running
    /// jobs from it).
    pub kleases: String,
    /// The event stream (CONTRACT V1-V4; see `lua/core.lua`, `record_change`): a
    /// stream of the namespace's recorded changes and emitted events, ids by the
    /// server (`*`), written by every script that changes the state of a marked job.
    pub events: String,
    /// The newest id `trim_events` deleted from [`Keys::events`] (string `MS-SEQ`),
    /// absent until the first trim that deleted one (see `lua/trim_events.lua`).
    pub events_trimmed: String,
    /// The pub/sub channel of wake-ups (not a key): the namespace's, shared by all its
    /// partitions, so one subscriber serves a partitioned store.
    pub wake: String,
    /// How the namespace is laid out (hash: `partitions` -> K, `version` -> the key
    /// layout's version), written when a store first opens it and checked by every
    /// later open (see `config.rs`). Always in the namespace's own slot `{namespace}`.
    pub layout: String,
}

impl Keys {
    /// The keys of an unpartitioned namespace (and, for a partitioned one, of what is
    /// not split: its layout record, schedules and worker registry).
    pub(crate) fn new(namespace: &str) -> Self {
        Self::tagged(namespace, namespace)
    }

    /// The keys of partition `partition` of `count` of `namespace`: hash tag
    /// [`partition_tag`]. `#` is outside the namespace alphabet, so no namespace's tag
    /// is another's partition (with `:` namespace `a:1` would be partition 1 of `a`).
    pub(crate) fn partition(namespace: &str, partition: usize, count: usize) -> Self {
        Self::tagged(namespace, &partition_tag(namespace, partition, count))
    }

    fn tagged(namespace: &str, tag: &str) -> Self {
        let prefix = format!("jobs:{{{tag}}}:");
        let key = |name: &str| format!("{prefix}{name}");
        Keys {
            ready: key("ready"),
            sched: key("sched"),
            leases: key("leases"),
            list: key("list"),
            running: key("running"),
            paused: key("paused"),
            cron_specs: key("cron:spec"),
            cron_enabled: key("cron:enabled"),
            cron_last: key("cron:last"),
            workers: key("workers"),
            workers_busy: key("workers:busy"),
            workers_seen: key("workers:seen"),
            finished: key("finished"),
            done_v1: key("done"),
            children: key("children"),
            dependents: key("dependents"),
            placement: key("placement"),
            seq: key("seq"),
            limits: key("limits"),
            flow: key("flow"),
            ckeys: key("ckeys"),
            kready: key("kready"),
            kleases: key("kleases"),
            events: key("events"),
            events_trimmed: key("events:trimmed"),
            wake: format!("jobs:{{{namespace}}}:wake"),
            layout: format!("jobs:{{{namespace}}}:layout"),
            prefix,
        }
    }

    /// The `SCAN` pattern of every key of the namespace. A namespace holds no glob
    /// character (`[A-Za-z0-9._:-]`), and braces are literal in Redis patterns.
    pub(crate) fn all(&self) -> String {
        format!("{}*", self.prefix)
    }

    /// The hash of one job.
    pub(crate) fn job(&self, id: JobId) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 4 + 36);
        self.push_job(&mut out, id);
        out
    }

    /// The key of the hash of the job an index entry names by `id` as written there. A
    /// damaged entry's text names a key no job has (it is still in the namespace's
    /// slot: the hash tag comes first), so a script given it finds nothing there.
    pub(crate) fn job_named(&self, id: &str) -> String {
        format!("{}job:{id}", self.prefix)
    }

    /// Appends the key of job `id`'s hash to `out`.
    pub(crate) fn push_job(&self, out: &mut String, id: JobId) {
        out.push_str(&self.prefix);
        out.push_str("job:");
        id.push_canonical(out);
    }

    /// The hash of job `id`'s durable steps (CONTRACT D1–D4; see `lua/save_step.lua`).
    /// It shares the job's hash tag, so the scripts that read or delete the job reach
    /// it in the same slot, and the namespace's `SCAN` pattern finds it.
    pub(crate) fn steps(&self, id: JobId) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 6 + 36);
        out.push_str(&self.prefix);
        out.push_str("steps:");
        id.push_canonical(&mut out);
        out
    }

    /// [`Keys::steps`] of the job an index entry names by `id` as written there, as
    /// [`Keys::job_named`] does for its hash.
    pub(crate) fn steps_named(&self, id: &str) -> String {
        format!("{}steps:{id}", self.prefix)
    }

    /// The dedup key of (tenant, idempotency key): both hex-encoded, so `:` `{` `}` or
    /// any other byte in them is just data, and ("a:b", "c") differs from ("a", "b:c").
    pub(crate) fn dedup(&self, tenant: &str, key: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 7 + 2 * (tenant.len() + key.len()));
        out.push_str(&self.prefix);
        out.push_str("dedup:");
        push_hex(&mut out, tenant.as_bytes());
        out.push(':');
        push_hex(&mut out, key.as_bytes());
        out
    }
}

/// The hash tag of partition `partition` of `count`: `namespace#p`, or `namespace#p.s`
/// with the smallest `s` that puts the tag's cluster slot in the `p`-th of `count`
/// equal slices of the 16,384 slots. The partitions of a namespace so spread evenly
/// over the slot space, and so over a cluster's masters in proportion to the slots each
/// owns (K = 12 on three masters of equal ranges: four each), where tags of random
/// slots would often pile up on one master. CRC16 is the cluster's own hash, so the
/// tags are the same in every process and version.
pub(crate) fn partition_tag(namespace: &str, partition: usize, count: usize) -> String {
    let count = count.max(1);
    let base = format!("{namespace}#{partition}");
    let slice = |tag: &str| usize::from(crc16(tag.as_bytes()) % SLOTS) * count / usize::from(SLOTS);
    if slice(&base) == partition {
        return base;
    }
    // A slice holds 16,384 / count slots, so a suffix lands in it after about `count`
    // tries; the bound only keeps a loop finite, and is never reached for count <= 256.
    (1..=1_000_000u32)
        .map(|suffix| format!("{base}.{suffix}"))
        .find(|tag| slice(tag) == partition)
        .unwrap_or(base)
}

/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16_384;

/// The text a concurrency key (CONTRACT K1-K5) is stored and indexed under: its bytes
/// hex-encoded, lower case. Hex keeps the keys' byte order, holds no space (the separator
/// of `kready` and `kleases` members, which sorts below every hex digit, so a key sorts
/// before its extensions) and no brace, whatever the key holds.
pub(crate) fn hex_key(key: &str) -> String {
    let mut out = String::with_capacity(2 * key.len());
    push_hex(&mut out, key.as_bytes());
    out
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
}

/// The hash slot Redis Cluster gives `key` (CRC16 of its hash tag, mod 16384).
#[cfg(test)]
pub(crate) fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        bytes[open + 1..]
            .iter()
            .position(|b| *b == b'}')
            .filter(|len| *len > 0)
            .map(|len| &bytes[open + 1..open + 1 + len])
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS
}

/// CRC16-CCITT (XModem), the hash of Redis Cluster's key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use durq_core::Timestamp;

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The reference value from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn every_key_of_a_namespace_shares_one_slot() {
        let keys = Keys::new("ns-1");
        let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
        let slot = hash_slot(&keys.ready);
        let all = [
            keys.sched.clone(),
            keys.leases.clone(),
            keys.list.clone(),
            keys.running.clone(),
            keys.paused.clone(),
            keys.cron_specs.clone(),
            keys.cron_enabled.clone(),
            keys.cron_last.clone(),
            keys.workers.clone(),
            keys.workers_busy.clone(),
            keys.workers_seen.clone(),
            keys.finished.clone(),
            keys.done_v1.clone(),
            keys.children.clone(),
            keys.placement.clone(),
            keys.seq.clone(),
            keys.limits.clone(),
            keys.flow.clone(),
            keys.ckeys.clone(),
            keys.kready.clone(),
            keys.kleases.clone(),
            keys.events.clone(),
            keys.events_trimmed.clone(),
            keys.job(id),
            keys.steps(id),
            keys.steps_named("x"),
            keys.dedup("}{", "{x}"),
            keys.dedup("tenant{other}", "}"),
            keys.dedup("", "k"),
        ];
        for key in all {
            assert_eq!(hash_slot(&key), slot, "{key}");
        }
    }

    #[test]
    fn partitions_take_one_slice_of_the_slots_each_and_keep_their_tags() {
        for count in [2, 3, 12, 100, 256] {
            for namespace in ["jobs", "orders.eu-1", "chaos-17"] {
                let mut slices = std::collections::HashSet::new();
                for partition in 0..count {
                    let keys = Keys::partition(namespace, partition, count);
                    let slot = usize::from(hash_slot(&keys.ready));
                    assert_eq!(
                        slot * count / 16_384,
                        partition,
                        "{namespace} {partition}/{count}"
                    );
                    let id = JobId::mint(Timestamp::from_millis(1));
                    assert_eq!(hash_slot(&keys.job(id)), slot as u16);
                    // A job's steps live in its slot (CONTRACT D1–D4).
                    assert_eq!(hash_slot(&keys.steps(id)), slot as u16);
                    // So does the stream its changes would be recorded in.
                    assert_eq!(hash_slot(&keys.events), slot as u16);
                    slices.insert(slot * count / 16_384);
                    // The namespace's wake-up channel and layout record are its own.
                    assert_eq!(keys.wake, Keys::new(namespace).wake);
                    assert_eq!(keys.layout, Keys::new(namespace).layout);
                }
                assert_eq!(slices.len(), count);
            }
        }
        // Fixed tags, computed independently: a change would move every partitioned
        // namespace's keys where no store looks for them.
        let tags: Vec<String> = (0..12).map(|p| partition_tag("jobs", p, 12)).collect();
        assert_eq!(
            tags,
            [
                "jobs#0.43",
                "jobs#1.13",
                "jobs#2.41",
                "jobs#3.3",
                "jobs#4.11",
                "jobs#5.41",
                "jobs#6.43",
                "jobs#7.22",
                "jobs#8.23",
                "jobs#9.43",
                "jobs#10.22",
                "jobs#11.10",
            ]
        );
        assert_eq!(
            Keys::partition("jobs", 3, 12).ready,
            "jobs:{jobs#3.3}:ready"
        );
    }

    #[test]
    fn distinct_tenant_key_pairs_never_share_a_dedup_key() {
        let keys = Keys::new("ns");
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("", "a:b:c"),
            ("a:b:c", ""),
            ("a", "b"),
            ("ab", ""),
            ("{a}", "b"),
            ("a}", "{b"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (tenant, key) in pairs {
            assert!(seen.insert(keys.dedup(tenant, key)), "{tenant:?} {key:?}");
        }
        // User braces never reach the key: the only braces are the namespace's tag.
        let key = keys.dedup("a}:{", "x{}\u{0}");
        assert!(key.starts_with("jobs:{ns}:dedup:"));
        assert_eq!(key.matches('{').count(), 1);
        assert_eq!(key.matches('}').count(), 1);
    }
}
