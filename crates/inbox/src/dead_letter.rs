//! Dead letters: the record unchanged plus `dlq_*` headers (`inbox/CONTRACT.md`, "Dead
//! letters"), produced with `acks=all` and awaited.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::error::InboxError;
use crate::record::InboxRecord;

/// The dead-letter producer.
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
    pub(crate) async fn send(
        &self,
        record: &InboxRecord,
        consumer: &str,
        reason: &str,
        attempts: u32,
    ) -> Result<(), InboxError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 6);
        for (k, v) in &record.headers {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        let attempts = attempts.to_string();
        for (k, v) in [
            ("dlq_reason", reason),
            ("dlq_topic", record.topic.as_str()),
            ("dlq_partition", partition.as_str()),
            ("dlq_offset", offset.as_str()),
            ("dlq_consumer", consumer),
            ("dlq_attempts", attempts.as_str()),
        ] {
            headers = headers.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&self.topic).headers(headers);
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
            .map_err(|(e, _)| InboxError::kafka(format!("dead letter to {}", self.topic), e))
    }
}
