package dev.outboxrelay.inbox;

import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * Observation points of {@link Inbox#process}, for metrics and tracing. Both do nothing by default;
 * they run on the processing thread.
 */
public interface Hooks {
  /** Hooks that do nothing. */
  Hooks NONE = new Hooks() {};

  /**
   * Runs after the handler returned, before the database commit (in every attempt that gets so
   * far). Throwing makes the attempt fail: it is rolled back and retried.
   *
   * @param record the record being processed
   * @throws Exception fails the attempt
   */
  default void beforeCommit(ConsumerRecord<byte[], byte[]> record) throws Exception {}

  /**
   * Runs once per record after its database transaction ended (and its dead letter, if any, was
   * acknowledged), whatever the outcome, before the Kafka offset may be committed. An exception
   * propagates out of {@link Inbox#process}: the record then counts as not settled.
   *
   * @param record the record
   * @param result its outcome and the attempts made
   */
  default void afterCommit(ConsumerRecord<byte[], byte[]> record, Result result) {}

  /**
   * The compensation hook: called by the parked sweep for a parked record whose gap deadline
   * passed, instead of dead-lettering it, outside any inbox transaction. Return {@code true} when
   * it compensated: the parked row is deleted and the outcome is {@link Outcome#COMPENSATED}
   * ({@link #afterCommit} is called with it). Return {@code false} (the default) to dead-letter the
   * record as usual. Throwing leaves the row parked: the next sweep calls it again.
   *
   * @param record the record rebuilt from the parked row (key, value, headers, topic, partition and
   *     offset as received)
   * @param parkedAt when it was parked
   * @return whether the record was compensated (else it is dead-lettered)
   * @throws Exception the row stays parked, retried at the next sweep
   */
  default boolean onGapExpired(ConsumerRecord<byte[], byte[]> record, java.time.Instant parkedAt)
      throws Exception {
    return false;
  }
}
