package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** {@link Inbox#process} against the real database; dead letters go to a real topic. */
class InboxTest {
  private static TestServers servers;
  private static String sourceTopic;
  private static final AtomicInteger OFFSETS = new AtomicInteger();

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
    sourceTopic = servers.topic("source", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  /** A record as the relay makes it, at a fresh offset of the source topic's partition 3. */
  private static ConsumerRecord<byte[], byte[]> record(
      String key, String eventKey, String value, String version) {
    RecordHeaders headers = new RecordHeaders();
    if (eventKey != null) {
      headers.add("event_key", bytes(eventKey));
    }
    headers.add("aggregate_type", bytes("order"));
    headers.add("id", bytes("42"));
    if (version != null) {
      headers.add("version", bytes(version));
    }
    return new ConsumerRecord<>(
        sourceTopic,
        3,
        OFFSETS.incrementAndGet(),
        0L,
        TimestampType.CREATE_TIME,
        -1,
        -1,
        bytes(key),
        bytes(value),
        headers,
        Optional.empty());
  }

  private static InboxSettings.Builder settings(String dlq) {
    return InboxSettings.builder("billing", dlq)
        .maxAttempts(3)
        .backoffInitial(Duration.ofMillis(5))
        .backoffMax(Duration.ofMillis(20));
  }

  /** The coupon handler of the scenarios: inserts a row, then may fail. */
  private static Handler coupon(AtomicInteger runs, int failures) {
    return (tx, record) -> {
      int run = runs.incrementAndGet();
      try (PreparedStatement ps =
          tx.prepareStatement(
              "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)")) {
        ps.setString(1, "billing");
        ps.setString(2, new String(record.key(), java.nio.charset.StandardCharsets.UTF_8));
        ps.setString(3, header(record, "event_key"));
        String v = header(record, "version");
        ps.setObject(4, v == null ? null : Long.valueOf(v));
        ps.executeUpdate();
      }
      if (run <= failures) {
        throw new IllegalStateException("transient failure " + run + " of " + failures);
      }
    };
  }

  @Test
  void duplicateIsAcknowledgedWithoutRunningTheHandler() throws Exception {
    Inbox inbox =
        new Inbox(settings("unused").build(), servers.dataSource, servers.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    Result first = inbox.process(record("order-1", "dup-1", "{}", null), coupon(runs, 0));
    Result second = inbox.process(record("order-1", "dup-1", "{}", null), coupon(runs, 0));
    assertEquals(new Result(Outcome.PROCESSED, 1), first);
    assertEquals(new Result(Outcome.DUPLICATE, 1), second);
    assertEquals(1, runs.get());
    assertEquals(1, servers.coupons("dup-1"));
    assertEquals(
        1,
        servers.count(
            "SELECT COUNT(*) FROM outbox_inbox WHERE consumer = 'billing' AND event_key = 'dup-1'"));
    // Another consumer name has its own inbox: not a duplicate there.
    Inbox other =
        new Inbox(
            InboxSettings.builder("shipping", "unused").build(),
            servers.dataSource,
            servers.producer(),
            null);
    assertEquals(
        Outcome.PROCESSED,
        other.process(record("order-1", "dup-1", "{}", null), coupon(runs, 0)).outcome());
  }

  /** Event keys (and aggregate ids) that differ only in case, accent or trailing spaces. */
  private static final List<String> KEY_TWINS =
      List.of("evt-a1B", "evt-A1b", "caf\u00e9", "cafe", "k", "k ");

  @Test
  void keysDifferingInCaseAccentOrTrailingSpacesAreDistinct() throws Exception {
    Inbox inbox =
        new Inbox(
            InboxSettings.builder("keys", "unused").versionHeader("version").build(),
            servers.dataSource,
            servers.producer(),
            null);
    AtomicInteger runs = new AtomicInteger();
    // Each key once: a new event each (the aggregate ids are the same strings, version 1 each:
    // a shared version row would make the twin stale).
    for (String k : KEY_TWINS) {
      assertEquals(
          Outcome.PROCESSED, inbox.process(record(k, k, "{}", "1"), coupon(runs, 0)).outcome(), k);
    }
    // Each key again: a duplicate, no second effect.
    for (String k : KEY_TWINS) {
      assertEquals(
          Outcome.DUPLICATE, inbox.process(record(k, k, "{}", "2"), coupon(runs, 0)).outcome(), k);
    }
    assertEquals(KEY_TWINS.size(), runs.get());
    List<String> coupons = new ArrayList<>();
    for (String k : servers.strings("SELECT event_key FROM coupons ORDER BY id")) {
      if (KEY_TWINS.contains(k)) {
        coupons.add(k);
      }
    }
    assertEquals(KEY_TWINS, coupons);
    assertEquals(
        KEY_TWINS,
        servers.strings(
            "SELECT event_key FROM outbox_inbox WHERE consumer = 'keys' ORDER BY kafka_offset"));
    List<String> aggregates =
        servers.strings(
            "SELECT aggregate_id FROM outbox_inbox_version WHERE consumer = 'keys'"
                + " AND version = 1");
    assertEquals(KEY_TWINS.size(), aggregates.size(), aggregates.toString());
    assertTrue(aggregates.containsAll(KEY_TWINS), aggregates.toString());
  }

  @Test
  void transientHandlerErrorsAreRolledBackAndRetried() throws Exception {
    Inbox inbox =
        new Inbox(settings("unused").build(), servers.dataSource, servers.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    Result result = inbox.process(record("order-2", "retry-1", "{}", null), coupon(runs, 2));
    assertEquals(new Result(Outcome.PROCESSED, 3), result);
    assertEquals(3, runs.get());
    assertEquals(1, servers.coupons("retry-1"), "the failed attempts' rows were rolled back");
  }

  @Test
  void handlerErrorsDeadLetterAfterMaxAttempts() throws Exception {
    String dlq = servers.topic("dlq-poison", 1);
    List<String> seen = new ArrayList<>();
    Hooks hooks =
        new Hooks() {
          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            seen.add(result.outcome().label() + "/" + result.attempts());
          }
        };
    Inbox inbox = new Inbox(settings(dlq).build(), servers.dataSource, servers.producer(), hooks);
    AtomicInteger runs = new AtomicInteger();
    ConsumerRecord<byte[], byte[]> poison =
        record("order-5", "poison-1", "{\"poison\":true}", null);
    Handler handler =
        (tx, r) -> {
          coupon(runs, 0).handle(tx, r);
          throw new Exception("poison record");
        };
    assertEquals(new Result(Outcome.DEAD_LETTERED, 3), inbox.process(poison, handler));
    assertEquals(3, runs.get());
    assertEquals(List.of("dead_lettered/3"), seen);
    assertEquals(0, servers.coupons("poison-1"), "no effect of a failed attempt remains");
    assertEquals(
        0, servers.count("SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'poison-1'"));

    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    ConsumerRecord<byte[], byte[]> letter = letters.get(0);
    assertEquals("order-5", new String(letter.key(), java.nio.charset.StandardCharsets.UTF_8));
    assertEquals(
        "{\"poison\":true}", new String(letter.value(), java.nio.charset.StandardCharsets.UTF_8));
    assertEquals("poison-1", header(letter, "event_key"));
    assertEquals("order", header(letter, "aggregate_type"));
    assertEquals("42", header(letter, "id"));
    assertEquals("poison record", header(letter, "dlq_reason"));
    assertEquals(sourceTopic, header(letter, "dlq_topic"));
    assertEquals("3", header(letter, "dlq_partition"));
    assertEquals(Long.toString(poison.offset()), header(letter, "dlq_offset"));
    assertEquals("billing", header(letter, "dlq_consumer"));
    assertEquals("3", header(letter, "dlq_attempts"));
  }

  @Test
  void missingEventKeyIsDeadLetteredAtOnce() throws Exception {
    String dlq = servers.topic("dlq-nokey", 1);
    Inbox inbox = new Inbox(settings(dlq).build(), servers.dataSource, servers.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    assertEquals(
        new Result(Outcome.DEAD_LETTERED, 0),
        inbox.process(record("order-9", null, "{}", null), coupon(runs, 0)));
    assertEquals(
        new Result(Outcome.DEAD_LETTERED, 0),
        inbox.process(record("order-9", "", "{}", null), coupon(runs, 0)));
    assertEquals(0, runs.get());
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 2);
    assertEquals(2, letters.size());
    for (ConsumerRecord<byte[], byte[]> letter : letters) {
      assertEquals("missing event_key header", header(letter, "dlq_reason"));
      assertEquals("0", header(letter, "dlq_attempts"));
    }
  }

  @Test
  void staleVersionsAreSkippedAndGapsDeadLetteredUnderTheDeadLetterPolicy() throws Exception {
    String dlq = servers.topic("dlq-gap", 1);
    Inbox inbox =
        new Inbox(
            settings(dlq).versionHeader("version").gapPolicy(GapPolicy.DEAD_LETTER).build(),
            servers.dataSource,
            servers.producer(),
            null);
    AtomicInteger runs = new AtomicInteger();
    String[][] events = {
      {"A", "A-v1", "1", "processed"},
      {"A", "A-v2", "2", "processed"},
      {"A", "A-v2-again", "2", "stale"},
      {"A", "A-v1-late", "1", "stale"},
      {"A", "A-v4-early", "4", "dead_lettered"},
      {"A", "A-v3", "3", "processed"},
      {"A", "A-v4", "4", "processed"},
      {"B", "B-v1", "1", "processed"},
    };
    for (String[] e : events) {
      Result r = inbox.process(record(e[0], e[1], "{}", e[2]), coupon(runs, 0));
      assertEquals(e[3], r.outcome().label(), e[1]);
      assertEquals(1, r.attempts(), e[1]);
      assertEquals(e[3].equals("processed") ? 1 : 0, servers.coupons(e[1]), e[1]);
    }
    assertEquals(
        4,
        servers.count(
            "SELECT version FROM outbox_inbox_version WHERE consumer = 'billing'"
                + " AND aggregate_type = 'order' AND aggregate_id = 'A'"));
    assertEquals(
        1,
        servers.count(
            "SELECT version FROM outbox_inbox_version WHERE consumer = 'billing'"
                + " AND aggregate_type = 'order' AND aggregate_id = 'B'"));
    // A stale record's inbox row stays: its redelivery is a duplicate.
    assertEquals(
        Outcome.DUPLICATE,
        inbox.process(record("A", "A-v1-late", "{}", "1"), coupon(runs, 0)).outcome());
    // A dead-lettered gap left no inbox row and nothing parked (what park did before parked
    // versions).
    assertEquals(
        0, servers.count("SELECT COUNT(*) FROM outbox_inbox WHERE event_key = 'A-v4-early'"));
    assertEquals(0, servers.count("SELECT COUNT(*) FROM outbox_inbox_parked"));
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    assertEquals("A-v4-early", header(letters.get(0), "event_key"));
    assertEquals("version gap: expected 3, got 4", header(letters.get(0), "dlq_reason"));
    assertEquals("1", header(letters.get(0), "dlq_attempts"));
  }

  @Test
  void gapsAreRetriedUnderTheRetryPolicy() throws Exception {
    String dlq = servers.topic("dlq-gap-retry", 1);
    AtomicInteger runs = new AtomicInteger();
    List<Long> waits = new ArrayList<>();
    Inbox inbox =
        new Inbox(
            settings(dlq).versionHeader("version").gapPolicy(GapPolicy.RETRY).build(),
            servers.dataSource,
            servers.producer(),
            null);
    assertEquals(
        Outcome.PROCESSED,
        inbox.process(record("C", "C-v1", "{}", "1"), coupon(runs, 0)).outcome());
    long start = System.nanoTime();
    assertEquals(
        new Result(Outcome.DEAD_LETTERED, 3),
        inbox.process(record("C", "C-v3", "{}", "3"), coupon(runs, 0)));
    waits.add((System.nanoTime() - start) / 1_000_000);
    assertTrue(waits.get(0) >= 5 + 10, "backed off between attempts: " + waits);
    assertEquals(1, runs.get());
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals("version gap: expected 2, got 3", header(letters.get(0), "dlq_reason"));
    assertEquals("3", header(letters.get(0), "dlq_attempts"));
  }

  @Test
  void invalidVersionHeaderIsPoison() throws Exception {
    String dlq = servers.topic("dlq-badversion", 1);
    AtomicInteger runs = new AtomicInteger();
    Inbox inbox =
        new Inbox(
            settings(dlq).versionHeader("version").build(),
            servers.dataSource,
            servers.producer(),
            null);
    assertEquals(
        new Result(Outcome.DEAD_LETTERED, 0),
        inbox.process(record("D", "D-bad", "{}", "seven"), coupon(runs, 0)));
    assertEquals(0, runs.get());
    assertEquals(
        "invalid version header: seven", header(servers.readAll(dlq, 1).get(0), "dlq_reason"));
    // Without a version header the record is not version-checked.
    assertEquals(
        Outcome.PROCESSED,
        inbox.process(record("D", "D-none", "{}", null), coupon(runs, 0)).outcome());
  }

  @Test
  void hooksRunAroundTheCommit() throws Exception {
    List<String> calls = new ArrayList<>();
    AtomicInteger beforeCommits = new AtomicInteger();
    Hooks hooks =
        new Hooks() {
          @Override
          public void beforeCommit(ConsumerRecord<byte[], byte[]> record) throws Exception {
            calls.add("before_commit");
            if (beforeCommits.incrementAndGet() == 1) {
              throw new Exception("hook failure");
            }
          }

          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            calls.add("after_commit " + result.outcome().label());
          }
        };
    Inbox inbox =
        new Inbox(settings("unused").build(), servers.dataSource, servers.producer(), hooks);
    Handler handler =
        (tx, r) -> {
          calls.add("handler");
          coupon(new AtomicInteger(), 0).handle(tx, r);
        };
    assertEquals(
        new Result(Outcome.PROCESSED, 2),
        inbox.process(record("E", "hooks-1", "{}", null), handler));
    assertEquals(
        List.of("handler", "before_commit", "handler", "before_commit", "after_commit processed"),
        calls);
    assertEquals(1, servers.coupons("hooks-1"));
    calls.clear();
    inbox.process(record("E", "hooks-1", "{}", null), handler);
    assertEquals(List.of("after_commit duplicate"), calls);
  }

  @Test
  void backoffDoublesUpToItsCap() {
    InboxSettings s =
        InboxSettings.builder("c", "dlq")
            .backoffInitial(Duration.ofMillis(100))
            .backoffMax(Duration.ofSeconds(1))
            .build();
    assertEquals(Duration.ofMillis(100), s.backoff(1));
    assertEquals(Duration.ofMillis(200), s.backoff(2));
    assertEquals(Duration.ofMillis(800), s.backoff(4));
    assertEquals(Duration.ofSeconds(1), s.backoff(5));
    assertEquals(Duration.ofSeconds(1), s.backoff(80));
    InboxSettings defaults = InboxSettings.builder("c", "dlq").build();
    assertEquals(5, defaults.maxAttempts());
    assertEquals(Duration.ofSeconds(10), defaults.backoff(50));
  }
}
