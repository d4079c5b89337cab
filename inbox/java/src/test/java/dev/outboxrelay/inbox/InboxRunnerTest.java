package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** {@link InboxRunner} against the real Kafka and database. */
class InboxRunnerTest {
  private static TestServers servers;

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  private static Handler coupon(List<String> handled) {
    return (tx, record) -> {
      try (PreparedStatement ps =
          tx.prepareStatement(
              "INSERT INTO coupons (consumer, order_id, event_key) VALUES (?, ?, ?)")) {
        ps.setString(1, "runner");
        ps.setString(2, new String(record.key(), StandardCharsets.UTF_8));
        ps.setString(3, header(record, "event_key"));
        ps.executeUpdate();
      }
      handled.add(header(record, "event_key"));
    };
  }

  /** Stops the runner once {@code n} records were settled; records the outcomes. */
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

  private InboxRunner runner(
      InboxSettings settings, Handler handler, Hooks hooks, StopAfter listener) {
    Properties kafka = TestServers.kafka();
    kafka.put("max.poll.records", "3"); // several poll batches
    InboxRunner runner =
        InboxRunner.builder(kafka)
            .inbox(settings, servers.dataSource, handler)
            .hooks(hooks)
            .listener(listener)
            .pollTimeout(Duration.ofMillis(200))
            .build();
    listener.runner = runner;
    return runner;
  }

  @Test
  void theRunnerSweepsParkedVersions() throws Exception {
    String topic = servers.topic("runner-parked", 1);
    String dlq = servers.topic("runner-parked-dlq", 1);
    servers.produce(topic, 0, "P", "P-v1", "{}", 1L);
    servers.produce(topic, 0, "P", "P-v3", "{}", 3L); // parked, resumed after P-v2
    servers.produce(topic, 0, "G", "G-v1", "{}", 1L);
    servers.produce(topic, 0, "G", "G-v3", "{}", 3L); // parked, never resumed: expires
    servers.produce(topic, 0, "P", "P-v2", "{}", 2L);
    String group = servers.group("runner-parked");
    InboxSettings settings =
        InboxSettings.builder(group, dlq)
            .versionHeader("version")
            .gapDeadline(Duration.ofMillis(1500))
            .parkSweepInterval(Duration.ofMillis(100))
            .build();
    List<String> handled = Collections.synchronizedList(new ArrayList<>());
    List<String> settled = Collections.synchronizedList(new ArrayList<>());
    StopAfter listener = new StopAfter(Integer.MAX_VALUE);
    Hooks hooks =
        new Hooks() {
          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            settled.add(result.outcome().label() + " " + header(record, "event_key"));
            if (result.outcome() == Outcome.DEAD_LETTERED) {
              listener.runner.stop();
            }
          }
        };
    InboxRunner runner = runner(settings, coupon(handled), hooks, listener);
    runner.run(List.of(topic));
    assertEquals(
        List.of(
            "processed P-v1",
            "parked P-v3",
            "processed G-v1",
            "parked G-v3",
            "processed P-v2",
            "resumed P-v3",
            "dead_lettered G-v3"),
        settled);
    assertEquals(List.of("P-v1", "G-v1", "P-v2", "P-v3"), handled);
    assertEquals(
        0, servers.count("SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = ?", group));
    assertEquals(Map.of(0, 5L), servers.committed(group));
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    assertTrue(
        header(letters.get(0), "dlq_reason")
            .startsWith("version gap: expected 2, got 3; parked since "),
        header(letters.get(0), "dlq_reason"));
    assertEquals("0", header(letters.get(0), "dlq_attempts"));
    assertEquals("3", header(letters.get(0), "dlq_offset"));
  }

  @Test
  void commitsOffsetsOnlyAfterProcessing() throws Exception {
    String topic = servers.topic("runner", 2);
    String dlq = servers.topic("runner-dlq", 1);
    for (int i = 1; i <= 10; i++) {
      servers.produce(topic, i % 2, "order-" + i, "order-" + i + "-1", "{}");
    }
    String group = servers.group("runner");
    InboxSettings settings =
        InboxSettings.builder(group, dlq).backoffInitial(Duration.ofMillis(5)).build();
    List<String> handled = Collections.synchronizedList(new ArrayList<>());
    List<String> violations = Collections.synchronizedList(new ArrayList<>());
    AtomicInteger settledCount = new AtomicInteger();
    Handler checkingHandler =
        (tx, record) -> {
          // While a record is in hand, the group's committed offset never passes it.
          Long committed = servers.committed(group).get(record.partition());
          if (committed != null && committed > record.offset()) {
            violations.add(record.partition() + "@" + record.offset() + " committed " + committed);
          }
          coupon(handled).handle(tx, record);
        };
    // The 7th settled record fails after its database commit (like a crash before the offset
    // commit): the runner stops with the error, its offset is not committed.
    Hooks failSeventh =
        new Hooks() {
          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            if (settledCount.incrementAndGet() == 7) {
              throw new IllegalStateException("crash after db commit");
            }
          }
        };
    StopAfter first = new StopAfter(Integer.MAX_VALUE);
    InboxRunner runner = runner(settings, checkingHandler, failSeventh, first);
    InboxException error = assertThrows(InboxException.class, () -> runner.run(List.of(topic)));
    assertTrue(error.getMessage().contains("crash after db commit"), error.getMessage());
    assertEquals(7, handled.size());
    assertEquals(6, first.outcomes.size());

    // Committed: exactly the 6 settled records (per partition: the next offset to read).
    Map<Integer, Long> committed = servers.committed(group);
    long committedTotal = committed.values().stream().mapToLong(Long::longValue).sum();
    assertEquals(6, committedTotal, committed.toString());

    // A second consumer of the group gets the rest: the 7th record again (a duplicate), then the
    // others; afterwards the group has nothing left to read.
    StopAfter second = new StopAfter(4);
    runner(settings, checkingHandler, Hooks.NONE, second).run(List.of(topic));
    assertEquals(4, second.outcomes.size());
    assertEquals(
        1,
        second.outcomes.stream().filter(o -> o.endsWith(" duplicate")).count(),
        second.outcomes.toString());
    assertEquals(10, handled.size());
    assertEquals(servers.endOffsets(topic), servers.committed(group));
    assertEquals(List.of(), violations);
    for (int i = 1; i <= 10; i++) {
      assertEquals(1, servers.coupons("order-" + i + "-1"), "order-" + i);
    }
  }

  @Test
  void stopFromAnotherThreadFinishesAndCommits() throws Exception {
    String topic = servers.topic("runner-stop", 1);
    String dlq = servers.topic("runner-stop-dlq", 1);
    String group = servers.group("stop");
    InboxSettings settings = InboxSettings.builder(group, dlq).build();
    List<String> handled = Collections.synchronizedList(new ArrayList<>());
    StopAfter listener = new StopAfter(Integer.MAX_VALUE);
    InboxRunner runner = runner(settings, coupon(handled), Hooks.NONE, listener);
    Thread loop = new Thread(() -> runner.run(List.of(topic)));
    loop.start();
    for (int i = 1; i <= 3; i++) {
      servers.produce(topic, 0, "order-" + i, "stop-" + i, "{}");
    }
    TestServers.await("3 records settled", () -> listener.outcomes.size() == 3);
    runner.close(); // waits until the loop committed and closed
    assertTrue(!loop.isAlive() || joined(loop), "the loop ended");
    assertEquals(Map.of(0, 3L), servers.committed(group));
  }

  @Test
  void createsAMissingDeadLetterTopic() throws Exception {
    String topic = servers.topic("runner-fresh", 1);
    String dlq = servers.freshTopicName("runner-fresh-dlq"); // nobody created it
    servers.produce(topic, 0, "order-x", null, "{}"); // no event_key: dead-lettered at once
    String group = servers.group("fresh");
    InboxSettings settings = InboxSettings.builder(group, dlq).build();
    StopAfter listener = new StopAfter(1);
    InboxRunner runner = runner(settings, coupon(new ArrayList<>()), Hooks.NONE, listener);
    runner.run(List.of(topic));
    assertEquals(List.of("null dead_lettered"), listener.outcomes);
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    assertEquals("missing event_key header", header(letters.get(0), "dlq_reason"));
  }

  @Test
  void refusesADeadLetterTopicTheBrokerWillNotCreate() throws Exception {
    // '/' is not allowed in a topic name. Neither the topic nor the group ever exists.
    String bad = "inbox-java-bad/dlq-" + java.util.UUID.randomUUID();
    InboxSettings settings = InboxSettings.builder("inbox-java-bad", bad).build();
    InboxException e =
        assertThrows(
            InboxException.class,
            () -> runner(settings, coupon(new ArrayList<>()), Hooks.NONE, new StopAfter(1)));
    assertTrue(
        e.getMessage().contains(bad) && e.getMessage().contains("kafka-topics.sh --create"),
        e.getMessage());
  }

  private static boolean joined(Thread t) throws InterruptedException {
    t.join(30_000);
    return !t.isAlive();
  }
}
