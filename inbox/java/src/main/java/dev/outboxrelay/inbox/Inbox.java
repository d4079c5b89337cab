package dev.outboxrelay.inbox;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.context.Scope;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLNonTransientConnectionException;
import java.sql.SQLTransactionRollbackException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Processes one Kafka record at most once per (consumer, event key): the inbox row, the version
 * check and the handler's change commit in one database transaction (inbox/CONTRACT.md).
 *
 * <p>For users with their own poll loop: call {@link #process} for each record of a partition in
 * offset order, and commit the record's offset + 1 to Kafka only after it returned. {@link
 * InboxRunner} does all that. An instance is thread-safe when its data source and producer are
 * (connection pools and {@code KafkaProducer} are), but records of one partition must be processed
 * one at a time.
 *
 * <p>Each record is processed inside an OpenTelemetry consumer span {@code "<topic> process"} whose
 * parent is the W3C trace context of the record's {@code traceparent}/{@code tracestate} headers;
 * the span is current while the handler and the hooks run, so their own spans join the producer's
 * trace (inbox/CONTRACT.md, "Trace context"; {@link InboxSettings.Builder#openTelemetry}).
 */
public final class Inbox {
  private static final Logger LOG = LoggerFactory.getLogger(Inbox.class);
  private static final int ER_DUP_ENTRY = 1062;

  /**
   * Server and client error codes that are the infrastructure's, not the record's: lock wait
   * timeout, deadlock, read-only server, shutdown, connection killed, client disconnected, and the
   * client codes of a refused or lost connection.
   */
  private static final java.util.Set<Integer> INFRASTRUCTURE_CODES =
      java.util.Set.of(
          1205, 1213, 1290, 1836, 1053, 1077, 1927, 4031, 2002, 2003, 2006, 2013, 2055);

  /** The header naming the record's aggregate type (the version table's key part). */
  public static final String AGGREGATE_TYPE_HEADER = "aggregate_type";

  private final InboxSettings settings;
  private final DataSource dataSource;
  private final Producer<byte[], byte[]> deadLetters;
  private final Hooks hooks;
  private final String consumerGroup;
  private final String insertInbox;
  private final String selectVersion;
  private final String upsertVersion;

  /**
   * @param settings the settings
   * @param dataSource connections to the consumer's database (the one holding the inbox tables and
   *     the business tables); a pool, as one connection is taken per attempt
   * @param deadLetters producer for the dead-letter topic: configure it with {@code acks=all} (see
   *     {@link InboxRunner#deadLetterProducerConfig}); it is not closed by the inbox
   * @param hooks the hooks, or {@link Hooks#NONE}
   */
  public Inbox(
      InboxSettings settings,
      DataSource dataSource,
      Producer<byte[], byte[]> deadLetters,
      Hooks hooks) {
    this(settings, dataSource, deadLetters, hooks, settings.consumer());
  }

  /** As the public constructor; {@code consumerGroup} names the spans' consumer group. */
  Inbox(
      InboxSettings settings,
      DataSource dataSource,
      Producer<byte[], byte[]> deadLetters,
      Hooks hooks,
      String consumerGroup) {
    this.settings = settings;
    this.dataSource = dataSource;
    this.deadLetters = deadLetters;
    this.hooks = hooks == null ? Hooks.NONE : hooks;
    this.consumerGroup = consumerGroup == null ? settings.consumer() : consumerGroup;
    this.insertInbox =
        "INSERT INTO "
            + settings.inboxTable()
            + " (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES (?, ?, ?, ?, ?)";
    this.selectVersion =
        "SELECT version FROM "
            + settings.versionTable()
            + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? FOR UPDATE";
    this.upsertVersion =
        "INSERT INTO "
            + settings.versionTable()
            + " (consumer, aggregate_type, aggregate_id, version) VALUES (?, ?, ?, ?)"
            + " ON DUPLICATE KEY UPDATE version = VALUES(version)";
  }

  /**
   * @return the settings
   */
  public InboxSettings settings() {
    return settings;
  }

  /**
   * Settles one record: runs {@code handler} in the inbox transaction unless the record is a
   * duplicate or stale, retrying failed attempts with exponential backoff (blocking the caller),
   * and dead-letters it when it cannot be processed. Then calls {@link Hooks#afterCommit}. On
   * return, the record's offset + 1 may be committed to Kafka.
   *
   * @param record the record (key = aggregate id, headers {@code event_key}, {@code
   *     aggregate_type}, optionally the version header)
   * @param handler the business change
   *     <p>Handler errors and data errors (a version gap under {@link GapPolicy#RETRY}) count
   *     toward {@code maxAttempts}; infrastructure errors ({@link #isInfrastructureError}) are
   *     retried with the same backoff without counting, for at most {@link
   *     InboxSettings#outageBudget()}.
   * @return the outcome and the number of attempts made (those ended by an infrastructure error not
   *     counted)
   * @throws InboxOutageException the database stayed unreachable longer than the outage budget: the
   *     record is not settled (stop without committing its offset)
   * @throws InboxException a dead letter could not be produced, or the thread was interrupted
   *     during a backoff: the record is not settled
   */
  public Result process(ConsumerRecord<byte[], byte[]> record, Handler handler) {
    Span span = InboxTracing.start(settings, consumerGroup, record);
    Scope scope = span.makeCurrent();
    Result result = null;
    try {
      result = settle(record, handler);
      InboxTracing.settled(span, result);
      hooks.afterCommit(record, result);
      return result;
    } catch (RuntimeException | Error e) {
      InboxTracing.failed(span, e, result != null);
      throw e;
    } finally {
      scope.close();
      span.end();
    }
  }

  private Result settle(ConsumerRecord<byte[], byte[]> record, Handler handler) {
    String eventKey = InboxSettings.header(record, settings.eventKeyHeader());
    if (eventKey == null || eventKey.isEmpty()) {
      return deadLetter(record, "missing " + settings.eventKeyHeader() + " header", 0);
    }
    Long version;
    try {
      version = settings.versionOf(record);
    } catch (IllegalArgumentException e) {
      return deadLetter(record, e.getMessage(), 0);
    }
    int attempt = 0; // attempts that count: not those ended by an infrastructure error
    long outageSince = 0; // System.nanoTime() of the first infrastructure error in a row
    int outageRetries = 0;
    while (true) {
      try {
        Outcome outcome = attempt(record, eventKey, version, handler);
        return new Result(outcome, attempt + 1);
      } catch (VersionGap gap) {
        attempt++;
        if (settings.gapPolicy() == GapPolicy.PARK) {
          Result parked = deadLetter(record, gap.getMessage(), attempt);
          return new Result(Outcome.PARKED, parked.attempts());
        }
        InboxTracing.attemptFailed(gap, attempt);
        if (attempt >= settings.maxAttempts()) {
          return deadLetter(record, gap.getMessage(), attempt);
        }
      } catch (Exception e) {
        String error = e.getMessage() == null ? e.getClass().getName() : e.getMessage();
        if (isInfrastructureError(e)) {
          // Not an attempt: the record is redone once the database answers.
          InboxTracing.outageFailed(e, attempt + 1);
          long now = System.nanoTime();
          if (outageRetries == 0) {
            outageSince = now;
          }
          Duration down = Duration.ofNanos(now - outageSince);
          if (down.compareTo(settings.outageBudget()) >= 0) {
            LOG.error(
                "{} {}-{}@{}: database outage longer than the outage budget ({}): {}; stopping",
                eventKey,
                record.topic(),
                record.partition(),
                record.offset(),
                settings.outageBudget(),
                error);
            throw new InboxOutageException(
                record.topic(), record.partition(), record.offset(), settings.outageBudget(), e);
          }
          outageRetries++;
          Duration wait = settings.backoff(outageRetries);
          Duration left = settings.outageBudget().minus(down);
          LOG.warn(
              "{} {}-{}@{}: infrastructure error (not an attempt; down {}): {}",
              eventKey,
              record.topic(),
              record.partition(),
              record.offset(),
              down,
              error);
          sleep(wait.compareTo(left) < 0 ? wait : left);
          continue;
        }
        outageRetries = 0;
        attempt++;
        InboxTracing.attemptFailed(e, attempt);
        LOG.warn(
            "{} {}-{}@{}: attempt {} of {} failed: {}",
            eventKey,
            record.topic(),
            record.partition(),
            record.offset(),
            attempt,
            settings.maxAttempts(),
            error);
        if (attempt >= settings.maxAttempts()) {
          return deadLetter(record, error, attempt);
        }
      }
      sleep(settings.backoff(attempt));
    }
  }

  /**
   * Whether {@code error}, or a cause in its chain (a handler's exception included), means the
   * database could not do the work rather than that the record is wrong (inbox/CONTRACT.md,
   * "Attempts and outages"): a {@link SQLException} with error code 1205, 1213, 1290, 1836, 1053,
   * 1077, 1927, 4031, 2002, 2003, 2006, 2013 or 2055, with an SQLState of class {@code 08}
   * (connection exception) or {@code 40001} (serialization failure: deadlock), or of the driver's
   * connection and rollback exception types ({@link SQLTransientConnectionException}, {@link
   * SQLNonTransientConnectionException}, {@link SQLTransactionRollbackException}; a failure of the
   * data source to give a connection at all is reported as the first); or a socket error. The first
   * {@link SQLException} of the chain decides. The inbox retries those without counting them as
   * attempts, for at most {@link InboxSettings#outageBudget()}.
   *
   * @param error an error of an attempt
   * @return whether it is an infrastructure error
   */
  public static boolean isInfrastructureError(Throwable error) {
    java.util.Set<Throwable> seen =
        java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
    for (Throwable t = error; t != null && seen.add(t); t = t.getCause()) {
      if (t instanceof SQLException sql) {
        String state = sql.getSQLState() == null ? "" : sql.getSQLState();
        return INFRASTRUCTURE_CODES.contains(sql.getErrorCode())
            || state.startsWith("08")
            || state.equals("40001")
            || sql instanceof SQLTransientConnectionException
            || sql instanceof SQLNonTransientConnectionException
            || sql instanceof SQLTransactionRollbackException;
      }
      if (t instanceof java.net.SocketException || t instanceof java.io.EOFException) {
        return true;
      }
    }
    return false;
  }

  /** One attempt in one transaction: PROCESSED, DUPLICATE or STALE, or an exception. */
  private Outcome attempt(
      ConsumerRecord<byte[], byte[]> record, String eventKey, Long version, Handler handler)
      throws Exception {
    Connection connection;
    try {
      connection = dataSource.getConnection();
    } catch (SQLException e) {
      // No connection at all (refused, pool timeout, ...): the infrastructure's, whatever the code.
      throw new SQLTransientConnectionException(
          "cannot get a database connection: " + e.getMessage(), "08001", e);
    }
    try (Connection tx = connection) {
      tx.setAutoCommit(false);
      try {
        Outcome outcome = inTransaction(tx, record, eventKey, version, handler);
        if (outcome == Outcome.DUPLICATE) {
          tx.rollback();
        } else {
          tx.commit();
        }
        return outcome;
      } catch (Throwable e) {
        try {
          tx.rollback();
        } catch (SQLException rollbackError) {
          e.addSuppressed(rollbackError);
        }
        throw e;
      } finally {
        restoreAutoCommit(tx);
      }
    }
  }

  private Outcome inTransaction(
      Connection tx,
      ConsumerRecord<byte[], byte[]> record,
      String eventKey,
      Long version,
      Handler handler)
      throws Exception {
    try (PreparedStatement insert = tx.prepareStatement(insertInbox)) {
      insert.setString(1, settings.consumer());
      insert.setString(2, eventKey);
      insert.setString(3, record.topic());
      insert.setInt(4, record.partition());
      insert.setLong(5, record.offset());
      insert.executeUpdate();
    } catch (SQLException e) {
      if (e.getErrorCode() == ER_DUP_ENTRY) {
        return Outcome.DUPLICATE;
      }
      throw e;
    }
    if (version != null) {
      String aggregateType =
          Objects.requireNonNullElse(InboxSettings.header(record, AGGREGATE_TYPE_HEADER), "");
      String aggregateId =
          record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
      Long stored = null;
      try (PreparedStatement select = tx.prepareStatement(selectVersion)) {
        select.setString(1, settings.consumer());
        select.setString(2, aggregateType);
        select.setString(3, aggregateId);
        try (ResultSet rs = select.executeQuery()) {
          if (rs.next()) {
            stored = rs.getLong(1);
          }
        }
      }
      if (stored != null && version <= stored) {
        return Outcome.STALE;
      }
      if (stored != null && version > stored + 1) {
        throw new VersionGap(stored + 1, version);
      }
      try (PreparedStatement upsert = tx.prepareStatement(upsertVersion)) {
        upsert.setString(1, settings.consumer());
        upsert.setString(2, aggregateType);
        upsert.setString(3, aggregateId);
        upsert.setLong(4, version);
        upsert.executeUpdate();
      }
    }
    handler.handle(tx, record);
    hooks.beforeCommit(record);
    return Outcome.PROCESSED;
  }

  /**
   * Produces the record to the dead-letter topic (key, value and headers unchanged plus the {@code
   * dlq_*} headers) and waits for its acknowledgement.
   */
  private Result deadLetter(ConsumerRecord<byte[], byte[]> record, String reason, int attempts) {
    RecordHeaders headers = new RecordHeaders();
    for (Header h : record.headers()) {
      headers.add(h);
    }
    headers.add("dlq_reason", utf8(reason));
    headers.add("dlq_topic", utf8(record.topic()));
    headers.add("dlq_partition", utf8(Integer.toString(record.partition())));
    headers.add("dlq_offset", utf8(Long.toString(record.offset())));
    headers.add("dlq_consumer", utf8(settings.consumer()));
    headers.add("dlq_attempts", utf8(Integer.toString(attempts)));
    ProducerRecord<byte[], byte[]> letter =
        new ProducerRecord<>(
            settings.deadLetterTopic(), null, record.key(), record.value(), headers);
    LOG.warn(
        "dead-lettering {}-{}@{} to {}: {}",
        record.topic(),
        record.partition(),
        record.offset(),
        settings.deadLetterTopic(),
        reason);
    try {
      deadLetters.send(letter).get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InboxException("interrupted while producing a dead letter", e);
    } catch (ExecutionException | RuntimeException e) {
      Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
      throw new InboxException(
          "cannot produce the dead letter of "
              + record.topic()
              + "-"
              + record.partition()
              + "@"
              + record.offset()
              + " to "
              + settings.deadLetterTopic()
              + ": "
              + cause,
          cause);
    }
    InboxTracing.deadLettered(reason);
    return new Result(Outcome.DEAD_LETTERED, attempts);
  }

  private static byte[] utf8(String s) {
    return (s == null ? "" : s).getBytes(StandardCharsets.UTF_8);
  }

  private static void sleep(Duration wait) {
    try {
      TimeUnit.MILLISECONDS.sleep(wait.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InboxException("interrupted during a retry backoff", e);
    }
  }

  private static void restoreAutoCommit(Connection tx) {
    try {
      tx.setAutoCommit(true);
    } catch (SQLException e) {
      LOG.debug("cannot restore auto-commit on a connection: {}", e.toString());
    }
  }

  /** A version more than one ahead of the stored one. */
  private static final class VersionGap extends Exception {
    private static final long serialVersionUID = 1L;

    VersionGap(long expected, long got) {
      super("version gap: expected " + expected + ", got " + got, null, false, false);
    }
  }
}
