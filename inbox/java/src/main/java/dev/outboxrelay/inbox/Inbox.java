package dev.outboxrelay.inbox;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.context.Scope;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLNonTransientConnectionException;
import java.sql.SQLTransactionRollbackException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;
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
  private final String selectStored;
  private final String insertParked;
  private final String selectParkedOne;
  private final String selectParkedDue;
  private final String deleteParked;
  private final String parkedStats;
  private final InboxMetrics metrics;

  /**
   * @param settings the settings
   * @param dataSource connections to the consumer's database (the one holding the inbox tables and
   *     the business tables); a pool, as one connection is taken per attempt
   * @param deadLetters producer for the dead-letter topic and the retry tier topics (retry copies):
   *     configure it with {@code acks=all} (see {@link InboxRunner#deadLetterProducerConfig}); it
   *     is not closed by the inbox
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
    this.metrics = InboxMetrics.of(settings);
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
    this.selectStored =
        "SELECT version FROM "
            + settings.versionTable()
            + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?";
    String parked = settings.parkedTable();
    String columns =
        "aggregate_type, aggregate_id, version, topic, kafka_partition, kafka_offset, record_key,"
            + " record_value, record_headers, UNIX_TIMESTAMP(parked_at), expires_at < NOW(6)";
    this.insertParked =
        "INSERT IGNORE INTO "
            + parked
            + " (consumer, aggregate_type, aggregate_id, version, event_key, topic,"
            + " kafka_partition, kafka_offset, record_key, record_value, record_headers, reason,"
            + " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            + " DATE_ADD(NOW(6), INTERVAL ? MICROSECOND))";
    this.selectParkedOne =
        "SELECT "
            + columns
            + " FROM "
            + parked
            + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND version = ?";
    this.selectParkedDue =
        "SELECT "
            + columns
            + " FROM "
            + parked
            + " WHERE consumer = ? ORDER BY expires_at LIMIT 100";
    this.deleteParked =
        "DELETE FROM "
            + parked
            + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND version = ?";
    this.parkedStats =
        "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), NOW(6)) FROM "
            + parked
            + " WHERE consumer = ?";
  }

  /**
   * @return the settings
   */
  public InboxSettings settings() {
    return settings;
  }

  /**
   * Settles one record: runs {@code handler} in the inbox transaction unless the record is a
   * duplicate or stale, retrying failed attempts with exponential backoff (blocking the caller);
   * when they are used up, sends a copy to the next retry tier of its original topic ({@link
   * InboxSettings#retryTiers(String)}, outcome {@link Outcome#RETRIED}) or, with no tier left,
   * dead-letters it. Then calls {@link Hooks#afterCommit}. On return, the record's offset + 1 may
   * be committed to Kafka. A retry copy (header {@code retry_count}) is processed the same way; its
   * inbox row names the original record. Holding a copy until its {@code retry_at} is the poll
   * loop's job ({@link InboxRunner} pauses its partition).
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
    return process(record, handler, null, null);
  }

  /**
   * {@link #process} in {@code span} when set (a record split off a batch), else its own; {@code
   * failure}: the error of the batch run that failed at this record, its attempt 1 (null: none).
   */
  private Result process(
      ConsumerRecord<byte[], byte[]> record, Handler handler, Span span, Exception failure) {
    Result result = processOne(record, handler, null, span, failure);
    if (result.outcome() == Outcome.PROCESSED) {
      VersionKey key = versionKey(record);
      if (key != null) {
        resumeAfter(key, handler);
      }
    }
    return result;
  }

  /** Settles one record (a parked one when {@code parked} is set) in its span, then afterCommit. */
  private Result processOne(
      ConsumerRecord<byte[], byte[]> record, Handler handler, VersionKey parked) {
    return processOne(record, handler, parked, null, null);
  }

  /**
   * As above, in {@code existing} (started for the record by a batch) when set, after {@code
   * failure} (a failed batch run's error: attempt 1) when set.
   */
  private Result processOne(
      ConsumerRecord<byte[], byte[]> record,
      Handler handler,
      VersionKey parked,
      Span existing,
      Exception failure) {
    Span span = existing != null ? existing : InboxTracing.start(settings, consumerGroup, record);
    Scope scope = span.makeCurrent();
    Result result = null;
    try {
      result = settle(record, handler, parked, failure);
      InboxTracing.settled(span, result);
      counted(record, result);
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

  private Result settle(
      ConsumerRecord<byte[], byte[]> record,
      Handler handler,
      VersionKey parked,
      Exception failure) {
    String eventKey = InboxSettings.header(record, settings.eventKeyHeader());
    if (eventKey == null || eventKey.isEmpty()) {
      return deadLetterParked(
          record, "missing " + settings.eventKeyHeader() + " header", 0, parked);
    }
    Long version;
    try {
      version = settings.versionOf(record);
    } catch (IllegalArgumentException e) {
      return deadLetterParked(record, e.getMessage(), 0, parked);
    }
    // The settings of the record's topic (its original topic's for a retry copy).
    EffectiveSettings ts = settings.forTopic(InboxSettings.topicOf(record));
    int attempt = 0; // attempts that count: not those ended by an infrastructure error
    long outageSince = 0; // System.nanoTime() of the first infrastructure error in a row
    int outageRetries = 0;
    Exception batchFailure = failure;
    while (true) {
      try {
        Outcome outcome;
        try {
          if (batchFailure != null) { // attempt 1 was a batch run's
            Exception e = batchFailure;
            batchFailure = null;
            throw e;
          }
          outcome = attempt(record, eventKey, version, handler, parked);
        } catch (VersionGap gap) {
          if (ts.gapPolicy() == GapPolicy.DEAD_LETTER) {
            return deadLetter(record, gap.getMessage(), attempt + 1);
          }
          if (ts.gapPolicy() == GapPolicy.RETRY) {
            throw gap;
          }
          if (park(record, eventKey, gap, ts.gapDeadline())) {
            return new Result(Outcome.PARKED, attempt + 1);
          }
          continue; // the gap closed meanwhile: redo the attempt
        }
        if (outcome == Outcome.DUPLICATE && parked != null) {
          // Applied before (a redelivery of it was processed): not parked any more.
          unpark(parked);
        }
        if (outcome == Outcome.PROCESSED && parked != null) {
          outcome = Outcome.RESUMED;
        }
        return new Result(outcome, attempt + 1);
      } catch (StillAhead ahead) {
        return new Result(Outcome.PARKED, attempt + 1);
      } catch (VersionGap gap) {
        attempt++;
        InboxTracing.attemptFailed(gap, attempt);
        if (attempt >= ts.maxAttempts()) {
          return exhausted(record, gap.getMessage(), attempt, parked);
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
          Duration wait = ts.backoff(outageRetries);
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
            ts.maxAttempts(),
            error);
        if (attempt >= ts.maxAttempts()) {
          return exhausted(record, error, attempt, parked);
        }
      }
      sleep(ts.backoff(attempt));
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
      ConsumerRecord<byte[], byte[]> record,
      String eventKey,
      Long version,
      Handler handler,
      VersionKey parked)
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
        Outcome outcome = inTransaction(tx, record, eventKey, version, handler, parked);
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
      Handler handler,
      VersionKey parked)
      throws Exception {
    try (PreparedStatement insert = tx.prepareStatement(insertInbox)) {
      insert.setString(1, settings.consumer());
      insert.setString(2, eventKey);
      // A retry copy's row names the first record (inbox/CONTRACT.md, "Retry tiers").
      insert.setString(3, RetryHeaders.originalTopic(record));
      insert.setInt(4, RetryHeaders.originalPartition(record));
      insert.setLong(5, RetryHeaders.originalOffset(record));
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
        if (parked != null) {
          unpark(tx, parked);
        }
        return Outcome.STALE;
      }
      if (stored != null && version > stored + 1) {
        if (parked != null) {
          throw new StillAhead();
        }
        throw new VersionGap(stored + 1, new VersionKey(aggregateType, aggregateId, version));
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
    if (parked != null) {
      unpark(tx, parked);
    }
    hooks.beforeCommit(record);
    return Outcome.PROCESSED;
  }

  /**
   * Test seam (tests only): runs inside a batch's transaction after the duplicate-finding {@code
   * SELECT … FOR UPDATE} (MySQL) and before the multi-row inbox {@code INSERT} (both flavors).
   */
  static volatile Runnable testHookAfterBatchSelect;

  /** The longest event key the inbox column takes (VARBINARY(1020)). */
  private static final int MAX_EVENT_KEY_BYTES = 1020;

  /** Redos in a row of a batch whose MySQL INSERT met a concurrent insert (1062). */
  private static final int MAX_BATCH_RACE_REDOS = 5;

  /** The server's flavor: {@code true} MariaDB, {@code false} MySQL, {@code null} not known yet. */
  private volatile Boolean mariaDb;

  /**
   * Settles several records in one database transaction (inbox/CONTRACT.md, "Batch mode"): records
   * without an event key, with an invalid version header or with an event key longer than 1,020
   * bytes go through {@link #process} first; a record whose event key (compared byte for byte) came
   * earlier in the batch is a {@link Outcome#DUPLICATE}; the others get their inbox rows in one
   * statement (MariaDB: {@code INSERT IGNORE … RETURNING event_key}; MySQL: {@code SELECT … FOR
   * UPDATE} of the keys, then a multi-row {@code INSERT}), their versions checked with one {@code
   * SELECT … FOR UPDATE} and written with one multi-row upsert, and their handlers run in batch
   * order in that transaction, then {@link Hooks#beforeCommit} per record, the commit, and {@link
   * Hooks#afterCommit} per record. Each record's rows, hooks, metrics, span and log lines are those
   * {@link #process} gives it. After the commit, the parked successors of the aggregates whose
   * version moved are resumed.
   *
   * <p>A handler (or {@code beforeCommit}) error that is not an infrastructure error at record
   * {@code i}, or a version gap under {@link GapPolicy#DEAD_LETTER} or {@link GapPolicy#RETRY}: the
   * transaction is rolled back, records {@code 0 .. i-1} are settled again as a batch, record
   * {@code i} alone by {@link #process} (its attempts from 1, retry tiers, dead letter), and the
   * records after it as a new batch. An infrastructure error ({@link #isInfrastructureError}) in a
   * statement, a handler or the commit: rolled back and redone after the backoff, for at most
   * {@link InboxSettings#outageBudget()} counted from the first one. A batch statement failing with
   * any other error: each record of the batch is settled by {@link #process}.
   *
   * <p>The records must be given in offset order per partition; records of several partitions may
   * be mixed. More than {@value InboxSettings#BATCH_MAX_RECORDS_LIMIT} are settled as consecutive
   * batches of at most that many. Not for retry copies waiting for their {@code retry_at} (the poll
   * loop's job, as with {@link #process}).
   *
   * @param records the records, in order (an empty list gives an empty result)
   * @param handler the business change, run once per record to apply, in the batch's transaction
   * @return one result per record, in the order of {@code records}
   * @throws InboxOutageException the database stayed unreachable longer than the outage budget (the
   *     exception names the first record of the batch): no record of the batch from the one in hand
   *     on is settled, commit none of their offsets
   * @throws InboxException as {@link #process}
   */
  public List<Result> processBatch(List<ConsumerRecord<byte[], byte[]>> records, Handler handler) {
    Objects.requireNonNull(records, "records");
    Objects.requireNonNull(handler, "handler");
    Result[] results = new Result[records.size()];
    List<BatchItem> items = new ArrayList<>(records.size());
    for (int i = 0; i < records.size(); i++) {
      ConsumerRecord<byte[], byte[]> record = records.get(i);
      String eventKey = InboxSettings.header(record, settings.eventKeyHeader());
      Long version = null;
      boolean single = eventKey == null || eventKey.isEmpty();
      byte[] keyBytes = null;
      if (!single) {
        try {
          version = settings.versionOf(record);
        } catch (IllegalArgumentException e) {
          single = true;
        }
        keyBytes = eventKey.getBytes(StandardCharsets.UTF_8);
        single = single || keyBytes.length > MAX_EVENT_KEY_BYTES;
      }
      if (single) {
        // Settled first, exactly as one at a time: a dead letter (or the insert's own error).
        results[i] = process(record, handler);
        continue;
      }
      items.add(new BatchItem(i, record, eventKey, bytesKey(keyBytes), version));
    }
    // At most BATCH_MAX_RECORDS_LIMIT rows a statement (placeholders stay under 65,535).
    for (int from = 0; from < items.size(); from += InboxSettings.BATCH_MAX_RECORDS_LIMIT) {
      int to = Math.min(items.size(), from + InboxSettings.BATCH_MAX_RECORDS_LIMIT);
      runBatch(items.subList(from, to), handler, results);
    }
    return java.util.Collections.unmodifiableList(java.util.Arrays.asList(results));
  }

  /** One record of a batch: its place, key, version and span; its outcome in the attempt. */
  private static final class BatchItem {
    final int index;
    final ConsumerRecord<byte[], byte[]> record;
    final String eventKey;
    final String key; // the event key's UTF-8 bytes, one char per byte: compared byte for byte
    final Long version;
    final String aggregateType;
    final String aggregateId;
    Span span;
    Outcome outcome;
    String parkReason;
    Exception failure; // its handler's (or beforeCommit's) error in the batch run that failed

    BatchItem(
        int index,
        ConsumerRecord<byte[], byte[]> record,
        String eventKey,
        String key,
        Long version) {
      this.index = index;
      this.record = record;
      this.eventKey = eventKey;
      this.key = key;
      this.version = version;
      this.aggregateType =
          Objects.requireNonNullElse(InboxSettings.header(record, AGGREGATE_TYPE_HEADER), "");
      this.aggregateId =
          record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
    }

    /** The aggregate, byte for byte. */
    String aggregate() {
      return bytesKey(aggregateType.getBytes(StandardCharsets.UTF_8))
          + '\u0100'
          + bytesKey(aggregateId.getBytes(StandardCharsets.UTF_8));
    }
  }

  /** Bytes as a string of one char (0-255) per byte: equal exactly when the bytes are. */
  private static String bytesKey(byte[] bytes) {
    return new String(bytes, StandardCharsets.ISO_8859_1);
  }

  /** The MySQL INSERT of a batch met a row inserted meanwhile (1062): redo the batch. */
  private static final class BatchRace extends Exception {
    private static final long serialVersionUID = 1L;

    BatchRace(SQLException cause) {
      super("a concurrent insert of a key of the batch: " + cause.getMessage(), cause);
    }
  }

  /** Settles {@code items} as one batch (split on a record's failure), filling {@code results}. */
  private void runBatch(List<BatchItem> items, Handler handler, Result[] results) {
    if (items.isEmpty()) {
      return;
    }
    for (BatchItem item : items) {
      if (item.span == null) {
        item.span = InboxTracing.start(settings, consumerGroup, item.record);
      }
    }
    BatchItem first = items.get(0);
    EffectiveSettings ts = settings.forTopic(InboxSettings.topicOf(first.record));
    long outageSince = 0;
    int outageRetries = 0;
    int raceRedos = 0;
    while (true) {
      int failed;
      try {
        try {
          failed = attemptBatch(items, handler);
        } catch (BatchRace race) {
          raceRedos++;
          if (raceRedos <= MAX_BATCH_RACE_REDOS) {
            LOG.info(
                "{} {}-{}@{}: batch of {} redone: {}",
                first.eventKey,
                first.record.topic(),
                first.record.partition(),
                first.record.offset(),
                items.size(),
                race.getMessage());
            continue;
          }
          // Racing again and again: as an infrastructure error (backoff, outage budget).
          throw new SQLTransactionRollbackException(
              race.getMessage(), "40001", ER_DUP_ENTRY, race.getCause());
        }
      } catch (Exception e) {
        String error = e.getMessage() == null ? e.getClass().getName() : e.getMessage();
        if (e instanceof InboxException inbox) {
          failBatch(items, inbox);
          throw inbox;
        }
        if (!isInfrastructureError(e)) {
          // A batch statement failed for another reason: each record by itself decides.
          LOG.warn(
              "{} {}-{}@{}: batch of {} failed ({}): settling its records one at a time",
              first.eventKey,
              first.record.topic(),
              first.record.partition(),
              first.record.offset(),
              items.size(),
              error);
          try {
            for (BatchItem item : items) {
              Span span = item.span;
              item.span = null; // ended by process
              results[item.index] = process(item.record, handler, span, null);
            }
          } catch (RuntimeException | Error unsettled) {
            failBatch(items, unsettled);
            throw unsettled;
          }
          return;
        }
        for (BatchItem item : items) {
          item.span.recordException(
              e,
              io.opentelemetry.api.common.Attributes.of(
                  InboxTracing.INBOX_ATTEMPT, 1L, InboxTracing.INBOX_OUTAGE, true));
        }
        long now = System.nanoTime();
        if (outageRetries == 0) {
          outageSince = now;
        }
        Duration down = Duration.ofNanos(now - outageSince);
        if (down.compareTo(settings.outageBudget()) >= 0) {
          LOG.error(
              "{} {}-{}@{}: database outage longer than the outage budget ({}): {}; stopping",
              first.eventKey,
              first.record.topic(),
              first.record.partition(),
              first.record.offset(),
              settings.outageBudget(),
              error);
          InboxOutageException outage =
              new InboxOutageException(
                  first.record.topic(),
                  first.record.partition(),
                  first.record.offset(),
                  settings.outageBudget(),
                  e);
          failBatch(items, outage);
          throw outage;
        }
        outageRetries++;
        Duration wait = ts.backoff(outageRetries);
        Duration left = settings.outageBudget().minus(down);
        LOG.warn(
            "{} {}-{}@{}: infrastructure error in a batch of {} (not an attempt; down {}): {}",
            first.eventKey,
            first.record.topic(),
            first.record.partition(),
            first.record.offset(),
            items.size(),
            down,
            error);
        try {
          sleep(wait.compareTo(left) < 0 ? wait : left);
        } catch (InboxException interrupted) {
          failBatch(items, interrupted);
          throw interrupted;
        }
        continue;
      }
      if (failed >= 0) {
        // Record `failed` failed: the ones before as a batch, it alone, the ones after as a batch.
        try {
          runBatch(items.subList(0, failed), handler, results);
          BatchItem item = items.get(failed);
          Span span = item.span;
          item.span = null; // ended by process
          // The failed batch run is its attempt 1 (a version gap is not: failure null).
          results[item.index] = process(item.record, handler, span, item.failure);
          runBatch(items.subList(failed + 1, items.size()), handler, results);
        } catch (RuntimeException | Error unsettled) {
          failBatch(items, unsettled); // the spans of the records not reached
          throw unsettled;
        }
        return;
      }
      settled(items, results);
      break;
    }
    // The aggregates whose version moved: their parked successors, in version order.
    java.util.Map<String, VersionKey> moved = new java.util.LinkedHashMap<>();
    for (BatchItem item : items) {
      if (item.outcome == Outcome.PROCESSED && item.version != null) {
        moved.put(
            item.aggregate(), new VersionKey(item.aggregateType, item.aggregateId, item.version));
      }
    }
    for (VersionKey key : moved.values()) {
      resumeAfter(key, handler);
    }
  }

  /** After the batch's commit: each record's span, metric, log line and afterCommit. */
  private void settled(List<BatchItem> items, Result[] results) {
    RuntimeException failure = null;
    for (BatchItem item : items) {
      Span span = item.span;
      item.span = null;
      if (failure != null) {
        InboxTracing.failed(span, failure, false);
        span.end();
        continue;
      }
      Result result = new Result(item.outcome, 1);
      if (item.outcome == Outcome.PARKED) {
        LOG.info(
            "{} {}-{}@{}: parked ({})",
            item.eventKey,
            item.record.topic(),
            item.record.partition(),
            item.record.offset(),
            item.parkReason);
      }
      Scope scope = span.makeCurrent();
      try {
        InboxTracing.settled(span, result);
        counted(item.record, result);
        hooks.afterCommit(item.record, result);
        results[item.index] = result;
      } catch (RuntimeException e) {
        InboxTracing.failed(span, e, true);
        failure = e;
      } finally {
        scope.close();
        span.end();
      }
    }
    if (failure != null) {
      throw failure;
    }
  }

  /** The batch could not be settled: every record's span says so and ends. */
  private static void failBatch(List<BatchItem> items, Throwable error) {
    for (BatchItem item : items) {
      if (item.span != null) {
        InboxTracing.failed(item.span, error, false);
        item.span.end();
        item.span = null;
      }
    }
  }

  /**
   * One attempt of a batch in one transaction: committed ({@code -1}, each item's outcome set), or
   * rolled back because of the item at the returned index (its handler or beforeCommit failed, or a
   * version gap that is not parked), or an exception (rolled back).
   */
  private int attemptBatch(List<BatchItem> items, Handler handler) throws Exception {
    try (Connection tx = connection()) {
      tx.setAutoCommit(false);
      try {
        int failed = inBatch(tx, items, handler);
        if (failed >= 0) {
          tx.rollback();
        } else {
          tx.commit();
        }
        return failed;
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

  /** Whether the server is MariaDB (detected once: {@code SELECT VERSION()}). */
  private boolean isMariaDb(Connection c) throws SQLException {
    Boolean known = mariaDb;
    if (known == null) {
      try (PreparedStatement select = c.prepareStatement("SELECT VERSION()");
          ResultSet rs = select.executeQuery()) {
        rs.next();
        known = String.valueOf(rs.getString(1)).contains("MariaDB");
      }
      mariaDb = known;
    }
    return known;
  }

  private static String placeholders(int rows, String row) {
    StringBuilder sb = new StringBuilder(rows * (row.length() + 1));
    for (int i = 0; i < rows; i++) {
      if (i > 0) {
        sb.append(',');
      }
      sb.append(row);
    }
    return sb.toString();
  }

  private int inBatch(Connection tx, List<BatchItem> items, Handler handler) throws Exception {
    boolean maria = isMariaDb(tx);
    // In-batch duplicates: the second of one key (byte for byte) is a duplicate of the first.
    java.util.Set<String> seen = new java.util.HashSet<>();
    List<BatchItem> fresh = new ArrayList<>(items.size());
    for (BatchItem item : items) {
      item.parkReason = null;
      item.outcome = null;
      if (seen.add(item.key)) {
        fresh.add(item);
      } else {
        item.outcome = Outcome.DUPLICATE;
      }
    }
    String columns = " (consumer, event_key, topic, kafka_partition, kafka_offset) VALUES ";
    if (maria) {
      runTestHook();
      java.util.Set<String> inserted = new java.util.HashSet<>();
      String sql =
          "INSERT IGNORE INTO "
              + settings.inboxTable()
              + columns
              + placeholders(fresh.size(), "(?, ?, ?, ?, ?)")
              + " RETURNING event_key";
      try (PreparedStatement insert = tx.prepareStatement(sql)) {
        bindInboxRows(insert, fresh);
        try (ResultSet rs = insert.executeQuery()) {
          while (rs.next()) {
            inserted.add(bytesKey(rs.getBytes(1)));
          }
        }
      }
      for (BatchItem item : fresh) {
        if (!inserted.contains(item.key)) {
          item.outcome = Outcome.DUPLICATE;
        }
      }
    } else {
      java.util.Set<String> found = new java.util.HashSet<>();
      String sql =
          "SELECT event_key FROM "
              + settings.inboxTable()
              + " WHERE consumer = ? AND event_key IN ("
              + placeholders(fresh.size(), "?")
              + ") FOR UPDATE";
      try (PreparedStatement select = tx.prepareStatement(sql)) {
        select.setString(1, settings.consumer());
        for (int i = 0; i < fresh.size(); i++) {
          select.setString(i + 2, fresh.get(i).eventKey);
        }
        try (ResultSet rs = select.executeQuery()) {
          while (rs.next()) {
            found.add(bytesKey(rs.getBytes(1)));
          }
        }
      }
      List<BatchItem> insert = new ArrayList<>(fresh.size());
      for (BatchItem item : fresh) {
        if (found.contains(item.key)) {
          item.outcome = Outcome.DUPLICATE;
        } else {
          insert.add(item);
        }
      }
      runTestHook();
      if (!insert.isEmpty()) {
        String rows =
            "INSERT INTO "
                + settings.inboxTable()
                + columns
                + placeholders(insert.size(), "(?, ?, ?, ?, ?)");
        try (PreparedStatement statement = tx.prepareStatement(rows)) {
          bindInboxRows(statement, insert);
          statement.executeUpdate();
        } catch (SQLException e) {
          if (e.getErrorCode() == ER_DUP_ENTRY) {
            throw new BatchRace(e);
          }
          throw e;
        }
      }
    }
    int failed = checkVersions(tx, items);
    if (failed >= 0) {
      return failed;
    }
    for (int i = 0; i < items.size(); i++) {
      BatchItem item = items.get(i);
      if (item.outcome == null) {
        item.outcome = Outcome.PROCESSED;
      }
    }
    for (int i = 0; i < items.size(); i++) {
      BatchItem item = items.get(i);
      if (item.outcome != Outcome.PROCESSED) {
        continue;
      }
      Scope scope = item.span.makeCurrent();
      try {
        handler.handle(tx, item.record);
      } catch (Exception e) {
        if (isInfrastructureError(e)) {
          throw e;
        }
        batchRecordFailed(item, e);
        return i;
      } finally {
        scope.close();
      }
    }
    for (int i = 0; i < items.size(); i++) {
      BatchItem item = items.get(i);
      if (item.outcome != Outcome.PROCESSED) {
        continue;
      }
      Scope scope = item.span.makeCurrent();
      try {
        hooks.beforeCommit(item.record);
      } catch (Exception e) {
        if (isInfrastructureError(e)) {
          throw e;
        }
        batchRecordFailed(item, e);
        return i;
      } finally {
        scope.close();
      }
    }
    return -1;
  }

  private static void runTestHook() {
    Runnable hook = testHookAfterBatchSelect;
    if (hook != null) {
      hook.run();
    }
  }

  private static void batchRecordFailed(BatchItem item, Exception e) {
    item.failure = e; // its attempt 1 (CONTRACT "Batch mode" 5)
    LOG.info(
        "{} {}-{}@{}: failed in a batch (rolled back; it goes alone, the others as batches): {}",
        item.eventKey,
        item.record.topic(),
        item.record.partition(),
        item.record.offset(),
        e.getMessage() == null ? e.getClass().getName() : e.getMessage());
  }

  private void bindInboxRows(PreparedStatement statement, List<BatchItem> rows)
      throws SQLException {
    int p = 1;
    for (BatchItem item : rows) {
      statement.setString(p++, settings.consumer());
      statement.setString(p++, item.eventKey);
      // A retry copy's row names the first record (as the single path's).
      statement.setString(p++, RetryHeaders.originalTopic(item.record));
      statement.setInt(p++, RetryHeaders.originalPartition(item.record));
      statement.setLong(p++, RetryHeaders.originalOffset(item.record));
    }
  }

  /**
   * The version check of the batch's new records (outcome still unset): one {@code SELECT … FOR
   * UPDATE} of the stored versions, then in batch order in memory: in order (the expected version
   * advances), stale, or a gap: parked (row inserted, the record's inbox row removed again, as the
   * single path leaves none), or, under another gap policy, the failing index. Then the new
   * versions in one upsert.
   *
   * @return -1, or the index of a record whose gap goes through the single path
   */
  private int checkVersions(Connection tx, List<BatchItem> items) throws SQLException {
    java.util.Map<String, BatchItem> aggregates = new java.util.LinkedHashMap<>();
    for (BatchItem item : items) {
      if (item.outcome == null && item.version != null) {
        aggregates.putIfAbsent(item.aggregate(), item);
      }
    }
    if (aggregates.isEmpty()) {
      return -1;
    }
    java.util.Map<String, Long> stored = new java.util.HashMap<>();
    String sql =
        "SELECT aggregate_type, aggregate_id, version FROM "
            + settings.versionTable()
            + " WHERE consumer = ? AND (aggregate_type, aggregate_id) IN ("
            + placeholders(aggregates.size(), "(?, ?)")
            + ") FOR UPDATE";
    try (PreparedStatement select = tx.prepareStatement(sql)) {
      int p = 1;
      select.setString(p++, settings.consumer());
      for (BatchItem item : aggregates.values()) {
        select.setString(p++, item.aggregateType);
        select.setString(p++, item.aggregateId);
      }
      try (ResultSet rs = select.executeQuery()) {
        while (rs.next()) {
          stored.put(bytesKey(rs.getBytes(1)) + '\u0100' + bytesKey(rs.getBytes(2)), rs.getLong(3));
        }
      }
    }
    java.util.Map<String, BatchItem> upserts = new java.util.LinkedHashMap<>();
    List<BatchItem> parked = new ArrayList<>();
    for (int i = 0; i < items.size(); i++) {
      BatchItem item = items.get(i);
      if (item.outcome != null || item.version == null) {
        continue;
      }
      String aggregate = item.aggregate();
      Long current = stored.get(aggregate);
      long version = item.version;
      if (current != null && version <= current) {
        item.outcome = Outcome.STALE;
      } else if (current != null && version > current + 1) {
        String reason = "version gap: expected " + (current + 1) + ", got " + version;
        GapPolicy policy = settings.forTopic(InboxSettings.topicOf(item.record)).gapPolicy();
        if (policy != GapPolicy.PARK) {
          batchRecordFailed(item, new Exception(reason));
          return i; // the single path dead-letters or retries it
        }
        item.outcome = Outcome.PARKED;
        item.parkReason = reason;
        parked.add(item);
      } else {
        stored.put(aggregate, version);
        upserts.put(aggregate, item);
      }
    }
    if (!parked.isEmpty()) {
      for (BatchItem item : parked) {
        insertParked(tx, item);
      }
      // A parked record has no inbox row (its resumption writes it), as in the single path.
      String delete =
          "DELETE FROM "
              + settings.inboxTable()
              + " WHERE consumer = ? AND event_key IN ("
              + placeholders(parked.size(), "?")
              + ")";
      try (PreparedStatement statement = tx.prepareStatement(delete)) {
        statement.setString(1, settings.consumer());
        for (int i = 0; i < parked.size(); i++) {
          statement.setString(i + 2, parked.get(i).eventKey);
        }
        statement.executeUpdate();
      }
    }
    if (!upserts.isEmpty()) {
      String upsert =
          "INSERT INTO "
              + settings.versionTable()
              + " (consumer, aggregate_type, aggregate_id, version) VALUES "
              + placeholders(upserts.size(), "(?, ?, ?, ?)")
              + " ON DUPLICATE KEY UPDATE version = VALUES(version)";
      try (PreparedStatement statement = tx.prepareStatement(upsert)) {
        int p = 1;
        for (BatchItem item : upserts.values()) {
          statement.setString(p++, settings.consumer());
          statement.setString(p++, item.aggregateType);
          statement.setString(p++, item.aggregateId);
          statement.setLong(p++, stored.get(item.aggregate()));
        }
        statement.executeUpdate();
      }
    }
    return -1;
  }

  /** Inserts the parked row of a batch record (the single path's statement and values). */
  private void insertParked(Connection tx, BatchItem item) throws SQLException {
    ConsumerRecord<byte[], byte[]> record = item.record;
    EffectiveSettings ts = settings.forTopic(InboxSettings.topicOf(record));
    try (PreparedStatement insert = tx.prepareStatement(insertParked)) {
      insert.setString(1, settings.consumer());
      insert.setString(2, item.aggregateType);
      insert.setString(3, item.aggregateId);
      insert.setLong(4, item.version);
      insert.setString(5, item.eventKey);
      insert.setString(6, record.topic());
      insert.setInt(7, record.partition());
      insert.setLong(8, record.offset());
      insert.setBytes(9, record.key());
      insert.setBytes(10, record.value());
      insert.setString(11, ParkedHeaders.encode(record.headers()));
      String reason = item.parkReason;
      insert.setString(12, reason.length() > 512 ? reason.substring(0, 512) : reason);
      long micros;
      try {
        micros = TimeUnit.NANOSECONDS.toMicros(ts.gapDeadline().toNanos());
      } catch (ArithmeticException e) {
        micros = Long.MAX_VALUE / 2;
      }
      insert.setLong(13, micros);
      insert.executeUpdate();
    }
  }

  /** The record's aggregate and version, or {@code null} when it is not version-checked. */
  private VersionKey versionKey(ConsumerRecord<byte[], byte[]> record) {
    Long version;
    try {
      version = settings.versionOf(record);
    } catch (IllegalArgumentException e) {
      return null;
    }
    if (version == null) {
      return null;
    }
    return new VersionKey(
        Objects.requireNonNullElse(InboxSettings.header(record, AGGREGATE_TYPE_HEADER), ""),
        record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8),
        version);
  }

  /**
   * Parks a record after a gap (inbox/CONTRACT.md, "Parked versions"): under the version row's
   * lock, still a gap: stores it (ignored when it is parked already) and returns {@code true}; the
   * gap closed meanwhile: {@code false} (redo the attempt). It expires after {@code gapDeadline}
   * (its topic's).
   */
  private boolean park(
      ConsumerRecord<byte[], byte[]> record, String eventKey, VersionGap gap, Duration gapDeadline)
      throws SQLException {
    VersionKey key = gap.key;
    try (Connection tx = connection()) {
      tx.setAutoCommit(false);
      try {
        Long stored = null;
        try (PreparedStatement select = tx.prepareStatement(selectVersion)) {
          select.setString(1, settings.consumer());
          select.setString(2, key.aggregateType());
          select.setString(3, key.aggregateId());
          try (ResultSet rs = select.executeQuery()) {
            if (rs.next()) {
              stored = rs.getLong(1);
            }
          }
        }
        if (stored == null || key.version() <= stored + 1) {
          tx.rollback();
          return false;
        }
        String reason = "version gap: expected " + (stored + 1) + ", got " + key.version();
        try (PreparedStatement insert = tx.prepareStatement(insertParked)) {
          insert.setString(1, settings.consumer());
          insert.setString(2, key.aggregateType());
          insert.setString(3, key.aggregateId());
          insert.setLong(4, key.version());
          insert.setString(5, eventKey);
          insert.setString(6, record.topic());
          insert.setInt(7, record.partition());
          insert.setLong(8, record.offset());
          insert.setBytes(9, record.key());
          insert.setBytes(10, record.value());
          insert.setString(11, ParkedHeaders.encode(record.headers()));
          insert.setString(12, reason.length() > 512 ? reason.substring(0, 512) : reason);
          long micros;
          try {
            micros = TimeUnit.NANOSECONDS.toMicros(gapDeadline.toNanos());
          } catch (ArithmeticException e) {
            micros = Long.MAX_VALUE / 2;
          }
          insert.setLong(13, micros);
          insert.executeUpdate();
        }
        tx.commit();
        LOG.info(
            "{} {}-{}@{}: parked ({})",
            eventKey,
            record.topic(),
            record.partition(),
            record.offset(),
            reason);
        return true;
      } catch (SQLException | RuntimeException e) {
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

  /**
   * Applies the parked successors of {@code applied}, one at a time, in version order, until one is
   * missing or not resumed. A read error leaves them to the sweep.
   */
  private void resumeAfter(VersionKey applied, Handler handler) {
    long version = applied.version();
    while (true) {
      ParkedRow row;
      try {
        row =
            parkedRow(new VersionKey(applied.aggregateType(), applied.aggregateId(), version + 1));
      } catch (SQLException | IllegalArgumentException e) {
        LOG.warn("parked successors not read (the sweep resumes them): {}", e.toString());
        return;
      }
      if (row == null) {
        return;
      }
      if (processOne(row.record(), handler, row.key()).outcome() != Outcome.RESUMED) {
        return;
      }
      version++;
    }
  }

  /**
   * What one {@link #sweepParked} did.
   *
   * @param resumed parked records applied (their successors included)
   * @param stale parked records removed as stale or duplicate
   * @param deadLettered parked records dead-lettered (deadline passed, or failing when resumed)
   * @param compensated expired parked records handed to {@link Hooks#onGapExpired}
   * @param parked rows still parked after the sweep
   * @param oldest age of the oldest of them ({@link Duration#ZERO} when none)
   */
  public record ParkedSweep(
      int resumed, int stale, int deadLettered, int compensated, long parked, Duration oldest) {}

  /**
   * One sweep of the parked table (inbox/CONTRACT.md, "Parked versions", the sweep): of the
   * consumer's 100 rows that expire first, one whose predecessor has been applied is applied (with
   * its successors), one no newer than the applied version is removed, one past its deadline is
   * dead-lettered (or handed to {@link Hooks#onGapExpired}) and removed. {@link InboxRunner} calls
   * it at start-up and every {@link InboxSettings#parkSweepInterval()}; with your own poll loop,
   * call it likewise (between records, on the thread that processes them).
   *
   * @param handler the business change, for the records it resumes
   * @return what it did
   * @throws SQLException the tables could not be read (sweep again later)
   * @throws InboxException as {@link #process}
   */
  public ParkedSweep sweepParked(Handler handler) throws SQLException {
    int resumed = 0;
    int stale = 0;
    int dead = 0;
    int compensated = 0;
    List<ParkedRow> rows = new ArrayList<>();
    try (Connection c = connection();
        PreparedStatement select = c.prepareStatement(selectParkedDue)) {
      select.setString(1, settings.consumer());
      try (ResultSet rs = select.executeQuery()) {
        while (rs.next()) {
          try {
            rows.add(parkedRow(rs));
          } catch (IllegalArgumentException e) {
            LOG.error("a parked row cannot be read, left in place: {}", e.getMessage());
          }
        }
      }
    }
    for (ParkedRow row : rows) {
      VersionKey key = row.key();
      Long stored = storedVersion(key);
      if (stored == null || key.version() <= stored + 1) {
        // Its predecessor was applied (a crash came between), or it is stale: the attempt
        // decides under the version row's lock.
        Outcome outcome = processOne(row.record(), handler, key).outcome();
        switch (outcome) {
          case RESUMED -> {
            resumed++;
            resumeAfter(key, handler);
          }
          case STALE, DUPLICATE -> stale++;
          case DEAD_LETTERED -> dead++;
          default -> {}
        }
      } else if (row.expired()) {
        boolean compensate;
        try {
          compensate = hooks.onGapExpired(row.record(), row.parkedAt());
        } catch (Exception e) {
          LOG.warn(
              "onGapExpired failed for {}-{}@{} (called again at the next sweep): {}",
              row.record().topic(),
              row.record().partition(),
              row.record().offset(),
              e.toString());
          continue;
        }
        Result result;
        if (compensate) {
          result = new Result(Outcome.COMPENSATED, 0);
          compensated++;
        } else {
          String reason =
              "version gap: expected "
                  + (stored + 1)
                  + ", got "
                  + key.version()
                  + "; parked since "
                  + RFC_3339.format(row.parkedAt());
          result = deadLetter(row.record(), reason, 0);
          dead++;
        }
        unpark(key);
        counted(row.record(), result);
        hooks.afterCommit(row.record(), result);
      }
    }
    try (Connection c = connection();
        PreparedStatement select = c.prepareStatement(parkedStats)) {
      select.setString(1, settings.consumer());
      try (ResultSet rs = select.executeQuery()) {
        rs.next();
        long micros = rs.getLong(2);
        ParkedSweep sweep =
            new ParkedSweep(
                resumed, stale, dead, compensated, rs.getLong(1), Duration.ofNanos(micros * 1000));
        if (metrics != null) {
          metrics.swept(sweep.parked(), sweep.oldest());
        }
        return sweep;
      }
    }
  }

  /** Counts a settled record (outbox_inbox_records, with a meter registry). */
  private void counted(ConsumerRecord<byte[], byte[]> record, Result result) {
    if (metrics != null) {
      metrics.settled(record, result.outcome());
    }
  }

  /** The metrics, or {@code null} (no meter registry): the runner sets the lag with them. */
  InboxMetrics metrics() {
    return metrics;
  }

  private static final DateTimeFormatter RFC_3339 =
      DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS'Z'").withZone(ZoneOffset.UTC);

  private Long storedVersion(VersionKey key) throws SQLException {
    try (Connection c = connection();
        PreparedStatement select = c.prepareStatement(selectStored)) {
      select.setString(1, settings.consumer());
      select.setString(2, key.aggregateType());
      select.setString(3, key.aggregateId());
      try (ResultSet rs = select.executeQuery()) {
        return rs.next() ? rs.getLong(1) : null;
      }
    }
  }

  private ParkedRow parkedRow(VersionKey key) throws SQLException {
    try (Connection c = connection();
        PreparedStatement select = c.prepareStatement(selectParkedOne)) {
      select.setString(1, settings.consumer());
      select.setString(2, key.aggregateType());
      select.setString(3, key.aggregateId());
      select.setLong(4, key.version());
      try (ResultSet rs = select.executeQuery()) {
        return rs.next() ? parkedRow(rs) : null;
      }
    }
  }

  /** The row at the result set's cursor ({@code columns} of the constructor). */
  private static ParkedRow parkedRow(ResultSet rs) throws SQLException {
    VersionKey key =
        new VersionKey(
            new String(rs.getBytes(1), StandardCharsets.UTF_8),
            new String(rs.getBytes(2), StandardCharsets.UTF_8),
            rs.getLong(3));
    byte[] recordKey = rs.getBytes(7);
    byte[] value = rs.getBytes(8);
    ConsumerRecord<byte[], byte[]> record =
        new ConsumerRecord<>(
            rs.getString(4),
            rs.getInt(5),
            rs.getLong(6),
            ConsumerRecord.NO_TIMESTAMP,
            TimestampType.NO_TIMESTAMP_TYPE,
            recordKey == null ? -1 : recordKey.length,
            value == null ? -1 : value.length,
            recordKey,
            value,
            ParkedHeaders.decode(rs.getString(9)),
            Optional.empty());
    BigDecimal parkedAt = rs.getBigDecimal(10);
    Instant at =
        Instant.ofEpochSecond(
            parkedAt.longValue(), parkedAt.remainder(BigDecimal.ONE).movePointRight(9).longValue());
    return new ParkedRow(key, record, at, rs.getBoolean(11));
  }

  /** Deletes a parked row (own transaction). */
  private void unpark(VersionKey key) throws SQLException {
    try (Connection c = connection()) {
      c.setAutoCommit(true);
      unpark(c, key);
    }
  }

  private void unpark(Connection c, VersionKey key) throws SQLException {
    try (PreparedStatement delete = c.prepareStatement(deleteParked)) {
      delete.setString(1, settings.consumer());
      delete.setString(2, key.aggregateType());
      delete.setString(3, key.aggregateId());
      delete.setLong(4, key.version());
      delete.executeUpdate();
    }
  }

  /**
   * A record whose attempts are used up: a copy to the next retry tier of its original topic when
   * one is left (outcome {@link Outcome#RETRIED}), else a dead letter; a parked one leaves the
   * table once the copy or letter is out.
   */
  private Result exhausted(
      ConsumerRecord<byte[], byte[]> record, String error, int attempts, VersionKey parked) {
    int tier = RetryHeaders.retryCount(record);
    List<Duration> tiers = settings.retryTiers(RetryHeaders.originalTopic(record));
    if (tier < tiers.size()) {
      return unparked(retryCopy(record, tier + 1, tiers.get(tier), error, attempts), parked);
    }
    return deadLetterParked(record, error, attempts, parked);
  }

  /**
   * Produces a copy of {@code record} to tier {@code tier}'s topic (key, value and headers
   * unchanged plus the retry headers, inbox/CONTRACT.md "Retry tiers") and waits for its
   * acknowledgement.
   */
  private Result retryCopy(
      ConsumerRecord<byte[], byte[]> record, int tier, Duration delay, String error, int attempts) {
    long now = System.currentTimeMillis();
    java.util.Set<String> replaced =
        java.util.Set.of(
            RetryHeaders.RETRY_COUNT,
            RetryHeaders.RETRY_AT,
            RetryHeaders.RETRY_ERROR,
            RetryHeaders.RETRY_HISTORY);
    RecordHeaders headers = new RecordHeaders();
    for (Header h : record.headers()) {
      if (!replaced.contains(h.key())) {
        headers.add(h);
      }
    }
    headers.add(RetryHeaders.RETRY_COUNT, utf8(Integer.toString(tier)));
    headers.add(RetryHeaders.RETRY_AT, utf8(Long.toString(now + delay.toMillis())));
    if (record.headers().lastHeader(RetryHeaders.ORIGINAL_TOPIC) == null) {
      headers.add(RetryHeaders.ORIGINAL_TOPIC, utf8(record.topic()));
    }
    if (record.headers().lastHeader(RetryHeaders.ORIGINAL_PARTITION) == null) {
      headers.add(RetryHeaders.ORIGINAL_PARTITION, utf8(Integer.toString(record.partition())));
    }
    if (record.headers().lastHeader(RetryHeaders.ORIGINAL_OFFSET) == null) {
      headers.add(RetryHeaders.ORIGINAL_OFFSET, utf8(Long.toString(record.offset())));
    }
    headers.add(RetryHeaders.RETRY_ERROR, utf8(error));
    headers.add(
        RetryHeaders.RETRY_HISTORY,
        utf8(
            RetryHeaders.appendHistory(
                RetryHeaders.text(record, RetryHeaders.RETRY_HISTORY),
                record.topic(),
                record.partition(),
                record.offset(),
                attempts,
                error,
                now)));
    String topic = settings.retryTopic(RetryHeaders.originalTopic(record), tier);
    LOG.warn(
        "sending {}-{}@{} to retry tier {} ({}, in {}): {}",
        record.topic(),
        record.partition(),
        record.offset(),
        tier,
        topic,
        delay,
        error);
    send(
        new ProducerRecord<>(topic, null, record.key(), record.value(), headers),
        record,
        "retry copy");
    return new Result(Outcome.RETRIED, attempts);
  }

  /** Dead-letters {@code record}; a parked one leaves the table once the letter is out. */
  private Result deadLetterParked(
      ConsumerRecord<byte[], byte[]> record, String reason, int attempts, VersionKey parked) {
    return unparked(deadLetter(record, reason, attempts), parked);
  }

  /** Removes the parked row {@code parked} (when set) of a record settled elsewhere. */
  private Result unparked(Result result, VersionKey parked) {
    if (parked != null) {
      try {
        unpark(parked);
      } catch (SQLException e) { // the sweep finds it again: a second letter at worst
        LOG.warn("a dead-lettered parked row could not be removed: {}", e.toString());
      }
    }
    return result;
  }

  private Connection connection() throws SQLException {
    try {
      return dataSource.getConnection();
    } catch (SQLException e) {
      throw new SQLTransientConnectionException(
          "cannot get a database connection: " + e.getMessage(), "08001", e);
    }
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
    // A retry copy's letter names the first record (its original_* headers).
    headers.add("dlq_topic", utf8(RetryHeaders.originalTopic(record)));
    headers.add("dlq_partition", utf8(Integer.toString(RetryHeaders.originalPartition(record))));
    headers.add("dlq_offset", utf8(Long.toString(RetryHeaders.originalOffset(record))));
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
    send(letter, record, "dead letter");
    InboxTracing.deadLettered(reason);
    return new Result(Outcome.DEAD_LETTERED, attempts);
  }

  /** Produces {@code out} (a dead letter or a retry copy of {@code record}) and awaits its ack. */
  private void send(
      ProducerRecord<byte[], byte[]> out, ConsumerRecord<byte[], byte[]> record, String what) {
    try {
      deadLetters.send(out).get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InboxException("interrupted while producing a " + what, e);
    } catch (ExecutionException | RuntimeException e) {
      Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
      throw new InboxException(
          "cannot produce the "
              + what
              + " of "
              + record.topic()
              + "-"
              + record.partition()
              + "@"
              + record.offset()
              + " to "
              + out.topic()
              + ": "
              + cause,
          cause);
    }
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

  /** An aggregate's version: the parked table's key after the consumer. */
  private record VersionKey(String aggregateType, String aggregateId, long version) {}

  /** A parked row: the rebuilt record, when it was parked, whether its deadline passed. */
  private record ParkedRow(
      VersionKey key, ConsumerRecord<byte[], byte[]> record, Instant parkedAt, boolean expired) {}

  /** A version more than one ahead of the stored one. */
  private static final class VersionGap extends Exception {
    private static final long serialVersionUID = 1L;
    private final transient VersionKey key;

    VersionGap(long expected, VersionKey key) {
      super("version gap: expected " + expected + ", got " + key.version(), null, false, false);
      this.key = key;
    }
  }

  /** A parked record whose version is still ahead of the stored one: it stays parked. */
  private static final class StillAhead extends Exception {
    private static final long serialVersionUID = 1L;

    StillAhead() {
      super("still ahead", null, false, false);
    }
  }
}
