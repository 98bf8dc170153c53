#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(doc)]
use durq_core::Layer;
use durq_core::{
    async_trait, Backend, Capability, JobId, ManualClock, Result, Store, StoreSettings,
};
use futures::future::BoxFuture;

mod scenarios;

pub mod model_check;
pub mod rules;
pub mod transactions;

pub use transactions::{
    CallerTransaction, TransactionEnv, TransactionHarness, TransactionScenario,
    TransactionScenarioFn, TRANSACTION_SCENARIOS,
};

#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;
    pub use tokio;

    pub use durq_core::Capability;

    /// Runs `scenario` against `harness`, then removes every namespace the scenario
    /// opened, whether it passed or panicked, and re-raises its panic. A scenario that
    /// `needs` a capability the harness's backend does not declare is skipped, and
    /// says so on stderr.
    pub async fn scenario(
        harness: &dyn crate::Harness,
        name: &str,
        needs: &[Capability],
        scenario: crate::ScenarioFn,
    ) {
        use futures::FutureExt as _;
        let tracked = crate::Tracked::new(harness);
        if let Some(missing) = crate::missing_capability(&tracked, needs).await {
            tracked.teardown_all().await;
            crate::report_skip(name, missing);
            return;
        }
        let outcome = std::panic::AssertUnwindSafe(scenario(&tracked))
            .catch_unwind()
            .await;
        tracked.teardown_all().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    /// Runs one scenario the way `#[tokio::test(flavor = "multi_thread",
    /// worker_threads = 4)]` would, without asking the calling crate to name tokio:
    /// a fresh multi-threaded runtime per test, so races in the scenarios are real.
    pub fn run<F: std::future::Future<Output = ()>>(scenario: F) {
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(err) => panic!("cannot start the tokio runtime of a conformance test: {err}"),
        };
        runtime.block_on(scenario);
    }
}

/// A scenario's entry point as a plain function pointer, so a table of scenarios can
/// be iterated (see [`SCENARIOS`]).
pub type ScenarioFn = for<'a> fn(&'a dyn Harness) -> BoxFuture<'a, ()>;

/// One scenario of the suite: a named test of one contract rule.
///
/// A scenario panics, with a message naming its rule, when the store breaks the rule;
/// it returns normally when the store keeps it.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// The scenario's name, which is also the name of its generated test, e.g.
    /// `"c2_claim_once"`.
    pub name: &'static str,
    /// The contract rule it checks, upper case, e.g. `"C2"` (`"M1"` for the model check).
    pub rule: &'static str,
    /// The capabilities the scenario calls beyond the core [`Backend`]: it runs only
    /// on a backend that declares them all (see [`Scenario::runs_on`]).
    pub needs: &'static [Capability],
    /// Runs the scenario against a harness.
    pub run: ScenarioFn,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}

impl Scenario {
    /// Whether the scenario runs on a store: whether it declares every capability
    /// the scenario [needs](Scenario::needs).
    pub fn runs_on(&self, store: &Store) -> bool {
        self.needs
            .iter()
            .all(|&capability| store.supports(capability))
    }
}

/// The first of `needs` a store opened through `harness` does not declare; `None`
/// when it declares them all, or `needs` is empty (then no store is opened).
async fn missing_capability(harness: &dyn Harness, needs: &[Capability]) -> Option<Capability> {
    if needs.is_empty() {
        return None;
    }
    let store = TestEnv::new(harness).store().await;
    needs
        .iter()
        .copied()
        .find(|&capability| !store.supports(capability))
}

/// Says on stderr that scenario `name` was skipped for want of `capability`.
fn report_skip(name: &str, capability: Capability) {
    // Written to the process's stderr directly, as `skip_or_fail` does: the test
    // harness captures `eprintln!` of passing tests.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "skipped {name}: the backend does not declare the {capability} capability"
    );
}

/// Every scenario of the suite, in contract order: the same list
/// [`conformance_tests!`] expands into tests.
///
/// For tools that run scenarios themselves, such as the mutant tests, which run each
/// scenario against a deliberately broken store and expect it to panic:
///
/// ```no_run
/// # async fn demo(harness: &dyn durq_conformance::Harness) {
/// for scenario in durq_conformance::SCENARIOS.iter().filter(|s| s.rule == "C2") {
///     (scenario.run)(harness).await;
/// }
/// # }
/// ```
pub const SCENARIOS: &[Scenario] = crate::__with_scenarios!(__scenario_table!());

/// The scenarios checking `rule` (`"E1"`, `"c2"`: case does not matter).
pub fn scenarios_for(rule: &str) -> impl Iterator<Item = &'static Scenario> + '_ {
    SCENARIOS
        .iter()
        .filter(move |scenario| scenario.rule.eq_ignore_ascii_case(rule))
}

/// Expands into one test per scenario of the suite, each named after its scenario
/// (`c2_claim_once`, …), for the backend `harness` opens.
///
/// `harness` is an `async fn() -> Option<H>` with `H: Harness`, or a closure returning
/// such a future, called once per test; it returns `None` to skip (see
/// [`skip_or_fail`]). A scenario that needs a [capability](durq_core::capability) the
/// backend does not declare is skipped, and says so on stderr. Each test runs on a fresh multi-threaded
/// tokio runtime with four workers; the calling crate needs no tokio dependency for it.
///
/// ```ignore
/// // tests/conformance.rs of a backend crate
/// async fn harness() -> Option<MyHarness> {
///     match MyHarness::connect().await {
///         Ok(harness) => Some(harness),
///         Err(err) => durq_conformance::skip_or_fail("my-server", "tcp://localhost", &err),
///     }
/// }
/// durq_conformance::conformance_tests!(harness);
/// // or, for a harness made without waiting:
/// // durq_conformance::conformance_tests!(|| async { Some(MyHarness::default()) });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr $(,)?) => {
        $crate::__with_scenarios!(__conformance_tests_expand!($harness));
    };
}

/// The one list of scenarios. Calls `$crate::$callback!` with `(args)` followed by
/// `RULE [NEEDS] module::name,` for every scenario, so the tests, the table and the docs
/// cannot drift apart.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_scenarios {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::__scenario_list! { $callback ($($args)*) }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests_expand {
    (($harness:expr) $($rule:ident [$($need:ident)*] $module:ident :: $name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run(async {
                    let Some(harness) = ($harness)().await else {
                        return;
                    };
                    fn scenario(
                        harness: &dyn $crate::Harness,
                    ) -> $crate::__private::BoxFuture<'_, ()> {
                        ::std::boxed::Box::pin($crate::$module::$name(harness))
                    }
                    $crate::__private::scenario(
                        &harness,
                        stringify!($name),
                        &[$($crate::__private::Capability::$need),*],
                        scenario,
                    )
                    .await;
                });
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_table {
    (() $($rule:ident [$($need:ident)*] $module:ident :: $name:ident,)*) => {
        &[$(
            $crate::Scenario {
                name: stringify!($name),
                rule: stringify!($rule),
                needs: &[$($crate::__private::Capability::$need),*],
                run: {
                    fn run(harness: &dyn $crate::Harness) -> $crate::__private::BoxFuture<'_, ()> {
                        ::std::boxed::Box::pin($crate::$module::$name(harness))
                    }
                    run
                },
            },
        )*]
    };
}

/// What the suite needs from a backend beyond the [`Store`] handle.
///
/// A harness opens stores on settings the suite chooses (a fresh namespace per test,
/// a [`ManualClock`]), so every test is isolated and drives time itself, and removes
/// each namespace when its test is over, so a run leaves nothing behind on a shared
/// server.
#[async_trait]
pub trait Harness: Send + Sync {
    /// Opens a store on `settings`. Opening a second store with the same namespace
    /// must show the same data, as a reopened file or reconnected client does
    /// (CONTRACT A6); different namespaces must never see each other (CONTRACT C8).
    async fn open(&self, settings: StoreSettings) -> Result<Store>;

    /// Deletes the record of job `id` in `namespace` behind the store's back, leaving
    /// every index entry that points to it in place: what a Redis eviction or TTL
    /// expiry, or a careless operator, does (CONTRACT C7, R5).
    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()>;

    /// Makes the stored record of job `id` in `namespace` unreadable behind the store's
    /// back (a field the backend cannot decode, as a damaged backup or a foreign writer
    /// would leave it), keeping its state, queue and place in the queue. Answers
    /// `false` when the harness cannot make a record unreadable: the scenarios of
    /// CONTRACT C10 are then skipped, and say so. The default answers `false`.
    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        let _ = (namespace, id);
        Ok(false)
    }

    /// Deletes everything stored under `namespace`. Called once per namespace a
    /// scenario opened, after the scenario, whether it passed or not.
    async fn teardown(&self, namespace: &str) -> Result<()>;
}

/// A harness whose stores pass through a layer: the whole suite run on a layer over
/// another backend. Made by [`HarnessExt::layered`].
pub struct Layered<H, F> {
    harness: H,
    wrap: F,
}

#[async_trait]
impl<H, F> Harness for Layered<H, F>
where
    H: Harness,
    F: Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync,
{
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let store = self.harness.open(settings).await?;
        Ok(Store::from((self.wrap)(Arc::clone(store.backend()))))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.harness.vanish(namespace, id).await
    }

    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        self.harness.corrupt(namespace, id).await
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.harness.teardown(namespace).await
    }
}

/// Combinators on every [`Harness`].
pub trait HarnessExt: Harness + Sized {
    /// This harness with every store's backend wrapped by `wrap`: a layer's
    /// constructor, or any [`Layer`]'s `layer` method.
    ///
    /// ```ignore
    /// async fn harness() -> Option<impl Harness> {
    ///     Some(MemoryServer::new().layered(|inner| Arc::new(MyLayer(inner))))
    /// }
    /// durq_conformance::conformance_tests!(harness);
    /// ```
    fn layered<F>(self, wrap: F) -> Layered<Self, F>
    where
        F: Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync,
    {
        Layered {
            harness: self,
            wrap,
        }
    }
}

impl<H: Harness> HarnessExt for H {}

/// The in-memory backend's harness: the reference backend, and the one to wrap when
/// testing a layer.
#[async_trait]
impl Harness for durq_memory::MemoryServer {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        Ok(Store::new(durq_memory::MemoryServer::open(self, settings)?))
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        durq_memory::MemoryServer::vanish(self, namespace, id);
        Ok(())
    }

    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        Ok(durq_memory::MemoryServer::corrupt(self, namespace, id))
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.drop_namespace(namespace);
        Ok(())
    }
}

/// A harness that remembers every namespace opened through it, so the macro's tests
/// can tear each one down after the scenario.
struct Tracked<'h> {
    inner: &'h dyn Harness,
    namespaces: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl<'h> Tracked<'h> {
    fn new(inner: &'h dyn Harness) -> Self {
        Tracked {
            inner,
            namespaces: std::sync::Mutex::default(),
        }
    }

    fn namespaces(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.namespaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn teardown_all(&self) {
        let namespaces = std::mem::take(&mut *self.namespaces());
        for namespace in namespaces {
            if let Err(err) = self.inner.teardown(&namespace).await {
                panic!("the harness could not tear down namespace {namespace}: {err}");
            }
        }
    }
}

#[async_trait]
impl Harness for Tracked<'_> {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        self.namespaces().insert(settings.namespace.clone());
        self.inner.open(settings).await
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.inner.vanish(namespace, id).await
    }

    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        self.inner.corrupt(namespace, id).await
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.inner.teardown(namespace).await
    }
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

/// A manual clock at a fixed instant and default settings on a new namespace named
/// after `prefix`, reading that clock: the world every scenario starts in.
pub(crate) fn fresh_world(prefix: &str) -> (ManualClock, StoreSettings) {
    let clock = ManualClock::default();
    let settings = StoreSettings::default()
        .namespace(unique_namespace(prefix))
        .clock(Arc::new(clock.clone()));
    (clock, settings)
}

impl<'a> TestEnv<'a> {
    /// A fresh environment: a new namespace, a manual clock at a fixed instant, and
    /// default limits otherwise.
    pub fn new(harness: &'a dyn Harness) -> Self {
        let (clock, settings) = fresh_world("t");
        TestEnv {
            harness,
            clock,
            settings,
        }
    }

    /// Opens a store on this environment's namespace and clock. Call it again to get a
    /// second handle on the same data (a reopen).
    pub async fn store(&self) -> Store {
        match self.harness.open(self.settings.clone()).await {
            Ok(store) => store,
            Err(err) => panic!("the harness could not open a store: {err}"),
        }
    }

    /// Opens a store with changed settings on the same namespace and clock.
    pub async fn store_with(&self, change: impl FnOnce(StoreSettings) -> StoreSettings) -> Store {
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

    /// Makes the record of job `id` unreadable under the store; `false` when the
    /// harness cannot.
    pub async fn corrupt(&self, id: JobId) -> bool {
        match self.harness.corrupt(&self.settings.namespace, id).await {
            Ok(done) => done,
            Err(err) => panic!("the harness could not corrupt the record of job {id}: {err}"),
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
    // Written to the process's stderr directly: the test harness captures `eprintln!`
    // of passing tests, which would make the skip silent.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: {service} at {url} is unreachable ({error}).\n*** Start it, or set the URL; CI sets JOBS_REQUIRE_SERVICES=1 and fails here.\n"
    );
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The rule ids of the contract: the bold id (`**E1**`) that opens a top-level
    /// bullet of `durq_core::CONTRACT`, in document order.
    fn contract_rules(contract: &str) -> Vec<String> {
        contract
            .lines()
            .filter_map(|line| line.strip_prefix("- **"))
            .filter_map(|rest| rest.split_once("**"))
            .map(|(id, _)| id)
            .filter(|id| {
                let mut chars = id.chars();
                chars.next().is_some_and(|c| c.is_ascii_uppercase())
                    && chars.as_str().parse::<u32>().is_ok_and(|n| n > 0)
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn contract_rules_are_read_from_rule_bullets_only() {
        let text = "- **E1** a rule\n  - **E2** a nested bullet\n- **Decided** no id\n\
                    **C3** not a bullet\n- **L10** another rule\n- **x1** lower case\n";
        assert_eq!(contract_rules(text), ["E1", "L10"]);
    }

    #[test]
    fn every_rule_has_a_scenario_named_after_it() {
        let rules = contract_rules(durq_core::CONTRACT);
        let mut distinct = HashSet::new();
        for rule in &rules {
            assert!(
                distinct.insert(rule),
                "rule {rule} appears twice in the contract"
            );
        }
        for rule in &rules {
            assert!(
                scenarios_for(rule).next().is_some(),
                "rule {rule} has no scenario"
            );
        }
        let mut names = HashSet::new();
        for scenario in SCENARIOS {
            assert!(
                names.insert(scenario.name),
                "{} listed twice",
                scenario.name
            );
            let prefix = format!("{}_", scenario.rule.to_ascii_lowercase());
            assert!(
                scenario.name.starts_with(&prefix),
                "{} is listed under rule {}",
                scenario.name,
                scenario.rule
            );
            assert!(
                rules.iter().any(|r| r == scenario.rule),
                "{} is listed under rule {}, which the contract does not have",
                scenario.name,
                scenario.rule
            );
        }
    }
}
