//! Flow control: the limits a queue declares on its running jobs (CONTRACT K1–K3),
//! enforced inside the claim by backends with the [`FlowControl`](crate::FlowControl)
//! capability.

use crate::error::{Error, Result};

/// How many of a queue's jobs may run at once, across every worker and process of the
/// namespace. Limits are data: set with [`Store::set_limits`](crate::Store::set_limits)
/// and changed at any time; the next claim applies them. The default limits nothing.
///
/// ```
/// use durq_core::QueueLimits;
/// // At most 20 invoices rendering at once, and one at a time per customer.
/// let limits = QueueLimits::new().max_running(20).max_running_per_key(1);
/// assert_eq!(limits.max_running, Some(20));
/// assert!(!limits.is_unlimited());
/// assert!(QueueLimits::new().is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct QueueLimits {
    /// CONTRACT K2: most jobs of the queue running at once; `None` for no limit.
    pub max_running: Option<u32>,
    /// CONTRACT K1: most jobs of one concurrency key of the queue running at once;
    /// `None` for no limit. Jobs without a key are not limited by it.
    pub max_running_per_key: Option<u32>,
}

impl QueueLimits {
    /// No limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`QueueLimits::max_running`].
    pub fn max_running(mut self, jobs: u32) -> Self {
        self.max_running = Some(jobs);
        self
    }

    /// Sets [`QueueLimits::max_running_per_key`].
    pub fn max_running_per_key(mut self, jobs: u32) -> Self {
        self.max_running_per_key = Some(jobs);
        self
    }

    /// Whether these limits limit nothing: what a queue without limits has, and what
    /// [`Store::set_limits`](crate::Store::set_limits) stores by removing the queue's.
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `running` jobs of the queue leave room for one more (K2).
    pub fn admits_queue(&self, running: u64) -> bool {
        self.max_running
            .is_none_or(|limit| running < u64::from(limit))
    }

    /// Whether `running` jobs of one concurrency key leave room for one more (K1).
    pub fn admits_key(&self, running: u64) -> bool {
        self.max_running_per_key
            .is_none_or(|limit| running < u64::from(limit))
    }

    /// CONTRACT K3: a limit of 0 is refused, naming its field: a queue that should run
    /// nothing is paused (Q1), which says so everywhere a limit would not.
    pub fn validate(&self) -> Result<()> {
        for (field, limit) in [
            ("max_running", self.max_running),
            ("max_running_per_key", self.max_running_per_key),
        ] {
            if limit == Some(0) {
                return Err(Error::invalid(
                    field,
                    "must be at least 1; pause the queue to run none of its jobs",
                ));
            }
        }
        Ok(())
    }
}

/// The limits in words, as the CLI and the dashboard show them: `at most 20 running, at
/// most 1 running per concurrency key`, or `none`.
impl std::fmt::Display for QueueLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.max_running, self.max_running_per_key) {
            (None, None) => f.write_str("none"),
            (Some(all), None) => write!(f, "at most {all} running"),
            (None, Some(per_key)) => write!(f, "at most {per_key} running per concurrency key"),
            (Some(all), Some(per_key)) => write!(
                f,
                "at most {all} running, at most {per_key} running per concurrency key"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_admit_below_them_and_none_admit_all() {
        let limits = QueueLimits::new().max_running(2).max_running_per_key(1);
        assert!(limits.admits_queue(1));
        assert!(!limits.admits_queue(2));
        assert!(limits.admits_key(0));
        assert!(!limits.admits_key(1));
        let none = QueueLimits::new();
        assert!(none.admits_queue(u64::MAX) && none.admits_key(u64::MAX));
    }

    #[test]
    fn limits_read_as_words() {
        assert_eq!(QueueLimits::new().to_string(), "none");
        assert_eq!(
            QueueLimits::new().max_running(3).to_string(),
            "at most 3 running"
        );
        assert_eq!(
            QueueLimits::new()
                .max_running(3)
                .max_running_per_key(1)
                .to_string(),
            "at most 3 running, at most 1 running per concurrency key"
        );
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        let field = |limits: QueueLimits| {
            limits
                .validate()
                .err()
                .and_then(|e| e.invalid_field().map(str::to_owned))
        };
        assert_eq!(
            field(QueueLimits::new().max_running(0)).as_deref(),
            Some("max_running")
        );
        assert_eq!(
            field(QueueLimits::new().max_running_per_key(0)).as_deref(),
            Some("max_running_per_key")
        );
        assert_eq!(
            field(QueueLimits::new().max_running(1).max_running_per_key(1)),
            None
        );
    }
}
