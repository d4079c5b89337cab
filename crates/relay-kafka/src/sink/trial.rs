//! A record sent alone with a producer of its own ([`KafkaSink::send_trial`]).
//!
//! Why a second producer: the sink's producer is idempotent with `enable.gapless.guarantee`,
//! so a produce response that refuses a batch for good (here: the topic, when the relay's
//! principal may describe it but not write to it) is a fatal error that stops it (librdkafka
//! CONFIGURATION.md, `enable.gapless.guarantee`). A held table whose topic was refused that way
//! is retried on the `[retry]` backoff; sending its first held record with the sink's producer
//! would stop that producer, and restart the source, at every retry while the topic is still
//! refused. The trial producer is not idempotent (one record in flight, so nothing to reorder
//! or duplicate within it) and its refusal fails only that record. It is created at the first
//! trial and lives as long as the sink; it uses the user's properties (same cluster,
//! credentials and partitioner, so the record lands on its key's partition).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use super::{acked, is_permanent, redact_config_error, refused, KafkaSink, RelayKafkaContext};
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::sink::{Delivered, Record, SendError};

/// Longest a trial's record waits for its acknowledgement (`message.timeout.ms` of the trial
/// producer): a pipeline waits for it, so it must not take librdkafka's default 5 minutes.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// The trial producer of one sink, created at its first use.
pub(super) struct TrialProducer {
    config: ClientConfig,
    metrics: Arc<Metrics>,
    log: Arc<crate::kafka_log::KafkaLog>,
    producer: Mutex<Option<Arc<FutureProducer<RelayKafkaContext>>>>,
}

impl TrialProducer {
    /// `config`: the sink's producer configuration (the user's properties included).
    pub(super) fn new(
        mut config: ClientConfig,
        metrics: Arc<Metrics>,
        log: Arc<crate::kafka_log::KafkaLog>,
    ) -> Self {
        config
            .set("enable.idempotence", "false")
            .set("enable.gapless.guarantee", "false")
            .set("max.in.flight.requests.per.connection", "1")
            .set("message.timeout.ms", TRIAL_TIMEOUT.as_millis().to_string())
            .set("linger.ms", "0");
        // Its transactional.id, if any, belongs to the sink's producer.
        config.remove("transactional.id");
        Self {
            config,
            metrics,
            log,
            producer: Mutex::new(None),
        }
    }

    fn producer(&self) -> Result<Arc<FutureProducer<RelayKafkaContext>>, RelayError> {
        let mut slot = self
            .producer
            .lock()
            .map_err(|_| RelayError::kafka("the trial producer's lock is poisoned"))?;
        if let Some(p) = slot.as_ref() {
            return Ok(Arc::clone(p));
        }
        let context = RelayKafkaContext::new(Arc::clone(&self.metrics), Arc::clone(&self.log));
        let producer: FutureProducer<RelayKafkaContext> =
            self.config.create_with_context(context).map_err(|e| {
                RelayError::Config(format!("kafka.properties: {}", redact_config_error(e)))
            })?;
        let producer = Arc::new(producer);
        *slot = Some(Arc::clone(&producer));
        Ok(producer)
    }
}

impl KafkaSink {
    /// Sends `record` alone with the sink's trial producer (see the module `trial`) and waits
    /// for its delivery, at most [`TRIAL_TIMEOUT`]: [`Delivered::Acked`] (the record is
    /// written), or [`Delivered::Refused`] (with `topic_refused` when its topic is what was
    /// refused). A record this sink would refuse before sending (too large for the topic, a
    /// timestamp it refuses) comes back refused without being sent.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the delivery failed otherwise (no broker, a timeout: the
    /// record may have been written); [`RelayError::Config`] when librdkafka refuses the trial
    /// producer's properties.
    pub async fn send_trial(&self, record: &Record) -> Result<Delivered, RelayError> {
        let refused_here = |reason: String| Delivered::Refused {
            reason,
            broker_error: "refused before sending".to_owned(),
            key: Some(record.key.clone()),
            value: record.value.clone(),
            headers: record
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone().unwrap_or_default()))
                .collect(),
            value_dropped: false,
            topic_refused: false,
        };
        if let Some(reason) = self.topic_limits.refusal(
            &record.topic,
            &record.key,
            record.value.as_deref(),
            &record.headers,
        ) {
            return Ok(refused_here(reason));
        }
        let (timestamp, headers) = match self.stamped(record) {
            Ok(stamped) => stamped,
            Err(
                SendError::Permanent(reason)
                | SendError::TooLarge(reason)
                | SendError::Timestamp(reason),
            ) => return Ok(refused_here(reason)),
            Err(SendError::Failed(e)) => return Err(e),
            Err(SendError::QueueFull | SendError::BrokerRefused(_)) => {
                return Err(RelayError::kafka("the trial record could not be prepared"))
            }
        };
        let producer = self.trial.producer()?;
        let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&record.topic)
            .key(record.key.as_slice())
            .headers(headers)
            .timestamp(timestamp);
        if let Some(partition) = record.partition {
            fr = fr.partition(partition);
        }
        if let Some(value) = &record.value {
            fr = fr.payload(value.as_slice());
        }
        match producer.send(fr, Duration::ZERO).await {
            Ok(delivery) => acked(&record.topic, delivery.partition, delivery.offset),
            Err((KafkaError::MessageProduction(code), msg)) if is_permanent(code) => {
                Ok(refused(code, &msg))
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut), _)) => {
                Err(RelayError::kafka(format!(
                    "the trial record for topic {} was not acknowledged within {} s",
                    record.topic,
                    TRIAL_TIMEOUT.as_secs()
                )))
            }
            Err((e, _)) => Err(RelayError::kafka(format!(
                "the trial record for topic {} failed: {e}",
                record.topic
            ))),
        }
    }
}
