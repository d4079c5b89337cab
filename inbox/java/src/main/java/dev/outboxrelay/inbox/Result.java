package dev.outboxrelay.inbox;

/**
 * What {@link Inbox#process} did with one record.
 *
 * @param outcome how the record was settled
 * @param attempts database attempts made: 1 when settled at the first try, {@code maxAttempts} for
 *     a record dead-lettered after its retries, 0 for a record dead-lettered at once (no event key,
 *     invalid version); attempts ended by an infrastructure error ({@link
 *     Inbox#isInfrastructureError}) are not counted
 */
public record Result(Outcome outcome, int attempts) {}
