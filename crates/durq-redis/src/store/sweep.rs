//! The sweeps: `reclaim` of expired leases and `purge` of finished jobs past
//! retention. Each reads its candidates from the head of a sorted index, so its cost
//! follows the entries due, not the size of the index (CONTRACT R6). And the sweep of
//! a whole namespace, `drop_namespace`.

use durq_core::{Error, ReclaimedJob, Result, Timestamp, LEASE_EXPIRED};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;

use super::{parse_state, RedisBackend};
use crate::backend::ReclaimReport;
use crate::codec::{array, int, job_id, member_id, text};
use crate::conn::{map_err, Conn};
use crate::scripts;
use crate::store::enqueue::ready_hex;
use crate::store::graph::Dependents;

/// Entries one reclaim or purge call handles.
const SWEEP_CHUNK: usize = 1000;

impl RedisBackend {
    /// Deletes the dedup keys (unique while active, no TTL) of jobs just purged, each
    /// only while it still names its job: `keys_left` as `purge.lua` returns them.
    async fn drop_unique_keys(&self, keys_left: &[Value]) -> Result<()> {
        if keys_left.is_empty() {
            return Ok(());
        }
        let mut invocation = scripts::UNKEY.prepare_invoke();
        for pair in keys_left.chunks(2) {
            let [key, id] = pair else {
                return Err(Error::corrupt("purge reply", "a key without its job"));
            };
            invocation
                .key(text(key, "purge reply")?)
                .arg(text(id, "purge reply")?);
        }
        self.invoke(&invocation, "purge keys").await.map(drop)
    }

    /// What [`RedisBackend::drop_namespace`] does: `SCAN` a page at a time, `UNLINK`
    /// what it found.
    pub(crate) async fn unlink_namespace(&self) -> Result<u64> {
        let pattern = self.keys().all();
        let mut conn = self.conn();
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SWEEP_CHUNK);
            let page = match &mut conn {
                Conn::Single(single) => scan.query_async::<Value>(single).await,
                Conn::Cluster(cluster) => {
                    let route = Route::with_key(&self.keys().ready, SlotAddr::Master);
                    let routing =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    cluster.route_command(scan, routing).await
                }
            }
            .map_err(|err| map_err("drop_namespace scan", err))?;
            let (next, keys): (u64, Vec<String>) = redis::from_redis_value(page)
                .map_err(|err| map_err("drop_namespace scan", err.into()))?;
            if !keys.is_empty() {
                let unlinked: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|err| map_err("drop_namespace unlink", err))?;
                deleted += unlinked;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Up to `limit` members of the sorted set `key` with the lowest scores, up to
    /// `max_score` (a Redis score bound: `(n` is exclusive). The sweeps of reclaim and
    /// purge read their candidates this way, so their cost follows the entries due,
    /// not the size of the set (CONTRACT R6).
    async fn oldest_members(
        &self,
        key: &str,
        max_score: &str,
        limit: usize,
        what: &'static str,
    ) -> Result<Vec<String>> {
        redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg("-inf")
            .arg(max_score)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err(what, err))
    }

    /// What [`RedisBackend::reclaim_with_report`] does.
    pub(crate) async fn reclaim_expired(
        &self,
        limit: usize,
        now: Timestamp,
    ) -> Result<(Vec<ReclaimedJob>, ReclaimReport)> {
        let mut report = ReclaimReport::default();
        let mut reclaimed = Vec::new();
        let now_text = now.as_millis().to_string();
        let now_hex = ready_hex(now);
        let keys = self.keys();
        while reclaimed.len() < limit {
            let batch = (limit - reclaimed.len()).min(SWEEP_CHUNK);
            // Only entries strictly expired (R1): O(log n + expired), whatever the number
            // of live leases (R6).
            let members = self
                .oldest_members(&keys.leases, &format!("({now_text}"), batch, "reclaim read")
                .await?;
            if members.is_empty() {
                break;
            }
            let ids = members
                .iter()
                .map(|member| member_id(member, "lease index"))
                .collect::<Result<Vec<_>>>()?;
            let reply = Dependents::default()
                .send_settling(&self.conn(), keys, now, "reclaim", || {
                    let mut invocation = scripts::RECLAIM.prepare_invoke();
                    invocation
                        .key(&keys.leases)
                        .key(&keys.ready)
                        .key(&keys.list)
                        .key(&keys.finished)
                        .key(&keys.seq)
                        .key(&keys.running)
                        .key(&keys.kready)
                        .key(&keys.ckeys)
                        .key(&keys.kleases)
                        .arg(&now_text)
                        .arg(&now_hex)
                        .arg(LEASE_EXPIRED)
                        .arg(&keys.wake);
                    for (member, id) in members.iter().zip(&ids) {
                        invocation.key(keys.job(*id)).arg(member);
                    }
                    invocation
                })
                .await?;
            let items = array(&reply, "reclaim reply")?;
            let [examined, jobs] = items else {
                return Err(Error::corrupt("reclaim reply", "expected two items"));
            };
            report.examined += u64::try_from(int(examined, "reclaim reply")?).unwrap_or(0);
            let jobs = array(jobs, "reclaim reply")?;
            for job in jobs {
                let pair = array(job, "reclaim reply")?;
                let [id, state] = pair else {
                    return Err(Error::corrupt("reclaim reply", "expected id and state"));
                };
                reclaimed.push(ReclaimedJob {
                    id: job_id(&text(id, "reclaim reply")?, "reclaim reply")?,
                    state: parse_state(&text(state, "reclaim reply")?, "reclaim reply")?,
                });
            }
            if members.len() < batch || jobs.is_empty() {
                break;
            }
        }
        Ok((reclaimed, report))
    }

    /// Rule A5: deletes up to `limit` terminal jobs finished at or before `cutoff`:
    /// first those left in layout 1's index (a namespace upgraded from that layout, or a
    /// store of it still running), then those of the finished log.
    pub(crate) async fn purge_finished(&self, limit: usize, cutoff: Timestamp) -> Result<u64> {
        let cutoff_ms = cutoff.as_millis();
        let cutoff_text = cutoff_ms.to_string();
        let keys = self.keys();
        let mut deleted = 0u64;
        while (deleted as usize) < limit {
            let batch = (limit - deleted as usize).min(SWEEP_CHUNK);
            // Both heads in one round trip; layout 1's index is absent on a namespace
            // this layout created, so reading it costs one empty reply.
            let (v1, mut log): (Vec<String>, Vec<String>) = redis::pipe()
                .cmd("ZRANGEBYSCORE")
                .arg(&keys.done_v1)
                .arg("-inf")
                .arg(&cutoff_text)
                .arg("LIMIT")
                .arg(0)
                .arg(batch)
                .cmd("LRANGE")
                .arg(&keys.finished)
                .arg(0)
                .arg(batch - 1)
                .query_async(&mut self.conn())
                .await
                .map_err(|err| map_err("purge read", err))?;
            let (source, entries) = if v1.is_empty() {
                // The log is in the order jobs finished: its due entries are a prefix
                // (an entry whose time does not parse is due, so the script drops it).
                let due = log
                    .iter()
                    .take_while(|entry| entry_time(entry).is_none_or(|at| at <= cutoff_ms))
                    .count();
                log.truncate(due);
                (FinishedSource::Log, log)
            } else {
                (FinishedSource::V1, v1)
            };
            if entries.is_empty() {
                break;
            }
            let (count, consumed) = self.purge_entries(source, &entries, &cutoff_text).await?;
            deleted += count;
            // Entries not consumed were taken by a concurrent purge, which made progress:
            // read again. A short due head consumed whole: nothing more is due.
            if source == FinishedSource::Log && entries.len() < batch && consumed == entries.len() {
                break;
            }
        }
        Ok(deleted)
    }

    /// One `purge.lua` call over `entries` of `source`: the jobs deleted, and how many
    /// entries left their log or index.
    async fn purge_entries(
        &self,
        source: FinishedSource,
        entries: &[String],
        cutoff_text: &str,
    ) -> Result<(u64, usize)> {
        let keys = self.keys();
        let mut invocation = scripts::PURGE.prepare_invoke();
        invocation
            .key(&keys.finished)
            .key(&keys.done_v1)
            .key(&keys.list)
            .key(&keys.children)
            .key(&keys.placement)
            .key(&keys.seq)
            .key(&keys.running)
            .key(&keys.ckeys)
            .key(&keys.kready)
            .key(&keys.kleases)
            .arg(cutoff_text)
            .arg(source.word());
        // Log entries: "finished queue code id parent"; layout 1's: "queue code id parent".
        let id_word = match source {
            FinishedSource::Log => 3,
            FinishedSource::V1 => 2,
        };
        // Each entry's job hash and its steps (CONTRACT D1–D4), which go with it.
        for entry in entries {
            let id = entry.split(' ').nth(id_word).unwrap_or_default();
            invocation
                .key(keys.job_named(id))
                .key(keys.steps_named(id))
                .arg(entry);
        }
        let reply = self.invoke(&invocation, "purge").await?;
        let [count, consumed, keys_left] = array(&reply, "purge reply")? else {
            return Err(Error::corrupt("purge reply", "three items expected"));
        };
        self.drop_unique_keys(array(keys_left, "purge reply")?)
            .await?;
        Ok((
            u64::try_from(int(count, "purge reply")?).unwrap_or(0),
            usize::try_from(int(consumed, "purge reply")?).unwrap_or(0),
        ))
    }
}

/// Where `purge` reads finished jobs from (`purge.lua`'s ARGV[2]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinishedSource {
    /// The finished log (`Keys::finished`), oldest first.
    Log,
    /// Layout 1's index of finished jobs (`Keys::done_v1`), by finish time.
    V1,
}

impl FinishedSource {
    fn word(self) -> &'static str {
        match self {
            FinishedSource::Log => "log",
            FinishedSource::V1 => "v1",
        }
    }
}

/// The finish time (ms) a finished log entry starts with, or `None` when it does not.
fn entry_time(entry: &str) -> Option<i64> {
    entry.split(' ').next()?.parse().ok()
}
