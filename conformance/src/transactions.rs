//! The caller's transactions (CONTRACT §7): what a backend that writes jobs inside a
//! transaction its caller opened must give the suite, so the scenarios of
//! `rules/transactions.rs` can prove T1 and T3 on it.
//!
//! The transactional calls take each backend's own transaction type (an
//! `sqlx::Transaction`, a `rusqlite` connection), so the suite cannot call them through
//! the `Store` handle. A [`TransactionHarness`] makes them uniform: it begins a
//! transaction on the database behind the stores it opens and hands it back as a
//! [`CallerTransaction`], a boxed object that enqueues, completes and writes a row of
//! the caller's own, then commits or rolls back.

use durq_core::{
    async_trait, Bytes, Enqueued, FencedCompletion, JobId, LeaseToken, ManualClock, NewJob, Result,
    Store, StoreSettings,
};
use futures::future::BoxFuture;

use crate::{fresh_world, Harness};

/// A transaction the caller opened on the store's database, with the backend's
/// transactional calls (CONTRACT §7) and a row of the caller's own to write beside
/// them. Made by [`TransactionHarness::begin`].
#[async_trait]
pub trait CallerTransaction: Send {
    /// Writes the caller's own row `mark` (in a table of the harness's, under the
    /// transaction's namespace): the business write that must commit with the jobs or
    /// not at all.
    async fn write_row(&mut self, mark: &str) -> Result<()>;

    /// Enqueues `job` in the transaction (`enqueue_in`, `SqliteTransaction::enqueue`).
    async fn enqueue(&mut self, job: NewJob) -> Result<Enqueued>;

    /// Enqueues `jobs` in the transaction, all or none (E9).
    async fn enqueue_batch(&mut self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>>;

    /// Completes job `id` under lease `token` in the transaction, storing `result` (T3).
    async fn complete(
        &mut self,
        id: JobId,
        token: LeaseToken,
        result: Option<Bytes>,
    ) -> Result<FencedCompletion>;

    /// Commits the transaction. A transaction a refused completion spoiled (T3) commits
    /// nothing: it answers that refusal (SQLite) or `Ok` for a commit the database
    /// turned into a rollback (PostgreSQL); the scenarios check what was written, not
    /// which of the two the backend answers.
    async fn commit(self: Box<Self>) -> Result<()>;

    /// Rolls the transaction back.
    async fn rollback(self: Box<Self>) -> Result<()>;
}

/// A [`Harness`] whose backend also writes jobs in the caller's transactions
/// (CONTRACT §7). Implement it beside [`Harness`] and add
/// [`transaction_tests!`](crate::transaction_tests) to run the transaction scenarios.
#[async_trait]
pub trait TransactionHarness: Harness {
    /// Begins a transaction on the database behind the stores this harness opens on
    /// `settings`, whose jobs are those stores' (same namespace, same clock).
    async fn begin(&self, settings: &StoreSettings) -> Result<Box<dyn CallerTransaction>>;

    /// Whether the caller's row `mark` of `namespace` is committed, read outside any
    /// transaction.
    async fn row_committed(&self, namespace: &str, mark: &str) -> Result<bool>;
}

/// A transaction scenario's entry point.
pub type TransactionScenarioFn =
    for<'a> fn(&'a dyn TransactionHarness, &'a TransactionEnv) -> BoxFuture<'a, ()>;

/// One test's world for a transaction scenario: a namespace no other test uses and a
/// manual clock, as [`TestEnv`](crate::TestEnv) gives the other scenarios.
pub struct TransactionEnv {
    /// The clock every store and transaction of this test reads.
    pub clock: ManualClock,
    /// The settings stores and transactions of this test are opened with.
    pub settings: StoreSettings,
}

impl TransactionEnv {
    fn new() -> Self {
        let (clock, settings) = fresh_world("tx");
        TransactionEnv { clock, settings }
    }

    /// Opens a store on this environment's namespace and clock.
    pub async fn store(&self, harness: &dyn TransactionHarness) -> Store {
        match harness.open(self.settings.clone()).await {
            Ok(store) => store,
            Err(err) => panic!("the harness could not open a store: {err}"),
        }
    }

    /// Begins a caller's transaction on this environment's namespace.
    pub async fn begin(&self, harness: &dyn TransactionHarness) -> Box<dyn CallerTransaction> {
        match harness.begin(&self.settings).await {
            Ok(tx) => tx,
            Err(err) => panic!("the harness could not begin a transaction: {err}"),
        }
    }

    /// Whether the caller's row `mark` is committed.
    pub async fn row_committed(&self, harness: &dyn TransactionHarness, mark: &str) -> bool {
        match harness.row_committed(&self.settings.namespace, mark).await {
            Ok(committed) => committed,
            Err(err) => panic!("the harness could not read row {mark}: {err}"),
        }
    }
}

#[doc(hidden)]
pub mod __private {
    use super::*;

    /// Runs a transaction scenario against `harness`, then removes its namespace
    /// (jobs and the caller's rows) whether it passed or panicked, and re-raises its
    /// panic.
    pub async fn transaction_scenario(
        harness: &dyn TransactionHarness,
        scenario: TransactionScenarioFn,
    ) {
        use futures::FutureExt as _;
        let env = TransactionEnv::new();
        let outcome = std::panic::AssertUnwindSafe(scenario(harness, &env))
            .catch_unwind()
            .await;
        if let Err(err) = harness.teardown(&env.settings.namespace).await {
            eprintln!(
                "could not remove namespace {}: {err}",
                env.settings.namespace
            );
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Generates one `#[test]` per transaction scenario (CONTRACT §7) for a
/// [`TransactionHarness`], as [`conformance_tests!`](crate::conformance_tests) does for
/// the rest of the suite: `$harness` is an async function or closure answering
/// `Option<impl TransactionHarness>` (`None` skips, see [`skip_or_fail`](crate::skip_or_fail)).
///
/// ```ignore
/// durq_conformance::transaction_tests!(harness);
/// ```
#[macro_export]
macro_rules! transaction_tests {
    ($harness:expr $(,)?) => {
        $crate::__transaction_scenario_list!(__transaction_tests_expand!($harness));
    };
}

/// The one list of transaction scenarios, `RULE module::name,` per scenario.
#[doc(hidden)]
#[macro_export]
macro_rules! __transaction_scenario_list {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! {
            ($($args)*)
            T1 transactions::t1_a_job_exists_only_if_its_transaction_commits,
            T1 transactions::t1_transactions_enqueueing_one_key_make_one_job,
            T1 transactions::t1_bad_input_writes_nothing_and_leaves_the_transaction_usable,
            T3 transactions::t3_a_fenced_completion_commits_with_the_callers_row,
            T3 transactions::t3_a_stale_lease_refuses_the_whole_transaction,
            T3 transactions::t3_a_fenced_completion_settles_the_jobs_waiting_for_it,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __transaction_tests_expand {
    (($harness:expr) $($rule:ident $module:ident :: $name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                $crate::__private::run(async {
                    let Some(harness) = ($harness)().await else {
                        return;
                    };
                    fn scenario<'a>(
                        harness: &'a dyn $crate::TransactionHarness,
                        env: &'a $crate::TransactionEnv,
                    ) -> $crate::__private::BoxFuture<'a, ()> {
                        ::std::boxed::Box::pin($crate::rules::$module::$name(harness, env))
                    }
                    $crate::transactions::__private::transaction_scenario(&harness, scenario)
                        .await;
                });
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __transaction_scenario_table {
    (() $($rule:ident $module:ident :: $name:ident,)*) => {
        &[$(
            $crate::TransactionScenario {
                name: stringify!($name),
                rule: stringify!($rule),
                run: {
                    fn run<'a>(
                        harness: &'a dyn $crate::TransactionHarness,
                        env: &'a $crate::TransactionEnv,
                    ) -> $crate::__private::BoxFuture<'a, ()> {
                        ::std::boxed::Box::pin($crate::rules::$module::$name(harness, env))
                    }
                    run
                },
            },
        )*]
    };
}

/// One transaction scenario: its name (the name of its generated test), the rule of
/// CONTRACT §7 it checks, and its entry point.
#[derive(Clone, Copy)]
pub struct TransactionScenario {
    /// The scenario's name, e.g. `"t3_a_stale_lease_refuses_the_whole_transaction"`.
    pub name: &'static str,
    /// The rule it checks, e.g. `"T3"`.
    pub rule: &'static str,
    /// The scenario itself; run it with [`TransactionScenario::check`].
    pub run: TransactionScenarioFn,
}

impl std::fmt::Debug for TransactionScenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionScenario")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

impl TransactionScenario {
    /// Runs the scenario against `harness` in a fresh namespace, removed afterwards
    /// whether it passed or not; panics, as the scenario does, when the backend
    /// breaks the rule. For tools that run scenarios themselves, such as mutant tests.
    pub async fn check(&self, harness: &dyn TransactionHarness) {
        __private::transaction_scenario(harness, self.run).await;
    }
}

/// Every transaction scenario, in the order the suite runs them.
pub const TRANSACTION_SCENARIOS: &[TransactionScenario] =
    crate::__transaction_scenario_list!(__transaction_scenario_table!());
