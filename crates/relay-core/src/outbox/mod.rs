//! The outbox event: one committed INSERT on an outbox table, as the binlog decoder (and
//! `republish`, from a table row) produce it and a sink routes it; and the table mappings
//! ([`mapping`]) that say which column plays which part.

use std::sync::Arc;

use crate::config::TableName;
use crate::outbox::mapping::TableMapping;
use crate::position::BinlogPosition;

pub mod mapping;
pub mod pattern;

/// One committed INSERT on an outbox table, owned and typed.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    /// The mapping of the table the row was written to.
    pub mapping: Arc<TableMapping>,
    /// The outbox table the row was written to (the mapping's table).
    pub table: Arc<TableName>,
    /// Text form of the `id` column (header `id`).
    pub id: Option<Vec<u8>>,
    /// Text form of the aggregate type (topic template, header `aggregate_type`).
    pub aggregate_type: String,
    /// The Kafka key: the aggregate id's text form (or its stored bytes with
    /// `key_format = "raw"`).
    pub aggregate_id: Vec<u8>,
    /// Header `event_type`.
    pub event_type: Option<Vec<u8>>,
    /// Header `event_key` (consumers' idempotency key).
    pub event_key: Option<Vec<u8>>,
    /// The payload bytes as stored (MySQL JSON rendered as MySQL prints it); `None` for SQL NULL.
    pub payload: Option<Vec<u8>>,
    /// The payload column is MySQL's JSON type (so it is JSON text for an envelope).
    pub payload_is_json: bool,
    /// Explicit partition from the partition column, if mapped and not NULL.
    pub partition: Option<i32>,
    /// Additional columns placed as headers: (header name, text form), NULLs left out.
    pub extra_headers: Vec<(String, Vec<u8>)>,
    /// Additional columns placed in the envelope: (field name, JSON text of the value).
    pub envelope: Vec<(String, Vec<u8>)>,
    /// Record timestamp in ms since the Unix epoch: the transaction's commit time
    /// ([`OutboxEvent::commit_ms`]), or with `timestamp = "column"` the `created_at` value
    /// (DATETIME in the configured zone, TIMESTAMP as UTC) when not NULL.
    pub timestamp_ms: i64,
    /// `timestamp_ms` is the `created_at` value (so a topic's refusal of it may fall back to
    /// `commit_ms`, see `timestamp_refused`).
    pub column_timestamp: bool,
    /// The source transaction's commit time, ms since the Unix epoch: MySQL's
    /// `original_commit_timestamp` (µs precision), else the header time of the transaction's
    /// first event (whole seconds); for an XA transaction, that of its `XA COMMIT`.
    pub commit_ms: i64,
    /// End of the rows event that carried the row (for error messages and tracing).
    pub position: BinlogPosition,
    /// With the Debezium profile: the columns' Connect schemas and the additional columns
    /// (NULLs included), for [`crate::debezium::Profile::record`].
    pub debezium: Option<Box<crate::debezium::DebeziumColumns>>,
}
