//! [`MemoryServer`]: what a memory backend is opened on, as the other backends are
//! opened from their `…Config`. It holds the data, as a database server would, so it
//! is a server rather than a configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use durq_core::validate::validate_settings;
#[cfg(feature = "testing")]
use durq_core::JobId;
use durq_core::{Result, StoreSettings};

use crate::store::Namespace;
use crate::MemoryBackend;

/// Plays the part of a database server: stores opened on it with the same namespace
/// share their data, as reconnecting clients would, and namespaces are isolated.
#[derive(Debug, Clone, Default)]
pub struct MemoryServer {
    namespaces: Arc<Mutex<HashMap<String, Arc<Namespace>>>>,
}

impl MemoryServer {
    /// An empty server.
    pub fn new() -> Self {
        MemoryServer::default()
    }

    fn namespace(&self, name: &str) -> Arc<Namespace> {
        let mut namespaces = self
            .namespaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(namespaces.entry(name.to_owned()).or_default())
    }

    /// Opens a store on `settings.namespace`, creating the namespace if it is new.
    pub fn open(&self, settings: StoreSettings) -> Result<MemoryBackend> {
        validate_settings(&settings)?;
        let namespace = self.namespace(&settings.namespace);
        Ok(MemoryBackend::on(namespace, settings))
    }

    /// Forgets namespace `name` and all its data, as dropping a database would; stores
    /// still open on it keep the old data, but no store opened later sees it.
    pub fn drop_namespace(&self, name: &str) {
        self.namespaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(name);
    }

    /// Deletes the record of job `id` while leaving every index entry that points to
    /// it, as an eviction would. For fault-injection tests (CONTRACT C7, R5).
    /// Returns whether the record existed.
    #[cfg(feature = "testing")]
    pub fn vanish(&self, namespace: &str, id: JobId) -> bool {
        self.namespace(namespace).lock().vanish(id)
    }

    /// Injects a bug into the namespace's claims: they count the jobs running before
    /// them against the queues' limits, but not the jobs they take themselves, as a
    /// backend that reads a limit before its claim's writes would (CONTRACT K1, K2).
    /// For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn count_limits_once(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().count_limits_once(on);
    }

    /// Injects a bug into the namespace's claims: they read the queues' rate windows on
    /// the machine's clock instead of the `now` they are given, as a backend that
    /// counts starts on the caller's clock would (CONTRACT K4). For the conformance
    /// suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn rate_on_system_clock(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().rate_on_system_clock(on);
    }

    /// Injects a bug into the namespace's claims: they never move a fair queue's turn
    /// on, so each starts its turns at the same key, as a rotation that forgets where
    /// it stopped would (CONTRACT K5). For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn turns_restart(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().turns_restart(on);
    }

    /// Injects a bug into the namespace's fitted claims (a budget, a preference, a
    /// reservation): they apply no limits, as a backend that enforces them only in its
    /// plain claim would (CONTRACT K1, K2, K4). For the conformance suite's mutant
    /// tests only.
    #[cfg(feature = "testing")]
    pub fn fitted_claims_ignore_limits(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().fitted_ignore_limits(on);
    }

    /// Injects a bug into the namespace's `set_limits`: limits without a rate keep the
    /// queue's starts, so a rate set again counts the starts taken under the old one,
    /// as a backend that leaves the logs to housekeeping would (CONTRACT K4). For the
    /// conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn rates_keep_starts(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().rates_keep_starts(on);
    }

    /// Injects a bug into the namespace's `set_limits`: limits without fair shares
    /// keep the queue's turns, so fair shares set again go on from the old turn, as a
    /// backend that never deletes a turn would (CONTRACT K5). For the conformance
    /// suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn unfair_keeps_turns(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().unfair_keeps_turns(on);
    }

    /// Injects a bug into the namespace's preferring claims: they admit a limited
    /// queue's jobs in ready order and only then put the preferred ones first, so a
    /// key's slot goes to a job the preference ranks lower (CONTRACT K1, F5). For the
    /// conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn limits_before_preference(&self, namespace: &str, on: bool) {
        self.namespace(namespace)
            .lock()
            .limits_before_preference(on);
    }

    /// Releases a waiting job when the first job it waits for succeeds, not the last:
    /// the fan-in mutant (CONTRACT G1). For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn release_on_first_dependency(&self, namespace: &str, on: bool) {
        self.namespace(namespace)
            .lock()
            .release_on_first_dependency(on);
    }

    /// Counts a dependency that ended dead or cancelled as met for every policy: the
    /// failure-policy mutant (CONTRACT G3). For the conformance suite's mutant tests
    /// only.
    #[cfg(feature = "testing")]
    pub fn ignore_dependency_failures(&self, namespace: &str, on: bool) {
        self.namespace(namespace)
            .lock()
            .ignore_dependency_failures(on);
    }

    /// Counts only queued and running jobs as holding a key unique while active, so a
    /// waiting job's key is taken by the next enqueue: the mutant of CONTRACT E10's
    /// decided bullet on waiting jobs. For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn waiting_frees_unique_keys(&self, namespace: &str, on: bool) {
        self.namespace(namespace)
            .lock()
            .waiting_frees_unique_keys(on);
    }

    /// Ends a released cancel-requested job without settling the jobs waiting for it:
    /// the mutant of a release with no graph (CONTRACT G3). For the conformance suite's
    /// mutant tests only.
    #[cfg(feature = "testing")]
    pub fn release_leaves_dependents(&self, namespace: &str, on: bool) {
        self.namespace(namespace)
            .lock()
            .release_leaves_dependents(on);
    }

    /// Makes `retry_from` check the job under one hold of the namespace's lock and
    /// reopen it under another, so concurrent reopens of one generation can all win:
    /// the mutant of CONTRACT D4. For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn reopen_checks_apart(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().reopen_checks_apart(on);
    }

    /// Makes every other event of the namespace's stream visible only after the one
    /// recorded after it, as rows numbered by a sequence become visible in commit
    /// order: the mutant of CONTRACT V4. For the conformance suite's mutant tests only.
    #[cfg(feature = "testing")]
    pub fn events_out_of_order(&self, namespace: &str, on: bool) {
        self.namespace(namespace).lock().events_out_of_order(on);
    }

    /// Marks the record of job `id` as one the store cannot read, standing for the
    /// damaged record a backend with a storage format can hold: a claim that meets it
    /// buries it (`dead`, its error saying why) instead of leasing it. For
    /// fault-injection tests (CONTRACT C10). Returns whether the record exists.
    #[cfg(feature = "testing")]
    pub fn corrupt(&self, namespace: &str, id: JobId) -> bool {
        self.namespace(namespace).lock().corrupt(id)
    }
}
