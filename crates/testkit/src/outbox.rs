//! Outbox rows as a test's writer generates them, and inserting them.

use anyhow::{ensure, Context, Result};
use mysql_async::prelude::*;
use mysql_async::{Params, Value};

/// One outbox row as the writer generates it: the expected content of one Kafka record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// `aggregate_type`: selects the topic, header `aggregate_type`.
    pub aggregate_type: String,
    /// `aggregate_id`: the record key.
    pub aggregate_id: String,
    /// `event_type`: header `event_type`.
    pub event_type: String,
    /// `event_key` (unique): header `event_key`.
    pub event_key: String,
    /// `payload` JSON text: the record value, byte for byte.
    pub payload: String,
    /// `created_at` in microseconds since the Unix epoch (UTC); inserted explicitly.
    pub created_at_micros: i64,
}

impl OutboxRow {
    /// `created_at` as MariaDB `DATETIME(6)` text (`2026-01-02 03:04:05.678901`).
    ///
    /// # Errors
    /// The time is out of range.
    pub fn created_at_text(&self) -> Result<String> {
        epoch_micros_to_datetime6(self.created_at_micros)
    }

    /// The record timestamp the relay must set: `created_at` in whole milliseconds (truncated).
    pub fn expected_timestamp_ms(&self) -> i64 {
        self.created_at_micros.div_euclid(1_000)
    }
}

/// Microseconds since the epoch as `YYYY-MM-DD HH:MM:SS.ffffff` (UTC).
///
/// # Errors
/// Out of chrono's range.
pub fn epoch_micros_to_datetime6(micros: i64) -> Result<String> {
    let dt = chrono::DateTime::from_timestamp_micros(micros)
        .with_context(|| format!("timestamp {micros} µs out of range"))?;
    Ok(dt.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f").to_string())
}

/// A `created_at` base for generated rows, in µs since the epoch: one hour ago, at a whole
/// second plus 0.678901 s (so the sub-millisecond part is non-zero and truncation to ms shows).
///
/// Record timestamps must be recent: the broker's time-based retention (`log.retention.hours`,
/// 24 on the test broker) deletes records whose timestamp is older, and would make rows vanish
/// from the topics in the middle of a test.
pub fn recent_created_at_base() -> i64 {
    let now_s = chrono::Utc::now().timestamp();
    (now_s - 3_600) * 1_000_000 + 678_901
}

/// How [`insert_outbox_rows`] writes a batch of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertStyle {
    /// One `INSERT … VALUES (…)` statement per row.
    SingleRow,
    /// One `INSERT … VALUES (…), (…), …` statement for the whole batch.
    MultiRow,
}

/// Inserts `rows` into `table` (`outbox` or `` `db`.`outbox` ``, as given) with explicit
/// `created_at`, as prepared statements with bound values (so payload bytes arrive unchanged).
/// Runs on `conn` as is: inside the caller's transaction if one is open.
///
/// # Errors
/// A statement fails (e.g. a duplicate `event_key`).
pub async fn insert_outbox_rows<C>(
    conn: &mut C,
    table: &str,
    rows: &[OutboxRow],
    style: InsertStyle,
) -> Result<()>
where
    C: Queryable,
{
    if rows.is_empty() {
        return Ok(());
    }
    let head = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, event_key, payload, \
         created_at) VALUES "
    );
    let tuple = "(?, ?, ?, ?, ?, ?)";
    let values = |r: &OutboxRow| -> Result<Vec<Value>> {
        Ok(vec![
            Value::from(r.aggregate_type.as_str()),
            Value::from(r.aggregate_id.as_str()),
            Value::from(r.event_type.as_str()),
            Value::from(r.event_key.as_str()),
            Value::from(r.payload.as_str()),
            Value::from(r.created_at_text()?),
        ])
    };
    match style {
        InsertStyle::SingleRow => {
            for r in rows {
                conn.exec_drop(format!("{head}{tuple}"), Params::Positional(values(r)?))
                    .await
                    .with_context(|| format!("inserting {}", r.event_key))?;
            }
        }
        InsertStyle::MultiRow => {
            let placeholders = vec![tuple; rows.len()].join(", ");
            let mut params = Vec::with_capacity(rows.len() * 6);
            for r in rows {
                params.extend(values(r)?);
            }
            ensure!(params.len() < 65_535, "too many rows for one statement");
            conn.exec_drop(format!("{head}{placeholders}"), Params::Positional(params))
                .await
                .with_context(|| format!("inserting {} rows in one statement", rows.len()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime6_text_and_truncated_millis() -> Result<()> {
        // 2026-01-02 03:04:05.678901 UTC
        let micros = 1_767_323_045_678_901;
        let row = OutboxRow {
            aggregate_type: "Order".into(),
            aggregate_id: "o-1".into(),
            event_type: "OrderCreated".into(),
            event_key: "k".into(),
            payload: "{}".into(),
            created_at_micros: micros,
        };
        assert_eq!(row.created_at_text()?, "2026-01-02 03:04:05.678901");
        assert_eq!(row.expected_timestamp_ms(), 1_767_323_045_678);
        Ok(())
    }

    #[test]
    fn recent_base_is_within_the_last_day() {
        let base = recent_created_at_base();
        let now = chrono::Utc::now().timestamp_micros();
        assert!(base < now && base > now - 86_400_000_000);
        assert_eq!(base % 1_000_000, 678_901);
    }
}
