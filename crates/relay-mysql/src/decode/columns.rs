//! Column values → the bytes of a Kafka record: the text form of ids, keys and headers, the
//! payload bytes, JSON envelope fields and the record timestamp.
//!
//! The column's type information comes from the table map event (MySQL Internals
//! "TABLE_MAP_EVENT", optional metadata: signedness, character set, ENUM/SET values), as
//! `mysql_common` attaches it to each row's columns.

use mysql_async::consts::{ColumnFlags, ColumnType};
use mysql_async::Value;
use mysql_common::collations::{Collation, CollationId};

use outbox_relay_core::config::{AdditionalColumn, BinaryFormat, Placement};

/// Collation id of the `binary` character set (binary strings and BLOBs).
const BINARY_COLLATION: u16 = 63;

/// What the decoder knows about one column of a table map, beyond the value itself.
#[derive(Debug, Clone, Default)]
pub struct ColumnInfo {
    /// Column name (from the table map or the tracked layout).
    pub name: String,
    /// Column type as the table map gives it (ENUM and SET resolved from STRING).
    pub column_type: Option<ColumnType>,
    /// Collation id of a string column (0 when the table map does not say).
    pub collation: u16,
    /// Integer column declared UNSIGNED.
    pub unsigned: bool,
    /// ENUM labels in declaration order, or SET member names, when the table map carries them
    /// (`binlog_row_metadata=FULL`).
    pub labels: Option<Vec<Vec<u8>>>,
    /// Declared length in bytes of a `CHAR`/`BINARY` column (`MYSQL_TYPE_STRING`), from the
    /// table map's column metadata. The binlog drops trailing pad bytes of such values; BINARY
    /// values are padded back with 0x00 to this length, as `SELECT` returns them.
    pub fixed_len: Option<usize>,
    /// The column accepts NULL (the table map's null bitmap; `true` where not known).
    pub nullable: bool,
}

/// The stand-in for an outbox column the mapping leaves out (`event_key = ""` in the
/// Debezium profile): its value is always NULL.
pub static UNMAPPED_COLUMN: ColumnInfo = ColumnInfo {
    name: String::new(),
    column_type: None,
    collation: 0,
    unsigned: false,
    labels: None,
    fixed_len: None,
    nullable: true,
};

/// Declared byte length of a `MYSQL_TYPE_STRING` column from its 2-byte table-map metadata
/// (MySQL `Field_string::do_save_field_metadata`: real type, length; lengths above 255 borrow
/// bits 4-5 of the first byte, inverted).
pub fn string_column_length(meta: &[u8]) -> Option<usize> {
    let (&b0, &b1) = (meta.first()?, meta.get(1)?);
    if b0 & 0x30 != 0x30 {
        Some(usize::from(b1) | (usize::from((b0 & 0x30) ^ 0x30) << 4))
    } else {
        Some(usize::from(b1))
    }
}

impl ColumnInfo {
    /// The Connect schema Debezium's MySQL connector gives this column (default settings:
    /// `bigint.unsigned.handling.mode=long`): integers as `int16`/`int32`/`int64`, MySQL JSON
    /// as `io.debezium.data.Json`, everything else as a string of the relay's text form (which
    /// for temporal, decimal, floating-point and binary columns differs from Debezium's own
    /// representation: the docs say so).
    pub fn debezium_schema(&self) -> outbox_relay_core::debezium::ColumnSchema {
        use outbox_relay_core::debezium::connect::Type;
        use outbox_relay_core::debezium::ColumnSchema;
        let optional = self.nullable;
        match self.column_type {
            Some(ColumnType::MYSQL_TYPE_JSON) => ColumnSchema::json(optional),
            // SMALLINT UNSIGNED does not fit int16 (Debezium's BinlogValueConverters: int32).
            Some(ColumnType::MYSQL_TYPE_SHORT) if self.unsigned => {
                ColumnSchema::integer(Type::Int32, optional)
            }
            Some(ColumnType::MYSQL_TYPE_TINY | ColumnType::MYSQL_TYPE_SHORT) => {
                ColumnSchema::integer(Type::Int16, optional)
            }
            // `io.debezium.time.Year`, an int32.
            Some(ColumnType::MYSQL_TYPE_YEAR) => {
                ColumnSchema::named_integer(Type::Int32, "io.debezium.time.Year", optional)
            }
            Some(ColumnType::MYSQL_TYPE_INT24) => ColumnSchema::integer(Type::Int32, optional),
            Some(ColumnType::MYSQL_TYPE_LONG) if self.unsigned => {
                ColumnSchema::integer(Type::Int64, optional)
            }
            Some(ColumnType::MYSQL_TYPE_LONG) => ColumnSchema::integer(Type::Int32, optional),
            Some(ColumnType::MYSQL_TYPE_LONGLONG) => ColumnSchema::integer(Type::Int64, optional),
            _ => ColumnSchema::string(optional),
        }
    }

    /// A character column (CHAR, VARCHAR, TEXT) in a character set, not binary.
    pub fn is_text(&self) -> bool {
        !self.is_binary()
            && matches!(
                self.column_type,
                Some(
                    ColumnType::MYSQL_TYPE_STRING
                        | ColumnType::MYSQL_TYPE_VAR_STRING
                        | ColumnType::MYSQL_TYPE_VARCHAR
                        | ColumnType::MYSQL_TYPE_BLOB
                        | ColumnType::MYSQL_TYPE_TINY_BLOB
                        | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
                        | ColumnType::MYSQL_TYPE_LONG_BLOB
                )
            )
    }

    fn is_binary(&self) -> bool {
        self.collation == BINARY_COLLATION
            && matches!(
                self.column_type,
                Some(
                    ColumnType::MYSQL_TYPE_STRING
                        | ColumnType::MYSQL_TYPE_VAR_STRING
                        | ColumnType::MYSQL_TYPE_VARCHAR
                        | ColumnType::MYSQL_TYPE_BLOB
                        | ColumnType::MYSQL_TYPE_TINY_BLOB
                        | ColumnType::MYSQL_TYPE_MEDIUM_BLOB
                        | ColumnType::MYSQL_TYPE_LONG_BLOB
                )
            )
    }
}

/// The column flags `mysql_common` derived from the table map's signedness metadata.
pub fn is_unsigned(flags: ColumnFlags) -> bool {
    flags.contains(ColumnFlags::UNSIGNED_FLAG)
}

/// A column's value as the decoder reads it from a row image, or `republish` from a table row.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnValue<'a> {
    /// A value as mysql_common reads it: every column type but a binlog row's JSON.
    Value(Value),
    /// A MySQL `JSON` column in a binlog row image: its bytes after their 4-byte length, in
    /// MySQL's binary format (`json_binary.h`), borrowed from the rows event and rendered as
    /// text only when the event is built ([`crate::decode::json::render_json_binary`]).
    Json(&'a [u8]),
}

/// The text form (UTF-8) of a value used as id, header or key; `None` for NULL.
///
/// Integers in decimal (UNSIGNED as unsigned, so BIGINT UNSIGNED above 2^63 stays positive),
/// binary strings per `binary`, other strings converted from their column character set,
/// ENUM/SET as their labels, temporal values as MySQL prints them, MySQL JSON as MySQL prints it.
///
/// # Errors
/// A message naming the problem (a character set that cannot be converted, bytes invalid in
/// their character set, a malformed binary JSON document).
pub fn text_form(
    value: ColumnValue<'_>,
    info: &ColumnInfo,
    binary: BinaryFormat,
) -> Result<Option<Vec<u8>>, String> {
    let value = match value {
        ColumnValue::Value(v) => v,
        ColumnValue::Json(doc) => {
            return crate::decode::json::render_json_binary_to_vec(doc)
                .map(Some)
                .map_err(|e| e.to_string())
        }
    };
    Ok(Some(match value {
        Value::NULL => return Ok(None),
        Value::Int(i) => match (&info.column_type, &info.labels) {
            (Some(ColumnType::MYSQL_TYPE_ENUM), Some(labels)) => enum_label(i, labels)?,
            (Some(ColumnType::MYSQL_TYPE_SET), Some(labels)) => set_members(i, labels),
            // A negative value in an UNSIGNED column was decoded without signedness metadata:
            // read the same bits as unsigned (two's complement), as the server stored them.
            // itoa rather than `to_string`: no formatter machinery for the id of every row.
            _ if info.unsigned && i < 0 => itoa::Buffer::new()
                .format(unsigned_bits(i, info.column_type))
                .as_bytes()
                .to_vec(),
            _ => itoa::Buffer::new().format(i).as_bytes().to_vec(),
        },
        Value::UInt(u) => itoa::Buffer::new().format(u).as_bytes().to_vec(),
        Value::Float(f) => f.to_string().into_bytes(),
        Value::Double(f) => f.to_string().into_bytes(),
        v @ (Value::Date(..) | Value::Time(..)) => {
            v.as_sql(true).trim_matches('\'').as_bytes().to_vec()
        }
        Value::Bytes(b) if info.is_binary() => match binary {
            _ if info.fixed_len.is_some_and(|n| b.len() < n) => {
                return text_form(
                    ColumnValue::Value(Value::Bytes(pad_binary(b, info.fixed_len))),
                    &ColumnInfo {
                        fixed_len: None,
                        ..info.clone()
                    },
                    binary,
                )
            }
            BinaryFormat::Raw => b,
            BinaryFormat::Uuid if b.len() == 16 => uuid_text(&b).into_bytes(),
            BinaryFormat::Uuid | BinaryFormat::Hex => hex(&b).into_bytes(),
        },
        Value::Bytes(b) => to_utf8(b, info.collation)?,
    }))
}

/// A row's additional columns (`outbox.additional`) placed per their mapping: header values
/// (text forms, NULLs left out) and envelope fields (JSON text), in configured order.
#[derive(Debug, Default)]
pub struct AdditionalFields {
    /// (header name, text form).
    pub headers: Vec<(String, Vec<u8>)>,
    /// (field name, JSON text).
    pub envelope: Vec<(String, Vec<u8>)>,
}

impl AdditionalFields {
    /// Places `value` of the additional column `a` (its column `info`).
    ///
    /// # Errors
    /// The value cannot be converted (see [`text_form`], [`json_field`]); the message names
    /// the column.
    pub fn place(
        &mut self,
        a: &AdditionalColumn,
        value: ColumnValue<'_>,
        info: &ColumnInfo,
        binary: BinaryFormat,
    ) -> Result<(), String> {
        let name = a.alias.clone().unwrap_or_else(|| a.column.clone());
        let named = |e: String| format!("column {:?}: {e}", info.name);
        match a.placement {
            Placement::Header => {
                if let Some(text) = text_form(value, info, binary).map_err(named)? {
                    self.headers.push((name, text));
                }
            }
            Placement::Envelope => self
                .envelope
                .push((name, json_field(value, info, binary).map_err(named)?)),
        }
        Ok(())
    }
}

/// The bytes of a value as stored (the payload, or a raw key): strings and binary untouched,
/// MySQL JSON rendered, anything else in its text form.
///
/// # Errors
/// As [`text_form`].
pub fn raw_bytes(value: ColumnValue<'_>, info: &ColumnInfo) -> Result<Option<Vec<u8>>, String> {
    match value {
        ColumnValue::Value(Value::Bytes(b)) if info.is_binary() => {
            Ok(Some(pad_binary(b, info.fixed_len)))
        }
        ColumnValue::Value(Value::Bytes(b)) => Ok(Some(b)),
        other => text_form(other, info, BinaryFormat::Raw),
    }
}

/// The JSON text of a value for an envelope field: integers and floats as JSON numbers, NULL as
/// `null`, MySQL JSON embedded as is, everything else as a JSON string of its text form.
///
/// # Errors
/// As [`text_form`]; also a text form that is not UTF-8.
pub fn json_field(
    value: ColumnValue<'_>,
    info: &ColumnInfo,
    binary: BinaryFormat,
) -> Result<Vec<u8>, String> {
    let is_json = matches!(value, ColumnValue::Json(_));
    let is_number = match &value {
        ColumnValue::Value(Value::UInt(_)) => true,
        ColumnValue::Value(Value::Int(_)) => !matches!(
            info.column_type,
            Some(ColumnType::MYSQL_TYPE_ENUM | ColumnType::MYSQL_TYPE_SET)
        ),
        ColumnValue::Value(Value::Float(f)) => f.is_finite(),
        ColumnValue::Value(Value::Double(f)) => f.is_finite(),
        _ => false,
    };
    let Some(text) = text_form(value, info, binary)? else {
        return Ok(b"null".to_vec());
    };
    if is_json || is_number {
        return Ok(text);
    }
    let text =
        String::from_utf8(text).map_err(|_| format!("column {:?} is not UTF-8 text", info.name))?;
    serde_json::to_vec(&text).map_err(|e| e.to_string())
}

fn pad_binary(mut b: Vec<u8>, len: Option<usize>) -> Vec<u8> {
    if let Some(n) = len {
        if b.len() < n {
            b.resize(n, 0);
        }
    }
    b
}

fn unsigned_bits(i: i64, ty: Option<ColumnType>) -> u64 {
    let bits = i as u64; // two's complement reinterpretation is the point
    match ty {
        Some(ColumnType::MYSQL_TYPE_TINY) => bits & 0xff,
        Some(ColumnType::MYSQL_TYPE_SHORT) => bits & 0xffff,
        Some(ColumnType::MYSQL_TYPE_INT24) => bits & 0xff_ffff,
        Some(ColumnType::MYSQL_TYPE_LONG) => bits & 0xffff_ffff,
        _ => bits,
    }
}

fn enum_label(index: i64, labels: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    // ENUM index 0 is the empty string MySQL stores for an invalid value.
    if index == 0 {
        return Ok(Vec::new());
    }
    usize::try_from(index - 1)
        .ok()
        .and_then(|i| labels.get(i))
        .cloned()
        .ok_or_else(|| format!("ENUM index {index} has no label in the table map"))
}

fn set_members(bits: i64, names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate().take(64) {
        if bits as u64 & (1u64 << i) != 0 {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(name);
        }
    }
    out
}

/// Canonical lowercase UUID text of 16 bytes (RFC 9562 section 4), as `BIN_TO_UUID(b)`.
pub fn uuid_text(b: &[u8]) -> String {
    let h = hex(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for byte in b {
        let _ = write!(s, "{byte:02x}");
    }
    s
}

/// The character set of a collation id from a table map: MySQL's ids (1-323, as `mysql_common`
/// knows them), then MariaDB's own ranges, which MySQL does not use: the language collations of
/// utf8mb3/utf8mb4/ucs2/utf16/utf32 (576-767), the NO PAD variants (1024-2047: the PAD SPACE
/// collation id + 1024, e.g. `utf8mb4_nopad_bin` 1070 = `utf8mb4_bin` 46 + 1024) and the UCA 14.0
/// family (2048-3327: 256 ids per character set, `utf8mb4_uca1400_ai_ci` is 2304).
///
/// Source: MariaDB's `information_schema.COLLATION_CHARACTER_SET_APPLICABILITY` (column `ID`,
/// 10.10+) and MySQL's `information_schema.COLLATIONS`. `None` for an id neither server defines
/// (0 means the table map carries no character set).
pub fn collation_charset(collation: u16) -> Option<&'static str> {
    let known = Collation::resolve(CollationId::from(collation)).charset;
    if known != "unknown" && !known.is_empty() {
        return Some(known);
    }
    match collation {
        576..=607 | 2048..=2303 => Some("utf8mb3"),
        608..=639 | 2304..=2559 => Some("utf8mb4"),
        640..=671 | 2560..=2815 => Some("ucs2"),
        672..=703 | 2816..=3071 => Some("utf16"),
        736..=767 | 3072..=3327 => Some("utf32"),
        1024..=2047 => collation_charset(collation - 1024),
        _ => None,
    }
}

/// UTF-32 (big-endian, as MySQL and MariaDB store it) to UTF-8.
fn utf32_to_utf8(bytes: &[u8]) -> Result<Vec<u8>, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "the value is not valid utf32 text ({} bytes)",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(4)
        .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect::<Option<String>>()
        .map(String::into_bytes)
        .ok_or_else(|| "the value is not valid utf32 text".to_owned())
}

/// Converts a string value from its column character set to UTF-8.
fn to_utf8(bytes: Vec<u8>, collation: u16) -> Result<Vec<u8>, String> {
    let Some(charset) = collation_charset(collation) else {
        // Unknown collation (0: no charset metadata, or an id no server here defines): valid
        // UTF-8 is kept, anything else is refused rather than guessed.
        return match String::from_utf8(bytes) {
            Ok(s) => Ok(s.into_bytes()),
            Err(_) => Err(format!(
                "the value is not UTF-8 and its collation (id {collation}) is unknown to the \
                 relay; store outbox text columns in utf8mb4"
            )),
        };
    };
    let encoding = match charset {
        // Already UTF-8 (or a subset of it).
        "utf8mb4" | "utf8mb3" | "utf8" | "ascii" | "binary" => return Ok(bytes),
        // MySQL's latin1 is Windows-1252.
        "latin1" => encoding_rs::WINDOWS_1252,
        "latin2" => encoding_rs::ISO_8859_2,
        "greek" => encoding_rs::ISO_8859_7,
        "hebrew" => encoding_rs::ISO_8859_8,
        "koi8r" => encoding_rs::KOI8_R,
        "koi8u" => encoding_rs::KOI8_U,
        "cp1250" => encoding_rs::WINDOWS_1250,
        "cp1251" => encoding_rs::WINDOWS_1251,
        "cp1256" => encoding_rs::WINDOWS_1256,
        "cp1257" => encoding_rs::WINDOWS_1257,
        "sjis" | "cp932" => encoding_rs::SHIFT_JIS,
        "ujis" | "eucjpms" => encoding_rs::EUC_JP,
        "euckr" => encoding_rs::EUC_KR,
        "gbk" | "gb2312" => encoding_rs::GBK,
        "gb18030" => encoding_rs::GB18030,
        "big5" => encoding_rs::BIG5,
        // UCS-2 is UTF-16 restricted to the BMP (big-endian in MySQL and MariaDB).
        "utf16" | "ucs2" => encoding_rs::UTF_16BE,
        "utf32" => return utf32_to_utf8(&bytes),
        "utf16le" => encoding_rs::UTF_16LE,
        other => {
            return Err(format!(
                "character set {other} cannot be converted to UTF-8 by the relay; store outbox \
                 text columns in utf8mb4"
            ))
        }
    };
    let (text, had_errors) = encoding.decode_without_bom_handling(&bytes);
    if had_errors {
        return Err(format!("the value is not valid {charset} text"));
    }
    Ok(text.into_owned().into_bytes())
}

/// Epoch ms of a DATETIME (read in `zone`) or TIMESTAMP (UTC) value; `None` for NULL or a zero
/// date.
///
/// DATETIME values in a daylight-saving overlap take the earlier instant; values in a gap (a
/// local time that did not exist) are an error.
///
/// # Errors
/// A message for an invalid date or a non-temporal column.
pub fn timestamp_ms(v: &Value, zone: chrono_tz::Tz) -> Result<Option<i64>, String> {
    use chrono::TimeZone;
    match v {
        Value::NULL => Ok(None),
        Value::Date(0, 0, 0, ..) => Ok(None),
        Value::Date(y, mo, d, h, mi, s, us) => {
            let local =
                chrono::NaiveDate::from_ymd_opt(i32::from(*y), u32::from(*mo), u32::from(*d))
                    .and_then(|date| {
                        date.and_hms_micro_opt(u32::from(*h), u32::from(*mi), u32::from(*s), *us)
                    })
                    .ok_or_else(|| format!("created_at {v:?} is not a valid date-time"))?;
            let instant = zone.from_local_datetime(&local).earliest().ok_or_else(|| {
                format!(
                    "created_at {local} does not exist in time zone {zone} (a daylight-saving \
                     gap); check outbox.datetime_time_zone"
                )
            })?;
            Ok(Some(instant.timestamp_millis()))
        }
        // TIMESTAMP(0): seconds since the epoch.
        Value::Int(secs) => Ok(Some(secs.saturating_mul(1000))),
        // TIMESTAMP(n), n > 0: "seconds.micros" text, as mysql_common decodes TIMESTAMP2.
        Value::Bytes(b) => {
            let text = std::str::from_utf8(b).map_err(|_| "created_at is not a timestamp")?;
            let (secs, frac) = text.split_once('.').unwrap_or((text, "0"));
            let secs: i64 = secs
                .parse()
                .map_err(|_| format!("created_at {text:?} is not a timestamp"))?;
            let micros: i64 = format!("{frac:0<6}")
                .get(..6)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("created_at {text:?} is not a timestamp"))?;
            Ok(Some(secs * 1000 + micros / 1000))
        }
        other => Err(format!(
            "created_at has an unsupported type ({other:?}); map a DATETIME or TIMESTAMP column, \
             or set outbox.columns.created_at = \"\" to use the binlog event time"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: ColumnType, collation: u16) -> ColumnInfo {
        ColumnInfo {
            name: "c".into(),
            column_type: Some(ty),
            collation,
            ..ColumnInfo::default()
        }
    }

    fn text(v: Value, i: &ColumnInfo) -> Option<Vec<u8>> {
        text_form(ColumnValue::Value(v), i, BinaryFormat::Uuid).expect("converts")
    }

    #[test]
    fn datetime_is_read_in_the_configured_zone() {
        let v = Value::Date(2026, 1, 2, 3, 4, 5, 678_901);
        // 2026-01-02T03:04:05.678Z
        assert_eq!(
            timestamp_ms(&v, chrono_tz::UTC),
            Ok(Some(1_767_323_045_678))
        );
        // Berlin is UTC+1 in January: the same wall time is one hour earlier in UTC.
        assert_eq!(
            timestamp_ms(&v, chrono_tz::Europe::Berlin),
            Ok(Some(1_767_323_045_678 - 3_600_000))
        );
        assert_eq!(
            timestamp_ms(&Value::Date(0, 0, 0, 0, 0, 0, 0), chrono_tz::UTC),
            Ok(None)
        );
        assert!(timestamp_ms(&Value::Date(2026, 2, 30, 0, 0, 0, 0), chrono_tz::UTC).is_err());
        // 2026-03-29 02:30 does not exist in Berlin (clocks jump from 02:00 to 03:00).
        let gap = timestamp_ms(
            &Value::Date(2026, 3, 29, 2, 30, 0, 0),
            chrono_tz::Europe::Berlin,
        );
        assert!(gap.expect_err("gap").contains("does not exist"));
    }

    #[test]
    fn timestamp_columns_are_utc_whatever_the_zone() {
        let berlin = chrono_tz::Europe::Berlin;
        assert_eq!(
            timestamp_ms(&Value::Int(1_767_323_045), berlin),
            Ok(Some(1_767_323_045_000))
        );
        assert_eq!(
            timestamp_ms(&Value::Bytes(b"1767323045.678901".to_vec()), berlin),
            Ok(Some(1_767_323_045_678))
        );
        assert_eq!(
            timestamp_ms(&Value::Bytes(b"1767323045.5".to_vec()), berlin),
            Ok(Some(1_767_323_045_500))
        );
    }

    #[test]
    fn integers_keep_their_sign_and_width() {
        let bigint = info(ColumnType::MYSQL_TYPE_LONGLONG, 0);
        assert_eq!(text(Value::Int(-42), &bigint), Some(b"-42".to_vec()));
        assert_eq!(
            text(Value::UInt(u64::MAX), &bigint),
            Some(b"18446744073709551615".to_vec())
        );
        let unsigned_bigint = ColumnInfo {
            unsigned: true,
            ..bigint.clone()
        };
        // 2^63 + 1 decoded as signed is -9223372036854775807.
        assert_eq!(
            text(Value::Int(-9_223_372_036_854_775_807), &unsigned_bigint),
            Some(b"9223372036854775809".to_vec())
        );
        let unsigned_int = ColumnInfo {
            unsigned: true,
            ..info(ColumnType::MYSQL_TYPE_LONG, 0)
        };
        assert_eq!(
            text(Value::Int(-1), &unsigned_int),
            Some(b"4294967295".to_vec())
        );
        assert_eq!(text(Value::NULL, &bigint), None);
    }

    #[test]
    fn binary_values_follow_the_binary_format() {
        let bin = info(ColumnType::MYSQL_TYPE_STRING, BINARY_COLLATION);
        let uuid: Vec<u8> = (0u8..16).collect();
        let t = |v: &[u8], f| {
            text_form(ColumnValue::Value(Value::Bytes(v.to_vec())), &bin, f).expect("converts")
        };
        assert_eq!(
            t(&uuid, BinaryFormat::Uuid),
            Some(b"00010203-0405-0607-0809-0a0b0c0d0e0f".to_vec())
        );
        assert_eq!(
            t(&uuid, BinaryFormat::Hex),
            Some(b"000102030405060708090a0b0c0d0e0f".to_vec())
        );
        assert_eq!(t(&uuid, BinaryFormat::Raw), Some(uuid.clone()));
        assert_eq!(t(&[0xab, 0x01], BinaryFormat::Uuid), Some(b"ab01".to_vec()));
        // BINARY(16) whose last bytes are 0x00: the binlog drops them, SELECT returns 16 bytes.
        let bin16 = ColumnInfo {
            fixed_len: Some(16),
            ..bin.clone()
        };
        let short = ColumnValue::Value(Value::Bytes(uuid[..14].to_vec()));
        let mut padded = uuid[..14].to_vec();
        padded.extend([0, 0]);
        assert_eq!(
            text_form(short.clone(), &bin16, BinaryFormat::Uuid).expect("converts"),
            Some(b"00010203-0405-0607-0809-0a0b0c0d0000".to_vec())
        );
        assert_eq!(raw_bytes(short, &bin16).expect("raw"), Some(padded));
    }

    #[test]
    fn string_column_lengths_from_table_map_metadata() {
        // BINARY(8): real type 0xfe, length 8 (mariadb-binlog prints meta=65032 = 0xfe08).
        assert_eq!(string_column_length(&[0xfe, 8]), Some(8));
        // CHAR(255) in utf8mb4 is 1020 bytes: 0xfe ^ (1020 >> 8 << 4) = 0xce, low byte 0xfc.
        assert_eq!(string_column_length(&[0xce, 0xfc]), Some(1020));
    }

    #[test]
    fn strings_are_converted_from_their_character_set() {
        // latin1_swedish_ci (8): 0xE9 is é, 0x80 is € (Windows-1252).
        let latin1 = info(ColumnType::MYSQL_TYPE_VARCHAR, 8);
        assert_eq!(
            text(Value::Bytes(vec![b'c', 0xe9, 0x80]), &latin1),
            Some("cé€".as_bytes().to_vec())
        );
        // utf8mb4_general_ci (45) and utf8mb3_general_ci (33): bytes kept.
        for collation in [45, 33] {
            let utf8 = info(ColumnType::MYSQL_TYPE_VARCHAR, collation);
            assert_eq!(
                text(Value::Bytes("ord-😀".as_bytes().to_vec()), &utf8),
                Some("ord-😀".as_bytes().to_vec())
            );
        }
        // Every utf8mb4 collation decodes as UTF-8, with ids read off the servers'
        // information_schema: MySQL 8.0 utf8mb4_0900_ai_ci (255), utf8mb4_0900_bin (309),
        // utf8mb4_de_pb_0900_ai_ci (256); MariaDB 11.4 utf8mb4_uca1400_ai_ci (2304),
        // utf8mb4_uca1400_as_cs_nopad (2503 is the last of the block), utf8mb4_nopad_bin (1070),
        // utf8mb4_general_nopad_ci (1069), utf8mb4_croatian_ci (608), utf8mb3_uca1400_ai_ci (2048).
        for collation in [255, 309, 256, 2304, 2503, 1070, 1069, 608, 2048] {
            let utf8 = info(ColumnType::MYSQL_TYPE_VARCHAR, collation);
            assert_eq!(
                text(Value::Bytes("ord-😀-é".as_bytes().to_vec()), &utf8),
                Some("ord-😀-é".as_bytes().to_vec()),
                "collation id {collation}"
            );
        }
        assert_eq!(collation_charset(2304), Some("utf8mb4"));
        assert_eq!(collation_charset(1070), Some("utf8mb4"));
        assert_eq!(collation_charset(2560), Some("ucs2"));
        // latin1_swedish_nopad_ci (1032) is latin1: converted, not kept.
        assert_eq!(collation_charset(1032), Some("latin1"));
        assert_eq!(
            text(
                Value::Bytes(vec![0xe9]),
                &info(ColumnType::MYSQL_TYPE_VARCHAR, 1032)
            ),
            Some("é".as_bytes().to_vec())
        );
        // ucs2 (2560, ucs2_uca1400_ai_ci) and utf32 (3072) are converted too.
        assert_eq!(
            text(
                Value::Bytes(vec![0, b'a', 0, 0xe9]),
                &info(ColumnType::MYSQL_TYPE_VARCHAR, 2560)
            ),
            Some("aé".as_bytes().to_vec())
        );
        assert_eq!(
            text(
                Value::Bytes(vec![0, 0, 0, b'a', 0, 1, 0xf6, 0]),
                &info(ColumnType::MYSQL_TYPE_VARCHAR, 3072)
            ),
            Some("a😀".as_bytes().to_vec())
        );
        assert_eq!(collation_charset(0), None);
        assert_eq!(collation_charset(4000), None);
        let unknown = info(ColumnType::MYSQL_TYPE_VARCHAR, 0);
        assert!(text_form(
            ColumnValue::Value(Value::Bytes(vec![0xff])),
            &unknown,
            BinaryFormat::Uuid
        )
        .is_err());
    }

    #[test]
    fn enum_and_set_values_become_their_labels() {
        let labels = Some(vec![
            b"BLOB".to_vec(),
            b"JSON".to_vec(),
            b"PROTOBUF".to_vec(),
        ]);
        let e = ColumnInfo {
            labels: labels.clone(),
            ..info(ColumnType::MYSQL_TYPE_ENUM, 45)
        };
        assert_eq!(text(Value::Int(2), &e), Some(b"JSON".to_vec()));
        assert_eq!(text(Value::Int(0), &e), Some(Vec::new()));
        let s = ColumnInfo {
            labels,
            ..info(ColumnType::MYSQL_TYPE_SET, 45)
        };
        assert_eq!(text(Value::Int(0b101), &s), Some(b"BLOB,PROTOBUF".to_vec()));
    }

    #[test]
    fn envelope_fields_are_typed_json() {
        let int = info(ColumnType::MYSQL_TYPE_LONGLONG, 0);
        let s = info(ColumnType::MYSQL_TYPE_VARCHAR, 45);
        let j = |v, i: &ColumnInfo| json_field(ColumnValue::Value(v), i, BinaryFormat::Uuid);
        assert_eq!(j(Value::Int(-7), &int), Ok(b"-7".to_vec()));
        assert_eq!(j(Value::NULL, &int), Ok(b"null".to_vec()));
        assert_eq!(
            j(Value::Bytes(b"a\"b".to_vec()), &s),
            Ok(br#""a\"b""#.to_vec())
        );
    }
}
