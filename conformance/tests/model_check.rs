//! Rule M1 against the in-memory store, from inside the conformance crate, so the
//! model check itself is exercised by `cargo test -p jobs-conformance`.

use std::sync::Arc;

use jobs_conformance::Harness;
use jobs_core::{async_trait, JobId, Result, Store, StoreSettings};
use jobs_memory::MemoryServer;

struct Memory(MemoryServer);

#[async_trait]
impl Harness for Memory {
    async fn open(&self, settings: StoreSettings) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(self.0.open(settings)?))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.0.vanish(namespace, id);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_model_check_on_memory() {
    jobs_conformance::model_check::m1_model_check(&Memory(MemoryServer::new())).await;
}
