package dev.outboxrelay.inbox;

import java.sql.Connection;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The consumer's business logic for one record.
 *
 * <p>It makes its database change through {@code tx}: a connection with auto-commit off and the
 * inbox row already inserted in its open transaction. It must neither commit, roll back nor close
 * it. Throwing any exception rolls back the whole attempt (inbox row and business change); the
 * record is retried with backoff, then dead-lettered with the exception's message as reason. An
 * exception that is, or has as a cause, an infrastructure error ({@link
 * Inbox#isInfrastructureError}: e.g. the driver's {@code SQLException} of a deadlock or a lost
 * connection thrown on) is not counted as an attempt: the record is redone, up to the outage
 * budget. Throw an exception without it as cause to make the failure count.
 */
@FunctionalInterface
public interface Handler {
  /**
   * Applies one record.
   *
   * @param tx the open transaction's connection (do not commit or close)
   * @param record the Kafka record (raw key and value bytes, headers)
   * @throws Exception any failure: the attempt is rolled back and retried
   */
  void handle(Connection tx, ConsumerRecord<byte[], byte[]> record) throws Exception;
}
