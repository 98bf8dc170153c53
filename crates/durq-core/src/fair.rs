//! Fair shares (CONTRACT K5), the part every backend shares: where a fair queue's
//! candidates stand in a claim's order, and which key's turn a claim leaves behind.
//! How a backend finds each key's next job is its own.

use crate::order::ReadyOrder;

/// The turn of the jobs without a concurrency key: no key is empty, and `""` sorts
/// before every other, where K5 places them.
pub const NO_KEY: &str = "";

/// A job a fair claim took, in turn order: its queue, its priority and the key whose
/// turn it was (`NO_KEY` for none). `Id` is whatever the backend leases by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn<Id> {
    /// The job, as the backend names it.
    pub id: Id,
    /// Its queue.
    pub queue: String,
    /// Its priority: turns are kept per queue and priority.
    pub priority: i16,
    /// The key whose turn it was.
    pub key: String,
}

/// The candidates of one fair queue, taken in turn order, each given the place in claim
/// order (C3) that the queue's first jobs hold: their orders sorted, handed out in turn
/// order. A claim across queues then merges them as it would the queue's first jobs,
/// and its cut keeps a prefix of the turns.
pub fn in_turn_places<Id: Copy>(taken: &[(ReadyOrder, Id)]) -> Vec<(ReadyOrder, Id)> {
    let mut places: Vec<ReadyOrder> = taken.iter().map(|(order, _)| *order).collect();
    places.sort_unstable();
    places
        .into_iter()
        .zip(taken.iter().map(|(_, id)| *id))
        .collect()
}

/// The turn a claim leaves each (queue, priority) at: the last of `turns` (in turn
/// order) whose job the claim kept, one per (queue, priority).
pub fn turns_left<'t, Id: PartialEq>(turns: &'t [Turn<Id>], kept: &[Id]) -> Vec<&'t Turn<Id>> {
    let mut last: Vec<&Turn<Id>> = Vec::new();
    for turn in turns.iter().filter(|turn| kept.contains(&turn.id)) {
        match last
            .iter_mut()
            .find(|seen| seen.queue == turn.queue && seen.priority == turn.priority)
        {
            Some(seen) => *seen = turn,
            None => last.push(turn),
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    fn order(priority: i16, seq: u64) -> ReadyOrder {
        ReadyOrder::new(priority, Timestamp::from_millis(0), seq)
    }

    #[test]
    fn turns_hold_the_places_of_the_first_jobs_in_turn_order() {
        // Taken in turn order b (seq 9), a (seq 1), c (seq 5).
        let placed = in_turn_places(&[(order(0, 9), 'b'), (order(0, 1), 'a'), (order(0, 5), 'c')]);
        assert_eq!(
            placed,
            vec![(order(0, 1), 'b'), (order(0, 5), 'a'), (order(0, 9), 'c')]
        );
    }

    #[test]
    fn the_turn_is_left_at_the_last_kept_job_per_queue_and_priority() {
        let turn = |id: u8, queue: &str, priority: i16, key: &str| Turn {
            id,
            queue: queue.to_owned(),
            priority,
            key: key.to_owned(),
        };
        let turns = [
            turn(1, "q", 0, "a"),
            turn(2, "q", 0, "b"),
            turn(3, "q", 5, "c"),
            turn(4, "q", 0, "d"),
            turn(5, "r", 0, "e"),
        ];
        let left: Vec<(&str, i16, &str)> = turns_left(&turns, &[1, 2, 3, 5])
            .into_iter()
            .map(|t| (t.queue.as_str(), t.priority, t.key.as_str()))
            .collect();
        // d was cut: q's priority 0 stays at b.
        assert_eq!(left, vec![("q", 0, "b"), ("q", 5, "c"), ("r", 0, "e")]);
    }
}
