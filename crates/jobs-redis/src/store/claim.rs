//! Claiming: the claim loop over `claim.lua`, the fitted claim loop over
//! `claim_fit.lua` (CONTRACT F2–F6), with their hints, and the burial of leased jobs
//! whose record cannot be read.

use std::sync::Arc;

use jobs_core::fit::PlacementCache;
use jobs_core::{ClaimRequest, ClaimedJob, Error, JobId, Result, Timestamp};
use redis::Value;

use super::{unexpected, RedisStore, PROMOTE_BOUND, PROMOTE_ROUNDS};
use crate::codec::{
    array, decode_claimed, id_string, int, job_id, job_id_bytes, text, LeaseWrite, Unreadable,
};
use crate::keys::Keys;
use crate::scripts;

/// Claim calls that may find their candidates taken by other claimers before a claim
/// gives up and returns what it has (an empty claim is allowed; the caller claims again).
const CLAIM_CONTENDED_ROUNDS: usize = 64;
/// Extra ids a claim asks for beyond its limit, so the next claim of the same queues
/// usually needs one call.
const HINT_SLACK: usize = 16;
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

/// A call of `claim.lua` or `claim_fit.lua` with what both begin with: KEYS 1–7 (the
/// indexes and the paused set) and ARGV 1–6 (now, worker, lease expiry, limit, hint
/// size, promotion bound). Each script's own keys and arguments follow.
fn claim_invocation<'s>(
    script: &'s redis::Script,
    keys: &Keys,
    [now, worker, expires]: [&String; 3],
    limit: usize,
    hint_size: usize,
) -> redis::ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation
        .key(&keys.ready)
        .key(&keys.sched)
        .key(&keys.leases)
        .key(&keys.list)
        .key(&keys.running)
        .key(&keys.done)
        .key(&keys.paused)
        .arg(now)
        .arg(worker)
        .arg(expires)
        .arg(limit)
        .arg(hint_size)
        .arg(PROMOTE_BOUND);
    invocation
}

/// What one `claim_fit.lua` call answered besides its jobs.
struct FitRound {
    /// Jobs it leased.
    got: usize,
    /// Ids whose hashes the next call needs (see the script's header).
    hint: Vec<JobId>,
    /// Whether its selection was not wholly leased: call again with the hint.
    more: bool,
    /// Where its walk stopped at the scan bound, if it did.
    stop: Option<String>,
}

impl RedisStore {
    /// Rules C1–C9 (see [`jobs_core::Backend::claim`]): leases up to `request.limit`
    /// jobs, script call after script call, until the limit is reached, the ready
    /// order runs dry, or other claimers keep taking the candidates. A fitted claim
    /// (F2–F6) goes to [`Self::claim_fitted`]; this path never judges a placement.
    pub(super) async fn claim_jobs(
        &self,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        if request.is_fitted() {
            return self.claim_fitted(request, now).await;
        }
        // The handle refused a queue named twice, so the names go to the script as they are.
        let queues = &request.queues;
        let hint_key = queues.join(",");
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
            let mut invocation = claim_invocation(
                &scripts::CLAIM,
                keys,
                [&now_text, &request.worker, &expires],
                remaining,
                request.limit + HINT_SLACK,
            );
            invocation.arg(queues.len());
            for queue in queues {
                invocation.arg(queue);
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
                    if promotions > PROMOTE_ROUNDS {
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

    /// Rules F2–F6 with C1–C9: a claim with a budget, preferred localities or a
    /// reservation, over `claim_fit.lua`. Each call selects anew among the ready jobs
    /// and leases the selected jobs whose hashes it was given, in order; the ones it was
    /// not given come back as the hint, and the next call passes them. A call that
    /// reached [`FIT_SCAN_BOUND`] names where it stopped, and a claim still short of
    /// its limit goes on from there, [`FIT_SCAN_CALLS`] times at most.
    async fn claim_fitted(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        let queues = &request.queues;
        // Kept apart from the plain claim's hints, which name the head of the queues:
        // these name the jobs behind the last fitted selection.
        let hint_key = format!("fit {}", queues.join(","));
        // Claimers of one store take turns per queue set. Every call on the server runs
        // one at a time anyway; concurrent fitted calls from one process all select the
        // same head, only the first can lease it, and the rest cost a call each for
        // nothing (at 32 claimers, nine in ten). In turn, each call finds the hint its
        // predecessor left and leases what it selects. Claims of other processes still
        // race as before, and the script still decides every claim alone.
        let gate = {
            let mut gates = self
                .inner
                .fit_gates
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if gates.len() > 256 {
                gates.retain(|_, gate| Arc::strong_count(gate) > 1);
            }
            Arc::clone(gates.entry(hint_key.clone()).or_default())
        };
        let _turn = gate.lock().await;
        let now_text = now.as_millis().to_string();
        let expires_at = now.saturating_add(request.lease_ttl);
        let expires = expires_at.as_millis().to_string();
        let lease = LeaseWrite {
            worker: &request.worker,
            expires_at,
            now,
        };
        let budget = request
            .budget
            .as_ref()
            .map(jobs_core::Budget::to_json)
            .unwrap_or_default();
        let reserved = request.reserved.map(id_string).unwrap_or_default();
        let keys = self.keys();
        let mut candidates = match request.reserved {
            Some(id) => vec![id],
            None => self
                .inner
                .hints
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&hint_key)
                .unwrap_or_default(),
        };
        let mut claimed: Vec<ClaimedJob> = Vec::new();
        let mut start = String::new();
        let mut contended = 0;
        let mut promotions = 0usize;
        let mut scans = 0;
        let hint = loop {
            let remaining = request.limit - claimed.len();
            let mut invocation = claim_invocation(
                &scripts::CLAIM_FIT,
                keys,
                [&now_text, &request.worker, &expires],
                remaining,
                remaining + HINT_SLACK,
            );
            invocation
                .key(&keys.placement)
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
            for id in &candidates {
                invocation.key(keys.job(*id)).arg(id_string(*id));
            }
            let mut unreadable = Vec::new();
            let round = match self.invoke(&invocation, "claim").await {
                Ok(reply) => self.fit_round(reply, &lease, &mut claimed, &mut unreadable),
                Err(err) => Err(err),
            };
            if !unreadable.is_empty() {
                self.bury(unreadable, now).await;
            }
            let round = match round {
                Ok(Some(round)) => round,
                Ok(None) => {
                    promotions += 1;
                    if promotions > PROMOTE_ROUNDS {
                        return Err(Error::corrupt("scheduled index", "promotion does not end"));
                    }
                    continue;
                }
                // As in the plain claim: jobs leased by earlier rounds are handed out.
                Err(err) if claimed.is_empty() => return Err(err),
                Err(err) => {
                    tracing::debug!(error = %err, "claim round failed; returning the jobs claimed so far");
                    return Ok(claimed);
                }
            };
            if claimed.len() >= request.limit {
                break round.hint;
            }
            if round.more {
                if round.got == 0 {
                    contended += 1;
                    if contended > CLAIM_CONTENDED_ROUNDS {
                        break round.hint;
                    }
                }
                candidates = round.hint;
            } else if let Some(stop) = round.stop.filter(|_| scans < FIT_SCAN_CALLS) {
                scans += 1;
                start = stop;
                candidates = round.hint;
            } else {
                break round.hint;
            }
            if let Some(id) = request.reserved {
                // A reservation's call always holds its one job.
                candidates = vec![id];
            }
        };
        if !hint.is_empty() && request.reserved.is_none() {
            let mut hints = self.inner.hints.lock().unwrap_or_else(|p| p.into_inner());
            // The cache only saves round trips; keep it small.
            if hints.len() > 256 {
                hints.clear();
            }
            hints.insert(hint_key, hint);
        }
        Ok(claimed)
    }

    /// Reads one `claim_fit.lua` reply: `None` when the script only promoted due jobs.
    /// The leased jobs are appended to `claimed` or `unreadable` as in [`Self::claim_round`].
    fn fit_round(
        &self,
        reply: Value,
        lease: &LeaseWrite<'_>,
        claimed: &mut Vec<ClaimedJob>,
        unreadable: &mut Vec<Unreadable>,
    ) -> Result<Option<FitRound>> {
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
        let Ok::<[Value; 6], _>([_, jobs, hint, corrupt, more, stop]) = items.try_into() else {
            return Err(unexpected("claim reply", &word));
        };
        if word != "ok" {
            return Err(unexpected("claim reply", &word));
        }
        let (got, hint) = self.take_round(jobs, &hint, &corrupt, lease, claimed, unreadable)?;
        let stop = text(&stop, "claim reply")?;
        Ok(Some(FitRound {
            got,
            hint,
            more: int(&more, "claim reply")? == 1,
            stop: Some(stop).filter(|stop| !stop.is_empty()),
        }))
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
        self.take_round(
            jobs_value,
            &hint_value,
            &corrupt_value,
            lease,
            claimed,
            unreadable,
        )
        .map(Some)
    }

    /// The part of a claim reply both scripts share: the leased jobs (those that can be
    /// read appended to `claimed`, the others to `unreadable`), the ids buried as
    /// corrupt, and the hint. Returns how many jobs the call leased, and the hint.
    fn take_round(
        &self,
        jobs_value: Value,
        hint_value: &Value,
        corrupt_value: &Value,
        lease: &LeaseWrite<'_>,
        claimed: &mut Vec<ClaimedJob>,
        unreadable: &mut Vec<Unreadable>,
    ) -> Result<(usize, Vec<JobId>)> {
        let Value::Array(jobs) = jobs_value else {
            return Err(Error::corrupt("claim reply", "expected an array of jobs"));
        };
        let got = jobs.len();
        let mut placements = PlacementCache::new();
        for job in jobs {
            // A leased job whose record cannot be read is not handed out, and failing the
            // whole claim would strand its batch mates until their leases expire: it is
            // buried (moved to dead) after this round.
            match decode_claimed(job, lease, &mut placements) {
                Ok(job) => claimed.push(job),
                Err(Ok(bad)) => unreadable.push(bad),
                Err(Err(err)) => return Err(err),
            }
        }
        for id in array(corrupt_value, "claim reply")? {
            tracing::warn!(
                namespace = %self.inner.settings.namespace,
                id = %text(id, "claim reply")?,
                "a ready job's record is unreadable; the claim moved it to dead"
            );
        }
        let hint = array(hint_value, "claim reply")?
            .iter()
            .map(|id| match id {
                Value::BulkString(bytes) => job_id_bytes(bytes, "ready index"),
                other => job_id(&text(other, "claim reply")?, "ready index"),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((got, hint))
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
}
