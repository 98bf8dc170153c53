//! One trace from the request that enqueued a job to each of its attempts (CONTRACT
//! E12), through `tracing` and OpenTelemetry (feature `opentelemetry`).
//!
//! At enqueue, [`TraceContextLayer`] opens a `jobs.enqueue` span under the caller's
//! current span and stores that span's W3C `traceparent` with each new job. When a
//! worker runs the job, its `job` span is made a child of that context, so an
//! OpenTelemetry exporter shows request → `jobs.enqueue` → `job` (one per attempt) in
//! one trace. The store only keeps the text; nothing here needs a bespoke tracing
//! system, only the `tracing-opentelemetry` layer the application already installs.

use std::sync::Arc;

use durq_core::{async_trait, Backend, Enqueued, Layer, LayeredBackend, NewJob, Result, Timestamp};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The W3C `traceparent` of `span`, or `None` when it belongs to no sampled-or-not
/// OpenTelemetry trace (no OpenTelemetry layer is installed, or the span is disabled).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// The OpenTelemetry context a stored `traceparent` names, as a remote parent; `None`
/// for text that is not one (the store validates it at enqueue, so only a record
/// written by something else could hold such text).
pub fn context_of(traceparent: &str) -> Option<opentelemetry::Context> {
    let mut parts = traceparent.split('-');
    let (Some("00"), Some(trace_id), Some(span_id), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let span_context = SpanContext::new(
        TraceId::from_hex(trace_id).ok()?,
        SpanId::from_hex(span_id).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    span_context
        .is_valid()
        .then(|| opentelemetry::Context::new().with_remote_span_context(span_context))
}

/// Makes `span` (a job's span, not yet entered) a child of the trace `traceparent`
/// names. A span that is disabled, or a subscriber without the OpenTelemetry layer,
/// leaves it as it was: tracing must never stop a job.
pub(crate) fn adopt(span: &tracing::Span, traceparent: &str) {
    let Some(parent) = context_of(traceparent) else {
        return;
    };
    if let Err(err) = span.set_parent(parent) {
        tracing::trace!(error = %err, "cannot join the job's trace");
    }
}

/// Stamps each enqueued job with the trace context of a `jobs.enqueue` span opened
/// under the caller's current span (CONTRACT E12). A job that already carries a
/// trace context keeps it.
///
/// [`connect`](crate::connect) adds it when the `opentelemetry` feature is on; add it
/// to a store opened otherwise with `store.layer(TraceContextLayer)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextLayer;

impl Layer for TraceContextLayer {
    fn layer(&self, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(Stamped { inner })
    }
}

/// A backend seen through the [`TraceContextLayer`].
#[derive(Debug)]
struct Stamped {
    inner: Arc<dyn Backend>,
}

fn stamp(job: &mut NewJob, traceparent: Option<&String>) {
    if job.trace_context.is_none() {
        job.trace_context = traceparent.cloned();
    }
}

#[async_trait]
impl LayeredBackend for Stamped {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn enqueue(&self, mut job: NewJob, now: Timestamp) -> Result<Enqueued> {
        let span = tracing::info_span!("jobs.enqueue", queue = %job.queue);
        stamp(&mut job, traceparent_of(&span).as_ref());
        tracing::Instrument::instrument(self.inner.enqueue(job, now), span).await
    }

    async fn enqueue_batch(&self, mut jobs: Vec<NewJob>, now: Timestamp) -> Result<Vec<Enqueued>> {
        let span = tracing::info_span!("jobs.enqueue", jobs = jobs.len());
        let traceparent = traceparent_of(&span);
        for job in &mut jobs {
            stamp(job, traceparent.as_ref());
        }
        tracing::Instrument::instrument(self.inner.enqueue_batch(jobs, now), span).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_the_context_it_names() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = context_of(text).expect("a valid traceparent");
        let span = context.span();
        let read = span.span_context();
        assert_eq!(
            format!(
                "00-{:032x}-{:016x}-{:02x}",
                read.trace_id(),
                read.span_id(),
                read.trace_flags().to_u8()
            ),
            text
        );
        assert!(read.is_remote());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(context_of(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn without_an_opentelemetry_layer_nothing_is_stamped() {
        let span = tracing::info_span!("no subscriber");
        assert_eq!(traceparent_of(&span), None);
        let mut job = NewJob::new("q");
        stamp(&mut job, None);
        assert_eq!(job.trace_context, None);
        let mut kept = NewJob::new("q")
            .trace_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        stamp(
            &mut kept,
            Some(&"00-11111111111111111111111111111111-2222222222222222-01".to_owned()),
        );
        assert_eq!(
            kept.trace_context.as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "a job's own trace context is kept"
        );
    }
}
