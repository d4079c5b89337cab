package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Parked versions (inbox/CONTRACT.md, "Parked versions") against the real database: parking,
 * resumption, the sweep, expiry and compensation. Each test has its own consumer name, so one
 * test's sweep never touches another's rows.
 */
class ParkedTest {
  private static TestServers servers;
  private static String sourceTopic;
  private static final AtomicInteger OFFSETS = new AtomicInteger(100);

  @BeforeAll
  static void setUp() throws Exception {
    servers = new TestServers();
    sourceTopic = servers.topic("parked-source", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    servers.close();
  }

  /** A record as the relay makes it, plus a header without a value and one with non-ASCII text. */
  private static ConsumerRecord<byte[], byte[]> record(
      String aggregateId, String eventKey, long version) {
    RecordHeaders headers = new RecordHeaders();
    headers.add("event_key", bytes(eventKey));
    headers.add("aggregate_type", bytes("order"));
    headers.add("version", bytes(Long.toString(version)));
    headers.add("empty", null);
    headers.add("note\"é", bytes("café ☕"));
    return new ConsumerRecord<>(
        sourceTopic,
        0,
        OFFSETS.incrementAndGet(),
        0L,
        TimestampType.CREATE_TIME,
        -1,
        -1,
        bytes(aggregateId),
        bytes("{\"v\":" + version + "}"),
        headers,
        Optional.empty());
  }

  private static InboxSettings.Builder settings(String consumer, String dlq) {
    return InboxSettings.builder(consumer, dlq)
        .versionHeader("version")
        .maxAttempts(2)
        .backoffInitial(Duration.ofMillis(5))
        .backoffMax(Duration.ofMillis(20));
  }

  /** Records every after_commit as "outcome event_key", and the records it saw. */
  private static final class Recorder implements Hooks {
    final List<String> calls = Collections.synchronizedList(new ArrayList<>());
    final List<ConsumerRecord<byte[], byte[]>> records =
        Collections.synchronizedList(new ArrayList<>());
    final List<String> beforeCommits = Collections.synchronizedList(new ArrayList<>());

    @Override
    public void beforeCommit(ConsumerRecord<byte[], byte[]> record) {
      beforeCommits.add(header(record, "event_key"));
    }

    @Override
    public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
      calls.add(result.outcome().label() + " " + header(record, "event_key"));
      records.add(record);
    }
  }

  /** Inserts a coupon for the consumer; counts runs. */
  private static Handler coupon(String consumer, AtomicInteger runs) {
    return (tx, record) -> {
      runs.incrementAndGet();
      try (PreparedStatement ps =
          tx.prepareStatement(
              "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)")) {
        ps.setString(1, consumer);
        ps.setString(2, new String(record.key(), StandardCharsets.UTF_8));
        ps.setString(3, header(record, "event_key"));
        ps.setLong(4, Long.parseLong(header(record, "version")));
        ps.executeUpdate();
      }
    };
  }

  private static long parked(String consumer) throws Exception {
    return servers.count("SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = ?", consumer);
  }

  private static long stored(String consumer, String aggregateId) throws Exception {
    return servers.count(
        "SELECT version FROM outbox_inbox_version WHERE consumer = ? AND aggregate_id = ?",
        consumer,
        aggregateId);
  }

  private static void assertSameRecord(
      ConsumerRecord<byte[], byte[]> want, ConsumerRecord<byte[], byte[]> got) {
    assertEquals(want.topic(), got.topic());
    assertEquals(want.partition(), got.partition());
    assertEquals(want.offset(), got.offset());
    assertArrayEquals(want.key(), got.key());
    assertArrayEquals(want.value(), got.value());
    List<Header> a = new ArrayList<>();
    want.headers().forEach(a::add);
    List<Header> b = new ArrayList<>();
    got.headers().forEach(b::add);
    assertEquals(a.size(), b.size());
    for (int i = 0; i < a.size(); i++) {
      assertEquals(a.get(i).key(), b.get(i).key());
      assertArrayEquals(a.get(i).value(), b.get(i).value());
    }
  }

  @Test
  void parkedVersionsResumeInVersionOrder() throws Exception {
    String consumer = "park-resume";
    Recorder hooks = new Recorder();
    Inbox inbox =
        new Inbox(
            settings(consumer, "unused").build(), servers.dataSource, servers.producer(), hooks);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    ConsumerRecord<byte[], byte[]> v3 = record("P", "P-v3", 3);
    ConsumerRecord<byte[], byte[]> v4 = record("P", "P-v4", 4);
    assertEquals(new Result(Outcome.PROCESSED, 1), inbox.process(record("P", "P-v1", 1), handler));
    assertEquals(new Result(Outcome.PARKED, 1), inbox.process(v4, handler));
    assertEquals(new Result(Outcome.PARKED, 1), inbox.process(v3, handler));
    assertEquals(2, parked(consumer));
    assertEquals(1, runs.get());
    assertEquals(
        "version gap: expected 2, got 4",
        servers.strings("SELECT reason FROM outbox_inbox_parked WHERE event_key = 'P-v4'").get(0));
    // Nothing of a parked record is in the inbox: it is not applied.
    assertEquals(
        0, servers.count("SELECT COUNT(*) FROM outbox_inbox WHERE event_key IN ('P-v3', 'P-v4')"));
    hooks.calls.clear();
    hooks.records.clear();
    hooks.beforeCommits.clear();

    // Version 2 arrives: processed, then 3 and 4 resume by themselves, in order.
    assertEquals(new Result(Outcome.PROCESSED, 1), inbox.process(record("P", "P-v2", 2), handler));
    assertEquals(List.of("processed P-v2", "resumed P-v3", "resumed P-v4"), hooks.calls);
    assertEquals(List.of("P-v2", "P-v3", "P-v4"), hooks.beforeCommits);
    assertSameRecord(v3, hooks.records.get(1));
    assertSameRecord(v4, hooks.records.get(2));
    assertEquals(
        List.of("P-v1", "P-v2", "P-v3", "P-v4"),
        servers.strings(
            "SELECT event_key FROM coupons WHERE consumer = '" + consumer + "' ORDER BY id"));
    assertEquals(4, stored(consumer, "P"));
    assertEquals(0, parked(consumer));
    // The resumed record's inbox row names where it was read.
    assertEquals(
        v4.offset(),
        servers.count("SELECT kafka_offset FROM outbox_inbox WHERE event_key = 'P-v4'"));
    // A redelivery of a resumed record is a duplicate.
    assertEquals(Outcome.DUPLICATE, inbox.process(v4, handler).outcome());
    assertEquals(4, runs.get());
  }

  @Test
  void aRedeliveredParkedRecordIsIgnored() throws Exception {
    String consumer = "park-redelivery";
    Inbox inbox =
        new Inbox(
            settings(consumer, "unused").build(),
            servers.dataSource,
            servers.producer(),
            Hooks.NONE);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    ConsumerRecord<byte[], byte[]> v3 = record("R", "R-v3", 3);
    inbox.process(record("R", "R-v1", 1), handler);
    assertEquals(Outcome.PARKED, inbox.process(v3, handler).outcome());
    String parkedAt =
        servers
            .strings(
                "SELECT CAST(parked_at AS CHAR) FROM outbox_inbox_parked WHERE event_key = 'R-v3'")
            .get(0);
    assertEquals(Outcome.PARKED, inbox.process(v3, handler).outcome());
    assertEquals(1, parked(consumer));
    assertEquals(
        parkedAt,
        servers
            .strings(
                "SELECT CAST(parked_at AS CHAR) FROM outbox_inbox_parked WHERE event_key = 'R-v3'")
            .get(0));
    assertEquals(1, runs.get());
    assertEquals(0, servers.coupons("R-v3"));
  }

  @Test
  void theSweepRemovesStaleRowsAndResumesTheNextVersion() throws Exception {
    String consumer = "park-sweep";
    Recorder hooks = new Recorder();
    Inbox inbox =
        new Inbox(
            settings(consumer, "unused").build(), servers.dataSource, servers.producer(), hooks);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    inbox.process(record("S", "S-v1", 1), handler);
    inbox.process(record("T", "T-v1", 1), handler);
    assertEquals(Outcome.PARKED, inbox.process(record("S", "S-v3", 3), handler).outcome());
    assertEquals(Outcome.PARKED, inbox.process(record("T", "T-v3", 3), handler).outcome());
    // Meanwhile S moved past 3 elsewhere, and T's version 2 was applied by another process.
    try (var c = servers.dataSource.getConnection();
        var ps =
            c.prepareStatement(
                "UPDATE outbox_inbox_version SET version = ? WHERE consumer = ?"
                    + " AND aggregate_id = ?")) {
      ps.setLong(1, 5);
      ps.setString(2, consumer);
      ps.setString(3, "S");
      ps.executeUpdate();
      ps.setLong(1, 2);
      ps.setString(3, "T");
      ps.executeUpdate();
    }
    hooks.calls.clear();
    Inbox.ParkedSweep sweep = inbox.sweepParked(handler);
    assertEquals(1, sweep.stale());
    assertEquals(1, sweep.resumed());
    assertEquals(0, sweep.deadLettered());
    assertEquals(0, sweep.parked());
    assertTrue(hooks.calls.contains("stale S-v3"), hooks.calls.toString());
    assertTrue(hooks.calls.contains("resumed T-v3"), hooks.calls.toString());
    assertEquals(0, parked(consumer));
    assertEquals(0, servers.coupons("S-v3"));
    assertEquals(1, servers.coupons("T-v3"));
    assertEquals(5, stored(consumer, "S"));
    assertEquals(3, stored(consumer, "T"));
  }

  @Test
  void anExpiredParkedRecordIsDeadLettered() throws Exception {
    String consumer = "park-expiry";
    String dlq = servers.topic("dlq-parked-expiry", 1);
    Recorder hooks = new Recorder();
    Inbox inbox =
        new Inbox(
            settings(consumer, dlq).gapDeadline(Duration.ZERO).build(),
            servers.dataSource,
            servers.producer(),
            hooks);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    ConsumerRecord<byte[], byte[]> v3 = record("G", "G-v3", 3);
    inbox.process(record("G", "G-v1", 1), handler);
    Instant before = Instant.now().minusSeconds(5);
    assertEquals(Outcome.PARKED, inbox.process(v3, handler).outcome());
    Thread.sleep(20);
    hooks.calls.clear();
    Inbox.ParkedSweep sweep = inbox.sweepParked(handler);
    assertEquals(1, sweep.deadLettered());
    assertEquals(0, sweep.parked());
    assertEquals(Duration.ZERO, sweep.oldest());
    assertEquals(List.of("dead_lettered G-v3"), hooks.calls);
    assertEquals(0, parked(consumer));
    assertEquals(0, servers.coupons("G-v3"));
    assertEquals(1, stored(consumer, "G"));
    List<ConsumerRecord<byte[], byte[]>> letters = servers.readAll(dlq, 1);
    assertEquals(1, letters.size());
    ConsumerRecord<byte[], byte[]> letter = letters.get(0);
    String reason = header(letter, "dlq_reason");
    String prefix = "version gap: expected 2, got 3; parked since ";
    assertTrue(reason.startsWith(prefix), reason);
    String since = reason.substring(prefix.length());
    assertTrue(
        since.matches("\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6}Z"), "RFC 3339: " + since);
    Instant at = Instant.parse(since);
    assertTrue(at.isAfter(before) && at.isBefore(Instant.now().plusSeconds(5)), since);
    assertEquals("0", header(letter, "dlq_attempts"));
    assertEquals(sourceTopic, header(letter, "dlq_topic"));
    assertEquals(Long.toString(v3.offset()), header(letter, "dlq_offset"));
    assertEquals("G-v3", header(letter, "event_key"));
    assertArrayEquals(v3.key(), letter.key());
    assertArrayEquals(v3.value(), letter.value());
    assertNull(letter.headers().lastHeader("empty").value());
    assertEquals("café ☕", header(letter, "note\"é"));
  }

  @Test
  void onGapExpiredCompensatesInsteadOfTheDeadLetter() throws Exception {
    String consumer = "park-compensate";
    String dlq = servers.topic("dlq-parked-compensate", 1);
    List<String> calls = Collections.synchronizedList(new ArrayList<>());
    AtomicInteger compensations = new AtomicInteger();
    Instant[] parkedAt = new Instant[1];
    Hooks hooks =
        new Hooks() {
          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            calls.add(result.outcome().label() + " " + header(record, "event_key"));
          }

          @Override
          public boolean onGapExpired(ConsumerRecord<byte[], byte[]> record, Instant at)
              throws Exception {
            parkedAt[0] = at;
            if (compensations.incrementAndGet() == 1) {
              throw new Exception("compensation service down");
            }
            calls.add("compensate " + header(record, "event_key"));
            return true;
          }
        };
    Inbox inbox =
        new Inbox(
            settings(consumer, dlq).gapDeadline(Duration.ZERO).build(),
            servers.dataSource,
            servers.producer(),
            hooks);
    Handler handler = coupon(consumer, new AtomicInteger());
    inbox.process(record("K", "K-v1", 1), handler);
    Instant before = Instant.now().minusSeconds(5);
    assertEquals(Outcome.PARKED, inbox.process(record("K", "K-v3", 3), handler).outcome());
    Thread.sleep(20);
    calls.clear();
    // The hook fails: the row stays for the next sweep.
    Inbox.ParkedSweep first = inbox.sweepParked(handler);
    assertEquals(0, first.compensated());
    assertEquals(1, first.parked());
    assertEquals(1, parked(consumer));
    assertTrue(calls.isEmpty(), calls.toString());
    Inbox.ParkedSweep second = inbox.sweepParked(handler);
    assertEquals(1, second.compensated());
    assertEquals(0, second.deadLettered());
    assertEquals(List.of("compensate K-v3", "compensated K-v3"), calls);
    assertEquals(0, parked(consumer));
    assertTrue(parkedAt[0].isAfter(before), parkedAt[0].toString());
    // No dead letter.
    assertEquals(0, servers.readAll(dlq, 0).size());
  }

  @Test
  void headersRoundTripInTheSharedFormat() {
    RecordHeaders headers = new RecordHeaders();
    headers.add("event_key", bytes("A-1"));
    headers.add("empty", null);
    headers.add("bin", new byte[] {0, (byte) 0xff, 10});
    headers.add("note\"é", bytes("x"));
    String text = ParkedHeaders.encode(headers);
    assertEquals(
        "[[\"event_key\", \"QS0x\"], [\"empty\", null], [\"bin\", \"AP8K\"],"
            + " [\"note\\\"\\u00e9\", \"eA==\"]]",
        text);
    Headers back = ParkedHeaders.decode(text);
    assertEquals(4, back.toArray().length);
    assertArrayEquals(new byte[] {0, (byte) 0xff, 10}, back.lastHeader("bin").value());
    assertNull(back.lastHeader("empty").value());
    assertArrayEquals(bytes("x"), back.lastHeader("note\"é").value());
    // As Rust's serde_json writes it (no spaces), and an empty array.
    Headers compact = ParkedHeaders.decode("[[\"a\",\"YQ==\"],[\"b\",null]]");
    assertArrayEquals(bytes("a"), compact.lastHeader("a").value());
    assertEquals(0, ParkedHeaders.decode("[]").toArray().length);
  }
}
