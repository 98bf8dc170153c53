//! Reads: one job, its payload, its children, a page of a queue, a queue's counts; and
//! the paused queues, with the one write that changes them.

use std::collections::HashMap;

use jobs_core::{
    Bytes, Error, Job, JobId, JobState, ListPage, ListQuery, QueueStats, Result, StoredSchedule,
    Timestamp,
};

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
            let counts = rest
                .iter()
                .map(|v| int(v, "stats reply").map(|n| u64::try_from(n).unwrap_or(0)))
                .collect::<Result<Vec<_>>>()?;
            let [ready, active, running, succeeded, dead, cancelled] = counts[..] else {
                return Err(unexpected("stats reply", &word));
            };
            // Queued and running jobs share the list code 'a'; the lease entries tell
            // them apart.
            let queued = active.saturating_sub(running);
            return Ok(QueueStats {
                ready,
                scheduled: queued.saturating_sub(ready),
                running,
                succeeded,
                dead,
                cancelled,
                // Filled in by the `Store` handle (CONTRACT Q1).
                paused: false,
            });
        }
        Err(Error::corrupt("scheduled index", "promotion does not end"))
    }
}
