//! Every scenario declares the capabilities it calls: run on a backend that hides one
//! capability, each scenario either passes or is skipped because it needs that
//! capability. A scenario that calls a capability without declaring it fails here,
//! before a downstream core-only backend meets it.

use std::sync::Arc;

use durq_conformance::{HarnessExt, Scenario, SCENARIOS};
use durq_core::{Backend, Capability, LayeredBackend};
use durq_memory::MemoryServer;
use futures::FutureExt as _;

/// The backend beneath, less one capability.
#[derive(Debug)]
struct Hide(Arc<dyn Backend>, Capability);

impl LayeredBackend for Hide {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }

    fn hides(&self, capability: Capability) -> bool {
        capability == self.1
    }
}

/// The scenarios that do not declare `hidden` and fail without it.
async fn undeclared_uses(hidden: Capability) -> Vec<String> {
    let harness = MemoryServer::new().layered(move |inner| Arc::new(Hide(inner, hidden)) as _);
    let mut failed = Vec::new();
    for scenario in SCENARIOS {
        let Scenario {
            name, needs, run, ..
        } = *scenario;
        let outcome = std::panic::AssertUnwindSafe(durq_conformance::__private::scenario(
            &harness, name, needs, run,
        ))
        .catch_unwind()
        .await;
        if outcome.is_err() {
            failed.push(format!("{name} without {hidden}"));
        }
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_scenario_declares_the_capabilities_it_calls() {
    let mut failed = Vec::new();
    for hidden in Capability::ALL {
        failed.extend(undeclared_uses(hidden).await);
    }
    assert!(
        failed.is_empty(),
        "scenarios that call a capability they do not declare (add it to their NEEDS in \
         scenarios.rs): {failed:#?}"
    );
}

#[tokio::test]
async fn a_hidden_capability_is_unsupported_through_the_handle() {
    let harness =
        MemoryServer::new().layered(|inner| Arc::new(Hide(inner, Capability::Admin)) as _);
    let env = durq_conformance::TestEnv::new(&harness);
    let store = env.store().await;
    assert!(!store.supports(Capability::Admin));
    assert!(store.supports(Capability::Inspect));
    let job = store
        .enqueue(durq_core::NewJob::new("q"))
        .await
        .expect("enqueue is core");
    match store.cancel(job.id).await {
        Err(durq_core::Error::Unsupported { capability }) => {
            assert_eq!(capability, Capability::Admin)
        }
        other => panic!("cancel without Admin answered {other:?}"),
    }
    assert_eq!(
        store.get(job.id).await.expect("get is core").state,
        durq_core::JobState::Queued,
        "an unsupported call changes nothing"
    );
}
