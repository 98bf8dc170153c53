//! Claiming: the claim loop over `claim.lua`, the fitted claim loop over
//! `claim_fit.lua` (CONTRACT F2–F6), each call holding the slice of the predicted head
//! that [`super::heads`] hands it, and the burial of leased jobs whose record cannot be
//! read.

use std::pin::pin;
use std::task::Poll;

use durq_core::fit::PlacementCache;
use durq_core::{ClaimRequest, ClaimedJob, Error, JobId, Result, Timestamp};
use redis::Value;

use super::heads::Call;
use super::{unexpected, RedisBackend, PROMOTE_BOUND, PROMOTE_ROUNDS};
use crate::codec::{
    array, decode_claimed, id_string, int, job_id, job_id_bytes, member_id, text, LeaseWrite,
    Unreadable, CLAIMED_FIELDS,
};
use crate::keys::Keys;
use crate::scripts::{self, Eval};
use crate::store::graph::Dependents;

/// Claim calls that may find their candidates taken by other claimers before a claim
/// gives up and returns what it has (an empty claim is allowed; the caller claims again).
const CLAIM_CONTENDED_ROUNDS: usize = 64;
/// The most ready entries one `claim_fit.lua` call examines. Without a bound, a fitted
/// claim over queues whose head holds jobs its budget does not admit (or, with preferred
/// localities, a long priority band holding none of them) would read the whole queue in
/// one script and block the server meanwhile. Each entry costs about 1–2 µs of server
/// time (its ready member, its placement, its verdict), so 2,000 entries hold the server
/// for a few milliseconds. A call that reaches the bound takes what it selected so far
/// and names where it stopped.
const FIT_SCAN_BOUND: usize = 2_000;
/// Further calls a fitted claim makes past [`FIT_SCAN_BOUND`], each starting where the
/// last stopped, while it has fewer jobs than its limit: jobs that fit behind up to
/// `(1 + FIT_SCAN_CALLS) × FIT_SCAN_BOUND` (10,000) entries that do not are still found,
/// and one claim never examines more than that.
const FIT_SCAN_CALLS: usize = 4;

/// A call of `claim.lua`, `claim_fit.lua` or `claim_limited.lua` with what they begin
/// with: KEYS 1–12 (the indexes, the paused set, the concurrency key indexes `ckeys`,
/// `kready`, `kleases`, the queue limits, and the event stream, CONTRACT V1) and ARGV 1–6 (now, worker, lease expiry,
/// limit, hint size, promotion bound). Each script's own keys and arguments follow.
fn claim_invocation(
    script: &'static redis::Script,
    keys: &Keys,
    [now, worker, expires]: [&String; 3],
    limit: usize,
    hint_size: usize,
) -> Eval {
    let mut invocation = Eval::new(script);
    invocation
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.running)
        .key(&keys.finished)
        .key(&keys.paused)
        .key(&keys.ckeys)
        .key(&keys.kready)
        .key(&keys.kleases)
        .key(&keys.limits)
        .key(&keys.events)
        .arg(now)
        .arg(worker)
        .arg(expires)
        .arg(limit)
        .arg(hint_size)
        .arg(PROMOTE_BOUND);
    invocation
}

/// What one claim call did, once its jobs were handed to the claim.
struct Round {
    /// Jobs it leased.
    got: usize,
    /// The ids whose hashes the next call needs (see the scripts' headers).
    hint: Vec<JobId>,
    /// `claim_fit.lua` only: the selection was not wholly leased; call again.
    more: bool,
    /// `claim_fit.lua` only: where its walk stopped at the scan bound, if it did.
    stop: Option<String>,
    /// The script refused the claim, writing nothing: one of its queues has limits
    /// (`claim_limited.lua` claims them, see [`super::flow`]).
    refused: bool,
    /// `claim_limited.lua` only: how many of the named queues have limits.
    limited: Option<u64>,
}

/// What a claim script answered, read as far as the next call needs: the leased jobs
/// are still to be decoded.
struct Answer {
    jobs: Value,
    corrupt: Value,
    /// The ids whose hashes the next call needs (see the scripts' headers), or why
    /// they cannot be read; the jobs the call leased are handed out either way.
    hint: Result<Vec<JobId>>,
    /// `claim_fit.lua` only: the selection was not wholly leased; call again.
    more: bool,
    /// `claim_fit.lua` only: where its walk stopped at the scan bound, if it did.
    stop: Option<String>,
    /// The script answered `limited`: see [`Round::refused`].
    refused: bool,
    /// `claim_limited.lua` only: see [`Round::limited`].
    limited: Option<u64>,
}

impl RedisBackend {
    /// Rules C1–C9 (see [`durq_core::Backend::claim`]): leases up to `request.limit`
    /// jobs, script call after script call, until the limit is reached, the ready
    /// order runs dry, or other claimers keep taking the candidates. A fitted claim
    /// (F2–F6) goes to [`Self::claim_fitted`]; this path never judges a placement.
    pub(crate) async fn claim_jobs(
        &self,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        if request.is_fitted() {
            return self.claim_fitted(request, now).await;
        }
        // The handle refused a queue named twice, so the names go to the script as they are.
        let queues = &request.queues;
        // A queue with limits is claimed by `claim_limited.lua` (super::flow), in the same
        // loop: its selection is the ready order less what the limits hold back (a fair
        // queue's, turn order), so the head's slices serve it as they serve claim.lua.
        let mut limited = self.names_limited_queue(queues);
        let claimer = self.inner.heads.claimer(queues.join(","));
        let (lease, [now_text, expires]) = lease_of(&request, now);
        let keys = self.keys();
        let mut claimed: Vec<ClaimedJob> = Vec::new();
        let mut contended = 0;
        let mut promotions = 0usize;
        loop {
            let remaining = request.limit - claimed.len();
            let call = claimer.next_call(remaining).await;
            let script = if limited {
                &scripts::CLAIM_LIMITED
            } else {
                &scripts::CLAIM
            };
            let mut invocation = claim_invocation(
                script,
                keys,
                [&now_text, &request.worker, &expires],
                remaining,
                claimer.hint_size(remaining),
            );
            if limited {
                invocation.key(&keys.flow);
            }
            invocation.arg(queues.len());
            for queue in queues {
                invocation.arg(queue);
            }
            hold(&mut invocation, keys, call.held());
            let round = self
                .round(&invocation, Some(call), false, &lease, &mut claimed, now)
                .await;
            let Round {
                got,
                hint,
                refused,
                limited: with_limits,
                ..
            } = match next_step(round, &claimed, &mut promotions)? {
                Step::Go(round) => round,
                Step::Again => continue,
                Step::Stop => break,
            };
            if refused {
                // One of the queues has limits (set since this handle last looked).
                self.found_limits(queues);
                limited = true;
                continue;
            }
            if with_limits == Some(0) {
                // Their limits are gone: the next claim is a plain one again.
                self.forget_limits(queues);
            }
            if got == 0 {
                contended += 1;
            }
            if claimed.len() >= request.limit
                || hint.is_empty()
                || contended > CLAIM_CONTENDED_ROUNDS
            {
                break;
            }
        }
        Ok(claimed)
    }

    /// Whether a claim of `queues` at `now` may find a job here: a ready entry of one
    /// of the queues, or a scheduled entry of any queue due (which the claim would
    /// promote first). Plain reads in one pipeline, no script: what a partitioned
    /// store asks of partitions nothing points it to before it runs a claim script
    /// there. A paused queue's entries count; the claim then finds nothing.
    pub(crate) async fn may_hold_ready(&self, queues: &[String], now: Timestamp) -> Result<bool> {
        let keys = self.keys();
        let mut pipe = redis::pipe();
        for queue in queues {
            pipe.cmd("ZRANGEBYLEX")
                .arg(&keys.ready)
                .arg(format!("[{queue} "))
                .arg(format!("({queue}!"))
                .arg("LIMIT")
                .arg(0)
                .arg(1);
        }
        pipe.cmd("ZRANGEBYSCORE")
            .arg(&keys.sched)
            .arg("-inf")
            .arg(now.as_millis())
            .arg("LIMIT")
            .arg(0)
            .arg(1);
        let found: Vec<Vec<Value>> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|err| crate::conn::map_err("claim look-ahead", err))?;
        Ok(found.iter().any(|entries| !entries.is_empty()))
    }

    /// Rules F2–F6 with C1–C9: a claim with a budget, preferred localities or a
    /// reservation, over `claim_fit.lua`. Each call selects anew among the ready jobs
    /// and leases the selected jobs whose hashes it was given, in order; the ones it was
    /// not given come back in the hint, which the next call's slice is taken from. A
    /// call that reached [`FIT_SCAN_BOUND`] names where it stopped, and a claim still
    /// short of its limit goes on from there, [`FIT_SCAN_CALLS`] times at most. A
    /// reservation holds its one job and no slice.
    async fn claim_fitted(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        let queues = &request.queues;
        // Kept apart from the plain claim's head, which is the ready order: this one is
        // the order of the fitted selection.
        let claimer = match request.reserved {
            Some(_) => None,
            None => Some(
                self.inner
                    .heads
                    .claimer(format!("fit {}", queues.join(","))),
            ),
        };
        let (lease, [now_text, expires]) = lease_of(&request, now);
        let budget = request
            .budget
            .as_ref()
            .map(durq_core::Budget::to_json)
            .unwrap_or_default();
        let reserved = request.reserved.map(id_string).unwrap_or_default();
        let keys = self.keys();
        let mut claimed: Vec<ClaimedJob> = Vec::new();
        let mut start = String::new();
        let mut contended = 0;
        let mut promotions = 0usize;
        let mut scans = 0;
        loop {
            let remaining = request.limit - claimed.len();
            let call = match &claimer {
                Some(claimer) => Some(claimer.next_call(remaining).await),
                None => None,
            };
            let hint_size = claimer
                .as_ref()
                .map_or(remaining, |claimer| claimer.hint_size(remaining));
            let mut invocation = claim_invocation(
                &scripts::CLAIM_FIT,
                keys,
                [&now_text, &request.worker, &expires],
                remaining,
                hint_size,
            );
            invocation
                .key(&keys.placement)
                .key(&keys.flow)
                .arg(FIT_SCAN_BOUND)
                .arg(&budget)
                .arg(&reserved)
                .arg(&start)
                .arg(queues.len());
            for queue in queues {
                invocation.arg(queue);
            }
            invocation.arg(request.prefer.len());
            for locality in &request.prefer {
                invocation.arg(locality);
            }
            let held = match &call {
                Some(call) => call.held(),
                None => request.reserved.as_slice(),
            };
            hold(&mut invocation, keys, held);
            let round = self
                .round(&invocation, call, true, &lease, &mut claimed, now)
                .await;
            let round = match next_step(round, &claimed, &mut promotions)? {
                Step::Go(round) => round,
                Step::Again => continue,
                Step::Stop => break,
            };
            if claimed.len() >= request.limit {
                break;
            }
            if round.more {
                if round.got == 0 {
                    contended += 1;
                    if contended > CLAIM_CONTENDED_ROUNDS {
                        break;
                    }
                }
            } else if let Some(stop) = round.stop.filter(|_| scans < FIT_SCAN_CALLS) {
                scans += 1;
                start = stop;
            } else {
                break;
            }
        }
        Ok(claimed)
    }

    /// One claim script call (`fitted`: `claim_fit.lua`): sent holding `call`'s slice,
    /// its answer handed to the head before its jobs are decoded (a claimer waiting for
    /// it goes on at once), its jobs appended to `claimed`. With no `call` (a
    /// reservation) it is sent as prepared. `None` when the script only promoted due
    /// jobs.
    async fn round(
        &self,
        invocation: &Eval,
        call: Option<Call>,
        fitted: bool,
        lease: &LeaseWrite<'_>,
        claimed: &mut Vec<ClaimedJob>,
        now: Timestamp,
    ) -> Result<Option<Round>> {
        let reply = match call {
            Some(mut call) => {
                let reply = self.send(invocation, &mut call).await;
                let answer = reply.and_then(|reply| read_answer(reply, fitted))?;
                if let Some(answer) = &answer {
                    call.answered(answer.hint.as_deref().unwrap_or_default());
                }
                answer
            }
            None => read_answer(self.eval(invocation, "claim").await?, fitted)?,
        };
        let Some(answer) = reply else {
            return Ok(None);
        };
        let got = self
            .take_jobs(answer.jobs, &answer.corrupt, lease, claimed, now)
            .await?;
        Ok(Some(Round {
            got,
            hint: answer.hint?,
            more: answer.more,
            stop: answer.stop,
            refused: answer.refused,
            limited: answer.limited,
        }))
    }

    /// Runs one claim call holding `call`'s slice. The call is put on the connection
    /// before the turn is given up (a multiplexed connection sends in the order calls
    /// are first polled), so the next claimer's call reaches the server behind it.
    async fn send(&self, invocation: &Eval, call: &mut Call) -> Result<Value> {
        let mut reply = pin!(self.eval(invocation, "claim"));
        let first = futures::poll!(reply.as_mut());
        call.sent();
        match first {
            Poll::Ready(reply) => reply,
            Poll::Pending => reply.await,
        }
    }

    /// Decodes the jobs a claim call leased: those that can be read are appended to
    /// `claimed`; the others are buried (moved to dead). Returns how many it leased.
    async fn take_jobs(
        &self,
        jobs: Value,
        corrupt: &Value,
        lease: &LeaseWrite<'_>,
        claimed: &mut Vec<ClaimedJob>,
        now: Timestamp,
    ) -> Result<usize> {
        let Value::Array(jobs) = jobs else {
            return Err(Error::corrupt("claim reply", "expected an array of jobs"));
        };
        let jobs = claimed_rows(jobs)?;
        let got = jobs.len();
        let mut placements = PlacementCache::new();
        let mut unreadable = Vec::new();
        let mut failed = None;
        for job in jobs {
            // A leased job whose record cannot be read is not handed out, and failing the
            // whole claim would strand its batch mates until their leases expire: it is
            // buried (moved to dead) after this round.
            match decode_claimed(job, lease, &mut placements) {
                Ok(job) => claimed.push(job),
                Err(Ok(bad)) => unreadable.push(bad),
                Err(Err(err)) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        if !unreadable.is_empty() {
            self.bury(unreadable, now).await;
        }
        if let Some(err) = failed {
            return Err(err);
        }
        let mut buried = Vec::new();
        for id in array(corrupt, "claim reply")? {
            let id = text(id, "claim reply")?;
            tracing::warn!(
                namespace = %self.inner.settings.namespace,
                id = %id,
                "a ready job's record is unreadable; the claim moved it to dead"
            );
            buried.push(job_id(&id, "claim reply")?);
        }
        if !buried.is_empty() {
            self.settle_buried(&buried, now).await;
        }
        Ok(got)
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
            // A reply other than `need` is the bury's own: a lease lost meanwhile means
            // another call took the job, and nothing is left to do either way.
            let buried = Dependents::default()
                .send_settling(&self.conn(), keys, now, "bury", || {
                    let mut invocation = scripts::BURY.prepare_invoke();
                    invocation
                        .key(keys.job(bad.id))
                        .key(&keys.leases)
                        .key(&keys.list)
                        .key(&keys.finished)
                        .key(&keys.running)
                        .key(&keys.kleases)
                        .arg(id_string(bad.id))
                        .arg(token.get())
                        .arg(now.as_millis())
                        .arg(bad.error.to_string());
                    invocation
                })
                .await;
            if let Err(err) = buried {
                tracing::warn!(id = %bad.id, error = %err, "could not bury an unreadable job");
            }
        }
    }

    /// Settles the jobs waiting for jobs a claim script buried (CONTRACT G3): the hot
    /// claim scripts take no graph tail, so `settle.lua` follows them. Best effort, as
    /// [`Self::bury`]: a waiting job this misses stays waiting, its dependency shown
    /// dead, until an operator cancels it (docs/redis.md).
    async fn settle_buried(&self, ids: &[JobId], now: Timestamp) {
        let keys = self.keys();
        let settled = Dependents::default()
            .send_settling(&self.conn(), keys, now, "settle", || {
                let mut invocation = scripts::SETTLE.prepare_invoke();
                for id in ids {
                    invocation.key(keys.job(*id));
                }
                for id in ids {
                    invocation.arg(id_string(*id));
                }
                invocation
            })
            .await;
        if let Err(err) = settled {
            tracing::warn!(error = %err, "could not settle the jobs waiting for buried jobs");
        }
    }
}

/// What the lease of each job a claim leases is (Rust fills it in; the script does
/// not return it), and the clock reading and lease expiry its calls pass, as text.
fn lease_of(request: &ClaimRequest, now: Timestamp) -> (LeaseWrite<'_>, [String; 2]) {
    let expires_at = now.saturating_add(request.lease_ttl);
    let texts = [
        now.as_millis().to_string(),
        expires_at.as_millis().to_string(),
    ];
    let lease = LeaseWrite {
        worker: &request.worker,
        expires_at,
        now,
    };
    (lease, texts)
}

/// What a claim loop does after a call.
enum Step {
    /// Goes on with what the call did.
    Go(Round),
    /// Calls again: the script only promoted due jobs.
    Again,
    /// Hands out what it has: the call failed after earlier calls leased jobs.
    Stop,
}

/// The step after a call, shared by both claim loops. Jobs leased by earlier calls are
/// handed out rather than stranded until their leases expire; the failure shows again
/// on the next claim. A promotion that does not end is a corrupt scheduled index.
fn next_step(
    round: Result<Option<Round>>,
    claimed: &[ClaimedJob],
    promotions: &mut usize,
) -> Result<Step> {
    match round {
        Ok(Some(round)) => Ok(Step::Go(round)),
        Ok(None) => {
            *promotions += 1;
            if *promotions > PROMOTE_ROUNDS {
                return Err(Error::corrupt("scheduled index", "promotion does not end"));
            }
            Ok(Step::Again)
        }
        Err(err) if claimed.is_empty() => Err(err),
        Err(err) => {
            tracing::debug!(error = %err, "claim round failed; returning the jobs claimed so far");
            Ok(Step::Stop)
        }
    }
}

/// The rows of a claim reply's jobs: `claim.lua` answers one flat array of
/// [`CLAIMED_FIELDS`] (11) values per job (a table per row costs the server more than
/// its values), `claim_fit.lua` an array per job.
fn claimed_rows(jobs: Vec<Value>) -> Result<Vec<[Value; CLAIMED_FIELDS]>> {
    let malformed = || Error::corrupt("claim reply", "wrong number of fields");
    if matches!(jobs.first(), Some(Value::Array(_))) {
        return jobs
            .into_iter()
            .map(|row| match row {
                Value::Array(items) => items.try_into().map_err(|_| malformed()),
                _ => Err(malformed()),
            })
            .collect();
    }
    if jobs.len() % CLAIMED_FIELDS != 0 {
        return Err(malformed());
    }
    let mut rows = Vec::with_capacity(jobs.len() / CLAIMED_FIELDS);
    let mut values = jobs.into_iter();
    loop {
        let row: Vec<Value> = values.by_ref().take(CLAIMED_FIELDS).collect();
        if row.is_empty() {
            break;
        }
        rows.push(row.try_into().map_err(|_| malformed())?);
    }
    Ok(rows)
}

/// Passes the hashes of `ids` (KEYS) with their ids (ARGV), after every other argument.
fn hold(invocation: &mut Eval, keys: &Keys, ids: &[JobId]) {
    for id in ids {
        invocation.job_key(keys, *id).id_arg(*id);
    }
}

/// Reads a claim script's reply up to its jobs: `None` when the script only promoted
/// due jobs. `fitted` for `claim_fit.lua`'s reply, which adds `more` and `stop`.
fn read_answer(reply: Value, fitted: bool) -> Result<Option<Answer>> {
    let Value::Array(items) = reply else {
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
    if word == "limited" {
        return Ok(Some(Answer {
            jobs: Value::Array(Vec::new()),
            corrupt: Value::Array(Vec::new()),
            hint: Ok(Vec::new()),
            more: false,
            stop: None,
            refused: true,
            limited: None,
        }));
    }
    if word != "ok" {
        return Err(unexpected("claim reply", &word));
    }
    let mut items = items.into_iter().skip(1);
    let (Some(jobs), Some(hint), Some(corrupt)) = (items.next(), items.next(), items.next()) else {
        return Err(unexpected("claim reply", &word));
    };
    let (more, stop) = if fitted {
        let (Some(more), Some(stop)) = (items.next(), items.next()) else {
            return Err(unexpected("claim reply", &word));
        };
        let stop = text(&stop, "claim reply")?;
        (
            int(&more, "claim reply")? == 1,
            Some(stop).filter(|stop| !stop.is_empty()),
        )
    } else {
        (false, None)
    };
    // `claim_limited.lua` adds how many of the named queues have limits.
    let limited = match items.next() {
        Some(count) if !fitted => Some(u64::try_from(int(&count, "claim reply")?).unwrap_or(0)),
        Some(_) => return Err(unexpected("claim reply", &word)),
        None => None,
    };
    if items.next().is_some() {
        return Err(unexpected("claim reply", &word));
    }
    // `claim.lua` names the head by its ready index members, `claim_fit.lua` by ids:
    // either ends with the id.
    let hint = array(&hint, "claim reply").and_then(|entries| {
        entries
            .iter()
            .map(|entry| match entry {
                Value::BulkString(bytes) => {
                    job_id_bytes(&bytes[bytes.len().saturating_sub(36)..], "ready index")
                }
                other => member_id(&text(other, "claim reply")?, "ready index"),
            })
            .collect::<Result<Vec<_>>>()
    });
    Ok(Some(Answer {
        jobs,
        corrupt,
        hint,
        more,
        stop,
        refused: false,
        limited,
    }))
}
