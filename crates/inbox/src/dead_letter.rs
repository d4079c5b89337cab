//! Dead letters: the record unchanged plus `dlq_*` headers (`inbox/CONTRACT.md`, "Dead
//! letters"), produced with `acks=all` and awaited.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::error::InboxError;
use crate::record::InboxRecord;

/// The dead-letter (and retry copy) producer.
pub(crate) struct DeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl DeadLetters {
    pub(crate) fn new(bootstrap_servers: &str, topic: &str) -> Result<Self, InboxError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .create()
            .map_err(|e| InboxError::kafka("creating the dead-letter producer", e))?;
        Ok(DeadLetters {
            producer,
            topic: topic.to_owned(),
        })
    }

    /// Produces `record` to the dead-letter topic and waits for the broker's acknowledgement.
    /// `dlq_topic`, `dlq_partition`, `dlq_offset` name the original record (a retry copy's
    /// `original_*` headers; the record itself otherwise).
    pub(crate) async fn send(
        &self,
        record: &InboxRecord,
        consumer: &str,
        reason: &str,
        attempts: u32,
    ) -> Result<(), InboxError> {
        let origin = crate::retry::origin(record);
        let mut headers = record.headers.clone();
        for (k, v) in [
            ("dlq_reason", reason.to_owned()),
            ("dlq_topic", origin.topic),
            ("dlq_partition", origin.partition.to_string()),
            ("dlq_offset", origin.offset.to_string()),
            ("dlq_consumer", consumer.to_owned()),
            ("dlq_attempts", attempts.to_string()),
        ] {
            headers.push((k.to_owned(), Some(v.into_bytes())));
        }
        let topic = self.topic.clone();
        self.produce(&topic, record, &headers, "dead letter").await
    }

    /// Produces a copy of `record` (key, value) with `headers` to `topic` (a retry tier) and
    /// waits for the broker's acknowledgement.
    pub(crate) async fn send_copy(
        &self,
        topic: &str,
        record: &InboxRecord,
        headers: &[(String, Option<Vec<u8>>)],
    ) -> Result<(), InboxError> {
        self.produce(topic, record, headers, "retry copy").await
    }

    async fn produce(
        &self,
        topic: &str,
        record: &InboxRecord,
        headers: &[(String, Option<Vec<u8>>)],
        what: &str,
    ) -> Result<(), InboxError> {
        let mut owned = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            owned = owned.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(owned);
        if let Some(k) = record.key.as_deref() {
            out = out.key(k);
        }
        if let Some(v) = record.value.as_deref() {
            out = out.payload(v);
        }
        // The producer's message.timeout.ms bounds the wait; this only stops the future early
        // when the queue is full.
        self.producer
            .send(out, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(e, _)| InboxError::kafka(format!("{what} to {topic}"), e))
    }
}

/// Settings of a client configuration an admin client takes (connection and security).
fn admin_setting(key: &str) -> bool {
    key == "bootstrap.servers"
        || key == "client.id"
        || key == "broker.address.family"
        || ["security.", "ssl.", "sasl.", "socket."]
            .iter()
            .any(|p| key.starts_with(p))
}

/// Makes sure `topic` exists before the first dead letter needs it (`inbox/CONTRACT.md`, "Dead
/// letters"): asks the brokers to create it with their defaults (partitions, replication) through
/// the admin CreateTopics request; a topic that already exists (or that the broker refuses to
/// create but serves) counts as there. It returns once the broker's metadata serves the topic,
/// so a consumer subscribing next finds it. [`crate::InboxConsumer::run`] calls it for the inbox's
/// dead-letter topic before its first poll; call it yourself with your own poll loop.
/// `config`: the client settings (`bootstrap.servers` at least; only connection and security
/// settings are used).
///
/// # Errors
/// [`InboxError::DeadLetterTopic`] naming the topic and the fix when the topic is missing and
/// the broker refuses to create it (an invalid name, a creation policy, no CREATE permission)
/// or cannot be asked within `timeout`.
pub async fn ensure_topic(
    config: &ClientConfig,
    topic: &str,
    timeout: Duration,
) -> Result<(), InboxError> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    use rdkafka::types::RDKafkaErrorCode;

    let mut admin_config = ClientConfig::new();
    for (k, v) in config.config_map() {
        if admin_setting(k) {
            admin_config.set(k, v);
        }
    }
    let refused = |why: String| InboxError::DeadLetterTopic {
        topic: topic.to_owned(),
        why,
    };
    let admin: AdminClient<DefaultClientContext> =
        admin_config.create().map_err(|e| refused(e.to_string()))?;
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, -1, TopicReplication::Fixed(-1))],
            &AdminOptions::new().request_timeout(Some(timeout)),
        )
        .await
        .map_err(|e| refused(e.to_string()))?;
    let admin = Arc::new(admin);
    let why = match created.into_iter().next() {
        Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {
            // CreateTopics answers once the controller created the topic; the brokers learn of
            // it a moment later. A consumer subscribing meanwhile is told it does not exist,
            // and librdkafka asks again only at `topic.metadata.refresh.interval.ms` (5
            // minutes by default): return once the topic is served.
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                if served(&admin, topic, Duration::from_secs(1)).await {
                    return Ok(());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(refused(format!(
                        "created, but the broker did not serve it within {timeout:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(Err((_, code))) => code.to_string(),
        None => "no answer for the topic".to_owned(),
    };
    // Refused: still fine when the broker serves the topic (CREATE denied on an existing one).
    if served(&admin, topic, timeout).await {
        Ok(())
    } else {
        Err(refused(why))
    }
}

/// Whether the broker's metadata serves `topic` with its partitions (asked within `timeout`;
/// `false` when it cannot be asked).
async fn served(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    topic: &str,
    timeout: Duration,
) -> bool {
    let admin = Arc::clone(admin);
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        admin
            .inner()
            .fetch_metadata(Some(&topic), timeout)
            .ok()
            .and_then(|m| {
                m.topics()
                    .iter()
                    .find(|t| t.name() == topic)
                    .map(|t| t.error().is_none() && !t.partitions().is_empty())
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
