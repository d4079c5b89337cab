package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.EventData;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.nio.charset.StandardCharsets;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The consumer span continues the record's W3C trace (inbox/CONTRACT.md, "Trace context"), against
 * the real database and Kafka, with the SDK's in-memory exporter.
 */
class InboxTracingTest {
  private static final String TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
  private static final String PARENT_ID = "00f067aa0ba902b7";
  private static final String TRACEPARENT = "00-" + TRACE_ID + "-" + PARENT_ID + "-01";
  private static final AtomicInteger OFFSETS = new AtomicInteger();

  private static TestServers servers;
  private static String sourceTopic;
  private InMemorySpanExporter exporter;
  private OpenTelemetrySdk otel;

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
    sourceTopic = servers.topic("traced", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  @BeforeEach
  void tracing() {
    exporter = InMemorySpanExporter.create();
    otel =
        OpenTelemetrySdk.builder()
            .setTracerProvider(
                SdkTracerProvider.builder()
                    .addSpanProcessor(SimpleSpanProcessor.create(exporter))
                    .build())
            .build();
  }

  @AfterEach
  void closeTracing() {
    otel.close();
  }

  /** A record as polled, with {@code extra} headers (name, value pairs). */
  private static ConsumerRecord<byte[], byte[]> record(
      String key, String eventKey, String... extra) {
    RecordHeaders headers = new RecordHeaders();
    if (eventKey != null) {
      headers.add("event_key", bytes(eventKey));
    }
    headers.add("aggregate_type", bytes("order"));
    for (int i = 0; i + 1 < extra.length; i += 2) {
      headers.add(extra[i], bytes(extra[i + 1]));
    }
    return new ConsumerRecord<>(
        sourceTopic,
        0,
        OFFSETS.incrementAndGet(),
        0L,
        TimestampType.CREATE_TIME,
        -1,
        -1,
        bytes(key),
        bytes("{}"),
        headers,
        Optional.empty());
  }

  /**
   * Inserts a coupon and starts a span {@code handler} in the current context (as an application's
   * own instrumentation would); then throws {@code failure} when not null.
   */
  private Handler traced(String consumer, Exception failure) {
    return (tx, record) -> {
      Span span = otel.getTracer("app").spanBuilder("handler").startSpan();
      try {
        try (PreparedStatement ps =
            tx.prepareStatement(
                "INSERT INTO coupons (consumer, order_id, event_key) VALUES (?, ?, ?)")) {
          ps.setString(1, consumer);
          ps.setString(2, new String(record.key(), StandardCharsets.UTF_8));
          ps.setString(3, header(record, "event_key"));
          ps.executeUpdate();
        }
      } finally {
        span.end();
      }
      if (failure != null) {
        throw failure;
      }
    };
  }

  private Inbox inbox(String dlq) {
    InboxSettings settings =
        InboxSettings.builder("traced", dlq)
            .maxAttempts(3)
            .backoffInitial(Duration.ofMillis(5))
            .backoffMax(Duration.ofMillis(20))
            .openTelemetry(otel)
            .build();
    return new Inbox(settings, servers.dataSource, servers.producer(), null);
  }

  private SpanData named(String name) {
    List<SpanData> spans =
        exporter.getFinishedSpanItems().stream().filter(s -> s.getName().equals(name)).toList();
    assertEquals(1, spans.size(), exporter.getFinishedSpanItems().toString());
    return spans.get(0);
  }

  @Test
  void spanContinuesTheRecordsTrace() throws Exception {
    Inbox inbox = inbox("unused");
    ConsumerRecord<byte[], byte[]> rec =
        record("order-1", "trace-1", "traceparent", TRACEPARENT, "tracestate", "vendor=abc");

    assertEquals(new Result(Outcome.PROCESSED, 1), inbox.process(rec, traced("traced", null)));

    assertEquals(1, servers.coupons("trace-1"));
    SpanData span = named(sourceTopic + " process");
    assertEquals(TRACE_ID, span.getTraceId());
    assertEquals(PARENT_ID, span.getParentSpanId());
    assertTrue(span.getParentSpanContext().isRemote());
    assertEquals("abc", span.getParentSpanContext().getTraceState().get("vendor"));
    assertEquals(SpanKind.CONSUMER, span.getKind());
    assertEquals(StatusCode.UNSET, span.getStatus().getStatusCode());
    Attributes want =
        Attributes.builder()
            .put("messaging.system", "kafka")
            .put("messaging.operation.type", "process")
            .put("messaging.destination.name", sourceTopic)
            .put("messaging.destination.partition.id", "0")
            .put("messaging.kafka.destination.partition", 0L)
            .put("messaging.kafka.offset", rec.offset())
            .put("messaging.kafka.message.key", "order-1")
            .put("messaging.consumer.group.name", "traced")
            .put("inbox.consumer", "traced")
            .put("inbox.event_key", "trace-1")
            .put("inbox.outcome", "processed")
            .put("inbox.attempts", 1L)
            .build();
    assertEquals(want.asMap(), span.getAttributes().asMap());
    SpanData handler = named("handler");
    assertEquals(span.getTraceId(), handler.getTraceId());
    assertEquals(span.getSpanId(), handler.getParentSpanId());

    // The redelivery: a span in the same trace, outcome duplicate, no handler span.
    exporter.reset();
    assertEquals(new Result(Outcome.DUPLICATE, 1), inbox.process(rec, traced("traced", null)));
    List<SpanData> spans = exporter.getFinishedSpanItems();
    assertEquals(1, spans.size(), spans.toString());
    assertEquals(TRACE_ID, spans.get(0).getTraceId());
    assertEquals(
        "duplicate", spans.get(0).getAttributes().get(AttributeKey.stringKey("inbox.outcome")));
    assertEquals(StatusCode.UNSET, spans.get(0).getStatus().getStatusCode());
  }

  @Test
  void aBatchGivesEachRecordItsOwnSpan() throws Exception {
    Inbox inbox = inbox("unused");
    ConsumerRecord<byte[], byte[]> first =
        record("order-b", "trace-b1", "traceparent", TRACEPARENT);
    ConsumerRecord<byte[], byte[]> second = record("order-b", "trace-b2");
    ConsumerRecord<byte[], byte[]> again = record("order-b", "trace-b1");
    assertEquals(
        List.of(
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.DUPLICATE, 1)),
        inbox.processBatch(List.of(first, second, again), traced("traced", null)));
    List<SpanData> spans =
        exporter.getFinishedSpanItems().stream()
            .filter(s -> s.getName().equals(sourceTopic + " process"))
            .sorted(
                java.util.Comparator.comparing(
                    s -> s.getAttributes().get(AttributeKey.longKey("messaging.kafka.offset"))))
            .toList();
    assertEquals(3, spans.size(), exporter.getFinishedSpanItems().toString());
    AttributeKey<String> outcome = AttributeKey.stringKey("inbox.outcome");
    assertEquals("processed", spans.get(0).getAttributes().get(outcome));
    assertEquals("processed", spans.get(1).getAttributes().get(outcome));
    assertEquals("duplicate", spans.get(2).getAttributes().get(outcome));
    assertEquals(TRACE_ID, spans.get(0).getTraceId());
    assertEquals(PARENT_ID, spans.get(0).getParentSpanId());
    assertEquals(1L, spans.get(1).getAttributes().get(AttributeKey.longKey("inbox.attempts")));
    // Each handler span is the child of its own record's span.
    List<SpanData> handlers =
        exporter.getFinishedSpanItems().stream()
            .filter(s -> s.getName().equals("handler"))
            .toList();
    assertEquals(2, handlers.size());
    assertEquals(spans.get(0).getSpanId(), handlers.get(0).getParentSpanId());
    assertEquals(spans.get(1).getSpanId(), handlers.get(1).getParentSpanId());
  }

  @Test
  void spanOfAFailingHandlerIsAnError() throws Exception {
    String dlq = servers.topic("traced-dlq", 1);
    Inbox inbox = inbox(dlq);
    ConsumerRecord<byte[], byte[]> rec = record("order-p", "trace-p", "traceparent", TRACEPARENT);

    assertEquals(
        new Result(Outcome.DEAD_LETTERED, 3),
        inbox.process(rec, traced("traced", new Exception("poison record"))));

    assertEquals("poison record", header(servers.readAll(dlq, 1).get(0), "dlq_reason"));
    SpanData span = named(sourceTopic + " process");
    assertEquals(TRACE_ID, span.getTraceId());
    assertEquals(PARENT_ID, span.getParentSpanId());
    assertEquals(StatusCode.ERROR, span.getStatus().getStatusCode());
    assertEquals("poison record", span.getStatus().getDescription());
    assertEquals(
        "dead_lettered", span.getAttributes().get(AttributeKey.stringKey("inbox.outcome")));
    assertEquals(3L, span.getAttributes().get(AttributeKey.longKey("inbox.attempts")));
    List<Long> attempts = new ArrayList<>();
    for (EventData event : span.getEvents()) {
      if (event.getName().equals("exception")) {
        attempts.add(event.getAttributes().get(AttributeKey.longKey("inbox.attempt")));
        assertEquals(
            "poison record",
            event.getAttributes().get(AttributeKey.stringKey("exception.message")));
      }
    }
    assertEquals(List.of(1L, 2L, 3L), attempts);
  }

  @Test
  void spanOfARecordWithoutTraceparentIsARoot() throws Exception {
    String dlq = servers.topic("traced-root-dlq", 1);
    Inbox inbox = inbox(dlq);

    assertEquals(
        Outcome.PROCESSED,
        inbox.process(record("order-2", "trace-2"), traced("traced", null)).outcome());

    SpanData span = named(sourceTopic + " process");
    assertFalse(span.getParentSpanContext().isValid(), "a root span");
    assertNotEquals(TRACE_ID, span.getTraceId());
    assertEquals(span.getSpanId(), named("handler").getParentSpanId());

    // A record without event_key is dead-lettered inside its span: status error.
    exporter.reset();
    assertEquals(
        Outcome.DEAD_LETTERED,
        inbox.process(record("order-x", null), traced("traced", null)).outcome());
    SpanData dead = named(sourceTopic + " process");
    assertEquals(StatusCode.ERROR, dead.getStatus().getStatusCode());
    assertEquals("missing event_key header", dead.getStatus().getDescription());
    assertEquals(null, dead.getAttributes().get(AttributeKey.stringKey("inbox.event_key")));
  }

  @Test
  void runnerSpanHasTheGroupAndTheRecordsTrace() throws Exception {
    String topic = servers.topic("traced-runner", 1);
    String dlq = servers.topic("traced-runner-dlq", 1);
    String group = servers.group("traced");
    ProducerRecord<byte[], byte[]> produced =
        new ProducerRecord<>(topic, 0, bytes("order-r"), bytes("{}"));
    produced.headers().add("event_key", bytes("trace-r"));
    produced.headers().add("traceparent", bytes(TRACEPARENT));
    servers.producer().send(produced).get();

    InboxSettings settings =
        InboxSettings.builder("traced-runner", dlq)
            .backoffInitial(Duration.ofMillis(5))
            .openTelemetry(otel)
            .build();
    List<String> outcomes = Collections.synchronizedList(new ArrayList<>());
    java.util.Properties kafka = TestServers.kafka();
    kafka.put("group.id", group);
    InboxRunner[] runner = new InboxRunner[1];
    runner[0] =
        InboxRunner.builder(kafka)
            .inbox(settings, servers.dataSource, traced("traced-runner", null))
            .listener(
                new InboxRunner.Listener() {
                  @Override
                  public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
                    outcomes.add(result.outcome().label());
                    runner[0].stop();
                  }
                })
            .pollTimeout(Duration.ofMillis(200))
            .build();
    runner[0].run(List.of(topic));

    assertEquals(List.of("processed"), outcomes);
    assertEquals(1, servers.coupons("trace-r"));
    SpanData span = named(topic + " process");
    assertEquals(TRACE_ID, span.getTraceId());
    assertEquals(PARENT_ID, span.getParentSpanId());
    assertEquals(
        group, span.getAttributes().get(AttributeKey.stringKey("messaging.consumer.group.name")));
    assertEquals(0L, span.getAttributes().get(AttributeKey.longKey("messaging.kafka.offset")));
  }
}
