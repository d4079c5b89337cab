//! Sink: an idempotent rdkafka producer and its delivery reports.
//!
//! The producer is configured so that a record is acknowledged only when all in-sync replicas
//! have it (`acks=all`) and so that librdkafka's internal retries can neither duplicate nor
//! reorder records within a partition (`enable.idempotence=true`, librdkafka
//! CONFIGURATION.md). Keys are hashed with `murmur2_random`, the Java client's partitioner, so
//! an aggregate lands on the same partition as with a Java producer.
//!
//! Each record is sent with a sequence number chosen by the caller; the delivery report is
//! filed under that number in [`Deliveries`], and the pipeline keeps the records' order itself.
//! (No future, channel or allocation per record: with rdkafka's `FutureProducer` those were a
//! tenth of the relay's CPU while draining a backlog.)
//!
//! # Who serves librdkafka's queue
//! Delivery reports, client errors and librdkafka's logs arrive on its main queue (librdkafka
//! INTRODUCTION.md, "Event interface"). The pipeline serves it itself ([`KafkaSink::serve`]),
//! on the thread that sends, and sleeps on [`KafkaSink::events`], which librdkafka wakes when
//! the queue becomes non-empty (`rd_kafka_queue_cb_event_enable`). Why not rdkafka's
//! `ThreadedProducer`: a record (and each of its headers) is allocated by librdkafka on the
//! sending thread and freed when its report is served; served on another thread, every free
//! was a cross-thread free, and malloc plus the extra thread cost ~20 % of the relay's CPU
//! while draining a backlog. A background task serves the queue every 100 ms too, so logs and
//! errors are not held back while no pipeline runs (start-up, a stopped run).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientConfig;

use crate::config::KafkaConfig;
use crate::error::RelayError;
use crate::route::KafkaRecord;

mod limits;
mod probe;
mod served;
use limits::TopicLimits;
pub use limits::{
    batch_hazard, batch_size_alone, ProducerLimits, LIBRDKAFKA_DEFAULT_MAX_BYTES,
    RECORD_BATCH_OVERHEAD,
};
pub use probe::KafkaProbe;
use served::ServedProducer;

/// librdkafka's logs and client errors, through `tracing`, each distinct message at most once
/// per [`LOG_REPEAT`]: an unreachable broker otherwise floods the log with the same lines.
#[derive(Default)]
pub struct RelayKafkaContext {
    last_logged: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// The last SASL/SSL authentication failure librdkafka reported (its reason text).
    auth_failure: AuthFailure,
    /// Where delivery reports go.
    deliveries: Arc<Deliveries>,
}

/// One delivery report: the sequence number the record was sent with, and its outcome
/// ([`RelayError::Kafka`] for failures worth a retry from the checkpoint).
pub type DeliveryReport = (u64, Result<Delivered, RelayError>);

/// Delivery reports of a [`KafkaSink`]'s records, filed when librdkafka's queue is served
/// ([`KafkaSink::serve`]) until the pipeline takes them.
#[derive(Default)]
pub struct Deliveries {
    reports: Mutex<Vec<DeliveryReport>>,
}

impl Deliveries {
    /// Moves the reports filed so far into `into` (appended, in arrival order).
    pub fn take_into(&self, into: &mut Vec<DeliveryReport>) {
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        if into.is_empty() {
            std::mem::swap(&mut *reports, into);
        } else {
            into.append(&mut reports);
        }
    }

    fn is_empty(&self) -> bool {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    fn file(&self, report: DeliveryReport) {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(report);
    }
}

impl ProducerContext for RelayKafkaContext {
    /// The sequence number given to [`KafkaSink::send`].
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        self.deliveries.file((seq as u64, delivery_outcome(result)));
    }
}

/// Where [`RelayKafkaContext`] leaves the last authentication failure for [`KafkaSink`].
type AuthFailure = std::sync::Arc<std::sync::Mutex<Option<String>>>;

/// Least time between two identical librdkafka log lines.
const LOG_REPEAT: Duration = Duration::from_secs(30);

impl RelayKafkaContext {
    fn should_log(&self, key: &str) -> bool {
        let Ok(mut last) = self.last_logged.lock() else {
            return true;
        };
        let now = std::time::Instant::now();
        match last.get(key) {
            Some(t) if now.duration_since(*t) < LOG_REPEAT => false,
            _ => {
                if last.len() > 1000 {
                    last.clear(); // bounded: messages embed broker names and counters
                }
                last.insert(key.to_owned(), now);
                true
            }
        }
    }
}

impl rdkafka::ClientContext for RelayKafkaContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if !self.should_log(message) {
            return;
        }
        // librdkafka flags the property as experimental at every start; the relay sets it on
        // purpose (see KafkaSink::new), so this is not worth an operator's attention.
        if message.contains("enable.gapless.guarantee is experimental") {
            tracing::debug!(target: "librdkafka", facility = fac, "{message}");
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", facility = fac, "{message}"),
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{message}")
            }
            L::Debug => tracing::debug!(target: "librdkafka", facility = fac, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication) {
            if let Ok(mut last) = self.auth_failure.lock() {
                *last = Some(reason.to_owned());
            }
        }
        // Client-level errors (broker down, all brokers down) are retried by librdkafka itself;
        // records that cannot be delivered fail in their delivery reports.
        if self.should_log(&error.to_string()) {
            tracing::warn!(target: "librdkafka", error = %error, "{reason}");
        }
    }
}

/// librdkafka's message for a rejected property, without the value of a secret one (its
/// `Display` repeats the value).
fn redact_config_error(e: KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, desc, key, _) if crate::secrets::is_secret_property(&key) => {
            format!("Client config error: {desc} {key} ***")
        }
        e => e.to_string(),
    }
}

/// How often the background task serves librdkafka's queue (logs and errors while no
/// pipeline does).
const IDLE_SERVE_INTERVAL: Duration = Duration::from_millis(100);

/// Serves `producer`'s queue every [`IDLE_SERVE_INTERVAL`] until it is dropped; wakes the
/// pipeline when that filed delivery reports.
fn spawn_idle_server(producer: Weak<ServedProducer>, deliveries: Arc<Deliveries>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // no runtime (a unit test): the caller serves
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(IDLE_SERVE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(p) = producer.upgrade() else {
                return;
            };
            if p.serve(1000) > 0 && !deliveries.is_empty() {
                p.wake().notify_one();
            }
        }
    });
}

/// The Kafka producer of one pipeline run. Cheap to clone (one producer inside).
#[derive(Clone)]
pub struct KafkaSink {
    producer: Arc<ServedProducer>,
    deliveries: Arc<Deliveries>,
    dead_letter_topic: Option<String>,
    auth_failure: AuthFailure,
    /// Topics whose partitions all had a leader when first used (see [`KafkaSink::ensure_topic`]).
    ready_topics: Arc<Mutex<HashSet<String>>>,
    /// The `max.message.bytes` of those topics.
    topic_limits: Arc<TopicLimits>,
}

/// Longest wait for a new topic's partitions to get leaders before its first record.
const TOPIC_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A row that could not be relayed, for the dead-letter topic.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// Why it could not be relayed.
    pub reason: String,
    /// End of the rows event that carried the row.
    pub position: crate::position::BinlogPosition,
    /// `database.table` of the outbox.
    pub table: String,
    /// The topic the record was meant for, when it got that far.
    pub topic: Option<String>,
    /// The record key, when known.
    pub key: Option<Vec<u8>>,
    /// The record value; dropped when it is what made the record fail (too large).
    pub value: Option<Vec<u8>>,
    /// The record's own headers, when known.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Why a record was not enqueued.
#[derive(Debug)]
pub enum SendError {
    /// librdkafka's local queue is full: wait for a delivery, then send again (backpressure).
    QueueFull,
    /// Refused for good (for example larger than `message.max.bytes`): dead-letter or stop.
    Permanent(String),
    /// Anything else; the pipeline stops and resumes from its checkpoint.
    Failed(RelayError),
}

impl KafkaSink {
    /// Creates the producer. Does not contact the brokers; see [`KafkaSink::check_reachable`].
    ///
    /// # Errors
    /// [`RelayError::Config`] when librdkafka rejects a property.
    pub fn new(
        config: &KafkaConfig,
        dead_letter_topic: Option<String>,
    ) -> Result<Self, RelayError> {
        let mut client = ClientConfig::new();
        // Defaults the user may override: a 1 ms batching delay (librdkafka's 5 ms default put
        // ~2.5 ms on every record's commit → ack latency at moderate rates for no measurable
        // drain gain; `make bench`), bounded total delivery time.
        client.set("linger.ms", "1");
        client.set("message.timeout.ms", "120000");
        for (key, value) in &config.properties {
            client.set(key, value);
        }
        client
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("enable.idempotence", "true")
            // A failed batch that would leave a gap in a partition is a fatal producer error
            // (the run ends and resumes from the checkpoint), never a silently missing record.
            .set("enable.gapless.guarantee", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random");
        let context = RelayKafkaContext::default();
        let auth_failure = context.auth_failure.clone();
        let deliveries = Arc::clone(&context.deliveries);
        let producer: BaseProducer<RelayKafkaContext> =
            client.create_with_context(context).map_err(|e| {
                RelayError::Config(format!("kafka.properties: {}", redact_config_error(e)))
            })?;
        let producer = Arc::new(ServedProducer::new(producer)?);
        spawn_idle_server(Arc::downgrade(&producer), Arc::clone(&deliveries));
        Ok(Self {
            producer,
            deliveries,
            dead_letter_topic,
            auth_failure,
            ready_topics: Arc::new(Mutex::new(HashSet::new())),
            topic_limits: Arc::new(TopicLimits::new(config)),
        })
    }

    /// Before the first record to `topic` in this run: asks for the topic's metadata (which
    /// makes the broker auto-create it when it allows that) and waits until every partition
    /// has a leader, at most 30 s; then reads the topic's `max.message.bytes`, so that
    /// [`KafkaSink::send`] refuses a record the broker would refuse (see `sink/limits.rs`).
    ///
    /// Why: an idempotent producer that sends to a partition of a topic still being created can
    /// see the partition vanish from and come back into the metadata, which resets its sequence
    /// numbers; the broker then takes the first batch for a duplicate and acknowledges it
    /// without storing it (librdkafka issue #3712). Seen here as one missing record in a fresh
    /// topic's partition. Waiting for the leaders first avoids the window.
    ///
    /// # Errors
    /// Never for a topic that does not become ready (the send then fails as usual: unknown
    /// topic, a permanent refusal); [`RelayError::Kafka`] when the metadata task fails.
    pub async fn ensure_topic(&self, topic: &str) -> Result<(), RelayError> {
        if self
            .ready_topics
            .lock()
            .map(|set| set.contains(topic))
            .unwrap_or(false)
        {
            return Ok(());
        }
        let producer = self.producer.clone();
        let name = topic.to_owned();
        let ready = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + TOPIC_READY_TIMEOUT;
            loop {
                let ready = producer
                    .producer
                    .client()
                    .fetch_metadata(Some(&name), Duration::from_secs(5))
                    .ok()
                    .is_some_and(|md| {
                        md.topics().iter().any(|t| {
                            t.name() == name
                                && t.error().is_none()
                                && !t.partitions().is_empty()
                                && t.partitions()
                                    .iter()
                                    .all(|p| p.leader() >= 0 && p.error().is_none())
                        })
                    });
                if ready || std::time::Instant::now() >= deadline {
                    return ready;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .await
        .map_err(|e| RelayError::Kafka(format!("metadata task failed: {e}")))?;
        if ready {
            self.topic_limits.learn(topic).await;
            if let Ok(mut set) = self.ready_topics.lock() {
                set.insert(topic.to_owned());
            }
        } else {
            tracing::warn!(topic, "the topic's partitions have no leader yet (or it does not exist and auto-creation is off); sending anyway");
        }
        Ok(())
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
        let result = tokio::task::spawn_blocking(move || {
            producer.producer.client().fetch_metadata(None, timeout)
        })
        .await
        .map_err(|e| RelayError::Kafka(format!("metadata task failed: {e}")))?;
        let Err(e) = result else {
            return Ok(());
        };
        // The authentication failure, if any, is an error event in the queue.
        self.serve();
        let auth = self.auth_failure.lock().ok().and_then(|a| a.clone());
        match auth {
            // Wrong credentials are the operator's to fix: retrying would only hide them.
            Some(reason) => Err(RelayError::Prerequisite {
                setting: "Kafka authentication (kafka.properties security.protocol, \
                          sasl.mechanisms, sasl.username, sasl.password, ssl.*)"
                    .into(),
                expected: format!("credentials the brokers of {bootstrap} accept"),
                found: reason,
                fix: "check sasl.username and sasl.password in [kafka.properties] (and \
                      sasl.mechanisms: the mechanism the broker's listener enables, e.g. \
                      SCRAM-SHA-512), and that the user exists on the cluster \
                      (kafka-configs.sh --describe --entity-type users)"
                    .into(),
            }),
            None => Err(RelayError::Kafka(format!(
                "no broker of {bootstrap} answered a metadata request: {e}"
            ))),
        }
    }

    /// The delivery reports of this sink's records, filed by [`KafkaSink::serve`].
    pub fn deliveries(&self) -> &Arc<Deliveries> {
        &self.deliveries
    }

    /// Serves librdkafka's main queue on the calling thread until it is empty: delivery reports
    /// go to [`KafkaSink::deliveries`], errors and logs to `tracing`. Does not block.
    pub fn serve(&self) {
        self.producer.serve(usize::MAX);
    }

    /// Resolves once librdkafka's main queue became non-empty since the last call (or the
    /// background task filed reports), at once if that happened while no one waited. Call
    /// [`KafkaSink::serve`] after it. Cancel-safe.
    pub async fn events(&self) {
        self.producer.wake().notified().await;
    }

    /// Enqueues `record`; its delivery report is filed under `seq` in
    /// [`KafkaSink::deliveries`] once Kafka acknowledges it or gives up.
    ///
    /// # Errors
    /// [`SendError::QueueFull`] when librdkafka's queue is full; [`SendError::Permanent`] for
    /// a record Kafka can never take (larger than `message.max.bytes`, or than the topic's
    /// `max.message.bytes` once [`KafkaSink::ensure_topic`] learnt it); [`SendError::Failed`]
    /// otherwise.
    pub fn send(&self, record: &KafkaRecord, seq: u64) -> Result<(), SendError> {
        if let Some(reason) = self.topic_limits.refusal(
            &record.topic,
            &record.key,
            record.value.as_deref(),
            &record.headers,
        ) {
            return Err(SendError::Permanent(reason));
        }
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_slice()),
            });
        }
        let mut br: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&record.topic, opaque(seq))
                .key(record.key.as_slice())
                .headers(headers)
                .timestamp(record.timestamp_ms);
        if let Some(partition) = record.partition {
            br = br.partition(partition);
        }
        if let Some(value) = &record.value {
            br = br.payload(value.as_slice());
        }
        let size = record_size(&record.key, record.value.as_deref(), &record.headers);
        self.producer
            .producer
            .send(br)
            .map_err(|(e, _)| classify_send_error(e, &record.topic, size))
    }

    /// After [`KafkaSink::send`] refused `record`: when its topic's `max.message.bytes` is what
    /// refused it, reads that limit again (at most every 10 s per topic) and says whether the
    /// record fits now (send it again then). `false` for any other refusal.
    pub async fn recheck_topic_limit(&self, record: &KafkaRecord) -> bool {
        let refused = |limits: &TopicLimits| {
            limits
                .refusal(
                    &record.topic,
                    &record.key,
                    record.value.as_deref(),
                    &record.headers,
                )
                .is_some()
        };
        if !refused(&self.topic_limits) {
            return false;
        }
        self.topic_limits.relearn(&record.topic).await;
        !refused(&self.topic_limits)
    }

    /// [`KafkaSink::ensure_topic`] for the dead-letter topic, when one is configured.
    ///
    /// # Errors
    /// As [`KafkaSink::ensure_topic`].
    pub async fn ensure_dead_letter_topic(&self) -> Result<(), RelayError> {
        match &self.dead_letter_topic {
            Some(topic) => self.ensure_topic(topic).await,
            None => Ok(()),
        }
    }

    /// `true` when rows that cannot be relayed go to a dead-letter topic instead of stopping.
    pub fn has_dead_letter(&self) -> bool {
        self.dead_letter_topic.is_some()
    }

    /// Produces `dl` to the dead-letter topic: the record's key, value (unless it is what
    /// failed) and headers, plus `dlq_reason`, `dlq_topic`, `dlq_binlog_file`, `dlq_binlog_pos`
    /// and `dlq_table`.
    ///
    /// # Errors
    /// [`SendError::Failed`] when no dead-letter topic is configured or the record cannot be
    /// enqueued; [`SendError::QueueFull`] as for [`KafkaSink::send`].
    pub fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError> {
        let Some(topic) = &self.dead_letter_topic else {
            return Err(SendError::Failed(RelayError::Config(
                "no dead-letter topic configured".into(),
            )));
        };
        let pos = dl.position.pos.to_string();
        let mut all: Vec<(&str, &[u8])> = Vec::with_capacity(dl.headers.len() + 5);
        all.extend(dl.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        all.extend([
            ("dlq_reason", dl.reason.as_bytes()),
            (
                "dlq_topic",
                dl.topic.as_deref().unwrap_or_default().as_bytes(),
            ),
            ("dlq_binlog_file", dl.position.file.as_bytes()),
            ("dlq_binlog_pos", pos.as_bytes()),
            ("dlq_table", dl.table.as_bytes()),
        ]);
        if let Some(reason) = self.topic_limits.refusal(
            topic,
            dl.key.as_deref().unwrap_or_default(),
            dl.value.as_deref(),
            &all,
        ) {
            return Err(SendError::Permanent(reason));
        }
        let mut headers = OwnedHeaders::new_with_capacity(all.len());
        for (key, value) in all {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let size = record_size(
            dl.key.as_deref().unwrap_or_default(),
            dl.value.as_deref(),
            &dl.headers,
        );
        let mut br: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(topic, opaque(seq)).headers(headers);
        if let Some(key) = &dl.key {
            br = br.key(key.as_slice());
        }
        if let Some(value) = &dl.value {
            br = br.payload(value.as_slice());
        }
        self.producer
            .producer
            .send(br)
            .map_err(|(e, _)| classify_send_error(e, topic, size))
    }

    /// Waits up to `timeout` for every enqueued record to be delivered or to fail.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when records are still outstanding after `timeout`.
    pub async fn flush(&self, timeout: Duration) -> Result<(), RelayError> {
        let producer = Arc::clone(&self.producer);
        tokio::task::spawn_blocking(move || producer.producer.flush(timeout))
            .await
            .map_err(|e| RelayError::Kafka(format!("flush task failed: {e}")))?
            .map_err(RelayError::from)
    }
}

/// Bytes of a record's key, value and headers (names and values): what counts against
/// `message.max.bytes`, give or take the record framing.
pub(crate) fn record_size<K: AsRef<str>, V: AsRef<[u8]>>(
    key: &[u8],
    value: Option<&[u8]>,
    headers: &[(K, V)],
) -> usize {
    key.len()
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(k, v)| k.as_ref().len() + v.as_ref().len())
            .sum::<usize>()
}

/// A client configuration for an admin client on the relay's brokers: `[kafka.properties]`
/// (security settings included) and `bootstrap.servers`.
pub fn admin_client_config(config: &KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (key, value) in &config.properties {
        client.set(key, value);
    }
    client.set("bootstrap.servers", &config.bootstrap_servers);
    client
}

/// Kafka refuses records whose size is the problem with these codes.
fn is_size_problem(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Why Kafka refused a record for good (`dlq_reason`, or the error that stops the relay).
fn refusal_reason(code: RDKafkaErrorCode, topic: &str, size: usize) -> String {
    if is_size_problem(code) {
        format!(
            "the record ({size} bytes of key, value and headers) is too large for Kafka \
             (topic {topic}: {code}). Fix: raise kafka.properties \"message.max.bytes\" and the \
             topic's max.message.bytes (and the broker's message.max.bytes for new topics), or \
             keep outbox payloads smaller"
        )
    } else {
        format!("Kafka refused the record for topic {topic}: {code}")
    }
}

fn classify_send_error(e: KafkaError, topic: &str, size: usize) -> SendError {
    match e {
        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => SendError::QueueFull,
        KafkaError::MessageProduction(code) if is_permanent(code) => {
            SendError::Permanent(refusal_reason(code, topic, size))
        }
        other => SendError::Failed(RelayError::Kafka(format!(
            "cannot produce to topic {topic}: {other}"
        ))),
    }
}

/// Errors that retrying the same record cannot fix: the record or its topic is refused.
/// Everything else (timeouts, broker down, leader changes) is retried by reconnecting.
fn is_permanent(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTopic
            | C::UnknownTopic
            | C::UnknownTopicOrPartition
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::PolicyViolation
            | C::UnknownPartition
    )
}

/// Outcome of one record's delivery.
#[derive(Debug)]
pub enum Delivered {
    /// Acknowledged at (partition, offset).
    Acked(i32, i64),
    /// Refused for good (too large, topic missing or forbidden): dead-letter it or stop.
    Refused {
        /// librdkafka's reason.
        reason: String,
        /// The refused record's key.
        key: Option<Vec<u8>>,
        /// The refused record's value, unless its size is what was refused.
        value: Option<Vec<u8>>,
        /// The refused record's headers.
        headers: Vec<(String, Vec<u8>)>,
    },
}

/// A sequence number as librdkafka's per-message opaque (a `usize`: no allocation).
fn opaque(seq: u64) -> usize {
    // Sequence numbers count records of one run: far below usize::MAX on 64-bit targets.
    usize::try_from(seq).unwrap_or(usize::MAX)
}

/// Turns a delivery report into a [`Delivered`].
///
/// # Errors
/// [`RelayError::Kafka`] for failures worth a retry (the pipeline restarts from its
/// checkpoint).
fn delivery_outcome(report: &DeliveryResult<'_>) -> Result<Delivered, RelayError> {
    use rdkafka::message::Headers;
    match report {
        Ok(msg) => Ok(Delivered::Acked(msg.partition(), msg.offset())),
        Err((KafkaError::MessageProduction(code), msg)) if is_permanent(*code) => {
            let code = *code;
            let headers: Vec<(String, Vec<u8>)> = msg
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            let size_problem = is_size_problem(code);
            let size = record_size(msg.key().unwrap_or_default(), msg.payload(), &headers);
            Ok(Delivered::Refused {
                reason: refusal_reason(code, msg.topic(), size),
                key: msg.key().map(<[u8]>::to_vec),
                value: if size_problem {
                    None
                } else {
                    msg.payload().map(<[u8]>::to_vec)
                },
                headers,
            })
        }
        Err((e, _)) => Err(RelayError::Kafka(format!("delivery failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_refusals_say_too_large_for_kafka() {
        let reason = refusal_reason(
            RDKafkaErrorCode::MessageSizeTooLarge,
            "t.orders",
            17_000_123,
        );
        assert!(
            reason.starts_with(
                "the record (17000123 bytes of key, value and headers) is too large for Kafka \
                 (topic t.orders: "
            ),
            "{reason}"
        );
        assert!(
            reason.contains("kafka.properties \"message.max.bytes\""),
            "{reason}"
        );
        assert_eq!(
            refusal_reason(RDKafkaErrorCode::TopicAuthorizationFailed, "t.orders", 10),
            format!(
                "Kafka refused the record for topic t.orders: {}",
                RDKafkaErrorCode::TopicAuthorizationFailed
            )
        );
    }

    /// The pipeline sleeps on `events()` and serves the queue itself: a delivery report must
    /// wake it. No broker listens on the address, so the record fails at `message.timeout.ms`.
    #[tokio::test]
    async fn a_delivery_report_wakes_the_waiter_and_is_filed_by_serve() {
        let config = KafkaConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            max_in_flight: 10,
            properties: [("message.timeout.ms".to_owned(), "300".to_owned())].into(),
        };
        let sink = KafkaSink::new(&config, None).expect("producer");
        let record = KafkaRecord {
            topic: "t.orders".into(),
            key: b"order-1".to_vec(),
            value: Some(b"{}".to_vec()),
            headers: vec![("id".into(), b"1".to_vec())],
            partition: None,
            timestamp_ms: 1_700_000_000_000,
        };
        sink.send(&record, 7).expect("enqueued");
        let mut reports = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while reports.is_empty() {
            tokio::time::timeout_at(deadline, sink.events())
                .await
                .expect("woken before the deadline");
            sink.serve();
            sink.deliveries().take_into(&mut reports);
        }
        assert_eq!(reports.len(), 1, "one report per record");
        let (seq, outcome) = &reports[0];
        assert_eq!(*seq, 7);
        assert!(
            matches!(outcome, Err(RelayError::Kafka(m)) if m.contains("delivery failed")),
            "{outcome:?}"
        );
    }

    #[test]
    fn record_size_counts_key_value_and_headers() {
        let headers = vec![("id".to_owned(), b"42".to_vec())];
        assert_eq!(record_size(b"key", Some(b"value"), &headers), 3 + 5 + 2 + 2);
        assert_eq!(record_size::<&str, Vec<u8>>(b"", None, &[]), 0);
    }
}
