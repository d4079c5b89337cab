package dev.outboxrelay.inbox;

/** What to do with a record whose version is more than one ahead of the stored version. */
public enum GapPolicy {
  /**
   * Store it in the parked table (outcome {@link Outcome#PARKED}) and apply it by itself once the
   * version before it has been (outcome {@link Outcome#RESUMED}); past the gap deadline it is
   * dead-lettered (or handed to {@link Hooks#onGapExpired}). The default.
   */
  PARK,
  /**
   * Dead-letter it at once with reason {@code version gap: expected <stored+1>, got <version>}
   * (outcome {@link Outcome#DEAD_LETTERED}): what {@link #PARK} did before parked versions.
   */
  DEAD_LETTER,
  /**
   * Count it as a failed attempt and retry with backoff (the earlier version may still be applied
   * meanwhile by someone else); dead-lettered after {@code maxAttempts}.
   */
  RETRY
}
