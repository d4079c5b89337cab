package dev.outboxrelay.inbox;

import java.time.Duration;
import java.util.List;

/**
 * The per-topic settings in effect for one topic (inbox/CONTRACT.md, "Per-topic settings"): its
 * {@link TopicSettings} over the consumer-wide values, every field set. Given by {@link
 * InboxSettings#forTopic}, the one place the inbox and the runner read them.
 *
 * @param maxAttempts attempts per record before its next tier or dead letter
 * @param backoffInitial the wait after the first failed attempt
 * @param backoffMax the longest wait between attempts
 * @param retryTiers the retry tiers' delays, tier 1 first (empty: none)
 * @param gapPolicy what to do with a version gap
 * @param gapDeadline how long a parked record may wait for its predecessor
 * @param inboxRetention how long inbox rows are kept (read by {@code outbox-relay prune --inbox})
 */
public record EffectiveSettings(
    int maxAttempts,
    Duration backoffInitial,
    Duration backoffMax,
    List<Duration> retryTiers,
    GapPolicy gapPolicy,
    Duration gapDeadline,
    Duration inboxRetention) {

  /**
   * Copies the tiers.
   *
   * @param maxAttempts attempts per record
   * @param backoffInitial the first wait
   * @param backoffMax the longest wait
   * @param retryTiers the tiers' delays
   * @param gapPolicy the gap policy
   * @param gapDeadline the gap deadline
   * @param inboxRetention the inbox retention
   */
  public EffectiveSettings {
    retryTiers = List.copyOf(retryTiers);
  }

  /**
   * The wait after failed attempt {@code attempt}: {@code backoffInitial × 2^(attempt-1)}, capped
   * at {@code backoffMax}.
   *
   * @param attempt the failed attempt's number, from 1
   * @return the wait before the next attempt
   */
  public Duration backoff(int attempt) {
    int shift = Math.min(Math.max(attempt - 1, 0), 30);
    long millis = backoffInitial.toMillis();
    long capped = backoffMax.toMillis();
    long wait = millis > (capped >> shift) ? capped : millis << shift;
    return Duration.ofMillis(Math.min(wait, capped));
  }
}
