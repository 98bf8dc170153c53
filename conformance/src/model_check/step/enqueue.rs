//! Enqueue (E1–E9): one job or a batch, with or without an idempotency key or a
//! parent. The ids the store returns are mapped onto model ids here.

use durq_core::{Enqueued, NewJob, Timestamp};

use super::error_matches;
use crate::model_check::case::Run;
use crate::model_check::model::NewModelJob;
use crate::model_check::ops::{Link, Spec};
use crate::model_check::{QUEUES, TENANTS};

impl Run {
    /// `enqueue` of one job.
    pub(super) async fn enqueue(&mut self, spec: &Spec, step: usize) -> Result<String, String> {
        let (job, new) = self.resolve(spec, step);
        let want = self.model.enqueue(&new);
        let got = self.store.enqueue(job).await;
        match (want, got) {
            (Ok(want), Ok(got)) => self.adopt(want, got),
            (Err(want), Err(err)) if error_matches(&err, want, None) => Ok(format!("error {err}")),
            (want, got) => Err(format!(
                "enqueue: the store answered {got:?}, the model expects {want:?}"
            )),
        }
    }

    /// `enqueue_batch`: all of it or none of it (E9), each entry answered in order.
    pub(super) async fn enqueue_batch(
        &mut self,
        specs: &[Spec],
        step: usize,
    ) -> Result<String, String> {
        let (jobs, news): (Vec<NewJob>, Vec<NewModelJob>) =
            specs.iter().map(|s| self.resolve(s, step)).unzip();
        let want = self.model.enqueue_batch(&news);
        let got = self.store.enqueue_batch(jobs).await;
        match (want, got) {
            (Ok(want), Ok(got)) if want.len() == got.len() => {
                let mut notes = Vec::new();
                for (w, g) in want.into_iter().zip(got) {
                    notes.push(self.adopt(w, g)?);
                }
                Ok(notes.join(", "))
            }
            (Err(want), Err(err)) if error_matches(&err, want, None) => Ok(format!("error {err}")),
            (want, got) => Err(format!(
                "enqueue_batch: the store answered {got:?}, the model expects {want:?}"
            )),
        }
    }

    /// The store's job and the model's job for `spec`.
    fn resolve(&self, spec: &Spec, step: usize) -> (NewJob, NewModelJob) {
        let now = self.model.now;
        let queue = usize::from(spec.queue) % QUEUES.len();
        let tenant = TENANTS[usize::from(spec.tenant) % TENANTS.len()];
        let (key, parent) = match spec.link {
            Link::None => (None, None),
            Link::Key(k) => (Some(format!("k{k}")), None),
            Link::Parent(n) => (None, self.job_ref(n)),
        };
        let run_at = spec
            .delay
            .map(|ms| Timestamp::from_millis(now.as_millis() + ms));
        let payload = payload_of(spec.payload, step);
        let mut job = NewJob::new(QUEUES[queue])
            .tenant(tenant)
            .priority(spec.priority)
            .max_attempts(spec.max_attempts)
            .payload(payload.clone());
        if let Some(key) = &key {
            job = job.idempotency_key(key.clone());
        }
        if let Some(at) = run_at {
            job = job.run_at(at);
        }
        if let Some(p) = parent {
            job = job.parent(self.ids[p]);
        }
        let model = NewModelJob {
            queue,
            tenant: tenant.to_owned(),
            key,
            priority: spec.priority,
            run_at,
            max_attempts: spec.max_attempts,
            parent,
            payload,
        };
        (job, model)
    }

    /// Records the store's answer to one enqueue the model answered with `want` (the
    /// model id, and whether it is a new job): a new job's store id is mapped onto the
    /// model id, after checking it is new and later than every id before it (ids are
    /// time-ordered); a duplicate must name the job the model deduplicated into.
    fn adopt(&mut self, want: (usize, bool), got: Enqueued) -> Result<String, String> {
        let (idx, created) = want;
        if created {
            if !got.created {
                return Err(format!(
                    "enqueue deduplicated into {} ({}); the model creates job #{idx}",
                    got.id,
                    self.label(&got.id)
                ));
            }
            if self.by_id.contains_key(&got.id) {
                return Err(format!(
                    "enqueue created a job with the id of {}",
                    self.label(&got.id)
                ));
            }
            if let Some(last) = self.ids.last() {
                if got.id <= *last {
                    return Err(format!(
                        "ids are not time-ordered: new job {} after {last}",
                        got.id
                    ));
                }
            }
            self.ids.push(got.id);
            self.by_id.insert(got.id, idx);
            Ok(format!("new #{idx}"))
        } else if got.created || got.id != self.ids[idx] {
            Err(format!(
                "enqueue answered {{ id: {} ({}), created: {} }}; the model returns job #{idx}, created: false",
                got.id,
                self.label(&got.id),
                got.created
            ))
        } else {
            Ok(format!("duplicate of #{idx}"))
        }
    }
}

/// The payload of a job enqueued at `step`: empty, text, or bytes that are not UTF-8
/// (with a newline, which a line-based encoding would trip over).
fn payload_of(variant: u8, step: usize) -> Vec<u8> {
    match variant {
        0 => Vec::new(),
        // Distinct per step, so a duplicate enqueue that overwrote a payload shows.
        1 => format!("payload of step {step}").into_bytes(),
        _ => vec![0, 0xff, step as u8, 0, b'\n'],
    }
}
