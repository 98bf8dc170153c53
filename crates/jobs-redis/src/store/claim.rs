//! Claiming: the claim loop over `claim.lua`, with its hints and the burial of leased
//! jobs whose record cannot be read.

use jobs_core::{ClaimRequest, ClaimedJob, Error, JobId, Result, Timestamp};
use redis::Value;

use super::{unexpected, RedisStore, PROMOTE_BOUND, PROMOTE_ROUNDS};
use crate::codec::{
    array, decode_claimed, id_string, job_id, job_id_bytes, text, LeaseWrite, Unreadable,
};
use crate::scripts;

/// Claim calls that may find their candidates taken by other claimers before a claim
/// gives up and returns what it has (an empty claim is allowed; the caller claims again).
const CLAIM_CONTENDED_ROUNDS: usize = 64;
/// Extra ids a claim asks for beyond its limit, so the next claim of the same queues
/// usually needs one call.
const HINT_SLACK: usize = 16;

impl RedisStore {
    /// Rules C1–C9 (see [`jobs_core::Backend::claim`]): leases up to `request.limit`
    /// jobs, script call after script call, until the limit is reached, the ready
    /// order runs dry, or other claimers keep taking the candidates.
    pub(super) async fn claim_jobs(
        &self,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
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
            let mut invocation = scripts::CLAIM.prepare_invoke();
            invocation
                .key(&keys.ready)
                .key(&keys.sched)
                .key(&keys.leases)
                .key(&keys.list)
                .key(&keys.running)
                .key(&keys.done)
                .key(&keys.paused)
                .arg(&now_text)
                .arg(&request.worker)
                .arg(&expires)
                .arg(remaining)
                .arg(request.limit + HINT_SLACK)
                .arg(PROMOTE_BOUND)
                .arg(queues.len());
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
}
