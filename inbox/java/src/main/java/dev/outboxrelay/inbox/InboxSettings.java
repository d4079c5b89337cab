package dev.outboxrelay.inbox;

import io.micrometer.core.instrument.MeterRegistry;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.OpenTelemetry;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.propagation.TextMapPropagator;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.function.Function;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;

/**
 * Settings of an {@link Inbox}: immutable, made with {@link #builder(String, String)}.
 *
 * <pre>{@code
 * InboxSettings settings = InboxSettings.builder("billing", "billing.dlq")
 *     .versionHeader("version")
 *     .maxAttempts(3)
 *     .topic("orders", TopicSettings.builder().maxAttempts(8).build())
 *     .build();
 * }</pre>
 */
public final class InboxSettings {
  private static final Pattern TABLE = Pattern.compile("[A-Za-z0-9_$]+(\\.[A-Za-z0-9_$]+)?");

  private final String consumer;
  private final String deadLetterTopic;
  private final String inboxTable;
  private final String versionTable;
  private final String parkedTable;
  private final String eventKeyHeader;
  private final String versionHeader;
  private final Function<ConsumerRecord<byte[], byte[]>, Long> versionFunction;
  private final GapPolicy gapPolicy;
  private final int maxAttempts;
  private final Duration backoffInitial;
  private final Duration backoffMax;
  private final Duration outageBudget;
  private final Duration gapDeadline;
  private final Duration parkSweepInterval;
  private final List<Duration> retryTiers;
  private final String retryTopicFormat;
  private final OpenTelemetry openTelemetry;
  private final TextMapPropagator propagator;
  private final Duration inboxRetention;
  private final EffectiveSettings defaults;
  private final Map<String, EffectiveSettings> topics;
  private final MeterRegistry meterRegistry;
  private final int batchMaxRecords;
  private final Duration batchMaxWait;

  /** The largest {@code batch_max_records} allowed. */
  public static final int BATCH_MAX_RECORDS_LIMIT = 10_000;

  private InboxSettings(
      Builder b, EffectiveSettings defaults, Map<String, EffectiveSettings> topics) {
    this.consumer = b.consumer;
    this.deadLetterTopic = b.deadLetterTopic;
    this.inboxTable = b.inboxTable;
    this.versionTable = b.versionTable;
    this.parkedTable = b.parkedTable;
    this.eventKeyHeader = b.eventKeyHeader;
    this.versionHeader = b.versionHeader;
    this.versionFunction = b.versionFunction;
    this.gapPolicy = b.gapPolicy;
    this.maxAttempts = b.maxAttempts;
    this.backoffInitial = b.backoffInitial;
    this.backoffMax = b.backoffMax;
    this.outageBudget = b.outageBudget;
    this.gapDeadline = b.gapDeadline;
    this.parkSweepInterval = b.parkSweepInterval;
    this.retryTiers = List.copyOf(b.retryTiers);
    this.retryTopicFormat = b.retryTopicFormat;
    this.openTelemetry = b.openTelemetry;
    this.propagator = b.propagator;
    this.inboxRetention = b.inboxRetention;
    this.defaults = defaults;
    this.topics = Map.copyOf(topics);
    this.meterRegistry = b.meterRegistry;
    this.batchMaxRecords = b.batchMaxRecords;
    this.batchMaxWait = b.batchMaxWait;
  }

  /**
   * @return the most records one database transaction settles in batch mode (inbox/CONTRACT.md,
   *     "Batch mode"); 1 (the default): batch mode off
   */
  public int batchMaxRecords() {
    return batchMaxRecords;
  }

  /**
   * @return how long {@link InboxRunner} waits for more records of a batch once one arrived
   *     (default 20 ms)
   */
  public Duration batchMaxWait() {
    return batchMaxWait;
  }

  /**
   * Starts settings with the two required values.
   *
   * @param consumer the consumer's name: part of the inbox key (at most 191 characters) and the
   *     default Kafka group id of {@link InboxRunner}
   * @param deadLetterTopic the topic poison, key-less and expired parked records go to (no default)
   * @return a builder with every other setting at its default
   */
  public static Builder builder(String consumer, String deadLetterTopic) {
    return new Builder(consumer, deadLetterTopic);
  }

  /**
   * @return the consumer name (inbox key part, default group id)
   */
  public String consumer() {
    return consumer;
  }

  /**
   * @return the dead-letter topic
   */
  public String deadLetterTopic() {
    return deadLetterTopic;
  }

  /**
   * @return the inbox table (default {@code outbox_inbox})
   */
  public String inboxTable() {
    return inboxTable;
  }

  /**
   * @return the version table (default {@code outbox_inbox_version})
   */
  public String versionTable() {
    return versionTable;
  }

  /**
   * @return the parked table (default {@code outbox_inbox_parked}, {@code
   *     migrations/0006_inbox_parked.sql})
   */
  public String parkedTable() {
    return parkedTable;
  }

  /**
   * @return the consumer-wide gap deadline: how long a parked record may wait for the version
   *     before it; then the sweep dead-letters it (default 1 h). A topic's: {@code
   *     forTopic(topic).gapDeadline()}
   */
  public Duration gapDeadline() {
    return gapDeadline;
  }

  /**
   * @return how often {@link InboxRunner} sweeps the parked table (and once before the first poll;
   *     default 10 s)
   */
  public Duration parkSweepInterval() {
    return parkSweepInterval;
  }

  /**
   * @return whether gaps are parked (versions checked, gap policy {@link GapPolicy#PARK} by default
   *     or for some topic): then the runner sweeps the parked table
   */
  public boolean parks() {
    if (!checksVersions()) {
      return false;
    }
    if (defaults.gapPolicy() == GapPolicy.PARK) {
      return true;
    }
    return topics.values().stream().anyMatch(t -> t.gapPolicy() == GapPolicy.PARK);
  }

  /**
   * The settings in effect for a topic (inbox/CONTRACT.md, "Per-topic settings"): its {@link
   * TopicSettings} ({@link Builder#topic}) over the consumer-wide values. The one place the inbox
   * and the runner read {@code maxAttempts}, {@code backoffInitial}, {@code backoffMax}, {@code
   * retryTiers}, {@code gapPolicy}, {@code gapDeadline} and {@code inboxRetention}.
   *
   * @param topic an original topic (a retry copy's {@code original_topic}, see {@link
   *     #topicOf(ConsumerRecord)})
   * @return the effective settings
   */
  public EffectiveSettings forTopic(String topic) {
    EffectiveSettings t = topics.get(topic);
    return t != null ? t : defaults;
  }

  /**
   * The topic whose settings apply to a record: its {@code original_topic} header when present (a
   * retry copy), else its own topic.
   *
   * @param record the record
   * @return the original topic
   */
  public static String topicOf(ConsumerRecord<?, ?> record) {
    return RetryHeaders.originalTopic(record);
  }

  /**
   * @return the topics with their own settings ({@link Builder#topic}), each resolved over the
   *     consumer-wide values
   */
  public Map<String, EffectiveSettings> topics() {
    return topics;
  }

  /**
   * The retry tiers of a topic (inbox/CONTRACT.md, "Retry tiers"): the delays of its tier topics,
   * tier 1 first; empty (the default): blocking retries only, a record whose attempts are used up
   * is dead-lettered. {@code forTopic(topic).retryTiers()}: the topic's own list ({@link
   * TopicSettings.Builder#retryTiers}), else the consumer-wide one ({@link Builder#retryTiers}).
   *
   * @param topic the record's original topic (a copy's {@code original_topic})
   * @return the delays, possibly empty
   */
  public List<Duration> retryTiers(String topic) {
    return forTopic(topic).retryTiers();
  }

  /**
   * @return the consumer-wide inbox retention (default 7 days): read by {@code outbox-relay prune
   *     --inbox}; the helper deletes nothing itself. A topic's: {@code
   *     forTopic(topic).inboxRetention()}
   */
  public Duration inboxRetention() {
    return inboxRetention;
  }

  /**
   * @return the registry of the inbox's metrics (inbox/CONTRACT.md, "Metrics"), or {@code null}
   *     (the default: no metrics)
   */
  public MeterRegistry meterRegistry() {
    return meterRegistry;
  }

  /**
   * @return the consumer-wide retry tiers (default none)
   */
  public List<Duration> retryTiers() {
    return retryTiers;
  }

  /**
   * @return the format of the tier topics' names (default {@code {topic}.retry.{n}})
   */
  public String retryTopicFormat() {
    return retryTopicFormat;
  }

  /**
   * The topic of tier {@code n} of {@code topic}: {@link #retryTopicFormat()} with {@code {topic}}
   * and {@code {n}} replaced.
   *
   * @param topic the original topic
   * @param n the tier, from 1
   * @return the tier topic's name
   */
  public String retryTopic(String topic, int n) {
    return retryTopicFormat.replace("{topic}", topic).replace("{n}", Integer.toString(n));
  }

  /**
   * @return the header carrying the event key (default {@code event_key})
   */
  public String eventKeyHeader() {
    return eventKeyHeader;
  }

  /**
   * @return the header carrying the version, or {@code null} (no version check, or a function)
   */
  public String versionHeader() {
    return versionHeader;
  }

  /**
   * @return whether records are version-checked (a version header or function is set)
   */
  public boolean checksVersions() {
    return versionFunction != null;
  }

  /**
   * @return the consumer-wide gap policy (default {@link GapPolicy#PARK}); a topic's: {@code
   *     forTopic(topic).gapPolicy()}
   */
  public GapPolicy gapPolicy() {
    return gapPolicy;
  }

  /**
   * @return the consumer-wide attempts per record before its next tier or dead letter (default 5);
   *     a topic's: {@code forTopic(topic).maxAttempts()}
   */
  public int maxAttempts() {
    return maxAttempts;
  }

  /**
   * @return the consumer-wide wait after the first failed attempt (default 100 ms); a topic's:
   *     {@code forTopic(topic).backoffInitial()}
   */
  public Duration backoffInitial() {
    return backoffInitial;
  }

  /**
   * @return the consumer-wide longest wait between attempts (default 10 s); a topic's: {@code
   *     forTopic(topic).backoffMax()}
   */
  public Duration backoffMax() {
    return backoffMax;
  }

  /**
   * @return how long one record may keep failing with infrastructure errors only ({@link
   *     Inbox#isInfrastructureError}) before {@link Inbox#process} throws {@link
   *     InboxOutageException}, the record unsettled (default 5 min)
   */
  public Duration outageBudget() {
    return outageBudget;
  }

  /**
   * The wait after failed attempt {@code attempt} with the consumer-wide backoff: {@code
   * backoffInitial × 2^(attempt-1)}, capped at {@code backoffMax}. A topic's: {@code
   * forTopic(topic).backoff(attempt)}.
   *
   * @param attempt the failed attempt's number, from 1
   * @return the wait before the next attempt
   */
  public Duration backoff(int attempt) {
    return defaults.backoff(attempt);
  }

  /**
   * The record's version, or {@code null} when records are not version-checked or this one has no
   * version (its header is missing or empty).
   *
   * @param record the record
   * @return the version
   * @throws IllegalArgumentException the version is unusable (the message is the dead-letter
   *     reason, e.g. {@code invalid version header: abc})
   */
  Long versionOf(ConsumerRecord<byte[], byte[]> record) {
    return versionFunction == null ? null : versionFunction.apply(record);
  }

  /**
   * The UTF-8 text of a record's last header of that name.
   *
   * @param record the record
   * @param name the header name
   * @return its text, or {@code null} when absent or valueless
   */
  /**
   * The OpenTelemetry instance whose tracer makes the consumer span of each record: the one given
   * to {@link Builder#openTelemetry}, else the global one ({@link GlobalOpenTelemetry#getOrNoop()}
   * at the time of the call: the no-op instance until the application installs an SDK; the global
   * is never set by this library).
   *
   * @return the OpenTelemetry instance to use now
   */
  public OpenTelemetry openTelemetry() {
    return openTelemetry != null ? openTelemetry : GlobalOpenTelemetry.getOrNoop();
  }

  /**
   * @return the propagator that extracts the producer's trace context from a record's headers
   *     (default {@link W3CTraceContextPropagator}: {@code traceparent}, {@code tracestate})
   */
  public TextMapPropagator propagator() {
    return propagator;
  }

  static String header(ConsumerRecord<?, ?> record, String name) {
    Header h = record.headers().lastHeader(name);
    return h == null || h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8);
  }

  /** Builds {@link InboxSettings}. Not thread-safe. */
  public static final class Builder {
    private final String consumer;
    private final String deadLetterTopic;
    private String inboxTable = "outbox_inbox";
    private String versionTable = "outbox_inbox_version";
    private String parkedTable = "outbox_inbox_parked";
    private String eventKeyHeader = "event_key";
    private String versionHeader;
    private Function<ConsumerRecord<byte[], byte[]>, Long> versionFunction;
    private GapPolicy gapPolicy = GapPolicy.PARK;
    private int maxAttempts = 5;
    private Duration backoffInitial = Duration.ofMillis(100);
    private Duration backoffMax = Duration.ofSeconds(10);
    private Duration outageBudget = Duration.ofMinutes(5);
    private Duration gapDeadline = Duration.ofHours(1);
    private Duration parkSweepInterval = Duration.ofSeconds(10);
    private List<Duration> retryTiers = List.of();
    private String retryTopicFormat = "{topic}.retry.{n}";
    private OpenTelemetry openTelemetry;
    private TextMapPropagator propagator = W3CTraceContextPropagator.getInstance();
    private Duration inboxRetention = Duration.ofDays(7);
    private int batchMaxRecords = 1;
    private Duration batchMaxWait = Duration.ofMillis(20);
    private final Map<String, TopicSettings> topics = new LinkedHashMap<>();
    private MeterRegistry meterRegistry;

    private Builder(String consumer, String deadLetterTopic) {
      this.consumer = consumer;
      this.deadLetterTopic = deadLetterTopic;
    }

    /**
     * @param table the inbox table, {@code name} or {@code schema.name}
     * @return this builder
     */
    public Builder inboxTable(String table) {
      this.inboxTable = table;
      return this;
    }

    /**
     * @param table the version table, {@code name} or {@code schema.name}
     * @return this builder
     */
    public Builder versionTable(String table) {
      this.versionTable = table;
      return this;
    }

    /**
     * @param table the parked table, {@code name} or {@code schema.name}
     * @return this builder
     */
    public Builder parkedTable(String table) {
      this.parkedTable = table;
      return this;
    }

    /**
     * How long a parked record (gap policy {@link GapPolicy#PARK}) may wait for the version before
     * it; past it the sweep dead-letters it (or calls {@link Hooks#onGapExpired}).
     *
     * @param deadline the gap deadline (default 1 h)
     * @return this builder
     */
    public Builder gapDeadline(Duration deadline) {
      this.gapDeadline = deadline;
      return this;
    }

    /**
     * How often {@link InboxRunner} sweeps the parked table: resumes rows whose predecessor was
     * applied, deletes stale ones, dead-letters expired ones.
     *
     * @param interval the sweep interval (default 10 s)
     * @return this builder
     */
    public Builder parkSweepInterval(Duration interval) {
      this.parkSweepInterval = interval;
      return this;
    }

    /**
     * Non-blocking retry tiers (inbox/CONTRACT.md, "Retry tiers"): when a record's attempts are
     * used up (handler and data errors only; infrastructure errors never count), a copy goes to the
     * next tier's topic ({@link #retryTopicFormat}) to be processed again once the tier's delay has
     * passed, and the partition moves on; after the last tier, the dead-letter topic. Per-key order
     * is broken while a record waits in a tier: opt in only with a version header or for handlers
     * whose effects commute. The consumer-wide default: a topic may have its own ({@link
     * TopicSettings.Builder#retryTiers}), and the runner creates and consumes each topic's own tier
     * topics.
     *
     * @param delays the tiers' delays, tier 1 first (default none: blocking retries only)
     * @return this builder
     */
    public Builder retryTiers(List<Duration> delays) {
      this.retryTiers = delays == null ? List.of() : delays;
      return this;
    }

    /**
     * @param format the tier topics' names: {@code {topic}} is the original topic, {@code {n}} the
     *     tier from 1 (default {@code {topic}.retry.{n}})
     * @return this builder
     */
    public Builder retryTopicFormat(String format) {
      this.retryTopicFormat = format;
      return this;
    }

    /**
     * @param header the header carrying the event key
     * @return this builder
     */
    public Builder eventKeyHeader(String header) {
      this.eventKeyHeader = header;
      return this;
    }

    /**
     * Turns on the version check with the version in a header (the decimal text of an integer). A
     * record without that header (or with an empty one) is not version-checked; one whose header is
     * not an integer is dead-lettered at once. {@code null} or empty turns the check off.
     *
     * @param header the header name, e.g. {@code version}
     * @return this builder
     */
    public Builder versionHeader(String header) {
      if (header == null || header.isEmpty()) {
        this.versionHeader = null;
        this.versionFunction = null;
        return this;
      }
      this.versionHeader = header;
      this.versionFunction =
          record -> {
            String text = header(record, header);
            if (text == null || text.isEmpty()) {
              return null;
            }
            try {
              return Long.parseLong(text.trim());
            } catch (NumberFormatException e) {
              throw new IllegalArgumentException("invalid version header: " + text, e);
            }
          };
      return this;
    }

    /**
     * Turns on the version check with a version computed from the record. The function returns
     * {@code null} for a record not to check, or throws {@link IllegalArgumentException} (its
     * message is the dead-letter reason) for an unusable one.
     *
     * @param function the record's version
     * @return this builder
     */
    public Builder versionFunction(Function<ConsumerRecord<byte[], byte[]>, Long> function) {
      this.versionHeader = null;
      this.versionFunction = function;
      return this;
    }

    /**
     * @param policy what to do with a version gap
     * @return this builder
     */
    public Builder gapPolicy(GapPolicy policy) {
      this.gapPolicy = policy;
      return this;
    }

    /**
     * @param attempts attempts per record before it is dead-lettered, at least 1
     * @return this builder
     */
    public Builder maxAttempts(int attempts) {
      this.maxAttempts = attempts;
      return this;
    }

    /**
     * @param wait the wait after the first failed attempt (doubled after each further one)
     * @return this builder
     */
    public Builder backoffInitial(Duration wait) {
      this.backoffInitial = wait;
      return this;
    }

    /**
     * @param wait the longest wait between two attempts
     * @return this builder
     */
    public Builder backoffMax(Duration wait) {
      this.backoffMax = wait;
      return this;
    }

    /**
     * How long one record may keep failing with infrastructure errors only (the database
     * unreachable, a lost connection, a read-only server, a deadlock...: {@link
     * Inbox#isInfrastructureError}). Those errors are retried with the backoff without counting as
     * attempts; past this budget {@link Inbox#process} throws {@link InboxOutageException} and the
     * record stays unsettled.
     *
     * @param budget the outage budget (default 5 min)
     * @return this builder
     */
    public Builder outageBudget(Duration budget) {
      this.outageBudget = budget;
      return this;
    }

    /**
     * Batch mode (inbox/CONTRACT.md, "Batch mode"): with more than 1, {@link InboxRunner} settles
     * up to this many records of a poll in one database transaction ({@link Inbox#processBatch}),
     * with the same guarantees, rows, hooks and metrics per record as one at a time. Consumer-wide.
     *
     * @param records the most records per batch, 1 to {@value #BATCH_MAX_RECORDS_LIMIT} (default 1:
     *     batch mode off); checked by {@link #build()}
     * @return this builder
     */
    public Builder batchMaxRecords(int records) {
      this.batchMaxRecords = records;
      return this;
    }

    /**
     * How long {@link InboxRunner} waits for more records once a poll returned at least one, to
     * fill a batch (batch mode only, {@link #batchMaxRecords}).
     *
     * @param wait the wait (default 20 ms), not negative; checked by {@link #build()}
     * @return this builder
     */
    public Builder batchMaxWait(Duration wait) {
      this.batchMaxWait = wait;
      return this;
    }

    /**
     * Overrides, for one topic, {@code maxAttempts}, {@code backoffInitial}, {@code backoffMax},
     * {@code retryTiers}, {@code gapPolicy}, {@code gapDeadline} and {@code inboxRetention}
     * (inbox/CONTRACT.md, "Per-topic settings"). A record uses the settings of its {@code
     * original_topic} header when present (a retry copy), else of its own topic; a topic not given
     * here uses the consumer-wide values. Given again for the same topic: the last one wins.
     *
     * @param topic the topic (an original topic, not a tier topic)
     * @param settings its overrides (unset fields inherit)
     * @return this builder
     */
    public Builder topic(String topic, TopicSettings settings) {
      this.topics.put(topic, Objects.requireNonNull(settings, "settings"));
      return this;
    }

    /**
     * How long inbox rows are kept: read by {@code outbox-relay prune --inbox} ({@code
     * --older-than}, and {@code --topic-retention} for topics with their own, {@link
     * TopicSettings.Builder#inboxRetention}); the helper deletes nothing itself.
     *
     * @param retention the inbox retention (default 7 days), positive
     * @return this builder
     */
    public Builder inboxRetention(Duration retention) {
      this.inboxRetention = retention;
      return this;
    }

    /**
     * Turns on the inbox's metrics (inbox/CONTRACT.md, "Metrics"): the counter {@code
     * outbox_inbox_records} (Prometheus: {@code outbox_inbox_records_total}; tags {@code consumer},
     * {@code topic} (the original topic), {@code outcome}), the gauges {@code
     * outbox_inbox_parked_records} and {@code outbox_inbox_parked_oldest_seconds} (tag {@code
     * consumer}, set after each sweep) and, with an {@link InboxRunner}, {@code
     * outbox_inbox_consumer_lag} (tags {@code consumer}, {@code topic}, {@code partition}, set
     * after each poll). Unset (the default): no metrics; the global registry is never used
     * implicitly (pass {@code Metrics.globalRegistry} for it).
     *
     * @param registry the registry, or {@code null} for none
     * @return this builder
     */
    public Builder meterRegistry(MeterRegistry registry) {
      this.meterRegistry = registry;
      return this;
    }

    /**
     * The OpenTelemetry instance for the consumer spans (inbox/CONTRACT.md, "Trace context").
     *
     * @param openTelemetry an instance (e.g. the application's {@code OpenTelemetrySdk}), or {@code
     *     null} for the global one (the default)
     * @return this builder
     */
    public Builder openTelemetry(OpenTelemetry openTelemetry) {
      this.openTelemetry = openTelemetry;
      return this;
    }

    /**
     * The propagator that extracts the producer's trace context from a record's headers.
     *
     * @param propagator e.g. {@code openTelemetry.getPropagators().getTextMapPropagator()}; default
     *     {@link W3CTraceContextPropagator#getInstance()} (what the relay writes)
     * @return this builder
     */
    public Builder propagator(TextMapPropagator propagator) {
      this.propagator = Objects.requireNonNull(propagator, "propagator");
      return this;
    }

    /**
     * Checks and builds the settings.
     *
     * @return the settings
     * @throws IllegalArgumentException a required value is missing or a value is out of range
     */
    public InboxSettings build() {
      require(consumer, "consumer");
      require(deadLetterTopic, "dead_letter_topic");
      require(eventKeyHeader, "event_key_header");
      for (String table : new String[] {inboxTable, versionTable, parkedTable}) {
        if (table == null || !TABLE.matcher(table).matches()) {
          throw new IllegalArgumentException("invalid table name: " + table);
        }
      }
      Objects.requireNonNull(gapPolicy, "gap_policy");
      if (maxAttempts < 1) {
        throw new IllegalArgumentException("max_attempts must be at least 1");
      }
      if (backoffInitial == null
          || backoffMax == null
          || backoffInitial.isNegative()
          || backoffMax.compareTo(backoffInitial) < 0) {
        throw new IllegalArgumentException("backoff: need 0 <= backoff_initial <= backoff_max");
      }
      if (inboxRetention == null || inboxRetention.isNegative() || inboxRetention.isZero()) {
        throw new IllegalArgumentException("inbox_retention must be positive");
      }
      if (outageBudget == null || outageBudget.isNegative()) {
        throw new IllegalArgumentException("outage_budget must not be negative");
      }
      if (batchMaxRecords < 1 || batchMaxRecords > BATCH_MAX_RECORDS_LIMIT) {
        throw new IllegalArgumentException(
            "batch_max_records must be between 1 and "
                + BATCH_MAX_RECORDS_LIMIT
                + ", got "
                + batchMaxRecords);
      }
      if (batchMaxWait == null || batchMaxWait.isNegative()) {
        throw new IllegalArgumentException(
            "batch_max_wait must not be negative, got " + batchMaxWait);
      }
      if (gapDeadline == null
          || gapDeadline.isNegative()
          || parkSweepInterval == null
          || parkSweepInterval.isNegative()
          || parkSweepInterval.isZero()) {
        throw new IllegalArgumentException(
            "gap_deadline must not be negative, park_sweep_interval must be positive");
      }
      for (Duration d : retryTiers) {
        if (d == null || d.isNegative()) {
          throw new IllegalArgumentException("retry_tiers: delays must not be negative");
        }
      }
      if (retryTopicFormat == null || !retryTopicFormat.contains("{n}")) {
        throw new IllegalArgumentException("retry_topic_format must contain {n}");
      }
      EffectiveSettings defaults =
          new EffectiveSettings(
              maxAttempts,
              backoffInitial,
              backoffMax,
              retryTiers,
              gapPolicy,
              gapDeadline,
              inboxRetention);
      Map<String, EffectiveSettings> resolved = new LinkedHashMap<>();
      for (Map.Entry<String, TopicSettings> e : topics.entrySet()) {
        resolved.put(e.getKey(), resolve(e.getKey(), e.getValue(), defaults));
      }
      return new InboxSettings(this, defaults, resolved);
    }

    /** A topic's overrides over the consumer-wide values, checked. */
    private static EffectiveSettings resolve(
        String topic, TopicSettings t, EffectiveSettings defaults) {
      if (topic == null || topic.isEmpty()) {
        throw new IllegalArgumentException("topic settings: the topic name is required");
      }
      String where = "topic " + topic + ": ";
      if (t.maxAttempts() != null && t.maxAttempts() < 1) {
        throw new IllegalArgumentException(where + "max_attempts must be at least 1");
      }
      nonNegative(where, "backoff_initial", t.backoffInitial());
      nonNegative(where, "backoff_max", t.backoffMax());
      nonNegative(where, "gap_deadline", t.gapDeadline());
      if (t.inboxRetention() != null
          && (t.inboxRetention().isNegative() || t.inboxRetention().isZero())) {
        throw new IllegalArgumentException(where + "inbox_retention must be positive");
      }
      if (t.retryTiers() != null) {
        for (Duration d : t.retryTiers()) {
          if (d == null || d.isNegative()) {
            throw new IllegalArgumentException(where + "retry_tiers: delays must not be negative");
          }
        }
      }
      Duration initial = or(t.backoffInitial(), defaults.backoffInitial());
      Duration max = or(t.backoffMax(), defaults.backoffMax());
      if (max.compareTo(initial) < 0) {
        throw new IllegalArgumentException(
            where + "backoff_initial (" + initial + ") must not exceed backoff_max (" + max + ")");
      }
      return new EffectiveSettings(
          t.maxAttempts() != null ? t.maxAttempts() : defaults.maxAttempts(),
          initial,
          max,
          or(t.retryTiers(), defaults.retryTiers()),
          or(t.gapPolicy(), defaults.gapPolicy()),
          or(t.gapDeadline(), defaults.gapDeadline()),
          or(t.inboxRetention(), defaults.inboxRetention()));
    }

    private static void nonNegative(String where, String name, Duration d) {
      if (d != null && d.isNegative()) {
        throw new IllegalArgumentException(where + name + " must not be negative");
      }
    }

    private static <T> T or(T value, T fallback) {
      return value != null ? value : fallback;
    }

    private static void require(String value, String name) {
      if (value == null || value.isEmpty()) {
        throw new IllegalArgumentException(name + " is required");
      }
    }
  }
}
