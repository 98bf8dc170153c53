//! The whole conformance suite against the in-memory backend.

use std::sync::Arc;

use jobs_conformance::Harness;
use jobs_core::{async_trait, JobId, Result, Store, StoreSettings};
use jobs_memory::MemoryServer;

struct MemoryHarness {
    server: MemoryServer,
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.server.open(settings)?))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.server.vanish(namespace, id);
        Ok(())
    }
}

async fn harness() -> Option<MemoryHarness> {
    Some(MemoryHarness {
        server: MemoryServer::new(),
    })
}

jobs_conformance::conformance_tests!(harness);
