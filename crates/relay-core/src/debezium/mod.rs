//! The Debezium profile (`[outbox] compat = "debezium"`): records with the bytes Debezium's
//! MySQL/MariaDB connector, its outbox event router and a Kafka Connect worker's converters
//! write for the same row. [`Profile`] is resolved once from `[debezium]`; the decoder gives
//! each event its columns' Connect schemas ([`DebeziumColumns`]); [`Profile::record`] builds
//! the key, value, headers and timestamp.
//!
//! Sources: Debezium 3.x `io.debezium.transforms.outbox.EventRouterDelegate#apply` (headers
//! `id` then the additional header fields, after the connector's `__debezium.context.*`
//! headers; key = the key column with its schema; value = the payload, or a struct
//! `{payload, <envelope fields>}`), mysql-binlog-connector-java's `JsonStringFormatter` (the
//! JSON text of a MySQL JSON column), Kafka's `JsonConverter`, `StringConverter` and
//! `SimpleHeaderConverter`, and Kafka Connect's `RegexRouter` (topic routing).

pub mod connect;
pub mod java;
pub mod json;

use std::sync::Arc;

use crate::config::debezium::{Converter, DebeziumConfig, DebeziumTimestamp, JsonNullBehavior};
use crate::config::{AdditionalColumn, Placement, TableName};
use crate::debezium::connect::{Data, NullBehavior, Schema, Type};
use crate::error::RelayError;

/// A column's Connect schema as Debezium's MySQL connector gives it (default settings), from
/// the column's MySQL type and nullability.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSchema {
    /// The Connect schema.
    pub schema: Schema,
}

impl ColumnSchema {
    /// A text column (CHAR, VARCHAR, TEXT, ENUM, SET; and types the profile carries as their
    /// text form).
    pub fn string(optional: bool) -> Self {
        Self {
            schema: Schema::primitive(Type::String, optional),
        }
    }

    /// A MySQL JSON column (`io.debezium.data.Json`).
    pub fn json(optional: bool) -> Self {
        Self {
            schema: Schema::json_string(optional),
        }
    }

    /// An integer column: `int16` (TINYINT, SMALLINT), `int32` (MEDIUMINT, INT) or `int64`
    /// (INT UNSIGNED, BIGINT).
    pub fn integer(ty: Type, optional: bool) -> Self {
        Self {
            schema: Schema::primitive(ty, optional),
        }
    }

    /// An integer column with a logical name (`io.debezium.time.Year`).
    pub fn named_integer(ty: Type, name: &str, optional: bool) -> Self {
        Self {
            schema: Schema {
                name: Some(name.into()),
                ..Schema::primitive(ty, optional)
            },
        }
    }

    /// The value of this column's text form `text` as Connect data (integers parsed; a BIGINT
    /// UNSIGNED above 2^63 wraps to a negative long, as Debezium's default
    /// `bigint.unsigned.handling.mode=long` sends it; the rest as strings).
    fn data(&self, text: Option<&[u8]>) -> Data {
        let Some(text) = text else {
            return Data::Null;
        };
        let s = String::from_utf8_lossy(text);
        match self.schema.ty {
            Type::Int16 | Type::Int32 | Type::Int64 => match s.parse::<i64>() {
                Ok(v) => Data::Int(v),
                Err(_) => match s.parse::<u64>() {
                    Ok(v) => Data::Int(v as i64),
                    Err(_) => Data::Str(s.into_owned()),
                },
            },
            _ => Data::Str(s.into_owned()),
        }
    }
}

/// One additional column of a row (`table.fields.additional.placement`), NULL included.
#[derive(Debug, Clone, PartialEq)]
pub struct AdditionalValue {
    /// Header or envelope field name.
    pub alias: String,
    /// Header or envelope.
    pub placement: Placement,
    /// The column's schema.
    pub column: ColumnSchema,
    /// The column's text form; `None` for NULL.
    pub text: Option<Vec<u8>>,
}

/// What the decoder knows of a row's columns for the Debezium profile.
#[derive(Debug, Clone, PartialEq)]
pub struct DebeziumColumns {
    /// The key column's schema.
    pub key: ColumnSchema,
    /// The payload column's schema.
    pub payload: ColumnSchema,
    /// The additional columns, in placement order.
    pub additional: Vec<AdditionalValue>,
}

/// The parts of a record in the Debezium profile.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordParts {
    /// Key bytes.
    pub key: Vec<u8>,
    /// Value bytes; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order; `None` values are null-valued headers.
    pub headers: Vec<(Arc<str>, Option<Vec<u8>>)>,
}

/// The resolved `[debezium]` settings.
#[derive(Debug)]
pub struct Profile {
    key_converter: Converter,
    value_converter: Converter,
    expand: Option<NullBehavior>,
    route: TopicRoute,
    tombstone_on_empty: bool,
    context_headers: Vec<(Arc<str>, Option<Vec<u8>>)>,
    /// Record timestamps: commit or processing time.
    pub timestamp: DebeziumTimestamp,
    /// The payload column (the expanded struct's name).
    payload_field: String,
    topic_prefix: String,
    /// Whether some additional column goes into the envelope.
    has_envelope: bool,
    /// The envelope schema's name per payload schema, as Debezium caches it
    /// (`EventRouterDelegate.payloadSchemaCache`): named after the first row seen with that
    /// payload schema (its table and routing value), then reused for every later row.
    envelope_names: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// `RegexRouter`: the whole value matched against `route.topic.regex`, the topic its
/// replacement; an unmatched value is the topic as it is.
#[derive(Debug)]
struct TopicRoute {
    regex: regex::Regex,
    replacement: String,
}

/// Java's `Matcher.replaceFirst` replacement syntax (`$1`, `${name}`, `\$`) in the `regex`
/// crate's (`$1`, `${name}`, `$$`).
fn java_replacement(java: &str) -> Result<String, String> {
    let mut out = String::with_capacity(java.len());
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => return Err("a replacement may not end with '\\'".into()),
            },
            '$' => match chars.peek() {
                Some('{') => {
                    out.push('$');
                }
                Some(d) if d.is_ascii_digit() => {
                    // `$12` in Java takes as many digits as name a group; `${12}` here.
                    let mut digits = String::new();
                    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        digits.push(*d);
                        chars.next();
                    }
                    out.push_str(&format!("${{{digits}}}"));
                }
                _ => return Err("'$' must start a group reference: ${name} or $1".into()),
            },
            c => out.push(c),
        }
    }
    Ok(out)
}

impl TopicRoute {
    fn new(regex: &str, replacement: &str) -> Result<Self, String> {
        let full = format!("^(?:{regex})$");
        let regex = regex::Regex::new(&full)
            .map_err(|e| format!("debezium.route_topic_regex {regex:?} is not a regex: {e}"))?;
        let replacement = java_replacement(replacement)
            .map_err(|e| format!("debezium.route_topic_replacement {replacement:?}: {e}"))?;
        Ok(Self { regex, replacement })
    }

    fn topic(&self, value: &str) -> String {
        if self.regex.is_match(value) {
            self.regex
                .replacen(value, 1, self.replacement.as_str())
                .into_owned()
        } else {
            value.to_owned()
        }
    }
}

/// One `table.fields.additional.placement` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementEntry {
    /// `column:header[:alias]` or `column:envelope[:alias]`.
    Column(AdditionalColumn),
    /// `column:partition`: the explicit partition.
    Partition(String),
}

/// Parses `table.fields.additional.placement` (`column:placement[:alias]`, comma-separated).
///
/// # Errors
/// [`RelayError::Config`] naming the entry and the accepted forms.
pub fn parse_placement(spec: &str) -> Result<Vec<PlacementEntry>, RelayError> {
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
        let bad = || {
            RelayError::Config(format!(
                "debezium.additional_placement entry {entry:?}: expected column:header[:alias], \
                 column:envelope[:alias] or column:partition"
            ))
        };
        let (column, placement) = match parts.as_slice() {
            [c, p] | [c, p, _] if !c.is_empty() => (*c, *p),
            _ => return Err(bad()),
        };
        let alias = parts.get(2).map(|a| (*a).to_owned());
        out.push(match placement.to_ascii_lowercase().as_str() {
            "header" => PlacementEntry::Column(AdditionalColumn {
                column: column.into(),
                placement: Placement::Header,
                alias,
            }),
            "envelope" => PlacementEntry::Column(AdditionalColumn {
                column: column.into(),
                placement: Placement::Envelope,
                alias,
            }),
            "partition" if alias.is_none() => PlacementEntry::Partition(column.into()),
            _ => return Err(bad()),
        });
    }
    Ok(out)
}

impl Profile {
    /// The profile of `config`.
    ///
    /// # Errors
    /// [`RelayError::Config`] naming the key: a converter not set, a route regex or
    /// replacement that does not parse, context headers without `topic_prefix`, or a connector
    /// other than `mysql`/`mariadb`.
    pub fn new(config: &DebeziumConfig) -> Result<Self, RelayError> {
        let need = |c: Option<Converter>, key: &str| {
            c.ok_or_else(|| {
                RelayError::Config(format!(
                    "debezium.{key} must name the Kafka Connect worker's {} as the team ran \
                     it: \"string\" (StringConverter), \"json\" (JsonConverter with \
                     schemas.enable=false) or \"json_schemas\" (JsonConverter with \
                     schemas.enable=true, the worker's default)",
                    key.replace('_', ".")
                ))
            })
        };
        let key_converter = need(config.key_converter, "key_converter")?;
        let value_converter = need(config.value_converter, "value_converter")?;
        let has_envelope = parse_placement(&config.additional_placement)?
            .iter()
            .any(|p| matches!(p, PlacementEntry::Column(c) if c.placement == Placement::Envelope));
        if !matches!(config.connector.as_str(), "mysql" | "mariadb") {
            return Err(RelayError::Config(format!(
                "debezium.connector = {:?}: \"mysql\" (io.debezium.connector.mysql.MySqlConnector) \
                 or \"mariadb\" (io.debezium.connector.mariadb.MariaDbConnector)",
                config.connector
            )));
        }
        let topic_prefix = config.topic_prefix.clone().unwrap_or_default();
        let context_headers = if config.context_headers {
            if topic_prefix.is_empty() {
                return Err(RelayError::Config(
                    "debezium.context_headers needs debezium.topic_prefix: the connector's \
                     topic.prefix (header __debezium.context.connectorLogicalName); or set \
                     context_headers = false if the connector ran with \
                     extended.headers.enabled=false"
                        .into(),
                ));
            }
            let run_id = uuid::Uuid::new_v4().to_string();
            [
                (
                    "__debezium.context.connectorLogicalName",
                    topic_prefix.as_str(),
                ),
                ("__debezium.context.taskId", config.task_id.as_str()),
                (
                    "__debezium.context.connectorName",
                    config.connector.as_str(),
                ),
                ("__debezium.context.runId", run_id.as_str()),
            ]
            .into_iter()
            .map(|(n, v)| (Arc::from(n), Some(v.as_bytes().to_vec())))
            .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            key_converter,
            value_converter,
            expand: config
                .expand_json_payload
                .then_some(match config.json_payload_null_behavior {
                    JsonNullBehavior::Ignore => NullBehavior::Ignore,
                    JsonNullBehavior::OptionalBytes => NullBehavior::OptionalBytes,
                }),
            route: TopicRoute::new(&config.route_topic_regex, &config.route_topic_replacement)
                .map_err(RelayError::Config)?,
            tombstone_on_empty: config.route_tombstone_on_empty_payload,
            context_headers,
            timestamp: config.timestamp,
            payload_field: config.field_event_payload.clone(),
            topic_prefix,
            has_envelope,
            envelope_names: Default::default(),
        })
    }

    /// The topic of a row whose `route.by.field` value is `routed_by`.
    pub fn topic(&self, routed_by: &str) -> String {
        self.route.topic(routed_by)
    }

    /// The key, value and headers of a row: `key` and `id` are the key and id columns' text
    /// forms, `payload` the payload's bytes (a MySQL JSON column already in Debezium's JSON
    /// text), `routed_by` the `route.by.field` value, `table` the outbox table.
    pub fn record(
        &self,
        columns: &DebeziumColumns,
        key: &[u8],
        id: Option<&[u8]>,
        payload: Option<&[u8]>,
        routed_by: &str,
        table: &TableName,
    ) -> RecordParts {
        let mut headers = self.context_headers.clone();
        headers.push((Arc::from("id"), id.map(<[u8]>::to_vec)));
        for a in columns
            .additional
            .iter()
            .filter(|a| a.placement == Placement::Header)
        {
            // SimpleHeaderConverter writes `value.toString()`: integers as Java longs.
            let value = match a.column.data(a.text.as_deref()) {
                Data::Int(v) => Some(v.to_string().into_bytes()),
                _ => a.text.clone(),
            };
            headers.push((Arc::from(a.alias.as_str()), value));
        }
        let key_data = columns.key.data(Some(key));
        let key = match (self.key_converter, &key_data) {
            // `Long.toString()`: a BIGINT UNSIGNED above 2^63 as the negative long Debezium
            // holds.
            (Converter::String, Data::Int(v)) => v.to_string().into_bytes(),
            (Converter::String, _) => key.to_vec(),
            (c, _) => {
                connect::json_converter(&columns.key.schema, &key_data, c == Converter::JsonSchemas)
            }
        };
        RecordParts {
            key,
            value: self.value(columns, payload, routed_by, table),
            headers,
        }
    }

    fn value(
        &self,
        columns: &DebeziumColumns,
        payload: Option<&[u8]>,
        routed_by: &str,
        table: &TableName,
    ) -> Option<Vec<u8>> {
        // Java's `String.trim()`: every character up to U+0020 is blank, nothing else is.
        let empty = payload.is_none_or(|p| p.iter().all(|&b| b <= b' '));
        if empty && self.tombstone_on_empty {
            return None;
        }
        let mut schema = columns.payload.schema.clone();
        let mut data = columns.payload.data(payload);
        let mut schema_dropped = false;
        if let (Some(nulls), Some(text)) = (self.expand, payload) {
            let text = String::from_utf8_lossy(text);
            match connect::expand(&self.payload_field, &text, nulls) {
                Ok((s, d)) => {
                    schema = s;
                    data = d;
                }
                Err(failure) => {
                    schema_dropped = failure.schema_dropped;
                    tracing::warn!(table = %table, reason = %failure.reason,
                        "JSON expansion failed: the payload is sent as a string (Debezium logs the same warning)");
                }
            }
        }
        if let (true, false, Some(text), Converter::Json | Converter::JsonSchemas) = (
            schema_dropped,
            self.has_envelope,
            payload,
            self.value_converter,
        ) {
            return Some(connect::json_converter_without_schema(
                &String::from_utf8_lossy(text),
                self.value_converter == Converter::JsonSchemas,
            ));
        }
        if self.has_envelope {
            let payload_key = format!("{schema:?}");
            let mut fields = vec![(
                crate::outbox::mapping::ENVELOPE_PAYLOAD_FIELD.to_owned(),
                schema,
            )];
            let mut values = vec![data];
            for a in columns
                .additional
                .iter()
                .filter(|a| a.placement == Placement::Envelope)
            {
                fields.push((a.alias.clone(), a.column.schema.clone()));
                values.push(a.column.data(a.text.as_deref()));
            }
            let name = {
                let mut names = self
                    .envelope_names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                // Debezium's cache holds 10,000 schemas (LRU); a relay's payload schemas are few.
                if names.len() >= 10_000 {
                    names.clear();
                }
                names
                    .entry(payload_key)
                    .or_insert_with(|| {
                        format!(
                            "{}.{}.{}.{routed_by}.Value",
                            self.topic_prefix, table.database, table.table
                        )
                    })
                    .clone()
            };
            schema = Schema::structure(Some(name), false, fields);
            data = Data::Struct(values);
        }
        match self.value_converter {
            // StringConverter writes `value.toString()`: a struct (expanded payload, envelope)
            // as Connect's `Struct.toString()`.
            Converter::String if matches!(data, Data::Struct(_)) => {
                Some(connect::struct_to_string(&schema, &data).into_bytes())
            }
            Converter::String => payload.map(<[u8]>::to_vec),
            c => Some(connect::json_converter(
                &schema,
                &data,
                c == Converter::JsonSchemas,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(toml_extra: &str) -> Profile {
        let config: DebeziumConfig = toml_from(&format!(
            "key_converter = \"json_schemas\"\nvalue_converter = \"json_schemas\"\n\
             topic_prefix = \"dbserver1\"\n{toml_extra}"
        ));
        Profile::new(&config).expect("profile")
    }

    fn toml_from(text: &str) -> DebeziumConfig {
        use figment::providers::{Format, Toml};
        figment::Figment::from(Toml::string(text))
            .extract()
            .expect("config")
    }

    fn columns(additional: Vec<AdditionalValue>) -> DebeziumColumns {
        DebeziumColumns {
            key: ColumnSchema::string(false),
            payload: ColumnSchema::json(true),
            additional,
        }
    }

    fn table() -> TableName {
        TableName::parse("inventory.outbox", None).expect("valid")
    }

    fn s(b: &Option<Vec<u8>>) -> String {
        String::from_utf8_lossy(b.as_deref().unwrap_or(b"<null>")).into_owned()
    }

    #[test]
    fn debezium_names_are_accepted() {
        let c = toml_from(
            "\"key.converter\" = \"string\"\n\"value.converter\" = \"json\"\n\
             \"table.expand.json.payload\" = true\n\"route.topic.replacement\" = \"x.${routedByValue}\"\n\
             \"topic.prefix\" = \"p\"\n",
        );
        assert_eq!(c.key_converter, Some(Converter::String));
        assert!(c.expand_json_payload);
        assert_eq!(c.topic_prefix.as_deref(), Some("p"));
    }

    #[test]
    fn routing_follows_regex_router() {
        let p = profile("");
        assert_eq!(p.topic("Order"), "outbox.event.Order");
        let p = profile(
            "route_topic_regex = \"(?<t>[a-z]+)-(\\\\d+)\"\nroute_topic_replacement = \"$2.${t}\"\n",
        );
        assert_eq!(p.topic("orders-7"), "7.orders");
        assert_eq!(
            p.topic("Orders"),
            "Orders",
            "no whole match: the value itself"
        );
    }

    #[test]
    fn headers_context_then_id_then_additional_with_nulls() {
        let p = profile("");
        let parts = p.record(
            &columns(vec![
                AdditionalValue {
                    alias: "eventType".into(),
                    placement: Placement::Header,
                    column: ColumnSchema::string(false),
                    text: Some(b"Created".to_vec()),
                },
                AdditionalValue {
                    alias: "tenant".into(),
                    placement: Placement::Header,
                    column: ColumnSchema::string(true),
                    text: None,
                },
            ]),
            b"order-1",
            Some(b"e-1"),
            Some(br#"{"a":1}"#),
            "Order",
            &table(),
        );
        let names: Vec<&str> = parts.headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(
            names,
            [
                "__debezium.context.connectorLogicalName",
                "__debezium.context.taskId",
                "__debezium.context.connectorName",
                "__debezium.context.runId",
                "id",
                "eventType",
                "tenant"
            ]
        );
        assert_eq!(s(&parts.headers[0].1), "dbserver1");
        assert_eq!(s(&parts.headers[1].1), "0");
        assert_eq!(s(&parts.headers[2].1), "mysql");
        assert_eq!(parts.headers[6].1, None);
        assert_eq!(
            String::from_utf8(parts.key).expect("valid"),
            r#"{"schema":{"type":"string","optional":false},"payload":"order-1"}"#
        );
        assert_eq!(
            s(&parts.value),
            r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\":1}"}"#
        );
    }

    #[test]
    fn envelope_fields_make_a_named_struct() {
        let p = Profile::new(&toml_from(
            "key_converter = \"string\"\nvalue_converter = \"json_schemas\"\ntopic_prefix = \"dbserver1\"\n\
             additional_placement = \"tenant:envelope:tenant\"\n",
        ))
        .expect("valid");
        let parts = p.record(
            &columns(vec![AdditionalValue {
                alias: "tenant".into(),
                placement: Placement::Envelope,
                column: ColumnSchema::string(true),
                text: Some(b"t1".to_vec()),
            }]),
            b"order-1",
            Some(b"e-1"),
            Some(br#"{"a":1}"#),
            "Order",
            &table(),
        );
        assert_eq!(parts.key, b"order-1");
        assert_eq!(
            s(&parts.value),
            concat!(
                r#"{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},"#,
                r#"{"type":"string","optional":true,"field":"tenant"}],"optional":false,"name":"dbserver1.inventory.outbox.Order.Value"},"#,
                r#""payload":{"payload":"{\"a\":1}","tenant":"t1"}}"#
            )
        );
    }

    #[test]
    fn null_payloads_follow_the_converter() {
        let none: Option<&[u8]> = None;
        for (conv, want) in [
            ("string", None),
            ("json", Some("null")),
            (
                "json_schemas",
                Some(
                    r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#,
                ),
            ),
        ] {
            let p = Profile::new(&toml_from(&format!(
                "key_converter = \"string\"\nvalue_converter = \"{conv}\"\ncontext_headers = false\n"
            )))
            .expect("valid");
            let parts = p.record(&columns(vec![]), b"k", None, none, "Order", &table());
            assert_eq!(parts.value.as_deref(), want.map(str::as_bytes), "{conv}");
            assert_eq!(parts.headers, vec![(Arc::from("id"), None)]);
        }
        let p = Profile::new(&toml_from(
            "key_converter = \"string\"\nvalue_converter = \"json_schemas\"\ncontext_headers = false\n\
             route_tombstone_on_empty_payload = true\n",
        ))
        .expect("valid");
        assert_eq!(
            p.record(&columns(vec![]), b"k", None, none, "Order", &table())
                .value,
            None
        );
    }

    #[test]
    fn expanded_payloads() {
        let p = Profile::new(&toml_from(
            "key_converter = \"json\"\nvalue_converter = \"json\"\ncontext_headers = false\n\
             expand_json_payload = true\n",
        ))
        .expect("valid");
        let parts = p.record(
            &columns(vec![]),
            b"order-1",
            None,
            Some("{\"a\":1,\"b\":null,\"s\":\"🎉\"}".as_bytes()),
            "Order",
            &table(),
        );
        assert_eq!(parts.key, b"\"order-1\"");
        assert_eq!(s(&parts.value), r#"{"a":1,"s":"\uD83C\uDF89"}"#);
        // A top-level array does not expand: the string, as JsonConverter quotes it.
        let parts = p.record(
            &columns(vec![]),
            b"k",
            None,
            Some(b"[1,2]"),
            "Order",
            &table(),
        );
        assert_eq!(s(&parts.value), r#""[1,2]""#);
    }

    #[test]
    fn bad_settings_are_named() {
        for (extra, needle) in [
            ("value_converter = \"json\"\n", "key_converter"),
            (
                "key_converter = \"string\"\nvalue_converter = \"json\"\n",
                "topic_prefix",
            ),
            (
                "key_converter = \"string\"\nvalue_converter = \"json\"\ntopic_prefix = \"p\"\nroute_topic_regex = \"(\"\n",
                "route_topic_regex",
            ),
            (
                "key_converter = \"string\"\nvalue_converter = \"json\"\ntopic_prefix = \"p\"\nadditional_placement = \"type:body\"\n",
                "additional_placement",
            ),
        ] {
            let err = Profile::new(&toml_from(extra)).expect_err("an error").to_string();
            assert!(err.contains(needle), "{extra}: {err}");
        }
    }

    #[test]
    fn replacement_syntax_is_translated() {
        assert_eq!(
            java_replacement("a.${x}.$1.\\$").expect("valid"),
            "a.${x}.${1}.$$"
        );
        assert!(java_replacement("a$").is_err());
    }
}
