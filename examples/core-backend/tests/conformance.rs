//! The core conformance suite on a backend that implements only the core trait: the
//! harness, from `struct` to the macro, is the 15 lines issue #30 asks for. Every
//! scenario that needs a capability is skipped, and says which.
use durq_conformance::Harness;
use durq_core::{async_trait, JobId, Result, Store, StoreSettings};
use durq_example_core_backend::CoreBackend;
use durq_memory::MemoryServer;

struct Core(MemoryServer);
#[async_trait]
impl Harness for Core {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        Ok(Store::new(CoreBackend::new(self.0.open(settings)?)))
    }
    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        Harness::vanish(&self.0, namespace, id).await
    }
    async fn teardown(&self, namespace: &str) -> Result<()> {
        Harness::teardown(&self.0, namespace).await
    }
}
durq_conformance::conformance_tests!(|| async { Some(Core(MemoryServer::new())) });
