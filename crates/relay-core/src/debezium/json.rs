//! JSON as the Java side of a Debezium pipeline reads and writes it: a tree like Jackson's
//! `ObjectMapper.readTree` builds ([`parse`]: integers as `int`, `long` or `BigInteger` by
//! size, other numbers as `double`, members in document order), Jackson's compact writer
//! ([`write_jackson`]: `UTF8JsonGenerator` with default features) and the string escaping of
//! Debezium's binlog JSON formatter ([`escape_debezium`], mysql-binlog-connector-java's
//! `JsonStringFormatter`).

use crate::debezium::java;

/// A JSON value as Jackson's tree model holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits Java's `int` (Jackson `IntNode`).
    Int(i32),
    /// An integer that fits Java's `long` but not `int` (`LongNode`).
    Long(i64),
    /// A larger integer, as its digits (`BigIntegerNode`).
    BigInt(String),
    /// A number with a fraction or an exponent (`DoubleNode`).
    Double(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Node>),
    /// An object, members in document order (a repeated name keeps its first place and its
    /// last value, as Jackson's `ObjectNode` does).
    Object(Vec<(String, Node)>),
}

/// Parses JSON text into a [`Node`] tree (Jackson's `readTree`).
///
/// # Errors
/// A message naming the byte offset of the first syntax error.
pub fn parse(text: &str) -> Result<Node, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
        depth: 0,
    };
    p.ws();
    let node = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected text at byte {}", p.i));
    }
    Ok(node)
}

/// Jackson's default nesting limit (`StreamReadConstraints.DEFAULT_MAX_DEPTH`).
const MAX_DEPTH: usize = 1000;

struct Parser<'s> {
    s: &'s [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self
            .s
            .get(self.i)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn literal(&mut self, word: &[u8], node: Node) -> Result<Node, String> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(node)
        } else {
            self.err("invalid literal")
        }
    }

    fn value(&mut self) -> Result<Node, String> {
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'n') => self.literal(b"null", Node::Null),
            Some(b't') => self.literal(b"true", Node::Bool(true)),
            Some(b'f') => self.literal(b"false", Node::Bool(false)),
            Some(b'"') => self.string().map(Node::String),
            Some(b'[') => self.nested(|p| p.array()),
            Some(b'{') => self.nested(|p| p.object()),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => self.err("unexpected character"),
        }
    }

    fn nested(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<Node, String>,
    ) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("nesting deeper than 1000");
        }
        let node = f(self);
        self.depth -= 1;
        node
    }

    fn array(&mut self) -> Result<Node, String> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b']') {
            self.i += 1;
            return Ok(Node::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Node::Array(items));
                }
                _ => return self.err("expected ',' or ']'"),
            }
        }
    }

    fn object(&mut self) -> Result<Node, String> {
        self.i += 1;
        let mut members: Vec<(String, Node)> = Vec::new();
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Ok(Node::Object(members));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return self.err("expected a member name");
            }
            let name = self.string()?;
            self.ws();
            if self.s.get(self.i) != Some(&b':') {
                return self.err("expected ':'");
            }
            self.i += 1;
            self.ws();
            let value = self.value()?;
            match members.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => members.push((name, value)),
            }
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Node::Object(members));
                }
                _ => return self.err("expected ',' or '}'"),
            }
        }
    }

    fn hex4(&mut self) -> Result<u16, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u16::from_str_radix(h, 16).ok());
        match h {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => self.err("invalid \\u escape"),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut units: Vec<u16> = Vec::new();
        let mut out = String::new();
        loop {
            let Some(&b) = self.s.get(self.i) else {
                return self.err("unterminated string");
            };
            match b {
                b'"' => {
                    self.i += 1;
                    flush_units(&mut units, &mut out);
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let Some(&e) = self.s.get(self.i) else {
                        return self.err("unterminated escape");
                    };
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            // UTF-16 code units: a pair may be split over two escapes.
                            units.push(self.hex4()?);
                            continue;
                        }
                        _ => return self.err("invalid escape"),
                    };
                    flush_units(&mut units, &mut out);
                    out.push(c);
                }
                _ => {
                    flush_units(&mut units, &mut out);
                    // Copy the run of plain bytes (valid UTF-8: the input is a &str).
                    let start = self.i;
                    while self.s.get(self.i).is_some_and(|&c| c != b'"' && c != b'\\') {
                        self.i += 1;
                    }
                    out.push_str(&String::from_utf8_lossy(&self.s[start..self.i]));
                }
            }
        }
    }

    fn number(&mut self) -> Result<Node, String> {
        let start = self.i;
        let mut integral = true;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        let digits_start = self.i;
        while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        if self.i == digits_start {
            return self.err("invalid number");
        }
        if self.s.get(self.i) == Some(&b'.') {
            integral = false;
            self.i += 1;
            let f = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            if self.i == f {
                return self.err("invalid number");
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            integral = false;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            let e = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            if self.i == e {
                return self.err("invalid number");
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("0");
        if !integral {
            return text
                .parse::<f64>()
                .map(Node::Double)
                .or_else(|_| self.err("invalid number"));
        }
        Ok(match text.parse::<i64>() {
            Ok(v) => match i32::try_from(v) {
                Ok(v) => Node::Int(v),
                Err(_) => Node::Long(v),
            },
            // Jackson keeps the digits as BigInteger ("-0" stays an int above).
            Err(_) => Node::BigInt(canonical_integer(text)),
        })
    }
}

/// An integer's digits as `BigInteger.toString()` prints them (no leading zeros, `-` kept).
fn canonical_integer(text: &str) -> String {
    let (sign, digits) = match text.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", text),
    };
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        "0".into()
    } else {
        format!("{sign}{digits}")
    }
}

/// Appends the characters of UTF-16 `units` to `out` (an unpaired surrogate becomes U+FFFD).
fn flush_units(units: &mut Vec<u16>, out: &mut String) {
    if !units.is_empty() {
        out.extend(char::decode_utf16(units.drain(..)).map(|c| c.unwrap_or('\u{FFFD}')));
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The escape of an ASCII character both Jackson and Debezium's formatter use
/// (`CharTypes.sOutputEscapes128`), or `None` when it is written as it is.
fn ascii_escape(b: u8, out: &mut Vec<u8>) -> bool {
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x09 => b't',
        0x0c => b'f',
        0x0a => b'n',
        0x0d => b'r',
        0x00..=0x1f => {
            out.extend_from_slice(b"\\u00");
            out.push(HEX_UPPER[usize::from(b >> 4)]);
            out.push(HEX_UPPER[usize::from(b & 0xf)]);
            return true;
        }
        _ => return false,
    };
    out.push(b'\\');
    out.push(short);
    true
}

/// Appends `s` quoted as Debezium's binlog JSON formatter does (`JsonStringFormatter`):
/// `"`, `\` and control characters escaped (`\n` style where JSON has one, else `\u00XX`),
/// everything else as it is (UTF-8).
pub fn escape_debezium(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s.as_bytes() {
        if !ascii_escape(b, out) {
            out.push(b);
        }
    }
    out.push(b'"');
}

/// Appends `s` quoted as Jackson's `UTF8JsonGenerator` writes it with default features: ASCII
/// escapes as [`escape_debezium`], other BMP characters as UTF-8, and characters outside the
/// BMP as their two UTF-16 surrogates in `\uXXXX` escapes (`🎉` → `\uD83C\uDF89`:
/// `JsonWriteFeature.COMBINE_UNICODE_SURROGATES_IN_UTF8` is off by default).
pub fn escape_jackson(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        if c.is_ascii() {
            let b = c as u8;
            if !ascii_escape(b, out) {
                out.push(b);
            }
        } else if (c as u32) > 0xFFFF {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.extend_from_slice(b"\\u");
                for shift in [12, 8, 4, 0] {
                    out.push(HEX_UPPER[usize::from((*u >> shift) & 0xf)]);
                }
            }
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    out.push(b'"');
}

/// Whose JSON writer: Jackson's or Debezium's binlog JSON formatter's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Writer {
    Jackson,
    Debezium,
}

/// Appends `node` as Jackson writes it (`ObjectMapper.writeValueAsBytes`, default features:
/// no spaces, doubles as `Double.toString`).
pub fn write_jackson(node: &Node, out: &mut Vec<u8>) {
    write(node, out, Writer::Jackson);
}

/// `node` as Debezium's binlog JSON formatter would have written the same document read from
/// MySQL's binary JSON: compact, strings escaped by [`escape_debezium`], integers as they are,
/// doubles by [`java::debezium_json_double`]. Used for JSON text MySQL printed (which keeps
/// each double's shortest digits, so the double read back is the stored one).
pub fn write_debezium(node: &Node, out: &mut Vec<u8>) {
    write(node, out, Writer::Debezium);
}

fn write(node: &Node, out: &mut Vec<u8>, writer: Writer) {
    let string = |s: &str, out: &mut Vec<u8>| match writer {
        Writer::Jackson => escape_jackson(s, out),
        Writer::Debezium => escape_debezium(s, out),
    };
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Node::Int(v) => out.extend_from_slice(v.to_string().as_bytes()),
        Node::Long(v) => out.extend_from_slice(v.to_string().as_bytes()),
        Node::BigInt(d) => out.extend_from_slice(d.as_bytes()),
        Node::Double(d) => out.extend_from_slice(
            match writer {
                Writer::Jackson => java::double_to_string(*d),
                Writer::Debezium => java::debezium_json_double(*d),
            }
            .as_bytes(),
        ),
        Node::String(s) => string(s, out),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out, writer);
            }
            out.push(b']');
        }
        Node::Object(members) => {
            out.push(b'{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(name, out);
                out.push(b':');
                write(value, out, writer);
            }
            out.push(b'}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jackson(text: &str) -> String {
        let mut out = Vec::new();
        write_jackson(&parse(text).expect("valid JSON"), &mut out);
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn numbers_are_classified_as_jackson_does() {
        assert_eq!(parse("1").expect("valid"), Node::Int(1));
        assert_eq!(parse("-2147483648").expect("valid"), Node::Int(i32::MIN));
        assert_eq!(parse("2147483648").expect("valid"), Node::Long(2147483648));
        assert_eq!(
            parse("18446744073709551615").expect("valid"),
            Node::BigInt("18446744073709551615".into())
        );
        assert_eq!(parse("1.0").expect("valid"), Node::Double(1.0));
        assert_eq!(parse("1e21").expect("valid"), Node::Double(1e21));
        assert_eq!(parse("-0.0").expect("valid"), Node::Double(-0.0));
    }

    #[test]
    fn jackson_writes_compact_text_with_java_doubles() {
        assert_eq!(
            jackson("{\"a\": 1, \"b\": [1.5, 1e21, 0.1, 1e-7, 100.0], \"c\": null}"),
            "{\"a\":1,\"b\":[1.5,1.0E21,0.1,1.0E-7,100.0],\"c\":null}"
        );
        assert_eq!(jackson("{}"), "{}");
        assert_eq!(jackson("[]"), "[]");
    }

    #[test]
    fn jackson_escapes_controls_and_astral_characters() {
        assert_eq!(
            jackson(r#""a\"b\\c\n\u0001é🎉""#),
            "\"a\\\"b\\\\c\\n\\u0001é\\uD83C\\uDF89\""
        );
    }

    #[test]
    fn debezium_formatter_keeps_astral_characters_and_plain_doubles() {
        let mut out = Vec::new();
        write_debezium(
            &parse(r#"{"s": "🎉\u0007", "d": [1e21, 0.5, 12345678.5], "n": 18446744073709551615}"#)
                .expect("valid"),
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).expect("valid"),
            "{\"s\":\"🎉\\u0007\",\"d\":[1000000000000000000000,0.5,12345678.5],\"n\":18446744073709551615}"
        );
    }

    #[test]
    fn repeated_member_names_keep_the_first_place_and_the_last_value() {
        assert_eq!(jackson(r#"{"a":1,"b":2,"a":3}"#), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn surrogate_pairs_in_escapes_are_joined() {
        assert_eq!(
            parse(r#""\uD83C\uDF89""#).expect("valid"),
            Node::String("🎉".into())
        );
    }

    #[test]
    fn syntax_errors_name_the_offset() {
        for bad in ["{", "[1,]", "{\"a\" 1}", "01x", "\"abc", "tru", "1.", "-"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
