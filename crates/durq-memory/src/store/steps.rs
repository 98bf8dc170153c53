//! Durable steps (CONTRACT D1–D4), kept in `State::steps` beside the job's record;
//! whatever deletes the record (purge, `vanish`) deletes them.

use durq_core::steps::{self, SavedStep, StepLog, MAX_STEPS};

use super::*;

impl State {
    /// Rule D2.
    pub(crate) fn steps(&self, id: JobId) -> Result<StepLog> {
        if !self.jobs.contains_key(&id) {
            return Err(Error::NotFound { id });
        }
        Ok(self.steps.get(&id).cloned().unwrap_or_default())
    }

    /// Rule D1.
    pub(crate) fn save_step(
        &mut self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.check_lease(id, token)?;
        let log = self.steps.entry(id).or_default();
        if log.get(name).is_some() {
            return Ok(());
        }
        if log.steps.len() >= MAX_STEPS {
            return Err(steps::too_many_steps());
        }
        log.steps.push(SavedStep {
            name: name.to_owned(),
            output,
            saved_at: now,
        });
        Ok(())
    }

    /// Rule D3, checked and applied under one hold of the namespace's lock, which is
    /// what makes concurrent reopens have one winner (D4).
    pub(crate) fn retry_from(
        &mut self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        let reopened = self.check_reopen(id, step, generation)?;
        self.reopen(id, reopened, now)
    }

    /// Rule D3's refusals, and the log a reopen leaves.
    pub(crate) fn check_reopen(&self, id: JobId, step: &str, generation: u64) -> Result<StepLog> {
        let record = self.jobs.get(&id).ok_or(Error::NotFound { id })?;
        let state = record.job.state;
        if !state.is_terminal() {
            return Err(Error::InvalidState {
                id,
                state,
                operation: "retry_from",
            });
        }
        match self.steps.get(&id) {
            Some(log) => log.reopened_from(id, step, generation),
            None => StepLog::default().reopened_from(id, step, generation),
        }
    }

    /// Rule D3's change: the steps cut, the job queued as A2 queues it, its history
    /// kept (H3). The attempt that succeeded lives in the record's own fields, which
    /// the requeue clears, so it is kept among the ended ones first.
    pub(crate) fn reopen(&mut self, id: JobId, reopened: StepLog, now: Timestamp) -> Result<()> {
        let history = self.attempt_history(id)?;
        let record = self.jobs.get_mut(&id).ok_or(Error::NotFound { id })?;
        record.ended = history;
        self.steps.insert(id, reopened);
        self.requeue(id, now)
    }
}
