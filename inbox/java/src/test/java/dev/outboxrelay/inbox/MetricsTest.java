package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.header;
import static dev.outboxrelay.inbox.TopicSettingsTest.record;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Metrics (inbox/CONTRACT.md, "Metrics") read back from a {@link SimpleMeterRegistry}. */
class MetricsTest {
  private static TestServers servers;
  private static String dlq;

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
    dlq = servers.topic("metrics-dlq", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  private static InboxSettings.Builder settings(String consumer, SimpleMeterRegistry registry) {
    return InboxSettings.builder(consumer, dlq)
        .versionHeader("version")
        .maxAttempts(1)
        .backoffInitial(Duration.ofMillis(1))
        .backoffMax(Duration.ofMillis(1))
        .meterRegistry(registry);
  }

  private static double records(
      SimpleMeterRegistry registry, String consumer, String topic, String outcome) {
    Counter c =
        registry
            .find("outbox_inbox_records")
            .tags("consumer", consumer, "topic", topic, "outcome", outcome)
            .counter();
    return c == null ? 0 : c.count();
  }

  private static Double gauge(SimpleMeterRegistry registry, String name, String... tags) {
    Gauge g = registry.find(name).tags(tags).gauge();
    return g == null ? null : g.value();
  }

  @Test
  void countsSettledRecordsByOriginalTopicAndOutcome() throws Exception {
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    String c = "metrics-count";
    Inbox inbox =
        new Inbox(settings(c, registry).build(), servers.dataSource, servers.producer(), null);
    Handler ok = (tx, record) -> {};
    inbox.process(record("orders", "A", "m-1", 1L, null), ok); // processed
    inbox.process(record("orders", "A", "m-1", 1L, null), ok); // duplicate
    inbox.process(record("orders", "A", "m-0", 1L, null), ok); // stale
    inbox.process(record("orders", "B", null, null, null), ok); // no event_key: dead-lettered
    Result copy =
        inbox.process(
            record("orders.retry.1", "C", "m-2", null, "orders"),
            (tx, record) -> {
              throw new Exception("failing");
            });
    assertEquals(Outcome.DEAD_LETTERED, copy.outcome());
    inbox.process(record("payments", "D", "m-3", null, null), ok); // processed

    assertEquals(1, records(registry, c, "orders", "processed"));
    assertEquals(1, records(registry, c, "orders", "duplicate"));
    assertEquals(1, records(registry, c, "orders", "stale"));
    assertEquals(2, records(registry, c, "orders", "dead_lettered"), "the copy: its original");
    assertEquals(0, records(registry, c, "orders.retry.1", "dead_lettered"));
    assertEquals(1, records(registry, c, "payments", "processed"));
    assertEquals(5, registry.find("outbox_inbox_records").counters().size());
  }

  @Test
  void prometheusShowsTheContractsNames() throws Exception {
    PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
    String c = "metrics-prometheus";
    InboxSettings s =
        InboxSettings.builder(c, dlq).versionHeader("version").meterRegistry(registry).build();
    Inbox inbox = new Inbox(s, servers.dataSource, servers.producer(), null);
    inbox.process(record("orders", "A", "prom-1", 1L, null), (tx, record) -> {});
    inbox.sweepParked((tx, record) -> {});
    InboxMetrics.of(s).lag("orders", 0, 4);
    String text = registry.scrape();
    for (String series :
        List.of(
            "outbox_inbox_records_total{consumer=\""
                + c
                + "\",outcome=\"processed\",topic=\"orders\"} 1.0",
            "outbox_inbox_parked_records{consumer=\"" + c + "\"} 0.0",
            "outbox_inbox_parked_oldest_seconds{consumer=\"" + c + "\"} 0.0",
            "outbox_inbox_consumer_lag{consumer=\""
                + c
                + "\",partition=\"0\",topic=\"orders\"} 4.0")) {
      assertTrue(text.contains(series), series + " in\n" + text);
    }
  }

  @Test
  void noRegistryNoMetrics() {
    InboxSettings s = InboxSettings.builder("metrics-none", "dlq").build();
    assertNull(s.meterRegistry());
  }

  @Test
  void parkedGaugesAfterEachSweep() throws Exception {
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    String c = "metrics-parked";
    Inbox inbox =
        new Inbox(settings(c, registry).build(), servers.dataSource, servers.producer(), null);
    Handler ok = (tx, record) -> {};
    inbox.process(record("orders", "P", "p-1", 1L, null), ok);
    assertEquals(
        Outcome.PARKED, inbox.process(record("orders", "P", "p-3", 3L, null), ok).outcome());
    assertEquals(1, records(registry, c, "orders", "parked"));
    assertNull(gauge(registry, "outbox_inbox_parked_records", "consumer", c), "before a sweep");

    Thread.sleep(1100);
    inbox.sweepParked(ok);
    assertEquals(1.0, gauge(registry, "outbox_inbox_parked_records", "consumer", c));
    Double oldest = gauge(registry, "outbox_inbox_parked_oldest_seconds", "consumer", c);
    assertNotNull(oldest);
    assertTrue(oldest >= 1.0 && oldest < 60, "oldest: " + oldest);

    // The gap closes: p-3 resumes after p-2; the next sweep finds none.
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("orders", "P", "p-2", 2L, null), ok).outcome());
    assertEquals(1, records(registry, c, "orders", "resumed"));
    inbox.sweepParked(ok);
    assertEquals(0.0, gauge(registry, "outbox_inbox_parked_records", "consumer", c));
    assertEquals(0.0, gauge(registry, "outbox_inbox_parked_oldest_seconds", "consumer", c));
  }

  @Test
  void consumerLagAfterEachPoll() throws Exception {
    String topic = servers.topic("metrics-lag", 1);
    for (int i = 0; i < 5; i++) {
      servers.produce(topic, 0, "L", "lag-" + i, "x");
    }
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    String group = servers.group("metrics-lag");
    List<Double> seen = Collections.synchronizedList(new ArrayList<>());
    Properties kafka = TestServers.kafka();
    kafka.put("max.poll.records", "2");
    InboxRunner[] runner = new InboxRunner[1];
    runner[0] =
        InboxRunner.builder(kafka)
            .inbox(settings(group, registry).build(), servers.dataSource, (tx, record) -> {})
            .listener(
                new InboxRunner.Listener() {
                  int settled;

                  @Override
                  public void polled(ConsumerRecords<byte[], byte[]> records) {
                    seen.add(
                        gauge(
                            registry,
                            "outbox_inbox_consumer_lag",
                            "consumer",
                            group,
                            "topic",
                            topic,
                            "partition",
                            "0"));
                  }

                  @Override
                  public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
                    if (++settled == 5) {
                      runner[0].stop();
                    }
                  }
                })
            .pollTimeout(Duration.ofMillis(200))
            .build();
    runner[0].run(List.of(topic));
    assertTrue(seen.size() >= 3, seen.toString());
    assertTrue(seen.get(0) != null && seen.get(0) > 0, "lag after the first poll: " + seen);
    assertEquals(0.0, seen.get(seen.size() - 1), "after the last poll: " + seen);
    assertEquals(5, records(registry, group, topic, "processed"));
    assertTrue(header(servers.readAll(topic, 5).get(0), "event_key").startsWith("lag-"));
  }
}
