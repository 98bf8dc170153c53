//! The runtime scenarios, each an `async fn(Env)` that `runtime_tests!` runs on every
//! backend.

use super::*;

mod events;
mod flow_control;
mod leases_and_shutdown;
mod lifecycle_hooks;
mod runs_retries_and_schedules;
mod steps;

pub use events::*;
pub use flow_control::*;
pub use leases_and_shutdown::*;
pub use lifecycle_hooks::*;
pub use runs_retries_and_schedules::*;
pub use steps::*;
