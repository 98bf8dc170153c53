//! One public function per rule of the [contract](durq_core::contract), named after it.
//!
//! Each scenario takes a [`Harness`](crate::Harness), builds its own
//! [`TestEnv`](crate::TestEnv) (a fresh namespace and a manual clock), drives time only
//! through that clock, and panics with a message naming the rule when the store breaks
//! it. Scenarios whose name extends a rule with a choice decided under it pin
//! that choice (`l8_release_takes_back_the_attempt`, …).
//!
//! Run them through [`conformance_tests!`](crate::conformance_tests), or iterate
//! [`SCENARIOS`](crate::SCENARIOS).

mod admin;
mod attempts;
mod claim;
mod claim_order;
mod claim_skips;
mod dependencies;
mod enqueue;
mod events;
mod fit;
mod flow_control;
mod idempotency;
mod lease;
mod lease_endings;
mod listing;
mod partitions;
mod purge;
mod queues;
mod reclaim;
mod results;
mod schedules;
mod stats;
mod steps;
mod support;
pub mod transactions;
mod validation;
mod workers;

pub use admin::*;
pub use attempts::*;
pub use claim::*;
pub use claim_order::*;
pub use claim_skips::*;
pub use dependencies::*;
pub use enqueue::*;
pub use events::*;
pub use fit::*;
pub use flow_control::*;
pub use idempotency::*;
pub use lease::*;
pub use lease_endings::*;
pub use listing::*;
pub use partitions::*;
pub use purge::*;
pub use queues::*;
pub use reclaim::*;
pub use results::*;
pub use schedules::*;
pub use stats::*;
pub use steps::*;
pub use validation::*;
pub use workers::*;
