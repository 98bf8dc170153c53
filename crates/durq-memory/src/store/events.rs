//! The event stream (CONTRACT V1–V4): an in-memory log per namespace, appended under
//! the namespace's lock in the same hold as the change it records, so its order is the
//! order of the changes and a reader never sees a later event before an earlier one.

use std::collections::VecDeque;

use durq_core::events::{self, Event, EventCursor, EventKind, EventPage};

use super::*;

/// The namespace's events, oldest first; each one's cursor is `N-0`, `N` counting up.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    entries: VecDeque<Event>,
    /// The last `N` drawn.
    last: u64,
    /// The newest cursor a trim deleted (V3).
    trimmed_through: EventCursor,
    /// With the fault `events_out_of_order` on: an event held back, appended after
    /// the next one (CONTRACT V4's mutant).
    held_back: Option<Event>,
}

impl EventLog {
    fn append(&mut self, event: Event, out_of_order: bool) {
        if !out_of_order {
            self.entries.push_back(event);
            return;
        }
        // The fault: every other event becomes visible only after the one drawn
        // after it, as rows numbered by a sequence become visible in commit order.
        match self.held_back.take() {
            None => self.held_back = Some(event),
            Some(earlier) => {
                self.entries.push_back(event);
                self.entries.push_back(earlier);
            }
        }
    }
}

impl State {
    /// Rule V1: records `kind` for the job of `record`, in the current hold of the
    /// lock.
    fn push_event(&mut self, id: JobId, kind: EventKind, attempt: u32, now: Timestamp) {
        let Some(record) = self.jobs.get(&id) else {
            return;
        };
        let queue = record.job.queue.clone();
        self.append_event(id, queue, kind, attempt, None, now);
    }

    fn append_event(
        &mut self,
        job: JobId,
        queue: String,
        kind: EventKind,
        attempt: u32,
        emitted: Option<(String, Bytes)>,
        now: Timestamp,
    ) {
        let log = &mut self.events;
        log.last += 1;
        let (name, data) = emitted.unzip();
        let event = Event {
            cursor: EventCursor::new(log.last, 0),
            job,
            queue,
            kind,
            attempt,
            name,
            data,
            recorded_at: now,
        };
        let out_of_order = self.faults.events_out_of_order;
        self.events.append(event, out_of_order);
    }

    /// Rule V1 for a change [`State::transition_unsettled`] made to a job that records
    /// its events.
    pub(super) fn record_change(
        &mut self,
        id: JobId,
        was: JobState,
        attempts_before: u32,
        now: Timestamp,
    ) {
        let Some(record) = self.jobs.get(&id) else {
            return;
        };
        let job = &record.job;
        if let Some(kind) =
            EventKind::of_change(Some(was), job.state, attempts_before, job.attempts)
        {
            let attempt = job.attempts;
            self.push_event(id, kind, attempt, now);
        }
    }

    /// Rule V1 for an enqueue that stored a job that records its events.
    pub(super) fn record_enqueue(&mut self, id: JobId, now: Timestamp) {
        self.push_event(id, EventKind::Enqueued, 0, now);
    }

    /// Rule V1: `emitted`, fenced by the lease.
    pub(crate) fn emit(
        &mut self,
        id: JobId,
        token: LeaseToken,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        self.check_lease(id, token)?;
        let job = &self.job(id)?;
        let (queue, attempt) = (job.queue.clone(), job.attempts);
        self.append_event(
            id,
            queue,
            EventKind::Emitted,
            attempt,
            Some((name.to_owned(), data)),
            now,
        );
        Ok(())
    }

    /// Rule V2.
    pub(crate) fn events(&self, after: EventCursor, limit: usize) -> EventPage {
        let log = &self.events;
        let start = log.entries.partition_point(|event| event.cursor <= after);
        let found = log.entries.range(start..).take(limit).cloned().collect();
        events::page(after, found, log.trimmed_through)
    }

    /// Rule V3.
    pub(crate) fn trim_events(&mut self, keep: u64) -> u64 {
        let log = &mut self.events;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        let excess = log.entries.len().saturating_sub(keep);
        for event in log.entries.drain(..excess) {
            log.trimmed_through = log.trimmed_through.max(event.cursor);
        }
        excess as u64
    }

    #[cfg(feature = "testing")]
    pub(crate) fn events_out_of_order(&mut self, on: bool) {
        self.faults.events_out_of_order = on;
    }
}
