//! One case in progress: the store and the model side by side, the map between their
//! ids, and how a step turns the positions an operation names into jobs and claims.

use std::collections::HashMap;

use durq_core::{Clock, JobId, JobState, ManualClock, Store};

use super::model::{Model, ModelJob};
use super::ops::{Pick, Tok};
use super::{DEDUP_WINDOW, RETENTION};

/// A claim handed out during the case: the job (model id) and its token.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim {
    pub(super) job: usize,
    pub(super) token: u64,
}

/// One case in progress: the store, the model, and the map between their ids.
pub(super) struct Run {
    pub(super) store: Store,
    pub(super) clock: ManualClock,
    pub(super) model: Model,
    /// Model id → store id.
    pub(super) ids: Vec<JobId>,
    /// Store id → model id.
    pub(super) by_id: HashMap<JobId, usize>,
    /// Every claim handed out so far, held or not, in order: steps name them by position.
    pub(super) claims: Vec<Claim>,
    /// One line per step run so far, with what it returned, for the failure report.
    pub(super) trace: Vec<String>,
}

impl Run {
    /// A case on a fresh `store` whose clock is `clock`, with an empty model at the
    /// same instant.
    pub(super) fn new(store: Store, clock: ManualClock) -> Self {
        Run {
            store,
            model: Model::new(clock.now(), DEDUP_WINDOW, RETENTION),
            clock,
            ids: Vec::new(),
            by_id: HashMap::new(),
            claims: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// Job `n` of all jobs so far.
    pub(super) fn job_ref(&self, n: u16) -> Option<usize> {
        (!self.ids.is_empty()).then(|| usize::from(n) % self.ids.len())
    }

    /// The `n`th job the model says is `wanted`, if any.
    pub(super) fn job_where(&self, n: u16, wanted: impl Fn(&ModelJob) -> bool) -> Option<usize> {
        let matching: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&i| wanted(&self.model.jobs[i]))
            .collect();
        (!matching.is_empty()).then(|| matching[usize::from(n) % matching.len()])
    }

    /// The job `pick` names: among the `wanted` ones unless it is wide or none is.
    pub(super) fn pick_job(&self, pick: Pick, wanted: impl Fn(&ModelJob) -> bool) -> Option<usize> {
        let narrow = if pick.wide {
            None
        } else {
            self.job_where(pick.n, wanted)
        };
        narrow.or_else(|| self.job_ref(pick.n))
    }

    /// The claim `pick` names: among the claims still held unless it is wide or none
    /// is; `token` then says which token the call carries.
    pub(super) fn pick_claim(&self, pick: Pick, token: Tok) -> Option<Claim> {
        let held: Vec<Claim> = self
            .claims
            .iter()
            .copied()
            .filter(|c| {
                let job = &self.model.jobs[c.job];
                job.state == JobState::Running
                    && job.lease.as_ref().is_some_and(|l| l.token == c.token)
            })
            .collect();
        let from = if pick.wide || held.is_empty() {
            &self.claims
        } else {
            &held
        };
        let claim = from.get(usize::from(pick.n) % from.len().max(1))?;
        Some(Claim {
            job: claim.job,
            token: match token {
                Tok::Own => claim.token,
                Tok::Next => claim.token + 1,
                Tok::Prev => claim.token.saturating_sub(1),
            },
        })
    }

    /// `#n` for the job with store id `id`, for messages; an id no enqueue returned is
    /// shown as it is.
    pub(super) fn label(&self, id: &JobId) -> String {
        match self.by_id.get(id) {
            Some(idx) => format!("#{idx}"),
            None => format!("unknown id {id}"),
        }
    }

    /// The model id of the job the store calls `id`; an id no enqueue ever returned is
    /// a failure of the call (`what`) that returned it.
    pub(super) fn model_id(&self, id: JobId, what: &str) -> Result<usize, String> {
        self.by_id
            .get(&id)
            .copied()
            .ok_or_else(|| format!("{what} returned id {id}, which no enqueue ever returned"))
    }
}
