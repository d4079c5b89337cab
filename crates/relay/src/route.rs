//! Route: an [`OutboxEvent`] becomes a Kafka record (topic, key, headers, value, timestamp).

use crate::decode::OutboxEvent;
use crate::error::RelayError;

/// Kafka's limit on topic name length (bytes).
const MAX_TOPIC_LEN: usize = 249;

/// A parsed topic template such as `outbox.event.{aggregate_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    AggregateType,
    EventType,
    Database,
    Table,
}

impl TopicTemplate {
    /// Parses a template. Placeholders: `{aggregate_type}`, `{event_type}`, `{database}`,
    /// `{table}`.
    ///
    /// # Errors
    /// [`RelayError::Config`] for an unknown placeholder, an unclosed brace, or literal text with
    /// characters Kafka does not allow in topic names (`[a-zA-Z0-9._-]` only).
    pub fn parse(template: &str) -> Result<Self, RelayError> {
        let bad = |why: String| RelayError::Config(format!("outbox.topic {template:?}: {why}"));
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| bad("unclosed '{'".into()))?;
                    parts.push(match &rest[1..end] {
                        "aggregate_type" => Part::AggregateType,
                        "event_type" => Part::EventType,
                        "database" => Part::Database,
                        "table" => Part::Table,
                        other => {
                            return Err(bad(format!(
                                "unknown placeholder {{{other}}}; use {{aggregate_type}}, \
                                 {{event_type}}, {{database}} or {{table}}"
                            )))
                        }
                    });
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    let literal = &rest[..end];
                    if let Some(c) = literal.chars().find(|c| !is_topic_char(*c)) {
                        return Err(bad(format!(
                            "{c:?} is not allowed in a Kafka topic name (use a-z A-Z 0-9 . _ -)"
                        )));
                    }
                    parts.push(Part::Literal(literal.to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        if parts.is_empty() {
            return Err(bad("the template is empty".into()));
        }
        Ok(Self { parts })
    }

    /// The topic for `event`.
    ///
    /// # Errors
    /// A message naming the value when the result is not a valid topic name (empty, too long, or
    /// with characters Kafka does not allow).
    pub fn render(&self, event: &OutboxEvent) -> Result<String, String> {
        let mut topic = String::new();
        for part in &self.parts {
            let value: &str = match part {
                Part::Literal(s) => s,
                Part::AggregateType => &event.aggregate_type,
                Part::EventType => {
                    std::str::from_utf8(event.event_type.as_deref().unwrap_or_default())
                        .map_err(|_| "event_type is not UTF-8 text".to_owned())?
                }
                Part::Database => &event.table.database,
                Part::Table => &event.table.table,
            };
            topic.push_str(value);
        }
        if topic.is_empty() || topic.len() > MAX_TOPIC_LEN || topic == "." || topic == ".." {
            return Err(format!(
                "topic {topic:?} is not a valid Kafka topic name (1 to {MAX_TOPIC_LEN} characters)"
            ));
        }
        if let Some(c) = topic.chars().find(|c| !is_topic_char(*c)) {
            return Err(format!(
                "topic {topic:?} contains {c:?}, which Kafka does not allow in topic names; \
                 fix the aggregate type or the topic template"
            ));
        }
        Ok(topic)
    }
}

fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A Kafka record ready for the sink. Borrowed from nothing: the sink owns it until delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaRecord {
    /// Destination topic.
    pub topic: String,
    /// Partition key (the aggregate id).
    pub key: Vec<u8>,
    /// Value; `None` produces a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order: `id`, `event_key`, `event_type`, `aggregate_type` (those not NULL).
    pub headers: Vec<(&'static str, Vec<u8>)>,
    /// Record timestamp, ms since the Unix epoch.
    pub timestamp_ms: i64,
}

/// Maps outbox events to Kafka records.
#[derive(Debug, Clone)]
pub struct Router {
    topic: TopicTemplate,
}

impl Router {
    /// A router with the given topic template.
    pub fn new(topic: TopicTemplate) -> Self {
        Self { topic }
    }

    /// The record for `event`.
    ///
    /// # Errors
    /// [`RelayError::Row`] when the topic cannot be built from the row.
    pub fn route(&self, event: OutboxEvent) -> Result<KafkaRecord, RelayError> {
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
    /// The reason and the event, when the topic cannot be built from the row.
    pub fn try_route(&self, event: OutboxEvent) -> Result<KafkaRecord, (String, Box<OutboxEvent>)> {
        let topic = match self.topic.render(&event) {
            Ok(topic) => topic,
            Err(reason) => return Err((reason, Box::new(event))),
        };
        Ok(Self::record(event, topic))
    }

    /// The record of an event that has no valid topic (empty topic), for its dead letter.
    pub fn record_without_topic(event: OutboxEvent) -> KafkaRecord {
        Self::record(event, String::new())
    }

    /// The record of `event` on `topic`: key, value, headers and timestamp moved out of it.
    fn record(event: OutboxEvent, topic: String) -> KafkaRecord {
        let mut headers = Vec::with_capacity(4);
        for (name, value) in [
            ("id", event.id),
            ("event_key", event.event_key),
            ("event_type", event.event_type),
            ("aggregate_type", Some(event.aggregate_type.into_bytes())),
        ] {
            if let Some(v) = value {
                headers.push((name, v));
            }
        }
        KafkaRecord {
            topic,
            key: event.aggregate_id,
            value: event.payload,
            headers,
            timestamp_ms: event.timestamp_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TableName;
    use crate::position::BinlogPosition;
    use std::sync::Arc;

    fn event(aggregate_type: &str) -> OutboxEvent {
        OutboxEvent {
            table: Arc::new(TableName {
                database: "shop".into(),
                table: "outbox".into(),
            }),
            id: Some(b"7".to_vec()),
            aggregate_type: aggregate_type.into(),
            aggregate_id: b"order-1".to_vec(),
            event_type: Some(b"OrderCreated".to_vec()),
            event_key: Some(b"k-7".to_vec()),
            payload: Some(br#"{"a":1}"#.to_vec()),
            timestamp_ms: 1_700_000_000_000,
            position: BinlogPosition::new("bin.000001", 400),
        }
    }

    #[test]
    fn default_template_routes_by_aggregate_type() {
        let router =
            Router::new(TopicTemplate::parse("outbox.event.{aggregate_type}").expect("valid"));
        let record = router.route(event("Order")).expect("routes");
        assert_eq!(record.topic, "outbox.event.Order");
        assert_eq!(record.key, b"order-1");
        assert_eq!(record.value.as_deref(), Some(&br#"{"a":1}"#[..]));
        let names: Vec<_> = record.headers.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["id", "event_key", "event_type", "aggregate_type"]);
        assert_eq!(record.headers[0].1, b"7");
    }

    #[test]
    fn all_placeholders_render() {
        let t = TopicTemplate::parse("{database}.{table}.{aggregate_type}.{event_type}")
            .expect("valid");
        assert_eq!(
            t.render(&event("Order")),
            Ok("shop.outbox.Order.OrderCreated".into())
        );
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
        let router =
            Router::new(TopicTemplate::parse("outbox.event.{aggregate_type}").expect("valid"));
        let err = router
            .route(event("Order Line"))
            .expect_err("space")
            .to_string();
        assert!(
            err.contains("bin.000001:400") && err.contains("Order Line"),
            "{err}"
        );
    }
}
