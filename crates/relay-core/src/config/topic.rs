//! Topic templates (`outbox.topic`, a table's `topic`, `dead_letter.topic`): parsed and
//! checked when the configuration loads, rendered per event by the router
//! ([`outbox_relay_kafka::route`]).

use crate::error::RelayError;

/// The values a template's placeholders take for one event.
#[derive(Debug, Clone, Copy)]
pub struct TopicFields<'a> {
    /// `{aggregate_type}`.
    pub aggregate_type: &'a str,
    /// `{event_type}`: the column's bytes (must be UTF-8 to be rendered); `None` when NULL.
    pub event_type: Option<&'a [u8]>,
    /// `{database}` (or `{schema}`) of the outbox table.
    pub database: &'a str,
    /// `{table}`: the outbox table's name.
    pub table: &'a str,
}

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
    /// Parses a template. Placeholders: `{aggregate_type}`, `{event_type}`, `{database}` (alias
    /// `{schema}`, for table patterns such as `tenant_*.outbox`), `{table}`.
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
                        // `{schema}`: the same value, the name used with table patterns.
                        "database" | "schema" => Part::Database,
                        "table" => Part::Table,
                        other => {
                            return Err(bad(format!(
                                "unknown placeholder {{{other}}}; use {{aggregate_type}}, \
                                 {{event_type}}, {{database}} (or its alias {{schema}}) or \
                                 {{table}}"
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

    /// The topic when the template has no placeholder (a fixed topic), else `None`.
    pub fn fixed(&self) -> Option<String> {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Literal(s) => Some(s.as_str()),
                _ => None,
            })
            .collect::<Option<String>>()
    }

    /// The topic for `event`.
    ///
    /// # Errors
    /// A message naming the value when the result is not a valid topic name (empty, too long, or
    /// with characters Kafka does not allow).
    pub fn render(&self, event: &TopicFields<'_>) -> Result<String, String> {
        let mut topic = String::new();
        for part in &self.parts {
            let value: &str = match part {
                Part::Literal(s) => s,
                Part::AggregateType => event.aggregate_type,
                Part::EventType => std::str::from_utf8(event.event_type.unwrap_or_default())
                    .map_err(|_| "event_type is not UTF-8 text".to_owned())?,
                Part::Database => event.database,
                Part::Table => event.table,
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

impl TopicTemplate {
    /// `true` when rendering the template for `event` gives `topic` (compared part by part:
    /// no allocation).
    pub fn renders_to(&self, event: &TopicFields<'_>, topic: &str) -> bool {
        let mut rest = topic.as_bytes();
        for part in &self.parts {
            let value: &[u8] = match part {
                Part::Literal(s) => s.as_bytes(),
                Part::AggregateType => event.aggregate_type.as_bytes(),
                Part::EventType => event.event_type.unwrap_or_default(),
                Part::Database => event.database.as_bytes(),
                Part::Table => event.table.as_bytes(),
            };
            match rest.strip_prefix(value) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}
