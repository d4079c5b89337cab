//! The readiness probe of Kafka: while the relay streams, a metadata request every third of
//! `http.ready_kafka_ms`, so `/readyz` notices an unreachable cluster even when no records are
//! sent (librdkafka only reports a lost broker connection, never its return).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::Producer;

use super::served::ServedProducer;
use super::KafkaSink;

/// A handle that asks the cluster for metadata on the sink's producer (the same connections).
#[derive(Clone)]
pub struct KafkaProbe {
    producer: Arc<ServedProducer>,
    metrics: Arc<outbox_relay_core::observe::metrics::Metrics>,
    log: Arc<crate::kafka_log::KafkaLog>,
}

impl KafkaSink {
    /// The probe of this sink's cluster.
    pub fn probe(&self) -> KafkaProbe {
        KafkaProbe {
            producer: Arc::clone(&self.producer),
            metrics: Arc::clone(&self.metrics),
            log: Arc::clone(&self.log),
        }
    }
}

impl KafkaProbe {
    /// One metadata request for no topic (the broker list), waiting at most `timeout`.
    ///
    /// # Errors
    /// librdkafka's error text when no broker answered in time.
    pub async fn once(&self, timeout: Duration) -> Result<(), String> {
        let producer = Arc::clone(&self.producer);
        // The request blocks its thread until a broker answers or `timeout` passes.
        let answer = tokio::task::spawn_blocking(move || {
            producer
                .producer
                .client()
                .fetch_metadata(None, timeout)
                .map(|_| ())
                .map_err(|e| format!("no broker answered a metadata request: {e}"))
        })
        .await
        .map_err(|e| format!("the probe task failed: {e}"))?;
        match &answer {
            Ok(()) => self.log.reachable(),
            Err(e) => self.log.unreachable(e),
        }
        answer
    }

    /// Probes every `every` until dropped, reporting each outcome to
    /// [`outbox_relay_core::observe::metrics::Metrics::kafka_probe`] of the sink's metrics.
    pub async fn run(self, every: Duration) {
        let metrics = Arc::clone(&self.metrics);
        loop {
            tokio::time::sleep(every).await;
            let asked = std::time::Instant::now();
            metrics.kafka_probe(asked, self.once(every).await);
        }
    }
}
