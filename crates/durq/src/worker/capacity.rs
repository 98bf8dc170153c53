//! What a worker offers (`WorkerBuilder::capacity`) and how much of it is free: taken
//! when a job's handler starts, given back when it ends, and sent as the budget of
//! every claim so the store hands out only jobs that fit (CONTRACT F2, F3).

use std::sync::Mutex;

use durq_core::{Budget, Needs};

/// A worker's total capacity and what is free of it now.
pub(crate) struct Capacity {
    total: Budget,
    free: Mutex<Budget>,
}

impl Capacity {
    pub(crate) fn new(total: Budget) -> Self {
        Capacity {
            free: Mutex::new(total.clone()),
            total,
        }
    }

    /// The budget of the next claim: what is free now.
    pub(crate) fn free(&self) -> Budget {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether claims must ask for one job at a time. The store admits each job of a
    /// claim against the budget on its own (CONTRACT F2), so two jobs that each fit
    /// what is free could together need more; while the worker counts amounts, each
    /// claim is for one job, sized against what the jobs before it left. Capabilities
    /// alone are not used up, so those claims keep their batches.
    pub(crate) fn claims_one_at_a_time(&self) -> bool {
        !self.total.amounts.is_empty()
    }

    /// A job with `needs` starts.
    pub(crate) fn take(&self, needs: &Needs) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        *free = free.minus(needs);
    }

    /// A job with `needs` ended.
    pub(crate) fn give_back(&self, needs: &Needs) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        *free = free.plus(needs, &self.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_jobs_hold_their_amounts_until_they_end() {
        let capacity = Capacity::new(Budget::new().amount("gpu", 2).capability("fpga"));
        let one_gpu = Needs::new().amount("gpu", 1);
        capacity.take(&one_gpu);
        capacity.take(&one_gpu);
        assert_eq!(capacity.free().amounts["gpu"], 0);
        assert!(!capacity.free().admits(&one_gpu));
        assert!(capacity.free().admits(&Needs::new().capability("fpga")));
        capacity.give_back(&one_gpu);
        assert!(capacity.free().admits(&one_gpu));
        capacity.give_back(&one_gpu);
        capacity.give_back(&one_gpu);
        assert_eq!(
            capacity.free().amounts["gpu"],
            2,
            "never more than the total"
        );
        assert!(capacity.claims_one_at_a_time());
        assert!(!Capacity::new(Budget::new().capability("fpga")).claims_one_at_a_time());
    }
}
