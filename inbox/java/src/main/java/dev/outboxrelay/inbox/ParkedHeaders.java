package dev.outboxrelay.inbox;

import java.util.Base64;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;

/**
 * The parked table's {@code record_headers} format (inbox/CONTRACT.md, "Tables"): a JSON array of
 * {@code [name, value]} pairs in the record's order, {@code value} the header's bytes in standard
 * base64, or {@code null} for a header without a value. The same text as the Rust, Go and Python
 * helpers write, so parked rows are interchangeable.
 */
final class ParkedHeaders {
  private ParkedHeaders() {}

  /**
   * @param headers a record's headers
   * @return their JSON text
   */
  static String encode(Headers headers) {
    StringBuilder out = new StringBuilder("[");
    boolean first = true;
    for (Header h : headers) {
      if (!first) {
        out.append(", ");
      }
      first = false;
      out.append('[');
      quote(out, h.key());
      out.append(", ");
      if (h.value() == null) {
        out.append("null");
      } else {
        out.append('"').append(Base64.getEncoder().encodeToString(h.value())).append('"');
      }
      out.append(']');
    }
    return out.append(']').toString();
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  /**
   * @param text the JSON text of {@link #encode}
   * @return the headers
   * @throws IllegalArgumentException the text is not such an array (the message says what is wrong)
   */
  static Headers decode(String text) {
    Parser p = new Parser(text);
    RecordHeaders headers = new RecordHeaders();
    p.expect('[');
    if (!p.take(']')) {
      do {
        p.expect('[');
        String name = p.string();
        if (name == null) {
          throw new IllegalArgumentException(
              "record_headers holds an item that is not a [name, value] pair");
        }
        p.expect(',');
        String value = p.string();
        p.expect(']');
        byte[] bytes;
        try {
          bytes = value == null ? null : Base64.getDecoder().decode(value);
        } catch (IllegalArgumentException e) {
          throw new IllegalArgumentException(
              "record_headers: header " + name + ": not base64 text", e);
        }
        headers.add(name, bytes);
      } while (p.take(','));
      p.expect(']');
    }
    p.end();
    return headers;
  }

  /** A strict reader of the little JSON the format needs: arrays, strings, {@code null}. */
  private static final class Parser {
    private final String s;
    private int i;

    Parser(String s) {
      this.s = s == null ? "" : s;
    }

    private void skip() {
      while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
        i++;
      }
    }

    boolean take(char c) {
      skip();
      if (i < s.length() && s.charAt(i) == c) {
        i++;
        return true;
      }
      return false;
    }

    void expect(char c) {
      if (!take(c)) {
        throw new IllegalArgumentException(
            "record_headers is not a JSON array of [name, value] pairs (at " + i + ")");
      }
    }

    void end() {
      skip();
      if (i != s.length()) {
        throw new IllegalArgumentException("record_headers: text after the array");
      }
    }

    /** A JSON string, or {@code null} for the literal {@code null}. */
    String string() {
      skip();
      if (s.startsWith("null", i)) {
        i += 4;
        return null;
      }
      expect('"');
      StringBuilder out = new StringBuilder();
      while (true) {
        if (i >= s.length()) {
          throw new IllegalArgumentException("record_headers: unterminated string");
        }
        char c = s.charAt(i++);
        if (c == '"') {
          return out.toString();
        }
        if (c != '\\') {
          out.append(c);
          continue;
        }
        if (i >= s.length()) {
          throw new IllegalArgumentException("record_headers: unterminated string");
        }
        char e = s.charAt(i++);
        switch (e) {
          case '"', '\\', '/' -> out.append(e);
          case 'b' -> out.append('\b');
          case 'f' -> out.append('\f');
          case 'n' -> out.append('\n');
          case 'r' -> out.append('\r');
          case 't' -> out.append('\t');
          case 'u' -> {
            if (i + 4 > s.length()) {
              throw new IllegalArgumentException("record_headers: bad \\u escape");
            }
            try {
              out.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
            } catch (NumberFormatException ex) {
              throw new IllegalArgumentException("record_headers: bad \\u escape", ex);
            }
            i += 4;
          }
          default -> throw new IllegalArgumentException("record_headers: bad escape \\" + e);
        }
      }
    }
  }
}
