//! OpenTelemetry spans of relayed rows, exported as OTLP over HTTP/protobuf (`[tracing]`).
//!
//! One span per outbox row the relay sends, of kind `PRODUCER`, named `send <topic>` (OTel
//! semantic conventions for messaging, where `send` replaced `publish`). It starts when the
//! relay read the binlog event that carried the row, has an event `kafka.produce` when the
//! record was handed to the producer, and ends when Kafka acknowledged the record (with its
//! partition and offset) or when the row's dead letter was acknowledged (status error).
//!
//! The parent is the row's W3C trace context: its `traceparent` (and `tracestate`) header as
//! `outbox.trace_context` or a mapping made it, read with the SDK's `TraceContextPropagator`.
//! A row without a valid `traceparent` starts a new trace. The record then carries the span's
//! own context in `traceparent` / `tracestate` instead of the row's (the conventions'
//! producer-side injection: a consumer's span becomes a child of the relay's `send` span, which
//! is a child of the span that wrote the row); dead letters keep the row's headers.
//!
//! A leaf like [`crate::observe::metrics`]: the pipeline feeds it plain values. With
//! `[tracing]` off there is no [`RowSpans`] and the pipeline makes no span and allocates
//! nothing for them. Export runs on the SDK batch processor's own thread with a bounded queue
//! (`tracing.max_queue_size`): a slow or unreachable receiver drops spans (the SDK logs it at
//! `warn`), it never stops or slows the relay.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::trace::{SpanBuilder, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, Span,
};
use opentelemetry_sdk::Resource;

use crate::config::TracingConfig;
use crate::error::RelayError;

/// W3C header names (lowercase, as the propagator asks for them).
const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The span exporter and tracer of one relay process; cheap to clone.
#[derive(Clone)]
pub struct RowSpans {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    propagator: Arc<TraceContextPropagator>,
}

impl std::fmt::Debug for RowSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RowSpans")
    }
}

/// Where spans go: the configured endpoint, the standard environment, or nowhere.
fn endpoint(config: &TracingConfig, env: impl Fn(&str) -> Option<String>) -> Option<Endpoint> {
    match config.otlp_endpoint.as_deref() {
        Some("") => None,
        Some(base) => Some(Endpoint::Url(format!(
            "{}/v1/traces",
            base.trim_end_matches('/')
        ))),
        None => [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .into_iter()
        .find_map(|var| env(var).filter(|v| !v.trim().is_empty()).map(|v| (var, v)))
        .map(|(var, value)| Endpoint::Env(var, value)),
    }
}

#[derive(Debug, PartialEq)]
enum Endpoint {
    /// `tracing.otlp_endpoint` + `/v1/traces`.
    Url(String),
    /// Left to the exporter, which reads this variable (named, with its value, for the log).
    Env(&'static str, String),
}

impl RowSpans {
    /// The exporter of `config`, or `None` when `[tracing]` is off (no endpoint configured nor
    /// in `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`, or
    /// `OTEL_SDK_DISABLED=true`). Nothing is sent yet: an unreachable receiver shows later, as
    /// export warnings.
    ///
    /// # Errors
    /// [`RelayError::Config`] when the exporter cannot be built (an endpoint that is not a URL).
    pub fn start(config: &TracingConfig) -> Result<Option<Self>, RelayError> {
        let env = |name: &str| std::env::var(name).ok();
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let Some(endpoint) = endpoint(config, env) else {
            return Ok(None);
        };
        use opentelemetry_otlp::{Protocol, WithExportConfig as _};
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(Duration::from_millis(config.export_timeout_ms));
        let shown = match &endpoint {
            Endpoint::Url(url) => {
                builder = builder.with_endpoint(url.clone());
                url.clone()
            }
            Endpoint::Env(var, value) => format!("{value} (from {var})"),
        };
        let exporter = builder.build().map_err(|e| {
            RelayError::Config(format!("tracing: cannot build the OTLP exporter: {e}"))
        })?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue_size)
            .build();
        let mut resource = Resource::builder();
        if let Some(name) = config.service_name.as_deref() {
            resource = resource.with_service_name(name.to_owned());
        } else if env("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("outbox-relay");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource.build())
            .build();
        tracing::info!(endpoint = %shown, sample_ratio = config.sample_ratio,
            "OpenTelemetry: one span per relayed row, exported over OTLP/HTTP");
        Ok(Some(Self::with_provider(provider)))
    }

    fn with_provider(provider: SdkTracerProvider) -> Self {
        Self {
            tracer: provider.tracer("outbox-relay"),
            provider,
            propagator: Arc::new(TraceContextPropagator::new()),
        }
    }

    /// Exports what is queued and stops the exporter, waiting at most `timeout` (on a blocking
    /// thread: the batch processor's export is synchronous). Failures are logged.
    pub async fn shutdown(self, timeout: Duration) {
        let provider = self.provider;
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout)).await;
        match done {
            Ok(Ok(())) => tracing::debug!("OpenTelemetry spans flushed"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "OpenTelemetry: flushing the last spans failed")
            }
            Err(e) => tracing::warn!(error = %e, "OpenTelemetry: flushing the last spans failed"),
        }
    }

    /// Starts the span of one row whose record goes to `row.topic`, the row's trace context
    /// taken from `headers` (see the module documentation).
    pub fn start_row<'h>(
        &self,
        row: &RowStart<'_>,
        headers: impl Iterator<Item = (&'h str, &'h [u8])> + Clone,
    ) -> RowSpan {
        let parent = self
            .propagator
            .extract(&HeaderReader(headers, std::marker::PhantomData));
        let mut attributes = Vec::with_capacity(10);
        attributes.push(KeyValue::new("messaging.system", "kafka"));
        attributes.push(KeyValue::new("messaging.operation.type", "send"));
        attributes.push(KeyValue::new("messaging.operation.name", "send"));
        if !row.topic.is_empty() {
            attributes.push(KeyValue::new(
                "messaging.destination.name",
                row.topic.to_owned(),
            ));
        }
        if !row.key.is_empty() {
            attributes.push(KeyValue::new(
                "messaging.kafka.message.key",
                String::from_utf8_lossy(row.key).into_owned(),
            ));
        }
        if row.tombstone {
            attributes.push(KeyValue::new("messaging.kafka.message.tombstone", true));
        }
        attributes.push(KeyValue::new("outbox.table", row.table.to_owned()));
        attributes.push(KeyValue::new("outbox.source", row.source.to_owned()));
        if let Some(key) = row.event_key {
            attributes.push(KeyValue::new(
                "outbox.event_key",
                String::from_utf8_lossy(key).into_owned(),
            ));
        }
        attributes.push(KeyValue::new(
            "outbox.binlog.position",
            row.position.clone(),
        ));
        let name: Cow<'static, str> = if row.topic.is_empty() {
            Cow::Borrowed("send")
        } else {
            Cow::Owned(format!("send {}", row.topic))
        };
        let started = SystemTime::now()
            .checked_sub(row.read_at.elapsed())
            .unwrap_or_else(SystemTime::now);
        let builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Producer)
            .with_start_time(started)
            .with_attributes(attributes);
        RowSpan(
            self.tracer.build_with_context(builder, &parent),
            self.propagator.clone(),
        )
    }
}

/// What a row's span says about it when it starts.
#[derive(Debug)]
pub struct RowStart<'a> {
    /// The record's topic (`""` when the row has none: a dead letter before routing).
    pub topic: &'a str,
    /// The record's key.
    pub key: &'a [u8],
    /// The record has no value (a tombstone).
    pub tombstone: bool,
    /// `database.table` of the outbox.
    pub table: &'a str,
    /// The source (connector name) that relays it.
    pub source: &'a str,
    /// The row's `event_key` column.
    pub event_key: Option<&'a [u8]>,
    /// The binlog position of the row's event (`file:pos`).
    pub position: String,
    /// When the relay read the row's binlog event: the span's start.
    pub read_at: Instant,
}

/// The span of one row, from its read to its acknowledgement. Dropped without an end (a run
/// that ended before the record's acknowledgement), it ends then with no status.
pub struct RowSpan(Span, Arc<TraceContextPropagator>);

impl std::fmt::Debug for RowSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RowSpan")
            .field(self.0.span_context())
            .finish()
    }
}

impl RowSpan {
    /// Replaces the `traceparent` / `tracestate` headers with this span's context (W3C), so
    /// the record's consumer continues the trace under this span.
    pub fn inject(&self, headers: &mut Vec<(Arc<str>, Option<Vec<u8>>)>) {
        headers.retain(|(name, _)| &**name != TRACEPARENT && &**name != TRACESTATE);
        let cx = Context::new().with_remote_span_context(self.0.span_context().clone());
        self.1.inject_context(&cx, &mut HeaderWriter(headers));
    }

    /// The record was handed to the producer.
    pub fn produced(&mut self) {
        self.0.add_event("kafka.produce", Vec::new());
    }

    /// Kafka acknowledged the record at `partition` / `offset`: ends the span (status ok).
    pub fn acked(mut self, partition: i32, offset: i64) {
        self.0.set_attribute(KeyValue::new(
            "messaging.destination.partition.id",
            partition.to_string(),
        ));
        self.0
            .set_attribute(KeyValue::new("messaging.kafka.offset", offset));
        self.0.set_status(Status::Ok);
        self.0.end();
    }

    /// The row went to the dead-letter topic instead (`reason`); ends the span when the dead
    /// letter is acknowledged, with status error.
    pub fn dead_lettered(mut self, reason: &str) {
        self.0
            .set_attribute(KeyValue::new("outbox.dead_lettered", true));
        self.0
            .set_attribute(KeyValue::new("error.type", "dead_lettered"));
        self.0.set_status(Status::error(reason.to_owned()));
        self.0.end();
    }

    /// The record was not delivered (`error`): ends the span with status error.
    pub fn failed(mut self, error: &str) {
        self.0
            .set_attribute(KeyValue::new("error.type", "not_delivered"));
        self.0.set_status(Status::error(error.to_owned()));
        self.0.end();
    }
}

/// Record headers as the propagator reads them (first header of a name wins).
struct HeaderReader<'h, I>(I, std::marker::PhantomData<&'h ()>);

impl<'h, I: Iterator<Item = (&'h str, &'h [u8])> + Clone> Extractor for HeaderReader<'h, I> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .clone()
            .find(|(name, _)| *name == key)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.clone().map(|(name, _)| name).collect()
    }
}

struct HeaderWriter<'a>(&'a mut Vec<(Arc<str>, Option<Vec<u8>>)>);

impl Injector for HeaderWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes an empty `tracestate` when there is none: no header then.
        if !value.is_empty() {
            self.0.push((Arc::from(key), Some(value.into_bytes())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans() -> RowSpans {
        // No processor: spans are made and sampled, nothing is exported.
        RowSpans::with_provider(SdkTracerProvider::builder().build())
    }

    fn row() -> RowStart<'static> {
        RowStart {
            topic: "outbox.event.order",
            key: b"42",
            tombstone: false,
            table: "shop.outbox",
            source: "orders",
            event_key: Some(b"e-1"),
            position: "binlog.000001:1234".into(),
            read_at: Instant::now(),
        }
    }

    fn header<'a>(headers: &'a [(Arc<str>, Option<Vec<u8>>)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| &**n == name)
            .and_then(|(_, v)| std::str::from_utf8(v.as_deref()?).ok())
    }

    #[test]
    fn the_rows_trace_is_the_parent_and_the_record_carries_the_relays_span() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers: Vec<(Arc<str>, Option<Vec<u8>>)> = vec![
            (Arc::from("id"), Some(b"1".to_vec())),
            (Arc::from("traceparent"), Some(parent.as_bytes().to_vec())),
            (Arc::from("tracestate"), Some(b"shop=1".to_vec())),
        ];
        let span = spans().start_row(
            &row(),
            headers
                .iter()
                .filter_map(|(n, v)| Some((&**n, v.as_deref()?))),
        );
        span.inject(&mut headers);
        let sent = header(&headers, "traceparent").expect("a traceparent");
        let parts: Vec<&str> = sent.split('-').collect();
        assert_eq!(parts[1], "4bf92f3577b34da6a3ce929d0e0e4736", "same trace");
        assert_ne!(
            parts[2], "00f067aa0ba902b7",
            "the relay's span, not the row's"
        );
        assert_eq!(parts[3], "01");
        assert_eq!(header(&headers, "tracestate"), Some("shop=1"));
        assert_eq!(
            headers
                .iter()
                .filter(|(n, _)| &**n == "traceparent")
                .count(),
            1
        );
        assert_eq!(header(&headers, "id"), Some("1"));
        span.acked(2, 17);
    }

    #[test]
    fn a_row_without_trace_context_starts_a_new_trace() {
        let mut headers: Vec<(Arc<str>, Option<Vec<u8>>)> = vec![(
            Arc::from("traceparent"),
            Some(b"not a traceparent".to_vec()),
        )];
        let span = spans().start_row(
            &row(),
            headers
                .iter()
                .filter_map(|(n, v)| Some((&**n, v.as_deref()?))),
        );
        span.inject(&mut headers);
        let sent = header(&headers, "traceparent").expect("a traceparent");
        assert_eq!(sent.len(), 55, "{sent}");
        assert!(sent.starts_with("00-") && sent.ends_with("-01"), "{sent}");
        assert_eq!(header(&headers, "tracestate"), None);
    }

    #[test]
    fn the_endpoint_comes_from_the_config_then_the_environment() {
        let config = |e: Option<&str>| TracingConfig {
            otlp_endpoint: e.map(str::to_owned),
            ..TracingConfig::default()
        };
        let none = |_: &str| None;
        let set = |v: &str| -> Option<String> {
            (v == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://c:4318".to_owned())
        };
        assert_eq!(endpoint(&config(None), none), None);
        assert_eq!(endpoint(&config(Some("")), set), None);
        assert_eq!(
            endpoint(&config(Some("http://127.0.0.1:4318/")), set),
            Some(Endpoint::Url("http://127.0.0.1:4318/v1/traces".into()))
        );
        assert_eq!(
            endpoint(&config(None), set),
            Some(Endpoint::Env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://c:4318".into()
            ))
        );
    }
}
