//! Bugs in waiting for a job's outcome (CONTRACT O1, O2).

use super::*;

/// O1: a wait that answers the job as it reads it, ended or not, as a backend that
/// forgot the loop would.
#[derive(Debug)]
pub(crate) struct WaitAnswersAtOnce;

#[async_trait]
impl Bug for WaitAnswersAtOnce {
    async fn wait_for_ending(
        &self,
        inner: &dyn Backend,
        id: JobId,
        _timeout: Duration,
    ) -> Result<Option<Job>> {
        inner.get(id).await.map(Some)
    }
}

/// O2: a wait that hears of no ending: it reads the job, and if it has not ended,
/// reads it again only at its deadline. Every answer is right, only late, as with a
/// backend whose endings send no notice.
#[derive(Debug)]
pub(crate) struct WaitHearsNoEndings;

#[async_trait]
impl Bug for WaitHearsNoEndings {
    async fn wait_for_ending(
        &self,
        inner: &dyn Backend,
        id: JobId,
        timeout: Duration,
    ) -> Result<Option<Job>> {
        durq_core::ending::wait_until_ended(timeout, None, || {
            Box::pin(async move { Ok(durq_core::ending::Armed::unwatched(inner.get(id).await?)) })
        })
        .await
    }
}
