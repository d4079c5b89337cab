//! Retry tiers (`inbox/CONTRACT.md`, "Retry tiers"): the headers of a record's copy to the next
//! tier, and what a copy says about itself (its tier, its `retry_at`, the original record).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::record::InboxRecord;

/// Headers a copy sets or replaces.
pub(crate) const RETRY_COUNT: &str = "retry_count";
pub(crate) const RETRY_AT: &str = "retry_at";
pub(crate) const RETRY_ERROR: &str = "retry_error";
pub(crate) const RETRY_HISTORY: &str = "retry_history";
pub(crate) const ORIGINAL_TOPIC: &str = "original_topic";
pub(crate) const ORIGINAL_PARTITION: &str = "original_partition";
pub(crate) const ORIGINAL_OFFSET: &str = "original_offset";

/// Where a record was first read: its `original_*` headers when it is a copy, else itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// The record's origin (`original_topic`, `original_partition`, `original_offset` when all
/// three are present and valid; the record itself otherwise).
pub(crate) fn origin(record: &InboxRecord) -> Origin {
    let parsed = (|| {
        Some(Origin {
            topic: record.header_str(ORIGINAL_TOPIC)?.to_owned(),
            partition: record.header_str(ORIGINAL_PARTITION)?.trim().parse().ok()?,
            offset: record.header_str(ORIGINAL_OFFSET)?.trim().parse().ok()?,
        })
    })();
    parsed.unwrap_or_else(|| Origin {
        topic: record.topic.clone(),
        partition: record.partition,
        offset: record.offset,
    })
}

/// The topic whose settings apply to the record (`inbox/CONTRACT.md`, "Per-topic settings"):
/// its `original_topic` header when present and not empty (a retry copy), else its own topic.
/// Also the `topic` label of `outbox_inbox_records_total`.
pub(crate) fn settings_topic(record: &InboxRecord) -> &str {
    match record.header_str(ORIGINAL_TOPIC) {
        Some(t) if !t.is_empty() => t,
        _ => &record.topic,
    }
}

/// The tier the record is in: its `retry_count` header (absent or not a number: 0, not a copy).
pub(crate) fn tier(record: &InboxRecord) -> u32 {
    record
        .header_str(RETRY_COUNT)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// When a copy may be processed (its `retry_at` header, ms since the Unix epoch).
pub(crate) fn retry_at(record: &InboxRecord) -> Option<i64> {
    record
        .header_str(RETRY_AT)
        .and_then(|v| v.trim().parse().ok())
}

/// Now, in ms since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The headers of `record`'s copy to tier `n`: every header of the record unchanged, then
/// `retry_count` = `n`, `retry_at` = `now_ms` + `delay`, `original_*` (kept when present, else
/// the record's), `retry_error` = `error`, and `retry_history` = the record's history plus one
/// entry for this record (`attempts` counted, failed at `now_ms`). Replaced headers are removed
/// from their old place and appended.
pub(crate) fn copy_headers(
    record: &InboxRecord,
    n: u32,
    delay: Duration,
    error: &str,
    attempts: u32,
    now_ms: i64,
) -> Vec<(String, Option<Vec<u8>>)> {
    let origin = origin(record);
    let mut history: Vec<serde_json::Value> = record
        .header_str(RETRY_HISTORY)
        .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok())
        .and_then(|v| match v {
            serde_json::Value::Array(a) => Some(a),
            _ => None,
        })
        .unwrap_or_default();
    history.push(serde_json::json!({
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "attempts": attempts,
        "error": error,
        "failed_at": now_ms,
    }));
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    let set: Vec<(&str, String)> = vec![
        (RETRY_COUNT, n.to_string()),
        (RETRY_AT, now_ms.saturating_add(delay_ms).to_string()),
        (ORIGINAL_TOPIC, origin.topic),
        (ORIGINAL_PARTITION, origin.partition.to_string()),
        (ORIGINAL_OFFSET, origin.offset.to_string()),
        (RETRY_ERROR, error.to_owned()),
        (RETRY_HISTORY, serde_json::Value::Array(history).to_string()),
    ];
    let mut headers: Vec<(String, Option<Vec<u8>>)> = record
        .headers
        .iter()
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .cloned()
        .collect();
    headers.extend(
        set.into_iter()
            .map(|(k, v)| (k.to_owned(), Some(v.into_bytes()))),
    );
    headers
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(topic: &str, offset: i64, headers: &[(&str, &str)]) -> InboxRecord {
        InboxRecord {
            topic: topic.into(),
            partition: 2,
            offset,
            key: Some(b"order-1".to_vec()),
            value: Some(b"{}".to_vec()),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
                .collect(),
        }
    }

    fn as_record(topic: &str, offset: i64, headers: Vec<(String, Option<Vec<u8>>)>) -> InboxRecord {
        InboxRecord {
            topic: topic.into(),
            partition: 0,
            offset,
            key: None,
            value: None,
            headers,
        }
    }

    fn get<'a>(h: &'a [(String, Option<Vec<u8>>)], name: &str) -> Vec<&'a str> {
        h.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| std::str::from_utf8(v.as_deref().unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn the_first_copy_names_the_record_and_keeps_its_headers() {
        let r = record("orders", 41, &[("event_key", "e-1"), ("version", "3")]);
        assert_eq!(tier(&r), 0);
        assert_eq!(origin(&r).offset, 41);
        let h = copy_headers(&r, 1, Duration::from_secs(60), "boom", 3, 1_000);
        assert_eq!(get(&h, "event_key"), ["e-1"]);
        assert_eq!(get(&h, "version"), ["3"]);
        assert_eq!(get(&h, RETRY_COUNT), ["1"]);
        assert_eq!(get(&h, RETRY_AT), ["61000"]);
        assert_eq!(get(&h, ORIGINAL_TOPIC), ["orders"]);
        assert_eq!(get(&h, ORIGINAL_PARTITION), ["2"]);
        assert_eq!(get(&h, ORIGINAL_OFFSET), ["41"]);
        assert_eq!(get(&h, RETRY_ERROR), ["boom"]);
        let history: serde_json::Value = serde_json::from_str(get(&h, RETRY_HISTORY)[0]).unwrap();
        assert_eq!(
            history,
            serde_json::json!([{"topic": "orders", "partition": 2, "offset": 41,
                "attempts": 3, "error": "boom", "failed_at": 1000}])
        );
    }

    #[test]
    fn a_copy_of_a_copy_keeps_the_origin_and_accumulates_the_history() {
        let r = record("orders", 41, &[("event_key", "e-1")]);
        let first = as_record(
            "orders.retry.1",
            7,
            copy_headers(&r, 1, Duration::from_secs(60), "boom", 3, 1_000),
        );
        assert_eq!(tier(&first), 1);
        assert_eq!(retry_at(&first), Some(61_000));
        assert_eq!(
            origin(&first),
            Origin {
                topic: "orders".into(),
                partition: 2,
                offset: 41
            }
        );
        let h = copy_headers(
            &first,
            2,
            Duration::from_secs(300),
            "bang \"quoted\"",
            2,
            70_000,
        );
        // Replaced, not repeated.
        assert_eq!(get(&h, RETRY_COUNT), ["2"]);
        assert_eq!(get(&h, RETRY_AT), ["370000"]);
        assert_eq!(get(&h, RETRY_ERROR), ["bang \"quoted\""]);
        assert_eq!(get(&h, ORIGINAL_TOPIC), ["orders"]);
        assert_eq!(get(&h, ORIGINAL_PARTITION), ["2"]);
        assert_eq!(get(&h, ORIGINAL_OFFSET), ["41"]);
        assert_eq!(get(&h, "event_key"), ["e-1"]);
        let history: serde_json::Value = serde_json::from_str(get(&h, RETRY_HISTORY)[0]).unwrap();
        let entries = history.as_array().unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0]["topic"], "orders");
        assert_eq!(entries[0]["offset"], 41);
        assert_eq!(entries[1]["topic"], "orders.retry.1");
        assert_eq!(entries[1]["partition"], 0);
        assert_eq!(entries[1]["offset"], 7);
        assert_eq!(entries[1]["attempts"], 2);
        assert_eq!(entries[1]["error"], "bang \"quoted\"");
        assert_eq!(entries[1]["failed_at"], 70_000);
    }

    #[test]
    fn a_history_that_is_not_an_array_starts_over() {
        let r = record("t", 1, &[(RETRY_HISTORY, "not json"), (RETRY_COUNT, "x")]);
        assert_eq!(tier(&r), 0);
        assert_eq!(retry_at(&r), None);
        let h = copy_headers(&r, 1, Duration::ZERO, "e", 1, 5);
        let history: serde_json::Value = serde_json::from_str(get(&h, RETRY_HISTORY)[0]).unwrap();
        assert_eq!(history.as_array().unwrap().len(), 1);
        assert_eq!(get(&h, RETRY_AT), ["5"]);
    }
}
