//! An outbox row's column values become an [`OutboxEvent`] here, and only here: for rows read
//! from the binlog (the decoder) and for rows read from the table (`republish`, `trace`).
//! Each reader takes the values out of its own row ([`OutboxColumn`]) and reads `created_at`
//! and the partition column its own way; [`row_values`] turns the values into text forms and
//! bytes, [`outbox_event`] checks the row and builds the event.

use std::sync::Arc;

use mysql_async::consts::ColumnType;

use crate::decode::columns::{raw_bytes, text_form, AdditionalFields, ColumnInfo, ColumnValue};
use outbox_relay_core::config::{KeyFormat, NullPayload};
use outbox_relay_core::debezium::{AdditionalValue, DebeziumColumns};
use outbox_relay_core::outbox::mapping::TableMapping;
use outbox_relay_core::outbox::OutboxEvent;
use outbox_relay_core::position::BinlogPosition;

/// A mapped column of an outbox row, as [`row_values`] asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxColumn {
    /// `outbox.columns.id`.
    Id,
    /// `outbox.columns.aggregate_type`.
    AggregateType,
    /// `outbox.columns.aggregate_id`.
    AggregateId,
    /// `outbox.columns.event_type`.
    EventType,
    /// `outbox.columns.event_key`.
    EventKey,
    /// `outbox.columns.payload`.
    Payload,
    /// The `n`th of `outbox.additional`.
    Additional(usize),
}

/// What an outbox row holds, as the event carries it (`None`: SQL NULL).
#[derive(Debug, Default)]
pub struct RowValues {
    /// Text form of the id.
    pub id: Option<Vec<u8>>,
    /// Text form of the aggregate type.
    pub aggregate_type: Option<Vec<u8>>,
    /// The key: the aggregate id's text form, or its bytes with `key_format = "raw"`.
    pub aggregate_id: Option<Vec<u8>>,
    /// Text form of the event type.
    pub event_type: Option<Vec<u8>>,
    /// Text form of the event key.
    pub event_key: Option<Vec<u8>>,
    /// The payload's bytes.
    pub payload: Option<Vec<u8>>,
    /// The payload is MySQL JSON.
    pub payload_is_json: bool,
    /// The additional columns placed as headers.
    pub extra_headers: Vec<(String, Vec<u8>)>,
    /// The additional columns placed in the envelope.
    pub envelope: Vec<(String, Vec<u8>)>,
    /// With the Debezium profile: the columns' schemas and the additional columns.
    pub debezium: Option<Box<DebeziumColumns>>,
}

/// Reads `mapping`'s columns of a row through `take` (in the order id, aggregate_type,
/// aggregate_id, event_type, event_key, payload, the additional ones); `fail` makes the error
/// of a value that cannot be converted (`column "name": why`), `payload_is_json` tells whether
/// the payload value is MySQL JSON.
///
/// # Errors
/// `take`'s, and `fail`'s for a value that cannot be converted.
pub fn row_values<'v, 'i, E>(
    mapping: &TableMapping,
    mut take: impl FnMut(OutboxColumn) -> Result<(ColumnValue<'v>, &'i ColumnInfo), E>,
    fail: impl Fn(String) -> E,
    payload_is_json: impl FnOnce(&ColumnValue<'v>, &ColumnInfo) -> bool,
) -> Result<RowValues, E> {
    let text = |(v, info): (ColumnValue<'v>, &ColumnInfo)| {
        text_form(v, info, mapping.binary_format)
            .map_err(|e| fail(format!("column {:?}: {e}", info.name)))
    };
    let id = text(take(OutboxColumn::Id)?)?;
    let aggregate_type = text(take(OutboxColumn::AggregateType)?)?;
    let (key_value, key_info) = take(OutboxColumn::AggregateId)?;
    let key_schema = mapping
        .debezium
        .is_some()
        .then(|| key_info.debezium_schema());
    // The Debezium profile: a JSON value of any mapped column in Debezium's JSON text.
    let text_of = |(v, info): (ColumnValue<'v>, &'i ColumnInfo)| {
        if let (Some(_), ColumnValue::Json(doc)) = (&mapping.debezium, &v) {
            return crate::decode::json::render_json_binary_debezium(doc)
                .map(Some)
                .map_err(|e| fail(format!("column {:?}: {e}", info.name)));
        }
        text((v, info))
    };
    let aggregate_id = match mapping.key_format {
        KeyFormat::Text => text_of((key_value, key_info))?,
        KeyFormat::Raw => raw_bytes(key_value, key_info)
            .map_err(|e| fail(format!("column {:?}: {e}", key_info.name)))?,
    };
    let mut values = RowValues {
        id,
        aggregate_type,
        aggregate_id,
        event_type: text(take(OutboxColumn::EventType)?)?,
        event_key: text(take(OutboxColumn::EventKey)?)?,
        ..RowValues::default()
    };
    let (payload_value, payload_info) = take(OutboxColumn::Payload)?;
    values.payload_is_json = payload_is_json(&payload_value, payload_info);
    if let Some(key) = key_schema {
        // The Debezium profile: a MySQL JSON payload in Debezium's JSON text, and every
        // additional column with its schema, NULLs included (null-valued headers).
        let mut payload_schema = payload_info.debezium_schema();
        values.payload = if let ColumnValue::Json(doc) = &payload_value {
            payload_schema = outbox_relay_core::debezium::ColumnSchema::json(payload_info.nullable);
            Some(
                crate::decode::json::render_json_binary_debezium(doc)
                    .map_err(|e| fail(format!("column {:?}: {e}", payload_info.name)))?,
            )
        } else if payload_info.column_type == Some(ColumnType::MYSQL_TYPE_JSON) {
            // A JSON value read with SQL (`republish`): MySQL's text, read back and written as
            // Debezium's formatter would (a JSON DECIMAL then prints as a double).
            payload_schema = outbox_relay_core::debezium::ColumnSchema::json(payload_info.nullable);
            match raw_bytes(payload_value, payload_info)
                .map_err(|e| fail(format!("column {:?}: {e}", payload_info.name)))?
            {
                Some(text) => {
                    let node =
                        outbox_relay_core::debezium::json::parse(&String::from_utf8_lossy(&text))
                            .map_err(|e| fail(format!("column {:?}: {e}", payload_info.name)))?;
                    let mut out = Vec::with_capacity(text.len());
                    outbox_relay_core::debezium::json::write_debezium(&node, &mut out);
                    Some(out)
                }
                None => None,
            }
        } else if payload_info.is_text() {
            // Debezium decodes a text column from its character set: UTF-8 here too.
            text((payload_value, payload_info))?
        } else {
            raw_bytes(payload_value, payload_info)
                .map_err(|e| fail(format!("column {:?}: {e}", payload_info.name)))?
        };
        let mut additional = Vec::with_capacity(mapping.additional.len());
        for (i, a) in mapping.additional.iter().enumerate() {
            let (v, info) = take(OutboxColumn::Additional(i))?;
            let schema = info.debezium_schema();
            additional.push(AdditionalValue {
                alias: a.alias.clone().unwrap_or_else(|| a.column.clone()),
                placement: a.placement,
                column: schema,
                text: text_of((v, info))?,
            });
        }
        values.debezium = Some(Box::new(DebeziumColumns {
            key,
            payload: payload_schema,
            additional,
        }));
        return Ok(values);
    }
    values.payload = raw_bytes(payload_value, payload_info)
        .map_err(|e| fail(format!("column {:?}: {e}", payload_info.name)))?;
    let mut fields = AdditionalFields::default();
    for (i, a) in mapping.additional.iter().enumerate() {
        let (v, info) = take(OutboxColumn::Additional(i))?;
        fields
            .place(a, v, info, mapping.binary_format)
            .map_err(&fail)?;
    }
    values.extra_headers = fields.headers;
    values.envelope = fields.envelope;
    Ok(values)
}

/// An outbox row that cannot become an event: why, and its values.
#[derive(Debug)]
pub struct Unbuildable {
    /// Why (a NULL aggregate type or id, an aggregate type that is not UTF-8, a NULL payload
    /// with `null_payload = "dead_letter"`).
    pub reason: String,
    /// What the row holds.
    pub values: RowValues,
}

/// The event of an outbox row of `mapping` with `values`, its explicit `partition`, its
/// `created_at` time (`column_ms`, with `timestamp = "column"`; `None`: the commit time), the
/// commit time and the position; `None` for a row with a NULL payload and
/// `null_payload = "skip"`.
///
/// # Errors
/// [`Unbuildable`] for a row that cannot become a record.
pub fn outbox_event(
    mapping: &Arc<TableMapping>,
    values: RowValues,
    partition: Option<i32>,
    column_ms: Option<i64>,
    commit_ms: i64,
    position: BinlogPosition,
) -> Result<Option<OutboxEvent>, Box<Unbuildable>> {
    let problem = match (
        &values.aggregate_type,
        &values.aggregate_id,
        &values.payload,
    ) {
        (None, _, _) => Some("aggregate_type is NULL: cannot route the row to a topic".into()),
        (Some(t), _, _) if std::str::from_utf8(t).is_err() => {
            Some("aggregate_type is not valid UTF-8 text".into())
        }
        (_, None, _) => Some("aggregate_id is NULL: the row has no partition key".into()),
        (_, _, None) => match mapping.null_payload {
            NullPayload::Tombstone => None,
            NullPayload::Skip => return Ok(None),
            NullPayload::DeadLetter => {
                Some("payload is NULL (outbox.null_payload = \"dead_letter\")".to_owned())
            }
        },
        _ => None,
    };
    if let Some(reason) = problem {
        return Err(Box::new(Unbuildable { reason, values }));
    }
    // Both are set here: a NULL one is a problem above.
    let mut values = values;
    let (Some(aggregate_type), Some(aggregate_id)) =
        (values.aggregate_type.take(), values.aggregate_id.take())
    else {
        return Err(Box::new(Unbuildable {
            reason: "incomplete row".into(),
            values,
        }));
    };
    Ok(Some(OutboxEvent {
        mapping: Arc::clone(mapping),
        table: Arc::clone(&mapping.table),
        aggregate_type: String::from_utf8(aggregate_type).unwrap_or_default(),
        aggregate_id,
        id: values.id,
        event_type: values.event_type,
        event_key: values.event_key,
        payload: values.payload,
        payload_is_json: values.payload_is_json,
        partition,
        extra_headers: values.extra_headers,
        envelope: values.envelope,
        // A NULL created_at has no time of its own: the commit time, as without one.
        timestamp_ms: column_ms.unwrap_or(commit_ms),
        column_timestamp: column_ms.is_some(),
        commit_ms,
        position,
        debezium: values.debezium,
    }))
}
