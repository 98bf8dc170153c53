//! Bugs in jobs that wait for jobs (CONTRACT G1–G5).

use super::*;

/// G1: a fan-in released when the first job it waits for succeeds, not the last. The
/// store's own settlement with the fault injected
/// (`MemoryServer::release_on_first_dependency`).
#[derive(Debug)]
pub(crate) struct ReleaseOnFirstDependency;

impl Bug for ReleaseOnFirstDependency {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.release_on_first_dependency(namespace, true);
    }
}

/// G3: a dependency that ended dead or cancelled counts as met whatever the waiting
/// job's policy, so a report runs on a failed input. The store's own settlement with
/// the fault injected (`MemoryServer::ignore_dependency_failures`).
#[derive(Debug)]
pub(crate) struct DependencyFailuresIgnored;

impl Bug for DependencyFailuresIgnored {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.ignore_dependency_failures(namespace, true);
    }
}

/// E10 (decided with G1): a waiting job does not hold its key unique while active, so
/// the next enqueue of the key makes a second job. The store's own dedup with the
/// fault injected (`MemoryServer::waiting_frees_unique_keys`).
#[derive(Debug)]
pub(crate) struct WaitingFreesUniqueKeys;

impl Bug for WaitingFreesUniqueKeys {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.waiting_frees_unique_keys(namespace, true);
    }
}

/// G3: a release that ends a cancel-requested job cancelled but leaves the jobs waiting
/// for it waiting, as Redis's release script did before it took a graph tail. The
/// store's own release with the fault injected
/// (`MemoryServer::release_leaves_dependents`).
#[derive(Debug)]
pub(crate) struct ReleaseLeavesDependents;

impl Bug for ReleaseLeavesDependents {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.release_leaves_dependents(namespace, true);
    }
}

/// G2: a batch whose jobs' batch indexes are dropped on the way to the store, as a
/// backend that resolves only stored ids would: the graph's jobs run at once.
#[derive(Debug)]
pub(crate) struct BatchIndexesDropped;

#[async_trait]
impl Bug for BatchIndexesDropped {
    async fn enqueue_batch(
        &self,
        inner: &dyn Backend,
        mut jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        for job in &mut jobs {
            job.depends_on
                .retain(|dependency| !matches!(dependency, Dependency::Earlier(_)));
        }
        inner.enqueue_batch(jobs, now).await
    }
}
