package dev.outboxrelay.inbox;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import java.time.Duration;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The inbox's Micrometer meters (inbox/CONTRACT.md, "Metrics"), registered with {@link
 * InboxSettings#meterRegistry()}; Micrometer's Prometheus naming shows them as {@code
 * outbox_inbox_records_total}, {@code outbox_inbox_parked_records}, {@code
 * outbox_inbox_parked_oldest_seconds} and {@code outbox_inbox_consumer_lag}.
 */
final class InboxMetrics {
  static final String RECORDS = "outbox_inbox_records";
  static final String PARKED = "outbox_inbox_parked_records";
  static final String PARKED_OLDEST = "outbox_inbox_parked_oldest_seconds";
  static final String LAG = "outbox_inbox_consumer_lag";

  /**
   * The gauges' values per registry: a gauge is registered once per name and tags (a second
   * registration returns the first gauge, observing the first object), so inboxes sharing a
   * registry share the value they set.
   */
  private static final Map<MeterRegistry, Map<List<String>, AtomicLong>> GAUGES =
      Collections.synchronizedMap(new WeakHashMap<>());

  private final MeterRegistry registry;
  private final String consumer;

  private InboxMetrics(MeterRegistry registry, String consumer) {
    this.registry = registry;
    this.consumer = consumer;
  }

  /**
   * @return the metrics of these settings, or {@code null} without a registry (no metrics)
   */
  static InboxMetrics of(InboxSettings settings) {
    MeterRegistry registry = settings.meterRegistry();
    return registry == null ? null : new InboxMetrics(registry, settings.consumer());
  }

  /** Counts a settled record under its original topic. */
  void settled(ConsumerRecord<?, ?> record, Outcome outcome) {
    if (outcome == null) {
      return;
    }
    Counter.builder(RECORDS)
        .description("Records settled by the inbox, by consumer, original topic and outcome.")
        .tags(
            "consumer",
            consumer,
            "topic",
            InboxSettings.topicOf(record),
            "outcome",
            outcome.label())
        .register(registry)
        .increment();
  }

  /** Sets the parked gauges after a sweep. */
  void swept(long parked, Duration oldest) {
    set(
        gauge(PARKED, "Parked rows of the consumer at the last sweep.", "consumer", consumer),
        parked);
    set(
        gauge(
            PARKED_OLDEST,
            "Age of the consumer's oldest parked row at the last sweep (0: none).",
            "consumer",
            consumer),
        oldest.toNanos() / 1e9);
  }

  /** Sets a partition's lag after a poll. */
  void lag(String topic, int partition, long lag) {
    set(
        gauge(
            LAG,
            "The partition's high watermark minus the consumer's position, after each poll.",
            "consumer",
            consumer,
            "topic",
            topic,
            "partition",
            Integer.toString(partition)),
        Math.max(lag, 0));
  }

  private static void set(AtomicLong value, double v) {
    value.set(Double.doubleToLongBits(v));
  }

  private AtomicLong gauge(String name, String description, String... tags) {
    Map<List<String>, AtomicLong> gauges =
        GAUGES.computeIfAbsent(registry, r -> new ConcurrentHashMap<>());
    List<String> id = new java.util.ArrayList<>(List.of(tags));
    id.add(0, name);
    return gauges.computeIfAbsent(
        List.copyOf(id),
        k -> {
          AtomicLong value = new AtomicLong(Double.doubleToLongBits(0));
          Gauge.builder(name, value, v -> Double.longBitsToDouble(v.get()))
              .description(description)
              .tags(tags)
              .strongReference(true)
              .register(registry);
          return value;
        });
  }
}
