package dev.outboxrelay.inbox;

import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;

/**
 * The headers of a retry copy (inbox/CONTRACT.md, "Retry tiers") and how to read them. A record
 * without {@code retry_count} (or with a value that is not a positive integer) is not a copy: tier
 * 0.
 */
public final class RetryHeaders {
  /** The tier the copy is in, from 1 (decimal). */
  public static final String RETRY_COUNT = "retry_count";

  /** When the copy may be processed: ms since the Unix epoch (decimal). */
  public static final String RETRY_AT = "retry_at";

  /** The last failed attempt's error text. */
  public static final String RETRY_ERROR = "retry_error";

  /** A JSON array, one object per tier left behind, oldest first. */
  public static final String RETRY_HISTORY = "retry_history";

  /** The first record's topic. */
  public static final String ORIGINAL_TOPIC = "original_topic";

  /** The first record's partition (decimal). */
  public static final String ORIGINAL_PARTITION = "original_partition";

  /** The first record's offset (decimal). */
  public static final String ORIGINAL_OFFSET = "original_offset";

  private RetryHeaders() {}

  /**
   * @param record a record
   * @return its tier: its {@code retry_count} header, 0 when absent or not a positive integer
   */
  public static int retryCount(ConsumerRecord<?, ?> record) {
    Long n = number(record, RETRY_COUNT);
    return n == null || n < 0 || n > Integer.MAX_VALUE ? 0 : n.intValue();
  }

  /**
   * @param record a record
   * @return when it may be processed (ms since the epoch) when it is a copy with a {@code retry_at}
   *     header, else {@code null}
   */
  public static Long retryAt(ConsumerRecord<?, ?> record) {
    return retryCount(record) > 0 ? number(record, RETRY_AT) : null;
  }

  /**
   * @param record a record
   * @return the first record's topic: its {@code original_topic} header, else its own topic
   */
  public static String originalTopic(ConsumerRecord<?, ?> record) {
    String t = text(record, ORIGINAL_TOPIC);
    return t == null || t.isEmpty() ? record.topic() : t;
  }

  /**
   * @param record a record
   * @return the first record's partition: its {@code original_partition} header, else its own
   */
  public static int originalPartition(ConsumerRecord<?, ?> record) {
    Long p = number(record, ORIGINAL_PARTITION);
    return p == null || p < 0 || p > Integer.MAX_VALUE ? record.partition() : p.intValue();
  }

  /**
   * @param record a record
   * @return the first record's offset: its {@code original_offset} header, else its own
   */
  public static long originalOffset(ConsumerRecord<?, ?> record) {
    Long o = number(record, ORIGINAL_OFFSET);
    return o == null || o < 0 ? record.offset() : o;
  }

  static String text(ConsumerRecord<?, ?> record, String name) {
    Header h = record.headers().lastHeader(name);
    return h == null || h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8);
  }

  private static Long number(ConsumerRecord<?, ?> record, String name) {
    String t = text(record, name);
    if (t == null) {
      return null;
    }
    try {
      return Long.parseLong(t.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }

  /**
   * {@code history} (a JSON array, or {@code null}/not an array: {@code []}) with one more object.
   */
  static String appendHistory(
      String history,
      String topic,
      int partition,
      long offset,
      int attempts,
      String error,
      long failedAt) {
    String entry =
        "{\"topic\":"
            + quote(topic)
            + ",\"partition\":"
            + partition
            + ",\"offset\":"
            + offset
            + ",\"attempts\":"
            + attempts
            + ",\"error\":"
            + quote(error)
            + ",\"failed_at\":"
            + failedAt
            + "}";
    String h = history == null ? "" : history.trim();
    if (h.length() >= 2 && h.startsWith("[") && h.endsWith("]")) {
      String inner = h.substring(1, h.length() - 1).trim();
      return inner.isEmpty() ? "[" + entry + "]" : "[" + inner + "," + entry + "]";
    }
    return "[" + entry + "]";
  }

  /** A JSON string literal. */
  static String quote(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (char c : (s == null ? "" : s).toCharArray()) {
      switch (c) {
        case '"' -> b.append("\\\"");
        case '\\' -> b.append("\\\\");
        case '\n' -> b.append("\\n");
        case '\r' -> b.append("\\r");
        case '\t' -> b.append("\\t");
        default -> {
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
        }
      }
    }
    return b.append('"').toString();
  }
}
