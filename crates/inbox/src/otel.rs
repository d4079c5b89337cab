//! The consumer span of each record (`inbox/CONTRACT.md`, "Trace context").
//!
//! The producer's W3C trace context (headers `traceparent`, `tracestate`:
//! <https://www.w3.org/TR/trace-context/>) is read from the record, and the record is processed
//! inside a span `"<topic> process"` of kind CONSUMER whose parent is that remote context
//! (OpenTelemetry messaging semantic conventions, plus the inbox's own attributes). The handler's
//! future runs with that span's context current ([`opentelemetry::Context::current`]), so the
//! spans it starts join the producer's trace.
//!
//! Only the `opentelemetry` API is used: without a tracer provider installed by the application
//! (`opentelemetry::global::set_tracer_provider`) or given to [`crate::Inbox::with_tracer_provider`]
//! every span is a no-op. The W3C headers are parsed here over the API's types (version `00` and
//! the spec's rules for later versions), so the library needs no SDK; another format is read
//! with [`crate::Inbox::with_propagator`].

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use opentelemetry::global::{BoxedTracer, ObjectSafeTracer};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};

use crate::outcome::{Outcome, Settled};
use crate::record::InboxRecord;

/// The instrumentation scope name of the spans.
pub const INSTRUMENTATION_NAME: &str = "outbox-inbox";

/// The W3C header of the parent: `version-trace_id-parent_id-trace_flags`.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header of vendor-specific trace data.
pub const TRACESTATE: &str = "tracestate";

/// Reads a record's headers for a [`TextMapPropagator`]: the first header of a name, as the
/// Rust helper reads its own headers, if its value is UTF-8.
pub struct HeaderExtractor<'a>(pub &'a InboxRecord);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.header_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.headers.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// The remote span context of a W3C `traceparent` (and `tracestate`) pair, or `None` when the
/// header is absent or invalid (the span then starts a new trace).
///
/// Rules of the spec (section "traceparent Header Field Values"): lower-case hex only; version
/// `ff` is invalid; version `00` has exactly four fields; a later version may carry more fields
/// after the flags (ignored, as it says); an all-zero trace id or parent id is invalid. An
/// invalid `tracestate` is dropped, keeping the parent.
pub fn parse_traceparent(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    fn hex(s: &str, len: usize) -> bool {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }
    let value = traceparent.trim();
    let mut parts = value.splitn(5, '-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    if !hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
        return None;
    }
    // A later version's flags field is followed by '-' and more data, or is the end.
    if !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let state = tracestate
        .and_then(|s| TraceState::from_str(s.trim()).ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    ))
}

/// Where the spans go and how the parent is read: [`crate::Inbox`]'s tracing settings.
#[derive(Clone, Default)]
pub(crate) struct Tracing {
    /// `None`: the global tracer provider at the time of each record.
    tracer: Option<Arc<BoxedTracer>>,
    /// `None`: the W3C headers ([`parse_traceparent`]).
    propagator: Option<Arc<dyn TextMapPropagator + Send + Sync>>,
    /// `messaging.consumer.group.name`; `None`: the consumer name.
    pub(crate) group: Option<String>,
}

impl fmt::Debug for Tracing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracing")
            .field("tracer", &self.tracer.as_ref().map(|_| "custom"))
            .field("propagator", &self.propagator.as_ref().map(|_| "custom"))
            .field("group", &self.group)
            .finish()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(INSTRUMENTATION_NAME)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

impl Tracing {
    pub(crate) fn set_tracer_provider<P>(&mut self, provider: &P)
    where
        P: TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as Tracer>::Span: Send + Sync + 'static,
    {
        let tracer: Box<dyn ObjectSafeTracer + Send + Sync> =
            Box::new(provider.tracer_with_scope(scope()));
        self.tracer = Some(Arc::new(BoxedTracer::new(tracer)));
    }

    pub(crate) fn set_propagator(&mut self, propagator: Arc<dyn TextMapPropagator + Send + Sync>) {
        self.propagator = Some(propagator);
    }

    /// The parent context of `record`'s span: its remote trace context on top of `base`, or
    /// `base` (the caller's current context) when it has none.
    fn parent(&self, base: &Context, record: &InboxRecord) -> Context {
        if let Some(p) = &self.propagator {
            return p.extract_with_context(base, &HeaderExtractor(record));
        }
        match record
            .header_str(TRACEPARENT)
            .and_then(|tp| parse_traceparent(tp, record.header_str(TRACESTATE)))
        {
            Some(remote) => base.with_remote_span_context(remote),
            None => base.clone(),
        }
    }

    /// Starts the consumer span of `record`; the returned context carries it.
    pub(crate) fn start(
        &self,
        record: &InboxRecord,
        consumer: &str,
        event_key_header: &str,
    ) -> Context {
        let parent = self.parent(&Context::current(), record);
        let mut attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", record.topic.clone()),
            KeyValue::new(
                "messaging.destination.partition.id",
                record.partition.to_string(),
            ),
            KeyValue::new(
                "messaging.kafka.destination.partition",
                i64::from(record.partition),
            ),
            KeyValue::new("messaging.kafka.offset", record.offset),
            KeyValue::new(
                "messaging.consumer.group.name",
                self.group.clone().unwrap_or_else(|| consumer.to_owned()),
            ),
            KeyValue::new("inbox.consumer", consumer.to_owned()),
        ];
        if let Some(key) = record.key_str().filter(|k| !k.is_empty()) {
            attributes.push(KeyValue::new("messaging.kafka.message.key", key.to_owned()));
        }
        if let Some(key) = record
            .header_str(event_key_header)
            .filter(|k| !k.is_empty())
        {
            attributes.push(KeyValue::new("inbox.event_key", key.to_owned()));
        }
        let name: Cow<'static, str> = format!("{} process", record.topic).into();
        let span = match &self.tracer {
            Some(tracer) => tracer
                .span_builder(name)
                .with_kind(SpanKind::Consumer)
                .with_attributes(attributes)
                .start_with_context(tracer.as_ref(), &parent),
            None => {
                let tracer = opentelemetry::global::tracer_with_scope(scope());
                tracer
                    .span_builder(name)
                    .with_kind(SpanKind::Consumer)
                    .with_attributes(attributes)
                    .start_with_context(&tracer, &parent)
            }
        };
        parent.with_span(span)
    }
}

/// A failed attempt of the current span's record: an `exception` event.
pub(crate) fn attempt_failed(error: &str, attempt: u32) {
    Context::current().span().add_event(
        "exception",
        vec![
            KeyValue::new("exception.message", error.to_owned()),
            KeyValue::new("inbox.attempt", i64::from(attempt)),
        ],
    );
}

/// An attempt ended by an infrastructure error (not counted): an `exception` event with
/// `inbox.attempt` = the number of the attempt that is redone and `inbox.outage` = true.
pub(crate) fn outage_failed(error: &str, attempt: u32) {
    Context::current().span().add_event(
        "exception",
        vec![
            KeyValue::new("exception.message", error.to_owned()),
            KeyValue::new("inbox.attempt", i64::from(attempt)),
            KeyValue::new("inbox.outage", true),
        ],
    );
}

/// The record was settled: outcome and attempts; status error for parked and dead-lettered.
pub(crate) fn settled(cx: &Context, settled: &Settled) {
    let span = cx.span();
    span.set_attributes([
        KeyValue::new("inbox.outcome", settled.outcome.as_str()),
        KeyValue::new("inbox.attempts", i64::from(settled.attempts)),
    ]);
    if settled.outcome == Outcome::DeadLettered {
        span.set_status(Status::error(settled.reason.clone().unwrap_or_default()));
    }
}

/// The record could not be settled (`error` is returned): status error.
pub(crate) fn unsettled(cx: &Context, error: &dyn std::error::Error) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("inbox.outcome", "unsettled"));
    span.record_error(error);
    span.set_status(Status::error(error.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    #[test]
    fn parses_version_00() {
        let cx =
            parse_traceparent(&format!("00-{TRACE}-{PARENT}-01"), Some("a=1,b=2")).expect("valid");
        assert_eq!(cx.trace_id().to_string(), TRACE);
        assert_eq!(cx.span_id().to_string(), PARENT);
        assert!(cx.is_sampled() && cx.is_remote());
        assert_eq!(cx.trace_state().get("b"), Some("2"));
        let unsampled = parse_traceparent(&format!("00-{TRACE}-{PARENT}-00"), None).expect("valid");
        assert!(!unsampled.is_sampled());
    }

    #[test]
    fn refuses_what_the_spec_calls_invalid() {
        for bad in [
            String::new(),
            format!("ff-{TRACE}-{PARENT}-01"),
            format!("00-{TRACE}-{PARENT}-01-extra"),
            format!("00-{}-{PARENT}-01", TRACE.to_uppercase()),
            format!("00-{}-{PARENT}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{TRACE}-{PARENT}-1"),
            format!("0-{TRACE}-{PARENT}-01"),
            format!("00-{TRACE}-{PARENT}"),
            format!("00-{TRACE}x-{PARENT}-01"),
        ] {
            assert!(parse_traceparent(&bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_may_carry_more_fields() {
        let cx =
            parse_traceparent(&format!("cc-{TRACE}-{PARENT}-01-what-comes"), None).expect("valid");
        assert_eq!(cx.trace_id().to_string(), TRACE);
    }

    #[test]
    fn an_invalid_tracestate_keeps_the_parent() {
        let cx =
            parse_traceparent(&format!("00-{TRACE}-{PARENT}-01"), Some("=,,=")).expect("valid");
        assert_eq!(cx.span_id().to_string(), PARENT);
    }
}
