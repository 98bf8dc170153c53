//! The suite has teeth: each test wraps the in-memory store in a deliberately broken
//! layer (a *mutant*, one bug each), runs the scenario of the rule the bug breaks, and
//! asserts that the scenario fails on the mutant and passes on the real store.
//!
//! Every mutant is one [`Mutant`]: a [`LayeredBackend`] whose operations go through a
//! [`Bug`]'s hooks. A hook forwards to the real backend unless the bug overrides it,
//! so each bug is written as the one operation it breaks, the way the real bug would
//! sit in a backend.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use durq_conformance::{Harness, Scenario, SCENARIOS};
use durq_core::graph::Dependency;
use durq_core::{
    async_trait, Attempt, AttemptOutcome, Backend, Bytes, Capabilities, ClaimRequest, ClaimedJob,
    Completion, Enqueued, Error, EventCursor, EventPage, Heartbeat, HeldLease, Job, JobId,
    JobState, LayeredBackend, LeaseToken, ListPage, ListQuery, NewJob, Partitioning, QueueLimits,
    QueueOverview, QueueStats, ReclaimedJob, Result, Retry, ScheduleUpdate, StepLog, Store,
    StoreSettings, Timestamp, Uniqueness, LEASE_EXPIRED,
};
use durq_memory::MemoryServer;

// ---------------------------------------------------------------------------------
// The forwarding layer.

/// One deliberate bug. Each hook receives the real backend and, by default, forwards
/// to it; a bug overrides the hook of the operation it breaks.
#[async_trait]
trait Bug: Send + Sync + fmt::Debug + 'static {
    /// The job as the `handle`-th store of its namespace hands it to the backend.
    fn stamp(&self, _handle: usize, job: NewJob, _now: Timestamp) -> NewJob {
        job
    }

    /// The partitioning the mutant declares (CONTRACT §8); by default the store's.
    fn partitioning(&self) -> Option<Partitioning> {
        None
    }

    /// Injects what the bug needs into the server's own logic, when a store of
    /// `namespace` opens; by default nothing.
    fn open(&self, _server: &MemoryServer, _namespace: &str) {}

    /// Makes a record unreadable, as the harness's `corrupt` asks.
    fn corrupt(&self, server: &MemoryServer, namespace: &str, id: JobId) -> bool {
        server.corrupt(namespace, id)
    }

    async fn enqueue(&self, inner: &dyn Backend, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        inner.enqueue(job, now).await
    }

    async fn enqueue_batch(
        &self,
        inner: &dyn Backend,
        jobs: Vec<NewJob>,
        now: Timestamp,
    ) -> Result<Vec<Enqueued>> {
        inner.enqueue_batch(jobs, now).await
    }

    async fn claim(
        &self,
        inner: &dyn Backend,
        request: ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<ClaimedJob>> {
        inner.claim(request, now).await
    }

    async fn heartbeat(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Heartbeat> {
        inner.heartbeat(lease.id, lease.token, ttl, now).await
    }

    async fn complete(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        result: Option<Bytes>,
        now: Timestamp,
    ) -> Result<()> {
        inner.complete(lease.id, lease.token, result, now).await
    }

    async fn fail(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        inner.fail(lease.id, lease.token, error, retry, now).await
    }

    async fn release(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        inner.release(lease.id, lease.token, ready_at, now).await
    }

    async fn reclaim(
        &self,
        inner: &dyn Backend,
        limit: usize,
        now: Timestamp,
    ) -> Result<Vec<ReclaimedJob>> {
        inner.reclaim(limit, now).await
    }

    async fn wait_for_ending(
        &self,
        inner: &dyn Backend,
        id: JobId,
        timeout: Duration,
    ) -> Result<Option<Job>> {
        inner.wait_for_ending(id, timeout).await
    }

    async fn stats(&self, inner: &dyn Backend, queue: &str, now: Timestamp) -> Result<QueueStats> {
        inner.require_inspect()?.stats(queue, now).await
    }

    async fn set_paused(&self, inner: &dyn Backend, queue: &str, paused: bool) -> Result<()> {
        inner.require_pause()?.set_paused(queue, paused).await
    }

    async fn set_limits(
        &self,
        inner: &dyn Backend,
        queue: &str,
        limits: QueueLimits,
    ) -> Result<()> {
        inner
            .require_flow_control()?
            .set_limits(queue, limits)
            .await
    }

    async fn queues(&self, inner: &dyn Backend, now: Timestamp) -> Result<Vec<QueueOverview>> {
        inner.require_inspect()?.queues(now).await
    }

    async fn reap_workers(&self, inner: &dyn Backend, cutoff: Timestamp) -> Result<Vec<String>> {
        inner.require_worker_registry()?.reap_workers(cutoff).await
    }

    async fn list(&self, inner: &dyn Backend, query: ListQuery) -> Result<ListPage> {
        inner.require_inspect()?.list(query).await
    }

    async fn attempts(&self, inner: &dyn Backend, id: JobId) -> Result<Vec<Attempt>> {
        inner.require_inspect()?.attempts(id).await
    }

    async fn get(&self, inner: &dyn Backend, id: JobId) -> Result<durq_core::Job> {
        inner.get(id).await
    }

    async fn update_schedule(
        &self,
        inner: &dyn Backend,
        name: &str,
        update: ScheduleUpdate,
    ) -> Result<()> {
        inner
            .require_schedules()?
            .update_schedule(name, update)
            .await
    }

    async fn steps(&self, inner: &dyn Backend, id: JobId) -> Result<StepLog> {
        inner.require_steps()?.steps(id).await
    }

    async fn save_step(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        inner
            .require_steps()?
            .save_step(lease.id, lease.token, name, output, now)
            .await
    }

    async fn retry_from(
        &self,
        inner: &dyn Backend,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        inner
            .require_steps()?
            .retry_from(id, step, generation, now)
            .await
    }

    async fn events(
        &self,
        inner: &dyn Backend,
        after: EventCursor,
        limit: usize,
    ) -> Result<EventPage> {
        inner.require_events()?.events(after, limit).await
    }

    async fn emit(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        inner
            .require_events()?
            .emit(lease.id, lease.token, name, data, now)
            .await
    }
}

/// The real backend behind one bug, opened as the `handle`-th store of its namespace
/// (0 for the first), for bugs that live in one handle's state.
#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Backend>,
    bug: Arc<dyn Bug>,
    handle: usize,
}

#[async_trait]
impl LayeredBackend for Mutant {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn capabilities(&self) -> Capabilities {
        let capabilities = self.inner.capabilities();
        match self.bug.partitioning() {
            Some(partitioning) => capabilities.partitioning(Some(partitioning)),
            None => capabilities,
        }
    }

    async fn enqueue(&self, job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let job = self.bug.stamp(self.handle, job, now);
        self.bug.enqueue(&*self.inner, job, now).await
    }

    async fn enqueue_batch(&self, jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let jobs = jobs
            .into_iter()
            .map(|job| self.bug.stamp(self.handle, job, now))
            .collect();
        self.bug.enqueue_batch(&*self.inner, jobs, now).await
    }

    async fn claim(&self, request: ClaimRequest, now: Timestamp) -> Result<Vec<ClaimedJob>> {
        self.bug.claim(&*self.inner, request, now).await
    }

    async fn heartbeat_batch(
        &self,
        leases: Vec<HeldLease>,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Heartbeat>>> {
        // Each entry through the bug's `heartbeat` hook: single heartbeats arrive here as
        // batches of one, so a broken heartbeat is broken in both.
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            answers.push(self.bug.heartbeat(&*self.inner, lease, ttl, now).await);
        }
        Ok(answers)
    }

    async fn complete_batch(
        &self,
        completions: Vec<Completion>,
        now: Timestamp,
    ) -> Result<Vec<Result<()>>> {
        // Each entry through the bug's `complete` hook: single completions arrive here as
        // batches of one, so a broken complete is broken in both.
        let mut answers = Vec::with_capacity(completions.len());
        for Completion { id, token, result } in completions {
            let lease = HeldLease::new(id, token);
            answers.push(self.bug.complete(&*self.inner, lease, result, now).await);
        }
        Ok(answers)
    }

    async fn fail(
        &self,
        id: JobId,
        token: LeaseToken,
        error: &str,
        retry: Retry,
        now: Timestamp,
    ) -> Result<JobState> {
        let lease = HeldLease::new(id, token);
        self.bug.fail(&*self.inner, lease, error, retry, now).await
    }

    async fn release(
        &self,
        id: JobId,
        token: LeaseToken,
        ready_at: Timestamp,
        now: Timestamp,
    ) -> Result<()> {
        let lease = HeldLease::new(id, token);
        self.bug.release(&*self.inner, lease, ready_at, now).await
    }

    async fn reclaim(&self, limit: usize, now: Timestamp) -> Result<Vec<ReclaimedJob>> {
        self.bug.reclaim(&*self.inner, limit, now).await
    }

    async fn wait_for_ending(&self, id: JobId, timeout: Duration) -> Result<Option<Job>> {
        self.bug.wait_for_ending(&*self.inner, id, timeout).await
    }

    async fn stats(&self, queue: &str, now: Timestamp) -> Result<QueueStats> {
        self.bug.stats(&*self.inner, queue, now).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.bug.set_paused(&*self.inner, queue, paused).await
    }

    async fn set_limits(&self, queue: &str, limits: QueueLimits) -> Result<()> {
        self.bug.set_limits(&*self.inner, queue, limits).await
    }

    async fn queues(&self, now: Timestamp) -> Result<Vec<QueueOverview>> {
        self.bug.queues(&*self.inner, now).await
    }

    async fn reap_workers(&self, cutoff: Timestamp) -> Result<Vec<String>> {
        self.bug.reap_workers(&*self.inner, cutoff).await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.bug.list(&*self.inner, query).await
    }

    async fn attempts(&self, id: JobId) -> Result<Vec<Attempt>> {
        self.bug.attempts(&*self.inner, id).await
    }

    async fn get(&self, id: JobId) -> Result<durq_core::Job> {
        self.bug.get(&*self.inner, id).await
    }

    async fn update_schedule(&self, name: &str, update: ScheduleUpdate) -> Result<()> {
        self.bug.update_schedule(&*self.inner, name, update).await
    }

    async fn steps(&self, id: JobId) -> Result<StepLog> {
        self.bug.steps(&*self.inner, id).await
    }

    async fn save_step(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        output: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let lease = HeldLease::new(id, token);
        self.bug
            .save_step(&*self.inner, lease, name, output, now)
            .await
    }

    async fn retry_from(
        &self,
        id: JobId,
        step: &str,
        generation: u64,
        now: Timestamp,
    ) -> Result<()> {
        self.bug
            .retry_from(&*self.inner, id, step, generation, now)
            .await
    }

    async fn events(&self, after: EventCursor, limit: usize) -> Result<EventPage> {
        self.bug.events(&*self.inner, after, limit).await
    }

    async fn emit(
        &self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let lease = HeldLease::new(id, token);
        self.bug.emit(&*self.inner, lease, name, data, now).await
    }
}

/// Opens real in-memory stores, each wrapped in the harness's bug when it has one.
/// One bug instance serves every store the harness opens, as one buggy backend
/// serves every connection.
struct MemoryHarness {
    server: MemoryServer,
    bug: Option<Arc<dyn Bug>>,
    /// How many stores were opened per namespace.
    opened: Mutex<HashMap<String, usize>>,
}

impl MemoryHarness {
    fn real() -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: None,
            opened: Mutex::default(),
        })
    }

    fn mutant(bug: impl Bug) -> Arc<dyn Harness> {
        Arc::new(MemoryHarness {
            server: MemoryServer::new(),
            bug: Some(Arc::new(bug)),
            opened: Mutex::default(),
        })
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn open(&self, settings: StoreSettings) -> Result<Store> {
        let handle = {
            let mut opened = lock(&self.opened);
            let count = opened.entry(settings.namespace.clone()).or_default();
            *count += 1;
            *count - 1
        };
        if let Some(bug) = &self.bug {
            bug.open(&self.server, &settings.namespace);
        }
        let inner: Arc<dyn Backend> = Arc::new(self.server.open(settings)?);
        Ok(match &self.bug {
            Some(bug) => Store::new(Mutant {
                inner,
                bug: Arc::clone(bug),
                handle,
            }),
            None => Store::from(inner),
        })
    }

    async fn vanish(&self, namespace: &str, id: JobId) -> Result<()> {
        self.server.vanish(namespace, id);
        Ok(())
    }

    async fn corrupt(&self, namespace: &str, id: JobId) -> Result<bool> {
        Ok(match &self.bug {
            Some(bug) => bug.corrupt(&self.server, namespace, id),
            None => self.server.corrupt(namespace, id),
        })
    }

    async fn teardown(&self, namespace: &str) -> Result<()> {
        self.server.drop_namespace(namespace);
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------
// The bugs, one struct each, by the part of the contract they break.

mod claims_and_leases;
mod dependencies;
mod events;
mod reads_admin_and_fit;
mod results;
mod steps;

use claims_and_leases::*;
use dependencies::*;
use events::*;
use reads_admin_and_fit::*;
use results::*;
use steps::*;

// ---------------------------------------------------------------------------------
// Running scenarios.

fn scenario(name: &str) -> &'static Scenario {
    match SCENARIOS.iter().find(|s| s.name == name) {
        Some(scenario) => scenario,
        None => panic!(
            "no scenario named {name}; the suite has: {:?}",
            SCENARIOS.iter().map(|s| s.name).collect::<Vec<_>>()
        ),
    }
}

/// Runs a scenario in its own task: `true` if it passed, `false` if it panicked (the
/// way a scenario reports a broken rule).
async fn passes(harness: Arc<dyn Harness>, scenario: &'static Scenario) -> bool {
    let run = tokio::spawn(async move { (scenario.run)(&*harness).await });
    match run.await {
        Ok(()) => true,
        Err(err) if err.is_panic() => false,
        Err(err) => panic!("{} did not run to an end: {err}", scenario.name),
    }
}

/// The scenario passes on the real store (the control) and fails on the mutant.
async fn caught(mutant: impl Bug, name: &str) {
    let scenario = scenario(name);
    assert!(
        passes(MemoryHarness::real(), scenario).await,
        "control: {name} must pass on the real in-memory store"
    );
    let description = format!("{mutant:?}");
    assert!(
        !passes(MemoryHarness::mutant(mutant), scenario).await,
        "{name} passed on the mutant {description}: the rule has no teeth against this bug"
    );
}

/// M1 fails on the mutant. (M1 on the real store is the memory backend's own
/// conformance test, and `tests/model_check.rs` here.)
async fn caught_by_m1(mutant: impl Bug) {
    caught(mutant, "m1_model_check").await;
}

// ---------------------------------------------------------------------------------
// The tests: `<mutant>_is_caught_by_<rule>`.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_claim_is_caught_by_c2() {
    caught(DoubleClaim::default(), "c2_claim_once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_claim_is_caught_by_m1() {
    caught_by_m1(DoubleClaim::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reversed_fifo_is_caught_by_c3() {
    caught(ReversedFifo, "c3_fifo_at_one_instant").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reversed_fifo_is_caught_by_m1() {
    caught_by_m1(ReversedFifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placement_ignoring_parents_is_caught_by_p1() {
    caught(
        PlacementIgnoresParents,
        "p1_jobs_live_with_their_key_or_parent_and_others_spread",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placement_ignoring_concurrency_keys_is_caught_by_p3() {
    caught(
        PlacementIgnoresConcurrencyKeys,
        "p3_a_keys_jobs_share_a_partition_and_keep_its_limits",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_stopping_at_one_partition_is_caught_by_p2() {
    caught(
        ClaimStopsAtOnePartition,
        "p2_claims_keep_the_order_within_each_partition",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_counted_before_the_claims_writes_are_caught_by_k1() {
    caught(
        CountsLimitsBeforeItsWrites,
        "k1_a_key_at_its_limit_is_passed_over_for_the_jobs_behind_it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_counted_before_the_claims_writes_are_caught_by_the_k1_history() {
    caught(
        CountsLimitsBeforeItsWrites,
        "k1_concurrent_claimers_never_run_more_of_a_key_than_its_limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_counted_before_the_claims_writes_are_caught_by_k2() {
    caught(
        CountsLimitsBeforeItsWrites,
        "k2_a_queue_at_its_running_limit_gives_no_more_jobs",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_window_on_the_callers_clock_is_caught_by_k4() {
    caught(
        RateWindowOnTheCallersClock,
        "k4_a_rate_admits_at_most_its_starts_in_any_window",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_window_on_the_callers_clock_is_caught_by_the_k4_history() {
    caught(
        RateWindowOnTheCallersClock,
        "k4_concurrent_claimers_never_start_more_than_the_rate_in_any_window",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_that_restart_at_the_same_key_are_caught_by_k5() {
    caught(
        TurnsRestartAtTheSameKey,
        "k5_claims_take_turns_over_the_keys_of_a_fair_queue",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fitted_claims_ignoring_limits_are_caught_by_k1() {
    caught(FittedClaimsIgnoreLimits, "k1_fitted_claims_keep_the_limits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removed_rates_keeping_their_starts_are_caught_by_k4() {
    caught(
        RemovedRatesKeepTheirStarts,
        "k4_limits_without_a_rate_forget_the_starts",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unfair_limits_keeping_the_turns_are_caught_by_k5() {
    caught(
        UnfairLimitsKeepTheTurns,
        "k5_limits_without_fair_shares_forget_the_turns",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_before_the_preference_are_caught_by_k1() {
    caught(
        LimitsBeforePreference,
        "k1_a_preferring_claim_admits_in_its_own_order",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fan_in_released_by_its_first_dependency_is_caught_by_g1() {
    caught(
        ReleaseOnFirstDependency,
        "g1_a_job_waits_until_every_dependency_succeeded",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_dependencies_counted_as_met_are_caught_by_g3() {
    caught(
        DependencyFailuresIgnored,
        "g3_a_failed_dependency_cancels_its_dependents_in_turn",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_job_freeing_its_unique_key_is_caught_by_e10() {
    caught(
        WaitingFreesUniqueKeys,
        "e10_a_waiting_job_holds_its_unique_key",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_that_answers_before_the_ending_is_caught_by_o1() {
    caught(WaitAnswersAtOnce, "o1_wait_answers_an_ended_job_as_stored").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_no_ending_wakes_is_caught_by_o2() {
    caught(
        WaitHearsNoEndings,
        "o2_waiters_are_woken_by_endings_from_other_handles",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_saved_without_the_lease_is_caught_by_d1() {
    caught(
        StepSavedWithoutTheLease,
        "d1_a_step_is_saved_under_the_lease_and_the_first_save_stands",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn steps_read_by_name_are_caught_by_d2() {
    caught(
        StepsReadByName,
        "d2_steps_are_read_in_save_order_and_outlive_the_run",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopen_cutting_only_the_last_step_is_caught_by_d3() {
    caught(
        ReopenCutsOnlyTheLastStep,
        "d3_retry_from_reopens_an_ended_job_from_a_step",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopen_checked_apart_from_its_change_is_caught_by_d4() {
    caught(
        ReopenChecksApart,
        "d4_concurrent_reopens_have_exactly_one_winner",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emit_without_the_lease_is_caught_by_v1() {
    caught(
        EmitWithoutTheLease,
        "v1_each_change_of_a_recording_job_is_recorded_in_order",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_next_at_the_first_event_is_caught_by_v2() {
    caught(
        NextAtTheFirstEvent,
        "v2_events_are_read_in_order_and_resumed_from_next",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trim_that_is_never_told_is_caught_by_v3() {
    caught(
        TrimNeverTold,
        "v3_a_trim_keeps_the_newest_and_says_what_was_lost",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_visible_out_of_order_are_caught_by_v4() {
    caught(
        EventsVisibleOutOfOrder,
        "v4_writers_and_a_reader_see_each_event_once_in_order",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_leaving_dependents_is_caught_by_g3() {
    caught(
        ReleaseLeavesDependents,
        "g3_a_dependency_cancelled_while_running_settles_at_its_release",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_indexes_dropped_are_caught_by_g2() {
    caught(BatchIndexesDropped, "g2_a_batch_enqueues_a_graph_at_once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlimited_limits_ignored_are_caught_by_k3() {
    caught(
        UnlimitedLimitsAreIgnored,
        "k3_limits_are_stored_per_queue_and_applied_by_the_next_claim",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reversed_fifo_on_partitions_is_caught_by_p2() {
    caught(
        Partitioned(ReversedFifo),
        "p2_claims_keep_the_order_within_each_partition",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reclaim_at_expiry_is_caught_by_r2() {
    caught(
        ReclaimAtExpiry::default(),
        "r2_lease_expiring_now_is_not_expired",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reclaim_at_expiry_is_caught_by_m1() {
    caught_by_m1(ReclaimAtExpiry::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_l2() {
    caught(
        CompleteIgnoresToken,
        "l2_stale_token_is_lease_lost_and_changes_nothing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_l9() {
    caught(
        CompleteIgnoresToken,
        "l9_old_holder_is_fenced_after_reclaim",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn complete_ignoring_token_is_caught_by_m1() {
    caught_by_m1(CompleteIgnoresToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_then_set_dedup_is_caught_by_e4() {
    caught(
        CheckThenSetDedup::default(),
        "e4_concurrent_enqueues_of_one_key_create_one_job",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_faking_vanished_job_is_caught_by_l3() {
    caught(
        HeartbeatFakesVanished,
        "l3_calls_on_vanished_job_are_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeat_faking_unknown_job_is_caught_by_l3() {
    caught(
        HeartbeatFakesVanished,
        "l3_calls_on_unknown_job_are_not_found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequence_per_handle_is_caught_by_c3() {
    caught(SequencePerHandle, "c3_fifo_holds_across_handles").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_and_fail_checking_then_writing_are_caught_by_l9() {
    caught(
        CheckThenWriteLease::default(),
        "l9_holder_racing_reclaim_has_one_winner",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_by_prefix_is_caught_by_a3() {
    caught(
        StatsByPrefix::default(),
        "a3_stats_of_queues_sharing_a_prefix_are_apart",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forgotten_pause_is_caught_by_q1() {
    caught(
        PauseForgotten,
        "q1_paused_queue_is_not_claimed_until_resumed",
    )
    .await;
    caught(
        PauseForgotten,
        "q1_a_claim_skips_paused_queues_before_its_limit",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaping_at_the_cutoff_is_caught_by_w4() {
    caught(
        ReapAtTheCutoff,
        "w4_silent_workers_are_reaped_and_their_jobs_left",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prefix_as_pattern_is_caught_by_a4() {
    caught(
        PrefixAsPattern,
        "a4_queue_prefix_is_literal_and_case_sensitive",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_tags_are_caught_by_a4() {
    caught(TagsIgnored, "a4_list_filters_by_tenant_and_tags_exactly").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_tenant_listing_all_is_caught_by_a4() {
    caught(
        DefaultTenantListsAll,
        "a4_list_filters_by_tenant_and_tags_exactly",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_leaving_no_attempt_is_caught_by_h2() {
    caught(
        ReleaseLeavesNoAttempt,
        "h2_each_ending_is_recorded_with_its_outcome_and_error",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_last_error_is_caught_by_l4_and_a2() {
    caught(
        StaleLastError::default(),
        "l4_a_succeeded_job_shows_no_error_of_an_earlier_attempt",
    )
    .await;
    caught(
        StaleLastError::default(),
        "a2_retry_dead_job_requeues_with_attempts_reset",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncut_attempt_error_is_caught_by_h2() {
    caught(
        AttemptErrorUncut::default(),
        "h2_an_attempts_error_is_cut_at_4_kib",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keeping_the_oldest_attempts_is_caught_by_h3() {
    caught(OldestAttemptsKept, "h3_only_the_newest_attempts_are_kept").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lag_from_the_head_is_caught_by_a7() {
    caught(
        LagFromTheHead,
        "a7_queues_list_every_queue_with_counts_pause_and_lag",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn firing_that_reenables_is_caught_by_s2() {
    caught(
        FiringReenables,
        "s2_a_disable_survives_a_firing_that_races_it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tick_key_per_scheduler_is_caught_by_s3() {
    caught(
        TickKeyPerScheduler,
        "s3_concurrent_schedulers_fire_each_tick_once",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snooze_ready_now_is_caught_by_l10() {
    caught(SnoozeReadyNow, "l10_snooze_waits_without_using_an_attempt").await;
    caught(SnoozeReadyNow, "l10_snoozed_job_comes_due_in_order").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_by_window_is_caught_by_e10() {
    caught(
        UniqueByWindow,
        "e10_unique_while_active_holds_until_the_job_finishes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_budget_is_caught_by_f2_f3_f4() {
    caught(BudgetIgnored, "f2_budget_amounts_filter").await;
    caught(BudgetIgnored, "f3_capabilities_match_exactly").await;
    caught(BudgetIgnored, "f4_order_then_truncate_among_fitting_jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_then_filter_is_caught_by_f4() {
    caught(ClaimThenFilter, "f4_order_then_truncate_among_fitting_jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preference_bugs_are_caught_by_f5() {
    caught(
        PreferenceIgnored,
        "f5_locality_reorders_within_a_priority_band",
    )
    .await;
    caught(
        PreferenceFilters,
        "f5_locality_reorders_within_a_priority_band",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ignored_reservation_is_caught_by_f6() {
    caught(ReservationIgnored, "f6_reserved_claims_only_that_job").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decode_after_lease_is_caught_by_c10() {
    caught(
        DecodeAfterLease::default(),
        "c10_a_corrupt_record_is_buried_and_the_claim_goes_on",
    )
    .await;
}
