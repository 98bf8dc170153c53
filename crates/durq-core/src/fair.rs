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

/// The keys of one priority of a fair queue in turn order (K5): from the one after
/// `served` (the queue's turn) to the last, then from the first (the jobs without a
/// key, [`NO_KEY`]) up to `served` itself, each once.
///
/// The walk is written once here; how a backend finds "the first key with ready jobs
/// after this one" is its own (an index seek, a page of keys read ahead, a sorted-set
/// range). A backend asks [`Ring::look`] what to find, finds it, and tells
/// [`Ring::found`] what it found:
///
/// ```
/// use durq_core::fair::{Found, Look, Ring, NO_KEY};
/// let keys = ["a", "b", "c"];
/// let first_after = |after: &str| keys.iter().find(|k| **k > after).map(|k| k.to_string());
/// let mut ring = Ring::new(Some("b".to_owned()));
/// let mut order = Vec::new();
/// loop {
///     let key = match ring.look() {
///         Look::Done => break,
///         Look::NoKey => Some(NO_KEY.to_owned()),
///         Look::After(after) => first_after(after),
///     };
///     match ring.found(key.as_deref()) {
///         Found::Take => order.push(key.unwrap_or_default()),
///         Found::Again => continue,
///         Found::Done => break,
///     }
/// }
/// assert_eq!(order, ["c", "", "a", "b"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    served: Option<String>,
    /// The last key handed out; `None` before the first (and again after wrapping).
    at: Option<String>,
    /// Whether the walk went past the last key and started again from the first.
    wrapped: bool,
    done: bool,
}

/// What a [`Ring`] needs found next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look<'r> {
    /// The jobs without a key have their turn next.
    NoKey,
    /// The first key with ready jobs after this one (byte order), or none.
    After(&'r str),
    /// Every key had its turn.
    Done,
}

/// What a [`Ring`] made of what was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The key found has its turn now.
    Take,
    /// The walk went round past the last key: look again.
    Again,
    /// Every key had its turn.
    Done,
}

impl Ring {
    /// The ring of a priority whose claims served `served` last (`None`: no claim did).
    pub fn new(served: Option<String>) -> Self {
        Ring {
            served,
            at: None,
            wrapped: false,
            done: false,
        }
    }

    /// What to find next: after the turn, or the last key handed out; without either,
    /// or once around, the very first key (the no-key turn).
    pub fn look(&self) -> Look<'_> {
        if self.done {
            return Look::Done;
        }
        match (&self.at, &self.served) {
            (Some(at), _) => Look::After(at),
            (None, Some(served)) if !self.wrapped => Look::After(served),
            (None, _) => Look::NoKey,
        }
    }

    /// Takes what [`Ring::look`] asked for: `key`, or `None` when no key lies after.
    pub fn found(&mut self, key: Option<&str>) -> Found {
        let Some(key) = key else {
            if !self.wrapped && self.served.is_some() {
                // Past the last key: around to the first.
                self.wrapped = true;
                self.at = None;
                return Found::Again;
            }
            self.done = true;
            return Found::Done;
        };
        if self.wrapped
            && self
                .served
                .as_deref()
                .is_some_and(|served| key.as_bytes() > served.as_bytes())
        {
            self.done = true;
            return Found::Done;
        }
        self.at = Some(key.to_owned());
        Found::Take
    }
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

    /// Walks a ring over `keys` (the keys with ready jobs, sorted; the no-key turn is
    /// always there) and returns the turn order.
    fn walk(served: Option<&str>, keys: &[&str]) -> Vec<String> {
        let mut ring = Ring::new(served.map(str::to_owned));
        let mut order = Vec::new();
        for _ in 0..100 {
            let key = match ring.look() {
                Look::Done => return order,
                Look::NoKey => Some(NO_KEY.to_owned()),
                Look::After(after) => keys
                    .iter()
                    .find(|k| k.as_bytes() > after.as_bytes())
                    .map(|k| (*k).to_owned()),
            };
            match ring.found(key.as_deref()) {
                Found::Take => order.push(key.unwrap_or_default()),
                Found::Again => {}
                Found::Done => return order,
            }
        }
        panic!("the ring does not end: {order:?}");
    }

    #[test]
    fn a_ring_gives_each_key_one_turn_from_the_one_after_the_turn() {
        let keys = ["a", "b", "c"];
        // No turn yet: the jobs without a key first, then every key in order.
        assert_eq!(walk(None, &keys), ["", "a", "b", "c"]);
        // After b: c, then round to the no-key turn, a, and b last.
        assert_eq!(walk(Some("b"), &keys), ["c", "", "a", "b"]);
        // After the last key: round at once.
        assert_eq!(walk(Some("c"), &keys), ["", "a", "b", "c"]);
        // After the no-key turn: the keys, then the no-key turn last.
        assert_eq!(walk(Some(""), &keys), ["a", "b", "c", ""]);
        // A turn at a key that has no jobs any more: the next one after it.
        assert_eq!(walk(Some("bb"), &keys), ["c", "", "a", "b"]);
        // Only the no-key turn.
        assert_eq!(walk(Some("x"), &[]), [""]);
        // Byte order, not the locale's: "B" (0x42) sorts before "a" (0x61).
        assert_eq!(walk(Some("B"), &["B", "a"]), ["a", "", "B"]);
    }
}
