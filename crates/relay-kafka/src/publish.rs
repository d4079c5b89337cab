//! Producing for the operator commands: the transactional producer of `dlq replay`
//! ([`TxnProducer`]: records and the reader group's offsets in one transaction), the producer
//! of `republish` ([`Producer`] with [`InOrder`]: records sent in order, acknowledgements
//! taken in order) and `check`'s trial of the relay's transactional producer
//! ([`try_init_transactions`]). Records are [`outbox_relay_core::sink::Record`]s or plain bytes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryFuture, FutureProducer, FutureRecord, Producer as _,
};
use rdkafka::types::RDKafkaErrorCode;

use super::reader::{ClientError, GroupMetadata, Offsets};
use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::sink::Record;

/// A failed transactional call of a [`TxnProducer`] as the operator's error: a refused
/// `transactional.id` is a configuration error naming the grant on the replay's group
/// (`dlq replay --group`, its only user), anything else a Kafka error (`{what}: {e}`).
pub fn transaction_error(what: &str, e: &ClientError) -> RelayError {
    if e.is_transactional_id_authorization_failed() {
        return RelayError::Config(format!(
            "{what}: {e}. Fix: grant the relay's user WRITE and DESCRIBE on the TransactionalId \
             of the replay's group (--group), or run as a user that has them"
        ));
    }
    RelayError::kafka(format!("{what}: {e}"))
}

/// A transactional producer with the relay's producer settings (idempotent, `acks=all`,
/// `murmur2_random`).
pub struct TxnProducer(BaseProducer);

impl TxnProducer {
    /// The producer of `transactional.id` = `id` (`transaction.timeout.ms` = 60000,
    /// `message.timeout.ms` at most that), its transactions initialized; `what` names it in
    /// errors (`replay`: `kafka.properties (replay producer)`, `initializing the replay's
    /// transactions`).
    ///
    /// # Errors
    /// [`RelayError::Config`] for invalid properties or a refused `transactional.id`;
    /// [`RelayError::Kafka`] when the transactions cannot be initialized.
    pub fn new(
        kafka: &KafkaConfig,
        id: &str,
        what: &str,
        timeout: Duration,
    ) -> Result<Self, RelayError> {
        // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
        let message_timeout = kafka
            .properties
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(60_000, |t| t.min(60_000));
        let mut client = crate::sink::producer_config(kafka);
        client
            .set("transactional.id", id)
            .set("transaction.timeout.ms", "60000")
            .set("message.timeout.ms", message_timeout.to_string());
        let producer: BaseProducer = client
            .create()
            .map_err(|e| RelayError::Config(format!("kafka.properties ({what} producer): {e}")))?;
        producer.init_transactions(timeout).map_err(|e| {
            transaction_error(
                &format!("initializing the {what}'s transactions"),
                &e.into(),
            )
        })?;
        Ok(Self(producer))
    }

    /// Begins a transaction.
    ///
    /// # Errors
    /// The client's.
    pub fn begin(&self) -> Result<(), ClientError> {
        Ok(self.0.begin_transaction()?)
    }

    /// Sends a record with `key`, `value` and `headers` to `topic`, retrying while the local
    /// queue is full for up to `timeout`; serves delivery reports without waiting.
    ///
    /// # Errors
    /// The client's.
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let mut owned = OwnedHeaders::new();
        for (k, v) in headers {
            owned = owned.insert(Header { key: k, value: *v });
        }
        let mut record = BaseRecord::<[u8], [u8]>::to(topic).headers(owned);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(value) = value {
            record = record.payload(value);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.0.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    self.0.poll(Duration::from_millis(10));
                    record = r;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        self.0.poll(Duration::ZERO);
        Ok(())
    }

    /// Adds the reader group's `offsets` to the open transaction and commits it.
    ///
    /// # Errors
    /// The client's.
    pub fn commit_with_offsets(
        &self,
        offsets: &Offsets,
        group: &GroupMetadata,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        self.0
            .send_offsets_to_transaction(&offsets.0, &group.0, timeout)
            .and_then(|()| self.0.commit_transaction(timeout))
            .map_err(ClientError)
    }

    /// Aborts the open transaction.
    ///
    /// # Errors
    /// The client's.
    pub fn abort(&self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.0.abort_transaction(timeout)?)
    }
}

/// A producer with the relay's producer settings, for [`InOrder`].
pub struct Producer(FutureProducer);

impl Producer {
    /// The producer; `what` names it in errors (`kafka.properties ({what} producer): …`).
    ///
    /// # Errors
    /// [`RelayError::Config`] for invalid properties.
    pub fn new(kafka: &KafkaConfig, what: &str) -> Result<Self, RelayError> {
        crate::sink::producer_config(kafka)
            .create()
            .map(Self)
            .map_err(|e| RelayError::Config(format!("kafka.properties ({what} producer): {e}")))
    }
}

/// Sends records in order and takes their acknowledgements in order, at most `max_in_flight`
/// waiting.
pub struct InOrder<'a> {
    producer: &'a Producer,
    max_in_flight: usize,
    in_flight: VecDeque<(DeliveryFuture, String)>,
    sent: u64,
}

impl<'a> InOrder<'a> {
    /// Nothing sent yet.
    pub fn new(producer: &'a Producer, max_in_flight: usize) -> Self {
        Self {
            producer,
            max_in_flight,
            in_flight: VecDeque::new(),
            sent: 0,
        }
    }

    /// Records acknowledged so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Sends `record` (the row `label` in messages), first taking acknowledgements while too
    /// many wait or the local queue is full.
    ///
    /// # Errors
    /// Why the record or one before it was not sent, as text naming the row.
    pub async fn send(&mut self, record: &Record, label: &str) -> Result<(), String> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (k, v) in &record.headers {
            headers = headers.insert(Header {
                key: k.as_ref(),
                value: v.as_deref(),
            });
        }
        let mut r = FutureRecord::<[u8], [u8]>::to(&record.topic)
            .key(record.key.as_slice())
            .headers(headers)
            .timestamp(record.timestamp_ms);
        if let Some(value) = &record.value {
            r = r.payload(value.as_slice());
        }
        if let Some(p) = record.partition {
            r = r.partition(p);
        }
        loop {
            if self.in_flight.len() >= self.max_in_flight {
                self.take_one().await?;
            }
            match self.producer.0.send_result(r) {
                Ok(delivery) => {
                    self.in_flight.push_back((delivery, label.to_owned()));
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if !self.in_flight.is_empty() =>
                {
                    r = back;
                    self.take_one().await?;
                }
                Err((e, _)) => return Err(format!("row {label} to {}: {e}", record.topic)),
            }
        }
    }

    async fn take_one(&mut self) -> Result<(), String> {
        let Some((delivery, label)) = self.in_flight.pop_front() else {
            return Ok(());
        };
        match delivery.await {
            Ok(Ok(_)) => {
                self.sent += 1;
                Ok(())
            }
            Ok(Err((e, _))) => Err(format!("Kafka refused row {label}: {e}")),
            Err(_) => Err(format!("the delivery of row {label} was cancelled")),
        }
    }

    /// Waits for every acknowledgement.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] naming the first row not acknowledged and how many were before it.
    pub async fn drain(&mut self) -> Result<(), RelayError> {
        while !self.in_flight.is_empty() {
            let sent = self.sent;
            self.take_one().await.map_err(|e| {
                RelayError::kafka(format!("{e} ({sent} rows acknowledged before it)"))
            })?;
        }
        Ok(())
    }
}

/// Makes the relay's transactional producer (the admin client's connection properties,
/// `transactional.id` = `id`, `transaction.timeout.ms` and `message.timeout.ms` =
/// `timeout_ms`) and initializes its transactions, on a blocking thread.
///
/// # Errors
/// Why it failed, as text.
pub async fn try_init_transactions(
    kafka: &KafkaConfig,
    id: &str,
    timeout_ms: u64,
    wait: Duration,
) -> Result<(), String> {
    let mut client = crate::sink::admin_client_config(kafka);
    client
        .set("transactional.id", id)
        .set("transaction.timeout.ms", timeout_ms.to_string())
        .set("message.timeout.ms", timeout_ms.to_string());
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let producer: BaseProducer = client.create().map_err(|e| e.to_string())?;
        producer.init_transactions(wait).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
}
