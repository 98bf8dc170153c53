#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use jobs_core::{async_trait, JobId, ManualClock, Result, Store, StoreSettings};

pub mod model_check;
pub mod rules;

#[doc(hidden)]
pub mod __private {
    pub use tokio;
}

/// What the suite needs from a backend beyond the [`Store`] trait.
///
/// A harness opens stores on settings the suite chooses (a fresh namespace per test,
/// a [`ManualClock`]), so every test is isolated and drives time itself.
#[async_trait]
pub trait Harness: Send + Sync {
    /// Opens a store on `settings`. Opening a second store with the same namespace
    /// must show the same data, as a reopened file or reconnected client does
    /// (CONTRACT A6); different namespaces must never see each other (CONTRACT C8).
    async fn open(&self, settings: StoreSettings) -> Result<Arc<dyn Store>>;

    /// Deletes the record of job `id` in `namespace` behind the store's back, leaving
    /// every index entry that points to it in place: what a Redis eviction or TTL
    /// expiry, or a careless operator, does (CONTRACT C7, R5).
    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()>;
}

/// One test's world: a harness, a manual clock, and a namespace no other test uses.
pub struct TestEnv<'a> {
    harness: &'a dyn Harness,
    /// The clock every store of this test reads. Advance it to expire leases,
    /// schedules, dedup windows and retention; never sleep.
    pub clock: ManualClock,
    /// The settings stores of this test are opened with.
    pub settings: StoreSettings,
}

static NAMESPACE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A namespace no other test in this or any concurrent process uses.
pub fn unique_namespace(prefix: &str) -> String {
    let n = NAMESPACE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos:x}-{n}", std::process::id())
}

impl<'a> TestEnv<'a> {
    /// A fresh environment: a new namespace, a manual clock at a fixed instant, and
    /// default limits otherwise.
    pub fn new(harness: &'a dyn Harness) -> Self {
        let clock = ManualClock::default();
        let settings = StoreSettings::default()
            .namespace(unique_namespace("t"))
            .clock(Arc::new(clock.clone()));
        TestEnv {
            harness,
            clock,
            settings,
        }
    }

    /// Opens a store on this environment's namespace and clock. Call it again to get a
    /// second handle on the same data (a reopen).
    pub async fn store(&self) -> Arc<dyn Store> {
        match self.harness.open(self.settings.clone()).await {
            Ok(store) => store,
            Err(err) => panic!("the harness could not open a store: {err}"),
        }
    }

    /// Opens a store with changed settings on the same namespace and clock.
    pub async fn store_with(
        &self,
        change: impl FnOnce(StoreSettings) -> StoreSettings,
    ) -> Arc<dyn Store> {
        let settings = change(self.settings.clone());
        match self.harness.open(settings).await {
            Ok(store) => store,
            Err(err) => panic!("the harness could not open a store: {err}"),
        }
    }

    /// Deletes a job record under the store, leaving its index entries.
    pub async fn vanish(&self, id: JobId) {
        if let Err(err) = self.harness.vanish(&self.settings.namespace, id).await {
            panic!("the harness could not make job {id} vanish: {err}");
        }
    }

    /// The harness, for scenarios that need a second namespace.
    pub fn harness(&self) -> &'a dyn Harness {
        self.harness
    }
}

/// Decides what a test does when its server cannot be reached: a loud skip on a
/// developer's laptop, a failure when `JOBS_REQUIRE_SERVICES=1` (as in CI).
///
/// Returns `None` to skip.
pub fn skip_or_fail<T>(service: &str, url: &str, error: &dyn std::fmt::Display) -> Option<T> {
    let required = std::env::var("JOBS_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
    if required {
        panic!("{service} at {url} is required (JOBS_REQUIRE_SERVICES=1) but unreachable: {error}");
    }
    eprintln!(
        "\n*** SKIPPED: {service} at {url} is unreachable ({error}).\n*** Start it, or set the URL; CI sets JOBS_REQUIRE_SERVICES=1 and fails here.\n"
    );
    None
}
