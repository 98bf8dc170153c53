//! Bugs in durable steps (CONTRACT D1–D4).

use super::*;

/// D1: a save that is not fenced: it stores the step under whatever lease the job
/// holds now, as a backend that checked only that the job runs would, so a run that
/// lost its lease still writes.
#[derive(Debug)]
pub(crate) struct StepSavedWithoutTheLease;

#[async_trait]
impl Bug for StepSavedWithoutTheLease {
    async fn save_step(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let job = inner.get(lease.id).await?;
        let token = job.lease.map_or(lease.token, |current| current.token);
        inner
            .require_steps()?
            .save_step(lease.id, token, name, output, now)
            .await
    }
}

/// D2: steps read back sorted by name, as from an index keyed by name, instead of in
/// the order they were saved.
#[derive(Debug)]
pub(crate) struct StepsReadByName;

#[async_trait]
impl Bug for StepsReadByName {
    async fn steps(&self, inner: &dyn Backend, id: JobId) -> Result<StepLog> {
        let mut log = inner.require_steps()?.steps(id).await?;
        log.steps.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(log)
    }
}

/// D3: a reopen that deletes only the last step saved instead of the named one and
/// every one after it: the job reruns too little.
#[derive(Debug)]
pub(crate) struct ReopenCutsOnlyTheLastStep;

#[async_trait]
impl Bug for ReopenCutsOnlyTheLastStep {
    async fn retry_from(
        &self,
        inner: &dyn Backend,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        let steps = inner.require_steps()?;
        let log = steps.steps(id).await?;
        let last = match (log.position(step), log.steps.last()) {
            (Some(_), Some(last)) => last.name.clone(),
            _ => step.to_owned(),
        };
        steps.retry_from(id, &last, generation, now).await
    }
}

/// D4: a reopen that checks the job and its generation, then changes it in a second
/// step, so every reopen that checked before the first change wins. The store's own
/// reopen with the fault injected (`MemoryServer::reopen_checks_apart`).
#[derive(Debug)]
pub(crate) struct ReopenChecksApart;

impl Bug for ReopenChecksApart {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.reopen_checks_apart(namespace, true);
    }
}
