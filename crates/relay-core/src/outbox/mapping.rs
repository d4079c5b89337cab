//! The resolved mapping of each outbox table: which columns feed which part of the Kafka record.
//!
//! Built once from `[outbox]` and its `[[outbox.table]]` overrides ([`RelayConfig::table_mappings`])
//! and shared (`Arc`) by the decoder and the router, so a row always carries the mapping of the
//! table it came from.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::debezium::Compat;
use crate::config::topic::TopicTemplate;
use crate::config::{
    AdditionalColumn, BinaryFormat, CloudEventsConfig, ColumnMapping, HeaderNames, KeyFormat,
    NullPayload, OnUpdate, OutboxConfig, Placement, RelayConfig, TableName, TimestampRefused,
    TimestampSource,
};
use crate::debezium::{parse_placement, PlacementEntry, Profile};
use crate::error::RelayError;
use crate::outbox::pattern::TablePattern;

/// The mapping `mappings` give `table`: the mapping of its exact name if it has one, else the
/// first pattern (in configuration order: `outbox.tables`, then `[[outbox.table]]`) it matches,
/// as [`TableMapping::for_table`] makes it. `None`: not an outbox table.
pub fn mapping_of(mappings: &[TableMapping], table: &TableName) -> Option<TableMapping> {
    mappings
        .iter()
        .find(|m| m.pattern.is_none() && *m.table == *table)
        .cloned()
        .or_else(|| {
            mappings
                .iter()
                .find(|m| m.pattern.as_ref().is_some_and(|p| p.matches(table)))
                .map(|m| m.for_table(table.clone()))
        })
}

/// The field name of the payload inside an envelope.
pub const ENVELOPE_PAYLOAD_FIELD: &str = "payload";

/// How one outbox table's rows become records.
#[derive(Debug, Clone)]
pub struct TableMapping {
    /// The outbox table; for a pattern's mapping ([`TableMapping::pattern`]), the pattern as
    /// written (`tenant_*.outbox`), until [`TableMapping::for_table`] names a matching table.
    pub table: Arc<TableName>,
    /// `Some` when the configured name is a pattern (`tenant_*.outbox`): the mapping is then a
    /// template for every matching table ([`TableMapping::for_table`]), not one table's.
    pub pattern: Option<TablePattern>,
    /// `outbox.trace_context` in effect (not with the Debezium profile): a pattern's matching
    /// table discovered while streaming gets its `traceparent`/`tracestate` columns as header
    /// columns from its layout, as `run` finds them for the other tables at start-up.
    pub trace_context: bool,
    /// Column names.
    pub columns: ColumnMapping,
    /// Topic template.
    pub topic: TopicTemplate,
    /// Names of the standard headers (`""`: left out).
    pub headers: HeaderNames,
    /// Extra columns, in configured order.
    pub additional: Vec<AdditionalColumn>,
    /// What a NULL payload becomes.
    pub null_payload: NullPayload,
    /// What an UPDATE does.
    pub on_update: OnUpdate,
    /// Where the record timestamp comes from.
    pub timestamp: TimestampSource,
    /// What a `created_at` value the topic would refuse becomes (`timestamp = "column"`).
    pub timestamp_refused: TimestampRefused,
    /// Zone of DATETIME `created_at` values.
    pub datetime_time_zone: chrono_tz::Tz,
    /// Text form of binary values.
    pub binary_format: BinaryFormat,
    /// What the key holds.
    pub key_format: KeyFormat,
    /// CloudEvents headers (`[outbox.cloudevents]`), when enabled.
    pub cloudevents: Option<Arc<CloudEventsConfig>>,
    /// The Debezium profile (`[outbox] compat = "debezium"`): it builds the record's key,
    /// value, headers and topic instead of the relay's own layout.
    pub debezium: Option<Arc<Profile>>,
}

impl TableMapping {
    /// This pattern mapping's mapping of `table`, one of its matching tables (the mapping
    /// itself, named `table`, with no pattern).
    pub fn for_table(&self, table: TableName) -> TableMapping {
        TableMapping {
            table: Arc::new(table),
            pattern: None,
            ..self.clone()
        }
    }

    /// `true` when this mapping is `table`'s: its exact name, or a pattern `table` matches.
    pub fn covers(&self, table: &TableName) -> bool {
        match &self.pattern {
            Some(p) => p.matches(table),
            None => *self.table == *table,
        }
    }

    /// `true` when some additional column goes into an envelope (the value is then JSON).
    pub fn has_envelope(&self) -> bool {
        self.additional
            .iter()
            .any(|a| a.placement == Placement::Envelope)
    }

    /// Every column name the mapping needs, with the config key that names it (for start-up
    /// checks and error messages).
    pub fn required_columns(&self) -> Vec<(String, &str)> {
        let c = &self.columns;
        let mut out: Vec<(String, &str)> = [
            ("id", c.id.as_str()),
            ("aggregate_type", &c.aggregate_type),
            ("aggregate_id", &c.aggregate_id),
            ("event_type", &c.event_type),
            ("event_key", &c.event_key),
            ("payload", &c.payload),
            ("created_at", &c.created_at),
            ("partition", &c.partition),
        ]
        .into_iter()
        .filter(|(_, name)| !name.is_empty())
        .map(|(key, name)| (format!("outbox.columns.{key}"), name))
        .collect();
        out.extend(
            self.additional
                .iter()
                .map(|a| ("outbox.additional".to_owned(), a.column.as_str())),
        );
        out
    }
}

fn parse_zone(zone: &str, key: &str) -> Result<chrono_tz::Tz, RelayError> {
    zone.parse::<chrono_tz::Tz>().map_err(|_| {
        RelayError::Config(format!(
            "{key} {zone:?} is not a time zone; use an IANA name such as \"UTC\" or \
             \"Europe/Berlin\""
        ))
    })
}

fn check_headers(
    h: &HeaderNames,
    additional: &[AdditionalColumn],
    key: &str,
) -> Result<(), RelayError> {
    let mut seen = HashSet::new();
    let names = [&h.id, &h.event_key, &h.event_type, &h.aggregate_type]
        .into_iter()
        .map(|n| &**n)
        .chain(
            additional
                .iter()
                .filter(|a| a.placement == Placement::Header)
                .map(|a| a.alias.as_deref().unwrap_or(&a.column)),
        )
        .filter(|n| !n.is_empty());
    for name in names {
        if !seen.insert(name) {
            return Err(RelayError::Config(format!(
                "{key}: header name {name:?} is used twice; give the headers distinct names"
            )));
        }
    }
    let mut fields = HashSet::from([ENVELOPE_PAYLOAD_FIELD]);
    for a in additional {
        if a.column.is_empty() {
            return Err(RelayError::Config(format!(
                "{key}: an additional entry has an empty column name"
            )));
        }
        if a.placement == Placement::Envelope {
            let field = a.alias.as_deref().unwrap_or(&a.column);
            if !fields.insert(field) {
                return Err(RelayError::Config(format!(
                    "{key}: envelope field {field:?} is used twice (\"payload\" holds the payload); \
                     set a distinct alias"
                )));
            }
        }
    }
    Ok(())
}

fn check_columns(c: &ColumnMapping, key: &str) -> Result<(), RelayError> {
    for (field, value) in [
        ("id", &c.id),
        ("aggregate_type", &c.aggregate_type),
        ("aggregate_id", &c.aggregate_id),
        ("event_type", &c.event_type),
        ("event_key", &c.event_key),
        ("payload", &c.payload),
    ] {
        if value.is_empty() && !(key == DEBEZIUM_KEY && matches!(field, "event_type" | "event_key"))
        {
            return Err(RelayError::Config(format!(
                "{key}.{field} must name a column"
            )));
        }
    }
    Ok(())
}

/// The key named in errors about the Debezium profile's columns.
const DEBEZIUM_KEY: &str = "debezium (table.field.event.*, route.by.field)";

/// `[outbox]` with `compat = "debezium"`: the columns, headers, additional columns and topic
/// of Debezium's outbox event router with the `[debezium]` settings.
struct DebeziumLayout {
    columns: ColumnMapping,
    headers: HeaderNames,
    additional: Vec<AdditionalColumn>,
    topic: TopicTemplate,
    profile: Arc<Profile>,
}

impl RelayConfig {
    /// The Debezium layout, when `[outbox] compat = "debezium"`.
    ///
    /// # Errors
    /// [`RelayError::Config`]: relay-layout settings next to the profile, or a bad
    /// `[debezium]` setting.
    fn debezium_layout(&self) -> Result<Option<DebeziumLayout>, RelayError> {
        let o = &self.outbox;
        if o.compat != Compat::Debezium {
            return Ok(None);
        }
        let relay_layout = [
            ("columns", o.columns != ColumnMapping::default()),
            ("headers", o.headers != HeaderNames::default()),
            ("additional", !o.additional.is_empty()),
            ("topic", o.topic != "outbox.event.{aggregate_type}"),
            (
                "table.*.columns/headers/additional/topic",
                o.table.iter().any(|t| {
                    t.topic.is_some()
                        || t.additional.is_some()
                        || t.headers.over(&HeaderNames::default()) != HeaderNames::default()
                        || t.columns.over(&ColumnMapping::default()) != ColumnMapping::default()
                }),
            ),
        ];
        if let Some((key, _)) = relay_layout.iter().find(|(_, set)| *set) {
            return Err(RelayError::Config(format!(
                "outbox.{key} is set together with outbox.compat = \"debezium\": with the \
                 Debezium profile, name the columns, headers and topic in [debezium] with the \
                 event router's settings (table.field.event.id/key/payload, route.by.field, \
                 table.fields.additional.placement, route.topic.replacement)"
            )));
        }
        let d = &self.debezium;
        let profile = Arc::new(Profile::new(d)?);
        let mut columns = ColumnMapping {
            id: d.field_event_id.clone(),
            aggregate_type: d.route_by_field.clone(),
            aggregate_id: d.field_event_key.clone(),
            event_type: String::new(),
            event_key: String::new(),
            payload: d.field_event_payload.clone(),
            created_at: String::new(),
            partition: String::new(),
        };
        let mut additional = Vec::new();
        for entry in parse_placement(&d.additional_placement)? {
            match entry {
                PlacementEntry::Column(mut c) => {
                    c.alias.get_or_insert_with(|| c.column.clone());
                    additional.push(c);
                }
                PlacementEntry::Partition(column) => columns.partition = column,
            }
        }
        // Headers are the profile's: none of the relay's standard ones.
        let headers = HeaderNames {
            id: "".into(),
            event_key: "".into(),
            event_type: "".into(),
            aggregate_type: "".into(),
        };
        // The default regex routes by the whole value: a template says the same, for the
        // commands that list topics (`check`, `trace`). The profile routes the records.
        let template = if d.route_topic_regex == "(?<routedByValue>.*)" {
            d.route_topic_replacement
                .replace("${routedByValue}", "{aggregate_type}")
        } else {
            "{aggregate_type}".to_owned()
        };
        check_columns(&columns, DEBEZIUM_KEY)?;
        check_headers(&headers, &additional, "debezium.additional_placement")?;
        Ok(Some(DebeziumLayout {
            columns,
            headers,
            additional,
            topic: TopicTemplate::parse(&template)?,
            profile,
        }))
    }

    /// The mapping of every outbox table: `[outbox] tables` with the section's defaults, then
    /// each `[[outbox.table]]` with its overrides. A name with `*` or `?` is a pattern
    /// ([`crate::outbox::pattern`]): its mapping has [`TableMapping::pattern`] set and stands for
    /// every matching table ([`mapping_of`]).
    ///
    /// # Errors
    /// [`RelayError::Config`] naming the key: a table named twice or malformed, a pattern that
    /// matches the checkpoint table's name, an invalid topic
    /// template or time zone, an empty required column name, duplicate header or envelope names.
    pub fn table_mappings(&self) -> Result<Vec<TableMapping>, RelayError> {
        let o: &OutboxConfig = &self.outbox;
        let default_zone = parse_zone(&o.datetime_time_zone, "outbox.datetime_time_zone")?;
        let debezium = self.debezium_layout()?;
        if debezium.is_none() {
            check_columns(&o.columns, "outbox.columns")?;
            check_headers(&o.headers, &o.additional, "outbox")?;
        }
        let cloudevents = o
            .cloudevents
            .enabled
            .then(|| Arc::new(o.cloudevents.clone()));
        let trace_context = o.trace_context && debezium.is_none();
        let mut out: Vec<TableMapping> = Vec::new();
        let mut seen = HashSet::new();
        for name in &o.tables {
            let table = TableName::parse(name, None)?;
            if !seen.insert(table.clone()) {
                return Err(RelayError::Config(format!(
                    "outbox table {table} is named twice in outbox.tables/outbox.table"
                )));
            }
            out.push(TableMapping {
                pattern: TablePattern::of(&table),
                trace_context,
                table: Arc::new(table),
                columns: o.columns.clone(),
                topic: TopicTemplate::parse(&o.topic)?,
                headers: o.headers.clone(),
                additional: o.additional.clone(),
                null_payload: o.null_payload,
                on_update: o.on_update,
                timestamp: o.timestamp,
                timestamp_refused: o.timestamp_refused,
                datetime_time_zone: default_zone,
                binary_format: o.binary_format,
                key_format: o.key_format,
                cloudevents: cloudevents.clone(),
                debezium: None,
            });
        }
        for t in &o.table {
            let table = TableName::parse(&t.name, None)?;
            let key = format!("outbox.table {table}");
            if !seen.insert(table.clone()) {
                return Err(RelayError::Config(format!(
                    "outbox table {table} is named twice in outbox.tables/outbox.table"
                )));
            }
            let columns = t.columns.over(&o.columns);
            check_columns(&columns, &format!("{key} columns"))?;
            let headers = t.headers.over(&o.headers);
            let additional = t.additional.clone().unwrap_or_else(|| o.additional.clone());
            check_headers(&headers, &additional, &key)?;
            out.push(TableMapping {
                pattern: TablePattern::of(&table),
                trace_context,
                table: Arc::new(table),
                columns,
                topic: TopicTemplate::parse(t.topic.as_deref().unwrap_or(&o.topic))?,
                headers,
                additional,
                null_payload: t.null_payload.unwrap_or(o.null_payload),
                on_update: t.on_update.unwrap_or(o.on_update),
                timestamp: t.timestamp.unwrap_or(o.timestamp),
                timestamp_refused: t.timestamp_refused.unwrap_or(o.timestamp_refused),
                datetime_time_zone: match &t.datetime_time_zone {
                    Some(z) => parse_zone(z, &format!("{key} datetime_time_zone"))?,
                    None => default_zone,
                },
                binary_format: t.binary_format.unwrap_or(o.binary_format),
                key_format: t.key_format.unwrap_or(o.key_format),
                cloudevents: cloudevents.clone(),
                debezium: None,
            });
        }
        if let Some(d) = debezium {
            for m in &mut out {
                m.columns = d.columns.clone();
                m.headers = d.headers.clone();
                m.additional = d.additional.clone();
                m.topic = d.topic.clone();
                m.debezium = Some(Arc::clone(&d.profile));
                if m.timestamp == TimestampSource::Column {
                    return Err(RelayError::Config(
                        "outbox.timestamp = \"column\" with compat = \"debezium\": set \
                         debezium.timestamp (\"commit\" or \"processing\")"
                            .into(),
                    ));
                }
            }
        }
        if let Some(m) = out
            .iter()
            .find(|m| m.timestamp == TimestampSource::Column && m.columns.created_at.is_empty())
        {
            return Err(RelayError::Config(format!(
                "outbox table {}: timestamp = \"column\" needs a column: set \
                 outbox.columns.created_at (DATETIME or TIMESTAMP), or timestamp = \"commit\" \
                 for the transaction's commit time",
                m.table
            )));
        }
        if let Ok(state) = self.checkpoint_table() {
            if let Some(p) = out
                .iter()
                .filter_map(|m| m.pattern.as_ref())
                .find(|p| p.matches_table_part(&state.table))
            {
                return Err(RelayError::Config(format!(
                    "outbox table pattern {p} matches the checkpoint table's name {:?} \
                     (checkpoint.table): the state table is never an outbox; narrow the \
                     pattern (e.g. {}.outbox) or rename the checkpoint table",
                    state.table, p.name.database
                )));
            }
        }
        if out.is_empty() {
            return Err(RelayError::Config(
                "name at least one outbox table: outbox.tables = [\"database.table\"] or an \
                 [[outbox.table]] entry with name = \"database.table\""
                    .into(),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[mysql]
url = "mysql://root@127.0.0.1:3306/shop"
server_id = 4242
[kafka]
bootstrap_servers = "127.0.0.1:9092"
"#;

    fn mappings(outbox: &str) -> Result<Vec<TableMapping>, RelayError> {
        RelayConfig::from_toml_str(&format!("{BASE}\n{outbox}")).and_then(|c| c.table_mappings())
    }

    #[test]
    fn per_table_entries_override_the_defaults_key_by_key() {
        let m = mappings(
            r#"
[outbox]
tables = ["shop.outbox"]
topic = "events.{aggregate_type}"
datetime_time_zone = "Europe/Berlin"
[outbox.columns]
payload = "body"
[[outbox.table]]
name = "billing.outbox"
topic = "billing-events"
columns = { aggregate_id = "invoice_id" }
headers = { event_key = "idempotency-key" }
additional = [{ column = "tenant", placement = "header" }]
null_payload = "skip"
binary_format = "hex"
"#,
        )
        .expect("valid");
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].table.to_string(), "shop.outbox");
        assert_eq!(m[0].columns.payload, "body");
        assert_eq!(m[0].null_payload, NullPayload::Tombstone);
        assert_eq!(m[0].datetime_time_zone, chrono_tz::Europe::Berlin);
        assert_eq!(m[1].table.to_string(), "billing.outbox");
        assert_eq!(m[1].columns.payload, "body", "inherited");
        assert_eq!(m[1].columns.aggregate_id, "invoice_id");
        assert_eq!(&*m[1].headers.event_key, "idempotency-key");
        assert_eq!(&*m[1].headers.id, "id");
        assert_eq!(m[1].null_payload, NullPayload::Skip);
        assert_eq!(m[1].binary_format, BinaryFormat::Hex);
        assert_eq!(m[1].datetime_time_zone, chrono_tz::Europe::Berlin);
        assert_eq!(m[1].additional.len(), 1);
    }

    #[test]
    fn the_debezium_profile_takes_the_event_routers_names() {
        let m = mappings(
            r#"
[outbox]
tables = ["inventory.outbox"]
compat = "debezium"
[debezium]
key_converter = "string"
value_converter = "json"
"topic.prefix" = "dbserver1"
"table.fields.additional.placement" = "type:header:eventType, tenant:envelope, shard:partition"
"route.topic.replacement" = "events.${routedByValue}"
"#,
        )
        .expect("valid");
        let c = &m[0].columns;
        assert_eq!(
            (
                c.id.as_str(),
                c.aggregate_type.as_str(),
                c.aggregate_id.as_str(),
                c.payload.as_str()
            ),
            ("id", "aggregatetype", "aggregateid", "payload")
        );
        assert_eq!((c.event_key.as_str(), c.event_type.as_str()), ("", ""));
        assert_eq!(c.partition, "shard");
        assert_eq!(m[0].additional.len(), 2);
        assert_eq!(m[0].additional[0].alias.as_deref(), Some("eventType"));
        assert_eq!(m[0].additional[1].alias.as_deref(), Some("tenant"));
        assert_eq!(m[0].additional[1].placement, Placement::Envelope);
        let profile = m[0].debezium.as_ref().expect("the profile");
        assert_eq!(profile.topic("Order"), "events.Order");
        assert_eq!(
            m[0].topic.render(&crate::config::topic::TopicFields {
                aggregate_type: "Order",
                event_type: None,
                database: "inventory",
                table: "outbox",
            }),
            Ok("events.Order".to_owned())
        );
    }

    #[test]
    fn the_debezium_profile_refuses_relay_layout_settings() {
        let err = |outbox: &str| mappings(outbox).expect_err("invalid").to_string();
        let dbz = "[debezium]\nkey_converter = \"string\"\nvalue_converter = \"json\"\ntopic_prefix = \"p\"\n";
        assert!(err(&format!(
            "[outbox]\ntables = [\"a.b\"]\ncompat = \"debezium\"\ntopic = \"x\"\n{dbz}"
        ))
        .contains("outbox.topic is set together with outbox.compat"));
        assert!(err(&format!(
            "[outbox]\ntables = [\"a.b\"]\ncompat = \"debezium\"\n[outbox.columns]\npayload = \"body\"\n{dbz}"
        ))
        .contains("outbox.columns is set"));
        assert!(err("[outbox]\ntables = [\"a.b\"]\ncompat = \"debezium\"\n")
            .contains("debezium.key_converter"));
    }

    #[test]
    fn bad_mappings_are_rejected_with_the_key() {
        let err = |outbox: &str| mappings(outbox).expect_err("invalid").to_string();
        assert!(err("[outbox]\ntables = []\n").contains("at least one outbox table"));
        assert!(
            err("[outbox]\ntables = [\"a.b\"]\ndatetime_time_zone = \"Mars/Olympus\"\n")
                .contains("outbox.datetime_time_zone \"Mars/Olympus\"")
        );
        assert!(err("[outbox]\ntables = [\"a.b\", \"a.b\"]\n").contains("named twice"));
        assert!(err(
            "[outbox]\ntables = [\"a.b\"]\nadditional = [{ column = \"x\", placement = \"header\", alias = \"id\" }]\n"
        )
        .contains("header name \"id\" is used twice"));
        assert!(err(
            "[outbox]\ntables = [\"a.b\"]\nadditional = [{ column = \"payload\", placement = \"envelope\" }]\n"
        )
        .contains("envelope field \"payload\""));
        assert!(
            err("[outbox]\ntables = [\"a.b\"]\nnull_payload = \"drop\"\n").contains("null_payload")
        );
        assert!(
            err("[[outbox.table]]\nname = \"a.b\"\ncolumns = { payload = \"\" }\n")
                .contains("columns.payload must name a column")
        );
    }

    #[test]
    fn patterns_map_their_matching_tables_and_exact_names_win() {
        let m = mappings(
            r#"
[outbox]
tables = ["tenant_*.outbox", "tenant_7.outbox"]
topic = "{schema}.{aggregate_type}"
[[outbox.table]]
name = "*.outbox"
topic = "other.{database}"
"#,
        )
        .expect("valid");
        assert!(m[0].pattern.is_some() && m[1].pattern.is_none() && m[2].pattern.is_some());
        let t = |s: &str| TableName::parse(s, None).expect("name");
        let of = |s: &str| mapping_of(&m, &t(s)).map(|x| (x.table.to_string(), x.topic.clone()));
        let fields = |db: &'static str| crate::config::topic::TopicFields {
            aggregate_type: "Order",
            event_type: None,
            database: db,
            table: "outbox",
        };
        let (name, topic) = of("tenant_1.outbox").expect("matches");
        assert_eq!(name, "tenant_1.outbox");
        assert_eq!(
            topic.render(&fields("tenant_1")),
            Ok("tenant_1.Order".to_owned())
        );
        assert_eq!(of("tenant_7.outbox").expect("exact").0, "tenant_7.outbox");
        assert!(mapping_of(&m, &t("tenant_7.outbox"))
            .expect("exact")
            .pattern
            .is_none());
        let (_, topic) = of("shop.outbox").expect("the second pattern");
        assert_eq!(topic.render(&fields("shop")), Ok("other.shop".to_owned()));
        assert!(of("tenant_1.outbox_old").is_none());
        assert!(m[0].trace_context);
    }

    #[test]
    fn a_pattern_may_not_match_the_checkpoint_table() {
        let err = |outbox: &str| mappings(outbox).expect_err("invalid").to_string();
        assert!(err("[outbox]\ntables = [\"shop.*\"]\n")
            .contains("matches the checkpoint table's name \"outbox_relay_checkpoint\""));
        assert!(err("[[outbox.table]]\nname = \"*.outbox_relay_*\"\n").contains("checkpoint"));
        assert!(mappings("[outbox]\ntables = [\"shop.outbox_?\"]\n").is_ok());
        assert!(err("[outbox]\ntables = [\"a_*.outbox\", \"a_*.outbox\"]\n").contains("twice"));
    }
}
