package dev.outboxrelay.inbox;

/**
 * A failure that stops processing: a dead letter that could not be produced (it is never dropped),
 * an interrupted backoff, or a Kafka error of the runner. The record in hand is not settled and its
 * offset is not committed.
 */
public class InboxException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /**
   * @param message what failed
   * @param cause the underlying error, or {@code null}
   */
  public InboxException(String message, Throwable cause) {
    super(message, cause);
  }
}
