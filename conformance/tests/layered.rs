//! The whole suite on a layer over the memory store: a layer costs its own code only.
use jobs_conformance::HarnessExt;
use jobs_core::{Backend, LayeredBackend};
use std::sync::Arc;
#[derive(Debug)]
struct Passthrough(Arc<dyn Backend>);
impl LayeredBackend for Passthrough {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }
}
async fn harness() -> Option<impl jobs_conformance::Harness> {
    Some(jobs_memory::MemoryServer::new().layered(|inner| Arc::new(Passthrough(inner))))
}
jobs_conformance::conformance_tests!(harness);
