//! Clock moves (§3 Time). The store's clock is the case's `ManualClock`; the model
//! reads it before and after every step, so a move needs no model call here.

use std::time::Duration;

use durq_core::{Clock, JobState, Timestamp};

use crate::model_check::case::Run;
use crate::model_check::model::ModelJob;
use crate::model_check::ops::Mark;
use crate::model_check::{DEDUP_WINDOW, RETENTION};

impl Run {
    /// Moves the clock `ms` forward.
    pub(super) fn advance(&mut self, ms: i64) -> String {
        self.clock.advance(Duration::from_millis(ms as u64));
        format!("now {:?}", self.clock.now())
    }

    /// Sets the clock to `mark` plus `offset` ms, if that is ahead: just before, at or
    /// just after an instant where a rule flips (an expiry, a `run_at`, the end of a
    /// dedup window or of a retention), where off-by-one bugs live.
    pub(super) fn advance_to(&mut self, mark: Mark, offset: i64) -> String {
        let Some(target) = self.mark_time(mark) else {
            return "skipped: no such mark".to_owned();
        };
        let target = Timestamp::from_millis(target.as_millis() + offset);
        if target <= self.model.now {
            return format!("skipped: {target:?} is not ahead");
        }
        self.clock.set(target);
        format!("now {target:?}")
    }

    /// The instant `mark` names, from the job it picks.
    fn mark_time(&self, mark: Mark) -> Option<Timestamp> {
        let now = self.model.now;
        let (n, at): (u16, fn(&ModelJob) -> Option<Timestamp>) = match mark {
            Mark::LeaseExpiry(n) => (n, |j| {
                (j.state == JobState::Running)
                    .then(|| j.lease.as_ref().map(|l| l.expires_at))
                    .flatten()
            }),
            Mark::RunAt(n) => (n, |j| (j.state == JobState::Queued).then_some(j.run_at)),
            Mark::DedupEnd(n) => (n, |j| {
                j.key
                    .as_ref()
                    .map(|_| j.created_at.saturating_add(DEDUP_WINDOW))
            }),
            Mark::RetentionEnd(n) => (n, |j| j.finished_at.map(|t| t.saturating_add(RETENTION))),
        };
        // Only marks still ahead (or just behind, for the -1 and 0 offsets) are useful.
        let idx = self.job_where(n, |j| j.present && at(j).is_some_and(|t| t >= now))?;
        at(&self.model.jobs[idx])
    }
}
