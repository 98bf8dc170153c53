//! Reclaim (R1–R3): the jobs whose lease ran out go back to the queue, or end.

use crate::model_check::case::Run;

impl Run {
    /// `reclaim`: which expired jobs a limited call takes, and the order of the jobs
    /// one call requeues among themselves, are the store's choice; the model checks
    /// the choice is allowed and where each job went, then adopts it.
    pub(super) async fn reclaim(&mut self, limit: usize) -> Result<String, String> {
        let got = self
            .store
            .reclaim(limit)
            .await
            .map_err(|err| format!("reclaim failed: {err}"))?;
        let mut mapped = Vec::with_capacity(got.len());
        for r in &got {
            mapped.push((self.model_id(r.id, "reclaim")?, r.state));
        }
        self.model.reclaim(limit, &mapped)?;
        Ok(format!("reclaimed {mapped:?}"))
    }
}
