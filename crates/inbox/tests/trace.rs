//! The consumer span continues the record's W3C trace (`inbox/CONTRACT.md`, "Trace context"),
//! against the real database (`OUTBOX_TEST_SERVER`, a database of its own per test) and Kafka,
//! with the OpenTelemetry SDK's in-memory exporter.

use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::Result;
use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer, TracerProvider};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracer, SdkTracerProvider, SpanData};
use outbox_inbox::{
    Handler, HandlerError, Inbox, InboxConfig, InboxConsumer, InboxRecord, Outcome,
};
use outbox_relay_testkit::db::migrations_dir;
use outbox_relay_testkit::kafka::{collect_records, create_topic};
use outbox_relay_testkit::rdkafka::config::ClientConfig;
use outbox_relay_testkit::rdkafka::message::{Header, OwnedHeaders};
use outbox_relay_testkit::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_relay_testkit::unique::unique_suffix;
use outbox_relay_testkit::{kafka_bootstrap, TestDb};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const TIMEOUT: Duration = Duration::from_secs(60);

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

/// A database with the inbox tables and `coupons`, a source and a dead-letter topic.
struct World {
    db: TestDb,
    topic: String,
    dlq: String,
    bootstrap: String,
}

impl World {
    async fn new() -> Result<Self> {
        let db = TestDb::create("inbox_trace").await?;
        let mut conn = db.conn().await?;
        conn.query_drop(std::fs::read_to_string(
            migrations_dir().join("0004_inbox.sql"),
        )?)
        .await?;
        conn.query_drop(
            "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             event_key VARCHAR(255))",
        )
        .await?;
        let suffix = unique_suffix();
        let (topic, dlq) = (
            format!("inbox-rust-trace-{suffix}"),
            format!("inbox-rust-trace-{suffix}.dlq"),
        );
        let bootstrap = kafka_bootstrap();
        create_topic(&bootstrap, &topic, 1_000_000).await?;
        create_topic(&bootstrap, &dlq, 1_000_000).await?;
        Ok(World {
            db,
            topic,
            dlq,
            bootstrap,
        })
    }

    fn inbox(&self, provider: &SdkTracerProvider) -> Result<Inbox> {
        let mut config = InboxConfig::new("traced", &self.dlq);
        config.max_attempts = 3;
        config.backoff_initial = Duration::from_millis(5);
        config.backoff_max = Duration::from_millis(20);
        Ok(Inbox::new(self.db.pool().clone(), config, &self.bootstrap)?
            .with_tracer_provider(provider))
    }

    /// A record as polled at `offset` (`headers`: name, value pairs).
    fn record(&self, offset: i64, key: &str, headers: &[(&str, &str)]) -> InboxRecord {
        InboxRecord {
            topic: self.topic.clone(),
            partition: 0,
            offset,
            key: Some(key.as_bytes().to_vec()),
            value: Some(b"{}".to_vec()),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
                .collect(),
        }
    }

    async fn coupons(&self, event_key: &str) -> Result<u64> {
        let n: Option<u64> = self
            .db
            .conn()
            .await?
            .exec_first(
                "SELECT COUNT(*) FROM coupons WHERE event_key = ?",
                (event_key,),
            )
            .await?;
        Ok(n.unwrap_or(0))
    }
}

fn tracing() -> (SdkTracerProvider, InMemorySpanExporter) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    (provider, exporter)
}

/// Inserts a coupon and starts a span `handler` in the current context (as an application's
/// own instrumentation would); then fails with `fail` when set.
struct TracedHandler {
    tracer: SdkTracer,
    fail: Option<&'static str>,
}

impl TracedHandler {
    fn new(provider: &SdkTracerProvider, fail: Option<&'static str>) -> Self {
        TracedHandler {
            tracer: provider.tracer("app"),
            fail,
        }
    }
}

impl Handler for TracedHandler {
    async fn handle(
        &self,
        tx: &mut Transaction<'_>,
        record: &InboxRecord,
    ) -> Result<(), HandlerError> {
        let mut span = self.tracer.start("handler");
        let key = record
            .header_str("event_key")
            .unwrap_or_default()
            .to_owned();
        let inserted = tx
            .exec_drop("INSERT INTO coupons (event_key) VALUES (?)", (key,))
            .await;
        span.end();
        inserted?;
        match self.fail {
            Some(reason) => Err(reason.into()),
            None => Ok(()),
        }
    }
}

fn named(exporter: &InMemorySpanExporter, name: &str) -> SpanData {
    let spans: Vec<SpanData> = exporter
        .get_finished_spans()
        .expect("finished spans")
        .into_iter()
        .filter(|s| s.name == name)
        .collect();
    assert_eq!(spans.len(), 1, "{} spans named {name}", spans.len());
    spans.into_iter().next().expect("one span")
}

fn attribute(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

#[tokio::test]
async fn span_continues_the_records_trace() -> Result<()> {
    let world = World::new().await?;
    let (provider, exporter) = tracing();
    let inbox = world.inbox(&provider)?;
    let tp = traceparent();
    let record = world.record(
        42,
        "order-1",
        &[
            ("event_key", "trace-1"),
            ("traceparent", &tp),
            ("tracestate", "vendor=abc"),
        ],
    );

    let settled = inbox
        .process(&record, &TracedHandler::new(&provider, None))
        .await?;
    assert_eq!(settled.outcome, Outcome::Processed);
    assert_eq!(world.coupons("trace-1").await?, 1);

    let span = named(&exporter, &format!("{} process", world.topic));
    assert_eq!(span.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(span.parent_span_id.to_string(), PARENT_ID);
    assert!(span.parent_span_is_remote);
    assert_eq!(span.span_kind, SpanKind::Consumer);
    assert_eq!(span.status, Status::Unset);
    assert_eq!(span.span_context.trace_state().get("vendor"), Some("abc"));
    let mut got: Vec<(String, Value)> = span
        .attributes
        .iter()
        .map(|kv| (kv.key.to_string(), kv.value.clone()))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want: Vec<(String, Value)> = [
        KeyValue::new("messaging.system", "kafka"),
        KeyValue::new("messaging.operation.type", "process"),
        KeyValue::new("messaging.destination.name", world.topic.clone()),
        KeyValue::new("messaging.destination.partition.id", "0"),
        KeyValue::new("messaging.kafka.destination.partition", 0i64),
        KeyValue::new("messaging.kafka.offset", 42i64),
        KeyValue::new("messaging.kafka.message.key", "order-1"),
        KeyValue::new("messaging.consumer.group.name", "traced"),
        KeyValue::new("inbox.consumer", "traced"),
        KeyValue::new("inbox.event_key", "trace-1"),
        KeyValue::new("inbox.outcome", "processed"),
        KeyValue::new("inbox.attempts", 1i64),
    ]
    .into_iter()
    .map(|kv| (kv.key.to_string(), kv.value))
    .collect();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, want);
    let handler = named(&exporter, "handler");
    assert_eq!(
        handler.span_context.trace_id(),
        span.span_context.trace_id()
    );
    assert_eq!(handler.parent_span_id, span.span_context.span_id());

    // The redelivery: a span in the same trace, outcome duplicate, no handler span.
    exporter.reset();
    let again = inbox
        .process(&record, &TracedHandler::new(&provider, None))
        .await?;
    assert_eq!(again.outcome, Outcome::Duplicate);
    let spans = exporter.get_finished_spans()?;
    assert_eq!(spans.len(), 1, "{spans:?}");
    assert_eq!(spans[0].span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(
        attribute(&spans[0], "inbox.outcome"),
        Some(Value::from("duplicate"))
    );
    assert_eq!(spans[0].status, Status::Unset);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    world.db.drop_database().await
}

#[tokio::test]
async fn span_of_a_failing_handler_is_an_error() -> Result<()> {
    let world = World::new().await?;
    let (provider, exporter) = tracing();
    let inbox = world.inbox(&provider)?;
    let tp = traceparent();
    let record = world.record(
        7,
        "order-p",
        &[("event_key", "trace-p"), ("traceparent", &tp)],
    );

    let settled = inbox
        .process(
            &record,
            &TracedHandler::new(&provider, Some("poison record")),
        )
        .await?;
    assert_eq!(
        (settled.outcome, settled.attempts),
        (Outcome::DeadLettered, 3)
    );
    let letters = collect_records(
        &world.bootstrap,
        std::slice::from_ref(&world.dlq),
        1,
        TIMEOUT,
    )
    .await?;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].header("dlq_reason"), Some("poison record"));

    let span = named(&exporter, &format!("{} process", world.topic));
    assert_eq!(span.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(span.parent_span_id.to_string(), PARENT_ID);
    assert_eq!(span.status, Status::error("poison record"));
    assert_eq!(
        attribute(&span, "inbox.outcome"),
        Some(Value::from("dead_lettered"))
    );
    assert_eq!(attribute(&span, "inbox.attempts"), Some(Value::I64(3)));
    let attempts: Vec<Option<Value>> = span
        .events
        .iter()
        .filter(|e| e.name == "exception")
        .map(|e| {
            e.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "inbox.attempt")
                .map(|kv| kv.value.clone())
        })
        .collect();
    assert_eq!(
        attempts,
        vec![
            Some(Value::I64(1)),
            Some(Value::I64(2)),
            Some(Value::I64(3))
        ]
    );
    world.db.drop_database().await
}

#[tokio::test]
async fn span_of_a_record_without_traceparent_is_a_root() -> Result<()> {
    let world = World::new().await?;
    let (provider, exporter) = tracing();
    let inbox = world.inbox(&provider)?;

    let record = world.record(1, "order-2", &[("event_key", "trace-2")]);
    let settled = inbox
        .process(&record, &TracedHandler::new(&provider, None))
        .await?;
    assert_eq!(settled.outcome, Outcome::Processed);
    let span = named(&exporter, &format!("{} process", world.topic));
    assert_eq!(span.parent_span_id, opentelemetry::trace::SpanId::INVALID);
    assert_ne!(span.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(
        named(&exporter, "handler").parent_span_id,
        span.span_context.span_id()
    );

    // A record without event_key is dead-lettered inside its span: status error.
    exporter.reset();
    let settled = inbox
        .process(
            &world.record(2, "order-x", &[]),
            &TracedHandler::new(&provider, None),
        )
        .await?;
    assert_eq!(settled.outcome, Outcome::DeadLettered);
    let span = named(&exporter, &format!("{} process", world.topic));
    assert_eq!(span.status, Status::error("missing event_key header"));
    assert_eq!(attribute(&span, "inbox.event_key"), None);
    drop(inbox); // returns its connection: the pool's disconnect waits for it
    world.db.drop_database().await
}

/// The runner: a record produced to Kafka with a traceparent header is processed in the
/// producer's trace, with the consumer's group as `messaging.consumer.group.name`.
#[tokio::test]
async fn consumer_span_has_the_group_and_the_records_trace() -> Result<()> {
    let world = World::new().await?;
    let (provider, exporter) = tracing();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &world.bootstrap)
        .create()?;
    let tp = traceparent();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_key",
            value: Some("trace-r"),
        })
        .insert(Header {
            key: "traceparent",
            value: Some(tp.as_str()),
        });
    producer
        .send(
            FutureRecord::to(&world.topic)
                .key("order-r")
                .payload("{}")
                .headers(headers),
            TIMEOUT,
        )
        .await
        .map_err(|(e, _)| e)?;

    let group = format!("inbox-rust-trace-{}", unique_suffix());
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &world.bootstrap)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest");
    let consumer = InboxConsumer::with_config(
        config,
        &[world.topic.as_str()],
        world.inbox(&provider)?,
        TracedHandler::new(&provider, None),
    )?;
    let mut outcomes = Vec::new();
    tokio::time::timeout(
        TIMEOUT,
        consumer.run_with(std::future::pending(), |_, settled, _| {
            outcomes.push(settled.outcome);
            ControlFlow::Break(())
        }),
    )
    .await??;
    assert_eq!(outcomes, vec![Outcome::Processed]);
    assert_eq!(world.coupons("trace-r").await?, 1);

    let span = named(&exporter, &format!("{} process", world.topic));
    assert_eq!(span.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(span.parent_span_id.to_string(), PARENT_ID);
    assert_eq!(
        attribute(&span, "messaging.consumer.group.name"),
        Some(Value::from(group))
    );
    assert_eq!(
        attribute(&span, "messaging.kafka.offset"),
        Some(Value::I64(0))
    );
    world.db.drop_database().await
}
