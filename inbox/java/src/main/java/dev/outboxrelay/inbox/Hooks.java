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
}
