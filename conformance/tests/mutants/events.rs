//! Bugs in the event stream (CONTRACT V1–V4).

use super::*;

/// V1: an emit that is not fenced: it records the event under whatever lease the job
/// holds now, as a backend that checked only that the job exists would, so a run that
/// lost its lease still emits.
#[derive(Debug)]
pub(crate) struct EmitWithoutTheLease;

#[async_trait]
impl Bug for EmitWithoutTheLease {
    async fn emit(
        &self,
        inner: &dyn Backend,
        lease: HeldLease,
        name: &str,
        data: Bytes,
        now: Timestamp,
    ) -> Result<()> {
        let job = inner.get(lease.id).await?;
        let token = job.lease.map_or(lease.token, |current| current.token);
        match inner
            .require_events()?
            .emit(lease.id, token, name, data, now)
            .await
        {
            // The job has no lease at all: the bug answers success and records nothing.
            Err(Error::LeaseLost { .. }) => Ok(()),
            answer => answer,
        }
    }
}

/// V2: a page whose `next` is its first event's cursor instead of its last, so a
/// consumer resuming from it reads most of the page again.
#[derive(Debug)]
pub(crate) struct NextAtTheFirstEvent;

#[async_trait]
impl Bug for NextAtTheFirstEvent {
    async fn events(
        &self,
        inner: &dyn Backend,
        after: EventCursor,
        limit: usize,
    ) -> Result<EventPage> {
        let mut page = inner.require_events()?.events(after, limit).await?;
        if let Some(first) = page.events.first() {
            page.next = first.cursor;
        }
        Ok(page)
    }
}

/// V3: reads that never say events were trimmed away, so a consumer behind a trim
/// cannot tell it missed some.
#[derive(Debug)]
pub(crate) struct TrimNeverTold;

#[async_trait]
impl Bug for TrimNeverTold {
    async fn events(
        &self,
        inner: &dyn Backend,
        after: EventCursor,
        limit: usize,
    ) -> Result<EventPage> {
        let mut page = inner.require_events()?.events(after, limit).await?;
        page.trimmed = false;
        Ok(page)
    }
}

/// V4: every other event becomes visible only after the one recorded after it, as
/// rows numbered by a sequence become visible in commit order; a reader that moved
/// past the later one never sees the earlier. The store's own log with the fault
/// injected (`MemoryServer::events_out_of_order`).
#[derive(Debug)]
pub(crate) struct EventsVisibleOutOfOrder;

impl Bug for EventsVisibleOutOfOrder {
    fn open(&self, server: &MemoryServer, namespace: &str) {
        server.events_out_of_order(namespace, true);
    }
}
