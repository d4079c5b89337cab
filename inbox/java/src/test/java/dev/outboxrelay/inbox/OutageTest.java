package dev.outboxrelay.inbox;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ConnectException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.SQLTransactionRollbackException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.mariadb.jdbc.MariaDbPoolDataSource;

/**
 * An infrastructure error is not a failed attempt (inbox/CONTRACT.md, "Attempts and outages"). The
 * database is made unreachable through a TCP proxy of the test's own (the shared server keeps
 * running): the proxy's listener is closed and its connections cut, then it listens again on the
 * same port.
 */
class OutageTest {
  private TestServers servers;
  private DbProxy proxy;
  private MariaDbPoolDataSource proxied;

  /**
   * Forwards a local port to the database server. {@link #down} closes the listener (new
   * connections are refused) and cuts the open connections; {@link #up} listens again on the same
   * port.
   */
  static final class DbProxy {
    private final InetSocketAddress target;
    private final Set<Socket> sockets = new HashSet<>();
    private ServerSocket listener;
    final int port;

    DbProxy(InetSocketAddress target) throws IOException {
      this.target = target;
      this.port = listen(0);
    }

    private int listen(int port) throws IOException {
      ServerSocket s = new ServerSocket();
      s.setReuseAddress(true);
      s.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
      synchronized (this) {
        listener = s;
      }
      Thread t = new Thread(() -> accept(s), "db-proxy-accept");
      t.setDaemon(true);
      t.start();
      return s.getLocalPort();
    }

    private void accept(ServerSocket s) {
      while (true) {
        Socket client;
        try {
          client = s.accept();
        } catch (IOException closed) {
          return; // closed by down()
        }
        try {
          Socket server = new Socket(target.getAddress(), target.getPort());
          synchronized (this) {
            sockets.add(client);
            sockets.add(server);
          }
          pump(client, server);
          pump(server, client);
        } catch (IOException e) {
          closeQuietly(client);
        }
      }
    }

    private static void pump(Socket from, Socket to) {
      Thread t =
          new Thread(
              () -> {
                try (InputStream in = from.getInputStream();
                    OutputStream out = to.getOutputStream()) {
                  in.transferTo(out);
                } catch (IOException e) {
                  // cut
                } finally {
                  closeQuietly(from);
                  closeQuietly(to);
                }
              },
              "db-proxy-pump");
      t.setDaemon(true);
      t.start();
    }

    private static void closeQuietly(Socket s) {
      try {
        s.close();
      } catch (IOException e) {
        // already closed
      }
    }

    void down() throws Exception {
      List<Socket> open;
      synchronized (this) {
        if (listener != null) {
          listener.close();
          listener = null;
        }
        open = new ArrayList<>(sockets);
        sockets.clear();
      }
      open.forEach(DbProxy::closeQuietly);
      TestServers.await(
          "the proxy port to refuse",
          () -> {
            try (Socket probe = new Socket()) {
              probe.connect(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 1000);
              return false;
            } catch (ConnectException refused) {
              return true;
            } catch (IOException other) {
              return false;
            }
          });
    }

    void up() throws Exception {
      TestServers.await(
          "the proxy port to bind again",
          () -> {
            try {
              listen(port);
              return true;
            } catch (IOException inUse) {
              return false;
            }
          });
    }
  }

  private static String env(String name, String fallback) {
    String value = System.getenv(name);
    return value == null || value.isEmpty() ? fallback : value;
  }

  @BeforeEach
  void setUp() throws Exception {
    servers = new TestServers();
    proxy =
        new DbProxy(
            new InetSocketAddress(
                env("INBOX_TEST_DB_HOST", "127.0.0.1"),
                Integer.parseInt(env("INBOX_TEST_DB_PORT", "3306"))));
    proxied =
        new MariaDbPoolDataSource(
            "jdbc:mariadb://127.0.0.1:"
                + proxy.port
                + "/"
                + servers.database
                + "?user="
                + env("INBOX_TEST_DB_USER", "root")
                + "&password="
                + System.getenv().getOrDefault("INBOX_TEST_DB_PASSWORD", "")
                + "&allowPublicKeyRetrieval=true&maxPoolSize=2&minPoolSize=0&connectTimeout=2000");
  }

  @AfterEach
  void tearDown() throws Exception {
    proxy.down();
    proxied.close();
    servers.close();
  }

  private static void coupon(java.sql.Connection tx, String eventKey) throws SQLException {
    try (PreparedStatement ps =
        tx.prepareStatement("INSERT INTO coupons (consumer, event_key) VALUES ('outage', ?)")) {
      ps.setString(1, eventKey);
      ps.executeUpdate();
    }
  }

  /** A runner on its own thread; {@link #error} is what {@code run} threw. */
  private final class Running {
    final InboxRunner runner;
    final Thread thread;
    volatile RuntimeException error;

    Running(String topic, String group, InboxSettings settings) {
      Properties kafka = TestServers.kafka();
      kafka.put("group.id", group);
      runner =
          InboxRunner.builder(kafka)
              .inbox(
                  settings,
                  proxied,
                  (tx, record) -> coupon(tx, TestServers.header(record, "event_key")))
              .pollTimeout(Duration.ofMillis(200))
              .build();
      thread =
          new Thread(
              () -> {
                try {
                  runner.run(List.of(topic));
                } catch (RuntimeException e) {
                  error = e;
                }
              },
              "inbox-runner");
      thread.start();
    }

    void stop() throws InterruptedException {
      runner.close();
      join();
    }

    void join() throws InterruptedException {
      thread.join(Duration.ofSeconds(60).toMillis());
      assertFalse(thread.isAlive(), "the runner did not stop");
    }
  }

  private InboxSettings.Builder settings(String dlq) {
    return InboxSettings.builder("outage", dlq)
        .maxAttempts(3)
        .backoffInitial(Duration.ofMillis(10))
        .backoffMax(Duration.ofMillis(20));
  }

  private void produce(String topic, int from, int to) throws Exception {
    for (int i = from; i < to; i++) {
      servers.produce(topic, 0, "order-" + i, "e-" + i, "{}");
    }
  }

  private Long committed(String group) throws Exception {
    return servers.committed(group).get(0);
  }

  private void awaitCommitted(String group, long offset) throws Exception {
    TestServers.await(
        "offset " + offset + " committed",
        () -> {
          try {
            return Long.valueOf(offset).equals(committed(group));
          } catch (Exception e) {
            return false;
          }
        });
  }

  private void assertEffectsOnce(int n) throws SQLException {
    for (int i = 0; i < n; i++) {
      assertEquals(1, servers.coupons("e-" + i), "coupons of e-" + i);
    }
    assertEquals(n, servers.count("SELECT COUNT(*) FROM coupons"), "coupons in all");
  }

  /**
   * The database is unreachable for far longer than max_attempts × backoff (3 attempts, waits of 10
   * and 20 ms) while records arrive; once it is back every record is processed once, none is
   * dead-lettered, and the offsets are committed.
   */
  @Test
  void anOutageIsNotAFailedAttempt() throws Exception {
    String topic = servers.topic("outage", 1);
    String dlq = servers.topic("outage-dlq", 1);
    String group = servers.group("outage");
    Running running = new Running(topic, group, settings(dlq).build());
    produce(topic, 0, 3);
    awaitCommitted(group, 3);

    proxy.down();
    produce(topic, 3, 8);
    // The outage itself lasts a fixed time (the stimulus, not a wait for a result): 2 s, about
    // 70 times the old retry budget.
    Thread.sleep(2000);
    assertEquals(3L, committed(group), "committed during the outage");
    proxy.up();

    awaitCommitted(group, 8);
    running.stop();
    assertNull(running.error);
    assertEffectsOnce(8);
    assertEquals(Map.of(0, 0L), servers.endOffsets(dlq), "dead letters");
  }

  /**
   * An outage longer than the outage budget stops the runner with {@link InboxOutageException},
   * nothing past the last processed record committed; a restarted runner processes the rest once.
   */
  @Test
  void anOutageLongerThanTheBudgetStopsTheRunner() throws Exception {
    String topic = servers.topic("outage", 1);
    String dlq = servers.topic("outage-dlq", 1);
    String group = servers.group("outage");
    Running running =
        new Running(topic, group, settings(dlq).outageBudget(Duration.ofSeconds(1)).build());
    produce(topic, 0, 3);
    awaitCommitted(group, 3);

    proxy.down();
    produce(topic, 3, 6);
    running.join();
    InboxOutageException outage = assertInstanceOf(InboxOutageException.class, running.error);
    assertEquals(topic + "-0@3", outage.topic() + "-" + outage.partition() + "@" + outage.offset());
    assertTrue(Inbox.isInfrastructureError(outage.getCause()), outage.toString());
    assertEquals(3L, committed(group), "committed after the outage");
    proxy.up();

    Running restarted = new Running(topic, group, settings(dlq).build());
    awaitCommitted(group, 6);
    restarted.stop();
    assertNull(restarted.error);
    assertEffectsOnce(6);
    assertEquals(Map.of(0, 0L), servers.endOffsets(dlq), "dead letters");
  }

  /**
   * With retry tiers and a single attempt, an outage sends no record to a tier (nor to the
   * dead-letter topic): once the database is back every record is processed once in its topic.
   */
  @Test
  void anOutageNeverSendsARecordToARetryTier() throws Exception {
    String topic = servers.topic("outage-tiers", 1);
    String dlq = servers.topic("outage-tiers-dlq", 1);
    String tier = topic + ".retry.1";
    servers.track(tier);
    String group = servers.group("outage-tiers");
    Running running =
        new Running(
            topic,
            group,
            settings(dlq).maxAttempts(1).retryTiers(List.of(Duration.ofMillis(100))).build());
    produce(topic, 0, 3);
    awaitCommitted(group, 3);

    proxy.down();
    produce(topic, 3, 6);
    Thread.sleep(2000); // the outage (the stimulus): far longer than one attempt's backoff
    assertEquals(3L, committed(group), "committed during the outage");
    proxy.up();

    awaitCommitted(group, 6);
    running.stop();
    assertNull(running.error);
    assertEffectsOnce(6);
    long copies = servers.endOffsets(tier).values().stream().mapToLong(Long::longValue).sum();
    assertEquals(0, copies, "retry copies");
    assertEquals(Map.of(0, 0L), servers.endOffsets(dlq), "dead letters");
  }

  @Test
  void infrastructureErrorsAreClassifiedByCodeStateAndType() {
    for (int code : new int[] {1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006}) {
      assertTrue(Inbox.isInfrastructureError(new SQLException("m", "HY000", code)), "" + code);
    }
    for (int code : new int[] {1062, 1146, 1064}) {
      assertFalse(Inbox.isInfrastructureError(new SQLException("m", "HY000", code)), "" + code);
    }
    assertTrue(Inbox.isInfrastructureError(new SQLException("gone", "08S01", 0)));
    assertTrue(Inbox.isInfrastructureError(new SQLTransactionRollbackException("deadlock")));
    // A handler's own exception counts as an attempt, unless its cause is an infrastructure error.
    assertFalse(Inbox.isInfrastructureError(new IllegalStateException("poison record")));
    assertTrue(
        Inbox.isInfrastructureError(
            new IllegalStateException("grant failed", new SQLException("m", "40001", 1213))));
  }

  /** A record as polled from partition 0 of {@code topic} at {@code offset}. */
  private static org.apache.kafka.clients.consumer.ConsumerRecord<byte[], byte[]> polled(
      String topic, long offset) {
    org.apache.kafka.common.header.internals.RecordHeaders headers =
        new org.apache.kafka.common.header.internals.RecordHeaders();
    headers.add("event_key", TestServers.bytes("b-" + offset));
    headers.add("aggregate_type", TestServers.bytes("order"));
    return new org.apache.kafka.clients.consumer.ConsumerRecord<>(
        topic,
        0,
        offset,
        0L,
        org.apache.kafka.common.record.TimestampType.CREATE_TIME,
        -1,
        -1,
        TestServers.bytes("order"),
        TestServers.bytes("{}"),
        headers,
        java.util.Optional.empty());
  }

  /**
   * Batch mode: a database outage shorter than the budget redoes the whole batch (attempts 1, once
   * each); one longer than the budget fails with the outage error naming the batch's first record
   * and settles nothing of it.
   */
  @Test
  void aBatchWaitsOutAnOutageOrStopsWithNothingSettled() throws Exception {
    List<org.apache.kafka.clients.consumer.ConsumerRecord<byte[], byte[]>> batch =
        List.of(polled("t", 7), polled("t", 8), polled("t", 9));
    Inbox shortBudget =
        new Inbox(
            settings("unused").outageBudget(Duration.ofMillis(500)).build(),
            proxied,
            servers.producer(),
            null);
    proxy.down();
    InboxOutageException outage =
        org.junit.jupiter.api.Assertions.assertThrows(
            InboxOutageException.class,
            () -> shortBudget.processBatch(batch, (tx, record) -> coupon(tx, "x")));
    assertEquals("t", outage.topic());
    assertEquals(0, outage.partition());
    assertEquals(7L, outage.offset());
    assertTrue(Inbox.isInfrastructureError(outage.getCause()), outage.getCause().toString());
    assertEquals(0, servers.count("SELECT COUNT(*) FROM outbox_inbox"));

    Inbox inbox =
        new Inbox(
            settings("unused").outageBudget(Duration.ofSeconds(60)).build(),
            proxied,
            servers.producer(),
            null);
    Thread revive =
        new Thread(
            () -> {
              try {
                Thread.sleep(1000);
                proxy.up();
              } catch (Exception e) {
                throw new IllegalStateException(e);
              }
            });
    revive.start();
    List<Result> results =
        inbox.processBatch(
            batch, (tx, record) -> coupon(tx, TestServers.header(record, "event_key")));
    revive.join();
    assertEquals(java.util.Collections.nCopies(3, new Result(Outcome.PROCESSED, 1)), results);
    for (String key : List.of("b-7", "b-8", "b-9")) {
      assertEquals(1, servers.coupons(key), key);
    }
  }
}
