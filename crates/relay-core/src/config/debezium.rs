//! `[debezium]`: with `[outbox] compat = "debezium"`, the settings of the Debezium outbox event
//! router (`io.debezium.transforms.outbox.EventRouter`) and of the Kafka Connect worker's
//! converters that a team ran, so the relay writes the bytes Debezium wrote. Every setting
//! also takes Debezium's own name (`"table.expand.json.payload" = true`).
//! Sources: Debezium 3.x documentation "Outbox Event Router" (configuration options), Kafka
//! Connect worker configuration (`key.converter`, `value.converter`, `schemas.enable`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[outbox] compat`: whose record layout the relay writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compat {
    /// The relay's own layout (`[outbox]` columns, headers, topic template).
    #[default]
    Relay,
    /// Debezium's outbox event router with the `[debezium]` settings: its column names and
    /// defaults, its headers, its key and value bytes under the configured converters.
    Debezium,
}

/// A Kafka Connect converter of the worker (`key.converter` / `value.converter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Converter {
    /// `org.apache.kafka.connect.storage.StringConverter`: the value's text, UTF-8.
    String,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`: JSON.
    Json,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=true` (the worker's
    /// default): `{"schema":…,"payload":…}`.
    JsonSchemas,
}

/// `timestamp`: the record timestamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DebeziumTimestamp {
    /// The source transaction's commit time (as `outbox.timestamp = "commit"`).
    #[default]
    Commit,
    /// The time the relay builds the record, as Debezium stamps its records (the change
    /// event's `ts_ms`: when the connector processed the event).
    Processing,
}

/// `table.json.payload.null.behavior`: JSON nulls in an expanded payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JsonNullBehavior {
    /// Left out (Debezium's default).
    #[default]
    Ignore,
    /// Kept, as optional bytes holding null.
    OptionalBytes,
}

/// `[debezium]`, used with `[outbox] compat = "debezium"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DebeziumConfig {
    /// The worker's `key.converter`: `string`, `json` (schemas off) or `json_schemas`.
    /// Required with `compat = "debezium"`.
    #[serde(alias = "key.converter")]
    pub key_converter: Option<Converter>,
    /// The worker's `value.converter`, as `key_converter`. Required with
    /// `compat = "debezium"`.
    #[serde(alias = "value.converter")]
    pub value_converter: Option<Converter>,
    /// `table.expand.json.payload`: a JSON payload becomes a structure (an object without null
    /// members under JsonConverter).
    #[serde(alias = "table.expand.json.payload")]
    pub expand_json_payload: bool,
    /// `table.json.payload.null.behavior`.
    #[serde(alias = "table.json.payload.null.behavior")]
    pub json_payload_null_behavior: JsonNullBehavior,
    /// `table.fields.additional.placement`: `column:header[:alias]`, `column:envelope[:alias]`
    /// or `column:partition`, comma-separated. Empty: none.
    #[serde(alias = "table.fields.additional.placement")]
    pub additional_placement: String,
    /// `table.field.event.id`: the event id column, sent as header `id`.
    #[serde(alias = "table.field.event.id")]
    pub field_event_id: String,
    /// `table.field.event.key`: the key column.
    #[serde(alias = "table.field.event.key")]
    pub field_event_key: String,
    /// `table.field.event.payload`: the payload column.
    #[serde(alias = "table.field.event.payload")]
    pub field_event_payload: String,
    /// `route.by.field`: the column whose value routes the record.
    #[serde(alias = "route.by.field")]
    pub route_by_field: String,
    /// `route.topic.regex`, matched against the whole `route_by_field` value.
    #[serde(alias = "route.topic.regex")]
    pub route_topic_regex: String,
    /// `route.topic.replacement` (Java replacement syntax: `${name}`, `$1`).
    #[serde(alias = "route.topic.replacement")]
    pub route_topic_replacement: String,
    /// `route.tombstone.on.empty.payload`: a NULL or blank payload becomes a tombstone under
    /// every converter.
    #[serde(alias = "route.tombstone.on.empty.payload")]
    pub route_tombstone_on_empty_payload: bool,
    /// `extended.headers.enabled`: the four `__debezium.context.*` headers first on every
    /// record.
    #[serde(alias = "extended.headers.enabled")]
    pub context_headers: bool,
    /// `topic.prefix` of the connector: the `__debezium.context.connectorLogicalName` header,
    /// and part of the envelope schema's name. Required with `context_headers`.
    #[serde(alias = "topic.prefix")]
    pub topic_prefix: Option<String>,
    /// The connector plugin, `mysql` or `mariadb`: the `__debezium.context.connectorName`
    /// header.
    pub connector: String,
    /// The task id: the `__debezium.context.taskId` header.
    pub task_id: String,
    /// The record timestamp: `processing` stamps records as Debezium does.
    pub timestamp: DebeziumTimestamp,
}

impl Default for DebeziumConfig {
    fn default() -> Self {
        Self {
            key_converter: None,
            value_converter: None,
            expand_json_payload: false,
            json_payload_null_behavior: JsonNullBehavior::Ignore,
            additional_placement: String::new(),
            field_event_id: "id".into(),
            field_event_key: "aggregateid".into(),
            field_event_payload: "payload".into(),
            route_by_field: "aggregatetype".into(),
            route_topic_regex: "(?<routedByValue>.*)".into(),
            route_topic_replacement: "outbox.event.${routedByValue}".into(),
            route_tombstone_on_empty_payload: false,
            context_headers: true,
            topic_prefix: None,
            connector: "mysql".into(),
            task_id: "0".into(),
            timestamp: DebeziumTimestamp::Commit,
        }
    }
}
