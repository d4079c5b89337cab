package dev.outboxrelay.inbox;

/** What to do with a record whose version is more than one ahead of the stored version. */
public enum GapPolicy {
  /** Dead-letter it at once (outcome {@link Outcome#PARKED}); the partition moves on. */
  PARK,
  /**
   * Count it as a failed attempt and retry with backoff (the earlier version may still be applied
   * meanwhile by someone else); dead-lettered after {@code maxAttempts}.
   */
  RETRY
}
