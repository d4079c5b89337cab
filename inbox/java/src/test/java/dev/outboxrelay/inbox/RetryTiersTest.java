package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Retry tiers (inbox/CONTRACT.md, "Retry tiers") against the real Kafka and database. */
class RetryTiersTest {
  private static TestServers servers;
  private static final ObjectMapper JSON = new ObjectMapper();

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  /**
   * The coupon handler: inserts a coupon, then fails while the record's tier is below the payload's
   * {@code fail_until_tier} (a number; "always" fails in every tier).
   */
  private static Handler coupon() {
    return (tx, record) -> {
      try (PreparedStatement ps =
          tx.prepareStatement(
              "INSERT INTO coupons (consumer, order_id, event_key) VALUES (?, ?, ?)")) {
        ps.setString(1, "tiers");
        ps.setString(2, new String(record.key(), StandardCharsets.UTF_8));
        ps.setString(3, header(record, "event_key"));
        ps.executeUpdate();
      }
      String value = new String(record.value(), StandardCharsets.UTF_8);
      if (value.equals("always")) {
        throw new Exception("always failing");
      }
      int until = value.isEmpty() ? 0 : Integer.parseInt(value);
      if (RetryHeaders.retryCount(record) < until) {
        throw new Exception("failing until tier " + until);
      }
    };
  }

  /** Records the settled outcomes (and when), stops the runner after {@code n}. */
  private static final class StopAfter implements InboxRunner.Listener {
    final List<String> outcomes = Collections.synchronizedList(new ArrayList<>());
    final Map<String, Long> settledAt = new ConcurrentHashMap<>();
    final int n;
    InboxRunner runner;
    Runnable onRetried = () -> {};

    StopAfter(int n) {
      this.n = n;
    }

    @Override
    public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
      String line = header(record, "event_key") + " " + result.outcome().label();
      settledAt.put(line, System.currentTimeMillis());
      outcomes.add(line);
      if (result.outcome() == Outcome.RETRIED) {
        onRetried.run();
      }
      if (outcomes.size() >= n) {
        runner.stop();
      }
    }
  }

  private InboxRunner runner(InboxSettings settings, StopAfter listener) {
    Properties kafka = TestServers.kafka();
    kafka.put("max.poll.records", "3");
    InboxRunner runner =
        InboxRunner.builder(kafka)
            .inbox(settings, servers.dataSource, coupon())
            .listener(listener)
            .pollTimeout(Duration.ofMillis(200))
            .build();
    listener.runner = runner;
    return runner;
  }

  private static InboxSettings.Builder settings(String group, String dlq, Duration... tiers) {
    return InboxSettings.builder(group, dlq)
        .maxAttempts(2)
        .backoffInitial(Duration.ofMillis(10))
        .backoffMax(Duration.ofMillis(10))
        .retryTiers(List.of(tiers));
  }

  private static long total(Map<Integer, Long> endOffsets) {
    return endOffsets.values().stream().mapToLong(Long::longValue).sum();
  }

  private void trackTiers(String topic, int tiers) {
    for (int n = 1; n <= tiers; n++) {
      servers.track(topic + ".retry." + n);
    }
  }

  @Test
  void aRecordFailingInTheTopicSucceedsInTier1() throws Exception {
    String topic = servers.topic("tiers-ok", 1);
    String dlq = servers.topic("tiers-ok-dlq", 1);
    trackTiers(topic, 2);
    servers.produce(topic, 0, "A", "A-1", "1");
    String group = servers.group("tiers-ok");
    StopAfter listener = new StopAfter(2);
    long before = System.currentTimeMillis();
    runner(settings(group, dlq, Duration.ofMillis(300), Duration.ofMillis(300)).build(), listener)
        .run(List.of(topic));
    assertEquals(List.of("A-1 retried", "A-1 processed"), listener.outcomes);
    assertEquals(1, servers.coupons("A-1"), "one effect");

    List<ConsumerRecord<byte[], byte[]>> copies = servers.readAll(topic + ".retry.1", 1);
    assertEquals(1, copies.size());
    ConsumerRecord<byte[], byte[]> copy = copies.get(0);
    assertEquals("A", new String(copy.key(), StandardCharsets.UTF_8));
    assertEquals("1", new String(copy.value(), StandardCharsets.UTF_8));
    assertEquals("A-1", header(copy, "event_key"));
    assertEquals("order", header(copy, "aggregate_type"));
    assertEquals("1", header(copy, "retry_count"));
    long retryAt = Long.parseLong(header(copy, "retry_at"));
    assertTrue(retryAt >= before + 300, "retry_at = send time + 300 ms");
    assertTrue(
        listener.settledAt.get("A-1 processed") >= retryAt, "the copy waited for its retry_at");
    assertEquals(topic, header(copy, "original_topic"));
    assertEquals("0", header(copy, "original_partition"));
    assertEquals("0", header(copy, "original_offset"));
    assertEquals("failing until tier 1", header(copy, "retry_error"));
    JsonNode history = JSON.readTree(header(copy, "retry_history"));
    assertEquals(1, history.size());
    assertEquals(topic, history.get(0).get("topic").asText());
    assertEquals(0, history.get(0).get("partition").asInt());
    assertEquals(0, history.get(0).get("offset").asLong());
    assertEquals(2, history.get(0).get("attempts").asInt());
    assertEquals("failing until tier 1", history.get(0).get("error").asText());
    assertTrue(history.get(0).get("failed_at").asLong() >= before);

    try (Connection c = servers.dataSource.getConnection();
        PreparedStatement ps =
            c.prepareStatement(
                "SELECT topic, kafka_partition, kafka_offset FROM outbox_inbox"
                    + " WHERE consumer = ? AND event_key = ?")) {
      ps.setString(1, group);
      ps.setString(2, "A-1");
      try (ResultSet rs = ps.executeQuery()) {
        assertTrue(rs.next());
        assertEquals(topic, rs.getString(1), "the inbox row names the original record");
        assertEquals(0, rs.getInt(2));
        assertEquals(0, rs.getLong(3));
      }
    }
    assertEquals(1L, servers.committed(group, topic, 0));
    assertEquals(1L, servers.committed(group, topic + ".retry.1", copy.partition()));
    assertEquals(0, total(servers.endOffsets(topic + ".retry.2")));
    assertEquals(0, total(servers.endOffsets(dlq)));
  }

  @Test
  void aRecordExhaustingTwoTiersIsDeadLetteredWithItsHistory() throws Exception {
    String topic = servers.topic("tiers-dlq", 1);
    String dlq = servers.topic("tiers-dlq-dlq", 1);
    trackTiers(topic, 2);
    servers.produce(topic, 0, "B", "B-0", ""); // offset 0: processed
    servers.produce(topic, 0, "B", "B-1", "always"); // offset 1
    String group = servers.group("tiers-dlq");
    StopAfter listener = new StopAfter(4);
    runner(settings(group, dlq, Duration.ofMillis(100), Duration.ofMillis(200)).build(), listener)
        .run(List.of(topic));
    assertEquals(
        List.of("B-0 processed", "B-1 retried", "B-1 retried", "B-1 dead_lettered"),
        listener.outcomes);
    assertEquals(0, servers.coupons("B-1"));
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    ConsumerRecord<byte[], byte[]> letter = letters.get(0);
    assertEquals("B-1", header(letter, "event_key"));
    assertEquals("always", new String(letter.value(), StandardCharsets.UTF_8));
    assertEquals("2", header(letter, "retry_count"));
    assertEquals(topic, header(letter, "dlq_topic"));
    assertEquals("0", header(letter, "dlq_partition"));
    assertEquals("1", header(letter, "dlq_offset"));
    assertEquals("2", header(letter, "dlq_attempts"));
    assertEquals("always failing", header(letter, "dlq_reason"));
    assertEquals(topic, header(letter, "original_topic"));
    assertEquals("1", header(letter, "original_offset"));
    JsonNode history = JSON.readTree(header(letter, "retry_history"));
    assertEquals(2, history.size());
    assertEquals(topic, history.get(0).get("topic").asText());
    assertEquals(1, history.get(0).get("offset").asLong());
    assertEquals(topic + ".retry.1", history.get(1).get("topic").asText());
    assertEquals(0, history.get(1).get("offset").asLong());
    assertEquals(2, history.get(1).get("attempts").asInt());
    List<ConsumerRecord<byte[], byte[]>> tier1 = servers.readAll(topic + ".retry.1", 1);
    List<ConsumerRecord<byte[], byte[]>> tier2 = servers.readAll(topic + ".retry.2", 1);
    assertEquals(1, tier1.size());
    assertEquals(1, tier2.size());
    assertEquals(tier1.get(0).partition(), history.get(1).get("partition").asInt());
    assertEquals(2L, servers.committed(group, topic, 0));
    assertEquals(1L, servers.committed(group, topic + ".retry.1", tier1.get(0).partition()));
    assertEquals(1L, servers.committed(group, topic + ".retry.2", tier2.get(0).partition()));
  }

  @Test
  void aCopyWaitsForItsRetryAtWhileOtherRecordsGoOn() throws Exception {
    String topic = servers.topic("tiers-wait", 2);
    String dlq = servers.topic("tiers-wait-dlq", 1);
    trackTiers(topic, 1);
    servers.produce(topic, 0, "C", "C-1", "1");
    String group = servers.group("tiers-wait");
    StopAfter listener = new StopAfter(4);
    // Produced once C-1's copy is out: processed while the copy waits (3 s).
    listener.onRetried =
        () -> {
          try {
            servers.produce(topic, 1, "D", "D-1", "");
            servers.produce(topic, 0, "E", "E-1", "");
          } catch (Exception e) {
            throw new IllegalStateException(e);
          }
        };
    runner(settings(group, dlq, Duration.ofSeconds(3)).build(), listener).run(List.of(topic));
    assertEquals(4, listener.outcomes.size());
    assertEquals("C-1 retried", listener.outcomes.get(0));
    assertEquals("C-1 processed", listener.outcomes.get(3), listener.outcomes.toString());
    assertTrue(listener.outcomes.containsAll(List.of("D-1 processed", "E-1 processed")));
    ConsumerRecord<byte[], byte[]> copy = servers.readAll(topic + ".retry.1", 1).get(0);
    long retryAt = Long.parseLong(header(copy, "retry_at"));
    assertTrue(listener.settledAt.get("C-1 processed") >= retryAt, "not before its retry_at");
    assertTrue(listener.settledAt.get("D-1 processed") < retryAt, "D-1 went on meanwhile");
    assertTrue(listener.settledAt.get("E-1 processed") < retryAt, "E-1 went on meanwhile");
    assertEquals(1, servers.coupons("C-1"));
    assertEquals(1L, servers.committed(group, topic + ".retry.1", copy.partition()));
  }

  @Test
  void refusesToStartWhenTheBrokerWillNotCreateATierTopic() throws Exception {
    String topic = servers.topic("tiers-bad", 1);
    String dlq = servers.topic("tiers-bad-dlq", 1);
    // '/' is not allowed in a topic name: the tier topic can never be created.
    InboxSettings settings =
        settings("inbox-java-tiers-bad", dlq, Duration.ofMillis(100)) // the group never joins
            .retryTopicFormat("{topic}/retry/{n}")
            .build();
    InboxRunner runner = runner(settings, new StopAfter(1));
    InboxException e = assertThrows(InboxException.class, () -> runner.run(List.of(topic)));
    String tier = topic + "/retry/1";
    assertTrue(
        e.getMessage().contains("retry tier topic \"" + tier + "\"")
            && e.getMessage().contains("kafka-topics.sh --create --topic " + tier),
        e.getMessage());
  }

  @Test
  void anInfrastructureErrorNeverSendsToATier() throws Exception {
    String topic = servers.topic("tiers-infra", 1);
    String dlq = servers.topic("tiers-infra-dlq", 1);
    trackTiers(topic, 1);
    InboxSettings settings =
        settings("tiers-infra", dlq, Duration.ofMillis(100))
            .outageBudget(Duration.ofMillis(300))
            .build();
    assertEquals(
        List.of(topic + ".retry.1"),
        DeadLetterTopics.ensureRetryTopics(
            TestServers.kafka(), settings, List.of(topic), Duration.ofSeconds(30)));
    Inbox inbox = new Inbox(settings, servers.dataSource, servers.producer(), null);
    RecordHeaders headers = new RecordHeaders();
    headers.add("event_key", bytes("I-1"));
    ConsumerRecord<byte[], byte[]> record =
        new ConsumerRecord<>(
            topic,
            0,
            0L,
            0L,
            TimestampType.CREATE_TIME,
            1,
            1,
            bytes("I"),
            bytes("x"),
            headers,
            Optional.empty());
    assertThrows(
        InboxOutageException.class,
        () ->
            inbox.process(
                record,
                (tx, r) -> {
                  throw new SQLTransientConnectionException("connection lost", "08S01");
                }));
    assertEquals(0, total(servers.endOffsets(topic + ".retry.1")), "no copy");
    assertEquals(0, total(servers.endOffsets(dlq)), "no dead letter");
    assertNull(servers.committed("tiers-infra", topic, 0));
  }
}
