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
  /** Its version skipped one (gap policy {@link GapPolicy#PARK}): sent to the dead-letter topic. */
  PARKED,
  /** Poison: sent to the dead-letter topic (attempts exhausted, or unusable at once). */
  DEAD_LETTERED;

  /**
   * The outcome's name as the contract writes it: {@code processed}, {@code duplicate}, {@code
   * stale}, {@code parked} or {@code dead_lettered}.
   *
   * @return the lower-case name
   */
  public String label() {
    return name().toLowerCase(Locale.ROOT);
  }
}
