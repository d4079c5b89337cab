package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Per-topic settings (inbox/CONTRACT.md, "Per-topic settings") against the real servers. */
class TopicSettingsTest {
  private static TestServers servers;
  private static String dlq;
  private static final AtomicInteger OFFSETS = new AtomicInteger();

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
    dlq = servers.topic("topics-dlq", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  /** A record of {@code topic}; {@code version} and {@code originalTopic} when set. */
  static ConsumerRecord<byte[], byte[]> record(
      String topic, String aggregateId, String eventKey, Long version, String originalTopic) {
    RecordHeaders headers = new RecordHeaders();
    if (eventKey != null) {
      headers.add("event_key", bytes(eventKey));
    }
    headers.add("aggregate_type", bytes("order"));
    if (version != null) {
      headers.add("version", bytes(version.toString()));
    }
    if (originalTopic != null) {
      headers.add("original_topic", bytes(originalTopic));
      headers.add("original_partition", bytes("0"));
      headers.add("original_offset", bytes("7"));
      headers.add("retry_count", bytes("1"));
    }
    return new ConsumerRecord<>(
        topic,
        0,
        OFFSETS.incrementAndGet(),
        0L,
        TimestampType.CREATE_TIME,
        -1,
        -1,
        bytes(aggregateId),
        bytes("x"),
        headers,
        Optional.empty());
  }

  private static Handler failing(AtomicInteger runs) {
    return (tx, record) -> {
      runs.incrementAndGet();
      throw new Exception("always failing");
    };
  }

  private static InboxSettings.Builder base(String consumer) {
    return InboxSettings.builder(consumer, dlq)
        .maxAttempts(2)
        .backoffInitial(Duration.ofMillis(1))
        .backoffMax(Duration.ofMillis(5));
  }

  @Test
  void maxAttemptsPerTopicAndACopyUsesItsOriginalTopics() throws Exception {
    InboxSettings settings =
        base("topics-attempts")
            .topic("one", TopicSettings.builder().maxAttempts(1).build())
            .topic("three", TopicSettings.builder().maxAttempts(3).build())
            .build();
    Inbox inbox = new Inbox(settings, servers.dataSource, servers.producer(), null);
    AtomicInteger runs = new AtomicInteger();

    Result one = inbox.process(record("one", "A", "one-1", null, null), failing(runs));
    assertEquals(Outcome.DEAD_LETTERED, one.outcome());
    assertEquals(1, one.attempts());
    Result three = inbox.process(record("three", "B", "three-1", null, null), failing(runs));
    assertEquals(Outcome.DEAD_LETTERED, three.outcome());
    assertEquals(3, three.attempts());
    Result other = inbox.process(record("other", "C", "other-1", null, null), failing(runs));
    assertEquals(2, other.attempts(), "a topic without its own: the consumer-wide value");
    // A retry copy in a tier topic: its original topic's settings, not the tier topic's.
    Result copy = inbox.process(record("three.retry.1", "D", "copy-1", null, "one"), failing(runs));
    assertEquals(Outcome.DEAD_LETTERED, copy.outcome());
    assertEquals(1, copy.attempts());
    assertEquals(7, runs.get());

    assertEquals(1, settings.forTopic("one").maxAttempts());
    assertEquals(3, settings.forTopic("three").maxAttempts());
    assertEquals(2, settings.forTopic("other").maxAttempts());
    assertEquals(Duration.ofMillis(5), settings.forTopic("one").backoffMax(), "inherited");
  }

  @Test
  void retryTiersPerTopic() throws Exception {
    String withTiers = servers.topic("topics-tiers", 1);
    String without = servers.topic("topics-notiers", 1);
    String plain = servers.topic("topics-plain", 1);
    servers.track(withTiers + ".retry.1");
    servers.track(plain + ".retry.1");
    servers.track(plain + ".retry.2");
    InboxSettings settings =
        base("topics-tiers")
            .retryTiers(List.of(Duration.ofMillis(100), Duration.ofMillis(100)))
            .topic(
                withTiers,
                TopicSettings.builder().retryTiers(List.of(Duration.ofMillis(300))).build())
            .topic(without, TopicSettings.builder().retryTiers(List.of()).build())
            .build();
    assertEquals(List.of(Duration.ofMillis(300)), settings.retryTiers(withTiers));
    assertEquals(List.of(), settings.retryTiers(without));
    assertEquals(2, settings.retryTiers(plain).size());
    // Each topic's own tier topics are made (none for the topic without tiers).
    assertEquals(
        List.of(withTiers + ".retry.1", plain + ".retry.1", plain + ".retry.2"),
        DeadLetterTopics.ensureRetryTopics(
            TestServers.kafka(),
            settings,
            List.of(withTiers, without, plain),
            Duration.ofSeconds(30)));

    Inbox inbox = new Inbox(settings, servers.dataSource, servers.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    assertEquals(
        Outcome.RETRIED,
        inbox.process(record(withTiers, "A", "t-1", null, null), failing(runs)).outcome());
    assertEquals(
        Outcome.DEAD_LETTERED,
        inbox.process(record(without, "B", "t-2", null, null), failing(runs)).outcome());
    // A copy in the last tier of its original topic: dead-lettered, not sent to a tier 2.
    assertEquals(
        Outcome.DEAD_LETTERED,
        inbox
            .process(record(withTiers + ".retry.1", "C", "t-3", null, withTiers), failing(runs))
            .outcome());
    List<ConsumerRecord<byte[], byte[]>> copies = servers.readAll(withTiers + ".retry.1", 1);
    assertEquals(1, copies.size());
    assertEquals("t-1", header(copies.get(0), "event_key"));
  }

  /** Records the outcomes, stops the runner after n. */
  private static final class StopAfter implements InboxRunner.Listener {
    final List<String> outcomes = Collections.synchronizedList(new ArrayList<>());
    final int n;
    InboxRunner runner;

    StopAfter(int n) {
      this.n = n;
    }

    @Override
    public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
      outcomes.add(header(record, "event_key") + " " + result.outcome().label());
      if (outcomes.size() >= n) {
        runner.stop();
      }
    }
  }

  @Test
  void theRunnerSubscribesToEachTopicsOwnTierTopics() throws Exception {
    String withTiers = servers.topic("topics-run-tiers", 1);
    String without = servers.topic("topics-run-notiers", 1);
    servers.track(withTiers + ".retry.1");
    servers.produce(withTiers, 0, "A", "R-1", "1"); // fails in the topic, succeeds in tier 1
    servers.produce(without, 0, "B", "R-2", "1"); // fails, no tier: dead-lettered
    String group = servers.group("topics-run");
    InboxSettings settings =
        base(group)
            .topic(
                withTiers,
                TopicSettings.builder().retryTiers(List.of(Duration.ofMillis(200))).build())
            .build();
    StopAfter listener = new StopAfter(3);
    Properties kafka = TestServers.kafka();
    InboxRunner runner =
        InboxRunner.builder(kafka)
            .inbox(
                settings,
                servers.dataSource,
                (tx, record) -> {
                  if (RetryHeaders.retryCount(record) < 1) {
                    throw new Exception("failing until tier 1");
                  }
                })
            .listener(listener)
            .pollTimeout(Duration.ofMillis(200))
            .build();
    listener.runner = runner;
    runner.run(List.of(withTiers, without));
    assertTrue(
        listener.outcomes.containsAll(List.of("R-1 retried", "R-1 processed", "R-2 dead_lettered")),
        listener.outcomes.toString());
    assertEquals(1, servers.readAll(withTiers + ".retry.1", 1).size());
    try (Admin admin = Admin.create(TestServers.kafka())) {
      assertFalse(
          admin.listTopics().names().get().contains(without + ".retry.1"),
          "no tier topic for the topic without tiers");
    }
  }

  @Test
  void gapPolicyAndGapDeadlinePerTopic() throws Exception {
    String consumer = "topics-gaps-" + OFFSETS.incrementAndGet();
    InboxSettings settings =
        base(consumer)
            .versionHeader("version")
            .gapPolicy(GapPolicy.DEAD_LETTER)
            .topic(
                "parking",
                TopicSettings.builder()
                    .gapPolicy(GapPolicy.PARK)
                    .gapDeadline(Duration.ofHours(5))
                    .build())
            .build();
    assertTrue(settings.parks(), "one topic parks: the runner sweeps");
    Inbox inbox = new Inbox(settings, servers.dataSource, servers.producer(), null);
    Handler ok = (tx, record) -> {};
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("parking", "P", "p-1", 1L, null), ok).outcome());
    assertEquals(
        Outcome.PARKED, inbox.process(record("parking", "P", "p-3", 3L, null), ok).outcome());
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("strict", "S", "s-1", 1L, null), ok).outcome());
    assertEquals(
        Outcome.DEAD_LETTERED, inbox.process(record("strict", "S", "s-3", 3L, null), ok).outcome());
    // A copy of a "parking" record, in a tier topic: parked like its original topic's records.
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("parking", "Q", "q-1", 1L, null), ok).outcome());
    assertEquals(
        Outcome.PARKED,
        inbox.process(record("parking.retry.1", "Q", "q-3", 3L, "parking"), ok).outcome());
    assertEquals(
        0,
        servers.count(
            "SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = ? AND aggregate_id = 'S'",
            consumer));
    long seconds =
        servers.count(
            "SELECT TIMESTAMPDIFF(SECOND, parked_at, expires_at) FROM outbox_inbox_parked"
                + " WHERE consumer = ? AND aggregate_id = 'P'",
            consumer);
    assertTrue(Math.abs(seconds - 5 * 3600) <= 2, "the topic's gap deadline: " + seconds);

    InboxSettings none =
        base("topics-gaps-none")
            .versionHeader("version")
            .gapPolicy(GapPolicy.DEAD_LETTER)
            .topic("x", TopicSettings.builder().maxAttempts(3).build())
            .build();
    assertFalse(none.parks(), "no topic parks: no sweep");
  }

  @Test
  void validationNamesTheTopicAndTheField() {
    assertError(
        "topic orders: max_attempts",
        base("v").topic("orders", TopicSettings.builder().maxAttempts(0).build()));
    assertError(
        "topic orders: backoff_initial",
        base("v")
            .topic(
                "orders", TopicSettings.builder().backoffInitial(Duration.ofMillis(-1)).build()));
    assertError(
        "topic orders: backoff_max",
        base("v")
            .topic("orders", TopicSettings.builder().backoffMax(Duration.ofMillis(-1)).build()));
    assertError(
        "topic orders: backoff_initial (PT1S) must not exceed backoff_max (PT0.005S)",
        base("v")
            .topic(
                "orders", TopicSettings.builder().backoffInitial(Duration.ofSeconds(1)).build()));
    assertError(
        "topic orders: gap_deadline",
        base("v")
            .topic("orders", TopicSettings.builder().gapDeadline(Duration.ofSeconds(-1)).build()));
    assertError(
        "topic orders: inbox_retention",
        base("v").topic("orders", TopicSettings.builder().inboxRetention(Duration.ZERO).build()));
    assertError(
        "topic orders: retry_tiers",
        base("v")
            .topic(
                "orders",
                TopicSettings.builder().retryTiers(List.of(Duration.ofSeconds(-1))).build()));
    assertError("topic settings", base("v").topic("", TopicSettings.builder().build()));
    // Consumer-wide.
    assertError("backoff", base("v").backoffInitial(Duration.ofSeconds(1)));
    assertError("inbox_retention", base("v").inboxRetention(Duration.ofDays(-1)));
    assertError("max_attempts", base("v").maxAttempts(0));

    InboxSettings ok =
        base("v")
            .inboxRetention(Duration.ofDays(3))
            .topic(
                "orders",
                TopicSettings.builder()
                    .backoffInitial(Duration.ofSeconds(1))
                    .backoffMax(Duration.ofSeconds(2))
                    .inboxRetention(Duration.ofDays(1))
                    .build())
            .build();
    assertEquals(Duration.ofDays(1), ok.forTopic("orders").inboxRetention());
    assertEquals(Duration.ofDays(3), ok.forTopic("other").inboxRetention());
    assertEquals(Duration.ofDays(7), base("v").build().inboxRetention(), "default 7 days");
    assertEquals(Duration.ofSeconds(2), ok.forTopic("orders").backoff(3));
  }

  private static void assertError(String expected, InboxSettings.Builder builder) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, builder::build);
    assertTrue(e.getMessage().contains(expected), e.getMessage());
  }

  static String text(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }
}
