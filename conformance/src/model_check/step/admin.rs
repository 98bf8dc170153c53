//! Operator actions that change jobs: cancel (A1), retry (A2) and purge (A5).

use durq_core::JobState;

use super::agree;
use crate::model_check::case::Run;
use crate::model_check::model::ModelJob;
use crate::model_check::ops::Pick;

impl Run {
    /// `cancel`: the state it returns must be the model's.
    pub(super) async fn cancel(&mut self, job: Pick) -> Result<String, String> {
        // Narrow: a running job if any (the interesting case), else a queued one.
        let running = self.job_where(job.n, |j| j.present && j.state == JobState::Running);
        let Some(idx) = running
            .filter(|_| !job.wide)
            .or_else(|| self.pick_job(job, |j| j.present && !j.state.is_terminal()))
        else {
            return Ok("skipped: no jobs yet".to_owned());
        };
        let id = self.ids[idx];
        let want = self.model.cancel(idx);
        let got = self.store.cancel(id).await;
        agree("cancel", id, want, got, |w, g| w == g).map(|note| format!("#{idx}: {note}"))
    }

    /// `retry`, narrowed to a dead or cancelled job (the ones it accepts).
    pub(super) async fn retry(&mut self, job: Pick) -> Result<String, String> {
        let retryable =
            |j: &ModelJob| j.present && matches!(j.state, JobState::Dead | JobState::Cancelled);
        let Some(idx) = self.pick_job(job, retryable) else {
            return Ok("skipped: no jobs yet".to_owned());
        };
        let id = self.ids[idx];
        let want = self.model.retry(idx);
        let got = self.store.retry(id).await;
        agree("retry", id, want, got, |_, _| true).map(|note| format!("#{idx}: {note}"))
    }

    /// `purge`: which of the purgeable jobs a limited call deletes is the store's
    /// choice, so the deleted ones are found by asking `get` for each purgeable job;
    /// the model checks the count and adopts the choice.
    pub(super) async fn purge(&mut self, limit: usize) -> Result<String, String> {
        let purgeable = self.model.purgeable();
        let count = self
            .store
            .purge(limit)
            .await
            .map_err(|err| format!("purge failed: {err}"))?;
        let mut deleted = Vec::new();
        for &idx in &purgeable {
            match self.store.get(self.ids[idx]).await {
                Ok(_) => {}
                Err(err) if err.is_not_found() => deleted.push(idx),
                Err(err) => return Err(format!("get #{idx} after purge failed: {err}")),
            }
        }
        self.model.purge(limit, count, &deleted)?;
        Ok(format!("purged {count}: {deleted:?}"))
    }
}
