package dev.outboxrelay.inbox;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * One topic's overrides of the consumer-wide settings of the same names (inbox/CONTRACT.md,
 * "Per-topic settings"): immutable, made with {@link #builder()}, given to {@link
 * InboxSettings.Builder#topic}. Every field is optional: unset ({@code null}) inherits the
 * consumer-wide value; {@code retryTiers(List.of())} means no tiers for that topic. The topic whose
 * settings apply to a record is its {@code original_topic} header when present (a retry copy), else
 * its own topic; {@link InboxSettings#forTopic} gives the values in effect.
 *
 * <pre>{@code
 * InboxSettings.builder("billing", "billing.dlq")
 *     .topic("orders", TopicSettings.builder()
 *         .maxAttempts(8)
 *         .retryTiers(List.of(Duration.ofSeconds(30), Duration.ofMinutes(5)))
 *         .build())
 *     .topic("notifications", TopicSettings.builder()
 *         .maxAttempts(2)
 *         .inboxRetention(Duration.ofDays(1))
 *         .build())
 *     .build();
 * }</pre>
 */
public final class TopicSettings {
  private final Integer maxAttempts;
  private final Duration backoffInitial;
  private final Duration backoffMax;
  private final List<Duration> retryTiers;
  private final GapPolicy gapPolicy;
  private final Duration gapDeadline;
  private final Duration inboxRetention;

  private TopicSettings(Builder b) {
    this.maxAttempts = b.maxAttempts;
    this.backoffInitial = b.backoffInitial;
    this.backoffMax = b.backoffMax;
    // Null delays are refused by InboxSettings.Builder.build() (naming the topic), not here.
    this.retryTiers =
        b.retryTiers == null ? null : Collections.unmodifiableList(new ArrayList<>(b.retryTiers));
    this.gapPolicy = b.gapPolicy;
    this.gapDeadline = b.gapDeadline;
    this.inboxRetention = b.inboxRetention;
  }

  /**
   * @return a builder with every field unset (inherited)
   */
  public static Builder builder() {
    return new Builder();
  }

  /**
   * @return the attempts per record, or {@code null} (inherited)
   */
  public Integer maxAttempts() {
    return maxAttempts;
  }

  /**
   * @return the wait after the first failed attempt, or {@code null} (inherited)
   */
  public Duration backoffInitial() {
    return backoffInitial;
  }

  /**
   * @return the longest wait between attempts, or {@code null} (inherited)
   */
  public Duration backoffMax() {
    return backoffMax;
  }

  /**
   * @return the retry tiers' delays (empty: none), or {@code null} (inherited)
   */
  public List<Duration> retryTiers() {
    return retryTiers;
  }

  /**
   * @return the gap policy, or {@code null} (inherited)
   */
  public GapPolicy gapPolicy() {
    return gapPolicy;
  }

  /**
   * @return the gap deadline, or {@code null} (inherited)
   */
  public Duration gapDeadline() {
    return gapDeadline;
  }

  /**
   * @return how long the topic's inbox rows are kept, or {@code null} (inherited)
   */
  public Duration inboxRetention() {
    return inboxRetention;
  }

  /** Builds {@link TopicSettings}. Not thread-safe. */
  public static final class Builder {
    private Integer maxAttempts;
    private Duration backoffInitial;
    private Duration backoffMax;
    private List<Duration> retryTiers;
    private GapPolicy gapPolicy;
    private Duration gapDeadline;
    private Duration inboxRetention;

    private Builder() {}

    /**
     * @param attempts attempts per record before its next tier or dead letter, at least 1
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
     * @param delays the topic's retry tiers, tier 1 first; {@code List.of()}: none for this topic;
     *     {@code null}: inherit
     * @return this builder
     */
    public Builder retryTiers(List<Duration> delays) {
      this.retryTiers = delays;
      return this;
    }

    /**
     * @param policy what to do with a version gap on this topic
     * @return this builder
     */
    public Builder gapPolicy(GapPolicy policy) {
      this.gapPolicy = policy;
      return this;
    }

    /**
     * @param deadline how long a parked record of this topic may wait for its predecessor
     * @return this builder
     */
    public Builder gapDeadline(Duration deadline) {
      this.gapDeadline = deadline;
      return this;
    }

    /**
     * @param retention how long the topic's inbox rows are kept (read by {@code outbox-relay prune
     *     --inbox --topic-retention}; the helper deletes nothing itself)
     * @return this builder
     */
    public Builder inboxRetention(Duration retention) {
      this.inboxRetention = retention;
      return this;
    }

    /**
     * Builds the overrides; they are checked by {@link InboxSettings.Builder#build()} (which knows
     * the values they are combined with).
     *
     * @return the topic settings
     */
    public TopicSettings build() {
      return new TopicSettings(this);
    }
  }
}
