//! The calls that change nothing: get and payload (E1), children (E8), stats (A3) and
//! list (A4). Their answers must equal the model's exactly.

use durq_core::{JobState, ListQuery};

use crate::model_check::case::Run;
use crate::model_check::ops::Pick;
use crate::model_check::QUEUES;

impl Run {
    /// `get` and `payload` of one job: as the model has it, or not found once purged.
    pub(super) async fn get(&self, job: Pick) -> Result<String, String> {
        // Narrow: a purged job, to see it stays gone.
        let Some(idx) = self.pick_job(job, |j| !j.present) else {
            return Ok("skipped: no jobs yet".to_owned());
        };
        let id = self.ids[idx];
        let got = self.store.get(id).await;
        let payload = self.store.payload(id).await;
        let want = &self.model.jobs[idx];
        if want.present {
            let job = got.map_err(|err| format!("get #{idx} failed: {err}"))?;
            self.model.check_job(idx, &job, &self.ids, &QUEUES)?;
            let payload = payload.map_err(|err| format!("payload #{idx} failed: {err}"))?;
            if payload.as_ref() != want.payload.as_slice() {
                return Err(format!(
                    "payload of #{idx} is {payload:?}; enqueued was {:?}",
                    want.payload
                ));
            }
            Ok(format!("#{idx} {}", job.state))
        } else {
            match (got, payload) {
                (Err(a), Err(b)) if a.is_not_found() && b.is_not_found() => {
                    Ok(format!("#{idx} not found (purged)"))
                }
                (got, payload) => Err(format!(
                    "#{idx} was purged, yet get answered {got:?} and payload {payload:?}"
                )),
            }
        }
    }

    /// `children` of one job, oldest first.
    pub(super) async fn children(&self, job: Pick) -> Result<String, String> {
        // Narrow: a job that has children, else any job.
        let parents: Vec<Option<usize>> = self.model.jobs.iter().map(|j| j.parent).collect();
        let Some(idx) = self
            .pick_job(job, |j| j.present)
            .filter(|_| job.wide)
            .or_else(|| {
                let with_children: Vec<usize> = parents.iter().flatten().copied().collect();
                (!with_children.is_empty())
                    .then(|| with_children[usize::from(job.n) % with_children.len()])
            })
            .or_else(|| self.job_ref(job.n))
        else {
            return Ok("skipped: no jobs yet".to_owned());
        };
        let Ok(want) = self.model.children(idx) else {
            // Children of a deleted job are not written down.
            return Ok(format!("skipped: #{idx} was purged"));
        };
        let got = self
            .store
            .children(self.ids[idx])
            .await
            .map_err(|err| format!("children of #{idx} failed: {err}"))?;
        let got: Vec<String> = got.iter().map(|j| self.label(&j.id)).collect();
        let want: Vec<String> = want.iter().map(|i| format!("#{i}")).collect();
        if got != want {
            return Err(format!(
                "children of #{idx}: the store lists {got:?}, the model {want:?} (E8, oldest first)"
            ));
        }
        Ok(format!("children of #{idx}: {got:?}"))
    }

    /// `stats` of one queue.
    pub(super) async fn stats(&self, queue: u8) -> Result<String, String> {
        let q = usize::from(queue) % QUEUES.len();
        let got = self
            .store
            .stats(QUEUES[q])
            .await
            .map_err(|err| format!("stats failed: {err}"))?;
        let want = self.model.stats(q);
        if got != want {
            return Err(format!(
                "stats of {}: the store counts {got:?}, the model {want:?}",
                QUEUES[q]
            ));
        }
        Ok(format!("{got:?}"))
    }

    /// `list` of one queue, all states or one, read `page` jobs at a time.
    pub(super) async fn list(
        &self,
        queue: u8,
        state: Option<JobState>,
        page: usize,
    ) -> Result<String, String> {
        let q = usize::from(queue) % QUEUES.len();
        let listed = self.list_paged(q, state, page).await?;
        let want = self.model.list(q, state);
        if listed != want {
            return Err(format!(
                "list of {} in {state:?}, {page} per page: the store lists {listed:?}, the model {want:?}",
                QUEUES[q]
            ));
        }
        Ok(format!("{listed:?}"))
    }

    /// Reads a whole listing page by page, checking the cursor rules decided under A4.
    async fn list_paged(
        &self,
        queue: usize,
        state: Option<JobState>,
        page: usize,
    ) -> Result<Vec<usize>, String> {
        let mut listed = Vec::new();
        let mut cursor = None;
        // Every page but the last is full, so this many pages always suffice.
        let bound = self.ids.len() / page + 2;
        for _ in 0..bound {
            let mut query = ListQuery::new(QUEUES[queue]).limit(page);
            query.states = state.into_iter().collect();
            query.cursor = cursor;
            let got = self
                .store
                .list(query)
                .await
                .map_err(|err| format!("list failed: {err}"))?;
            for job in &got.jobs {
                let idx = self.model_id(job.id, "list")?;
                if state.is_some_and(|s| s != job.state) {
                    return Err(format!(
                        "list of state {state:?} returned #{idx} in state {}",
                        job.state
                    ));
                }
                listed.push(idx);
            }
            let full = got.jobs.len() == page;
            let last = got.jobs.last().map(|j| j.id);
            if got.next != if full { last } else { None } {
                return Err(format!(
                    "list page of {} jobs (limit {page}) has next {:?}; A4, decided: the last id when the page is full, else none",
                    got.jobs.len(),
                    got.next
                ));
            }
            match got.next {
                Some(next) => cursor = Some(next),
                None => return Ok(listed),
            }
        }
        Err(format!(
            "list kept returning full pages after {bound} pages"
        ))
    }
}
