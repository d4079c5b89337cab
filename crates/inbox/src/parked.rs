//! Parked versions (`inbox/CONTRACT.md`, "Parked versions"): the stored form of a record that
//! arrived ahead of its aggregate's next version (`migrations/0006_inbox_parked.sql`), and the
//! statements on that table. A leaf: it knows rows and SQL, not the processing.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use mysql_async::Row;

use crate::record::InboxRecord;

/// Record headers in order (name, value bytes; a header may have no value).
pub(crate) type Headers = Vec<(String, Option<Vec<u8>>)>;

/// An aggregate's version slot: the parked table's primary key after the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionKey {
    /// `aggregate_type` header (UTF-8).
    pub aggregate_type: String,
    /// The record key (UTF-8).
    pub aggregate_id: String,
    /// The record's version.
    pub version: i64,
}

/// One parked row, read back.
#[derive(Debug, Clone)]
pub(crate) struct ParkedRow {
    pub key: VersionKey,
    /// The record as it was received (topic, partition and offset of the original).
    pub record: InboxRecord,
    /// `parked_at`, RFC 3339 UTC text.
    pub parked_at: String,
    /// `expires_at` has passed (by the database's clock).
    pub expired: bool,
}

/// The statements on the parked table `t` (a checked plain name).
#[derive(Debug, Clone)]
pub(crate) struct ParkedSql {
    /// Params: consumer, aggregate_type, aggregate_id, version, event_key, topic, partition,
    /// offset, key, value, headers JSON, reason, gap deadline in µs.
    pub insert: String,
    /// Params: consumer, aggregate_type, aggregate_id, version.
    pub select_one: String,
    /// Params: consumer. The 100 rows that expire first.
    pub select_due: String,
    /// Params: consumer, aggregate_type, aggregate_id, version.
    pub delete: String,
    /// Params: consumer. Row count and the oldest row's age in µs (NULL when none).
    pub stats: String,
}

const COLUMNS: &str = "aggregate_type, aggregate_id, version, topic, kafka_partition, \
     kafka_offset, record_key, record_value, record_headers, \
     DATE_FORMAT(CONVERT_TZ(parked_at, @@session.time_zone, '+00:00'), '%Y-%m-%dT%H:%i:%s.%fZ'), \
     expires_at < NOW(6)";

impl ParkedSql {
    pub(crate) fn new(t: &str) -> Self {
        ParkedSql {
            // IGNORE: a redelivered parked record meets its own row (the primary key).
            insert: format!(
                "INSERT IGNORE INTO {t} (consumer, aggregate_type, aggregate_id, version, \
                 event_key, topic, kafka_partition, kafka_offset, record_key, record_value, \
                 record_headers, reason, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \
                 DATE_ADD(NOW(6), INTERVAL ? MICROSECOND))"
            ),
            select_one: format!(
                "SELECT {COLUMNS} FROM {t} WHERE consumer = ? AND aggregate_type = ? AND \
                 aggregate_id = ? AND version = ?"
            ),
            select_due: format!(
                "SELECT {COLUMNS} FROM {t} WHERE consumer = ? ORDER BY expires_at LIMIT 100"
            ),
            delete: format!(
                "DELETE FROM {t} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? \
                 AND version = ?"
            ),
            stats: format!(
                "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), NOW(6)) FROM {t} \
                 WHERE consumer = ?"
            ),
        }
    }
}

/// The parameters of [`ParkedSql::insert`], in its column order (thirteen: more than
/// mysql_async's tuples take). `reason` is cut to the column's 512 characters; `deadline_us`:
/// the gap deadline in microseconds after now.
pub(crate) fn insert_params(
    consumer: &str,
    key: &VersionKey,
    event_key: impl Into<mysql_async::Value>,
    record: &InboxRecord,
    reason: &str,
    deadline_us: u64,
) -> mysql_async::Params {
    mysql_async::Params::Positional(vec![
        consumer.into(),
        key.aggregate_type.as_str().into(),
        key.aggregate_id.as_str().into(),
        key.version.into(),
        event_key.into(),
        record.topic.as_str().into(),
        record.partition.into(),
        record.offset.into(),
        record.key.as_deref().into(),
        record.value.as_deref().into(),
        encode_headers(&record.headers).into(),
        reason.chars().take(512).collect::<String>().into(),
        deadline_us.into(),
    ])
}

/// The record's headers as the table stores them: a JSON array of `[name, base64 value or
/// null]` pairs, in order.
pub(crate) fn encode_headers(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let pairs: Vec<serde_json::Value> = headers
        .iter()
        .map(|(k, v)| serde_json::json!([k, v.as_ref().map(|b| STANDARD.encode(b))]))
        .collect();
    serde_json::Value::Array(pairs).to_string()
}

/// The inverse of [`encode_headers`].
///
/// # Errors
/// The text is not such an array (the message says what is wrong).
pub(crate) fn decode_headers(text: &str) -> Result<Headers, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("record_headers is not JSON: {e}"))?;
    let items = value
        .as_array()
        .ok_or("record_headers is not a JSON array")?;
    items
        .iter()
        .map(|item| {
            let pair = item
                .as_array()
                .filter(|p| p.len() == 2)
                .ok_or("record_headers holds an item that is not a [name, value] pair")?;
            let name = pair[0]
                .as_str()
                .ok_or("record_headers holds a header name that is not a string")?;
            let value = match &pair[1] {
                serde_json::Value::Null => None,
                serde_json::Value::String(b64) => Some(
                    STANDARD
                        .decode(b64)
                        .map_err(|e| format!("record_headers: header {name:?}: {e}"))?,
                ),
                _ => return Err(format!("record_headers: header {name:?}: not base64 text")),
            };
            Ok((name.to_owned(), value))
        })
        .collect()
}

/// A row of [`ParkedSql::select_one`] / [`ParkedSql::select_due`].
///
/// # Errors
/// A column is missing or of another type, or the headers do not decode.
pub(crate) fn from_row(mut row: Row) -> Result<ParkedRow, String> {
    fn take<T: mysql_async::prelude::FromValue>(row: &mut Row, i: usize) -> Result<T, String> {
        row.take_opt::<T, usize>(i)
            .ok_or_else(|| format!("parked row: column {i} missing"))?
            .map_err(|e| format!("parked row: column {i}: {e}"))
    }
    let bytes_text = |b: Vec<u8>, what: &str| {
        String::from_utf8(b).map_err(|_| format!("parked row: {what} is not UTF-8"))
    };
    let aggregate_type = bytes_text(take(&mut row, 0)?, "aggregate_type")?;
    let aggregate_id = bytes_text(take(&mut row, 1)?, "aggregate_id")?;
    let version: i64 = take(&mut row, 2)?;
    let topic: String = take(&mut row, 3)?;
    let partition: i32 = take(&mut row, 4)?;
    let offset: i64 = take(&mut row, 5)?;
    let key: Option<Vec<u8>> = take(&mut row, 6)?;
    let value: Option<Vec<u8>> = take(&mut row, 7)?;
    let headers = decode_headers(&take::<String>(&mut row, 8)?)?;
    let parked_at: String = take(&mut row, 9)?;
    let expired: bool = take::<i64>(&mut row, 10)? != 0;
    Ok(ParkedRow {
        key: VersionKey {
            aggregate_type,
            aggregate_id,
            version,
        },
        record: InboxRecord {
            topic,
            partition,
            offset,
            key,
            value,
            headers,
        },
        parked_at,
        expired,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_with_bytes_and_missing_values() {
        let headers = vec![
            ("event_key".to_owned(), Some(b"evt-1".to_vec())),
            ("bin".to_owned(), Some(vec![0, 255, 10, 13])),
            ("empty".to_owned(), Some(Vec::new())),
            ("none".to_owned(), None),
            ("event_key".to_owned(), Some("é".as_bytes().to_vec())),
        ];
        let text = encode_headers(&headers);
        assert_eq!(decode_headers(&text).unwrap(), headers);
        assert_eq!(encode_headers(&[]), "[]");
    }

    #[test]
    fn headers_are_stored_as_name_and_base64_or_null_pairs() {
        // The contract's form, which every helper reads: [name, base64 value or null] in order
        // (non-UTF-8 bytes survive; a header without value is null, an empty one "").
        let headers = vec![
            ("a".to_owned(), Some(b"1".to_vec())),
            ("none".to_owned(), None),
            ("bin".to_owned(), Some(vec![0xff, 0x00, 0xfe])),
            ("empty".to_owned(), Some(Vec::new())),
        ];
        assert_eq!(
            encode_headers(&headers),
            r#"[["a","MQ=="],["none",null],["bin","/wD+"],["empty",""]]"#
        );
        // As another helper writes it (Python's json.dumps puts spaces after the separators).
        let spaced = r#"[["a", "MQ=="], ["none", null], ["bin", "/wD+"], ["empty", ""]]"#;
        assert_eq!(decode_headers(spaced).unwrap(), headers);
    }

    #[test]
    fn damaged_headers_are_named() {
        assert!(decode_headers("{").unwrap_err().contains("not JSON"));
        assert!(decode_headers("{}")
            .unwrap_err()
            .contains("not a JSON array"));
        assert!(decode_headers("[[1, null]]").unwrap_err().contains("name"));
        assert!(decode_headers("[[\"a\", \"!!\"]]")
            .unwrap_err()
            .contains("\"a\""));
        assert!(decode_headers("[[\"a\"]]").unwrap_err().contains("pair"));
    }
}
