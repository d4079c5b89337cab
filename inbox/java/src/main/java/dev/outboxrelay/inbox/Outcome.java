package dev.outboxrelay.inbox;

import java.util.Locale;

/** How a record was settled by {@link Inbox#process}. Every outcome lets its offset move on. */
public enum Outcome {
  /** The handler ran and its change was committed together with the inbox row. */
  PROCESSED,
  /** The inbox already had the record's event key: acknowledged without running the handler. */
  DUPLICATE,
  /** Its version is not newer than the stored one: inbox row committed, handler not run. */
  STALE,
  /**
   * Its version skipped one (gap policy {@link GapPolicy#PARK}): stored in the parked table,
   * handler not run; applied by itself once the version before it is ({@link #RESUMED}).
   */
  PARKED,
  /** A parked record applied by itself once the version before it was (handler run). */
  RESUMED,
  /**
   * A parked record whose gap deadline passed, handed to {@link Hooks#onGapExpired} (which returned
   * {@code true}) instead of the dead-letter topic.
   */
  COMPENSATED,
  /**
   * Its attempts were used up and its topic has a retry tier left: a copy was sent to the next
   * tier's topic (inbox/CONTRACT.md, "Retry tiers"), to be processed again after the tier's delay.
   */
  RETRIED,
  /** Poison: sent to the dead-letter topic (attempts exhausted, or unusable at once). */
  DEAD_LETTERED;

  /**
   * The outcome's name as the contract writes it: {@code processed}, {@code duplicate}, {@code
   * stale}, {@code parked}, {@code resumed}, {@code compensated}, {@code retried} or {@code
   * dead_lettered}.
   *
   * @return the lower-case name
   */
  public String label() {
    return name().toLowerCase(Locale.ROOT);
  }
}
