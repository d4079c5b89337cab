package dev.outboxrelay.inbox;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Owns a Kafka consumer loop: subscribes, polls, settles each record in partition order (one at a
 * time, retries blocking), and commits the settled offsets synchronously after each poll batch and
 * when partitions are revoked. Auto-commit is always off.
 *
 * <pre>{@code
 * try (InboxRunner runner = InboxRunner.builder(kafkaProperties)
 *     .inbox(settings, dataSource, handler)
 *     .build()) {
 *   Runtime.getRuntime().addShutdownHook(new Thread(runner::close));
 *   runner.run(List.of("orders"));   // blocks until stop() or close()
 * }
 * }</pre>
 *
 * <p>{@link #stop()} (from any thread, a signal handler or a listener) lets the record in hand
 * finish, including its retries, then commits and closes. Any other failure (a dead letter that
 * cannot be produced, a database outage longer than the outage budget ({@link
 * InboxOutageException}), an exception of a listener or hook) commits what was settled before the
 * record in hand, closes and leaves {@link #run} with an exception; the record in hand and those
 * after it are not committed, so a restarted runner resumes with it.
 *
 * <p>With an inbox that parks version gaps ({@link InboxSettings#parks()}), the loop also sweeps
 * the parked table ({@link Inbox#sweepParked}) before the first poll and every {@link
 * InboxSettings#parkSweepInterval()} (checked between records, and the poll waits at most that
 * long): parked records whose predecessor was applied resume, stale ones are removed, expired ones
 * are dead-lettered. A sweep that cannot read the tables is logged and done again later.
 *
 * <p>With retry tiers ({@link InboxSettings#retryTiers}, or a topic's own: {@link
 * InboxSettings#forTopic}), {@link #run} first creates the missing tier topics of each of its
 * topics (by that topic's tier count) (as the dead-letter topic, {@link
 * DeadLetterTopics#ensureRetryTopics}) and subscribes to them too. A retry copy whose {@code
 * retry_at} has not come pauses its partition (the position goes back to the copy, its offset is
 * not committed) until then; the other partitions go on, and the poll waits at most until the first
 * paused one is due.
 *
 * <p>With a meter registry ({@link InboxSettings.Builder#meterRegistry}), the runner sets {@code
 * outbox_inbox_consumer_lag} after each poll for the partitions that returned records.
 *
 * <p>Batch mode ({@link InboxSettings.Builder#batchMaxRecords} above 1; inbox/CONTRACT.md, "Batch
 * mode"): the consumer's {@code max.poll.records} is set to {@code batchMaxRecords}; once a poll
 * returned records the runner polls again for at most {@link InboxSettings#batchMaxWait()} (until
 * it has {@code batchMaxRecords}), then settles consecutive ordinary records as batches of at most
 * {@code batchMaxRecords} with {@link Inbox#processBatch} (one database transaction each) and each
 * retry copy alone with {@link Inbox#process}. Offsets are committed after each poll batch as
 * without it; a record's offset only once its batch settled.
 */
public final class InboxRunner implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(InboxRunner.class);

  /**
   * Settles one record; {@code Inbox::process} with a handler is the usual one. Returning means
   * settled: its offset + 1 will be committed.
   */
  @FunctionalInterface
  public interface RecordProcessor {
    /**
     * @param record the record
     * @return its outcome
     * @throws Exception stops the runner (the record is not settled)
     */
    Result process(ConsumerRecord<byte[], byte[]> record) throws Exception;
  }

  /** Observes the loop (on its thread). Every method does nothing by default. */
  public interface Listener {
    /** After {@code subscribe}, before the first poll. */
    default void subscribed() {}

    /**
     * After a poll returned records, before they are processed (in batch mode also after each of
     * the polls that fill a batch).
     *
     * @param records the batch
     */
    default void polled(ConsumerRecords<byte[], byte[]> records) {}

    /**
     * After a record was settled, before its offset is committed.
     *
     * @param record the record
     * @param result its outcome
     */
    default void settled(ConsumerRecord<byte[], byte[]> record, Result result) {}
  }

  private final Consumer<byte[], byte[]> consumer;
  private final Producer<byte[], byte[]> ownedProducer;
  private final RecordProcessor processor;
  private final BatchProcessor batchProcessor;
  private final int batchMaxRecords;
  private final Duration batchMaxWait;
  private final Listener listener;
  private final Duration pollTimeout;
  private final Sweeper sweeper;
  private final Duration sweepInterval;
  private final InboxMetrics metrics;
  private long lastSweep;
  private final Map<TopicPartition, OffsetAndMetadata> pending = new HashMap<>();
  private final InboxSettings settings;
  private final Properties kafka;

  /** Partitions paused on a retry copy: when it is due (ms since the epoch). */
  private final Map<TopicPartition, Long> waiting = new HashMap<>();

  private final AtomicBoolean started = new AtomicBoolean();
  private final AtomicBoolean closed = new AtomicBoolean();
  private final CountDownLatch finished = new CountDownLatch(1);
  private volatile boolean stopping;
  private volatile Thread loopThread;

  private InboxRunner(
      Builder b,
      RecordProcessor processor,
      BatchProcessor batchProcessor,
      Consumer<byte[], byte[]> consumer,
      Producer<byte[], byte[]> producer,
      Sweeper sweeper,
      Duration sweepInterval,
      InboxMetrics metrics) {
    this.metrics = metrics;
    this.sweeper = sweeper;
    this.sweepInterval = sweepInterval;
    this.settings = b.settings;
    this.kafka = b.kafka;
    this.consumer = consumer;
    this.ownedProducer = producer;
    this.processor = processor;
    this.batchProcessor = batchProcessor;
    this.batchMaxRecords = batchProcessor == null ? 1 : b.settings.batchMaxRecords();
    this.batchMaxWait = batchProcessor == null ? Duration.ZERO : b.settings.batchMaxWait();
    this.listener = b.listener;
    this.pollTimeout =
        sweeper != null && sweepInterval.compareTo(b.pollTimeout) < 0
            ? sweepInterval
            : b.pollTimeout;
  }

  /**
   * Starts a runner.
   *
   * @param kafka Kafka client properties: at least {@code bootstrap.servers}; consumer settings
   *     (e.g. {@code group.id}, {@code max.poll.records}) and producer settings for the dead-letter
   *     producer may be mixed, each client takes its own
   * @return a builder
   */
  public static Builder builder(Properties kafka) {
    return new Builder(kafka);
  }

  /**
   * The consumer configuration the runner uses: {@code kafka} plus byte-array deserializers and
   * {@code enable.auto.commit=false} (forced), {@code group.id} (when absent) and {@code
   * auto.offset.reset=earliest} (when absent).
   *
   * @param kafka the user's properties
   * @param groupId the group id to use when {@code kafka} has none, or {@code null}
   * @return a new properties object
   */
  public static Properties consumerConfig(Properties kafka, String groupId) {
    Properties p = new Properties();
    p.putAll(kafka);
    p.keySet().removeIf(k -> !ConsumerConfig.configNames().contains(k.toString()));
    if (groupId != null) {
      p.putIfAbsent(ConsumerConfig.GROUP_ID_CONFIG, groupId);
    }
    p.putIfAbsent(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    return p;
  }

  /**
   * The dead-letter producer's configuration: the producer settings of {@code kafka} plus
   * byte-array serializers, {@code acks=all} and idempotence (forced).
   *
   * @param kafka the user's properties
   * @return a new properties object
   */
  public static Properties deadLetterProducerConfig(Properties kafka) {
    Properties p = new Properties();
    p.putAll(kafka);
    p.keySet().removeIf(k -> !ProducerConfig.configNames().contains(k.toString()));
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    return p;
  }

  /**
   * Subscribes to {@code topics} and processes records until {@link #stop()} or {@link #close()};
   * then commits the settled offsets and closes the consumer (and the dead-letter producer it
   * made). Call it once; after {@link #close()} it returns at once.
   *
   * @param topics the topics to subscribe to
   * @throws InboxException processing or a Kafka call failed (offsets of records settled before are
   *     committed first)
   * @throws IllegalStateException run was already called
   */
  public void run(Collection<String> topics) {
    if (!started.compareAndSet(false, true)) {
      if (stopping) {
        return; // closed before it ran (e.g. a signal during startup), or already ran
      }
      throw new IllegalStateException("an InboxRunner runs once");
    }
    loopThread = Thread.currentThread();
    try {
      List<String> subscription = new ArrayList<>(topics);
      if (settings != null) {
        // The tier topics exist, are created now, or the runner refuses to start.
        for (String tierTopic :
            DeadLetterTopics.ensureRetryTopics(kafka, settings, topics, Duration.ofSeconds(30))) {
          if (!subscription.contains(tierTopic)) {
            subscription.add(tierTopic);
          }
        }
      }
      consumer.subscribe(subscription, new Revocations());
      listener.subscribed();
      while (!stopping) {
        sweepWhenDue();
        resumeDue();
        ConsumerRecords<byte[], byte[]> records;
        try {
          records = consumer.poll(nextPollTimeout());
        } catch (WakeupException e) {
          continue;
        }
        if (records.isEmpty()) {
          continue;
        }
        recordLag(records);
        listener.polled(records);
        if (batchProcessor != null) {
          settleBatches(records);
          commit(pending);
          continue;
        }
        for (ConsumerRecord<byte[], byte[]> record : records) {
          if (stopping) {
            break;
          }
          TopicPartition tp = new TopicPartition(record.topic(), record.partition());
          if (waiting.containsKey(tp)) {
            continue; // after a copy that is not due: fetched again once it is
          }
          Long due = RetryHeaders.retryAt(record);
          if (due != null && due > System.currentTimeMillis()) {
            hold(tp, record, due);
            continue;
          }
          sweepWhenDue();
          settle(record);
        }
        commit(pending);
      }
      commit(pending);
    } catch (InboxException e) {
      commitQuietly();
      throw e;
    } catch (Exception e) {
      commitQuietly();
      throw new InboxException("inbox runner failed: " + e, e);
    } finally {
      closeClients();
      finished.countDown();
    }
  }

  /**
   * Sets {@code outbox_inbox_consumer_lag} (with a meter registry) of the partitions the poll
   * returned records for: the partition's high watermark minus the consumer's position ({@link
   * Consumer#currentLag}, known from the fetch).
   */
  private void recordLag(ConsumerRecords<byte[], byte[]> records) {
    if (metrics == null) {
      return;
    }
    for (TopicPartition tp : records.partitions()) {
      OptionalLong lag = consumer.currentLag(tp);
      if (lag.isPresent()) {
        metrics.lag(tp.topic(), tp.partition(), lag.getAsLong());
      }
    }
  }

  /**
   * Pauses {@code tp} on a retry copy that is not due: its position goes back to the copy (the
   * records fetched after it are dropped), and {@link #resumeDue} resumes it at {@code due}.
   */
  private void hold(TopicPartition tp, ConsumerRecord<byte[], byte[]> record, long due) {
    consumer.pause(List.of(tp));
    consumer.seek(tp, record.offset());
    waiting.put(tp, due);
    LOG.debug(
        "{}@{}: retry copy due in {} ms, partition paused",
        tp,
        record.offset(),
        due - System.currentTimeMillis());
  }

  /** Resumes the partitions whose retry copy is due (those still assigned). */
  private void resumeDue() {
    if (waiting.isEmpty()) {
      return;
    }
    long now = System.currentTimeMillis();
    List<TopicPartition> due = new ArrayList<>();
    waiting.forEach(
        (tp, at) -> {
          if (at <= now) {
            due.add(tp);
          }
        });
    if (due.isEmpty()) {
      return;
    }
    due.forEach(waiting::remove);
    due.retainAll(consumer.assignment());
    consumer.resume(due);
  }

  /** The poll timeout, shortened to the first paused partition's due time. */
  private Duration nextPollTimeout() {
    if (waiting.isEmpty()) {
      return pollTimeout;
    }
    long first = waiting.values().stream().mapToLong(Long::longValue).min().getAsLong();
    long ms = Math.max(1, first - System.currentTimeMillis());
    return ms < pollTimeout.toMillis() ? Duration.ofMillis(ms) : pollTimeout;
  }

  /** Sweeps the parked table before the first poll and every park sweep interval. */
  private void sweepWhenDue() {
    if (sweeper == null) {
      return;
    }
    long now = System.nanoTime();
    if (lastSweep != 0 && now - lastSweep < sweepInterval.toNanos()) {
      return;
    }
    lastSweep = now == 0 ? 1 : now;
    try {
      Inbox.ParkedSweep sweep = sweeper.sweep();
      LOG.debug("parked sweep: {}", sweep);
    } catch (java.sql.SQLException e) {
      LOG.warn("parked sweep failed (the next one is in {}): {}", sweepInterval, e.toString());
    }
  }

  /**
   * Batch mode: {@code first} plus what more polls return within {@code batchMaxWait} (up to {@code
   * batchMaxRecords} in all), settled in consecutive runs: ordinary records as batches of at most
   * {@code batchMaxRecords}, each retry copy alone (held when not due), in poll order.
   */
  private void settleBatches(ConsumerRecords<byte[], byte[]> first) throws Exception {
    List<ConsumerRecord<byte[], byte[]>> polled = new ArrayList<>(first.count());
    first.forEach(polled::add);
    long deadline = System.nanoTime() + batchMaxWait.toNanos();
    while (polled.size() < batchMaxRecords && !stopping) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        break;
      }
      ConsumerRecords<byte[], byte[]> more;
      try {
        more = consumer.poll(Duration.ofNanos(left));
      } catch (WakeupException e) {
        break;
      }
      if (!more.isEmpty()) {
        recordLag(more);
        listener.polled(more);
        more.forEach(polled::add);
      }
    }
    // A partition revoked during the extra polls is another member's now: leave its records.
    java.util.Set<TopicPartition> assigned = consumer.assignment();
    List<ConsumerRecord<byte[], byte[]>> run = new ArrayList<>();
    for (ConsumerRecord<byte[], byte[]> record : polled) {
      if (stopping) {
        break;
      }
      TopicPartition tp = new TopicPartition(record.topic(), record.partition());
      if (waiting.containsKey(tp) || !assigned.contains(tp)) {
        continue; // after a copy that is not due: fetched again once it is
      }
      Long due = RetryHeaders.retryAt(record);
      if (due == null && RetryHeaders.retryCount(record) == 0) {
        run.add(record);
        if (run.size() >= batchMaxRecords) {
          settleRun(run);
        }
        continue;
      }
      // A retry copy: not batched (time-gated and rare), the single path.
      settleRun(run);
      if (due != null && due > System.currentTimeMillis()) {
        hold(tp, record, due);
        continue;
      }
      sweepWhenDue();
      settle(record);
    }
    if (!stopping) {
      settleRun(run);
    }
  }

  /** Settles {@code run} (ordinary records) as one batch and empties it. */
  private void settleRun(List<ConsumerRecord<byte[], byte[]>> run) throws Exception {
    if (run.isEmpty()) {
      return;
    }
    sweepWhenDue();
    List<ConsumerRecord<byte[], byte[]>> batch = List.copyOf(run);
    run.clear();
    List<Result> results = batchProcessor.process(batch);
    for (int i = 0; i < batch.size(); i++) {
      ConsumerRecord<byte[], byte[]> record = batch.get(i);
      listener.settled(record, results.get(i));
      pending.put(
          new TopicPartition(record.topic(), record.partition()),
          new OffsetAndMetadata(record.offset() + 1, record.leaderEpoch(), ""));
    }
  }

  /** Settles a batch of records ({@link Inbox#processBatch}). */
  @FunctionalInterface
  private interface BatchProcessor {
    List<Result> process(List<ConsumerRecord<byte[], byte[]>> records) throws Exception;
  }

  /** One sweep of the parked table. */
  @FunctionalInterface
  private interface Sweeper {
    Inbox.ParkedSweep sweep() throws java.sql.SQLException;
  }

  private void settle(ConsumerRecord<byte[], byte[]> record) throws Exception {
    Result result = processor.process(record);
    listener.settled(record, result);
    pending.put(
        new TopicPartition(record.topic(), record.partition()),
        new OffsetAndMetadata(record.offset() + 1, record.leaderEpoch(), ""));
  }

  /**
   * Asks the loop to end after the record in hand. Returns at once; thread-safe; may be called from
   * a listener or hook.
   */
  public void stop() {
    stopping = true;
    try {
      consumer.wakeup();
    } catch (RuntimeException e) {
      LOG.debug("wakeup: {}", e.toString());
    }
  }

  /**
   * Stops the loop and waits until {@link #run} committed and closed (at once when called on the
   * loop's own thread, or when run was never called, in which case it closes the clients). Suitable
   * for a shutdown hook.
   */
  @Override
  public void close() {
    stop(); // before the check below: a run() that finds it started also finds it stopping
    if (started.compareAndSet(false, true)) {
      closeClients();
      finished.countDown();
      return;
    }
    if (Thread.currentThread() == loopThread) {
      return;
    }
    try {
      finished.await();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Commits {@code offsets} synchronously; settled ones committed are removed from pending. */
  private void commit(Map<TopicPartition, OffsetAndMetadata> offsets) {
    if (offsets.isEmpty()) {
      return;
    }
    Map<TopicPartition, OffsetAndMetadata> batch = new HashMap<>(offsets);
    try {
      try {
        consumer.commitSync(batch);
      } catch (WakeupException e) {
        consumer.commitSync(batch); // the wakeup was for the poll: it is consumed now
      }
      pending.keySet().removeAll(batch.keySet());
    } catch (RebalanceInProgressException | RetriableException e) {
      LOG.warn("offset commit deferred ({}): retried after the next poll or on revocation", e);
    } catch (CommitFailedException e) {
      // No longer a member owning these partitions: their records are delivered again to the
      // new owner and found as duplicates.
      LOG.warn("offset commit failed, partitions lost: {}", e.getMessage());
      pending.keySet().removeAll(batch.keySet());
    }
  }

  private void commitQuietly() {
    try {
      commit(pending);
    } catch (KafkaException e) {
      LOG.warn("offset commit on failure: {}", e.toString());
    }
  }

  private void closeClients() {
    if (!closed.compareAndSet(false, true)) {
      return;
    }
    try {
      consumer.close();
    } catch (RuntimeException e) {
      LOG.warn("closing the consumer: {}", e.toString());
    }
    if (ownedProducer != null) {
      try {
        ownedProducer.close();
      } catch (RuntimeException e) {
        LOG.warn("closing the dead-letter producer: {}", e.toString());
      }
    }
  }

  /** Commits the settled offsets of revoked partitions; forgets those of lost ones. */
  private final class Revocations implements ConsumerRebalanceListener {
    @Override
    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
      Map<TopicPartition, OffsetAndMetadata> revoked = new HashMap<>();
      for (TopicPartition tp : partitions) {
        OffsetAndMetadata offset = pending.get(tp);
        if (offset != null) {
          revoked.put(tp, offset);
        }
      }
      try {
        commit(revoked);
      } catch (KafkaException e) {
        LOG.warn("offset commit on revocation: {}", e.toString());
      }
      pending.keySet().removeAll(partitions);
      waiting.keySet().removeAll(partitions);
    }

    @Override
    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {}

    @Override
    public void onPartitionsLost(Collection<TopicPartition> partitions) {
      pending.keySet().removeAll(partitions);
      waiting.keySet().removeAll(partitions);
    }
  }

  /** Builds an {@link InboxRunner}. */
  public static final class Builder {
    private final Properties kafka;
    private RecordProcessor processor;
    private InboxSettings settings;
    private DataSource dataSource;
    private Handler handler;
    private Hooks hooks = Hooks.NONE;
    private Listener listener = new Listener() {};
    private Duration pollTimeout = Duration.ofSeconds(1);

    private Builder(Properties kafka) {
      this.kafka = Objects.requireNonNull(kafka, "kafka properties");
    }

    /**
     * Processes each record with an {@link Inbox} running {@code handler}; the runner makes the
     * dead-letter producer ({@link #deadLetterProducerConfig}) and closes it. The group id defaults
     * to {@code settings.consumer()}.
     *
     * @param settings the inbox settings
     * @param dataSource the consumer's database (a connection pool)
     * @param handler the business change
     * @return this builder
     */
    public Builder inbox(InboxSettings settings, DataSource dataSource, Handler handler) {
      this.settings = Objects.requireNonNull(settings, "settings");
      this.dataSource = Objects.requireNonNull(dataSource, "dataSource");
      this.handler = Objects.requireNonNull(handler, "handler");
      return this;
    }

    /**
     * Processes each record with {@code processor} instead of an inbox (e.g. an {@link Inbox} you
     * made yourself, or no inbox at all); {@code group.id} must then be in the properties.
     *
     * @param processor settles one record
     * @return this builder
     */
    public Builder processor(RecordProcessor processor) {
      this.processor = Objects.requireNonNull(processor, "processor");
      return this;
    }

    /**
     * @param hooks the inbox's hooks (with {@link #inbox} only)
     * @return this builder
     */
    public Builder hooks(Hooks hooks) {
      this.hooks = Objects.requireNonNull(hooks, "hooks");
      return this;
    }

    /**
     * @param listener observes the loop
     * @return this builder
     */
    public Builder listener(Listener listener) {
      this.listener = Objects.requireNonNull(listener, "listener");
      return this;
    }

    /**
     * @param timeout the longest a poll waits for records (default 1 s; {@link #stop()} wakes it)
     * @return this builder
     */
    public Builder pollTimeout(Duration timeout) {
      this.pollTimeout = Objects.requireNonNull(timeout, "timeout");
      return this;
    }

    /**
     * Makes the Kafka clients; with {@link #inbox}, first makes sure the dead-letter topic exists
     * ({@link DeadLetterTopics#ensure}: created with the broker's defaults when missing).
     *
     * @return the runner
     * @throws IllegalStateException neither or both of {@link #inbox} and {@link #processor}
     * @throws InboxException the dead-letter topic is missing and the broker refused to create it
     */
    public InboxRunner build() {
      if ((settings == null) == (processor == null)) {
        throw new IllegalStateException("set exactly one of inbox(...) and processor(...)");
      }
      String groupId = settings == null ? null : settings.consumer();
      Producer<byte[], byte[]> producer = null;
      RecordProcessor p = processor;
      BatchProcessor batch = null;
      Sweeper sweeper = null;
      InboxMetrics metrics = null;
      Properties consumerConfig = consumerConfig(kafka, groupId);
      if (settings != null && settings.batchMaxRecords() > 1) {
        consumerConfig.put(
            ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(settings.batchMaxRecords()));
      }
      if (settings != null) {
        // The dead-letter topic exists, is created now, or the runner refuses to start.
        DeadLetterTopics.ensure(kafka, settings.deadLetterTopic(), Duration.ofSeconds(30));
        producer = new KafkaProducer<>(deadLetterProducerConfig(kafka));
        Inbox inbox =
            new Inbox(
                settings,
                dataSource,
                producer,
                hooks,
                consumerConfig.getProperty(ConsumerConfig.GROUP_ID_CONFIG));
        Handler h = handler;
        p = record -> inbox.process(record, h);
        if (settings.batchMaxRecords() > 1) {
          batch = records -> inbox.processBatch(records, h);
        }
        metrics = inbox.metrics();
        if (settings.parks()) {
          sweeper = () -> inbox.sweepParked(h);
        }
      }
      try {
        return new InboxRunner(
            this,
            p,
            batch,
            new KafkaConsumer<>(consumerConfig),
            producer,
            sweeper,
            settings == null ? null : settings.parkSweepInterval(),
            metrics);
      } catch (RuntimeException e) {
        if (producer != null) {
          producer.close();
        }
        throw e;
      }
    }
  }
}
