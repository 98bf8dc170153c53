//! Claims that fit the worker (CONTRACT F1–F6), written once: what a job needs, what a
//! worker offers, whether one admits the other, and the claim order among the jobs that
//! fit.
//!
//! A job may declare [`Needs`]: named integer amounts (`cpu_milli`, `mem_bytes`, `gpu`)
//! and capability keys (`fpga`). A claim may carry a [`Budget`]: what the worker has
//! free right now. Backends store a job's needs and locality as one opaque text
//! ([`encode_placement`]), and decide a claim with [`Budget::admits`] and
//! [`FitOrder`] (memory, SQLite) or a transcription of them into their own language
//! (PostgreSQL's SQL, Redis's Lua), which the conformance suite holds to the same rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::order::ReadyOrder;

/// What a job needs from the worker that runs it: named amounts and capabilities.
///
/// ```
/// use durq_core::Needs;
/// let needs = Needs::new().amount("cpu_milli", 2_000).amount("gpu", 1).capability("fpga");
/// assert_eq!(needs.amounts()["gpu"], 1);
/// assert!(needs.capabilities().contains("fpga"));
/// assert!(Needs::new().is_empty());
/// ```
///
/// A job's needs are copied into every answer that shows the job (each claim, get and
/// list), so they are shared: a job that needs nothing holds nothing, and a copy of
/// one that does is a reference count, not maps rebuilt key by key.
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "NeedSet", into = "NeedSet")]
pub struct Needs(Option<Arc<NeedSet>>);

/// The contents of [`Needs`], and their serialised form (`{"a":{..},"c":[..]}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct NeedSet {
    #[serde(default, rename = "a", skip_serializing_if = "BTreeMap::is_empty")]
    amounts: BTreeMap<String, u64>,
    #[serde(default, rename = "c", skip_serializing_if = "BTreeSet::is_empty")]
    capabilities: BTreeSet<String>,
}

static NO_AMOUNTS: BTreeMap<String, u64> = BTreeMap::new();
static NO_CAPABILITIES: BTreeSet<String> = BTreeSet::new();

impl From<NeedSet> for Needs {
    fn from(set: NeedSet) -> Self {
        // Nothing is stored as nothing, so two empty needs are always equal.
        if set.amounts.is_empty() && set.capabilities.is_empty() {
            Needs(None)
        } else {
            Needs(Some(Arc::new(set)))
        }
    }
}

impl From<Needs> for NeedSet {
    fn from(needs: Needs) -> Self {
        needs.0.map(Arc::unwrap_or_clone).unwrap_or_default()
    }
}

impl std::fmt::Debug for Needs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Needs")
            .field("amounts", self.amounts())
            .field("capabilities", self.capabilities())
            .finish()
    }
}

impl Needs {
    /// Needs nothing: fits every worker.
    pub fn new() -> Self {
        Needs(None)
    }

    fn set_mut(&mut self) -> &mut NeedSet {
        Arc::make_mut(self.0.get_or_insert_with(Default::default))
    }

    /// Needs `amount` of `name` (replacing an earlier amount of that name).
    pub fn amount(mut self, name: impl Into<String>, amount: u64) -> Self {
        self.set_mut().amounts.insert(name.into(), amount);
        self
    }

    /// Needs capability `key`.
    pub fn capability(mut self, key: impl Into<String>) -> Self {
        self.set_mut().capabilities.insert(key.into());
        self
    }

    /// Named integer amounts (`cpu_milli`, `mem_bytes`, `gpu`, …), each compared with
    /// the budget's amount of the same name.
    pub fn amounts(&self) -> &BTreeMap<String, u64> {
        self.0.as_ref().map_or(&NO_AMOUNTS, |set| &set.amounts)
    }

    /// Capability keys the worker must offer, each matched exactly.
    pub fn capabilities(&self) -> &BTreeSet<String> {
        self.0
            .as_ref()
            .map_or(&NO_CAPABILITIES, |set| &set.capabilities)
    }

    /// Whether the job declares nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `self` and `other` are one shared set (one is a copy of the other, or
    /// both need nothing): then they are equal, and whatever was decided for one holds
    /// for the other, without reading either.
    pub fn is_shared_with(&self, other: &Needs) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// Equal [`Needs`] made one shared set, for a store that keeps jobs in memory: jobs of
/// one kind then share their needs, so a claim judges each kind once
/// ([`Needs::is_shared_with`]) and reads one set, not one per job. Sets no job holds
/// any more are dropped as the pool grows.
#[derive(Debug, Default)]
pub struct NeedsPool {
    sets: std::collections::HashSet<Needs>,
    /// Size after which the next insertion first drops the unused sets.
    sweep_at: usize,
}

impl NeedsPool {
    /// The smallest size at which the pool looks for unused sets.
    const MIN_SWEEP: usize = 1024;

    /// An empty pool.
    pub fn new() -> Self {
        NeedsPool::default()
    }

    /// `needs` as the pool's shared set equal to it (added if new).
    pub fn share(&mut self, needs: Needs) -> Needs {
        if needs.is_empty() {
            return needs;
        }
        if let Some(shared) = self.sets.get(&needs) {
            return shared.clone();
        }
        if self.sets.len() >= self.sweep_at.max(Self::MIN_SWEEP) {
            // Held by the pool alone: no job needs it any more.
            self.sets
                .retain(|set| set.0.as_ref().is_some_and(|set| Arc::strong_count(set) > 1));
            self.sweep_at = 2 * self.sets.len();
        }
        self.sets.insert(needs.clone());
        needs
    }
}

/// What a worker offers a claim right now: the amounts it has free and the
/// capabilities it has (CONTRACT F2, F3).
///
/// An amount the budget does not name is unconstrained; an amount it names, zero
/// included, is a limit. A job needing a capability is admitted only by a budget that
/// offers that exact key, so a budget with no capabilities admits no such job. A claim
/// with no budget at all admits every job.
///
/// ```
/// use durq_core::{Budget, Needs};
/// let budget = Budget::new().amount("mem_bytes", 4 << 30).capability("fpga");
/// assert!(budget.admits(&Needs::new().amount("mem_bytes", 4 << 30).amount("gpu", 8)));
/// assert!(!budget.admits(&Needs::new().amount("mem_bytes", (4 << 30) + 1)));
/// assert!(!budget.admits(&Needs::new().capability("fpga-large")));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// The amounts free, by name.
    #[serde(default, rename = "a")]
    pub amounts: BTreeMap<String, u64>,
    /// The capabilities offered.
    #[serde(default, rename = "c")]
    pub capabilities: BTreeSet<String>,
}

impl Budget {
    /// A budget naming no amount and offering no capability: it admits every job that
    /// needs no capability.
    pub fn new() -> Self {
        Budget::default()
    }

    /// Offers `amount` of `name` (replacing an earlier amount of that name).
    pub fn amount(mut self, name: impl Into<String>, amount: u64) -> Self {
        self.amounts.insert(name.into(), amount);
        self
    }

    /// Offers capability `key`.
    pub fn capability(mut self, key: impl Into<String>) -> Self {
        self.capabilities.insert(key.into());
        self
    }

    /// Whether a job with `needs` fits: each amount it needs is at most the budget's
    /// amount of that name (when the budget names it), and each capability it needs is
    /// offered (CONTRACT F2, F3).
    pub fn admits(&self, needs: &Needs) -> bool {
        needs
            .amounts()
            .iter()
            .all(|(name, need)| self.amounts.get(name).is_none_or(|offered| need <= offered))
            && needs.capabilities().is_subset(&self.capabilities)
    }

    /// The budget as JSON text (`{"a":{name:amount},"c":[key]}`), the form the
    /// PostgreSQL and Redis backends hand to their server.
    pub fn to_json(&self) -> String {
        // Maps of strings to integers and sets of strings always serialise.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// What is left after a job with `needs` takes its amounts: the runtime's free
    /// capacity while the job runs. Amounts the budget does not name stay unnamed.
    pub fn minus(&self, needs: &Needs) -> Budget {
        let mut left = self.clone();
        for (name, need) in needs.amounts() {
            if let Some(free) = left.amounts.get_mut(name) {
                *free = free.saturating_sub(*need);
            }
        }
        left
    }

    /// What is free again once a job with `needs` has finished, never more than
    /// `total`.
    pub fn plus(&self, needs: &Needs, total: &Budget) -> Budget {
        let mut free = self.clone();
        for (name, need) in needs.amounts() {
            if let (Some(amount), Some(cap)) = (free.amounts.get_mut(name), total.amounts.get(name))
            {
                *amount = amount.saturating_add(*need).min(*cap);
            }
        }
        free
    }
}

/// A job's place in the order of a claim that prefers localities (CONTRACT F5):
/// priority descending, then jobs whose locality the claim prefers, then
/// [`ReadyOrder`] (ready time, then enqueue sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FitOrder {
    priority: std::cmp::Reverse<i16>,
    elsewhere: bool,
    ready: ReadyOrder,
}

impl FitOrder {
    /// The place of a job in the ready order `ready`, `preferred` when its locality is
    /// one the claim prefers.
    pub fn new(ready: ReadyOrder, preferred: bool) -> Self {
        FitOrder {
            priority: std::cmp::Reverse(ready.priority),
            elsewhere: !preferred,
            ready,
        }
    }

    /// The job's ready order.
    pub fn ready(&self) -> ReadyOrder {
        self.ready
    }
}

/// Whether a job with `locality` is one that `prefer` names. A job without a locality
/// is never preferred.
pub fn is_preferred(prefer: &[String], locality: Option<&str>) -> bool {
    locality.is_some_and(|locality| prefer.iter().any(|p| p == locality))
}

/// The stored form, written from borrowed parts.
#[derive(Serialize)]
struct StoredPlacement<'a> {
    #[serde(rename = "a", skip_serializing_if = "BTreeMap::is_empty")]
    amounts: &'a BTreeMap<String, u64>,
    #[serde(rename = "c", skip_serializing_if = "BTreeSet::is_empty")]
    capabilities: &'a BTreeSet<String>,
    #[serde(rename = "l", skip_serializing_if = "Option::is_none")]
    locality: Option<&'a str>,
}

/// The stored form, read back. Its fields are spelled out rather than `Needs` flattened in: serde
/// buffers a flattened struct through an intermediate map, and every read of a job
/// with needs decodes one.
#[derive(Deserialize)]
struct Placement {
    #[serde(default, rename = "a")]
    amounts: BTreeMap<String, u64>,
    #[serde(default, rename = "c")]
    capabilities: BTreeSet<String>,
    #[serde(default, rename = "l")]
    locality: Option<String>,
}

/// The one text a backend stores for a job's needs and locality
/// (`{"a":{name:amount},"c":[key],"l":locality}`, empty parts left out), or `None` when
/// the job declares neither, so jobs that use no placement cost nothing.
pub fn encode_placement(needs: &Needs, locality: Option<&str>) -> Option<String> {
    if needs.is_empty() && locality.is_none() {
        return None;
    }
    serde_json::to_string(&StoredPlacement {
        amounts: needs.amounts(),
        capabilities: needs.capabilities(),
        locality,
    })
    .ok()
}

/// Reads a stored placement back; the error says what is wrong with the text (a
/// backend reports it as a corrupt record).
pub fn decode_placement(text: &str) -> Result<(Needs, Option<String>), String> {
    // A derived struct also reads from a JSON array (its fields in order); only the
    // object Rust writes is a placement.
    if !text.trim_start().starts_with('{') {
        return Err("placement unreadable: not a JSON object".to_owned());
    }
    serde_json::from_str::<Placement>(text)
        .map(|placement| {
            let needs = Needs::from(NeedSet {
                amounts: placement.amounts,
                capabilities: placement.capabilities,
            });
            (needs, placement.locality)
        })
        .map_err(|err| format!("placement unreadable: {err}"))
}

/// Placements decoded by their stored text, for one call that reads many jobs of a few
/// kinds (a claim of 32 jobs rarely holds more than a handful of distinct needs): each
/// text is decoded once, and the jobs that share it share one [`Needs`], a reference
/// count. Holds at most [`PlacementCache::CAPACITY`] texts; past that a text is decoded
/// each time it is met.
#[derive(Debug, Default)]
pub struct PlacementCache {
    seen: std::collections::HashMap<Box<str>, (Needs, Option<String>)>,
}

impl PlacementCache {
    /// Texts remembered.
    pub const CAPACITY: usize = 64;

    /// An empty cache.
    pub fn new() -> Self {
        PlacementCache::default()
    }

    /// [`decode_placement`] of `text`, remembered.
    pub fn decode(&mut self, text: &str) -> Result<(Needs, Option<String>), String> {
        if let Some((needs, locality)) = self.seen.get(text) {
            return Ok((needs.clone(), locality.clone()));
        }
        let decoded = decode_placement(text)?;
        if self.seen.len() < Self::CAPACITY {
            self.seen.insert(text.into(), decoded.clone());
        }
        Ok(decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_shares_equal_needs_and_drops_the_ones_no_job_holds() {
        let mut pool = NeedsPool::new();
        let gpu = || Needs::new().amount("gpu", 1).capability("cuda");
        let first = pool.share(gpu());
        let second = pool.share(gpu());
        assert!(first.is_shared_with(&second));
        assert_eq!(first, second);
        let other = pool.share(Needs::new().amount("gpu", 2));
        assert!(!other.is_shared_with(&first));
        assert!(pool.share(Needs::new()).is_shared_with(&Needs::new()));
        assert!(!Needs::new().is_shared_with(&first));
        // Equal but apart: equal contents are not one shared set.
        assert!(!gpu().is_shared_with(&gpu()));
        assert_eq!(pool.sets.len(), 2);

        // Sets nobody holds go once the pool reaches its sweep size; held ones stay.
        drop((second, other));
        let mut held = Vec::new();
        for n in 0..NeedsPool::MIN_SWEEP as u64 {
            let needs = pool.share(Needs::new().amount("mem_bytes", n));
            if n % 2 == 0 {
                held.push(needs);
            }
        }
        assert!(
            pool.sets.len() < NeedsPool::MIN_SWEEP,
            "a sweep ran: {}",
            pool.sets.len()
        );
        assert!(
            pool.share(gpu()).is_shared_with(&first),
            "a held set stays shared"
        );
        for needs in &held {
            assert!(pool.share(needs.clone()).is_shared_with(needs));
        }
    }
    use crate::time::Timestamp;

    #[test]
    fn a_cached_placement_decodes_as_the_text_does_and_shares_its_needs() {
        let needs = Needs::new().amount("gpu", 2).capability("cuda");
        let text = encode_placement(&needs, Some("rack-1")).expect("a placement");
        let mut cache = PlacementCache::new();
        let first = cache.decode(&text).expect("decodes");
        let second = cache.decode(&text).expect("decodes");
        assert_eq!(first, decode_placement(&text).expect("decodes"));
        assert_eq!(first, second);
        assert_eq!(first.1.as_deref(), Some("rack-1"));
        // The second answer shares the first one's needs instead of rebuilding them.
        let (Needs(Some(a)), Needs(Some(b))) = (&first.0, &second.0) else {
            panic!("needs were expected");
        };
        assert!(Arc::ptr_eq(a, b));
        assert!(
            cache.decode("[1]").is_err(),
            "an unreadable text stays unreadable"
        );
        assert!(cache.decode("[1]").is_err());
        for n in 0..(PlacementCache::CAPACITY as u64 + 10) {
            let text = encode_placement(&Needs::new().amount("n", n), None).expect("text");
            assert_eq!(
                cache.decode(&text).expect("decodes").0.amounts()["n"],
                n,
                "past its capacity the cache still answers right"
            );
        }
    }

    #[test]
    fn an_absent_amount_is_unconstrained_and_a_named_zero_is_a_limit() {
        let needs = Needs::new().amount("gpu", 8);
        assert!(Budget::new().amount("mem_bytes", 1).admits(&needs));
        assert!(!Budget::new().amount("gpu", 0).admits(&needs));
        assert!(Budget::new().amount("gpu", 0).admits(&Needs::new()));
        assert!(Budget::new()
            .amount("gpu", 0)
            .admits(&Needs::new().amount("gpu", 0)));
    }

    #[test]
    fn an_exact_fit_is_admitted_and_one_unit_over_is_not() {
        let budget = Budget::new().amount("cpu_milli", 4_000);
        assert!(budget.admits(&Needs::new().amount("cpu_milli", 4_000)));
        assert!(!budget.admits(&Needs::new().amount("cpu_milli", 4_001)));
    }

    #[test]
    fn capabilities_match_whole_keys_as_a_subset() {
        let offer = Budget::new()
            .capability("fpga")
            .capability("nvme")
            .capability("tpu");
        assert!(offer.admits(&Needs::new().capability("fpga").capability("tpu")));
        assert!(!Budget::new()
            .capability("fpga")
            .admits(&Needs::new().capability("fpga").capability("tpu")));
        assert!(!Budget::new()
            .capability("fpga-large")
            .admits(&Needs::new().capability("fpga")));
        assert!(!Budget::new()
            .capability("fpga")
            .admits(&Needs::new().capability("fpga-large")));
        assert!(!Budget::new().admits(&Needs::new().capability("fpga")));
    }

    #[test]
    fn locality_orders_within_a_priority_band_only() {
        let at = |priority, ms, seq| ReadyOrder::new(priority, Timestamp::from_millis(ms), seq);
        let mut orders = [
            FitOrder::new(at(1, 10, 1), false),
            FitOrder::new(at(1, 30, 3), true),
            FitOrder::new(at(5, 40, 4), false),
            FitOrder::new(at(1, 20, 2), false),
        ];
        orders.sort();
        let seqs: Vec<u64> = orders.iter().map(|o| o.ready().seq).collect();
        assert_eq!(seqs, [4, 3, 1, 2]);
    }

    #[test]
    fn no_locality_is_never_preferred() {
        assert!(!is_preferred(&["a".into()], None));
        assert!(is_preferred(&["b".into(), "a".into()], Some("a")));
        assert!(!is_preferred(&[], Some("a")));
    }

    #[test]
    fn placement_round_trips_and_is_absent_when_empty() {
        assert_eq!(encode_placement(&Needs::new(), None), None);
        let needs = Needs::new().amount("mem_bytes", 1 << 40).capability("fpga");
        let text = encode_placement(&needs, Some("eu-1")).expect("a placement to store");
        assert_eq!(
            text,
            r#"{"a":{"mem_bytes":1099511627776},"c":["fpga"],"l":"eu-1"}"#
        );
        assert_eq!(
            decode_placement(&text).expect("readable"),
            (needs, Some("eu-1".to_owned()))
        );
        assert_eq!(
            decode_placement(r#"{"l":"x"}"#).expect("readable"),
            (Needs::new(), Some("x".to_owned()))
        );
        assert!(decode_placement("{").is_err());
        for bad in [
            "[]",
            "[{}]",
            "7",
            r#"{"a":[1]}"#,
            r#"{"l":7}"#,
            r#"{"a":{"gpu":-1}}"#,
        ] {
            assert!(decode_placement(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capacity_is_taken_and_given_back_within_the_total() {
        let total = Budget::new().amount("gpu", 2).capability("fpga");
        let needs = Needs::new().amount("gpu", 1).amount("cpu_milli", 5);
        let running = total.minus(&needs);
        assert_eq!(running.amounts["gpu"], 1);
        assert!(!running.amounts.contains_key("cpu_milli"));
        assert_eq!(running.plus(&needs, &total), total);
        assert_eq!(total.plus(&needs, &total), total);
    }
}
