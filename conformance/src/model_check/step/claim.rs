//! Claim (C1–C6): which jobs a worker gets, in which order, and how they look once
//! claimed. Every claim handed out is remembered, so later lease steps can name it.

use std::time::Duration;

use durq_core::{ClaimRequest, Error, JobState};

use crate::model_check::case::{Claim, Run};
use crate::model_check::{QUEUES, WORKERS};

impl Run {
    /// `claim` by one of the workers, over the queues `queues` encodes (see
    /// [`claimed_queues`]).
    pub(super) async fn claim(
        &mut self,
        worker: u8,
        queues: u8,
        limit: usize,
        ttl_ms: u64,
    ) -> Result<String, String> {
        let queues = claimed_queues(queues);
        let worker = WORKERS[usize::from(worker) % WORKERS.len()];
        let ttl = Duration::from_millis(ttl_ms);
        let request =
            ClaimRequest::new(queues.iter().map(|&q| QUEUES[q]), worker, ttl).limit(limit);
        let got = self.store.claim(request).await;
        if queues.is_empty() {
            return match got {
                Err(Error::InvalidInput {
                    field: "queues", ..
                }) => Ok("refused: no queues".to_owned()),
                other => Err(format!(
                    "a claim naming no queue must be refused (C1, field \"queues\"), got {other:?}"
                )),
            };
        }
        let claimed = got.map_err(|err| format!("claim failed: {err}"))?;
        let mut picked = Vec::with_capacity(claimed.len());
        for job in &claimed {
            let idx = self.model_id(job.id(), "claim")?;
            if self.model.jobs[idx].state == JobState::Running {
                return Err(format!(
                    "claim handed out #{idx}, which is running under another lease (C2)"
                ));
            }
            picked.push(idx);
        }
        // The store picks which ready jobs: the model checks the pick is one the contract
        // allows (count, readiness, order), then claims the same jobs.
        let partitioning = self.store.capabilities().partitioning;
        let ids = &self.ids;
        let partition = |idx: usize| match (partitioning, ids.get(idx)) {
            (Some(partitioning), Some(id)) => partitioning.of(*id),
            _ => 0,
        };
        self.model
            .claim(&queues, worker, ttl, limit, &picked, partition)?;
        let mut notes = Vec::new();
        for (job, &idx) in claimed.iter().zip(&picked) {
            self.model
                .check_job(idx, &job.job, &self.ids, &QUEUES)
                .map_err(|diff| format!("the claimed job: {diff}"))?;
            if job.payload.as_ref() != self.model.jobs[idx].payload.as_slice() {
                return Err(format!(
                    "claim returned #{idx} with payload {:?}; enqueued was {:?}",
                    job.payload, self.model.jobs[idx].payload
                ));
            }
            // The model issues tokens 1, 2, 3, … per job, one per claim.
            let token = self.model.jobs[idx].claims;
            self.claims.push(Claim { job: idx, token });
            notes.push(format!("#{idx} token {token}"));
        }
        Ok(format!("claimed [{}]", notes.join(", ")))
    }
}

/// The queues (by index, in the order named) of a claim's `queues` code; 4 names none,
/// which C1 refuses.
fn claimed_queues(code: u8) -> Vec<usize> {
    match code {
        0 => vec![0],
        1 => vec![1],
        2 => vec![0, 1],
        3 => vec![1, 0],
        _ => vec![],
    }
}
