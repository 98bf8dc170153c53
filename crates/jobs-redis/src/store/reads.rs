//! Reads: one job, its payload, its children, a page of a queue, a queue's counts, every
//! queue's counts and oldest ready job; and the paused queues, with the one write that
//! changes them.

use std::collections::HashMap;

use jobs_core::{
    Bytes, Error, Job, JobId, JobState, ListPage, ListQuery, QueueOverview, QueueStats, ReadyOrder,
    Result, StoredSchedule, Timestamp,
};
use redis::Value;

use super::{status, unexpected, RedisStore, PROMOTE_BOUND, PROMOTE_ROUNDS};
use crate::codec::{
    array, decode_job, decode_listed, int, is_missing, job_id, member_id, text, JOB_FIELDS,
};
use crate::conn::map_err;
use crate::scripts;

impl RedisStore {
    /// Rule Q1: adds `queue` to the paused set or removes it; a resume wakes the
    /// claimers waiting on the queue. One set, read by every claim script.
    pub(super) async fn pause_queue(&self, queue: &str, paused: bool) -> Result<()> {
        let keys = self.keys();
        let mut conn = self.conn();
        if paused {
            let _: i64 = redis::cmd("SADD")
                .arg(&keys.paused)
                .arg(queue)
                .query_async(&mut conn)
                .await
                .map_err(|err| map_err("pause", err))?;
            return Ok(());
        }
        let removed: i64 = redis::cmd("SREM")
            .arg(&keys.paused)
            .arg(queue)
            .query_async(&mut conn)
            .await
            .map_err(|err| map_err("resume", err))?;
        if removed > 0 {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&keys.wake)
                .arg(queue)
                .query_async(&mut conn)
                .await
                .map_err(|err| map_err("resume wake-up", err))?;
        }
        Ok(())
    }

    /// Rules S1, S2: one `schedule.lua` call; false when the schedule was unknown.
    pub(super) async fn write_schedule(
        &self,
        op: &str,
        name: &str,
        third: &str,
        fourth: &str,
    ) -> Result<bool> {
        let keys = self.keys();
        let mut invocation = scripts::SCHEDULE.prepare_invoke();
        invocation
            .key(&keys.cron_specs)
            .key(&keys.cron_enabled)
            .key(&keys.cron_last)
            .arg(op)
            .arg(name)
            .arg(third)
            .arg(fourth);
        let reply = self.invoke(&invocation, "schedule").await?;
        Ok(int(&reply, "schedule reply")? == 1)
    }

    /// Rule S1: every schedule, by name. The three hashes are read in one pipeline; a
    /// schedule deleted or written between them reads as it was before or after.
    pub(super) async fn read_schedules(&self) -> Result<Vec<StoredSchedule>> {
        let keys = self.keys();
        let (specs, enabled, last): (
            HashMap<String, String>,
            HashMap<String, String>,
            HashMap<String, String>,
        ) = redis::pipe()
            .hgetall(&keys.cron_specs)
            .hgetall(&keys.cron_enabled)
            .hgetall(&keys.cron_last)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("schedules", err))?;
        let mut schedules = Vec::with_capacity(specs.len());
        for (name, spec) in specs {
            let what = || format!("schedule {name}");
            let on = match enabled.get(&name).map(String::as_str) {
                Some("1") => true,
                Some("0") => false,
                other => return Err(Error::corrupt(what(), format!("enabled flag {other:?}"))),
            };
            let tick = last
                .get(&name)
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or_else(|| Error::corrupt(what(), "last tick missing or not a number"))?;
            schedules.push(StoredSchedule {
                name,
                spec,
                enabled: on,
                last_tick: Timestamp::from_millis(tick),
            });
        }
        schedules.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(schedules)
    }

    /// Rule Q1: the paused queues, by name.
    pub(super) async fn read_paused_queues(&self) -> Result<Vec<String>> {
        let mut queues: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&self.keys().paused)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("paused queues", err))?;
        queues.sort_unstable();
        Ok(queues)
    }

    /// Rule E1: the job as stored.
    pub(super) async fn read_job(&self, id: JobId) -> Result<Job> {
        let row: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(self.keys().job(id))
            .arg(&JOB_FIELDS[..])
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("get", err))?;
        if is_missing(&row) {
            return Err(Error::NotFound { id });
        }
        decode_job(id, row)
    }

    /// Rule E1: the payload bytes as enqueued.
    pub(super) async fn read_payload(&self, id: JobId) -> Result<Bytes> {
        let payload: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys().job(id))
            .arg("payload")
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("payload", err))?;
        payload.map(Bytes::from).ok_or(Error::NotFound { id })
    }

    /// Rule E8: the jobs enqueued with `parent`, oldest first.
    pub(super) async fn read_children(&self, parent: JobId) -> Result<Vec<Job>> {
        let prefix = format!("{parent} ");
        let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
            .arg(&self.keys().children)
            .arg(format!("[{prefix}"))
            .arg(format!("({parent}!"))
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("children", err))?;
        let ids = members
            .iter()
            .map(|member| member_id(member, "children index"))
            .collect::<Result<Vec<_>>>()?;
        self.get_many(&ids, "").await
    }

    /// Reads jobs by id in one round trip; vanished ones are left out. `queue` names the
    /// queue of an index that led here, shown for a buried record whose own is unreadable.
    async fn get_many(&self, ids: &[JobId], queue: &str) -> Result<Vec<Job>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HMGET")
                .arg(self.keys().job(*id))
                .arg(&JOB_FIELDS[..]);
        }
        let rows: Vec<Vec<Option<Vec<u8>>>> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("read jobs", err))?;
        let mut jobs = Vec::with_capacity(ids.len());
        for (id, row) in ids.iter().zip(rows) {
            if !is_missing(&row) {
                jobs.push(decode_listed(*id, row, queue)?);
            }
        }
        Ok(jobs)
    }

    /// Up to `limit` ids of `queue`'s list index under the state `codes`, newest first,
    /// after `cursor`: one consistent read of every code's range, merged.
    async fn list_ids(
        &self,
        queue: &str,
        codes: &str,
        cursor: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<JobId>> {
        let mut invocation = scripts::LIST.prepare_invoke();
        invocation
            .key(&self.keys().list)
            .arg(queue)
            .arg(codes)
            .arg(cursor.map(|c| c.to_string()).unwrap_or_default())
            .arg(limit);
        let reply = self.invoke(&invocation, "list").await?;
        let mut ids = Vec::new();
        for part in array(&reply, "list reply")? {
            for id in array(part, "list reply")? {
                ids.push(job_id(&text(id, "list reply")?, "list index")?);
            }
        }
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids.dedup();
        ids.truncate(limit);
        Ok(ids)
    }

    /// The ids of `queue`'s running jobs, newest first, after `cursor`, from the lease
    /// index (read whole: it holds one entry per running job of the namespace).
    async fn running_ids(&self, queue: &str, cursor: Option<JobId>) -> Result<Vec<JobId>> {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&self.keys().leases)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("list running", err))?;
        let prefix = format!("{queue} ");
        let mut ids = Vec::new();
        for member in members.iter().filter(|m| m.starts_with(&prefix)) {
            let id = member_id(member, "lease index")?;
            if cursor.is_none_or(|cursor| id < cursor) {
                ids.push(id);
            }
        }
        ids.sort_unstable_by(|a, b| b.cmp(a));
        Ok(ids)
    }

    /// Rule A4: one page of a queue's jobs, newest first.
    pub(super) async fn list_jobs(&self, query: ListQuery) -> Result<ListPage> {
        // Running jobs are read from the lease index (bounded by how many run); every
        // other page from the list index, whose code 'a' holds queued and running jobs
        // alike, so a queued page skips the running ones on the way.
        let running = match query.state {
            Some(JobState::Running) => Some(self.running_ids(&query.queue, query.cursor).await?),
            _ => None,
        };
        let codes = match query.state {
            Some(JobState::Queued) | Some(JobState::Running) => "a",
            Some(JobState::Succeeded) => "s",
            Some(JobState::Dead) => "d",
            Some(JobState::Cancelled) => "c",
            None => "asdc",
        };
        let mut cursor = query.cursor;
        let mut offset = 0;
        let mut jobs = Vec::with_capacity(query.limit);
        loop {
            let ids: Vec<JobId> = match &running {
                Some(all) => {
                    let chunk: Vec<JobId> =
                        all.iter().skip(offset).take(query.limit).copied().collect();
                    offset += chunk.len();
                    chunk
                }
                None => {
                    self.list_ids(&query.queue, codes, cursor, query.limit)
                        .await?
                }
            };
            let exhausted = ids.len() < query.limit;
            for job in self.get_many(&ids, &query.queue).await? {
                if query.state.is_none_or(|state| job.state == state) {
                    let id = job.id;
                    jobs.push(job);
                    if jobs.len() == query.limit {
                        return Ok(ListPage {
                            jobs,
                            next: Some(id),
                        });
                    }
                }
            }
            if exhausted {
                return Ok(ListPage { jobs, next: None });
            }
            cursor = ids.last().copied();
        }
    }

    /// Rule A3: the counts of one queue's jobs per state at `now`, promoting due
    /// scheduled jobs first so `ready` and `scheduled` are told apart at `now`.
    pub(super) async fn queue_stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let keys = self.keys();
        let mut invocation = scripts::STATS.prepare_invoke();
        invocation
            .key(&keys.ready)
            .key(&keys.sched)
            .key(&keys.list)
            .key(&keys.running)
            .arg(now.as_millis())
            .arg(PROMOTE_BOUND)
            .arg(queue);
        for _ in 0..=PROMOTE_ROUNDS {
            let reply = self.invoke(&invocation, "stats").await?;
            let (word, rest) = status(&reply, "stats reply")?;
            if word == "promote" {
                continue;
            }
            return decode_counts(rest, "stats reply");
        }
        Err(Error::corrupt("scheduled index", "promotion does not end"))
    }

    /// Rule A7: every queue holding a job, by name, with its counts and the ready time of
    /// its oldest ready job at `now`: `queues.lua` calls, each listing the queues after
    /// the last one the previous call listed until its read budget is spent
    /// ([`QUEUES_READ_BUDGET`]), due scheduled jobs promoted first as in `stats`. Each
    /// queue's row comes from one call; rows of different calls are read at different
    /// moments (all at `now`), so a queue that gets its first job during a listing of
    /// several calls may be missed, as if it came just after.
    pub(super) async fn queue_overviews(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        const WHAT: &str = "queues reply";
        let keys = self.keys();
        let mut overviews = Vec::new();
        let mut after = String::new();
        let mut promotions = 0;
        loop {
            let mut invocation = scripts::QUEUES.prepare_invoke();
            invocation
                .key(&keys.ready)
                .key(&keys.sched)
                .key(&keys.list)
                .key(&keys.running)
                .arg(now.as_millis())
                .arg(PROMOTE_BOUND)
                .arg(&after)
                .arg(QUEUES_READ_BUDGET);
            let reply = self.invoke(&invocation, "queues").await?;
            let (word, rest) = status(&reply, WHAT)?;
            match (word.as_str(), rest) {
                ("promote", _) => {
                    promotions += 1;
                    if promotions > PROMOTE_ROUNDS {
                        return Err(Error::corrupt("scheduled index", "promotion does not end"));
                    }
                }
                ("corrupt", [member]) => {
                    let member = text(member, WHAT)?;
                    return Err(Error::corrupt(
                        "list index",
                        format!("member {member:?} names no queue"),
                    ));
                }
                ("ok", [next, rows]) => {
                    for row in array(rows, WHAT)? {
                        overviews.push(decode_overview(row)?);
                    }
                    let next = text(next, WHAT)?;
                    if next.is_empty() {
                        break;
                    }
                    // The script always moves forward in the index, so the calls end.
                    after = next;
                }
                _ => return Err(unexpected(WHAT, &word)),
            }
        }
        // Index order is byte order for valid names; sorting keeps the promise for any.
        overviews.sort_by(|a, b| a.queue.cmp(&b.queue));
        overviews.dedup_by(|a, b| a.queue == b.queue);
        Ok(overviews)
    }
}

/// Range reads after which one `queues.lua` call starts no further queue: about 450
/// queues of one priority band each (nine reads a queue: one to find it, six counts, two
/// band reads), some 3 ms of server time; a queue is always read whole, so a call
/// exceeds this by at most one queue's bands.
const QUEUES_READ_BUDGET: usize = 4096;

/// The counts `queue_counts` (lib.lua) answers, in its order: ready, active, running,
/// succeeded, dead, cancelled, as [`QueueStats`] (`paused` left `false`).
fn decode_counts(values: &[Value], what: &str) -> Result<QueueStats> {
    let counts = values
        .iter()
        .map(|v| int(v, what).map(|n| u64::try_from(n).unwrap_or(0)))
        .collect::<Result<Vec<_>>>()?;
    let [ready, active, running, succeeded, dead, cancelled] = counts[..] else {
        return Err(Error::corrupt(
            what,
            format!("{} counts instead of 6", counts.len()),
        ));
    };
    // Queued and running jobs share the list code 'a'; the lease entries tell them apart.
    let queued = active.saturating_sub(running);
    Ok(QueueStats {
        ready,
        scheduled: queued.saturating_sub(ready),
        running,
        succeeded,
        dead,
        cancelled,
        // Filled in by the `Store` handle (CONTRACT Q1).
        paused: false,
    })
}

/// One row of `queues.lua`: `{queue, counts, order key or ''}`.
fn decode_overview(row: &Value) -> Result<QueueOverview> {
    const WHAT: &str = "queues reply";
    let [name, counts, oldest] = array(row, WHAT)? else {
        return Err(Error::corrupt(WHAT, "a row is not {queue, counts, key}"));
    };
    let queue = text(name, WHAT)?;
    let stats = decode_counts(array(counts, WHAT)?, &format!("counts of queue {queue}"))?;
    let oldest = text(oldest, WHAT)?;
    let oldest_ready = if oldest.is_empty() {
        None
    } else {
        Some(ReadyOrder::ready_at_of_sort_key(&oldest).ok_or_else(|| {
            Error::corrupt(
                "ready index",
                format!("order key {oldest:?} of queue {queue}"),
            )
        })?)
    };
    Ok(QueueOverview::new(queue, stats, oldest_ready))
}
