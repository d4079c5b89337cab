//! Route: an [`OutboxEvent`] becomes a Kafka record (topic, key, headers, value, timestamp).

use std::sync::{Arc, Mutex};

use outbox_relay_core::config::debezium::DebeziumTimestamp;
use outbox_relay_core::config::topic::TopicFields;
pub use outbox_relay_core::config::topic::TopicTemplate;
use outbox_relay_core::config::{CloudEventsConfig, TimestampRefused};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::outbox::OutboxEvent;
use outbox_relay_core::sink::Record;

/// The placeholders' values of `event`.
fn topic_fields(event: &OutboxEvent) -> TopicFields<'_> {
    TopicFields {
        aggregate_type: &event.aggregate_type,
        event_type: event.event_type.as_deref(),
        database: &event.table.database,
        table: &event.table.table,
    }
}

/// Maps outbox events to Kafka records, following each event's table mapping.
#[derive(Debug, Default)]
pub struct Router {
    /// The last topic rendered: consecutive events of one aggregate type share it instead of
    /// rendering and allocating it again.
    last_topic: Mutex<Option<Arc<str>>>,
}

impl Clone for Router {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl Router {
    /// A router.
    pub fn new() -> Self {
        Self::default()
    }

    /// The topic of `event`: the last one when it renders the same.
    fn topic(&self, event: &OutboxEvent) -> Result<Arc<str>, String> {
        if let Some(profile) = &event.mapping.debezium {
            let topic = profile.topic(&event.aggregate_type);
            if topic.is_empty() {
                return Err(format!(
                    "the route.by.field value {:?} routes to an empty topic",
                    event.aggregate_type
                ));
            }
            let mut last = self.last_topic.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = last.as_ref().filter(|t| ***t == *topic) {
                return Ok(Arc::clone(t));
            }
            let topic: Arc<str> = topic.into();
            *last = Some(Arc::clone(&topic));
            return Ok(topic);
        }
        let template = &event.mapping.topic;
        let mut last = self.last_topic.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(topic) = last
            .as_ref()
            .filter(|t| template.renders_to(&topic_fields(event), t))
        {
            return Ok(Arc::clone(topic));
        }
        let topic: Arc<str> = template.render(&topic_fields(event))?.into();
        *last = Some(Arc::clone(&topic));
        Ok(topic)
    }

    /// The record for `event`.
    ///
    /// # Errors
    /// [`RelayError::Row`] when the topic or the value cannot be built from the row.
    pub fn route(&self, event: OutboxEvent) -> Result<Record, RelayError> {
        self.try_route(event)
            .map_err(|(reason, event)| RelayError::Row {
                position: event.position.clone(),
                table: event.table.to_string(),
                reason,
            })
    }

    /// Like [`Router::route`], but gives the event back with the reason when it cannot be
    /// routed (for its dead letter).
    ///
    /// # Errors
    /// The reason and the event, when the topic cannot be built from the row or its payload
    /// cannot go into the configured JSON envelope.
    pub fn try_route(&self, event: OutboxEvent) -> Result<Record, (String, Box<OutboxEvent>)> {
        let topic = match self.topic(&event) {
            Ok(topic) => topic,
            Err(reason) => return Err((reason, Box::new(event))),
        };
        if event.mapping.has_envelope() && event.payload.is_some() {
            if let Err(reason) = envelope_payload(&event) {
                return Err((reason, Box::new(event)));
            }
        }
        if event.mapping.cloudevents.is_some() {
            if let Err(reason) = cloudevent_check(&event) {
                return Err((reason, Box::new(event)));
            }
        }
        Ok(Self::record(event, topic))
    }

    /// The record of an event that has no valid topic (empty topic), for its dead letter.
    pub fn record_without_topic(event: OutboxEvent) -> Record {
        Self::record(event, Arc::from(""))
    }

    /// The record of `event` in the Debezium profile (`[outbox] compat = "debezium"`).
    fn debezium_record(
        event: OutboxEvent,
        topic: Arc<str>,
        profile: &outbox_relay_core::debezium::Profile,
        columns: &outbox_relay_core::debezium::DebeziumColumns,
    ) -> Record {
        let parts = profile.record(
            columns,
            &event.aggregate_id,
            event.id.as_deref(),
            event.payload.as_deref(),
            &event.aggregate_type,
            &event.table,
        );
        let timestamp_ms = match profile.timestamp {
            DebeziumTimestamp::Commit => event.commit_ms,
            // Debezium's `ts_ms`: when the connector processed the change.
            DebeziumTimestamp::Processing => chrono::Utc::now().timestamp_millis(),
        };
        Record {
            topic,
            key: parts.key,
            value: parts.value,
            headers: parts.headers,
            partition: event.partition,
            timestamp_ms,
            column_timestamp: false,
            fallback_ms: None,
        }
    }

    /// The record of `event` on `topic`: key, value, headers and timestamp moved out of it.
    fn record(mut event: OutboxEvent, topic: Arc<str>) -> Record {
        if let (Some(profile), Some(columns)) =
            (event.mapping.debezium.clone(), event.debezium.take())
        {
            return Self::debezium_record(event, topic, &profile, &columns);
        }
        let names = &event.mapping.headers;
        let value = match (&event.payload, event.mapping.has_envelope()) {
            (Some(_), true) => envelope_payload(&event).ok(),
            _ => None,
        };
        let cloudevent = event
            .mapping
            .cloudevents
            .as_deref()
            .map(|c| cloudevent_headers(c, &event));
        let mut headers = Vec::with_capacity(4 + event.extra_headers.len());
        for (name, value) in [
            (&names.id, event.id),
            (&names.event_key, event.event_key),
            (&names.event_type, event.event_type),
            (
                &names.aggregate_type,
                Some(event.aggregate_type.into_bytes()),
            ),
        ] {
            if let (false, Some(v)) = (name.is_empty(), value) {
                headers.push((name.clone(), Some(v)));
            }
        }
        headers.extend(
            event
                .extra_headers
                .into_iter()
                .map(|(name, value)| (Arc::from(name), Some(value))),
        );
        headers.extend(
            cloudevent
                .into_iter()
                .flatten()
                .map(|(name, value)| (name, Some(value))),
        );
        Record {
            topic,
            key: event.aggregate_id,
            value: value.or(event.payload),
            headers,
            partition: event.partition,
            timestamp_ms: event.timestamp_ms,
            column_timestamp: event.column_timestamp,
            fallback_ms: (event.column_timestamp
                && event.mapping.timestamp_refused == TimestampRefused::Commit)
                .then_some(event.commit_ms),
        }
    }
}

/// Why `event` cannot be a CloudEvent (`[outbox.cloudevents]`): it needs a type and an id.
fn cloudevent_check(event: &OutboxEvent) -> Result<(), String> {
    if event.event_type.is_none() {
        return Err(format!(
            "CloudEvents (outbox.cloudevents.enabled) needs a type, and this row's {} column is \
             NULL: give every row an event type, or turn CloudEvents off",
            event.mapping.columns.event_type
        ));
    }
    if event.event_key.is_none() && event.id.is_none() {
        return Err(format!(
            "CloudEvents (outbox.cloudevents.enabled) needs an id, and this row's {} and {} \
             columns are NULL",
            event.mapping.columns.event_key, event.mapping.columns.id
        ));
    }
    Ok(())
}

/// The CloudEvents 1.0 attributes of `event` as Kafka headers, binary content mode (CloudEvents
/// Kafka protocol binding, section 3.2: `ce_` + attribute name; `datacontenttype` as
/// `content-type`).
fn cloudevent_headers(c: &CloudEventsConfig, event: &OutboxEvent) -> Vec<(Arc<str>, Vec<u8>)> {
    let mut out: Vec<(Arc<str>, Vec<u8>)> = vec![("ce_specversion".into(), b"1.0".to_vec())];
    if let Some(id) = event.event_key.as_ref().or(event.id.as_ref()) {
        out.push(("ce_id".into(), id.clone()));
    }
    out.push(("ce_source".into(), c.source.as_bytes().to_vec()));
    if let Some(t) = &event.event_type {
        out.push(("ce_type".into(), t.clone()));
    }
    out.push(("ce_subject".into(), event.aggregate_id.clone()));
    if let Some(t) = chrono::DateTime::from_timestamp_millis(event.timestamp_ms) {
        let time = t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        out.push(("ce_time".into(), time.into_bytes()));
    }
    if !c.content_type.is_empty() {
        out.push(("content-type".into(), c.content_type.as_bytes().to_vec()));
    }
    out
}

/// The JSON envelope `{"payload": <payload>, "<field>": <value>, …}` of an event with envelope
/// fields. The payload is embedded as JSON when it is JSON (a MySQL JSON column, or text that
/// parses as JSON), as a JSON string when it is other UTF-8 text.
///
/// # Errors
/// A binary payload that is not UTF-8 text.
fn envelope_payload(event: &OutboxEvent) -> Result<Vec<u8>, String> {
    let payload = event.payload.as_deref().unwrap_or(b"null");
    let mut out = Vec::with_capacity(payload.len() + 64);
    out.extend_from_slice(b"{\"");
    out.extend_from_slice(outbox_relay_core::outbox::mapping::ENVELOPE_PAYLOAD_FIELD.as_bytes());
    out.extend_from_slice(b"\":");
    if event.payload_is_json || serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        out.extend_from_slice(payload);
    } else {
        let text = std::str::from_utf8(payload).map_err(|_| {
            "the payload is binary (not UTF-8 text or JSON) and cannot go into the JSON \
             envelope configured by outbox.additional placement = \"envelope\""
                .to_owned()
        })?;
        serde_json::to_writer(&mut out, text).map_err(|e| e.to_string())?;
    }
    for (field, json) in &event.envelope {
        out.push(b',');
        serde_json::to_writer(&mut out, field).map_err(|e| e.to_string())?;
        out.push(b':');
        out.extend_from_slice(json);
    }
    out.push(b'}');
    Ok(out)
}

/// Kafka's default partitioner: `(murmur2(key) & 0x7fffffff) % partitions` (Apache Kafka
/// `BuiltInPartitioner.partitionForKey`; librdkafka `murmur2_random` for non-NULL keys).
pub fn key_partition(key: &[u8], partitions: i32) -> i32 {
    let h = murmur2::murmur2(key, murmur2::KAFKA_SEED) & 0x7fff_ffff;
    // The hash is below 2^31 and `partitions` positive: the remainder fits an i32.
    i32::try_from(i64::from(h) % i64::from(partitions.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay_core::config::RelayConfig;
    use outbox_relay_core::outbox::mapping::TableMapping;
    use outbox_relay_core::position::BinlogPosition;
    use std::sync::Arc;

    fn mapping(outbox: &str) -> Arc<TableMapping> {
        let toml = format!(
            "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 9\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\ntables = [\"shop.outbox\"]\n{outbox}"
        );
        let config = RelayConfig::from_toml_str(&toml).expect("valid config");
        Arc::new(config.table_mappings().expect("mappings").remove(0))
    }

    fn event_with(aggregate_type: &str, mapping: Arc<TableMapping>) -> OutboxEvent {
        OutboxEvent {
            table: Arc::clone(&mapping.table),
            mapping,
            id: Some(b"7".to_vec()),
            aggregate_type: aggregate_type.into(),
            aggregate_id: b"order-1".to_vec(),
            event_type: Some(b"OrderCreated".to_vec()),
            event_key: Some(b"k-7".to_vec()),
            payload: Some(br#"{"a":1}"#.to_vec()),
            payload_is_json: false,
            partition: None,
            extra_headers: Vec::new(),
            envelope: Vec::new(),
            timestamp_ms: 1_700_000_000_000,
            column_timestamp: false,
            commit_ms: 1_700_000_000_000,
            position: BinlogPosition::new("bin.000001", 400),
            debezium: None,
        }
    }

    fn event(aggregate_type: &str) -> OutboxEvent {
        event_with(aggregate_type, mapping(""))
    }

    #[test]
    fn cloudevents_headers_follow_the_kafka_binding() {
        let m = mapping("[outbox.cloudevents]\nenabled = true\nsource = \"/shop/orders\"\n");
        let record = Router::new().route(event_with("Order", m)).expect("routes");
        let h: Vec<(&str, &str)> = record
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    &**n,
                    std::str::from_utf8(v.as_deref().expect("a value")).expect("utf-8"),
                )
            })
            .collect();
        // The standard headers stay; the CloudEvents attributes follow them.
        assert_eq!(
            h,
            vec![
                ("id", "7"),
                ("event_key", "k-7"),
                ("event_type", "OrderCreated"),
                ("aggregate_type", "Order"),
                ("ce_specversion", "1.0"),
                ("ce_id", "k-7"),
                ("ce_source", "/shop/orders"),
                ("ce_type", "OrderCreated"),
                ("ce_subject", "order-1"),
                ("ce_time", "2023-11-14T22:13:20.000Z"),
                ("content-type", "application/json"),
            ]
        );
        assert_eq!(record.value.as_deref(), Some(&br#"{"a":1}"#[..]));
    }

    #[test]
    fn cloudevents_need_a_type_an_id_and_a_source() {
        let m = mapping(
            "[outbox.cloudevents]\nenabled = true\nsource = \"urn:shop\"\ncontent_type = \"\"\n",
        );
        let mut e = event_with("Order", Arc::clone(&m));
        e.event_key = None;
        let record = Router::new().route(e).expect("the id column stands in");
        assert!(record
            .headers
            .iter()
            .any(|(n, v)| &**n == "ce_id" && v.as_deref() == Some(&b"7"[..])));
        assert!(!record.headers.iter().any(|(n, _)| &**n == "content-type"));
        let mut e = event_with("Order", Arc::clone(&m));
        e.event_type = None;
        let (reason, _) = Router::new().try_route(e).expect_err("no type");
        assert!(reason.contains("needs a type"), "{reason}");
        let mut e = event_with("Order", m);
        e.event_key = None;
        e.id = None;
        let (reason, _) = Router::new().try_route(e).expect_err("no id");
        assert!(reason.contains("needs an id"), "{reason}");
        let err = RelayConfig::from_toml_str(
            "[mysql]\nurl = \"mysql://root@127.0.0.1:3306/shop\"\nserver_id = 9\n\
             [kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[outbox]\ntables = [\"shop.outbox\"]\n\
             [outbox.cloudevents]\nenabled = true\n",
        )
        .expect_err("no source");
        assert!(
            err.to_string().contains("outbox.cloudevents.source"),
            "{err}"
        );
    }

    #[test]
    fn the_last_topic_is_reused_only_when_it_renders_the_same() {
        let router = Router::new();
        for agg in ["Order", "Order", "Ord", "Orders", "Payment", "Order"] {
            let record = router.route(event(agg)).expect("routes");
            assert_eq!(&*record.topic, format!("outbox.event.{agg}"));
        }
        let by_type = mapping("topic = \"{aggregate_type}.{event_type}\"\n");
        for ty in ["Created", "Created", "Paid"] {
            let mut e = event_with("Order", Arc::clone(&by_type));
            e.event_type = Some(ty.as_bytes().to_vec());
            let record = router.route(e).expect("routes");
            assert_eq!(&*record.topic, format!("Order.{ty}"));
        }
    }

    #[test]
    fn default_template_routes_by_aggregate_type() {
        let record = Router::new().route(event("Order")).expect("routes");
        assert_eq!(&*record.topic, "outbox.event.Order");
        assert_eq!(record.key, b"order-1");
        assert_eq!(record.value.as_deref(), Some(&br#"{"a":1}"#[..]));
        let names: Vec<_> = record.headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, ["id", "event_key", "event_type", "aggregate_type"]);
        assert_eq!(record.headers[0].1.as_deref(), Some(&b"7"[..]));
        assert_eq!(record.partition, None);
    }

    #[test]
    fn all_placeholders_render() {
        let t = TopicTemplate::parse("{database}.{table}.{aggregate_type}.{event_type}")
            .expect("valid");
        assert_eq!(
            t.render(&topic_fields(&event("Order"))),
            Ok("shop.outbox.Order.OrderCreated".into())
        );
    }

    #[test]
    fn fixed_topic_and_renamed_or_dropped_headers() {
        let m = mapping(
            "topic = \"all-events\"\n[outbox.headers]\nevent_key = \"idempotency-key\"\nid = \"\"\n",
        );
        let mut e = event_with("Order", m);
        e.extra_headers = vec![("tenant".into(), b"acme".to_vec())];
        e.partition = Some(3);
        let record = Router::new().route(e).expect("routes");
        assert_eq!(&*record.topic, "all-events");
        let names: Vec<_> = record.headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(
            names,
            ["idempotency-key", "event_type", "aggregate_type", "tenant"]
        );
        assert_eq!(record.partition, Some(3));
    }

    #[test]
    fn envelope_wraps_the_payload_with_typed_fields() {
        let m = mapping(
            "additional = [{ column = \"version\", placement = \"envelope\", alias = \"v\" }, \
             { column = \"tenant\", placement = \"envelope\" }]\n",
        );
        let mut e = event_with("Order", Arc::clone(&m));
        e.envelope = vec![
            ("v".into(), b"3".to_vec()),
            ("tenant".into(), br#""acme""#.to_vec()),
        ];
        let record = Router::new().route(e).expect("routes");
        assert_eq!(
            record.value.as_deref(),
            Some(&br#"{"payload":{"a":1},"v":3,"tenant":"acme"}"#[..])
        );
        // Text that is not JSON becomes a JSON string; a NULL payload stays a tombstone.
        let mut text = event_with("Order", Arc::clone(&m));
        text.payload = Some(b"plain \"text\"".to_vec());
        let record = Router::new().route(text).expect("routes");
        assert_eq!(
            record.value.as_deref(),
            Some(&br#"{"payload":"plain \"text\""}"#[..])
        );
        let mut null = event_with("Order", Arc::clone(&m));
        null.payload = None;
        assert_eq!(Router::new().route(null).expect("routes").value, None);
        let mut binary = event_with("Order", m);
        binary.payload = Some(vec![0xff, 0x00]);
        let err = Router::new().route(binary).expect_err("binary").to_string();
        assert!(err.contains("cannot go into the JSON envelope"), "{err}");
    }

    #[test]
    fn invalid_templates_are_config_errors() {
        for bad in [
            "",
            "outbox.{nope}",
            "outbox.{aggregate_type",
            "out box.{aggregate_type}",
        ] {
            assert!(TopicTemplate::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn aggregate_type_that_makes_a_bad_topic_is_a_row_error() {
        let err = Router::new()
            .route(event("Order Line"))
            .expect_err("space")
            .to_string();
        assert!(
            err.contains("bin.000001:400") && err.contains("Order Line"),
            "{err}"
        );
    }

    /// Partitions of keys as Apache Kafka's Java client computes them
    /// (`Utils.toPositive(Utils.murmur2(key)) % n`), values from its `UtilsTest.testMurmur2`
    /// hashes: "21" -> -973932308, "foobar" -> -790332482, "a-little-bit-long-string" ->
    /// -985981536.
    #[test]
    fn keys_go_to_the_partitions_kafka_computes() {
        let cases: [(&str, i32); 3] = [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
        ];
        for (key, java_hash) in cases {
            let hash = murmur2::murmur2(key.as_bytes(), murmur2::KAFKA_SEED);
            assert_eq!(hash.cast_signed(), java_hash, "murmur2 of {key:?}");
            let expected = (java_hash & 0x7fff_ffff) % 12;
            assert_eq!(key_partition(key.as_bytes(), 12), expected, "{key:?}");
        }
    }
}
