//! Reads: one job, its payload, its children, its attempts, a page of a queue, a
//! queue's counts, every queue's counts and oldest ready job.

use durq_core::attempts::{self, LastClaim};
use durq_core::{
    Attempt, Bytes, Error, Job, JobId, JobState, LeaseToken, ListPage, ListQuery, QueueOverview,
    QueueStats, ReadyOrder, Result, Timestamp, ATTEMPTS_KEPT,
};
use redis::Value;

use super::{status, unexpected, RedisBackend, PROMOTE_BOUND, PROMOTE_ROUNDS};
use crate::codec::{
    array, attempt_field, decode_attempt, decode_job, decode_listed, id_string, int, is_missing,
    job_id, member_id, opt_bytes, tag_pattern, text, JOB_FIELDS,
};
use crate::conn::map_err;
use crate::scripts;

impl RedisBackend {
    /// Rule E1: the job as stored.
    pub(crate) async fn read_job(&self, id: JobId) -> Result<Job> {
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

    /// Rules O1, O2: the job as [`read_job`](Self::read_job) reads it, marked awaited
    /// (`awt`) in the same script if it has not ended, so the script that ends it
    /// announces the ending (await.lua).
    pub(crate) async fn await_job(&self, id: JobId) -> Result<Job> {
        let mut invocation = scripts::AWAIT.prepare_invoke();
        invocation.key(self.keys().job(id));
        for field in &JOB_FIELDS[..] {
            invocation.arg(*field);
        }
        let reply = self.invoke(&invocation, "wait").await?;
        let row: Vec<Option<Vec<u8>>> =
            redis::from_redis_value(reply).map_err(|err| map_err("wait", err.into()))?;
        if is_missing(&row) {
            return Err(Error::NotFound { id });
        }
        decode_job(id, row)
    }

    /// Rule E1: the payload bytes as enqueued.
    pub(crate) async fn read_payload(&self, id: JobId) -> Result<Bytes> {
        let payload: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys().job(id))
            .arg("payload")
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("payload", err))?;
        payload.map(Bytes::from).ok_or(Error::NotFound { id })
    }

    /// Rule E8: the jobs enqueued with `parent`, oldest first.
    pub(crate) async fn read_children(&self, parent: JobId) -> Result<Vec<Job>> {
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

    /// Rule A4: one page of the jobs `query` matches, newest first, in rounds of two
    /// script calls: `list.lua` finds the next ids of the queues and states asked for
    /// (the list index's ranges merged by id, no index of its own), `list_rows.lua`
    /// reads their records in one snapshot, keeps those of the tenant and tags asked for
    /// and returns their rows. A page without tenant or tags is one round. With them,
    /// rounds go on, each asking for twice as many ids, until the page is full, the ids
    /// run out, or [`LIST_EXAMINE_BOUND`] candidates were examined: the page then ends
    /// early, `next` the last id examined (CONTRACT A4 allows it; callers page on until
    /// `next` is none).
    pub(crate) async fn list_jobs(&self, query: ListQuery) -> Result<ListPage> {
        if let (Some(queue), Some(prefix)) = (&query.queue, &query.queue_prefix) {
            if !queue.starts_with(prefix.as_str()) {
                return Ok(ListPage {
                    jobs: Vec::new(),
                    next: None,
                });
            }
        }
        let streams = Streams::of(&query.states);
        let scoped = query.tenant.is_some() || !query.tags.is_empty();
        let patterns: Vec<String> = query
            .tags
            .iter()
            .map(|(key, value)| tag_pattern(key, value))
            .collect();
        let mut cursor = query.cursor;
        let mut examined = 0;
        // Under a tenant or tag filter, the first round asks for a few pages' worth of
        // candidates, each next round for twice as many: few rounds when matches are
        // rare, little read in vain when they are not.
        let mut ask = (4 * query.limit).max(512);
        let mut jobs: Vec<Job> = Vec::with_capacity(query.limit);
        loop {
            let missing = query.limit - jobs.len();
            let left = LIST_EXAMINE_BOUND.saturating_sub(examined).max(1);
            let want = if scoped {
                ask.min(left)
            } else {
                missing.min(left)
            };
            let found = self.list_candidates(&query, &streams, cursor, want).await?;
            let Some(last) = found.ids.last().copied() else {
                return Ok(ListPage { jobs, next: None });
            };
            let (looked, rows) = self
                .list_rows(&found.ids, missing, query.tenant.as_deref(), &patterns)
                .await?;
            examined += looked;
            for (at, row) in rows {
                // list_rows checked every row number against the ids it was given.
                let Some(&id) = found.ids.get(at) else {
                    return Err(Error::corrupt("list rows reply", "bad row number"));
                };
                let queue = found.queue_of(at);
                let job = decode_listed(id, row, queue)?;
                // list_rows.lua judged tenant and tags on the stored text; the decoded
                // job is what counts, and its state may have changed between the calls.
                if query.matches(&job) {
                    jobs.push(job);
                }
            }
            if jobs.len() == query.limit {
                let next = jobs.last().map(|job| job.id);
                return Ok(ListPage { jobs, next });
            }
            if looked >= found.ids.len() && found.exhausted {
                return Ok(ListPage { jobs, next: None });
            }
            // `looked` is at least 1: the script examines candidates until it has the
            // rows still missing, and at least one is.
            let last_examined = looked.checked_sub(1).and_then(|at| found.ids.get(at));
            cursor = Some(last_examined.copied().unwrap_or(last));
            if examined >= LIST_EXAMINE_BOUND {
                return Ok(ListPage { jobs, next: cursor });
            }
            ask = ask.saturating_mul(2);
        }
    }

    /// One `list.lua` call: up to `want` ids after `cursor`, newest first.
    async fn list_candidates(
        &self,
        query: &ListQuery,
        streams: &Streams,
        cursor: Option<JobId>,
        want: usize,
    ) -> Result<Candidates> {
        const WHAT: &str = "list reply";
        let keys = self.keys();
        let mut invocation = scripts::LIST.prepare_invoke();
        invocation
            .key(&keys.list)
            .key(&keys.leases)
            .arg(query.queue.as_deref().unwrap_or(""))
            .arg(query.queue_prefix.as_deref().unwrap_or(""))
            .arg(&streams.codes)
            .arg(if streams.queued_only { "q" } else { "" })
            .arg(if streams.running { "1" } else { "" })
            .arg(cursor.map(id_string).unwrap_or_default())
            .arg(want);
        let reply = self.invoke(&invocation, "list").await?;
        let [ids, numbers, queues, exhausted] = array(&reply, WHAT)? else {
            return Err(Error::corrupt(WHAT, "expected four items"));
        };
        let ids = array(ids, WHAT)?
            .iter()
            .map(|id| job_id(&text(id, WHAT)?, "list index"))
            .collect::<Result<Vec<_>>>()?;
        let numbers = array(numbers, WHAT)?
            .iter()
            .map(|n| int(n, WHAT))
            .collect::<Result<Vec<_>>>()?;
        let queues = array(queues, WHAT)?
            .iter()
            .map(|q| text(q, WHAT))
            .collect::<Result<Vec<_>>>()?;
        if numbers.len() != ids.len() {
            return Err(Error::corrupt(WHAT, "one queue number per id expected"));
        }
        Ok(Candidates {
            ids,
            numbers,
            queues,
            exhausted: int(exhausted, WHAT)? == 1,
        })
    }

    /// One `list_rows.lua` call over `ids`: how many it examined, and the rows it kept
    /// (at most `most`), each with its position in `ids`.
    async fn list_rows(
        &self,
        ids: &[JobId],
        most: usize,
        tenant: Option<&str>,
        patterns: &[String],
    ) -> Result<(usize, Vec<(usize, Vec<Option<Vec<u8>>>)>)> {
        const WHAT: &str = "list rows reply";
        let keys = self.keys();
        let mut invocation = scripts::LIST_ROWS.prepare_invoke();
        // '' for every tenant, '=' and the tenant for one (so the default tenant, the
        // empty one, can be asked for too).
        let tenant = tenant.map_or(String::new(), |tenant| format!("={tenant}"));
        invocation.arg(most).arg(tenant).arg(patterns.len());
        for pattern in patterns {
            invocation.arg(pattern);
        }
        invocation.arg(JOB_FIELDS.len());
        for field in JOB_FIELDS {
            invocation.arg(field);
        }
        for id in ids {
            invocation.key(keys.job(*id));
        }
        let reply = self.invoke(&invocation, "list").await?;
        let [examined, rows] = array(&reply, WHAT)? else {
            return Err(Error::corrupt(WHAT, "expected two items"));
        };
        let examined = usize::try_from(int(examined, WHAT)?)
            .ok()
            .filter(|n| *n <= ids.len())
            .ok_or_else(|| Error::corrupt(WHAT, "bad examined count"))?;
        let mut kept = Vec::new();
        for pair in array(rows, WHAT)?.chunks(2) {
            let [at, values] = pair else {
                return Err(Error::corrupt(WHAT, "a row without its number"));
            };
            let at = usize::try_from(int(at, WHAT)?)
                .ok()
                .and_then(|at| at.checked_sub(1))
                .filter(|at| *at < examined)
                .ok_or_else(|| Error::corrupt(WHAT, "bad row number"))?;
            let values: Vec<Option<Vec<u8>>> = array(values, WHAT)?.iter().map(opt_bytes).collect();
            kept.push((at, values));
        }
        Ok((examined, kept))
    }

    /// Rules H1–H4: the job's attempts, from one HMGET of its hash: the fields of its
    /// last claim and every attempt slot (`a0`..`a31`, see `lua/lib.lua`), never the
    /// payload or result. The hash is the one snapshot of both.
    pub(crate) async fn read_attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        const LAST: [&str; 5] = ["state", "worker", "token", "started", "finished"];
        let slots = ATTEMPTS_KEPT;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.keys().job(id)).arg(&LAST[..]);
        for slot in 0..slots {
            cmd.arg(attempt_field(slot));
        }
        let raw: Vec<Option<Vec<u8>>> = cmd
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("attempts", err))?;
        let corrupt = |field: &str, why: String| {
            Error::corrupt(format!("job {id}"), format!("field {field}: {why}"))
        };
        let names = LAST
            .iter()
            .map(|name| (*name).to_owned())
            .chain((0..slots).map(attempt_field));
        let values = raw
            .into_iter()
            .zip(names)
            .map(|(value, name)| {
                value
                    .map(|bytes| {
                        String::from_utf8(bytes).map_err(|_| corrupt(&name, "not UTF-8".into()))
                    })
                    .transpose()
            })
            .collect::<Result<Vec<Option<String>>>>()?;
        let (last, records) = values.split_at(LAST.len().min(values.len()));
        let [state, worker, token, started, finished] = last else {
            return Err(Error::corrupt("attempts reply", "too few fields"));
        };
        let Some(state) = state else {
            // No job (a staged payload alone is none either); a hash holding a job's
            // fields without its state is one `get` reports as corrupt too.
            if values.iter().any(Option::is_some) {
                return Err(corrupt("state", "missing".into()));
            }
            return Err(Error::NotFound { id });
        };
        let state: JobState = state
            .parse()
            .map_err(|_| corrupt("state", format!("unknown state {state:?}")))?;
        let number = |field: &str, text: &Option<String>| -> Result<Option<i64>> {
            text.as_deref()
                .map(|t| {
                    t.parse()
                        .map_err(|_| corrupt(field, format!("not a number: {t:?}")))
                })
                .transpose()
        };
        let token = number("token", token)?.unwrap_or(0);
        let token = u64::try_from(token).map_err(|_| corrupt("token", "negative".into()))?;
        let mut ended = Vec::new();
        for (slot, record) in (0..slots).zip(records) {
            if let Some(record) = record {
                ended.push(
                    decode_attempt(record).map_err(|why| corrupt(&attempt_field(slot), why))?,
                );
            }
        }
        Ok(attempts::history(
            ended,
            LastClaim {
                state,
                worker: worker.clone(),
                token: LeaseToken::new(token),
                started_at: number("started", started)?.map(Timestamp::from_millis),
                finished_at: number("finished", finished)?.map(Timestamp::from_millis),
            },
        ))
    }

    /// Rule A3: the counts of one queue's jobs per state at `now`, promoting due
    /// scheduled jobs first so `ready` and `scheduled` are told apart at `now`.
    pub(crate) async fn queue_stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        let keys = self.keys();
        let mut invocation = scripts::STATS.prepare_invoke();
        invocation
            .key(&keys.ready)
            .key(&keys.sched)
            .key(&keys.list)
            .key(&keys.running)
            .key(&keys.ckeys)
            .key(&keys.kready)
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
    pub(crate) async fn queue_overviews(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
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
                .key(&keys.ckeys)
                .key(&keys.kready)
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

/// Candidates one `list` call examines at most (CONTRACT A4): with a tenant or tags to
/// match, each is a record read inside `list_rows.lua` (about a microsecond of server
/// time), so a page over jobs that mostly do not match holds the server a few
/// milliseconds at most before it ends early with `next` set.
const LIST_EXAMINE_BOUND: usize = 4096;

/// The ranges one `list.lua` call reads, from the states a query asks for: list-index
/// codes, and how queued and running jobs (which share code `a`) are told apart.
#[derive(Debug, Clone)]
struct Streams {
    /// Codes of the list index read (`w` waiting, `a` queued and running, `s`, `d`,
    /// `c`).
    codes: String,
    /// Only the queued jobs of code `a`: the running ones (the lease index) skipped.
    queued_only: bool,
    /// The running jobs, from the lease index (bounded by how many run), instead of
    /// walking code `a` past every queued job.
    running: bool,
}

impl Streams {
    fn of(states: &[JobState]) -> Self {
        let has = |state| states.is_empty() || states.contains(&state);
        let (queued, running) = (has(JobState::Queued), has(JobState::Running));
        let mut codes = String::new();
        for (wanted, code) in [
            (has(JobState::Waiting), 'w'),
            (queued, 'a'),
            (has(JobState::Succeeded), 's'),
            (has(JobState::Dead), 'd'),
            (has(JobState::Cancelled), 'c'),
        ] {
            if wanted {
                codes.push(code);
            }
        }
        Streams {
            codes,
            queued_only: queued && !running,
            running: running && !queued,
        }
    }
}

/// What one `list.lua` call found.
struct Candidates {
    ids: Vec<JobId>,
    /// For each id, the number (from 1) of its queue in `queues`.
    numbers: Vec<i64>,
    queues: Vec<String>,
    /// No id follows the last one.
    exhausted: bool,
}

impl Candidates {
    /// The queue whose index entry named candidate `at`.
    fn queue_of(&self, at: usize) -> &str {
        self.numbers
            .get(at)
            .and_then(|n| usize::try_from(*n).ok())
            .and_then(|n| n.checked_sub(1))
            .and_then(|n| self.queues.get(n))
            .map_or("", String::as_str)
    }
}

/// Range reads after which one `queues.lua` call starts no further queue: about 400
/// queues of one priority band each (ten reads a queue: one to find it, seven counts, two
/// band reads), some 3 ms of server time; a queue is always read whole, so a call
/// exceeds this by at most one queue's bands.
const QUEUES_READ_BUDGET: usize = 4096;

/// The counts `queue_counts` (lib.lua) answers, in its order: ready, active, running,
/// succeeded, dead, cancelled, waiting, as [`QueueStats`] (`paused` left `false`).
fn decode_counts(values: &[Value], what: &str) -> Result<QueueStats> {
    let counts = values
        .iter()
        .map(|v| int(v, what).map(|n| u64::try_from(n).unwrap_or(0)))
        .collect::<Result<Vec<_>>>()?;
    let [ready, active, running, succeeded, dead, cancelled, waiting] = counts[..] else {
        return Err(Error::corrupt(
            what,
            format!("{} counts instead of 7", counts.len()),
        ));
    };
    // Queued and running jobs share the list code 'a'; the lease entries tell them apart.
    let queued = active.saturating_sub(running);
    Ok(QueueStats {
        waiting,
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
