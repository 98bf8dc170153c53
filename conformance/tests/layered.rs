//! The whole suite on a layer over the memory store: a layer costs its own code only.
use durq_conformance::HarnessExt;
use durq_core::{Backend, LayeredBackend};
use std::sync::Arc;
#[derive(Debug)]
struct Passthrough(Arc<dyn Backend>);
impl LayeredBackend for Passthrough {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }
}
async fn harness() -> Option<impl durq_conformance::Harness> {
    Some(durq_memory::MemoryServer::new().layered(|inner| Arc::new(Passthrough(inner))))
}
durq_conformance::conformance_tests!(harness);
