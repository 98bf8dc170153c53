//! The whole conformance suite against the in-memory backend (its harness lives in
//! `jobs-conformance`, where layered suites reuse it).

use jobs_memory::MemoryServer;

async fn harness() -> Option<MemoryServer> {
    Some(MemoryServer::new())
}

jobs_conformance::conformance_tests!(harness);
