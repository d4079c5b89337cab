//! MySQL's binary JSON rendered as text exactly as MySQL prints it.
//!
//! A `JSON` column reaches the binlog in MySQL's binary format (`json_binary.h`); mysql_common
//! exposes it as [`jsonb::Value`]. Its own conversion (`serde_json::Value::try_from`, then
//! `to_string()`) loses information and prints differently from MySQL: it refuses OPAQUE values
//! (DECIMAL, DATE, TIME, DATETIME, TIMESTAMP, BLOB/BIT...), prints `{"a":1}` without MySQL's
//! spaces and doubles its own way (`1.5e-7` where MySQL prints `0.00000015`,
//! `1000000000000000.0` where MySQL prints `1e15`); its `JsonDom` path (`Value::parse`) turns
//! decimals into strings and drops the line breaks MySQL puts in base64 text.
//! [`render_mysql_json`] produces, byte for byte, what
//! `SELECT json_col` returns on MySQL 8.0/8.4/9.x: `Json_wrapper::to_string()` in
//! `sql/json_dom.cc` (`wrapper_to_string`, not pretty). The rules, with their sources:
//!
//! * **Containers** (`wrapper_to_string`, `append_comma`): `[1, 2]`, `{"k": v, "k2": v2}`: `", "`
//!   between elements, `": "` after a key, `[]` and `{}` when empty, no other whitespace. Object
//!   members come out in the stored order (the binary format keeps keys sorted by length, then
//!   bytes: `json_binary.cc`, `Json_object` key order); they are not re-sorted here. At most
//!   [`MAX_DEPTH`] nested containers (`check_json_depth`, `JSON_DOCUMENT_MAX_DEPTH`).
//! * **Strings and keys** (`double_quote`, `escape_character` in `json_dom.cc`): in double
//!   quotes; `"` → `\"`, `\` → `\\`, 0x08 → `\b`, 0x09 → `\t`, 0x0A → `\n`, 0x0C → `\f`,
//!   0x0D → `\r`, other bytes up to 0x1F → `\u00xx` (lowercase hex). Everything else, `/`, 0x7F
//!   and all non-ASCII UTF-8, is copied raw (no `\u` escapes).
//! * **Integers** (`J_INT`/`J_UINT`: `append_longlong`/`append_ulonglong`): exact decimal,
//!   int16/int32/int64 and uint16/uint32/uint64 alike, up to 18446744073709551615.
//! * **Doubles** (`J_DOUBLE`): `my_gcvt(d, MY_GCVT_ARG_DOUBLE, MY_GCVT_MAX_FIELD_WIDTH, ...)`
//!   (`strings/dtoa.cc`), then `.0` appended when the result has neither `.` nor `e`
//!   ("distinguishable from integers"). `MY_GCVT_MAX_FIELD_WIDTH` is
//!   `DBL_DIG + 4 + max(5, MAX_DECPT_FOR_F_FORMAT)` = 34 (one less for a negative number).
//!   `my_gcvt` takes the digits of David Gay's `dtoa` in mode 4 with 33/34 digits, which for a
//!   double is the shortest string that reads back to the same double, the nearest to it when
//!   two qualify, ties to the even digit (exactly mode 0, Python's `repr`). With `decpt` the
//!   position of the decimal point (value = 0.DIGITS × 10^decpt) it uses plain notation when
//!   `-14 <= decpt <= 15` (or `decpt` = 16 with 17 digits) and `d.ddde±x` (no `+`, no padding
//!   of the exponent) otherwise: 1.5 → `1.5`, 3 → `3.0`, 0.1 → `0.1`, 1e14 → `100000000000000.0`,
//!   1e15 → `1e15`, 1e300 → `1e300`, 1.5e-7 → `0.00000015`, 1e-15 → `0.000000000000001`,
//!   1e-16 → `1e-16`, -0.0 → `-0.0`. A NaN or an infinity (which MySQL never stores) comes out
//!   as `my_gcvt`'s overflow text `0`, so `0.0`.
//! * **Literals**: `true`, `false`, `null`.
//! * **OPAQUE values** (`Json_wrapper::type()` maps the stored field type; `wrapper_to_string`):
//!   - `NEWDECIMAL` (246) → the number, unquoted, as `decimal2string` prints it: the stored
//!     scale's digits after the point (`12.50`, `9.00`, `0.5` → `0.50` at scale 2), no leading
//!     zeros, `0` before the point when there is no integer part. The data is precision, scale,
//!     then `decimal2bin` bytes (`Json_decimal::convert_from_binary`).
//!   - `DATE` (10) → `"2024-01-02"`; `TIME` (11) → `"12:34:56.000000"` (`-` when negative,
//!     hours at least two digits, may be more: `"838:59:59.000000"`); `DATETIME` (12) and
//!     `TIMESTAMP` (7) → `"2024-01-02 03:04:05.000000"`: always six fractional digits, whatever
//!     the precision of the original value (`my_TIME_to_str(t, ptr, 6)` in `sql-common/
//!     my_time.cc`), from the 8-byte packed value (`Json_datetime::from_packed`,
//!     `TIME_from_longlong_*_packed`).
//!   - `VAR_STRING` (253) → a JSON string of the data ("Treat strings saved in opaque as plain
//!     json strings").
//!   - anything else (BLOB 252, BIT 16, VARCHAR 15 for a binary string, GEOMETRY 255, the
//!     `*2` temporal types...) → `"base64:type<N>:<base64>"`: standard alphabet with `=`
//!     padding and, as `base64_encode` (`mysys/base64.cc`) does, a line break after every 76
//!     characters, which the string escaping turns into `\n`.
//! * **Large documents**: mysql_common reads both storage formats (small: 16-bit offsets, large:
//!   32-bit offsets, used by MySQL for containers of 64 KiB or more, with int32/uint32 inlined in
//!   the value entries); the rendering is the same.
//!
//! Two entry points walk the same rules. The decoder's, [`render_json_binary`], reads the
//! column's bytes in place (`json_binary.h`'s layout, every offset checked); the other,
//! [`render_mysql_json`], takes a value mysql_common has parsed (the conformance tool reads
//! rows through mysql_common). A property test holds the two to the same text.
//!
//! A partial JSON update (`binlog_row_value_options=PARTIAL_JSON`) logs only a diff
//! ([`BinlogValue::JsonDiff`]), not the document: [`render_binlog_json`] reports it as
//! [`JsonRenderError::PartialUpdate`].

use std::io;

use mysql_async::binlog::jsonb;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;

/// The deepest nesting of arrays and objects MySQL accepts and prints
/// (`JSON_DOCUMENT_MAX_DEPTH`); a deeper (corrupt) document is refused with
/// [`JsonRenderError::TooDeep`].
pub const MAX_DEPTH: usize = 100;

/// The longest text rendered for one document: 1 GiB, MySQL's largest `max_allowed_packet`
/// (MySQL stops printing a value longer than `max_allowed_packet` too). Only a corrupt document
/// whose offsets point many times at the same bytes can reach it.
pub const MAX_OUTPUT_LEN: usize = 1 << 30;

/// Why a JSON value cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonRenderError {
    /// The binary JSON is corrupt (bad offsets or lengths, unknown type, a DECIMAL or temporal
    /// value of the wrong size...). `path` is where in the document, e.g. `$.a[2]`.
    #[error("malformed binary JSON at {path}: {reason}")]
    Malformed {
        /// JSON path of the bad value (`$` is the document).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// More than [`MAX_DEPTH`] nested arrays/objects (MySQL cannot store such a document).
    #[error("binary JSON nested more than {} levels deep at {path}", MAX_DEPTH)]
    TooDeep {
        /// JSON path of the container that is one level too deep.
        path: String,
    },
    /// The rendered text would exceed [`MAX_OUTPUT_LEN`] bytes.
    #[error("rendered JSON text exceeds {} bytes", MAX_OUTPUT_LEN)]
    TooLarge,
    /// The column holds a partial JSON update, not a document.
    #[error(
        "the JSON column holds a partial update (a diff logged with \
         binlog_row_value_options=PARTIAL_JSON), not the document; the document text cannot be \
         rebuilt from the binlog row"
    )]
    PartialUpdate,
    /// The value is not a binary JSON value (not from a MySQL `JSON` column).
    #[error("not a MySQL binary JSON value")]
    NotJson,
}

impl JsonRenderError {
    fn malformed(reason: impl Into<String>) -> Self {
        Self::Malformed {
            path: "$".into(),
            reason: reason.into(),
        }
    }

    /// Prefixes the error's path with one leg (called while unwinding, innermost first).
    fn within(mut self, leg: &str) -> Self {
        if let Self::Malformed { path, .. } | Self::TooDeep { path } = &mut self {
            path.insert_str(1, leg);
        }
        self
    }
}

/// Appends the MySQL text of `value` to `out`.
///
/// # Errors
/// [`JsonRenderError::Malformed`], [`JsonRenderError::TooDeep`] or
/// [`JsonRenderError::TooLarge`]; `out` is then left as it was.
pub fn render_mysql_json(
    value: &jsonb::Value<'_>,
    out: &mut Vec<u8>,
) -> Result<(), JsonRenderError> {
    render_limited(value, out, MAX_OUTPUT_LEN)
}

/// The MySQL text of `value` (see [`render_mysql_json`]).
///
/// # Errors
/// As [`render_mysql_json`].
pub fn render_mysql_json_to_vec(value: &jsonb::Value<'_>) -> Result<Vec<u8>, JsonRenderError> {
    // Rendered into a buffer kept per thread, then copied once at its final size: growing a
    // new vector from empty reallocated it about eight times for a 500-byte document.
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    /// A larger buffer is not kept for the next document (one large document must not pin
    /// its size for the thread's life).
    const KEEP: usize = 64 * 1024;
    SCRATCH.with(|scratch| {
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            // Not reentrant in practice; a nested call renders on its own.
            let mut out = Vec::new();
            render_mysql_json(value, &mut out)?;
            return Ok(out);
        };
        scratch.clear();
        let rendered = render_mysql_json(value, &mut scratch).map(|()| scratch.to_vec());
        if scratch.capacity() > KEEP {
            *scratch = Vec::new();
        }
        rendered
    })
}

/// The MySQL text of a JSON column value from a binlog row: what the decoder stores for a
/// [`BinlogValue::Jsonb`].
///
/// # Errors
/// [`JsonRenderError::PartialUpdate`] for a [`BinlogValue::JsonDiff`],
/// [`JsonRenderError::NotJson`] for a [`BinlogValue::Value`], else as [`render_mysql_json`].
pub fn render_binlog_json(value: &BinlogValue<'_>) -> Result<Vec<u8>, JsonRenderError> {
    match value {
        BinlogValue::Jsonb(v) => render_mysql_json_to_vec(v),
        BinlogValue::JsonDiff(_) => Err(JsonRenderError::PartialUpdate),
        BinlogValue::Value(_) => Err(JsonRenderError::NotJson),
    }
}

/// The MySQL text of a JSON column value as a binlog row image holds it: `doc` is the
/// column's bytes after their 4-byte length (a type byte, then the value, `json_binary.h`;
/// empty = `null`). Appends to `out`; the text is [`render_mysql_json`]'s for the same bytes.
///
/// # Errors
/// [`JsonRenderError::Malformed`], [`JsonRenderError::TooDeep`] or
/// [`JsonRenderError::TooLarge`]; `out` is then left as it was.
pub fn render_json_binary(doc: &[u8], out: &mut Vec<u8>) -> Result<(), JsonRenderError> {
    render_document(doc, out, MAX_OUTPUT_LEN, Style::Mysql)
}

/// The MySQL text of a JSON column's bytes (see [`render_json_binary`]), in a vector sized
/// for it up front (the text of a document is about as long as its binary form).
///
/// # Errors
/// As [`render_json_binary`].
pub fn render_json_binary_to_vec(doc: &[u8]) -> Result<Vec<u8>, JsonRenderError> {
    let mut out = Vec::with_capacity(doc.len() + doc.len() / 4 + 16);
    render_json_binary(doc, &mut out)?;
    Ok(out)
}

/// The text Debezium's MySQL connector gives a JSON column's bytes ([`render_json_binary`]
/// says what `doc` is), as mysql-binlog-connector-java's `JsonBinary.parseAsString` with
/// `JsonStringFormatter` prints it: no spaces, strings escaped only where JSON requires it
/// (`\u00XX` in upper case), doubles as Java's `Double.toString` or, when that has an exponent,
/// their exact plain decimal, dates and times without zero fractions, other opaque values as
/// plain base64. For the Debezium profile.
///
/// # Errors
/// As [`render_json_binary`].
pub fn render_json_binary_debezium(doc: &[u8]) -> Result<Vec<u8>, JsonRenderError> {
    let mut out = Vec::with_capacity(doc.len() + 16);
    render_document(doc, &mut out, MAX_OUTPUT_LEN, Style::Debezium)?;
    Ok(out)
}

fn render_document(
    doc: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
    style: Style,
) -> Result<(), JsonRenderError> {
    render_with(out, limit, style, |r| r.document(doc))
}

fn render_limited(
    value: &jsonb::Value<'_>,
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<(), JsonRenderError> {
    render_styled(value, out, limit, Style::Mysql)
}

fn render_styled(
    value: &jsonb::Value<'_>,
    out: &mut Vec<u8>,
    limit: usize,
    style: Style,
) -> Result<(), JsonRenderError> {
    render_with(out, limit, style, |r| r.value(value, 0))
}

/// Runs `render` appending to `out`, which is left as it was on an error.
fn render_with(
    out: &mut Vec<u8>,
    limit: usize,
    style: Style,
    render: impl FnOnce(&mut Renderer<'_>) -> Result<(), JsonRenderError>,
) -> Result<(), JsonRenderError> {
    let start = out.len();
    let mut renderer = Renderer {
        out,
        start,
        limit,
        style,
    };
    let result = render(&mut renderer);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Whose text: MySQL's (`SELECT`) or Debezium's binlog JSON formatter's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Mysql,
    Debezium,
}

struct Renderer<'o> {
    out: &'o mut Vec<u8>,
    start: usize,
    limit: usize,
    style: Style,
}

impl Renderer<'_> {
    /// `depth`: containers around `v` (MySQL's `depth` argument of `wrapper_to_string`).
    fn value(&mut self, v: &jsonb::Value<'_>, depth: usize) -> Result<(), JsonRenderError> {
        match v {
            jsonb::Value::Null => self.out.extend_from_slice(b"null"),
            jsonb::Value::Bool(true) => self.out.extend_from_slice(b"true"),
            jsonb::Value::Bool(false) => self.out.extend_from_slice(b"false"),
            jsonb::Value::I16(x) => write_int(self.out, *x),
            jsonb::Value::I32(x) => write_int(self.out, *x),
            jsonb::Value::I64(x) => write_int(self.out, *x),
            jsonb::Value::U16(x) => write_int(self.out, *x),
            jsonb::Value::U32(x) => write_int(self.out, *x),
            jsonb::Value::U64(x) => write_int(self.out, *x),
            jsonb::Value::F64(x) => self.double(*x),
            jsonb::Value::String(s) => self.quoted(s.str_raw()),
            jsonb::Value::SmallArray(a) => self.array(a.iter(), depth)?,
            jsonb::Value::LargeArray(a) => self.array(a.iter(), depth)?,
            jsonb::Value::SmallObject(o) => self.object(o.iter(), depth)?,
            jsonb::Value::LargeObject(o) => self.object(o.iter(), depth)?,
            jsonb::Value::Opaque(o) => self.opaque(o.value_type(), o.data_raw())?,
        }
        if self.out.len() - self.start > self.limit {
            return Err(JsonRenderError::TooLarge);
        }
        Ok(())
    }

    fn array<'v>(
        &mut self,
        items: impl Iterator<Item = io::Result<jsonb::Value<'v>>>,
        depth: usize,
    ) -> Result<(), JsonRenderError> {
        let depth = enter(depth)?;
        self.out.push(b'[');
        for (i, item) in items.enumerate() {
            let leg = || format!("[{i}]");
            let item =
                item.map_err(|e| JsonRenderError::malformed(e.to_string()).within(&leg()))?;
            if i > 0 {
                self.separator();
            }
            self.value(&item, depth).map_err(|e| e.within(&leg()))?;
        }
        self.out.push(b']');
        Ok(())
    }

    fn object<'v>(
        &mut self,
        members: impl Iterator<Item = io::Result<(jsonb::ObjectKey<'v>, jsonb::Value<'v>)>>,
        depth: usize,
    ) -> Result<(), JsonRenderError> {
        let depth = enter(depth)?;
        self.out.push(b'{');
        for (i, member) in members.enumerate() {
            let (key, item) = member
                .map_err(|e| JsonRenderError::malformed(format!("object member #{i}: {e}")))?;
            if i > 0 {
                self.separator();
            }
            self.quoted(key.value_raw());
            self.colon();
            self.value(&item, depth)
                .map_err(|e| e.within(&member_leg(key.value_raw())))?;
        }
        self.out.push(b'}');
        Ok(())
    }

    fn double(&mut self, x: f64) {
        match self.style {
            Style::Mysql => write_double(self.out, x),
            Style::Debezium => self.out.extend_from_slice(
                outbox_relay_core::debezium::java::debezium_json_double(x).as_bytes(),
            ),
        }
    }

    // Separators: a constant slice per style, so the copy is a store rather than a `memcpy`
    // call of a length only known at run time.
    fn separator(&mut self) {
        match self.style {
            Style::Mysql => self.out.extend_from_slice(b", "),
            Style::Debezium => self.out.push(b','),
        }
    }

    /// Between an object member's key and its value.
    fn colon(&mut self) {
        match self.style {
            Style::Mysql => self.out.extend_from_slice(b": "),
            Style::Debezium => self.out.push(b':'),
        }
    }

    /// A JSON string: MySQL's `double_quote`, or Debezium's `JsonStringFormatter.appendString`
    /// (of the bytes read as UTF-8, invalid sequences replaced as Java's `new String` does).
    fn quoted(&mut self, bytes: &[u8]) {
        match self.style {
            Style::Mysql => write_quoted(self.out, bytes),
            Style::Debezium => {
                outbox_relay_core::debezium::json::escape_debezium(
                    &String::from_utf8_lossy(bytes),
                    self.out,
                );
            }
        }
    }

    /// An opaque value as Debezium's formatter prints it: DECIMAL as `BigDecimal.toPlainString`
    /// (MySQL's digits and scale), DATE `YYYY-MM-DD`, TIME `[-]HH:MM:SS[.f]`, DATETIME and
    /// TIMESTAMP `YYYY-MM-DD HH:MM:SS[.f]` (fraction without trailing zeros, none when 0),
    /// anything else as a string of plain base64.
    fn opaque_debezium(&mut self, ty: ColumnType, data: &[u8]) -> Result<(), JsonRenderError> {
        match ty {
            ColumnType::MYSQL_TYPE_NEWDECIMAL | ColumnType::MYSQL_TYPE_DECIMAL => {
                write_decimal(self.out, data).map_err(JsonRenderError::malformed)
            }
            ColumnType::MYSQL_TYPE_DATE
            | ColumnType::MYSQL_TYPE_TIME
            | ColumnType::MYSQL_TYPE_TIME2
            | ColumnType::MYSQL_TYPE_DATETIME
            | ColumnType::MYSQL_TYPE_DATETIME2
            | ColumnType::MYSQL_TYPE_TIMESTAMP
            | ColumnType::MYSQL_TYPE_TIMESTAMP2 => {
                let packed = <[u8; 8]>::try_from(data).map_err(|_| {
                    JsonRenderError::malformed(format!(
                        "{ty:?} value of {} bytes (a packed temporal value has 8)",
                        data.len()
                    ))
                })?;
                let mut text = Vec::new();
                let base = match ty {
                    ColumnType::MYSQL_TYPE_TIME2 => ColumnType::MYSQL_TYPE_TIME,
                    ColumnType::MYSQL_TYPE_DATETIME2 | ColumnType::MYSQL_TYPE_TIMESTAMP2 => {
                        ColumnType::MYSQL_TYPE_DATETIME
                    }
                    ty => ty,
                };
                write_temporal(&mut text, base, i64::from_le_bytes(packed));
                // MySQL's form ends in `.ffffff` (but DATE): Debezium trims the fraction.
                if let Some(dot) = text.iter().rposition(|&b| b == b'.') {
                    while text.last() == Some(&b'0') {
                        text.pop();
                    }
                    if text.len() == dot + 1 {
                        text.truncate(dot);
                    }
                }
                self.out.push(b'"');
                self.out.extend_from_slice(&text);
                self.out.push(b'"');
                Ok(())
            }
            _ => {
                self.out.push(b'"');
                write_base64_plain(self.out, data);
                self.out.push(b'"');
                Ok(())
            }
        }
    }

    /// An OPAQUE value: the MySQL column type `ty` it was stored from, and its data.
    fn opaque(&mut self, ty: ColumnType, data: &[u8]) -> Result<(), JsonRenderError> {
        if self.style == Style::Debezium {
            return self.opaque_debezium(ty, data);
        }
        match ty {
            ColumnType::MYSQL_TYPE_NEWDECIMAL => {
                write_decimal(self.out, data).map_err(JsonRenderError::malformed)
            }
            ty @ (ColumnType::MYSQL_TYPE_DATE
            | ColumnType::MYSQL_TYPE_TIME
            | ColumnType::MYSQL_TYPE_DATETIME
            | ColumnType::MYSQL_TYPE_TIMESTAMP) => {
                let packed = <[u8; 8]>::try_from(data).map_err(|_| {
                    JsonRenderError::malformed(format!(
                        "{ty:?} value of {} bytes (a packed temporal value has 8)",
                        data.len()
                    ))
                })?;
                self.out.push(b'"');
                write_temporal(self.out, ty, i64::from_le_bytes(packed));
                self.out.push(b'"');
                Ok(())
            }
            ColumnType::MYSQL_TYPE_VAR_STRING => {
                write_quoted(self.out, data);
                Ok(())
            }
            ty => {
                let mut text = Vec::with_capacity(16 + data.len() / 3 * 4 + data.len() / 57 + 4);
                text.extend_from_slice(b"base64:type");
                write_int(&mut text, u64::from(ty as u8));
                text.push(b':');
                write_base64(&mut text, data);
                write_quoted(self.out, &text);
                Ok(())
            }
        }
    }
}

/// MySQL's binary JSON value types (`json_binary.h`, `JSONB_TYPE_*`).
mod jsonb_type {
    pub const SMALL_OBJECT: u8 = 0x00;
    pub const LARGE_OBJECT: u8 = 0x01;
    pub const SMALL_ARRAY: u8 = 0x02;
    pub const LARGE_ARRAY: u8 = 0x03;
    pub const LITERAL: u8 = 0x04;
    pub const INT16: u8 = 0x05;
    pub const UINT16: u8 = 0x06;
    pub const INT32: u8 = 0x07;
    pub const UINT32: u8 = 0x08;
    pub const INT64: u8 = 0x09;
    pub const UINT64: u8 = 0x0a;
    pub const DOUBLE: u8 = 0x0b;
    pub const STRING: u8 = 0x0c;
    pub const OPAQUE: u8 = 0x0f;
}

/// The walk over the binary format itself, for a JSON column's bytes as the row image holds
/// them ([`render_json_binary`]): the layout of `json_binary.h` read in place, every offset
/// and length checked against the bytes of its container, each value written as it is met.
/// The same text as [`Renderer::value`] over mysql_common's parse of the same bytes (a
/// property test holds the two together), at a fraction of the work: no intermediate value
/// per element, no `io::Result` per step.
impl Renderer<'_> {
    /// A whole document: its type byte, then its value; no bytes at all is `null` (as MySQL
    /// reads an empty JSON column value).
    fn document(&mut self, doc: &[u8]) -> Result<(), JsonRenderError> {
        match doc.split_first() {
            None => {
                self.out.extend_from_slice(b"null");
                Ok(())
            }
            Some((&ty, value)) => self.binary(ty, value, 0),
        }
    }

    /// The value of type `ty` whose bytes start at `data[0]` (`data` runs to the end of the
    /// enclosing container, or of the document). `depth`: containers around it.
    fn binary(&mut self, ty: u8, data: &[u8], depth: usize) -> Result<(), JsonRenderError> {
        use jsonb_type::*;
        match ty {
            SMALL_OBJECT => self.container::<false>(data, true, depth)?,
            LARGE_OBJECT => self.container::<true>(data, true, depth)?,
            SMALL_ARRAY => self.container::<false>(data, false, depth)?,
            LARGE_ARRAY => self.container::<true>(data, false, depth)?,
            LITERAL => match data.first() {
                Some(0) => self.out.extend_from_slice(b"null"),
                Some(1) => self.out.extend_from_slice(b"true"),
                Some(2) => self.out.extend_from_slice(b"false"),
                Some(other) => {
                    return Err(JsonRenderError::malformed(format!(
                        "unknown literal {other:#04x} (0 null, 1 true, 2 false)"
                    )))
                }
                None => return Err(short("literal")),
            },
            INT16 => write_int(self.out, i16::from_le_bytes(fixed(data, "int16")?)),
            UINT16 => write_int(self.out, u16::from_le_bytes(fixed(data, "uint16")?)),
            INT32 => write_int(self.out, i32::from_le_bytes(fixed(data, "int32")?)),
            UINT32 => write_int(self.out, u32::from_le_bytes(fixed(data, "uint32")?)),
            INT64 => write_int(self.out, i64::from_le_bytes(fixed(data, "int64")?)),
            UINT64 => write_int(self.out, u64::from_le_bytes(fixed(data, "uint64")?)),
            DOUBLE => self.double(f64::from_le_bytes(fixed(data, "double")?)),
            STRING => {
                let (len, rest) = variable_length(data)?;
                let bytes = rest.get(..len).ok_or_else(|| {
                    JsonRenderError::malformed(format!(
                        "string of {len} bytes where {} remain",
                        rest.len()
                    ))
                })?;
                self.quoted(bytes);
            }
            OPAQUE => {
                let (&column_type, rest) = data.split_first().ok_or_else(|| short("opaque"))?;
                let column_type = ColumnType::try_from(column_type).map_err(|_| {
                    JsonRenderError::malformed(format!(
                        "opaque value of unknown column type {column_type}"
                    ))
                })?;
                let (len, rest) = variable_length(rest)?;
                let bytes = rest.get(..len).ok_or_else(|| {
                    JsonRenderError::malformed(format!(
                        "opaque value of {len} bytes where {} remain",
                        rest.len()
                    ))
                })?;
                self.opaque(column_type, bytes)?;
            }
            other => {
                return Err(JsonRenderError::malformed(format!(
                    "unknown value type {other:#04x}"
                )))
            }
        }
        if self.out.len() - self.start > self.limit {
            return Err(JsonRenderError::TooLarge);
        }
        Ok(())
    }

    /// An object or array (`json_binary.h`: element count, byte size, then for an object one
    /// key entry per member — key offset, 2-byte key length — then one value entry per element
    /// — type byte, then the value's offset or, for literals and 16-bit integers (and 32-bit
    /// ones in the large format), the value itself). Offsets and sizes take 2 bytes in the
    /// small format and 4 in the large one, and count from the container's first byte.
    fn container<const LARGE: bool>(
        &mut self,
        data: &[u8],
        object: bool,
        depth: usize,
    ) -> Result<(), JsonRenderError> {
        let depth = enter(depth)?;
        // The format as a constant: each entry's offsets are then loads of a known width.
        let word = if LARGE { 4 } else { 2 };
        let count = offset_at(data, 0, LARGE)?;
        let size = offset_at(data, word, LARGE)?;
        let data = data.get(..size).ok_or_else(|| {
            JsonRenderError::malformed(format!(
                "container of {size} bytes where {} remain",
                data.len()
            ))
        })?;
        let key_entry = if object { word + 2 } else { 0 };
        let value_entry = 1 + word;
        let values_at = 2 * word + count.saturating_mul(key_entry);
        let header = count.saturating_mul(value_entry).saturating_add(values_at);
        if header > size {
            return Err(JsonRenderError::malformed(format!(
                "{count} elements do not fit in a container of {size} bytes"
            )));
        }
        // Both entry tables lie within the header, checked above: walked as exact chunks, an
        // entry's fields are read without a bounds check each.
        let value_entries = data[values_at..header].chunks_exact(value_entry);
        let mut key_entries = data[2 * word..values_at].chunks_exact(key_entry.max(1));
        self.out.push(if object { b'{' } else { b'[' });
        for (i, entry) in value_entries.enumerate() {
            if i > 0 {
                self.separator();
            }
            let mut key: &[u8] = &[];
            if object {
                let key_fields = key_entries.next().unwrap_or_default();
                let key_offset = offset_at(key_fields, 0, LARGE)?;
                let key_len = usize::from(u16::from_le_bytes(fixed(
                    key_fields.get(word..).unwrap_or_default(),
                    "key length",
                )?));
                key = data
                    .get(key_offset..key_offset.saturating_add(key_len))
                    .filter(|_| key_offset >= header)
                    .ok_or_else(|| {
                        JsonRenderError::malformed(format!(
                            "object member #{i}: key of {key_len} bytes at offset {key_offset} \
                             outside the keys of a {size}-byte object"
                        ))
                    })?;
                self.quoted(key);
                self.colon();
            }
            let (&ty, slot) = entry.split_first().unwrap_or((&0, &[]));
            let inlined = matches!(
                ty,
                jsonb_type::LITERAL | jsonb_type::INT16 | jsonb_type::UINT16
            ) || (LARGE && matches!(ty, jsonb_type::INT32 | jsonb_type::UINT32));
            let result = if inlined {
                self.binary(ty, slot, depth)
            } else {
                let at = offset_at(slot, 0, LARGE)?;
                match data.get(at..).filter(|_| at >= header) {
                    Some(value) => self.binary(ty, value, depth),
                    None => Err(JsonRenderError::malformed(format!(
                        "value offset {at} outside the values of a {size}-byte container"
                    ))),
                }
            };
            if let Err(e) = result {
                return Err(if object {
                    e.within(&member_leg(key))
                } else {
                    e.within(&format!("[{i}]"))
                });
            }
        }
        self.out.push(if object { b'}' } else { b']' });
        Ok(())
    }
}

/// The error for a value cut short by the end of its bytes.
#[cold]
fn short(what: &str) -> JsonRenderError {
    JsonRenderError::malformed(format!("{what} value cut short"))
}

/// The first `N` bytes of `data`.
#[inline]
fn fixed<const N: usize>(data: &[u8], what: &str) -> Result<[u8; N], JsonRenderError> {
    data.get(..N)
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or_else(|| short(what))
}

/// The offset or size at `at`: 2 bytes little-endian in the small format, 4 in the large one.
/// Inlined: a container reads two or three of these per element.
#[inline]
fn offset_at(data: &[u8], at: usize, large: bool) -> Result<usize, JsonRenderError> {
    let rest = data.get(at..).unwrap_or_default();
    let n = if large {
        u32::from_le_bytes(fixed(rest, "offset")?)
    } else {
        u32::from(u16::from_le_bytes(fixed(rest, "offset")?))
    };
    usize::try_from(n).map_err(|_| JsonRenderError::malformed("offset beyond the address space"))
}

/// A string's or opaque value's length (`json_binary.cc` `read_variable_length`): 7 bits per
/// byte, low bits first, the high bit set on every byte but the last, at most 5 bytes (a
/// 32-bit length). Returns the length and the bytes after it.
fn variable_length(data: &[u8]) -> Result<(usize, &[u8]), JsonRenderError> {
    let mut len: u64 = 0;
    for (i, &b) in data.iter().take(5).enumerate() {
        len |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let len = u32::try_from(len)
                .ok()
                .and_then(|l| usize::try_from(l).ok())
                .ok_or_else(|| JsonRenderError::malformed("length above 4 GiB"))?;
            return Ok((len, &data[i + 1..]));
        }
    }
    Err(JsonRenderError::malformed(
        "variable-length size cut short or longer than 5 bytes",
    ))
}

/// One level deeper, or [`JsonRenderError::TooDeep`] (MySQL's `check_json_depth(++depth)`).
fn enter(depth: usize) -> Result<usize, JsonRenderError> {
    let depth = depth + 1;
    if depth > MAX_DEPTH {
        return Err(JsonRenderError::TooDeep { path: "$".into() });
    }
    Ok(depth)
}

/// `.key`, or `."key"` when the key is not an identifier (MySQL's JSON path syntax).
fn member_leg(key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    let identifier = key.chars().next().is_some_and(|c| !c.is_ascii_digit())
        && key
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '$');
    if identifier {
        format!(".{key}")
    } else {
        let mut quoted = Vec::new();
        write_quoted(&mut quoted, key.as_bytes());
        format!(".{}", String::from_utf8_lossy(&quoted))
    }
}

/// MySQL's `double_quote`: the bytes in double quotes, escaping `"`, `\` and bytes <= 0x1F.
#[inline]
fn write_quoted(out: &mut Vec<u8>, bytes: &[u8]) {
    // Object keys and most short values: tested and copied a word at a time.
    if let Some(quoted) = quoted_short(bytes) {
        out.extend_from_slice(&quoted);
        out.truncate(out.len() - (SHORT - bytes.len()));
        return;
    }
    write_quoted_long(out, bytes);
}

/// [`write_quoted`] of a string longer than [`SHORT`] or one that needs an escape: kept out of
/// line so that the short path's caller saves no registers for it.
#[inline(never)]
fn write_quoted_long(out: &mut Vec<u8>, bytes: &[u8]) {
    // Most strings need no escape: one scan (which the compiler vectorizes) and one copy, not
    // a branch per byte (this was 4.6 % of the relay's CPU draining a MySQL backlog).
    if needs_escape(bytes) {
        write_escaped(out, bytes);
        return;
    }
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    out.extend_from_slice(bytes);
    out.push(b'"');
}

/// The longest string [`quoted_short`] takes.
const SHORT: usize = 16;

/// `bytes` in double quotes at the start of an 18-byte block (`"` fills the rest), when they
/// are at most [`SHORT`] long and need no escape; `None` otherwise. The bytes are read and
/// written as one or two words ([`needs_escape`]'s loads for a string's last 0-15 bytes), and
/// the caller copies the whole block and then drops the `SHORT - len` bytes past the closing
/// quote: a fixed-size copy is two stores, where a copy of a length known only at run time is
/// a `memcpy` call costing more than the rest of the string's work.
#[inline]
fn quoted_short(bytes: &[u8]) -> Option<[u8; SHORT + 2]> {
    let n = bytes.len();
    let mut block = [b'"'; SHORT + 2];
    let word = if n > SHORT {
        return None;
    } else if n >= 8 {
        let (first, last) = (le_u64(&bytes[..8]), le_u64(&bytes[n - 8..]));
        block[1..9].copy_from_slice(&first.to_le_bytes());
        block[n - 7..n + 1].copy_from_slice(&last.to_le_bytes());
        if word_escapes(first) {
            return None;
        }
        last
    } else if n >= 4 {
        let (first, last) = (le_u32(&bytes[..4]), le_u32(&bytes[n - 4..]));
        block[1..5].copy_from_slice(&first.to_le_bytes());
        block[n - 3..n + 1].copy_from_slice(&last.to_le_bytes());
        u64::from(first) | u64::from(last) << 32
    } else if n > 0 {
        let (first, middle, last) = (bytes[0], bytes[n / 2], bytes[n - 1]);
        block[1] = first;
        block[1 + n / 2] = middle;
        block[n] = last;
        const PAD: u64 = 0x4141_4141_4100_0000; // five `A`s above three bytes
        PAD | u64::from(first) | u64::from(middle) << 8 | u64::from(last) << 16
    } else {
        return Some(block);
    };
    (!word_escapes(word)).then_some(block)
}

/// [`write_quoted`] of bytes that need an escape.
#[cold]
fn write_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut plain = 0; // start of the run of bytes copied as they are
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0x0f)],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i]);
        out.extend_from_slice(escape);
        plain = i + 1;
    }
    out.extend_from_slice(&bytes[plain..]);
    out.push(b'"');
}

/// Whether `bytes` hold a byte that a JSON string escapes (a control character, `"`, `\\`).
/// Whole 16-byte chunks are tested without an early exit, which the compiler turns into
/// vector compares (`Iterator::any` over bytes stays a branch per byte). The last 0-15 bytes
/// (all of an object key, usually) go through one or two 8-byte words ([`word_escapes`]):
/// two overlapping loads for 8-15 bytes, two overlapping 4-byte halves for 4-7, and for 1-3
/// the first, middle and last byte padded with `A`, which needs no escape.
#[inline]
fn needs_escape(bytes: &[u8]) -> bool {
    let escapes = |b: u8| (b < 0x20) | (b == b'"') | (b == b'\\');
    let mut chunks = bytes.chunks_exact(16);
    for chunk in &mut chunks {
        if chunk.iter().fold(false, |hit, &b| hit | escapes(b)) {
            return true;
        }
    }
    let rest = chunks.remainder();
    let n = rest.len();
    let word = if n >= 8 {
        if word_escapes(le_u64(&rest[..8])) {
            return true;
        }
        le_u64(&rest[n - 8..])
    } else if n >= 4 {
        u64::from(le_u32(&rest[..4])) | u64::from(le_u32(&rest[n - 4..])) << 32
    } else if n > 0 {
        const PAD: u64 = 0x4141_4141_4100_0000; // five `A`s above three bytes
        PAD | u64::from(rest[0]) | u64::from(rest[n / 2]) << 8 | u64::from(rest[n - 1]) << 16
    } else {
        return false;
    };
    word_escapes(word)
}

/// Whether one of the 8 bytes of `x` is below 0x20, `"` or `\\`: the word-at-a-time tests of
/// Bit Twiddling Hacks ("Determine if a word has a byte less than n", exact for n <= 128, and
/// "has a zero byte" of `x` XOR the byte repeated). Each test may flag bytes above a true hit
/// but never flags a word without one, so the answer for the word is exact.
#[inline]
fn word_escapes(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below_space = x.wrapping_sub(ONES * 0x20) & !x;
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    (below_space | zero_quote | zero_backslash) & HIGH != 0
}

/// The first 8 bytes of `b` (at least 8), little-endian.
#[inline]
fn le_u64(b: &[u8]) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&b[..8]);
    u64::from_le_bytes(word)
}

/// The first 4 bytes of `b` (at least 4), little-endian.
#[inline]
fn le_u32(b: &[u8]) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&b[..4]);
    u32::from_le_bytes(word)
}

/// `n` in decimal (`-` for a negative one). (A hand-written fixed-block variant was measured
/// on 2026-12-07 and gave no gain beyond the instruction count's noise: itoa stays.)
fn write_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `MY_GCVT_MAX_FIELD_WIDTH`: `DBL_DIG + 4 + max(5, MAX_DECPT_FOR_F_FORMAT)`.
const MY_GCVT_MAX_FIELD_WIDTH: i32 = 15 + 4 + 15;
/// `MAX_DECPT_FOR_F_FORMAT` = `DBL_DIG`.
const MAX_DECPT_FOR_F_FORMAT: i32 = 15;

/// A JSON double as MySQL prints it: `my_gcvt(x, MY_GCVT_ARG_DOUBLE, 34)` plus `.0` when that
/// has neither a point nor an exponent.
fn write_double(out: &mut Vec<u8>, x: f64) {
    if !x.is_finite() {
        // dtoa's DTOA_OVERFLOW: my_gcvt prints "0" (no sign); the JSON code appends ".0".
        out.extend_from_slice(b"0.0");
        return;
    }
    let mut width = MY_GCVT_MAX_FIELD_WIDTH;
    if x < 0.0 {
        width -= 1; // "We want to remove '-' from equations early"
    }
    let (digits, decpt) = shortest_digits(x.abs());
    let digits = digits.as_slice();
    let len = digits.len() as i32;
    // Characters of the exponent in the 'e' format, without its sign.
    let exp_len =
        1 + i32::from(decpt >= 101 || decpt <= -99) + i32::from(decpt >= 11 || decpt <= -9);
    let f_len = if decpt <= 0 {
        len - decpt + 2
    } else if decpt < len {
        len + 1
    } else {
        decpt
    };
    let have_space = f_len <= width;
    let force_e_format = decpt <= 0 && width <= 2 - decpt && width >= 3 + exp_len;
    // my_gcvt: (have_space || (decpt <= width && (decpt >= -1 || (decpt == -2 &&
    // (len > 1 || !force_e_format))) && !force_e_format)) && (...); the inner
    // `(len > 1 || !force_e_format)` always holds next to `!force_e_format`.
    let f_format = (have_space
        || (decpt <= width && (decpt >= -1 || decpt == -2) && !force_e_format))
        && (!have_space
            || (decpt > -MAX_DECPT_FOR_F_FORMAT
                && (decpt <= MAX_DECPT_FOR_F_FORMAT || len > decpt)));
    // With a field of 33 or 34 characters and at most 17 digits, my_gcvt never has to re-round
    // to fewer digits in either format, so its truncation branches do not apply here.
    if x.is_sign_negative() {
        out.push(b'-'); // dtoa reports the sign of -0.0 too
    }
    if f_format {
        if decpt <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', decpt.unsigned_abs() as usize));
            out.extend_from_slice(digits);
        } else if decpt < len {
            let (whole, fraction) = digits.split_at(decpt as usize);
            out.extend_from_slice(whole);
            out.push(b'.');
            out.extend_from_slice(fraction);
        } else {
            // An integral value: MySQL's JSON code appends `.0` to it.
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', (decpt - len) as usize));
            out.extend_from_slice(b".0");
        }
    } else {
        out.push(digits[0]);
        if len > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        let exp = decpt - 1;
        if exp < 0 {
            out.push(b'-');
        }
        write_int(out, u64::from(exp.unsigned_abs()));
    }
}

/// The digits of Gay's `dtoa(x, 0)` for a finite `x >= 0` and `decpt` (x = 0.DIGITS ×
/// 10^decpt): the shortest digit string that reads back as `x`, the nearest to `x` when two of
/// that length do, ties to the even digit. `0` gives (`0`, 1) as dtoa does.
///
/// Rust's shortest formatting gives the right length but, on an exact tie, rounds the last
/// digit up where dtoa takes the even one (2^-25 = 2.98023223876953125e-8: Rust
/// `...7695313`, dtoa `...7695312`); so the value is also rounded correctly (ties to even) to
/// that many digits and that is used whenever it reads back as `x`.
fn shortest_digits(x: f64) -> (Digits, i32) {
    if x == 0.0 || !x.is_finite() {
        let mut digits = Digits::default();
        digits.push(b'0');
        return (digits, 1);
    }
    short_decimal(x).unwrap_or_else(|| ryu_digits(x))
}

/// [`shortest_digits`] of a finite `x > 0` below 10^15 that is a decimal of at most 15 digits
/// and 15 decimals (a price, an amount, a quantity: most doubles in documents), found with one
/// multiplication and one division per decimal instead of Ryu and a parse of its text (about
/// a twentieth of a MySQL outbox row's decoding, for one such number); `None` for any other
/// (1e15 and above go to Ryu even with one significant digit).
///
/// Why it is dtoa's answer: the decimals `m / 10^k` are tried for k = 0, 1, … with `m` the
/// integer nearest `x·10^k`; `m / 10^k == x` (both exact below 2^53 and 10^22, so the division
/// is the correctly rounded value of the decimal) says the decimal reads back as `x`. The
/// first k that does gives the fewest significant digits (a shorter decimal would read back
/// at a smaller k), and with at most 15 digits no other decimal of that length reads back as
/// `x` (two such decimals are further apart than the reals that round to `x`), so there is no
/// tie to break.
fn short_decimal(x: f64) -> Option<(Digits, i32)> {
    const LIMIT: f64 = 1e15; // 15 digits
    let mut scale = 1.0f64;
    for k in 0..=15 {
        let scaled = x * scale;
        if scaled >= LIMIT {
            return None;
        }
        // Nearest integer without `f64::round`, a libm call on baseline x86-64 that every
        // digit of a non-short double paid: below 2^50 the sum is exact or off by a rounding
        // that only makes the read-back below fail at this k.
        let m = (scaled + 0.5) as u64;
        if m as f64 / scale == x {
            // 1 <= m < 10^15.
            let mut m = m;
            let len = m.checked_ilog10()? as i32 + 1;
            while m.is_multiple_of(10) {
                m /= 10;
            }
            let mut digits = Digits::default();
            let n = m.ilog10() as usize + 1;
            digits.len = n;
            for slot in digits.buf[..n].iter_mut().rev() {
                *slot = b'0' + (m % 10) as u8;
                m /= 10;
            }
            return Some((digits, len - k));
        }
        scale *= 10.0;
    }
    None
}

/// [`shortest_digits`] of any finite `x > 0`, by Ryu and the tie rule [`shortest_digits`] gives.
fn ryu_digits(x: f64) -> (Digits, i32) {
    use std::fmt::Write as _;
    let mut digits = Digits::default();
    // Ryu's shortest digits (a quarter of the time of `{:e}`, which ran for every double of
    // every document): `d.ddd`, `0.000ddd` or `d.ddde±x`.
    let mut ryu = ryu::Buffer::new();
    let decpt = read_digits(ryu.format_finite(x).as_bytes(), &mut digits);
    while digits.len > 1 && digits.as_slice().last() == Some(&b'0') {
        digits.len -= 1;
    }
    // With at most 15 digits (DBL_DIG) no tie is possible: n-digit decimals are then further
    // apart than the interval of reals that round to `x`, so the one inside it (the shortest)
    // is also the nearest. Only 16- and 17-digit values are formatted again, to the nearest
    // of their length, kept when it reads back.
    let n = digits.len;
    if n <= 15 {
        return (digits, decpt);
    }
    let mut nearest = Digits::default();
    let _ = write!(nearest, "{x:.*e}", n.saturating_sub(1));
    let text = nearest.as_slice();
    let reads_back = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        == Some(x);
    if !reads_back {
        return (digits, decpt);
    }
    let mut near = Digits::default();
    let decpt = read_digits(text, &mut near);
    while near.len > 1 && near.as_slice().last() == Some(&b'0') {
        near.len -= 1;
    }
    (near, decpt)
}

/// The significant digits of a number printed as `d.ddd`, `0.000ddd`, `ddd` or `d.ddde±x`
/// (ryu's and Rust's `{:e}` forms), pushed to `digits` without leading zeros; returns
/// `decpt` (the number = 0.DIGITS × 10^decpt). One pass over the text: it runs for every
/// double of every document, and parsing the exponent through `str::parse` and searching the
/// text three times cost a third of the double's time.
fn read_digits(text: &[u8], digits: &mut Digits) -> i32 {
    // Digits before the point (or before the exponent when there is no point), counted while
    // pushing; leading zeros move the point right.
    let mut before_point: i32 = 0;
    let mut seen_point = false;
    let mut leading_zeros: i32 = 0;
    let mut exponent: i32 = 0;
    for (i, &c) in text.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                if !seen_point {
                    before_point += 1;
                }
                if digits.len == 0 && c == b'0' {
                    leading_zeros += 1;
                } else {
                    digits.push(c);
                }
            }
            b'.' => seen_point = true,
            b'e' | b'E' => {
                let (negative, rest) = match &text[i + 1..] {
                    [b'-', rest @ ..] => (true, rest),
                    [b'+', rest @ ..] => (false, rest),
                    rest => (false, rest),
                };
                for &d in rest.iter().take(4) {
                    exponent = exponent * 10 + i32::from(d.wrapping_sub(b'0') % 10);
                }
                if negative {
                    exponent = -exponent;
                }
                break;
            }
            _ => {}
        }
    }
    before_point + exponent - leading_zeros
}

/// Up to 40 bytes of formatted number text, on the stack; what does not fit is dropped (a
/// double's `{:e}` forms have at most 17 digits, a sign, a point and a 4-character exponent).
#[derive(Clone, Copy)]
struct Digits {
    buf: [u8; 40],
    len: usize,
}

impl Default for Digits {
    fn default() -> Self {
        Self {
            buf: [0; 40],
            len: 0,
        }
    }
}

impl Digits {
    fn push(&mut self, c: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = c;
            self.len += 1;
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for Digits {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - self.len;
        if s.len() > room {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len();
        Ok(())
    }
}

/// Bytes used by a group of 0..=9 decimal digits in MySQL's binary DECIMAL (`dig2bytes`).
const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];

/// A JSON DECIMAL (precision, scale, `decimal2bin` bytes) as `decimal2string` prints it.
fn write_decimal(out: &mut Vec<u8>, data: &[u8]) -> Result<(), String> {
    let [precision, scale, bin @ ..] = data else {
        return Err(format!("DECIMAL value of {} bytes", data.len()));
    };
    let size = decimal_bin_size(*precision, *scale)?;
    if bin.len() != size {
        return Err(format!(
            "DECIMAL({precision},{scale}) of {} bytes, expected {size}",
            bin.len()
        ));
    }
    let (negative, int_digits, frac_digits) = decimal_digits(*precision, *scale, bin)?;
    if negative {
        out.push(b'-');
    }
    let int_digits = int_digits.trim_start_matches('0');
    out.extend_from_slice(if int_digits.is_empty() {
        b"0"
    } else {
        int_digits.as_bytes()
    });
    if *scale > 0 {
        out.push(b'.');
        out.extend_from_slice(frac_digits.as_bytes());
    }
    Ok(())
}

/// The digit groups of a binary DECIMAL(`precision`, `scale`): the integer part starts with its
/// partial group, the fraction ends with its partial group.
fn decimal_groups(precision: u8, scale: u8) -> Result<(Vec<usize>, Vec<usize>), String> {
    let (precision, scale) = (usize::from(precision), usize::from(scale));
    // MySQL's DECIMAL_MAX_PRECISION and DECIMAL_MAX_SCALE.
    if precision == 0 || precision > 65 || scale > 30 || scale > precision {
        return Err(format!(
            "DECIMAL with precision {precision} and scale {scale}"
        ));
    }
    let intg = precision - scale;
    let partial = |digits: usize| Some(digits % 9).filter(|&d| d > 0);
    let int_groups = partial(intg)
        .into_iter()
        .chain(std::iter::repeat_n(9, intg / 9))
        .collect();
    let frac_groups = std::iter::repeat_n(9, scale / 9)
        .chain(partial(scale))
        .collect();
    Ok((int_groups, frac_groups))
}

/// Bytes of a binary DECIMAL(`precision`, `scale`) (`decimal_bin_size`).
///
/// # Errors
/// A precision or scale MySQL does not allow.
pub(crate) fn decimal_bin_size(precision: u8, scale: u8) -> Result<usize, String> {
    let (int_groups, frac_groups) = decimal_groups(precision, scale)?;
    Ok(int_groups
        .iter()
        .chain(&frac_groups)
        .map(|&d| DIG2BYTES[d])
        .sum())
}

/// A binary DECIMAL(`precision`, `scale`) (`decimal2bin`, exactly
/// [`decimal_bin_size`] bytes) as its sign, integer digits (zero-padded) and fraction digits.
///
/// # Errors
/// A precision or scale MySQL does not allow, or a digit group with more digits than it holds.
pub(crate) fn decimal_digits(
    precision: u8,
    scale: u8,
    bin: &[u8],
) -> Result<(bool, String, String), String> {
    let (int_groups, frac_groups) = decimal_groups(precision, scale)?;
    // The sign is the first bit, inverted; a negative number has all its bits inverted.
    let negative = bin.first().is_some_and(|b| b & 0x80 == 0);
    let mask = if negative { 0xff } else { 0x00 };
    let mut pos = 0;
    let mut read_group = |digits: usize| -> Result<String, String> {
        let bytes = DIG2BYTES[digits];
        let group = bin
            .get(pos..pos + bytes)
            .ok_or_else(|| format!("DECIMAL of {} bytes is cut short", bin.len()))?;
        let mut value: u64 = 0;
        for (k, &b) in group.iter().enumerate() {
            let b = if pos + k == 0 { b ^ 0x80 } else { b };
            value = value << 8 | u64::from(b ^ mask);
        }
        pos += bytes;
        if value >= 10u64.pow(digits as u32) {
            return Err(format!(
                "DECIMAL digit group {value} has more than {digits} digits"
            ));
        }
        Ok(format!("{value:0digits$}"))
    };
    let mut int_digits = String::new();
    for &d in &int_groups {
        int_digits.push_str(&read_group(d)?);
    }
    let mut frac_digits = String::new();
    for &d in &frac_groups {
        frac_digits.push_str(&read_group(d)?);
    }
    Ok((negative, int_digits, frac_digits))
}

/// A packed DATE/TIME/DATETIME/TIMESTAMP as `my_TIME_to_str(t, to, 6)` prints it, after
/// `TIME_from_longlong_{date,time,datetime}_packed`.
fn write_temporal(out: &mut Vec<u8>, ty: ColumnType, packed: i64) {
    let negative = packed < 0;
    let tmp = packed.unsigned_abs();
    let second_part = tmp % (1 << 24);
    let int_part = tmp >> 24;
    if ty == ColumnType::MYSQL_TYPE_TIME {
        let hour = ((int_part >> 12) as u32) % (1 << 10);
        let minute = ((int_part >> 6) as u32) % (1 << 6);
        let second = (int_part as u32) % (1 << 6);
        if negative {
            out.push(b'-');
        }
        // my_time_to_str: hours zero-padded to two digits, possibly more.
        if hour < 10 {
            out.push(b'0');
        }
        write_int(out, u64::from(hour));
        out.push(b':');
        write_two_digits(out, u64::from(minute));
        out.push(b':');
        write_two_digits(out, u64::from(second));
        write_micros(out, second_part);
        return;
    }
    let ymd = int_part >> 17;
    let ym = ymd >> 5;
    let hms = int_part % (1 << 17);
    let year = u64::from((ym / 13) as u32);
    write_two_digits(out, year / 100);
    write_two_digits(out, year % 100);
    out.push(b'-');
    write_two_digits(out, ym % 13);
    out.push(b'-');
    write_two_digits(out, ymd % (1 << 5));
    if ty == ColumnType::MYSQL_TYPE_DATE {
        return; // my_date_to_str: no time, no fraction
    }
    out.push(b' ');
    write_two_digits(out, hms >> 12);
    out.push(b':');
    write_two_digits(out, (hms >> 6) % (1 << 6));
    out.push(b':');
    write_two_digits(out, hms % (1 << 6));
    write_micros(out, second_part);
}

/// `format_two_digits`: `00` for a value over 99.
fn write_two_digits(out: &mut Vec<u8>, value: u64) {
    let value = if value >= 100 { 0 } else { value };
    out.push(b'0' + (value / 10) as u8);
    out.push(b'0' + (value % 10) as u8);
}

/// `my_useconds_to_str(to, useconds, 6)`: `.` and the last six digits.
fn write_micros(out: &mut Vec<u8>, micros: u64) {
    let micros = micros % 1_000_000;
    out.push(b'.');
    let mut digits = [b'0'; 6];
    let mut rest = micros;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    out.extend_from_slice(&digits);
}

/// Java's `Base64.getEncoder()`: standard alphabet, `=` padding, no line breaks.
fn write_base64_plain(out: &mut Vec<u8>, data: &[u8]) {
    let mut wrapped = Vec::with_capacity(data.len() / 3 * 4 + 8);
    write_base64(&mut wrapped, data);
    out.extend(wrapped.into_iter().filter(|&b| b != b'\n'));
}

/// MySQL's `base64_encode`: standard alphabet, `=` padding, `\n` after every 76 characters
/// when more follow.
fn write_base64(out: &mut Vec<u8>, data: &[u8]) {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (i, chunk) in data.chunks(3).enumerate() {
        if i > 0 && i % 19 == 0 {
            out.push(b'\n'); // 19 groups of 4 = 76 characters per line
        }
        let b0 = u32::from(chunk[0]);
        let b1 = chunk.get(1).copied().map_or(0, u32::from);
        let b2 = chunk.get(2).copied().map_or(0, u32::from);
        let c = b0 << 16 | b1 << 8 | b2;
        out.push(TABLE[(c >> 18 & 0x3f) as usize]);
        out.push(TABLE[(c >> 12 & 0x3f) as usize]);
        out.push(if chunk.len() > 1 {
            TABLE[(c >> 6 & 0x3f) as usize]
        } else {
            b'='
        });
        out.push(if chunk.len() > 2 {
            TABLE[(c & 0x3f) as usize]
        } else {
            b'='
        });
    }
}

#[cfg(test)]
mod tests {

    use mysql_async::binlog::events::{EventData, RowsEventData};
    use mysql_async::binlog::jsonb::{JsonbString, OpaqueValue};
    use mysql_common::io::ParseBuf;
    use proptest::prelude::*;

    use super::*;

    // ---------------------------------------------------------------------------------------
    // A test-only encoder for MySQL's binary JSON, written from the format description in
    // MySQL's sql-common/json_binary.h: a type byte, then the value. Objects and arrays:
    // element count and byte size (2-byte fields in the small format, 4-byte in the large
    // one), then for objects one key entry per member (key offset, 2-byte key length), then one
    // value entry per element (type byte + offset, or the value itself when it fits: literals,
    // int16/uint16, and int32/uint32 in the large format), then the keys, then the values.
    // Offsets count from the first byte after the type byte. Strings and opaque data carry a
    // variable-length size (7 bits a byte, low bits first, high bit = more bytes follow);
    // opaque values start with their MySQL column type. Each container is small when it fits,
    // large otherwise (as json_binary.cc serializes).
    // ---------------------------------------------------------------------------------------

    const SMALL_OBJECT: u8 = 0x00;
    const LARGE_OBJECT: u8 = 0x01;
    const SMALL_ARRAY: u8 = 0x02;
    const LARGE_ARRAY: u8 = 0x03;
    const LITERAL: u8 = 0x04;
    const INT16: u8 = 0x05;
    const UINT16: u8 = 0x06;
    const INT32: u8 = 0x07;
    const UINT32: u8 = 0x08;
    const INT64: u8 = 0x09;
    const UINT64: u8 = 0x0a;
    const DOUBLE: u8 = 0x0b;
    const STRING: u8 = 0x0c;
    const OPAQUE: u8 = 0x0f;

    /// A JSON document as the test encoder stores it.
    #[derive(Debug, Clone, PartialEq)]
    enum Doc {
        Null,
        Bool(bool),
        I16(i16),
        U16(u16),
        I32(i32),
        U32(u32),
        I64(i64),
        U64(u64),
        F64(f64),
        Str(String),
        Arr(Vec<Doc>),
        /// Members in stored order.
        Obj(Vec<(String, Doc)>),
        /// MySQL column type and raw data.
        Opaque(u8, Vec<u8>),
    }

    fn varlen(out: &mut Vec<u8>, mut n: usize) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    /// The document's bytes: type byte and value.
    fn encode(doc: &Doc) -> Vec<u8> {
        encode_with(doc, false)
    }

    /// As [`encode`], with every container in the large format when `force_large`.
    fn encode_with(doc: &Doc, force_large: bool) -> Vec<u8> {
        let (ty, mut bytes) = encode_value(doc, force_large);
        bytes.insert(0, ty);
        bytes
    }

    /// Type byte and value bytes (for inlinable scalars: the bytes to inline).
    fn encode_value(doc: &Doc, force_large: bool) -> (u8, Vec<u8>) {
        match doc {
            Doc::Null => (LITERAL, vec![0x00]),
            Doc::Bool(true) => (LITERAL, vec![0x01]),
            Doc::Bool(false) => (LITERAL, vec![0x02]),
            Doc::I16(x) => (INT16, x.to_le_bytes().to_vec()),
            Doc::U16(x) => (UINT16, x.to_le_bytes().to_vec()),
            Doc::I32(x) => (INT32, x.to_le_bytes().to_vec()),
            Doc::U32(x) => (UINT32, x.to_le_bytes().to_vec()),
            Doc::I64(x) => (INT64, x.to_le_bytes().to_vec()),
            Doc::U64(x) => (UINT64, x.to_le_bytes().to_vec()),
            Doc::F64(x) => (DOUBLE, x.to_le_bytes().to_vec()),
            Doc::Str(s) => {
                let mut out = Vec::new();
                varlen(&mut out, s.len());
                out.extend_from_slice(s.as_bytes());
                (STRING, out)
            }
            Doc::Opaque(ty, data) => {
                let mut out = vec![*ty];
                varlen(&mut out, data.len());
                out.extend_from_slice(data);
                (OPAQUE, out)
            }
            Doc::Arr(items) => {
                let values: Vec<_> = items.iter().map(|d| encode_value(d, force_large)).collect();
                container(None, &values, force_large)
            }
            Doc::Obj(members) => {
                let keys: Vec<&[u8]> = members.iter().map(|(k, _)| k.as_bytes()).collect();
                let values: Vec<_> = members
                    .iter()
                    .map(|(_, d)| encode_value(d, force_large))
                    .collect();
                container(Some(&keys), &values, force_large)
            }
        }
    }

    fn container(
        keys: Option<&[&[u8]]>,
        values: &[(u8, Vec<u8>)],
        force_large: bool,
    ) -> (u8, Vec<u8>) {
        let object = keys.is_some();
        if !force_large {
            if let Some(bytes) = try_container(keys, values, false) {
                return (if object { SMALL_OBJECT } else { SMALL_ARRAY }, bytes);
            }
        }
        let bytes = try_container(keys, values, true).expect("fits the large format");
        (if object { LARGE_OBJECT } else { LARGE_ARRAY }, bytes)
    }

    fn try_container(
        keys: Option<&[&[u8]]>,
        values: &[(u8, Vec<u8>)],
        large: bool,
    ) -> Option<Vec<u8>> {
        let osz = if large { 4 } else { 2 };
        let offset = |out: &mut Vec<u8>, v: usize| -> Option<()> {
            if large {
                out.extend_from_slice(&u32::try_from(v).ok()?.to_le_bytes());
            } else {
                out.extend_from_slice(&u16::try_from(v).ok()?.to_le_bytes());
            }
            Some(())
        };
        let n = values.len();
        let header = 2 * osz + keys.map_or(0, |_| n * (osz + 2)) + n * (1 + osz);
        let mut tail = Vec::new();
        let mut key_entries = Vec::new();
        for key in keys.unwrap_or(&[]) {
            offset(&mut key_entries, header + tail.len())?;
            key_entries.extend_from_slice(&u16::try_from(key.len()).ok()?.to_le_bytes());
            tail.extend_from_slice(key);
        }
        let mut value_entries = Vec::new();
        for (ty, bytes) in values {
            value_entries.push(*ty);
            let inlined =
                matches!(*ty, LITERAL | INT16 | UINT16) || (large && matches!(*ty, INT32 | UINT32));
            if inlined {
                let mut slot = bytes.clone();
                slot.resize(osz, 0);
                value_entries.extend_from_slice(&slot);
            } else {
                offset(&mut value_entries, header + tail.len())?;
                tail.extend_from_slice(bytes);
            }
        }
        let mut out = Vec::new();
        offset(&mut out, n)?;
        offset(&mut out, header + tail.len())?;
        out.extend_from_slice(&key_entries);
        out.extend_from_slice(&value_entries);
        out.extend_from_slice(&tail);
        Some(out)
    }

    /// Members deduplicated (the last one wins, as in MySQL) and in MySQL's stored order:
    /// shorter keys first, then by bytes.
    fn mysql_object(members: Vec<(String, Doc)>) -> Doc {
        let mut unique: Vec<(String, Doc)> = Vec::new();
        for (k, v) in members {
            match unique.iter_mut().find(|(u, _)| *u == k) {
                Some(slot) => slot.1 = v,
                None => unique.push((k, v)),
            }
        }
        unique.sort_by(|(a, _), (b, _)| (a.len(), a.as_bytes()).cmp(&(b.len(), b.as_bytes())));
        Doc::Obj(unique)
    }

    fn parse(bytes: &[u8]) -> jsonb::Value<'_> {
        ParseBuf(bytes)
            .parse::<jsonb::Value<'_>>(())
            .expect("mysql_common parses the encoded document")
    }

    /// The text of a document's bytes, walked in place as the decoder does.
    fn render_bytes(bytes: &[u8]) -> Result<String, JsonRenderError> {
        let out = render_json_binary_to_vec(bytes)?;
        Ok(String::from_utf8(out).expect("UTF-8 output"))
    }

    /// The text of a document's bytes through mysql_common's parse.
    fn render_parsed(bytes: &[u8]) -> Result<String, JsonRenderError> {
        let out = render_mysql_json_to_vec(&parse(bytes))?;
        Ok(String::from_utf8(out).expect("UTF-8 output"))
    }

    fn render_doc(doc: &Doc) -> String {
        render_bytes(&encode(doc)).expect("renders")
    }

    fn render_scalar(v: jsonb::Value<'_>) -> String {
        String::from_utf8(render_mysql_json_to_vec(&v).expect("renders")).expect("UTF-8 output")
    }

    fn double(x: f64) -> String {
        render_scalar(jsonb::Value::F64(x))
    }

    fn opaque(ty: ColumnType, data: &[u8]) -> Result<String, JsonRenderError> {
        let v = jsonb::Value::Opaque(OpaqueValue::new(ty, data.to_vec()));
        render_mysql_json_to_vec(&v).map(|out| String::from_utf8(out).expect("UTF-8 output"))
    }

    // ---------------------------------------------------------------------------------------
    // Real MySQL binlogs.
    // ---------------------------------------------------------------------------------------

    /// Every JSON column value of every rows event of the fixture, in order, as
    /// "<event> <image>: <rendering or error>".
    fn fixture_json(name: &str) -> Vec<String> {
        let mut src = crate::binlog::fixtures::open(name);
        let mut seen = Vec::new();
        while let Some(ev) = src.next_event() {
            let ev = ev.unwrap_or_else(|e| panic!("{name}: {e}"));
            let Some(EventData::RowsEvent(rows)) = ev.event.read_data().expect("event data") else {
                continue;
            };
            let kind = match &rows {
                RowsEventData::WriteRowsEvent(_) => "write",
                RowsEventData::UpdateRowsEvent(_) => "update",
                RowsEventData::PartialUpdateRowsEvent(_) => "partial-update",
                _ => "other",
            };
            let tme = src.table_map(rows.table_id()).expect("table map");
            for row in rows.rows(tme) {
                let (before, after) = row.unwrap_or_else(|e| panic!("{name}: {e}"));
                for (image, row) in [("before", before), ("after", after)] {
                    let Some(row) = row else { continue };
                    for i in 0..row.len() {
                        let Some(v @ (BinlogValue::Jsonb(_) | BinlogValue::JsonDiff(_))) =
                            row.as_ref(i)
                        else {
                            continue;
                        };
                        let text = match render_binlog_json(v) {
                            Ok(t) => String::from_utf8(t).expect("UTF-8 output"),
                            Err(e) => format!("error {e:?}"),
                        };
                        seen.push(format!("{kind} {image}: {text}"));
                    }
                }
            }
        }
        seen
    }

    /// `mysql8-json.000001` (MySQL 8.0.31, tests/fixtures/binlogs/generate.sh):
    /// `test.t(id INT, json_col JSON, name VARCHAR(100) AS (json_col->>'$.name'), age INT AS
    /// (json_col->'$.age'))`. Rows 1-3 are inserted one per transaction, rows 4-8 in one
    /// statement; then `age + 1` for rows 1-6 (UPDATE_ROWS, full images), then `age = 99` for
    /// rows 1-3 with `binlog_row_image=MINIMAL` and `binlog_row_value_options=PARTIAL_JSON`
    /// (PARTIAL_UPDATE_ROWS: the before image has only the key, the after image a JSON diff,
    /// not a document). Every expected text is what MySQL itself printed for `SELECT json_col`
    /// after each step (`mysql8-json.000001.select`).
    #[test]
    fn fixture_json_binlog_renders_as_mysql_prints_it() {
        // `SELECT json_col` after the INSERTs, then after the first UPDATE (rows 1-6).
        let inserted = [
            r#"{"age": 24, "data": "xxxxxxxxxx", "name": "Joe"}"#,
            r#"{"age": 32, "list": ["a", [1, 2, {"deep": {"deeper": [null, {}]}}], [], {}], "name": "Sue"}"#,
            r#"{"age": 40, "name": "Pete", "ké\"y": 1, "escapes": "quote \" backslash \\ newline\ntab\tctrl\u0001 slash /", "unicode": "héllo wörld ✓ 日本 😀"}"#,
            r#"{"age": 1, "i16": -32768, "i32": -2147483648, "max": 9223372036854775807, "min": -9223372036854775808, "u16": 65535, "u32": 4294967295, "name": "ints", "umax": 18446744073709551615}"#,
            r#"{"d": [1.5, -0.0, 0.1, 3.0, 1e300, -2.5e-300, 1.7976931348623157e308, 5e-324, 1.2345678901234566e29], "age": 2, "name": "doubles"}"#,
            r#"{"f": false, "n": null, "t": true, "age": 3, "name": "literals"}"#,
            r#"[1, "two", 3.5, null, true, {"k": []}]"#,
            r#""just a string""#,
        ];
        let updated = [
            r#"{"age": 25, "data": "xxxxxxxxxx", "name": "Joe"}"#,
            r#"{"age": 33, "list": ["a", [1, 2, {"deep": {"deeper": [null, {}]}}], [], {}], "name": "Sue"}"#,
            r#"{"age": 41, "name": "Pete", "ké\"y": 1, "escapes": "quote \" backslash \\ newline\ntab\tctrl\u0001 slash /", "unicode": "héllo wörld ✓ 日本 😀"}"#,
            r#"{"age": 2, "i16": -32768, "i32": -2147483648, "max": 9223372036854775807, "min": -9223372036854775808, "u16": 65535, "u32": 4294967295, "name": "ints", "umax": 18446744073709551615}"#,
            r#"{"d": [1.5, -0.0, 0.1, 3.0, 1e300, -2.5e-300, 1.7976931348623157e308, 5e-324, 1.2345678901234566e29], "age": 3, "name": "doubles"}"#,
            r#"{"f": false, "n": null, "t": true, "age": 4, "name": "literals"}"#,
        ];
        let mut expected: Vec<String> = inserted
            .iter()
            .map(|t| format!("write after: {t}"))
            .collect();
        for (before, after) in inserted.iter().zip(updated) {
            expected.push(format!("update before: {before}"));
            expected.push(format!("update after: {after}"));
        }
        for _ in 0..3 {
            expected.push("partial-update after: error PartialUpdate".to_owned());
        }
        assert_eq!(fixture_json("mysql8-json.000001"), expected);
    }

    /// `mysql8-json-opaque.000001` (MySQL 8.0.31): `foo.test(a JSON)`, one row per WRITE_ROWS
    /// event, each holding a value JSON text has no form for, so MySQL stores it as an opaque
    /// value (column type + bytes) or as a DECIMAL/DATE/TIME/DATETIME in its packed form:
    /// `JSON_OBJECT('a', x'55')` (VARCHAR, i.e. a binary string), `CAST('2012-03-18' AS DATE)`,
    /// `CAST('2012-03-18 11:30:45' AS DATETIME)`, `CAST('87:31:46.654321' AS TIME(6))`,
    /// `CAST(123.456 AS DECIMAL(6,3))`, `CAST(9 AS DECIMAL(11,2))`, `CAST(-0.5 AS
    /// DECIMAL(4,2))`, `JSON_ARRAY(0, 1, true, false)`, NULL, a BIT(12) column `b'101010101010'`
    /// and `CAST(<BLOB x'00ff10'> AS JSON)` (`mysql8-json-opaque.000001.sql`). Expected: what
    /// MySQL printed for `SELECT a` (`mysql8-json-opaque.000001.select`). Note the TIME: MySQL
    /// 8.0.31 prints `71:31:46.654321` for the JSON of `CAST('87:31:46.654321' AS TIME(6))`,
    /// and the binlog holds the same packed value, so the relay prints what MySQL prints.
    #[test]
    fn fixture_json_opaque_binlog_renders_as_mysql_prints_it() {
        let expected = [
            r#"{"a": "base64:type15:VQ=="}"#,
            r#"{"b": "2012-03-18"}"#,
            r#"{"c": "2012-03-18 11:30:45.000000"}"#,
            r#"{"c": "71:31:46.654321"}"#,
            r#"{"d": 123.456}"#,
            r#"{"e": 9.00}"#,
            r#"{"e": -0.50}"#,
            r#"{"e": [0, 1, true, false]}"#,
            r#"{"e": null}"#,
            r#"{"f": "base64:type16:Cqo="}"#,
            r#""base64:type252:AP8Q""#,
        ]
        .map(|t| format!("write after: {t}"));
        assert_eq!(fixture_json("mysql8-json-opaque.000001"), expected);
    }

    // ---------------------------------------------------------------------------------------
    // Scalars. Expected texts follow the MySQL source quoted in the module documentation.
    // ---------------------------------------------------------------------------------------

    /// Digits: Python's `repr` (David Gay's dtoa, mode 0, as MySQL's dtoa.cc); layout:
    /// my_gcvt's choice between plain and exponent notation; then the `.0` rule.
    #[test]
    fn doubles_print_as_my_gcvt_plus_point_zero() {
        let cases: &[(f64, &str)] = &[
            (1.5, "1.5"),
            (3.0, "3.0"),
            (-3.0, "-3.0"),
            (0.1, "0.1"),
            (0.1 + 0.2, "0.30000000000000004"),
            (100.0, "100.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e300, "1e300"),
            (-1e300, "-1e300"),
            (1e14, "100000000000000.0"),
            (1e15, "1e15"),
            (1e21, "1e21"),
            (1e23, "1e23"),
            (8.41e21, "8.41e21"),
            (1234567890123456.7, "1234567890123456.8"), // decpt 16 with 17 digits: plain
            (123456789012345678.0, "1.2345678901234568e17"),
            (12345678901234567890.0, "1.2345678901234567e19"),
            (9007199254740993.0, "9.007199254740992e15"), // 16 digits, decpt 16: exponent
            (2251799813685248.5, "2251799813685248.5"),   // 17 digits, decpt 16: plain
            (0.00001, "0.00001"),
            (1.5e-7, "0.00000015"),
            (1e-15, "0.000000000000001"),
            (1e-16, "1e-16"),
            (-2.5e-20, "-2.5e-20"),
            (5e-324, "5e-324"),
            (5e-310, "5e-310"),
            (2.2250738585072014e-308, "2.2250738585072014e-308"),
            (f64::MAX, "1.7976931348623157e308"),
            // Exact ties: dtoa keeps the even digit (Python: 2.9802322387695312e-08,
            // 106905816501897.12) where Rust's shortest form ends in 3.
            (2f64.powi(-25), "0.000000029802322387695312"),
            (f64::from_bits(0x42d8_4ebc_cde3_a248), "106905816501897.12"),
            // my_gcvt's overflow text for what MySQL cannot store.
            (f64::NAN, "0.0"),
            (f64::INFINITY, "0.0"),
            (f64::NEG_INFINITY, "0.0"),
        ];
        for &(x, text) in cases {
            assert_eq!(double(x), text, "{x:e}");
        }
    }

    /// The short-decimal path gives Ryu's digits (themselves checked against dtoa above and
    /// by the fixtures) wherever it answers, and answers for the usual prices and amounts.
    fn same_digits_as_ryu(x: f64) -> Result<(), proptest::test_runner::TestCaseError> {
        if let Some((digits, decpt)) = short_decimal(x) {
            let (want, want_decpt) = ryu_digits(x);
            proptest::prop_assert_eq!(
                (digits.as_slice(), decpt),
                (want.as_slice(), want_decpt),
                "{:e} ({:#x})",
                x,
                x.to_bits()
            );
        }
        Ok(())
    }

    #[test]
    fn short_decimals_answer_for_prices_and_amounts() {
        for x in [
            123.45,
            0.05,
            0.1,
            19.99,
            120.0,
            1.0,
            7.0,
            0.3,
            1e14,
            999_999_999_999_999.0,
        ] {
            let (digits, decpt) = short_decimal(x).unwrap_or_else(|| panic!("{x} not taken"));
            let (want, want_decpt) = ryu_digits(x);
            assert_eq!(
                (digits.as_slice(), decpt),
                (want.as_slice(), want_decpt),
                "{x}"
            );
        }
        // 16 digits, or out of range: left to Ryu.
        for x in [0.1 + 0.2, 1e15, 1e-16, 5e-324, f64::MAX, 2f64.powi(-25)] {
            assert!(short_decimal(x).is_none(), "{x:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn short_decimals_are_ryus_digits(m in 1u64..1_000_000_000_000_000, k in 0u32..=17) {
            let x = m as f64 / 10f64.powi(k as i32);
            // At most 15 digits and 15 decimals: the fast path must answer.
            proptest::prop_assert!(k > 15 || short_decimal(x).is_some(), "{x:e} not taken");
            same_digits_as_ryu(x)?;
        }

        #[test]
        fn short_decimals_are_ryus_digits_for_any_double(bits in 1u64..0x7ff0_0000_0000_0000) {
            same_digits_as_ryu(f64::from_bits(bits))?;
        }
    }

    #[test]
    fn integers_are_exact() {
        assert_eq!(render_scalar(jsonb::Value::I16(i16::MIN)), "-32768");
        assert_eq!(render_scalar(jsonb::Value::U16(u16::MAX)), "65535");
        assert_eq!(render_scalar(jsonb::Value::I32(i32::MIN)), "-2147483648");
        assert_eq!(render_scalar(jsonb::Value::U32(u32::MAX)), "4294967295");
        assert_eq!(
            render_scalar(jsonb::Value::I64(i64::MIN)),
            "-9223372036854775808"
        );
        assert_eq!(
            render_scalar(jsonb::Value::I64(i64::MAX)),
            "9223372036854775807"
        );
        assert_eq!(
            render_scalar(jsonb::Value::U64(u64::MAX)),
            "18446744073709551615"
        );
        assert_eq!(render_scalar(jsonb::Value::I64(0)), "0");
    }

    /// Every digit count and both sides of each power of ten, appended after other text (the
    /// block copy must drop exactly the bytes past the number), checked against std's
    /// formatting.
    #[test]
    fn integers_of_every_length_match_std() {
        let mut unsigned = vec![0u64, 1, 9, u64::MAX, u64::MAX - 1];
        for p in 1..=19 {
            let ten = 10u64.pow(p);
            unsigned.extend([ten - 1, ten, ten + 1, ten + ten / 2 + 7]);
        }
        for &n in &unsigned {
            let mut out = b"[".to_vec();
            write_int(&mut out, n);
            assert_eq!(out, format!("[{n}").into_bytes(), "u64 {n}");
            if let Ok(i) = i64::try_from(n) {
                let mut out = b"x".to_vec();
                write_int(&mut out, -i);
                assert_eq!(out, format!("x{}", -i).into_bytes(), "i64 {}", -i);
            }
        }
        for n in [i16::MIN, -1, 0, i16::MAX] {
            let mut out = Vec::new();
            write_int(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
        let mut out = Vec::new();
        write_int(&mut out, i64::MIN);
        assert_eq!(out, i64::MIN.to_string().into_bytes());
    }

    #[test]
    fn literals() {
        assert_eq!(render_scalar(jsonb::Value::Null), "null");
        assert_eq!(render_scalar(jsonb::Value::Bool(true)), "true");
        assert_eq!(render_scalar(jsonb::Value::Bool(false)), "false");
        // An empty JSON value in a row is JSON null (mysql_common and MySQL agree).
        assert_eq!(render_bytes(&[]).expect("renders"), "null");
    }

    #[test]
    fn strings_are_escaped_as_mysql_double_quote_does() {
        let s = "a\"b\\c\u{8}\u{c}\n\r\t\u{0}\u{1}\u{1f} \u{7f}/é€😀";
        let expected = "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f \u{7f}/é€😀\"";
        assert_eq!(
            render_scalar(jsonb::Value::String(JsonbString::new(
                s.as_bytes().to_vec()
            ))),
            expected
        );
        assert_eq!(
            render_scalar(jsonb::Value::String(JsonbString::new(Vec::new()))),
            "\"\""
        );
        // Bytes are copied, not validated: MySQL prints what is stored.
        let raw = render_mysql_json_to_vec(&jsonb::Value::String(JsonbString::new(vec![
            b'x', 0xff, 0x0b,
        ])))
        .expect("renders");
        assert_eq!(raw, b"\"x\xff\\u000b\"");
        // The scan for escapes goes 32 bytes at a time: one at the start, the end and each
        // side of a chunk boundary is still found.
        for at in [0, 31, 32, 33, 63, 64, 70] {
            let mut bytes = vec![b'a'; 71];
            bytes[at] = b'"';
            let mut expected = String::from("\"");
            for i in 0..bytes.len() {
                expected.push_str(if i == at { "\\\"" } else { "a" });
            }
            expected.push('"');
            let rendered = render_scalar(jsonb::Value::String(JsonbString::new(bytes)));
            assert_eq!(rendered, expected, "quote at byte {at}");
        }
    }

    #[test]
    fn containers_use_mysql_separators_and_stored_key_order() {
        assert_eq!(render_doc(&Doc::Arr(vec![])), "[]");
        assert_eq!(render_doc(&Doc::Obj(vec![])), "{}");
        let doc = Doc::Arr(vec![
            Doc::I16(1),
            Doc::Str("two".into()),
            Doc::Arr(vec![Doc::Null]),
            Doc::Obj(vec![("k".into(), Doc::Bool(true))]),
        ]);
        assert_eq!(render_doc(&doc), r#"[1, "two", [null], {"k": true}]"#);
        // Keys are printed in the stored order, even one MySQL would not have written.
        let doc = Doc::Obj(vec![
            ("b".into(), Doc::I16(1)),
            ("a".into(), Doc::I16(2)),
            ("a\"\n".into(), Doc::Obj(vec![])),
        ]);
        assert_eq!(render_doc(&doc), r#"{"b": 1, "a": 2, "a\"\n": {}}"#);
    }

    #[test]
    fn all_scalar_types_inside_small_and_large_containers() {
        let doc = Doc::Obj(vec![
            ("a".into(), Doc::I32(-70000)),
            ("b".into(), Doc::U32(70000)),
            ("c".into(), Doc::I64(-5)),
            ("d".into(), Doc::U64(u64::MAX)),
            ("e".into(), Doc::F64(2.5)),
            ("f".into(), Doc::U16(7)),
            ("g".into(), Doc::I16(-7)),
            ("h".into(), Doc::Null),
        ]);
        let expected = r#"{"a": -70000, "b": 70000, "c": -5, "d": 18446744073709551615, "e": 2.5, "f": 7, "g": -7, "h": null}"#;
        assert_eq!(render_doc(&doc), expected);
        let large = encode_with(&doc, true);
        assert_eq!(large[0], LARGE_OBJECT);
        assert_eq!(render_bytes(&large).expect("renders"), expected);
    }

    #[test]
    fn decimals_print_with_their_scale() {
        let dec = |data: &[u8]| opaque(ColumnType::MYSQL_TYPE_NEWDECIMAL, data);
        // DECIMAL(4,2) 12.50: 2 integer digits in 1 byte, 2 fraction digits in 1 byte.
        assert_eq!(dec(&[4, 2, 0x80 | 12, 50]).expect("renders"), "12.50");
        // -12.50: every bit inverted (then the first bit flipped back to 0).
        assert_eq!(dec(&[4, 2, !(0x80 | 12), !50]).expect("renders"), "-12.50");
        // DECIMAL(3,2) 0.05: no integer digits left once leading zeros go: "0" is printed.
        assert_eq!(dec(&[3, 2, 0x80, 5]).expect("renders"), "0.05");
        // DECIMAL(5,0) 0 and 12345 (3 bytes for 5 digits).
        assert_eq!(dec(&[5, 0, 0x80, 0, 0]).expect("renders"), "0");
        assert_eq!(dec(&[5, 0, 0x80, 0x30, 0x39]).expect("renders"), "12345");
        // DECIMAL(20,10) 1234567890.0123456789: groups 1 | 234567890 . 012345678 | 9.
        let mut bin = vec![20, 10, 0x80 | 1];
        bin.extend_from_slice(&234_567_890u32.to_be_bytes());
        bin.extend_from_slice(&12_345_678u32.to_be_bytes());
        bin.push(9);
        assert_eq!(dec(&bin).expect("renders"), "1234567890.0123456789");
        // Malformed: wrong size, scale above precision, a group over its digits.
        assert!(matches!(
            dec(&[4, 2, 0x80]),
            Err(JsonRenderError::Malformed { .. })
        ));
        assert!(matches!(
            dec(&[2, 3, 0x80, 0]),
            Err(JsonRenderError::Malformed { .. })
        ));
        assert!(matches!(
            dec(&[2, 0, 0x80 | 100]),
            Err(JsonRenderError::Malformed { .. })
        ));
        assert!(matches!(dec(&[1]), Err(JsonRenderError::Malformed { .. })));
    }

    /// `TIME_to_longlong_datetime_packed` (my_time.cc).
    fn datetime_packed(y: u64, mo: u64, d: u64, h: u64, mi: u64, s: u64, us: u64) -> i64 {
        let ymd = (y * 13 + mo) << 5 | d;
        let hms = h << 12 | mi << 6 | s;
        ((ymd << 17 | hms) << 24 | us) as i64
    }

    /// `TIME_to_longlong_time_packed` (my_time.cc).
    fn time_packed(negative: bool, h: u64, mi: u64, s: u64, us: u64) -> i64 {
        let tmp = ((h << 12 | mi << 6 | s) << 24 | us) as i64;
        if negative {
            -tmp
        } else {
            tmp
        }
    }

    fn debezium(doc: &Doc) -> String {
        let out = render_json_binary_debezium(&encode(doc)).expect("renders");
        String::from_utf8(out).expect("UTF-8 output")
    }

    /// mysql-binlog-connector-java's `JsonStringFormatter`, as Debezium's MySQL connector
    /// prints a JSON column.
    #[test]
    fn debezium_style_is_compact_with_java_numbers_and_minimal_escapes() {
        let doc = mysql_object(vec![
            ("s".into(), Doc::Str("é🎉\u{1}\"\\/".into())),
            (
                "n".into(),
                Doc::Arr(vec![
                    Doc::F64(1e21),
                    Doc::F64(0.1),
                    Doc::F64(1.0),
                    Doc::F64(-0.0),
                    Doc::F64(12345678.5),
                    Doc::I64(-9223372036854775808),
                    Doc::U64(18446744073709551615),
                    Doc::I16(7),
                ]),
            ),
            ("e".into(), Doc::Obj(vec![])),
            ("z".into(), Doc::Null),
        ]);
        assert_eq!(
            debezium(&doc),
            "{\"e\":{},\"n\":[1000000000000000000000,0.1,1.0,-0.0,12345678.5,\
             -9223372036854775808,18446744073709551615,7],\"s\":\"é🎉\\u0001\\\"\\\\/\",\"z\":null}"
        );
        assert_eq!(
            render_doc(&doc),
            "{\"e\": {}, \"n\": [1e21, 0.1, 1.0, -0.0, 12345678.5, -9223372036854775808, \
             18446744073709551615, 7], \"s\": \"é🎉\\u0001\\\"\\\\/\", \"z\": null}",
            "MySQL's own text is unchanged"
        );
        for (micros, text) in [
            (500_000, "\"2024-01-02 03:04:05.5\""),
            (0, "\"2024-01-02 03:04:05\""),
        ] {
            let dt = datetime_packed(2024, 1, 2, 3, 4, 5, micros);
            let doc = Doc::Opaque(
                ColumnType::MYSQL_TYPE_DATETIME as u8,
                dt.to_le_bytes().to_vec(),
            );
            assert_eq!(debezium(&doc), text);
        }
        assert_eq!(
            debezium(&Doc::Opaque(
                ColumnType::MYSQL_TYPE_BLOB as u8,
                vec![0xff; 60]
            )),
            format!("\"{}\"", "////".repeat(20))
        );
    }

    #[test]
    fn temporal_values_print_with_six_fraction_digits() {
        let t = |ty, packed: i64| opaque(ty, &packed.to_le_bytes()).expect("renders");
        let dt = datetime_packed(2024, 1, 2, 3, 4, 5, 0);
        assert_eq!(
            t(ColumnType::MYSQL_TYPE_DATETIME, dt),
            "\"2024-01-02 03:04:05.000000\""
        );
        assert_eq!(
            t(ColumnType::MYSQL_TYPE_TIMESTAMP, dt),
            "\"2024-01-02 03:04:05.000000\""
        );
        let dt = datetime_packed(999, 12, 31, 23, 59, 59, 120);
        assert_eq!(
            t(ColumnType::MYSQL_TYPE_DATETIME, dt),
            "\"0999-12-31 23:59:59.000120\""
        );
        let date = datetime_packed(2024, 1, 2, 0, 0, 0, 0);
        assert_eq!(t(ColumnType::MYSQL_TYPE_DATE, date), "\"2024-01-02\"");
        assert_eq!(t(ColumnType::MYSQL_TYPE_DATE, 0), "\"0000-00-00\"");
        assert_eq!(
            t(
                ColumnType::MYSQL_TYPE_TIME,
                time_packed(false, 12, 34, 56, 0)
            ),
            "\"12:34:56.000000\""
        );
        assert_eq!(
            t(
                ColumnType::MYSQL_TYPE_TIME,
                time_packed(true, 838, 59, 59, 0)
            ),
            "\"-838:59:59.000000\""
        );
        assert_eq!(
            t(
                ColumnType::MYSQL_TYPE_TIME,
                time_packed(true, 0, 0, 1, 500_000)
            ),
            "\"-00:00:01.500000\""
        );
        assert!(matches!(
            opaque(ColumnType::MYSQL_TYPE_DATE, &[0; 7]),
            Err(JsonRenderError::Malformed { .. })
        ));
    }

    #[test]
    fn other_opaque_values_print_as_mysql_base64() {
        let blob = |data: &[u8]| opaque(ColumnType::MYSQL_TYPE_BLOB, data).expect("renders");
        assert_eq!(blob(b""), "\"base64:type252:\"");
        assert_eq!(blob(b"f"), "\"base64:type252:Zg==\"");
        assert_eq!(blob(b"fo"), "\"base64:type252:Zm8=\"");
        assert_eq!(blob(b"foobar"), "\"base64:type252:Zm9vYmFy\"");
        assert_eq!(
            opaque(ColumnType::MYSQL_TYPE_BIT, &[0x55]).expect("renders"),
            "\"base64:type16:VQ==\""
        );
        // 57 bytes make exactly 76 characters: one line. 58 bytes need a second line, which
        // MySQL's base64_encode starts with a line break (escaped as \n in the JSON string).
        let line = "AAAA".repeat(19);
        assert_eq!(blob(&[0; 57]), format!("\"base64:type252:{line}\""));
        assert_eq!(blob(&[0; 58]), format!("\"base64:type252:{line}\\nAA==\""));
        assert_eq!(
            blob(&[0; 114]),
            format!("\"base64:type252:{line}\\n{line}\"")
        );
        // VAR_STRING opaque data is a plain JSON string.
        assert_eq!(
            opaque(ColumnType::MYSQL_TYPE_VAR_STRING, b"a\"b").expect("renders"),
            r#""a\"b""#
        );
        // Through the binary format: the type byte of the opaque value is kept.
        assert_eq!(
            render_doc(&Doc::Arr(vec![Doc::Opaque(0xfc, b"hi".to_vec())])),
            r#"["base64:type252:aGk="]"#
        );
    }

    #[test]
    fn large_documents_use_the_large_format_and_render_the_same() {
        let long = "x".repeat(70_000);
        let doc = Doc::Obj(vec![
            ("n".into(), Doc::I32(-1)),
            ("s".into(), Doc::Str(long.clone())),
            (
                "t".into(),
                Doc::Arr(vec![Doc::U32(70_000), Doc::Bool(false)]),
            ),
        ]);
        let bytes = encode(&doc);
        assert_eq!(bytes[0], LARGE_OBJECT);
        assert!(bytes.len() > 65_536);
        let expected = format!(r#"{{"n": -1, "s": "{long}", "t": [70000, false]}}"#);
        assert_eq!(render_bytes(&bytes).expect("renders"), expected);

        let many: Vec<Doc> = (0..20_000).map(|i| Doc::I32(i * 1000)).collect();
        let bytes = encode(&Doc::Arr(many));
        assert_eq!(bytes[0], LARGE_ARRAY);
        let text = render_bytes(&bytes).expect("renders");
        let expected: Vec<String> = (0..20_000).map(|i| (i * 1000).to_string()).collect();
        assert_eq!(text, format!("[{}]", expected.join(", ")));
    }

    #[test]
    fn binlog_values() {
        let v = BinlogValue::Jsonb(jsonb::Value::I16(5));
        assert_eq!(render_binlog_json(&v).expect("renders"), b"5");
        assert_eq!(
            render_binlog_json(&BinlogValue::JsonDiff(Vec::new())),
            Err(JsonRenderError::PartialUpdate)
        );
        assert_eq!(
            render_binlog_json(&BinlogValue::Value(mysql_async::Value::Int(1))),
            Err(JsonRenderError::NotJson)
        );
        assert!(JsonRenderError::PartialUpdate
            .to_string()
            .contains("binlog_row_value_options=PARTIAL_JSON"));
    }

    #[test]
    fn nesting_deeper_than_mysql_allows_is_refused() {
        let nest = |levels: usize| {
            let mut doc = Doc::Null;
            for _ in 0..levels {
                doc = Doc::Arr(vec![doc]);
            }
            doc
        };
        let text = render_doc(&nest(MAX_DEPTH));
        assert_eq!(text.len(), 2 * MAX_DEPTH + 4);
        let err = render_bytes(&encode(&nest(MAX_DEPTH + 1))).expect_err("too deep");
        let path = format!("${}", "[0]".repeat(MAX_DEPTH));
        assert_eq!(err, JsonRenderError::TooDeep { path });
    }

    #[test]
    fn errors_carry_the_path_and_leave_out_untouched() {
        let doc = Doc::Obj(vec![(
            "a b".into(),
            Doc::Arr(vec![Doc::I16(1), Doc::Opaque(10, vec![1, 2, 3])]),
        )]);
        let mut out = b"prefix".to_vec();
        let err = render_mysql_json(&parse(&encode(&doc)), &mut out).expect_err("bad DATE");
        assert_eq!(out, b"prefix");
        let JsonRenderError::Malformed { path, reason } = err else {
            panic!("not Malformed: {err:?}");
        };
        assert_eq!(path, r#"$."a b"[1]"#);
        assert!(reason.contains("3 bytes"), "{reason}");

        // A value offset pointing past the end of the array.
        let mut bytes = encode(&Doc::Arr(vec![Doc::I16(1), Doc::Str("abc".into())]));
        bytes[9] = 0x7f; // offset of the string (entry 2: type at 8, offset at 9..11)
        let err = render_bytes(&bytes).expect_err("bad offset");
        assert!(
            matches!(&err, JsonRenderError::Malformed { path, .. } if path == "$[1]"),
            "{err:?}"
        );
    }

    #[test]
    fn output_is_capped_for_documents_that_reuse_their_bytes() {
        // Both elements of each array point at the same nested array: 2^40 leaves from a few
        // hundred bytes. MySQL would try to print it all; the cap stops it.
        let mut inner = encode(&Doc::Arr(vec![Doc::Null, Doc::Null]));
        for _ in 0..40 {
            // [count=2][size][entry 0: array at 10][entry 1: array at 10][inner value]
            let size = (10 + inner.len() - 1) as u16;
            let mut outer = vec![SMALL_ARRAY, 2, 0];
            outer.extend_from_slice(&size.to_le_bytes());
            outer.extend_from_slice(&[SMALL_ARRAY, 10, 0, SMALL_ARRAY, 10, 0]);
            outer.extend_from_slice(&inner[1..]);
            inner = outer;
        }
        let mut out = Vec::new();
        let err = render_limited(&parse(&inner), &mut out, 1 << 20).expect_err("too large");
        assert_eq!(err, JsonRenderError::TooLarge);
        assert!(out.is_empty());
        let err = render_document(&inner, &mut out, 1 << 20, Style::Mysql).expect_err("too large");
        assert_eq!(err, JsonRenderError::TooLarge);
        assert!(out.is_empty());
    }

    #[test]
    fn empty_and_scalar_documents_walk_in_place() {
        assert_eq!(render_bytes(&[]).expect("renders"), "null");
        assert_eq!(render_bytes(&[LITERAL, 1]).expect("renders"), "true");
        assert_eq!(render_bytes(&[INT16, 0xff, 0xff]).expect("renders"), "-1");
        assert_eq!(
            render_bytes(&[STRING, 3, b'a', b'"', b'b']).expect("renders"),
            r#""a\"b""#
        );
        // Cut short, unknown types, a string longer than its bytes, a size past the end.
        for bad in [
            &[INT64, 1, 2][..],
            &[LITERAL, 7],
            &[0x0d],
            &[STRING, 5, b'a'],
            &[STRING, 0x80, 0x80, 0x80, 0x80, 0x80, 1],
            &[OPAQUE, 0xf0, 1, 0],
            &[SMALL_ARRAY, 1, 0, 200, 0, LITERAL, 0, 0],
            &[SMALL_OBJECT, 1, 0, 4, 0],
        ] {
            assert!(
                matches!(render_bytes(bad), Err(JsonRenderError::Malformed { .. })),
                "{bad:?}: {:?}",
                render_bytes(bad)
            );
        }
    }

    // ---------------------------------------------------------------------------------------
    // Property tests: random documents → MySQL binary (test encoder) → mysql_common's parser →
    // render → parsed back by a strict reader of MySQL's layout and by serde_json.
    // ---------------------------------------------------------------------------------------

    /// A value read from MySQL's text by a reader that accepts only MySQL's layout: `", "` and
    /// `": "` as the only whitespace, only the escapes `double_quote` writes.
    #[derive(Debug)]
    enum Tok {
        Null,
        Bool(bool),
        Num(String),
        Str(Vec<u8>),
        Arr(Vec<Tok>),
        Obj(Vec<(Vec<u8>, Tok)>),
    }

    struct Strict<'a> {
        s: &'a [u8],
        pos: usize,
    }

    impl Strict<'_> {
        fn read(s: &[u8]) -> Result<Tok, String> {
            let mut r = Strict { s, pos: 0 };
            let v = r.value()?;
            if r.pos != s.len() {
                return Err(format!("trailing bytes at {}", r.pos));
            }
            Ok(v)
        }

        fn peek(&self) -> Option<u8> {
            self.s.get(self.pos).copied()
        }

        fn expect(&mut self, lit: &[u8]) -> Result<(), String> {
            if self.s[self.pos..].starts_with(lit) {
                self.pos += lit.len();
                Ok(())
            } else {
                Err(format!(
                    "expected {:?} at {}",
                    String::from_utf8_lossy(lit),
                    self.pos
                ))
            }
        }

        fn value(&mut self) -> Result<Tok, String> {
            match self.peek() {
                Some(b'n') => self.expect(b"null").map(|()| Tok::Null),
                Some(b't') => self.expect(b"true").map(|()| Tok::Bool(true)),
                Some(b'f') => self.expect(b"false").map(|()| Tok::Bool(false)),
                Some(b'"') => self.string().map(Tok::Str),
                Some(b'[') => {
                    self.pos += 1;
                    let mut items = Vec::new();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        return Ok(Tok::Arr(items));
                    }
                    loop {
                        items.push(self.value()?);
                        if self.peek() == Some(b']') {
                            self.pos += 1;
                            return Ok(Tok::Arr(items));
                        }
                        self.expect(b", ")?;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    let mut members = Vec::new();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        return Ok(Tok::Obj(members));
                    }
                    loop {
                        let key = self.string()?;
                        self.expect(b": ")?;
                        members.push((key, self.value()?));
                        if self.peek() == Some(b'}') {
                            self.pos += 1;
                            return Ok(Tok::Obj(members));
                        }
                        self.expect(b", ")?;
                    }
                }
                Some(b'-' | b'0'..=b'9') => {
                    let start = self.pos;
                    while matches!(self.peek(), Some(b'-' | b'.' | b'e' | b'0'..=b'9')) {
                        self.pos += 1;
                    }
                    Ok(Tok::Num(
                        String::from_utf8_lossy(&self.s[start..self.pos]).into_owned(),
                    ))
                }
                other => Err(format!("unexpected {other:?} at {}", self.pos)),
            }
        }

        fn string(&mut self) -> Result<Vec<u8>, String> {
            self.expect(b"\"")?;
            let mut out = Vec::new();
            loop {
                let Some(b) = self.peek() else {
                    return Err("unterminated string".into());
                };
                self.pos += 1;
                match b {
                    b'"' => return Ok(out),
                    0x00..=0x1f => return Err(format!("raw control byte {b:#x}")),
                    b'\\' => {
                        let e = self.peek().ok_or("dangling escape")?;
                        self.pos += 1;
                        out.push(match e {
                            b'"' => b'"',
                            b'\\' => b'\\',
                            b'b' => 0x08,
                            b'f' => 0x0c,
                            b'n' => 0x0a,
                            b'r' => 0x0d,
                            b't' => 0x09,
                            b'u' => {
                                let hex = self.s.get(self.pos..self.pos + 4).ok_or("short \\u")?;
                                self.pos += 4;
                                let ok = hex.starts_with(b"00")
                                    && hex[2..]
                                        .iter()
                                        .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
                                let hex = std::str::from_utf8(hex).map_err(|e| e.to_string())?;
                                let code =
                                    u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                if !ok || code > 0x1f || [8, 9, 10, 12, 13].contains(&code) {
                                    return Err(format!("MySQL does not write \\u{hex}"));
                                }
                                code
                            }
                            _ => return Err(format!("MySQL does not write \\{}", e as char)),
                        });
                    }
                    _ => out.push(b),
                }
            }
        }
    }

    /// Checks that the MySQL text read back matches the document, numbers exactly.
    fn check_tok(doc: &Doc, tok: &Tok) -> Result<(), String> {
        let int = |text: &str, expected: String| {
            if *text == expected {
                Ok(())
            } else {
                Err(format!("integer {expected} printed as {text}"))
            }
        };
        match (doc, tok) {
            (Doc::Null, Tok::Null) => Ok(()),
            (Doc::Bool(a), Tok::Bool(b)) if a == b => Ok(()),
            (Doc::I16(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::U16(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::I32(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::U32(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::I64(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::U64(x), Tok::Num(t)) => int(t, x.to_string()),
            (Doc::F64(x), Tok::Num(t)) => check_double_text(*x, t),
            (Doc::Str(s), Tok::Str(b)) if s.as_bytes() == b.as_slice() => Ok(()),
            (Doc::Arr(items), Tok::Arr(toks)) if items.len() == toks.len() => items
                .iter()
                .zip(toks)
                .try_for_each(|(d, t)| check_tok(d, t)),
            (Doc::Obj(members), Tok::Obj(toks)) if members.len() == toks.len() => {
                members.iter().zip(toks).try_for_each(|((k, d), (tk, t))| {
                    if k.as_bytes() != tk.as_slice() {
                        return Err(format!("key {k:?} printed as {tk:?} (order?)"));
                    }
                    check_tok(d, t)
                })
            }
            _ => Err(format!("{doc:?} printed as {tok:?}")),
        }
    }

    /// The text reads back as exactly `x`, looks like a double, and uses the notation
    /// my_gcvt picks for its decimal exponent.
    fn check_double_text(x: f64, text: &str) -> Result<(), String> {
        let back: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
        if back.to_bits() != x.to_bits() {
            return Err(format!(
                "{x:e} printed as {text}, which reads back as {back:e}"
            ));
        }
        if !text.contains(['.', 'e']) || text.contains(['+', 'E']) || text.contains("e0") {
            return Err(format!("{text} is not MySQL's form of a double"));
        }
        if text.contains("e-0") || text.starts_with("00") || text.starts_with("-00") {
            return Err(format!("{text} is not MySQL's form of a double"));
        }
        if x != 0.0 {
            let sci = format!("{x:e}");
            let exp: i32 = sci
                .split_once('e')
                .and_then(|(_, e)| e.parse().ok())
                .ok_or("exponent")?;
            // decpt = exp + 1: plain for -14..=15, exponent below -14 or above 16.
            let decpt = exp + 1;
            if (-14..=15).contains(&decpt) && text.contains('e') {
                return Err(format!("{text}: decpt {decpt} should be plain"));
            }
            if !(-14..=16).contains(&decpt) && !text.contains('e') {
                return Err(format!("{text}: decpt {decpt} should use an exponent"));
            }
        }
        Ok(())
    }

    fn to_serde(doc: &Doc) -> serde_json::Value {
        use serde_json::Value as J;
        match doc {
            Doc::Null => J::Null,
            Doc::Bool(b) => J::Bool(*b),
            Doc::I16(x) => J::from(*x),
            Doc::U16(x) => J::from(*x),
            Doc::I32(x) => J::from(*x),
            Doc::U32(x) => J::from(*x),
            Doc::I64(x) => J::from(*x),
            Doc::U64(x) => J::from(*x),
            Doc::F64(x) => serde_json::Number::from_f64(*x).map_or(J::Null, J::Number),
            Doc::Str(s) => J::String(s.clone()),
            Doc::Arr(items) => J::Array(items.iter().map(to_serde).collect()),
            Doc::Obj(members) => J::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), to_serde(v)))
                    .collect(),
            ),
            Doc::Opaque(..) => J::Null,
        }
    }

    /// Equal, but a double parsed by serde_json may be a few units in the last place off (its
    /// `float_roundtrip` feature is not enabled: it reads `0.00000000011641532182693481`, which
    /// is 2^-33, as 2^-33 minus 2 ulp); exactness is checked by `check_tok`.
    fn serde_equal(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value as J;
        match (a, b) {
            (J::Number(x), J::Number(y)) => {
                if x.is_f64() || y.is_f64() {
                    if !(x.is_f64() && y.is_f64()) {
                        return false;
                    }
                    let (Some(x), Some(y)) = (x.as_f64(), y.as_f64()) else {
                        return false;
                    };
                    x.is_sign_negative() == y.is_sign_negative()
                        && x.to_bits().abs_diff(y.to_bits()) <= 4
                } else {
                    x.as_i64() == y.as_i64() && x.as_u64() == y.as_u64()
                }
            }
            (J::Array(x), J::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| serde_equal(a, b))
            }
            (J::Object(x), J::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| serde_equal(v, w)))
            }
            _ => a == b,
        }
    }

    /// Renders the document through the binary format and checks the text both ways.
    fn check_round_trip(doc: &Doc, bytes: &[u8]) -> Result<(), TestCaseError> {
        let text = render_json_binary_to_vec(bytes)
            .map_err(|e| TestCaseError::fail(format!("render: {e}")))?;
        let tok = Strict::read(&text).map_err(|e| {
            TestCaseError::fail(format!("{e} in {}", String::from_utf8_lossy(&text)))
        })?;
        check_tok(doc, &tok).map_err(|e| {
            TestCaseError::fail(format!("{e} in {}", String::from_utf8_lossy(&text)))
        })?;
        let parsed: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| TestCaseError::fail(format!("serde_json: {e}")))?;
        prop_assert!(
            serde_equal(&parsed, &to_serde(doc)),
            "serde_json reads {} back as {parsed}",
            String::from_utf8_lossy(&text)
        );
        Ok(())
    }

    fn arb_string() -> impl Strategy<Value = String> {
        let ch = prop_oneof![
            6 => any::<char>(),
            3 => proptest::char::range('a', 'z'),
            1 => Just('"'),
            1 => Just('\\'),
            1 => Just('/'),
            2 => (0u8..0x20).prop_map(char::from),
            1 => Just('\u{7f}'),
            1 => Just('é'),
            1 => Just('😀'),
        ];
        prop::collection::vec(ch, 0..16).prop_map(|v| v.into_iter().collect())
    }

    fn arb_f64() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => any::<u64>().prop_map(f64::from_bits).prop_filter("finite", |x| x.is_finite()),
            2 => (-1_000_000i64..1_000_000).prop_map(|i| i as f64),
            2 => (any::<i32>(), 0i32..24).prop_map(|(m, k)| f64::from(m) / 10f64.powi(k)),
            1 => (any::<i64>(), -30i32..30).prop_map(|(m, k)| m as f64 * 10f64.powi(k)),
            1 => (1u32..2046).prop_map(|e| f64::from_bits(u64::from(e) << 52)),
            1 => prop::sample::select(vec![
                0.0, -0.0, 1e15, 1e16, 1e-15, 1e-16, 1e14, f64::MAX, f64::MIN_POSITIVE, 5e-324,
                1234567890123456.7, 0.1, 2f64.powi(-25), 2f64.powi(-33),
            ]),
        ]
    }

    fn arb_leaf() -> impl Strategy<Value = Doc> {
        prop_oneof![
            1 => Just(Doc::Null),
            1 => any::<bool>().prop_map(Doc::Bool),
            1 => any::<i16>().prop_map(Doc::I16),
            1 => any::<u16>().prop_map(Doc::U16),
            1 => any::<i32>().prop_map(Doc::I32),
            1 => any::<u32>().prop_map(Doc::U32),
            1 => any::<i64>().prop_map(Doc::I64),
            1 => any::<u64>().prop_map(Doc::U64),
            3 => arb_f64().prop_map(Doc::F64),
            3 => arb_string().prop_map(Doc::Str),
        ]
    }

    fn arb_doc() -> impl Strategy<Value = Doc> {
        arb_leaf().prop_recursive(5, 96, 10, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..10).prop_map(Doc::Arr),
                prop::collection::vec((arb_string(), inner), 0..10).prop_map(mysql_object),
            ]
        })
    }

    /// The byte-at-a-time answer [`needs_escape`] must give.
    fn escapes_somewhere(bytes: &[u8]) -> bool {
        bytes.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
    }

    /// Every byte value at every position of every length up to 40 (each word-load case, and
    /// two 16-byte chunks and a tail), amid bytes that border the escaped ones.
    #[test]
    fn needs_escape_finds_every_escaped_byte_wherever_it_is() {
        for background in [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xff] {
            for len in 0..=40 {
                let plain = vec![background; len];
                assert!(!needs_escape(&plain), "{len} x {background:#04x}");
                for at in 0..len {
                    for b in 0..=255u8 {
                        let mut bytes = plain.clone();
                        bytes[at] = b;
                        assert_eq!(
                            needs_escape(&bytes),
                            escapes_somewhere(&bytes),
                            "{b:#04x} at {at} of {len} amid {background:#04x}"
                        );
                    }
                }
            }
        }
    }

    /// The word-at-a-time path for short strings writes what the byte-at-a-time escaping
    /// writes, for every byte value at every position of every length it takes and just
    /// beyond, after text already in the buffer.
    #[test]
    fn short_strings_are_quoted_as_the_byte_at_a_time_escape_quotes_them() {
        for background in [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xff] {
            for len in 0..=SHORT + 2 {
                for at in 0..len.max(1) {
                    for b in 0..=255u8 {
                        let mut bytes = vec![background; len];
                        if let Some(slot) = bytes.get_mut(at) {
                            *slot = b;
                        }
                        let mut quoted = b"[1, ".to_vec();
                        write_quoted(&mut quoted, &bytes);
                        let mut escaped = b"[1, ".to_vec();
                        write_escaped(&mut escaped, &bytes);
                        assert_eq!(
                            quoted, escaped,
                            "{b:#04x} at {at} of {len} amid {background:#04x}"
                        );
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_documents_round_trip(doc in arb_doc()) {
            check_round_trip(&doc, &encode(&doc))?;
        }

        #[test]
        fn needs_escape_agrees_with_a_byte_at_a_time_scan(
            bytes in prop::collection::vec(prop_oneof![40 => 0x23u8.., 1 => any::<u8>()], 0..70),
        ) {
            prop_assert_eq!(needs_escape(&bytes), escapes_somewhere(&bytes));
        }

        /// The in-place walk the decoder uses prints what the walk over mysql_common's parse
        /// prints, in both formats and both styles.
        #[test]
        fn walking_in_place_renders_as_the_parsed_walk(doc in arb_doc()) {
            for bytes in [encode(&doc), encode_with(&doc, true)] {
                prop_assert_eq!(render_bytes(&bytes), render_parsed(&bytes));
                let mut parsed = Vec::new();
                render_styled(&parse(&bytes), &mut parsed, MAX_OUTPUT_LEN, Style::Debezium)
                    .expect("renders");
                prop_assert_eq!(render_json_binary_debezium(&bytes).expect("renders"), parsed);
            }
        }

        #[test]
        fn large_format_renders_like_small(doc in arb_doc()) {
            let small = render_mysql_json_to_vec(&parse(&encode(&doc)));
            let large = render_mysql_json_to_vec(&parse(&encode_with(&doc, true)));
            prop_assert_eq!(small, large);
        }

        #[test]
        fn doubles_read_back_exactly(x in arb_f64()) {
            let text = double(x);
            prop_assert!(check_double_text(x, &text).is_ok(), "{}", text);
        }

        /// The digits skip the second formatting below 16 digits: they are those of always
        /// rounding correctly to the shortest length and keeping that when it reads back.
        #[test]
        fn shortest_digits_are_the_nearest_of_their_length(x in arb_f64()) {
            let x = x.abs();
            prop_assume!(x != 0.0);
            let shortest = format!("{x:e}");
            let n = shortest.split('e').next().map_or(1, |m| m.bytes().filter(u8::is_ascii_digit).count());
            let nearest = format!("{x:.*e}", n - 1);
            let chosen = if nearest.parse::<f64>() == Ok(x) { nearest } else { shortest };
            let (mantissa, exponent) = chosen.split_once('e').expect("exponent");
            let mut digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
            while digits.len() > 1 && digits.last() == Some(&b'0') {
                digits.pop();
            }
            let (got, decpt) = shortest_digits(x);
            prop_assert_eq!(got.as_slice(), digits.as_slice());
            prop_assert_eq!(decpt, exponent.parse::<i32>().expect("exponent") + 1);
        }

        #[test]
        fn renderer_never_panics_on_corrupt_documents(
            doc in arb_doc(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encode(&doc);
            for (at, byte) in edits {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            let walked = render_document(&bytes, &mut Vec::new(), 1 << 24, Style::Mysql);
            if let Ok(v) = ParseBuf(&bytes).parse::<jsonb::Value<'_>>(()) {
                let mut parsed = Vec::new();
                let parsed_ok = render_limited(&v, &mut parsed, 1 << 24);
                // The in-place walk checks offsets at least as strictly as mysql_common: what
                // it accepts, both print alike.
                if walked.is_ok() {
                    prop_assert!(parsed_ok.is_ok(), "{:?}", parsed_ok);
                }
            }
        }

        #[test]
        fn renderer_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = render_document(&bytes, &mut Vec::new(), 1 << 24, Style::Mysql);
            let _ = render_document(&bytes, &mut Vec::new(), 1 << 24, Style::Debezium);
            if let Ok(v) = ParseBuf(&bytes).parse::<jsonb::Value<'_>>(()) {
                let _ = render_limited(&v, &mut Vec::new(), 1 << 24);
            }
        }

        /// A random DECIMAL written as `decimal2bin` does: the expected text comes straight
        /// from the digit strings.
        #[test]
        fn decimals_round_trip(
            negative in any::<bool>(),
            (precision, scale) in (1usize..=65).prop_flat_map(|p| (Just(p), 0..=p.min(30))),
            seed in prop::collection::vec(0u8..10, 65),
        ) {
            let digits: Vec<u8> = seed[..precision].to_vec();
            let (int, frac) = digits.split_at(precision - scale);
            let negative = negative && digits.iter().any(|&d| d != 0); // MySQL has no -0
            let group = |ds: &[u8]| ds.iter().fold(0u64, |n, &d| n * 10 + u64::from(d));
            let mut bin = Vec::new();
            let lead = int.len() % 9;
            let mut push = |ds: &[u8]| {
                let n = group(ds);
                let bytes = DIG2BYTES[ds.len()];
                bin.extend_from_slice(&n.to_be_bytes()[8 - bytes..]);
            };
            push(&int[..lead]);
            int[lead..].chunks(9).for_each(&mut push);
            frac.chunks(9).for_each(&mut push);
            if negative {
                bin.iter_mut().for_each(|b| *b = !*b);
            }
            bin[0] ^= 0x80;
            let mut data = vec![precision as u8, scale as u8];
            data.extend_from_slice(&bin);

            let int_text: String = int.iter().map(|d| char::from(b'0' + d)).collect();
            let int_text = int_text.trim_start_matches('0');
            let mut expected = String::new();
            if negative {
                expected.push('-');
            }
            expected.push_str(if int_text.is_empty() { "0" } else { int_text });
            if scale > 0 {
                expected.push('.');
                expected.extend(frac.iter().map(|d| char::from(b'0' + d)));
            }
            let text = opaque(ColumnType::MYSQL_TYPE_NEWDECIMAL, &data);
            prop_assert_eq!(text, Ok(expected.clone()));
            // mysql_common's own DECIMAL reader agrees.
            let theirs = mysql_common::binlog::decimal::Decimal::read_packed(&data[..], false)
                .map(|d| d.to_string())
                .map_err(|e| e.to_string());
            prop_assert_eq!(theirs, Ok(expected));
        }

        #[test]
        fn datetimes_round_trip(
            y in 0u64..=9999, mo in 0u64..=12, d in 0u64..=31,
            h in 0u64..=23, mi in 0u64..=59, s in 0u64..=59, us in 0u64..=999_999,
        ) {
            let packed = datetime_packed(y, mo, d, h, mi, s, us).to_le_bytes();
            let expected =
                format!("\"{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06}\"");
            prop_assert_eq!(opaque(ColumnType::MYSQL_TYPE_DATETIME, &packed), Ok(expected.clone()));
            prop_assert_eq!(opaque(ColumnType::MYSQL_TYPE_TIMESTAMP, &packed), Ok(expected));
            let date = datetime_packed(y, mo, d, 0, 0, 0, 0).to_le_bytes();
            prop_assert_eq!(
                opaque(ColumnType::MYSQL_TYPE_DATE, &date),
                Ok(format!("\"{y:04}-{mo:02}-{d:02}\""))
            );
        }

        #[test]
        fn times_round_trip(
            negative in any::<bool>(),
            h in 0u64..=838, mi in 0u64..=59, s in 0u64..=59, us in 0u64..=999_999,
        ) {
            let packed = time_packed(negative, h, mi, s, us).to_le_bytes();
            let sign = if negative && (h, mi, s, us) != (0, 0, 0, 0) { "-" } else { "" };
            let expected = format!("\"{sign}{h:02}:{mi:02}:{s:02}.{us:06}\"");
            prop_assert_eq!(opaque(ColumnType::MYSQL_TYPE_TIME, &packed), Ok(expected));
        }

        /// Base64 checked by decoding it back (and MySQL's 76-character lines).
        #[test]
        fn opaque_base64_decodes_back(data in prop::collection::vec(any::<u8>(), 0..300)) {
            let text = opaque(ColumnType::MYSQL_TYPE_GEOMETRY, &data).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let body = text
                .strip_prefix("\"base64:type255:")
                .and_then(|t| t.strip_suffix('"'))
                .ok_or_else(|| TestCaseError::fail(text.clone()))?;
            let lines: Vec<&str> = body.split("\\n").collect();
            for line in &lines[..lines.len() - 1] {
                prop_assert_eq!(line.len(), 76);
            }
            prop_assert!(lines[lines.len() - 1].len() <= 76);
            let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut decoded = Vec::new();
            let joined: Vec<u8> = lines.concat().into_bytes();
            prop_assert_eq!(joined.len() % 4, 0);
            for quad in joined.chunks(4) {
                let mut n = 0u32;
                let mut pad = 0;
                for &c in quad {
                    n <<= 6;
                    if c == b'=' {
                        pad += 1;
                    } else {
                        let v = alphabet.iter().position(|&a| a == c).ok_or_else(|| TestCaseError::fail("alphabet"))?;
                        n |= v as u32;
                    }
                }
                let bytes = n.to_be_bytes();
                decoded.extend_from_slice(&bytes[1..4 - pad]);
            }
            prop_assert_eq!(decoded, data);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Documents over 64 KiB: a long string somewhere in a random document forces the
        /// large format on every container around it.
        #[test]
        fn large_documents_round_trip(
            doc in arb_doc(),
            len in 65_536usize..80_000,
            at in any::<prop::sample::Index>(),
        ) {
            let long = Doc::Str("é".repeat(len / 2));
            let doc = match doc {
                Doc::Arr(mut items) => {
                    let i = at.index(items.len() + 1);
                    items.insert(i, long);
                    Doc::Arr(items)
                }
                Doc::Obj(mut members) => {
                    members.push(("long".into(), long));
                    mysql_object(members)
                }
                other => Doc::Arr(vec![other, long]),
            };
            let bytes = encode(&doc);
            prop_assert!(matches!(bytes[0], LARGE_ARRAY | LARGE_OBJECT));
            check_round_trip(&doc, &bytes)?;
        }
    }
}
