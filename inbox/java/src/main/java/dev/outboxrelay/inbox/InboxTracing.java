package dev.outboxrelay.inbox;

import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanBuilder;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.propagation.TextMapGetter;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The consumer span of each record (inbox/CONTRACT.md, "Trace context"): the producer's W3C trace
 * context is extracted from the record's headers and the record is processed in a span {@code
 * "<topic> process"} of kind CONSUMER whose parent is that context (OpenTelemetry messaging
 * semantic conventions, plus the inbox's own attributes).
 */
final class InboxTracing {
  /** The instrumentation scope of the spans. */
  static final String INSTRUMENTATION_NAME = "dev.outboxrelay.inbox";

  static final AttributeKey<String> MESSAGING_SYSTEM = AttributeKey.stringKey("messaging.system");
  static final AttributeKey<String> OPERATION_TYPE =
      AttributeKey.stringKey("messaging.operation.type");
  static final AttributeKey<String> DESTINATION_NAME =
      AttributeKey.stringKey("messaging.destination.name");
  static final AttributeKey<String> PARTITION_ID =
      AttributeKey.stringKey("messaging.destination.partition.id");
  static final AttributeKey<Long> KAFKA_PARTITION =
      AttributeKey.longKey("messaging.kafka.destination.partition");
  static final AttributeKey<Long> KAFKA_OFFSET = AttributeKey.longKey("messaging.kafka.offset");
  static final AttributeKey<String> KAFKA_MESSAGE_KEY =
      AttributeKey.stringKey("messaging.kafka.message.key");
  static final AttributeKey<String> CONSUMER_GROUP =
      AttributeKey.stringKey("messaging.consumer.group.name");
  static final AttributeKey<String> INBOX_CONSUMER = AttributeKey.stringKey("inbox.consumer");
  static final AttributeKey<String> INBOX_EVENT_KEY = AttributeKey.stringKey("inbox.event_key");
  static final AttributeKey<String> INBOX_OUTCOME = AttributeKey.stringKey("inbox.outcome");
  static final AttributeKey<Long> INBOX_ATTEMPTS = AttributeKey.longKey("inbox.attempts");
  static final AttributeKey<Long> INBOX_ATTEMPT = AttributeKey.longKey("inbox.attempt");
  static final AttributeKey<Boolean> INBOX_OUTAGE = AttributeKey.booleanKey("inbox.outage");

  /** {@code inbox.outcome} of a record that {@link Inbox#process} could not settle. */
  static final String UNSETTLED = "unsettled";

  /**
   * Reads a record's headers for a propagator: the last header of a name (as the inbox reads its
   * own headers), decoded as UTF-8. ({@code keys} is left to its default: deprecated in the API and
   * not used by the W3C propagator.)
   */
  static final TextMapGetter<ConsumerRecord<byte[], byte[]>> HEADERS =
      new TextMapGetter<>() {
        @Override
        public String get(ConsumerRecord<byte[], byte[]> carrier, String key) {
          return carrier == null ? null : InboxSettings.header(carrier, key);
        }
      };

  private InboxTracing() {}

  /**
   * Starts the consumer span of {@code record} as a child of the trace context in its headers (with
   * none, of {@link Context#current()}: a new trace unless the caller is in a span).
   */
  static Span start(
      InboxSettings settings, String consumerGroup, ConsumerRecord<byte[], byte[]> record) {
    Context parent = settings.propagator().extract(Context.current(), record, HEADERS);
    SpanBuilder builder =
        settings
            .openTelemetry()
            .getTracer(INSTRUMENTATION_NAME)
            .spanBuilder(record.topic() + " process")
            .setParent(parent)
            .setSpanKind(SpanKind.CONSUMER)
            .setAttribute(MESSAGING_SYSTEM, "kafka")
            .setAttribute(OPERATION_TYPE, "process")
            .setAttribute(DESTINATION_NAME, record.topic())
            .setAttribute(PARTITION_ID, Integer.toString(record.partition()))
            .setAttribute(KAFKA_PARTITION, (long) record.partition())
            .setAttribute(KAFKA_OFFSET, record.offset())
            .setAttribute(CONSUMER_GROUP, consumerGroup)
            .setAttribute(INBOX_CONSUMER, settings.consumer());
    String key = utf8OrNull(record.key());
    if (key != null && !key.isEmpty()) {
      builder.setAttribute(KAFKA_MESSAGE_KEY, key);
    }
    String eventKey = InboxSettings.header(record, settings.eventKeyHeader());
    if (eventKey != null && !eventKey.isEmpty()) {
      builder.setAttribute(INBOX_EVENT_KEY, eventKey);
    }
    return builder.startSpan();
  }

  /** Records how the record was settled (a dead letter set its error status already). */
  static void settled(Span span, Result result) {
    span.setAttribute(INBOX_OUTCOME, result.outcome().label());
    span.setAttribute(INBOX_ATTEMPTS, (long) result.attempts());
  }

  /** A failed attempt: an exception event with the attempt number. */
  static void attemptFailed(Throwable error, int attempt) {
    Span.current().recordException(error, Attributes.of(INBOX_ATTEMPT, (long) attempt));
  }

  /**
   * An attempt ended by an infrastructure error (not counted): an exception event with {@code
   * inbox.attempt} (the attempt that is redone) and {@code inbox.outage = true}.
   */
  static void outageFailed(Throwable error, int attempt) {
    Span.current()
        .recordException(error, Attributes.of(INBOX_ATTEMPT, (long) attempt, INBOX_OUTAGE, true));
  }

  /** The record goes to the dead-letter topic: span status error with the reason. */
  static void deadLettered(String reason) {
    Span.current().setStatus(StatusCode.ERROR, reason == null ? "" : reason);
  }

  /** The record could not be settled ({@link Inbox#process} throws {@code error}). */
  static void failed(Span span, Throwable error, boolean settled) {
    if (!settled) {
      span.setAttribute(INBOX_OUTCOME, UNSETTLED);
    }
    span.recordException(error);
    span.setStatus(StatusCode.ERROR, String.valueOf(error.getMessage()));
  }

  /** The key as UTF-8 text, or {@code null} when absent or not valid UTF-8. */
  private static String utf8OrNull(byte[] key) {
    if (key == null) {
      return null;
    }
    try {
      return StandardCharsets.UTF_8
          .newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(ByteBuffer.wrap(key))
          .toString();
    } catch (CharacterCodingException e) {
      return null;
    }
  }
}
