//! The temporal columns of the formats before MySQL 5.6 (`MYSQL_TYPE_DATETIME`, `_TIME`,
//! `_TIMESTAMP`), as row events carry them: tables created before MySQL 5.6 / MariaDB 10.1, or
//! on MariaDB with `mysql56_temporal_format=OFF`.
//!
//! Without fractional seconds they are MySQL's classic formats: DATETIME an 8-byte
//! little-endian `YYYYMMDDhhmmss`, TIME a signed 3-byte `±hhmmss`, TIMESTAMP 4 bytes of epoch
//! seconds. With fractional seconds (MariaDB 5.3's "hires" formats, `sql/field.cc`
//! `Field_datetime_hires`, `Field_time_hires`, `Field_timestamp_hires`) they are big-endian
//! packed values whose length depends on the precision, which the table map does not carry:
//! the relay reads it from `information_schema.COLUMNS.DATETIME_PRECISION`.

use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::io::ParseBuf;

/// Bytes of a hires DATETIME value by precision (MariaDB `datetime_hires_bytes`).
const DATETIME_BYTES: [usize; 7] = [5, 6, 6, 7, 7, 7, 8];
/// Bytes of a hires TIME value by precision (MariaDB `time_hires_bytes`).
const TIME_BYTES: [usize; 7] = [3, 4, 4, 5, 5, 5, 6];
/// Bytes of a hires TIMESTAMP's fraction by precision (MariaDB `sec_part_bytes`).
const FRACTION_BYTES: [usize; 7] = [0, 1, 1, 2, 2, 3, 3];
/// 838:59:59 in seconds: the largest TIME; hires TIME values are stored above this zero point.
const TIME_MAX_SECONDS: i64 = 838 * 3600 + 59 * 60 + 59;

/// Whether `ty` is one of the pre-5.6 temporal types this module reads.
pub fn is_old_temporal(ty: ColumnType) -> bool {
    matches!(
        ty,
        ColumnType::MYSQL_TYPE_DATETIME
            | ColumnType::MYSQL_TYPE_TIME
            | ColumnType::MYSQL_TYPE_TIMESTAMP
    )
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

fn big_endian(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |v, &b| (v << 8) | u64::from(b))
}

/// 10^(6 - `decimals`): what a hires value of that precision is scaled down by.
fn scale(decimals: u8) -> u64 {
    10u64.pow(6 - u32::from(decimals.min(6)))
}

/// Reads one value of the pre-5.6 temporal type `ty` with `decimals` fractional digits (0–6)
/// from `buf`, in the shapes mysql_common gives the 5.6 types: DATETIME as `Value::Date`, TIME
/// as `Value::Time`, TIMESTAMP as `Value::Int` epoch seconds, or `"seconds.micros"` bytes
/// with a fraction (as TIMESTAMP2).
///
/// # Errors
/// `decimals` above 6, too few bytes, or a value no server writes (a month above 12, …).
pub fn read(buf: &mut ParseBuf<'_>, ty: ColumnType, decimals: u8) -> std::io::Result<Value> {
    if decimals > 6 {
        return Err(invalid(format!(
            "fractional second precision {decimals} (at most 6)"
        )));
    }
    let d = usize::from(decimals);
    match (ty, decimals) {
        (ColumnType::MYSQL_TYPE_DATETIME, 0) => {
            let raw: [u8; 8] = buf.parse(())?;
            let v = u64::from_le_bytes(raw);
            let (date, time) = (v / 1_000_000, v % 1_000_000);
            datetime(
                date / 10_000,
                date / 100 % 100,
                date % 100,
                time / 10_000,
                time / 100 % 100,
                time % 100,
                0,
            )
        }
        (ColumnType::MYSQL_TYPE_DATETIME, _) => {
            let bytes: &[u8] = buf.parse(DATETIME_BYTES[d])?;
            // ((((year*13+month)*32+day)*24+hour)*60+minute)*60+second, then micros.
            let mut x = u128::from(big_endian(bytes)) * u128::from(scale(decimals));
            let mut next = |n: u128| {
                let part = x % n;
                x /= n;
                part as u64
            };
            let (us, s, mi, h, day, mo) = (
                next(1_000_000),
                next(60),
                next(60),
                next(24),
                next(32),
                next(13),
            );
            datetime(x as u64, mo, day, h, mi, s, us)
        }
        (ColumnType::MYSQL_TYPE_TIME, 0) => {
            let raw: [u8; 3] = buf.parse(())?;
            // A signed 24-bit ±(hh*10000 + mm*100 + ss).
            let v = i32::from_le_bytes([
                raw[0],
                raw[1],
                raw[2],
                if raw[2] & 0x80 != 0 { 0xff } else { 0 },
            ]);
            let abs = i64::from(v).abs();
            time(v < 0, abs / 10_000, abs / 100 % 100, abs % 100, 0)
        }
        (ColumnType::MYSQL_TYPE_TIME, _) => {
            let bytes: &[u8] = buf.parse(TIME_BYTES[d])?;
            let zero = (TIME_MAX_SECONDS + 1) * 1_000_000 / scale(decimals) as i64;
            let v = (big_endian(bytes) as i64 - zero) * scale(decimals) as i64;
            let abs = v.abs();
            let secs = abs / 1_000_000;
            time(
                v < 0,
                secs / 3600,
                secs / 60 % 60,
                secs % 60,
                abs % 1_000_000,
            )
        }
        (ColumnType::MYSQL_TYPE_TIMESTAMP, 0) => {
            let raw: [u8; 4] = buf.parse(())?;
            Ok(Value::Int(i64::from(u32::from_le_bytes(raw))))
        }
        (ColumnType::MYSQL_TYPE_TIMESTAMP, _) => {
            let secs: &[u8] = buf.parse(4)?;
            let fraction: &[u8] = buf.parse(FRACTION_BYTES[d])?;
            let secs = big_endian(secs);
            let us = big_endian(fraction) * scale(decimals);
            Ok(Value::Bytes(if us == 0 {
                secs.to_string().into_bytes()
            } else {
                format!("{secs}.{us:06}").into_bytes()
            }))
        }
        _ => Err(invalid(format!("{ty:?} is not a pre-5.6 temporal type"))),
    }
}

fn datetime(y: u64, mo: u64, d: u64, h: u64, mi: u64, s: u64, us: u64) -> std::io::Result<Value> {
    let fits = y <= 9999 && mo <= 12 && d <= 31 && h <= 23 && mi <= 59 && s <= 59 && us < 1_000_000;
    if !fits {
        return Err(invalid(format!(
            "DATETIME {y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{us:06} is out of range"
        )));
    }
    // Checked above: each part fits its type.
    Ok(Value::Date(
        y as u16, mo as u8, d as u8, h as u8, mi as u8, s as u8, us as u32,
    ))
}

fn time(neg: bool, hours: i64, mi: i64, s: i64, us: i64) -> std::io::Result<Value> {
    if hours > 838 || mi > 59 || s > 59 {
        return Err(invalid(format!(
            "TIME {}{hours}:{mi:02}:{s:02} is out of range",
            if neg { "-" } else { "" }
        )));
    }
    // As mysql_common splits TIME2: whole days, then hours of the day.
    Ok(Value::Time(
        neg,
        (hours / 24) as u32,
        (hours % 24) as u8,
        mi as u8,
        s as u8,
        us as u32,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn one(ty: ColumnType, decimals: u8, bytes: &str) -> std::io::Result<Value> {
        let data = hex(bytes);
        let mut buf = ParseBuf(&data);
        let v = read(&mut buf, ty, decimals)?;
        assert!(buf.is_empty(), "{} bytes left", buf.len());
        Ok(v)
    }

    /// Values of a row MariaDB 10.11 logged for a table created with
    /// `mysql56_temporal_format=OFF` (bytes from its binlog file).
    #[test]
    fn mariadb_hires_and_classic_values() {
        use ColumnType::*;
        let v = |ty, d, b| one(ty, d, b).expect("decodes");
        assert_eq!(
            v(MYSQL_TYPE_DATETIME, 0, "45442f2c6d120000"),
            Value::Date(2026, 1, 2, 3, 4, 5, 0)
        );
        assert_eq!(
            v(MYSQL_TYPE_DATETIME, 6, "0102b7739549f580"),
            Value::Date(2026, 1, 2, 3, 4, 5, 123_456)
        );
        assert_eq!(
            v(MYSQL_TYPE_DATETIME, 3, "004160fbf7fff3"),
            Value::Date(1999, 12, 31, 23, 59, 59, 987_000)
        );
        assert_eq!(
            v(MYSQL_TYPE_TIME, 0, "590a80"),
            Value::Time(true, 34, 22, 59, 59, 0)
        );
        assert_eq!(
            v(MYSQL_TYPE_TIME, 4, "07234c34d3"),
            Value::Time(false, 0, 12, 34, 56, 789_100)
        );
        assert_eq!(
            v(MYSQL_TYPE_TIMESTAMP, 0, "a5355769"),
            Value::Int(1_767_323_045)
        );
        assert_eq!(
            v(MYSQL_TYPE_TIMESTAMP, 6, "695735a5000001"),
            Value::Bytes(b"1767323045.000001".to_vec())
        );
    }

    #[test]
    fn short_or_impossible_values_are_errors() {
        use ColumnType::*;
        assert!(one(MYSQL_TYPE_DATETIME, 6, "0102b7").is_err());
        assert!(one(MYSQL_TYPE_DATETIME, 7, "0102b7739549f580").is_err());
        assert!(one(MYSQL_TYPE_DATETIME, 6, "ffffffffffffffff").is_err());
        assert!(one(MYSQL_TYPE_TIME, 2, "ffffffff").is_err());
        assert!(one(MYSQL_TYPE_DATETIME, 0, "ffffffffffffffff").is_err());
    }
}
