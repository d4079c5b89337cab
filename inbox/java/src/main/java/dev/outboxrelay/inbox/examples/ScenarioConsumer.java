package dev.outboxrelay.inbox.examples;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.outboxrelay.inbox.GapPolicy;
import dev.outboxrelay.inbox.Handler;
import dev.outboxrelay.inbox.Hooks;
import dev.outboxrelay.inbox.InboxRunner;
import dev.outboxrelay.inbox.InboxSettings;
import dev.outboxrelay.inbox.Outcome;
import dev.outboxrelay.inbox.Result;
import dev.outboxrelay.inbox.RetryHeaders;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.common.header.Header;
import org.mariadb.jdbc.MariaDbPoolDataSource;

/**
 * The scenario consumer of inbox/CONTRACT.md: runs the inbox with the fixed coupon handler,
 * configured by {@code INBOX_*} environment variables, and reports on stdout ({@code READY}, {@code
 * OUTCOME …}, {@code BENCH …}). Logs go to stderr. Exit status 0 after SIGTERM/SIGINT or {@code
 * INBOX_EXIT_AFTER}, 137 for a scenario crash, 1 for an error.
 */
public final class ScenarioConsumer {
  private static final PrintStream OUT =
      new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);

  private final Map<String, String> env;
  private final String consumer;
  private final String versionHeader;
  private final String crashPoint;
  private final String crashEventKey;
  private final String crashMarker;
  private final long exitAfter;
  private final Map<String, Integer> failures = new HashMap<>();
  private ObjectMapper json;

  private long[] latencies = new long[0];
  private int settled;
  private long pollNanos;

  /** When the poll that returned each record not yet settled returned (batch mode polls more). */
  private final Map<ConsumerRecord<byte[], byte[]>, Long> polledAt = new IdentityHashMap<>();

  private long firstPollNanos;
  private long lastSettledNanos;
  private InboxRunner runner;
  private boolean plain;

  private ScenarioConsumer(Map<String, String> env) {
    this.env = env;
    this.consumer = required("INBOX_CONSUMER");
    this.versionHeader = env.getOrDefault("INBOX_VERSION_HEADER", "");
    this.crashPoint = env.getOrDefault("INBOX_CRASH_POINT", "");
    this.crashEventKey = env.getOrDefault("INBOX_CRASH_EVENT_KEY", "");
    this.crashMarker = env.getOrDefault("INBOX_CRASH_MARKER", "");
    this.exitAfter = Long.parseLong(orDefault("INBOX_EXIT_AFTER", "0"));
    if (exitAfter > 0) {
      latencies = new long[(int) Math.min(exitAfter, 10_000_000)];
    }
  }

  /**
   * Runs the scenario consumer.
   *
   * @param args none (configuration is in the environment)
   */
  public static void main(String[] args) {
    ScenarioConsumer app;
    MariaDbPoolDataSource dataSource;
    InboxRunner runner;
    try {
      app = new ScenarioConsumer(System.getenv());
      dataSource = app.dataSource();
      runner = app.runner(dataSource);
    } catch (Exception e) {
      System.err.println("scenario consumer: " + e);
      System.exit(1);
      return;
    }
    int[] status = {0};
    CountDownLatch mainDone = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  runner.close(); // SIGTERM/SIGINT: finish the record in hand, commit, close
                  try {
                    mainDone.await();
                  } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                  }
                  OUT.flush();
                  Runtime.getRuntime().halt(status[0]); // exit 0 after a signal, not 143
                },
                "scenario-consumer-shutdown"));
    try {
      runner.run(List.of(app.required("INBOX_TOPIC")));
      if (app.exitAfter > 0 && app.settled >= app.exitAfter) {
        app.printBench();
      }
    } catch (RuntimeException e) {
      System.err.println("scenario consumer: " + e);
      e.printStackTrace();
      status[0] = 1;
    } finally {
      dataSource.close();
    }
    OUT.flush();
    mainDone.countDown();
    System.exit(status[0]);
  }

  private InboxRunner runner(MariaDbPoolDataSource dataSource) {
    runner = build(dataSource);
    return runner;
  }

  private InboxRunner build(MariaDbPoolDataSource dataSource) {
    Properties kafka = new Properties();
    kafka.put("bootstrap.servers", required("INBOX_BOOTSTRAP"));
    kafka.put(ConsumerConfig.GROUP_ID_CONFIG, required("INBOX_GROUP"));
    kafka.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    // A crashed (exit 137) member holds its partitions until its session times out: keep a
    // restart's wait short (broker minimum 6 s; the client default is 45 s).
    kafka.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
    InboxRunner.Builder builder = InboxRunner.builder(kafka).listener(new Report());
    String mode = orDefault("INBOX_MODE", "inbox");
    if (mode.equals("plain")) {
      plain = true;
      Handler handler = this::handle;
      return builder
          .processor(
              record -> {
                try (Connection c = dataSource.getConnection()) {
                  c.setAutoCommit(true);
                  handler.handle(c, record);
                }
                return new Result(Outcome.PROCESSED, 1);
              })
          .build();
    }
    if (!mode.equals("inbox")) {
      throw new IllegalArgumentException("INBOX_MODE must be inbox or plain, not " + mode);
    }
    long backoff = Long.parseLong(orDefault("INBOX_BACKOFF_MS", "50"));
    InboxSettings settings =
        InboxSettings.builder(consumer, required("INBOX_DLQ_TOPIC"))
            .maxAttempts(Integer.parseInt(orDefault("INBOX_MAX_ATTEMPTS", "3")))
            .backoffInitial(Duration.ofMillis(backoff))
            .backoffMax(Duration.ofMillis(Math.max(backoff, 1000)))
            .outageBudget(
                Duration.ofMillis(Long.parseLong(orDefault("INBOX_OUTAGE_BUDGET_MS", "300000"))))
            .versionHeader(versionHeader)
            .gapPolicy(
                GapPolicy.valueOf(orDefault("INBOX_GAP_POLICY", "park").toUpperCase(Locale.ROOT)))
            .gapDeadline(
                Duration.ofMillis(Long.parseLong(orDefault("INBOX_GAP_DEADLINE_MS", "3600000"))))
            .parkSweepInterval(
                Duration.ofMillis(Long.parseLong(orDefault("INBOX_PARK_SWEEP_MS", "10000"))))
            .retryTiers(retryTiers(env.getOrDefault("INBOX_RETRY_TIERS_MS", "")))
            .batchMaxRecords(Integer.parseInt(orDefault("INBOX_BATCH", "1")))
            .batchMaxWait(Duration.ofMillis(Long.parseLong(orDefault("INBOX_BATCH_WAIT_MS", "20"))))
            .build();
    return builder.inbox(settings, dataSource, this::handle).hooks(new CrashHooks()).build();
  }

  /** {@code INBOX_RETRY_TIERS_MS}: comma-separated delays in ms; empty: none. */
  private static List<Duration> retryTiers(String text) {
    List<Duration> tiers = new ArrayList<>();
    for (String part : text.split(",")) {
      if (!part.isBlank()) {
        tiers.add(Duration.ofMillis(Long.parseLong(part.trim())));
      }
    }
    return tiers;
  }

  private MariaDbPoolDataSource dataSource() throws SQLException {
    String url =
        "jdbc:mariadb://"
            + orDefault("INBOX_DB_HOST", "127.0.0.1")
            + ":"
            + orDefault("INBOX_DB_PORT", "3306")
            + "/"
            + required("INBOX_DB_NAME")
            + "?user="
            + URLEncoder.encode(orDefault("INBOX_DB_USER", "root"), StandardCharsets.UTF_8)
            + "&password="
            + URLEncoder.encode(env.getOrDefault("INBOX_DB_PASSWORD", ""), StandardCharsets.UTF_8)
            + "&allowPublicKeyRetrieval=true&maxPoolSize=2&minPoolSize=1";
    return new MariaDbPoolDataSource(url);
  }

  /** The business handler every helper's scenario consumer runs (inbox/CONTRACT.md). */
  private void handle(Connection tx, ConsumerRecord<byte[], byte[]> record) throws Exception {
    if (json == null) {
      json = new ObjectMapper();
    }
    JsonNode payload = json.readTree(record.value());
    String eventKey = header(record, "event_key");
    try (PreparedStatement insert =
        tx.prepareStatement(
            "INSERT INTO coupons (consumer, order_id, event_key, version) VALUES (?, ?, ?, ?)")) {
      insert.setString(1, consumer);
      insert.setString(
          2, record.key() == null ? null : new String(record.key(), StandardCharsets.UTF_8));
      insert.setString(3, eventKey);
      Long version = parseLong(header(record, versionHeader.isEmpty() ? "version" : versionHeader));
      if (version == null) {
        insert.setNull(4, Types.BIGINT);
      } else {
        insert.setLong(4, version);
      }
      insert.executeUpdate();
    }
    if (payload.path("poison").asBoolean(false)) {
      throw new Exception("poison record");
    }
    int failUntilTier = payload.path("fail_until_tier").asInt(0);
    if (RetryHeaders.retryCount(record) < failUntilTier) {
      throw new Exception("failing until tier " + failUntilTier);
    }
    int failTimes = payload.path("fail_times").asInt(0);
    if (failTimes > 0) {
      int failed = failures.getOrDefault(eventKey, 0);
      if (failed < failTimes) {
        failures.put(eventKey, failed + 1);
        throw new Exception("transient failure " + (failed + 1) + " of " + failTimes);
      }
    }
  }

  /** Crashes at the configured point: exit 137 at once, no cleanup. */
  private final class CrashHooks implements Hooks {
    @Override
    public void beforeCommit(ConsumerRecord<byte[], byte[]> record) {
      if (crashPoint.equals("after_handler")) {
        maybeCrash(record);
      }
    }

    @Override
    public void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {
      // Every settled record passes here once: those the runner polled, and those settled later
      // by themselves (resumed parked versions, a sweep's dead letters).
      outcome(record, result);
      if (crashPoint.equals("after_db_commit") && result.outcome() == Outcome.PROCESSED) {
        maybeCrash(record);
      }
      if (crashPoint.equals("after_retry_copy") && result.outcome() == Outcome.RETRIED) {
        maybeCrash(record);
      }
    }

    private void maybeCrash(ConsumerRecord<byte[], byte[]> record) {
      if (!crashEventKey.equals(header(record, "event_key"))) {
        return;
      }
      if (!crashMarker.isEmpty()) {
        try {
          Files.createFile(Path.of(crashMarker));
        } catch (FileAlreadyExistsException e) {
          return; // crashed once already
        } catch (IOException e) {
          throw new IllegalStateException("cannot create the crash marker " + crashMarker, e);
        }
      }
      OUT.flush();
      System.err.println("scenario consumer: crash at " + crashPoint + " of " + crashEventKey);
      Runtime.getRuntime().halt(137);
    }
  }

  /** Prints READY and OUTCOME lines; measures and ends the bench. */
  private final class Report implements InboxRunner.Listener {
    @Override
    public void subscribed() {
      line("READY");
    }

    @Override
    public void polled(ConsumerRecords<byte[], byte[]> records) {
      pollNanos = System.nanoTime();
      if (firstPollNanos == 0) {
        firstPollNanos = pollNanos;
      }
      if (exitAfter > 0) {
        for (ConsumerRecord<byte[], byte[]> record : records) {
          polledAt.put(record, pollNanos);
        }
      }
    }

    @Override
    public void settled(ConsumerRecord<byte[], byte[]> record, Result result) {
      long now = System.nanoTime();
      if (plain) {
        outcome(record, result); // no inbox, no hooks: reported here
      }
      if (exitAfter <= 0) {
        return;
      }
      Long at = polledAt.remove(record);
      if (settled < latencies.length) {
        latencies[settled] = now - (at == null ? pollNanos : at);
      }
      settled++;
      lastSettledNanos = now;
      if (settled >= exitAfter) {
        runner.stop();
      }
    }
  }

  private static void outcome(ConsumerRecord<byte[], byte[]> record, Result result) {
    line(
        "OUTCOME "
            + result.outcome().label()
            + " "
            + printable(header(record, "event_key"))
            + " "
            + RetryHeaders.originalPartition(record) // a retry copy's: the first record's
            + " "
            + RetryHeaders.originalOffset(record)
            + " "
            + result.attempts());
  }

  private void printBench() {
    int n = Math.min(settled, latencies.length);
    long[] sorted = Arrays.copyOf(latencies, n);
    Arrays.sort(sorted);
    double seconds = (lastSettledNanos - firstPollNanos) / 1e9;
    line(
        String.format(
            Locale.ROOT,
            "BENCH records=%d seconds=%.3f p50_ms=%.3f p99_ms=%.3f",
            settled,
            seconds,
            percentile(sorted, 0.50),
            percentile(sorted, 0.99)));
  }

  private static double percentile(long[] sorted, double q) {
    if (sorted.length == 0) {
      return 0;
    }
    int index = (int) Math.ceil(q * sorted.length) - 1;
    return sorted[Math.max(0, Math.min(index, sorted.length - 1))] / 1e6;
  }

  private static void line(String text) {
    OUT.println(text);
    OUT.flush();
  }

  private static String header(ConsumerRecord<byte[], byte[]> record, String name) {
    Header h = record.headers().lastHeader(name);
    return h == null || h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8);
  }

  /** The event key as one word of an OUTCOME line: {@code -} when missing or empty. */
  private static String printable(String eventKey) {
    return eventKey == null || eventKey.isBlank() ? "-" : eventKey.replaceAll("\\s", "_");
  }

  private static Long parseLong(String text) {
    if (text == null) {
      return null;
    }
    try {
      return Long.parseLong(text.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }

  private String required(String name) {
    String value = env.get(name);
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException(name + " is required");
    }
    return value;
  }

  private String orDefault(String name, String fallback) {
    String value = env.get(name);
    return value == null || value.isEmpty() ? fallback : value;
  }
}
