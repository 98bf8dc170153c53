//! Lease (L1–L9): the calls a claim's holder makes. Each acts on a claim handed out
//! earlier, with its own token or one beside it (a stale or a forged one), so lost
//! leases are exercised as often as held ones.

use std::time::Duration;

use durq_core::{Completion, LeaseToken, Retry, Timestamp};

use super::agree;
use crate::model_check::case::{Claim, Run};
use crate::model_check::ops::{Pick, Tok};

/// The note of a step that skipped: no claim has been handed out yet.
const NO_CLAIMS: &str = "skipped: no claims yet";

impl Run {
    /// `heartbeat`: the cancellation flag and the new expiry must be the model's.
    pub(super) async fn heartbeat(
        &mut self,
        claim: Pick,
        token: Tok,
        ttl_ms: u64,
    ) -> Result<String, String> {
        let Some(c) = self.pick_claim(claim, token) else {
            return Ok(NO_CLAIMS.to_owned());
        };
        let ttl = Duration::from_millis(ttl_ms);
        let id = self.ids[c.job];
        let want = self.model.heartbeat(c.job, c.token, ttl);
        let got = self
            .store
            .heartbeat(id, LeaseToken::new(c.token), ttl)
            .await;
        agree("heartbeat", id, want, got, |w, g| {
            w.0 == g.cancel_requested && w.1 == g.expires_at
        })
        .map(|note| on_claim(c, note))
    }

    /// `complete`, with a result or without.
    pub(super) async fn complete(
        &mut self,
        claim: Pick,
        token: Tok,
        with_result: bool,
        step: usize,
    ) -> Result<String, String> {
        let Some(c) = self.pick_claim(claim, token) else {
            return Ok(NO_CLAIMS.to_owned());
        };
        let result = with_result.then(|| format!("result of step {step}").into_bytes());
        let id = self.ids[c.job];
        let want = self.model.complete(c.job, c.token, result.clone());
        let got = self
            .store
            .complete(id, LeaseToken::new(c.token), result.map(Into::into))
            .await;
        agree("complete", id, want, got, |_, _| true).map(|note| on_claim(c, note))
    }

    /// `complete_batch`: each entry answered as `complete` would, in order (decided
    /// under L5), so each is checked against the model's `complete` in turn. Entries
    /// naming no claim are left out of the batch.
    pub(super) async fn complete_batch(
        &mut self,
        entries: &[(Pick, Tok, bool)],
        step: usize,
    ) -> Result<String, String> {
        let mut picked = Vec::new();
        for (n, (claim, token, result)) in entries.iter().enumerate() {
            if let Some(c) = self.pick_claim(*claim, *token) {
                let result = result.then(|| format!("result {n} of step {step}"));
                picked.push((c, result.map(String::into_bytes)));
            }
        }
        if picked.is_empty() {
            return Ok(NO_CLAIMS.to_owned());
        }
        let completions = picked
            .iter()
            .map(|(c, result)| {
                Completion::new(
                    self.ids[c.job],
                    LeaseToken::new(c.token),
                    result.clone().map(Into::into),
                )
            })
            .collect();
        let answers = match self.store.complete_batch(completions).await {
            Ok(answers) => answers,
            Err(err) => return Err(format!("complete_batch failed as a whole: {err}")),
        };
        if answers.len() != picked.len() {
            return Err(format!(
                "complete_batch answered {} of {} entries",
                answers.len(),
                picked.len()
            ));
        }
        let mut notes = Vec::new();
        for ((c, result), got) in picked.into_iter().zip(answers) {
            let id = self.ids[c.job];
            let want = self.model.complete(c.job, c.token, result);
            let note = agree("complete_batch entry", id, want, got, |_, _| true)?;
            notes.push(on_claim(c, note));
        }
        Ok(notes.join("; "))
    }

    /// `fail`, never to be retried or retried `retry_in` ms from now (a negative
    /// offset is a retry time in the past); the state it leads to must be the model's.
    pub(super) async fn fail(
        &mut self,
        claim: Pick,
        token: Tok,
        retry_in: Option<i64>,
        step: usize,
    ) -> Result<String, String> {
        let Some(c) = self.pick_claim(claim, token) else {
            return Ok(NO_CLAIMS.to_owned());
        };
        let retry = match retry_in {
            None => Retry::Never,
            Some(ms) => Retry::At(Timestamp::from_millis(self.model.now.as_millis() + ms)),
        };
        let message = format!("failure at step {step}");
        let id = self.ids[c.job];
        let want = self.model.fail(c.job, c.token, &message, retry);
        let got = self
            .store
            .fail(id, LeaseToken::new(c.token), &message, retry)
            .await;
        agree("fail", id, want, got, |w, g| w == g).map(|note| on_claim(c, note))
    }

    /// `release`.
    pub(super) async fn release(&mut self, claim: Pick, token: Tok) -> Result<String, String> {
        let Some(c) = self.pick_claim(claim, token) else {
            return Ok(NO_CLAIMS.to_owned());
        };
        let id = self.ids[c.job];
        let want = self.model.release(c.job, c.token);
        let got = self.store.release(id, LeaseToken::new(c.token)).await;
        agree("release", id, want, got, |_, _| true).map(|note| on_claim(c, note))
    }
}

/// A step's note, saying which claim (job and token) the call carried.
fn on_claim(c: Claim, note: String) -> String {
    format!("#{} token {}: {note}", c.job, c.token)
}
