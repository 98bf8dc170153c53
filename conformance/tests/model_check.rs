//! Rule M1 against the in-memory store, from inside the conformance crate, so the
//! model check itself is exercised by `cargo test -p durq-conformance`.

use durq_memory::MemoryServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_model_check_on_memory() {
    durq_conformance::model_check::m1_model_check(&MemoryServer::new()).await;
}
