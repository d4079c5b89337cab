package dev.outboxrelay.inbox;

import java.time.Duration;

/**
 * The record in hand failed only with infrastructure errors ({@link Inbox#isInfrastructureError})
 * for longer than {@link InboxSettings#outageBudget()}. It is not settled: its offset, and those
 * after it, must not be committed; a restarted consumer resumes with it. The cause is the last
 * infrastructure error.
 */
public class InboxOutageException extends InboxException {
  private static final long serialVersionUID = 1L;

  private final String topic;
  private final int partition;
  private final long offset;

  /**
   * @param topic the record's topic
   * @param partition its partition
   * @param offset its offset
   * @param budget the outage budget that ran out
   * @param cause the last infrastructure error
   */
  public InboxOutageException(
      String topic, int partition, long offset, Duration budget, Throwable cause) {
    super(
        "database outage longer than the outage budget ("
            + budget
            + ") at record "
            + topic
            + "-"
            + partition
            + "@"
            + offset
            + ", not settled: "
            + cause,
        cause);
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
  }

  /**
   * @return the unsettled record's topic
   */
  public String topic() {
    return topic;
  }

  /**
   * @return its partition
   */
  public int partition() {
    return partition;
  }

  /**
   * @return its offset
   */
  public long offset() {
    return offset;
  }
}
