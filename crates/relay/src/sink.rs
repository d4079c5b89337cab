//! Sink: an idempotent rdkafka producer and its delivery reports.
//!
//! The producer is configured so that a record is acknowledged only when all in-sync replicas
//! have it (`acks=all`) and so that librdkafka's internal retries can neither duplicate nor
//! reorder records within a partition (`enable.idempotence=true`, librdkafka
//! CONFIGURATION.md). Keys are hashed with `murmur2_random`, the Java client's partitioner, so
//! an aggregate lands on the same partition as with a Java producer.

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;

use crate::config::KafkaConfig;
use crate::error::RelayError;
use crate::route::KafkaRecord;

/// The Kafka producer of one pipeline run.
pub struct KafkaSink {
    producer: FutureProducer,
}

/// Why a record was not enqueued.
#[derive(Debug)]
pub enum SendError {
    /// librdkafka's local queue is full: wait for a delivery, then send again (backpressure).
    QueueFull,
    /// Anything else; the pipeline stops and resumes from its checkpoint.
    Failed(RelayError),
}

impl KafkaSink {
    /// Creates the producer. Does not contact the brokers; see [`KafkaSink::check_reachable`].
    ///
    /// # Errors
    /// [`RelayError::Config`] when librdkafka rejects a property.
    pub fn new(config: &KafkaConfig) -> Result<Self, RelayError> {
        let mut client = ClientConfig::new();
        // Defaults the user may override: small batching delay, bounded total delivery time.
        client.set("linger.ms", "5");
        client.set("message.timeout.ms", "120000");
        for (key, value) in &config.properties {
            client.set(key, value);
        }
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random");
        let producer: FutureProducer = client
            .create()
            .map_err(|e| RelayError::Config(format!("kafka.properties: {e}")))?;
        Ok(Self { producer })
    }

    /// Fetches cluster metadata once, to fail fast (and retry) when no broker answers.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] naming the bootstrap servers.
    pub async fn check_reachable(
        &self,
        bootstrap: &str,
        timeout: Duration,
    ) -> Result<(), RelayError> {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.client().fetch_metadata(None, timeout))
            .await
            .map_err(|e| RelayError::Kafka(format!("metadata task failed: {e}")))?
            .map(|_| ())
            .map_err(|e| {
                RelayError::Kafka(format!(
                    "no broker of {bootstrap} answered a metadata request: {e}"
                ))
            })
    }

    /// Enqueues `record`; the returned future resolves when Kafka acknowledges it or gives up.
    ///
    /// # Errors
    /// [`SendError::QueueFull`] when librdkafka's queue is full; [`SendError::Failed`] otherwise
    /// (for example a record larger than `message.max.bytes`).
    pub fn send(&self, record: &KafkaRecord) -> Result<DeliveryFuture, SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_slice()),
            });
        }
        let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&record.topic)
            .key(record.key.as_slice())
            .headers(headers)
            .timestamp(record.timestamp_ms);
        if let Some(value) = &record.value {
            fr = fr.payload(value.as_slice());
        }
        self.producer.send_result(fr).map_err(|(e, _)| match e {
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => SendError::QueueFull,
            other => SendError::Failed(RelayError::Kafka(format!(
                "cannot produce to topic {}: {other}",
                record.topic
            ))),
        })
    }

    /// Waits up to `timeout` for every enqueued record to be delivered or to fail.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when records are still outstanding after `timeout`.
    pub async fn flush(&self, timeout: Duration) -> Result<(), RelayError> {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(timeout))
            .await
            .map_err(|e| RelayError::Kafka(format!("flush task failed: {e}")))?
            .map_err(RelayError::from)
    }
}

/// Turns a delivery report into a result.
///
/// # Errors
/// [`RelayError::Kafka`] when the record was not acknowledged (after librdkafka's retries).
pub fn delivery_result(
    report: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> Result<(i32, i64), RelayError> {
    match report {
        Ok(Ok(delivery)) => Ok((delivery.partition, delivery.offset)),
        Ok(Err((e, _))) => Err(RelayError::Kafka(format!("delivery failed: {e}"))),
        Err(_) => Err(RelayError::Kafka(
            "the producer was dropped before delivery".into(),
        )),
    }
}
