package dev.outboxrelay.inbox;

import static dev.outboxrelay.inbox.TestServers.bytes;
import static dev.outboxrelay.inbox.TestServers.header;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Logger;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * {@link Inbox#processBatch} and the runner's batch mode against real MariaDB 10.11 and MySQL 8.0
 * (INBOX_TEST_DB_PORT, INBOX_TEST_MYSQL_PORT) and a real Kafka.
 */
class BatchTest {
  private static final Map<String, TestServers> SERVERS = new HashMap<>();
  private static final AtomicInteger OFFSETS = new AtomicInteger();
  private static final AtomicInteger CONSUMERS = new AtomicInteger();
  private static String sourceTopic;

  @BeforeAll
  static void setUp() throws Exception {
    SERVERS.put("mariadb", new TestServers("mariadb"));
    SERVERS.put("mysql", new TestServers("mysql"));
    sourceTopic = SERVERS.get("mariadb").topic("batch-source", 1);
  }

  @AfterAll
  static void tearDown() throws Exception {
    Inbox.testHookAfterBatchSelect = null;
    for (TestServers s : SERVERS.values()) {
      s.close();
    }
  }

  /** A record as the relay makes it (payload {@code value}), at a fresh offset of partition 0. */
  private static ConsumerRecord<byte[], byte[]> record(
      String key, String eventKey, String value, Long version) {
    RecordHeaders headers = new RecordHeaders();
    headers.add("event_key", bytes(eventKey));
    headers.add("aggregate_type", bytes("order"));
    if (version != null) {
      headers.add("version", bytes(version.toString()));
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
        bytes(value),
        headers,
        Optional.empty());
  }

  /** A consumer name of its own per test: each test sees only its own rows. */
  private static String consumer(String name) {
    return "batch-" + name + "-" + CONSUMERS.incrementAndGet();
  }

  private static InboxSettings.Builder settings(String consumer, String dlq) {
    return InboxSettings.builder(consumer, dlq)
        .maxAttempts(2)
        .backoffInitial(Duration.ofMillis(5))
        .backoffMax(Duration.ofMillis(20))
        .batchMaxRecords(100);
  }

  /** The coupon handler: inserts one row, then fails for a payload {@code {"poison": true}}. */
  private static Handler coupon(String consumer, AtomicInteger runs) {
    return (tx, record) -> {
      runs.incrementAndGet();
      try (PreparedStatement ps =
          tx.prepareStatement(
              "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)")) {
        ps.setString(1, consumer);
        ps.setString(2, new String(record.key(), StandardCharsets.UTF_8));
        ps.setString(3, header(record, "event_key"));
        String v = header(record, "version");
        ps.setObject(4, v == null ? null : Long.valueOf(v));
        ps.executeUpdate();
      }
      if (new String(record.value(), StandardCharsets.UTF_8).contains("poison")) {
        throw new IllegalStateException("poison record");
      }
    };
  }

  private static List<Outcome> outcomes(List<Result> results) {
    List<Outcome> out = new ArrayList<>();
    results.forEach(r -> out.add(r.outcome()));
    return out;
  }

  private static long couponsOf(TestServers s, String consumer) throws SQLException {
    return s.count("SELECT COUNT(*) FROM coupons WHERE consumer = ?", consumer);
  }

  /** (a) 50 new records: 50 effects, 50 inbox rows as the single path writes them. */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void aBatchOfNewRecordsIsProcessedInOneGo(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("new");
    Inbox inbox = new Inbox(settings(consumer, "unused").build(), s.dataSource, s.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    List<ConsumerRecord<byte[], byte[]>> records = new ArrayList<>();
    for (int i = 0; i < 50; i++) {
      records.add(record("order-" + i, consumer + "-" + i, "{}", null));
    }
    List<Result> results = inbox.processBatch(records, coupon(consumer, runs));
    assertEquals(Collections.nCopies(50, new Result(Outcome.PROCESSED, 1)), results);
    assertEquals(50, runs.get());
    assertEquals(50, couponsOf(s, consumer));
    // The rows: the same columns and values as the single path's (a record processed alone).
    ConsumerRecord<byte[], byte[]> alone = record("order-x", consumer + "-alone", "{}", null);
    assertEquals(Outcome.PROCESSED, inbox.process(alone, coupon(consumer, runs)).outcome());
    try (Connection c = s.dataSource.getConnection();
        PreparedStatement ps =
            c.prepareStatement(
                "SELECT event_key, topic, kafka_partition, kafka_offset, processed_at IS NOT NULL"
                    + " FROM outbox_inbox WHERE consumer = ?")) {
      ps.setString(1, consumer);
      Map<String, String> rows = new HashMap<>();
      try (ResultSet rs = ps.executeQuery()) {
        while (rs.next()) {
          rows.put(
              new String(rs.getBytes(1), StandardCharsets.UTF_8),
              rs.getString(2) + "/" + rs.getInt(3) + "/" + rs.getLong(4) + "/" + rs.getBoolean(5));
        }
      }
      assertEquals(51, rows.size());
      records.add(alone);
      for (ConsumerRecord<byte[], byte[]> r : records) {
        assertEquals(
            r.topic() + "/" + r.partition() + "/" + r.offset() + "/true",
            rows.get(header(r, "event_key")));
      }
    }
  }

  /** (b) A key already in the inbox and a key twice in the batch: duplicates, one effect each. */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void duplicatesInTheInboxAndInTheBatch(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("dup");
    Inbox inbox = new Inbox(settings(consumer, "unused").build(), s.dataSource, s.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("o", "old", "{}", null), handler).outcome());
    List<Result> results =
        inbox.processBatch(
            List.of(
                record("o", "new-1", "{}", null),
                record("o", "old", "{}", null),
                record("o", "new-2", "{}", null),
                record("o", "new-1", "{}", null),
                // Differs from new-1 only in case: another event (keys compare byte for byte).
                record("o", "NEW-1", "{}", null)),
            handler);
    assertEquals(
        List.of(
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.DUPLICATE, 1),
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.DUPLICATE, 1),
            new Result(Outcome.PROCESSED, 1)),
        results);
    assertEquals(4, runs.get());
    for (String key : List.of("old", "new-1", "new-2", "NEW-1")) {
      assertEquals(
          1,
          s.count(
              "SELECT COUNT(*) FROM coupons WHERE consumer = ? AND BINARY event_key = ?",
              consumer,
              key),
          key);
    }
    assertEquals(4, s.count("SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?", consumer));
  }

  /**
   * (c) A poison record in the middle (max_attempts 2): the others processed once, it dead-lettered
   * after 2 attempts of its own, outcomes in input order.
   */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void aPoisonRecordInTheMiddleGoesAloneToTheDeadLetterTopic(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("poison");
    String dlq = s.topic("batch-dlq", 1);
    List<String> afterCommit = Collections.synchronizedList(new ArrayList<>());
    Hooks hooks =
        new Hooks() {
          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            afterCommit.add(header(record, "event_key") + " " + result.outcome().label());
          }
        };
    Inbox inbox = new Inbox(settings(consumer, dlq).build(), s.dataSource, s.producer(), hooks);
    AtomicInteger runs = new AtomicInteger();
    List<ConsumerRecord<byte[], byte[]>> records = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      records.add(record("o" + i, "p-" + i, i == 2 ? "{\"poison\": true}" : "{}", null));
    }
    List<Result> results = inbox.processBatch(records, coupon(consumer, runs));
    assertEquals(
        List.of(
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.DEAD_LETTERED, 2),
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.PROCESSED, 1)),
        results);
    for (int i = 0; i < 5; i++) {
      assertEquals(
          i == 2 ? 0 : 1,
          s.count(
              "SELECT COUNT(*) FROM coupons WHERE consumer = ? AND event_key = ?",
              consumer,
              "p-" + i),
          "p-" + i);
    }
    assertEquals(4, s.count("SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?", consumer));
    // Handler runs: the batch up to p-2 (3), p-0 and p-1 again (2), p-2 once more alone (the
    // failed batch run was its attempt 1 of max_attempts 2), p-3 and p-4 (2).
    assertEquals(8, runs.get());
    // afterCommit once per record: the batch before, the poison record, the batch after.
    assertEquals(
        List.of(
            "p-0 processed",
            "p-1 processed",
            "p-2 dead_lettered",
            "p-3 processed",
            "p-4 processed"),
        afterCommit);
    List<ConsumerRecord<byte[], byte[]>> letters = s.readAll(dlq, 1);
    assertEquals(1, letters.size());
    ConsumerRecord<byte[], byte[]> letter = letters.get(0);
    assertEquals("p-2", header(letter, "event_key"));
    assertEquals("2", header(letter, "dlq_attempts"));
    assertEquals("poison record", header(letter, "dlq_reason"));
    assertEquals(Long.toString(records.get(2).offset()), header(letter, "dlq_offset"));
  }

  /**
   * (d) One aggregate's v1, v2, v4, v3 and another's stale version: v4 parked then resumed after
   * the batch, the stale one stale, stored version 4, no parked row left.
   */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void versionsInOrderStaleParkedAndResumed(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("ver");
    List<String> afterCommit = Collections.synchronizedList(new ArrayList<>());
    List<String> beforeCommit = Collections.synchronizedList(new ArrayList<>());
    Hooks hooks =
        new Hooks() {
          @Override
          public void beforeCommit(ConsumerRecord<byte[], byte[]> record) {
            beforeCommit.add(header(record, "event_key"));
          }

          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            afterCommit.add(header(record, "event_key") + " " + result.outcome().label());
          }
        };
    io.micrometer.core.instrument.simple.SimpleMeterRegistry registry =
        new io.micrometer.core.instrument.simple.SimpleMeterRegistry();
    Inbox inbox =
        new Inbox(
            settings(consumer, "unused").versionHeader("version").meterRegistry(registry).build(),
            s.dataSource,
            s.producer(),
            hooks);
    AtomicInteger runs = new AtomicInteger();
    Handler handler = coupon(consumer, runs);
    assertEquals(
        Outcome.PROCESSED, inbox.process(record("B", "B-v5", "{}", 5L), handler).outcome());
    afterCommit.clear();
    beforeCommit.clear();
    List<Result> results =
        inbox.processBatch(
            List.of(
                record("A", "A-v1", "{}", 1L),
                record("A", "A-v2", "{}", 2L),
                record("A", "A-v4", "{}", 4L),
                record("B", "B-v3", "{}", 3L),
                record("A", "A-v3", "{}", 3L)),
            handler);
    assertEquals(
        List.of(
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.PARKED, 1),
            new Result(Outcome.STALE, 1),
            new Result(Outcome.PROCESSED, 1)),
        results);
    assertEquals(
        List.of(
            "A-v1 processed",
            "A-v2 processed",
            "A-v4 parked",
            "B-v3 stale",
            "A-v3 processed",
            "A-v4 resumed"),
        afterCommit);
    assertEquals(List.of("A-v1", "A-v2", "A-v3", "A-v4"), beforeCommit);
    // outbox_inbox_records_total by outcome, as the single path counts (B-v5 processed alone).
    Map<String, Double> counted = new HashMap<>();
    registry
        .find("outbox_inbox_records")
        .tag("consumer", consumer)
        .counters()
        .forEach(c -> counted.put(c.getId().getTag("outcome"), c.count()));
    assertEquals(Map.of("processed", 4.0, "parked", 1.0, "stale", 1.0, "resumed", 1.0), counted);
    assertEquals(
        4,
        s.count(
            "SELECT version FROM outbox_inbox_version WHERE consumer = ? AND aggregate_id = 'A'",
            consumer));
    assertEquals(
        5,
        s.count(
            "SELECT version FROM outbox_inbox_version WHERE consumer = ? AND aggregate_id = 'B'",
            consumer));
    assertEquals(
        0, s.count("SELECT COUNT(*) FROM outbox_inbox_parked WHERE consumer = ?", consumer));
    // Effects: A v1..v4 once each, B v5 once, none for the stale B v3.
    assertEquals(5, couponsOf(s, consumer));
    assertEquals(
        0,
        s.count(
            "SELECT COUNT(*) FROM coupons WHERE consumer = ? AND event_key = 'B-v3'", consumer));
    // Inbox rows: all six (the stale one included, as the single path leaves it), A-v4's written
    // by its resumption with its own topic, partition and offset.
    assertEquals(6, s.count("SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?", consumer));
  }

  /** A data source whose connections run at READ COMMITTED (as some applications configure). */
  private static DataSource readCommitted(DataSource pool) {
    return new DataSource() {
      @Override
      public Connection getConnection() throws SQLException {
        Connection c = pool.getConnection();
        c.setTransactionIsolation(Connection.TRANSACTION_READ_COMMITTED);
        return c;
      }

      @Override
      public Connection getConnection(String user, String password) throws SQLException {
        throw new SQLFeatureNotSupportedException();
      }

      @Override
      public PrintWriter getLogWriter() {
        return null;
      }

      @Override
      public void setLogWriter(PrintWriter out) {}

      @Override
      public void setLoginTimeout(int seconds) {}

      @Override
      public int getLoginTimeout() {
        return 0;
      }

      @Override
      public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        throw new SQLFeatureNotSupportedException();
      }

      @Override
      public <T> T unwrap(Class<T> iface) throws SQLException {
        throw new SQLException("not a wrapper");
      }

      @Override
      public boolean isWrapperFor(Class<?> iface) {
        return false;
      }
    };
  }

  /**
   * (e) Another transaction inserts one key of the batch between the duplicate check and the
   * insert. MySQL at READ COMMITTED: the INSERT fails with 1062, the batch is redone and finds it a
   * duplicate. MariaDB: INSERT IGNORE … RETURNING does not return it: a duplicate. Either way its
   * effect is not written, the others are processed once.
   */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void aKeyInsertedByAnotherTransactionMeanwhileIsADuplicate(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("race");
    Inbox inbox =
        new Inbox(
            settings(consumer, "unused").build(), readCommitted(s.dataSource), s.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    AtomicInteger hookCalls = new AtomicInteger();
    AtomicBoolean inserted = new AtomicBoolean();
    Inbox.testHookAfterBatchSelect =
        () -> {
          hookCalls.incrementAndGet();
          if (inserted.compareAndSet(false, true)) {
            try (Connection other = s.dataSource.getConnection();
                PreparedStatement ps =
                    other.prepareStatement(
                        "INSERT INTO outbox_inbox (consumer, event_key, topic, kafka_partition,"
                            + " kafka_offset) VALUES (?, 'race-2', 'elsewhere', 0, 0)")) {
              other.setAutoCommit(true);
              ps.setString(1, consumer);
              ps.executeUpdate();
            } catch (SQLException e) {
              throw new IllegalStateException(e);
            }
          }
        };
    List<Result> results;
    try {
      results =
          inbox.processBatch(
              List.of(
                  record("o", "race-1", "{}", null),
                  record("o", "race-2", "{}", null),
                  record("o", "race-3", "{}", null)),
              coupon(consumer, runs));
    } finally {
      Inbox.testHookAfterBatchSelect = null;
    }
    assertEquals(
        List.of(
            new Result(Outcome.PROCESSED, 1),
            new Result(Outcome.DUPLICATE, 1),
            new Result(Outcome.PROCESSED, 1)),
        results);
    // MySQL: redone once after the 1062; MariaDB: no redo needed.
    assertEquals(server.equals("mysql") ? 2 : 1, hookCalls.get());
    assertEquals(2, runs.get());
    assertEquals(0, s.coupons("race-2"));
    assertEquals(1, s.coupons("race-1"));
    assertEquals(1, s.coupons("race-3"));
    assertEquals(
        "elsewhere",
        s.strings(
                "SELECT topic FROM outbox_inbox WHERE consumer = '"
                    + consumer
                    + "' AND event_key = 'race-2'")
            .get(0));
  }

  /**
   * (f) The handler of the 3rd record kills its own connection once (an infrastructure error): the
   * whole batch is redone, every record processed once, attempts 1.
   */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void aLostConnectionMidBatchRedoesTheWholeBatch(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String consumer = consumer("kill");
    Inbox inbox = new Inbox(settings(consumer, "unused").build(), s.dataSource, s.producer(), null);
    AtomicInteger runs = new AtomicInteger();
    AtomicBoolean killed = new AtomicBoolean();
    Handler coupons = coupon(consumer, runs);
    Handler handler =
        (tx, record) -> {
          if (header(record, "event_key").equals("kill-2") && killed.compareAndSet(false, true)) {
            long id;
            try (Statement st = tx.createStatement();
                ResultSet rs = st.executeQuery("SELECT CONNECTION_ID()")) {
              rs.next();
              id = rs.getLong(1);
            }
            try (Connection other = s.dataSource.getConnection();
                Statement st = other.createStatement()) {
              st.execute("KILL CONNECTION " + id);
            }
          }
          coupons.handle(tx, record);
        };
    List<ConsumerRecord<byte[], byte[]>> records = new ArrayList<>();
    for (int i = 0; i < 5; i++) {
      records.add(record("o", "kill-" + i, "{}", null));
    }
    List<Result> results = inbox.processBatch(records, handler);
    assertTrue(killed.get());
    assertEquals(Collections.nCopies(5, new Result(Outcome.PROCESSED, 1)), results);
    for (int i = 0; i < 5; i++) {
      assertEquals(1, s.coupons("kill-" + i), "kill-" + i);
    }
    // The first try ran the handlers of kill-0, kill-1 and kill-2 (rolled back), the redo all 5.
    assertEquals(8, runs.get());
    assertEquals(5, s.count("SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?", consumer));
  }

  /** (g) The runner in batch mode over real Kafka: 500 records, 500 effects, offsets at the end. */
  @ParameterizedTest
  @ValueSource(strings = {"mariadb", "mysql"})
  void theRunnerSettlesPollBatchesInBatches(String server) throws Exception {
    TestServers s = SERVERS.get(server);
    String topic = s.topic("batch-runner", 1);
    String dlq = s.topic("batch-runner-dlq", 1);
    String group = s.group("batch-runner");
    for (int i = 0; i < 500; i++) {
      s.produceAsync(topic, 0, "o" + (i % 7), group + "-" + i, "{}");
    }
    s.producer().flush();
    AtomicInteger runs = new AtomicInteger();
    AtomicInteger settled = new AtomicInteger();
    AtomicInteger biggestPoll = new AtomicInteger();
    InboxRunner[] runner = new InboxRunner[1];
    Properties kafka = TestServers.kafka();
    runner[0] =
        InboxRunner.builder(kafka)
            .inbox(
                settings(group, dlq).batchMaxRecords(100).build(),
                s.dataSource,
                coupon(group, runs))
            .listener(
                new InboxRunner.Listener() {
                  @Override
                  public void polled(
                      org.apache.kafka.clients.consumer.ConsumerRecords<byte[], byte[]> records) {
                    biggestPoll.accumulateAndGet(records.count(), Math::max);
                  }

                  @Override
                  public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
                    assertEquals(new Result(Outcome.PROCESSED, 1), result);
                    if (settled.incrementAndGet() >= 500) {
                      runner[0].stop();
                    }
                  }
                })
            .pollTimeout(Duration.ofMillis(200))
            .build();
    runner[0].run(List.of(topic));
    assertEquals(500, settled.get());
    assertEquals(500, runs.get());
    assertEquals(500, couponsOf(s, group));
    assertEquals(500, s.count("SELECT COUNT(*) FROM outbox_inbox WHERE consumer = ?", group));
    assertEquals(500L, s.committed(group, topic, 0));
    assertTrue(biggestPoll.get() <= 100, "max.poll.records = batch_max_records");
  }

  /**
   * (i) Retry copies in batch mode: ordinary records are settled in batches (the last three share
   * one transaction), the retry copies from the tier topic each alone through the single path (a
   * transaction each, attempts from 1).
   */
  @Test
  void retryCopiesAreNotBatched() throws Exception {
    TestServers s = SERVERS.get("mariadb");
    String topic = s.topic("batch-tiers", 1);
    String dlq = s.topic("batch-tiers-dlq", 1);
    s.track(topic + ".retry.1");
    String group = s.group("batch-tiers");
    for (int i = 0; i < 6; i++) {
      // B-1 and B-2 fail until they are in tier 1.
      s.produceAsync(topic, 0, "o", "B-" + i, i == 1 || i == 2 ? "until-tier-1" : "{}");
    }
    s.producer().flush();
    // The order of handler, beforeCommit and afterCommit calls shows the transactions: a batch
    // runs its handlers, then its beforeCommits, then (after its commit) its afterCommits.
    List<String> events = Collections.synchronizedList(new ArrayList<>());
    Hooks hooks =
        new Hooks() {
          @Override
          public void beforeCommit(ConsumerRecord<byte[], byte[]> record) {
            events.add(
                "before " + header(record, "event_key") + "/" + RetryHeaders.retryCount(record));
          }

          @Override
          public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
            events.add(
                "after " + header(record, "event_key") + "/" + RetryHeaders.retryCount(record));
          }
        };
    Handler handler =
        (tx, record) -> {
          try (PreparedStatement ps =
              tx.prepareStatement(
                  "INSERT INTO coupons (consumer, order_id, event_key) VALUES (?, ?, ?)")) {
            ps.setString(1, group);
            ps.setString(2, "o");
            ps.setString(3, header(record, "event_key"));
            ps.executeUpdate();
          }
          events.add(
              "handle " + header(record, "event_key") + "/" + RetryHeaders.retryCount(record));
          boolean untilTier1 =
              new String(record.value(), StandardCharsets.UTF_8).equals("until-tier-1");
          if (untilTier1 && RetryHeaders.retryCount(record) < 1) {
            throw new Exception("failing until tier 1");
          }
        };
    List<String> outcomes = Collections.synchronizedList(new ArrayList<>());
    InboxRunner[] runner = new InboxRunner[1];
    runner[0] =
        InboxRunner.builder(TestServers.kafka())
            .inbox(
                settings(group, dlq).retryTiers(List.of(Duration.ZERO)).build(),
                s.dataSource,
                handler)
            .listener(
                new InboxRunner.Listener() {
                  @Override
                  public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
                    outcomes.add(
                        header(record, "event_key")
                            + " "
                            + result.outcome().label()
                            + " "
                            + result.attempts());
                    if (outcomes.size() >= 8) {
                      runner[0].stop();
                    }
                  }
                })
            .hooks(hooks)
            .pollTimeout(Duration.ofMillis(200))
            .build();
    runner[0].run(List.of(topic));
    assertEquals(
        List.of(
            "B-0 processed 1",
            "B-1 retried 2",
            "B-2 retried 2",
            "B-3 processed 1",
            "B-4 processed 1",
            "B-5 processed 1",
            "B-1 processed 1",
            "B-2 processed 1"),
        outcomes);
    for (int i = 0; i < 6; i++) {
      assertEquals(1, s.coupons("B-" + i), "B-" + i);
    }
    // The batch after the split: one transaction (three handlers, then three beforeCommits).
    int b3 = events.indexOf("handle B-3/0");
    assertEquals(
        List.of(
            "handle B-3/0",
            "handle B-4/0",
            "handle B-5/0",
            "before B-3/0",
            "before B-4/0",
            "before B-5/0",
            "after B-3/0",
            "after B-4/0",
            "after B-5/0"),
        events.subList(b3, b3 + 9));
    // The copies: a transaction each.
    int c1 = events.indexOf("handle B-1/1");
    assertEquals(
        List.of(
            "handle B-1/1",
            "before B-1/1",
            "after B-1/1",
            "handle B-2/1",
            "before B-2/1",
            "after B-2/1"),
        events.subList(c1, c1 + 6),
        events.toString());
    assertEquals(6L, s.committed(group, topic, 0));
    // The copies' offsets (the tier topic has the broker's default partitions).
    long copies = 0;
    for (Map.Entry<Integer, Long> end : s.endOffsets(topic + ".retry.1").entrySet()) {
      copies += end.getValue();
      if (end.getValue() > 0) {
        assertEquals(end.getValue(), s.committed(group, topic + ".retry.1", end.getKey()));
      }
    }
    assertEquals(2, copies);
  }

  /** (h) batch_max_records outside 1..10000 and a negative batch_max_wait are refused. */
  @Test
  void batchSettingsAreChecked() {
    for (int bad : new int[] {0, 10001}) {
      IllegalArgumentException e =
          assertThrows(
              IllegalArgumentException.class,
              () -> InboxSettings.builder("c", "dlq").batchMaxRecords(bad).build());
      assertEquals("batch_max_records must be between 1 and 10000, got " + bad, e.getMessage());
    }
    IllegalArgumentException e =
        assertThrows(
            IllegalArgumentException.class,
            () -> InboxSettings.builder("c", "dlq").batchMaxWait(Duration.ofMillis(-1)).build());
    assertTrue(e.getMessage().startsWith("batch_max_wait must not be negative"), e.getMessage());
    InboxSettings defaults = InboxSettings.builder("c", "dlq").build();
    assertEquals(1, defaults.batchMaxRecords());
    assertEquals(Duration.ofMillis(20), defaults.batchMaxWait());
    assertEquals(
        10000, InboxSettings.builder("c", "dlq").batchMaxRecords(10000).build().batchMaxRecords());
  }
}
