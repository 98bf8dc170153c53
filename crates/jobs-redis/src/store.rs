//! `RedisStore`: the `Store` contract over Redis, one Lua script per state change.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobs_core::validate::{
    truncate_error, validate_batch, validate_claim, validate_lease_ttl, validate_list,
    validate_new_job, validate_queue, validate_settings, validate_size,
};
use jobs_core::{
    async_trait, complete_each, duration_millis, Bytes, ClaimRequest, ClaimedJob, Completion,
    Enqueued, Error, Heartbeat, HeldLease, Job, JobId, JobState, LeaseToken, ListPage, ListQuery,
    NewJob, QueueStats, ReclaimedJob, Result, Retry, Store, StoreSettings, Timestamp,
    LEASE_EXPIRED,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{ScriptInvocation, Value};

use crate::batch::{self, Completer, Entry as BatchEntry};
use crate::codec::{
    array, decode_claimed, decode_job, decode_listed, id_string, int, is_missing, job_id,
    job_id_bytes, member_id, text, LeaseWrite, Unreadable, JOB_FIELDS,
};
use crate::conn::{map_err, Conn};
use crate::enqueue::{ready_hex, Ctx as EnqueueCtx, Enqueuer, Prepared};
use crate::keys::Keys;
use crate::scripts;
use crate::wake::Waker;

/// Due scheduled entries one script call moves to the ready index. Bounds the work of a
/// call when a large batch of scheduled jobs falls due at once.
const PROMOTE_BOUND: usize = 1000;
/// Entries one reclaim or purge call handles.
const SWEEP_CHUNK: usize = 1000;
/// Claim calls that may find their candidates taken by other claimers before a claim
/// gives up and returns what it has (an empty claim is allowed; the caller claims again).
const CLAIM_CONTENDED_ROUNDS: usize = 64;
/// Extra ids a claim asks for beyond its limit, so the next claim of the same queues
/// usually needs one call.
const HINT_SLACK: usize = 16;
/// Garbage-collection margin on top of the dedup window: server TTLs must
/// never decide anything, so they fire well after the clock's decision.
const TTL_MARGIN_MS: i64 = 24 * 60 * 60 * 1000;
/// The longest server TTL set (100 years); longer settings just keep the keys.
const TTL_MAX_MS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// A job store on Redis or Redis Cluster.
///
/// Every state change is one Lua script (EVALSHA), all keys of a namespace share the
/// hash tag `{namespace}`, and every decision takes "now" from the store's clock. See
/// `docs/redis.md` for the keys and scripts. Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    settings: StoreSettings,
    keys: Keys,
    /// The ids at the head of the ready order after the last claim of each queue set,
    /// so the next claim can pass their hashes in KEYS without reading first.
    hints: Mutex<HashMap<String, Vec<JobId>>>,
    waker: Waker,
    completer: Completer,
    enqueuer: Enqueuer,
    enqueue_ctx: EnqueueCtx,
    cluster: bool,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is not kept: it may hold a password.
        f.debug_struct("RedisStore")
            .field("namespace", &self.inner.settings.namespace)
            .field("cluster", &self.inner.cluster)
            .finish_non_exhaustive()
    }
}

/// What one `reclaim` did, beyond the jobs it recovered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Lease entries the scripts looked at: only entries already expired when read, so
    /// this follows the number of expired leases, not of running jobs (CONTRACT R6).
    pub examined: u64,
}

fn ttl_ms(duration: Duration) -> i64 {
    duration_millis(duration)
        .saturating_add(TTL_MARGIN_MS)
        .min(TTL_MAX_MS)
}

/// The status word a script answered with, and the rest of its reply.
fn status<'a>(reply: &'a Value, what: &str) -> Result<(String, &'a [Value])> {
    let items = array(reply, what)?;
    let (first, rest) = items
        .split_first()
        .ok_or_else(|| Error::corrupt(what, "empty script reply"))?;
    Ok((text(first, what)?, rest))
}

fn unexpected(what: &str, word: &str) -> Error {
    Error::corrupt(what, format!("unexpected script reply {word:?}"))
}

fn parse_state(text: &str, what: &str) -> Result<JobState> {
    text.parse()
        .map_err(|_| Error::corrupt(what, format!("unknown state {text:?}")))
}

impl RedisStore {
    /// Connects to one Redis server, e.g. `redis://127.0.0.1:6379`. The connection
    /// reconnects by itself; a call made while it is down fails with
    /// [`Error::Unavailable`].
    pub async fn connect(url: &str, settings: StoreSettings) -> Result<Self> {
        validate_settings(&settings)?;
        let client = redis::Client::open(url)
            .map_err(|err| Error::invalid("url", format!("not a Redis URL: {err}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(30)))
            .set_number_of_retries(2);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|err| map_err("connect", err))?;
        Self::finish_connect(Conn::Single(conn), vec![url.to_owned()], settings, false).await
    }

    /// Connects to a Redis Cluster through any of its nodes' URLs. Every key of a
    /// namespace is in one hash slot, so every script runs on the node owning it.
    pub async fn connect_cluster<I, S>(urls: I, settings: StoreSettings) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        validate_settings(&settings)?;
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        if urls.is_empty() {
            return Err(Error::invalid("urls", "name at least one cluster node"));
        }
        let client = ClusterClientBuilder::new(urls.clone())
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(30))
            .build()
            .map_err(|err| Error::invalid("urls", format!("not Redis URLs: {err}")))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|err| map_err("connect", err))?;
        // Pub/sub messages reach every node of a cluster, so any node's URL serves.
        Self::finish_connect(Conn::Cluster(conn), urls, settings, true).await
    }

    async fn finish_connect(
        conn: Conn,
        pubsub_urls: Vec<String>,
        settings: StoreSettings,
        cluster: bool,
    ) -> Result<Self> {
        let keys = Keys::new(&settings.namespace);
        let waker = Waker::new(pubsub_urls, keys.wake.clone());
        let completer = Completer::new(conn.clone(), keys.clone());
        let window = settings.dedup_window;
        let enqueue_ctx = EnqueueCtx {
            conn: conn.clone(),
            keys: keys.clone(),
            window,
            dedup_ttl: if window.is_zero() { 0 } else { ttl_ms(window) },
        };
        let enqueuer = Enqueuer::new(enqueue_ctx.clone());
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                settings,
                keys,
                hints: Mutex::new(HashMap::new()),
                waker,
                completer,
                enqueuer,
                enqueue_ctx,
                cluster,
            }),
        };
        // Loading every script now finds a broken server or script at connect time, and
        // spares the first calls a NOSCRIPT round trip.
        let mut conn = store.conn();
        for script in scripts::all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|err| map_err("script load", err))?;
        }
        Ok(store)
    }

    fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    fn keys(&self) -> &Keys {
        &self.inner.keys
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

    fn now(&self) -> Timestamp {
        self.inner.settings.now()
    }

    async fn invoke(&self, invocation: &ScriptInvocation<'_>, what: &str) -> Result<Value> {
        invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(|err| map_err(what, err))
    }

    /// Resolves once the wake-up subscriber is subscribed (or after `timeout`); returns
    /// whether it is. Waiting for work works without it, by timeout.
    pub async fn wake_ready(&self, timeout: Duration) -> bool {
        self.inner.waker.subscribed(timeout).await
    }

    /// How many `wait_for_work` calls on this store are waiting now.
    pub fn waiting_for_work(&self) -> usize {
        self.inner.waker.waiting()
    }

    /// [`Store::reclaim`], also reporting how many lease entries the scripts examined.
    pub async fn reclaim_with_report(
        &self,
        limit: usize,
    ) -> Result<(Vec<ReclaimedJob>, ReclaimReport)> {
        let mut report = ReclaimReport::default();
        let mut reclaimed = Vec::new();
        let now = self.now();
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
            let mut invocation = scripts::RECLAIM.prepare_invoke();
            invocation
                .key(&keys.leases)
                .key(&keys.ready)
                .key(&keys.list)
                .key(&keys.done)
                .key(&keys.seq)
                .key(&keys.running)
                .arg(&now_text)
                .arg(&now_hex)
                .arg(LEASE_EXPIRED)
                .arg(&keys.wake);
            for member in &members {
                let id = member_id(member, "lease index")?;
                invocation.key(keys.job(id)).arg(member);
            }
            let reply = self.invoke(&invocation, "reclaim").await?;
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

    /// The ids the batch's dedup keys point at now, so the scripts rarely have to ask.
    async fn read_dedup_keys(&self, jobs: &[NewJob]) -> Result<Vec<JobId>> {
        let keys: Vec<String> = jobs
            .iter()
            .filter_map(|job| {
                let key = job.idempotency_key.as_ref()?;
                Some(self.keys().dedup(&job.tenant, key))
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.get(key);
        }
        let values: Vec<Option<String>> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("enqueue dedup read", err))?;
        values
            .into_iter()
            .flatten()
            .map(|id| job_id(&id, "dedup key"))
            .collect::<Result<HashSet<_>>>()
            .map(|ids| ids.into_iter().collect())
    }

    async fn enqueue_jobs(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        validate_batch(&jobs, &self.inner.settings)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut known = self.read_dedup_keys(&jobs).await?;
        let now = self.now();
        let prepared: Vec<Prepared> = jobs
            .into_iter()
            .map(|job| Prepared {
                job,
                id: JobId::mint(now),
                now,
            })
            .collect();
        crate::enqueue::run_all(&self.inner.enqueue_ctx, &prepared, &mut known).await
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

    /// Reads one claim script reply: `None` when the script only promoted due jobs, else
    /// how many jobs it leased and the hint for the next call. The leased jobs that can
    /// be read are appended to `claimed`, the others to `unreadable` (to be buried).
    fn claim_round(
        &self,
        reply: Value,
        lease: &LeaseWrite<'_>,
        claimed: &mut Vec<ClaimedJob>,
        unreadable: &mut Vec<Unreadable>,
    ) -> Result<Option<(usize, Vec<JobId>)>> {
        let Value::Array(mut items) = reply else {
            return Err(Error::corrupt("claim reply", "expected an array"));
        };
        let word = items
            .first()
            .map(|w| text(w, "claim reply"))
            .transpose()?
            .unwrap_or_default();
        if word == "promote" {
            return Ok(None);
        }
        if word != "ok" || items.len() != 4 {
            return Err(unexpected("claim reply", &word));
        }
        let corrupt_value = items.pop().unwrap_or_default();
        let hint_value = items.pop().unwrap_or_default();
        let jobs_value = items.pop().unwrap_or_default();
        let Value::Array(jobs) = jobs_value else {
            return Err(Error::corrupt("claim reply", "expected an array of jobs"));
        };
        let got = jobs.len();
        for job in jobs {
            // A leased job whose record cannot be read is not handed out, and failing the
            // whole claim would strand its batch mates until their leases expire: it is
            // buried (moved to dead) after this round.
            match decode_claimed(job, lease) {
                Ok(job) => claimed.push(job),
                Err(Ok(bad)) => unreadable.push(bad),
                Err(Err(err)) => return Err(err),
            }
        }
        for id in array(&corrupt_value, "claim reply")? {
            tracing::warn!(
                namespace = %self.inner.settings.namespace,
                id = %text(id, "claim reply")?,
                "a ready job's record is unreadable; the claim moved it to dead"
            );
        }
        let hint = array(&hint_value, "claim reply")?
            .iter()
            .map(|id| match id {
                Value::BulkString(bytes) => job_id_bytes(bytes, "ready index"),
                other => job_id(&text(other, "claim reply")?, "ready index"),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((got, hint)))
    }

    /// Moves jobs this store's claim leased but could not read to `dead` (`bury.lua`),
    /// so they are neither handed out nor come back after each reclaim. Best effort: a
    /// job this misses stays leased, and reclaim or the next claim buries it.
    async fn bury(&self, unreadable: Vec<Unreadable>, now: Timestamp) {
        let keys = self.keys();
        for bad in unreadable {
            tracing::warn!(
                namespace = %self.inner.settings.namespace,
                id = %bad.id,
                error = %bad.error,
                "a claimed job's record is unreadable; moving it to dead"
            );
            let Some(token) = bad.token else {
                // Without a token the lease cannot be fenced: reclaim buries it once its
                // lease ran out (its token field is what it cannot read).
                continue;
            };
            let mut invocation = scripts::BURY.prepare_invoke();
            invocation
                .key(keys.job(bad.id))
                .key(&keys.leases)
                .key(&keys.list)
                .key(&keys.done)
                .key(&keys.running)
                .arg(id_string(bad.id))
                .arg(token.get())
                .arg(now.as_millis())
                .arg(bad.error.to_string());
            if let Err(err) = self.invoke(&invocation, "bury").await {
                tracing::warn!(id = %bad.id, error = %err, "could not bury an unreadable job");
            }
        }
    }

    /// One `heartbeat.lua` call over `leases`, one answer per entry.
    async fn heartbeat_many(
        &self,
        leases: &[HeldLease],
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        let now = self.now();
        let expires_at = now.saturating_add(ttl);
        let keys = self.keys();
        let mut invocation = scripts::HEARTBEAT.prepare_invoke();
        invocation
            .key(&keys.leases)
            .key(&keys.running)
            .arg(now.as_millis())
            .arg(expires_at.as_millis());
        for lease in leases {
            invocation
                .key(keys.job(lease.id))
                .arg(id_string(lease.id))
                .arg(lease.token.get());
        }
        let reply = self.invoke(&invocation, "heartbeat").await?;
        let items = array(&reply, "heartbeat reply")?;
        if items.len() != leases.len() {
            return Err(Error::corrupt(
                "heartbeat reply",
                "one status per lease expected",
            ));
        }
        leases
            .iter()
            .zip(items)
            .map(|(lease, item)| {
                let word = text(item, "heartbeat reply")?;
                Ok(match word.as_str() {
                    "0" | "1" => Ok(Heartbeat {
                        cancel_requested: word == "1",
                        expires_at,
                    }),
                    other => Err(Self::lease_call_error(
                        lease.id,
                        other,
                        &[],
                        "heartbeat reply",
                    )),
                })
            })
            .collect()
    }

    fn lease_call_error(id: JobId, word: &str, rest: &[Value], what: &str) -> Error {
        match word {
            "notfound" => Error::NotFound { id },
            "lost" => Error::LeaseLost { id },
            "corrupt" => Error::corrupt(
                format!("job {id}"),
                rest.first()
                    .and_then(|reason| text(reason, what).ok())
                    .unwrap_or_else(|| "unreadable meta field".to_owned()),
            ),
            other => unexpected(what, other),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    fn settings(&self) -> &StoreSettings {
        &self.inner.settings
    }

    async fn enqueue(&self, job: NewJob) -> Result<Enqueued> {
        validate_new_job(&job, &self.inner.settings)?;
        let now = self.now();
        let id = JobId::mint(now);
        // Concurrent enqueues of this store go to Redis together, each as called.
        self.inner.enqueuer.enqueue(Prepared { job, id, now }).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>> {
        self.enqueue_jobs(jobs).await
    }

    async fn get(&self, id: JobId) -> Result<Job> {
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

    async fn payload(&self, id: JobId) -> Result<Bytes> {
        let payload: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys().job(id))
            .arg("payload")
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("payload", err))?;
        payload.map(Bytes::from).ok_or(Error::NotFound { id })
    }

    async fn children(&self, parent: JobId) -> Result<Vec<Job>> {
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

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedJob>> {
        validate_claim(&request)?;
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let mut queues: Vec<&str> = Vec::with_capacity(request.queues.len());
        for queue in &request.queues {
            if !queues.contains(&queue.as_str()) {
                queues.push(queue);
            }
        }
        let hint_key = queues.join(",");
        let now = self.now();
        let now_text = now.as_millis().to_string();
        let expires_at = now.saturating_add(request.lease_ttl);
        let expires = expires_at.as_millis().to_string();
        let lease = LeaseWrite {
            worker: &request.worker,
            expires_at,
            now,
        };
        let keys = self.keys();
        let mut candidates = self
            .inner
            .hints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&hint_key)
            .unwrap_or_default();
        let mut claimed: Vec<ClaimedJob> = Vec::new();
        let mut contended = 0;
        let mut promotions = 0usize;
        loop {
            let remaining = request.limit - claimed.len();
            let mut invocation = scripts::CLAIM.prepare_invoke();
            invocation
                .key(&keys.ready)
                .key(&keys.sched)
                .key(&keys.leases)
                .key(&keys.list)
                .key(&keys.running)
                .key(&keys.done)
                .arg(&now_text)
                .arg(&request.worker)
                .arg(&expires)
                .arg(remaining)
                .arg(request.limit + HINT_SLACK)
                .arg(PROMOTE_BOUND)
                .arg(queues.len());
            for queue in &queues {
                invocation.arg(*queue);
            }
            for id in &candidates {
                invocation.key(keys.job(*id)).arg(id_string(*id));
            }
            let mut unreadable = Vec::new();
            let round = match self.invoke(&invocation, "claim").await {
                Ok(reply) => self.claim_round(reply, &lease, &mut claimed, &mut unreadable),
                Err(err) => Err(err),
            };
            if !unreadable.is_empty() {
                self.bury(unreadable, now).await;
            }
            let (got, hint) = match round {
                Ok(Some(round)) => round,
                Ok(None) => {
                    promotions += 1;
                    if promotions > 10_000_000 / PROMOTE_BOUND {
                        return Err(Error::corrupt("scheduled index", "promotion does not end"));
                    }
                    continue;
                }
                // Jobs leased by earlier rounds are handed out rather than stranded until
                // their leases expire; the failure shows again on the next call.
                Err(err) if claimed.is_empty() => return Err(err),
                Err(err) => {
                    tracing::debug!(error = %err, "claim round failed; returning the jobs claimed so far");
                    break;
                }
            };
            if got == 0 {
                contended += 1;
            }
            if claimed.len() >= request.limit
                || hint.is_empty()
                || contended > CLAIM_CONTENDED_ROUNDS
            {
                if !hint.is_empty() {
                    let mut hints = self.inner.hints.lock().unwrap_or_else(|p| p.into_inner());
                    // The cache only saves round trips; keep it small.
                    if hints.len() > 256 {
                        hints.clear();
                    }
                    hints.insert(hint_key, hint);
                }
                break;
            }
            candidates = hint;
        }
        Ok(claimed)
    }

    async fn heartbeat(&self, id: JobId, token: LeaseToken, ttl: Duration) -> Result<Heartbeat> {
        validate_lease_ttl(ttl)?;
        self.heartbeat_many(&[HeldLease::new(id, token)], ttl)
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::corrupt("heartbeat reply", "no status")))
    }

    /// One `heartbeat.lua` call for the whole batch, one clock reading; the script
    /// answers each entry as `heartbeat` would.
    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
    ) -> Result<Vec<Result<Heartbeat>>> {
        validate_lease_ttl(ttl)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.heartbeat_many(&leases, ttl).await
    }

    async fn complete(&self, id: JobId, token: LeaseToken, result: Option<Bytes>) -> Result<()> {
        if let Some(bytes) = &result {
            validate_size("result", bytes.len(), &self.inner.settings)?;
        }
        let now = self.now();
        self.inner.completer.complete(id, token, now, result).await
    }

    /// One `complete.lua` call for the whole batch when it fits one (512 entries, 8 MiB
    /// of results), with one clock reading; the script handles the entries in order, so a
    /// second entry for one job answers lease lost (L5). A larger batch goes through
    /// [`complete_each`], which the grouping of concurrent completes batches anyway.
    async fn complete_batch(&self, completions: Vec<Completion>) -> Result<Vec<Result<()>>> {
        let now = self.now();
        let mut answers: Vec<Option<Result<()>>> = Vec::with_capacity(completions.len());
        let mut entries = Vec::with_capacity(completions.len());
        for completion in &completions {
            let size = completion.result.as_ref().map_or(0, Bytes::len);
            match completion
                .result
                .as_ref()
                .map(|_| validate_size("result", size, &self.inner.settings))
                .transpose()
            {
                // Refused alone, as `complete` would refuse it; the others go on.
                Err(err) => answers.push(Some(Err(err))),
                Ok(_) => {
                    answers.push(None);
                    entries.push(BatchEntry {
                        id: completion.id,
                        token: completion.token,
                        now,
                        result: completion.result.as_deref(),
                    });
                }
            }
        }
        if entries.is_empty() {
            return Ok(answers.into_iter().flatten().collect());
        }
        if !batch::fits_one_call(&entries) {
            drop(entries);
            return Ok(complete_each(self, completions).await);
        }
        let mut outcomes = batch::run_script(self.conn(), self.keys(), &entries)
            .await?
            .into_iter();
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    outcomes.next().unwrap_or_else(|| {
                        Err(Error::corrupt(
                            "complete reply",
                            "one status per job expected",
                        ))
                    })
                })
            })
            .collect())
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
    ) -> Result<JobState> {
        let now = self.now();
        let keys = self.keys();
        let (at, at_hex, due) = match retry {
            Retry::At(at) => (at.as_millis().to_string(), ready_hex(at), at <= now),
            Retry::Never => (String::new(), String::new(), false),
        };
        let mut invocation = scripts::FAIL.prepare_invoke();
        lease_end_keys(&mut invocation, keys, id)
            .arg(id.to_string())
            .arg(token.get())
            .arg(now.as_millis())
            .arg(truncate_error(error))
            .arg(at)
            .arg(at_hex)
            .arg(if due { "1" } else { "0" })
            .arg(&keys.wake);
        let reply = self.invoke(&invocation, "fail").await?;
        match status(&reply, "fail reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "fail reply")?, "fail reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "fail reply")),
        }
    }

    async fn release(&self, id: JobId, token: LeaseToken) -> Result<()> {
        let now = self.now();
        let keys = self.keys();
        let mut invocation = scripts::RELEASE.prepare_invoke();
        lease_end_keys(&mut invocation, keys, id)
            .arg(id.to_string())
            .arg(token.get())
            .arg(now.as_millis())
            .arg(ready_hex(now))
            .arg(&keys.wake);
        let reply = self.invoke(&invocation, "release").await?;
        match status(&reply, "release reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "release reply")),
        }
    }

    async fn reclaim(&self, limit: usize) -> Result<Vec<ReclaimedJob>> {
        Ok(self.reclaim_with_report(limit).await?.0)
    }

    async fn cancel(&self, id: JobId) -> Result<JobState> {
        let now = self.now();
        let keys = self.keys();
        let mut invocation = scripts::CANCEL.prepare_invoke();
        invocation
            .key(keys.job(id))
            .key(&keys.ready)
            .key(&keys.sched)
            .key(&keys.list)
            .key(&keys.done)
            .arg(id.to_string())
            .arg(now.as_millis());
        let reply = self.invoke(&invocation, "cancel").await?;
        match status(&reply, "cancel reply")? {
            (word, [state]) if word == "ok" => {
                parse_state(&text(state, "cancel reply")?, "cancel reply")
            }
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "cancel reply")),
        }
    }

    async fn retry(&self, id: JobId) -> Result<()> {
        let now = self.now();
        let keys = self.keys();
        let mut invocation = scripts::RETRY.prepare_invoke();
        invocation
            .key(keys.job(id))
            .key(&keys.ready)
            .key(&keys.list)
            .key(&keys.done)
            .key(&keys.seq)
            .arg(id.to_string())
            .arg(now.as_millis())
            .arg(ready_hex(now))
            .arg(&keys.wake);
        let reply = self.invoke(&invocation, "retry").await?;
        match status(&reply, "retry reply")? {
            (word, _) if word == "ok" => Ok(()),
            (word, [state]) if word == "state" => Err(Error::InvalidState {
                id,
                state: parse_state(&text(state, "retry reply")?, "retry reply")?,
                operation: "retry",
            }),
            (word, rest) => Err(Self::lease_call_error(id, &word, rest, "retry reply")),
        }
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        validate_queue(queue)?;
        let now = self.now();
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
        for _ in 0..=(10_000_000 / PROMOTE_BOUND) {
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
            });
        }
        Err(Error::corrupt("scheduled index", "promotion does not end"))
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        validate_list(&query)?;
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

    async fn purge(&self, limit: usize) -> Result<u64> {
        let cutoff = self.inner.settings.retention_cutoff(self.now());
        let cutoff_text = cutoff.as_millis().to_string();
        let keys = self.keys();
        let mut deleted = 0u64;
        while (deleted as usize) < limit {
            let batch = (limit - deleted as usize).min(SWEEP_CHUNK);
            let members = self
                .oldest_members(&keys.done, &cutoff_text, batch, "purge read")
                .await?;
            if members.is_empty() {
                break;
            }
            let mut invocation = scripts::PURGE.prepare_invoke();
            invocation
                .key(&keys.done)
                .key(&keys.list)
                .key(&keys.children)
                .arg(&cutoff_text);
            for member in &members {
                // member = "queue code id parent"
                let id = member
                    .split(' ')
                    .nth(2)
                    .ok_or_else(|| {
                        Error::corrupt("finished index", format!("bad entry {member:?}"))
                    })
                    .and_then(|id| job_id(id, "finished index"))?;
                invocation.key(keys.job(id)).arg(member);
            }
            let reply = self.invoke(&invocation, "purge").await?;
            let count = u64::try_from(int(&reply, "purge reply")?).unwrap_or(0);
            deleted += count;
            if members.len() < batch || count == 0 {
                break;
            }
        }
        Ok(deleted)
    }

    async fn wait_for_work(&self, queues: &[String], timeout: Duration) -> Result<()> {
        self.inner.waker.wait(queues, timeout).await;
        Ok(())
    }
}

/// Adds the KEYS shared by the scripts that end a lease and send the job back to
/// `queued` or to a terminal state (`fail.lua`, `release.lua`), in their headers' order.
fn lease_end_keys<'i, 'a>(
    invocation: &'i mut redis::ScriptInvocation<'a>,
    keys: &Keys,
    id: JobId,
) -> &'i mut redis::ScriptInvocation<'a> {
    invocation
        .key(keys.job(id))
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.done)
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.seq)
        .key(&keys.running)
}
