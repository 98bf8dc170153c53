//! The whole conformance suite against the in-memory backend (its harness lives in
//! `durq-conformance`, where layered suites reuse it).

use durq_memory::MemoryServer;

async fn harness() -> Option<MemoryServer> {
    Some(MemoryServer::new())
}

durq_conformance::conformance_tests!(harness);
