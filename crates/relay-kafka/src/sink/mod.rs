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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientConfig;

use outbox_relay_core::config::KafkaConfig;
use outbox_relay_core::error::RelayError;
use outbox_relay_core::observe::metrics::Metrics;
use outbox_relay_core::sink::{DeadLetter, Delivered, Deliveries, FatalCause, Record, SendError};

use crate::kafka_log::{KafkaLog, UNREACHABLE_CHECKS};

mod limits;
mod lso;
mod probe;
mod readback;
mod record_sink;
mod served;
mod transactional;
mod trial;
use limits::TopicLimits;
pub use limits::{
    batch_hazard, batch_size_alone, invalid_timestamp, ProducerLimits, TimestampRules,
    LIBRDKAFKA_DEFAULT_MAX_BYTES, RECORD_BATCH_OVERHEAD,
};
pub use lso::LsoMonitor;
pub use probe::KafkaProbe;
pub use readback::{ReadBack, ReadBackRequest, ReadBackResult};
use served::ServedProducer;
pub use transactional::consumer_config;
pub use transactional::{point_label, TransactionalSink};

/// The producers' context: delivery reports to [`Deliveries`], librdkafka's logs and client
/// errors to the cluster's [`KafkaLog`] (one line per change of reachability; repeats at
/// DEBUG).
pub struct RelayKafkaContext {
    /// The cluster's log and reachability.
    log: Arc<KafkaLog>,
    /// The last SASL/SSL authentication failure librdkafka reported (its reason text).
    auth_failure: AuthFailure,
    /// Where delivery reports go.
    deliveries: Arc<Deliveries>,
    /// The source's metrics (unproven acknowledgements).
    metrics: Arc<Metrics>,
}

impl RelayKafkaContext {
    fn new(metrics: Arc<Metrics>, log: Arc<KafkaLog>) -> Self {
        Self {
            log,
            auth_failure: Default::default(),
            deliveries: Default::default(),
            metrics,
        }
    }
}

impl ProducerContext for RelayKafkaContext {
    /// The sequence number given to [`KafkaSink::send`].
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        if matches!(result, Ok(msg) if msg.offset() < 0) {
            self.metrics.unproven_ack(); // see `acked`
        }
        if result.is_ok() {
            self.log.reachable();
        }
        self.deliveries.file((seq as u64, delivery_outcome(result)));
    }
}

/// Where [`RelayKafkaContext`] leaves the last authentication failure for [`KafkaSink`].
type AuthFailure = std::sync::Arc<std::sync::Mutex<Option<String>>>;

impl rdkafka::ClientContext for RelayKafkaContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.log.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication) {
            if let Ok(mut last) = self.auth_failure.lock() {
                *last = Some(reason.to_owned());
            }
        }
        // Client-level errors (broker down, all brokers down) are retried by librdkafka itself;
        // records that cannot be delivered fail in their delivery reports.
        self.log.error(&error, reason);
    }
}

/// The context of the relay's other clients of a run (the read-back consumer, the
/// last-stable-offset monitor, the admin clients of topic limits): their logs and errors go
/// to the cluster's [`KafkaLog`] as the producer's do, instead of rdkafka's default context,
/// which logs every error event (hundreds while the brokers are down).
#[derive(Clone)]
pub struct LogContext(pub Arc<KafkaLog>);

impl rdkafka::ClientContext for LogContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.error(&error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for LogContext {}

/// librdkafka's message for a rejected property, without the value of a secret one (its
/// `Display` repeats the value).
fn redact_config_error(e: KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, desc, key, _)
            if outbox_relay_core::config::secrets::is_secret_property(&key) =>
        {
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
    /// The `max.message.bytes` and timestamp rules of those topics.
    topic_limits: Arc<TopicLimits>,
    /// Topics whose timestamp fallback was logged.
    fallback_topics: Arc<Mutex<HashSet<String>>>,
    /// Topics found missing (auto-creation off) or not authorized: when, and the refusal.
    missing_topics: Arc<MissingTopics>,
    /// The source's metrics.
    metrics: Arc<Metrics>,
    /// Sends a record alone, without risking the producer (see the module `trial`).
    trial: Arc<trial::TrialProducer>,
    /// The cluster's log and reachability.
    log: Arc<KafkaLog>,
}

/// How long a topic found missing (auto-creation off) or not authorized stays so before its
/// metadata is asked for again.
const MISSING_TOPIC_RECHECK: Duration = Duration::from_secs(10);

/// Longest wait for a new topic's partitions to get leaders before its first record.
const TOPIC_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The header a record sent with its commit time instead of a refused `created_at` value
/// carries: that value, ms since the epoch, as decimal text.
pub const TIMESTAMP_FALLBACK_HEADER: &str = "timestamp_fallback";

/// The fix of a `created_at` value a topic refuses.
const COLUMN_TIMESTAMP_FIX: &str = "write created_at in UTC, or set outbox.datetime_time_zone \
    to the zone the writers use for DATETIME values (outbox-relay check compares a recent row \
    with the server's UTC time), or use the commit time (outbox.timestamp = \"commit\", or \
    timestamp_refused = \"commit\" to fall back to it), or raise the topic's \
    message.timestamp.after.max.ms / message.timestamp.before.max.ms";

/// The fix of a commit time a topic refuses (an old backlog against \
/// `message.timestamp.before.max.ms`, or a clock far off).
const COMMIT_TIMESTAMP_FIX: &str = "raise the topic's message.timestamp.before.max.ms (or \
    after.max.ms) so that it takes the source's commit times, or set its \
    message.timestamp.type=LogAppendTime; check the clocks of the database server, the relay \
    and the brokers";

/// Topics found missing (auto-creation off) or not authorized: when, and the refusal.
#[derive(Default)]
struct MissingTopics {
    topics: Mutex<std::collections::HashMap<String, (std::time::Instant, String)>>,
    /// `topics` has an entry, set and cleared under its lock: [`KafkaSink::send`] takes the lock
    /// only then (on every record it was a lock and an unlock).
    any: std::sync::atomic::AtomicBool,
}

impl MissingTopics {
    fn insert(&self, topic: &str, reason: String) {
        if let Ok(mut topics) = self.topics.lock() {
            topics.insert(topic.to_owned(), (std::time::Instant::now(), reason));
            self.any.store(true, Ordering::Relaxed);
        }
    }

    fn forget(&self, topic: &str) {
        if let Ok(mut topics) = self.topics.lock() {
            topics.remove(topic);
            self.any.store(!topics.is_empty(), Ordering::Relaxed);
        }
    }

    /// Why records for `topic` are refused without sending: it was found missing (with
    /// auto-creation off) or not authorized less than [`MISSING_TOPIC_RECHECK`] ago.
    fn reason(&self, topic: &str) -> Option<String> {
        // Relaxed: a record racing another task's ensure_topic is refused by the broker if not
        // here.
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let mut topics = self.topics.lock().ok()?;
        match topics.get(topic) {
            Some((at, reason)) if at.elapsed() < MISSING_TOPIC_RECHECK => Some(reason.clone()),
            Some(_) => {
                topics.remove(topic);
                self.any.store(!topics.is_empty(), Ordering::Relaxed);
                None
            }
            None => None,
        }
    }
}

impl KafkaSink {
    /// Creates the producer. Does not contact the brokers; see [`KafkaSink::check_reachable`].
    ///
    /// # Errors
    /// [`RelayError::Config`] when librdkafka rejects a property.
    /// `metrics`: the source's metrics (timestamp fallbacks, unproven acknowledgements, the
    /// readiness probe's outcomes).
    pub fn new(
        config: &KafkaConfig,
        dead_letter_topic: Option<String>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, RelayError> {
        Self::with_properties(config, dead_letter_topic, &[], metrics)
    }

    /// [`KafkaSink::new`] with more producer properties set after the user's (the
    /// transactional producer's `transactional.id`, see [`TransactionalSink`]).
    ///
    /// # Errors
    /// As [`KafkaSink::new`].
    pub(super) fn with_properties(
        config: &KafkaConfig,
        dead_letter_topic: Option<String>,
        extra: &[(&str, String)],
        metrics: Arc<Metrics>,
    ) -> Result<Self, RelayError> {
        let mut client = producer_config(config);
        // A failed batch that would leave a gap in a partition is a fatal producer error (the
        // run ends and resumes from the checkpoint), never a silently missing record.
        client.set("enable.gapless.guarantee", "true");
        for (key, value) in extra {
            client.set(*key, value);
        }
        let log = KafkaLog::of(&config.bootstrap_servers);
        let trial = Arc::new(trial::TrialProducer::new(
            client.clone(),
            Arc::clone(&metrics),
            Arc::clone(&log),
        ));
        let context = RelayKafkaContext::new(Arc::clone(&metrics), Arc::clone(&log));
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
            log,
            ready_topics: Arc::new(Mutex::new(HashSet::new())),
            topic_limits: Arc::new(TopicLimits::new(config)),
            fallback_topics: Arc::new(Mutex::new(HashSet::new())),
            missing_topics: Arc::default(),
            metrics,
            trial,
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
    /// `true` once the topic is ready, which it then stays for this producer (later calls
    /// return `true` at once); `false` for a topic found missing or refused, or without leaders
    /// after the wait.
    ///
    /// # Errors
    /// Never for a topic that does not become ready (the send then fails as usual: unknown
    /// topic, a permanent refusal); [`RelayError::Kafka`] when the metadata task fails.
    pub async fn ensure_topic(&self, topic: &str) -> Result<bool, RelayError> {
        if self
            .ready_topics
            .lock()
            .map(|set| set.contains(topic))
            .unwrap_or(false)
        {
            return Ok(true);
        }
        if let Some(reason) = self.missing_topics.reason(topic) {
            tracing::debug!(topic, "{reason}");
            return Ok(false);
        }
        // A topic the brokers refuse to describe, or that is missing while they create no
        // topics, will not become ready: say so at once (send refuses its records) instead
        // of waiting for it.
        let (_, error, broker) = self.topic_state(topic, Duration::ZERO).await?;
        let missing = match error {
            Some(code @ RDKafkaErrorCode::TopicAuthorizationFailed) => {
                Some(refusal_reason(code, topic, 0))
            }
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => match broker {
                Some(id) if self.topic_limits.auto_create(id).await == Some(false) => Some(
                    refusal_reason(RDKafkaErrorCode::UnknownTopicOrPartition, topic, 0),
                ),
                _ => None,
            },
            _ => None,
        };
        if let Some(reason) = missing {
            self.missing_topics.insert(topic, reason);
            return Ok(false);
        }
        let (ready, _, _) = self.topic_state(topic, TOPIC_READY_TIMEOUT).await?;
        if ready {
            self.topic_limits.learn(topic).await;
            if let Ok(mut set) = self.ready_topics.lock() {
                set.insert(topic.to_owned());
            }
        } else {
            tracing::warn!(topic, "the topic's partitions have no leader yet (or it does not exist and auto-creation is off); sending anyway");
        }
        Ok(ready)
    }

    /// [`KafkaSink::ensure_topic`] after forgetting that `topic` was found missing or not
    /// authorized: the brokers are asked again at once (a held table's retry, which has its own
    /// backoff).
    ///
    /// # Errors
    /// As [`KafkaSink::ensure_topic`].
    pub async fn recheck_topic(&self, topic: &str) -> Result<bool, RelayError> {
        self.missing_topics.forget(topic);
        self.ensure_topic(topic).await
    }

    /// Asks for `topic`'s metadata until every partition has a leader or `wait` has passed
    /// (at least once): whether it is ready, the topic's error in the last answer, and a broker
    /// of the cluster.
    async fn topic_state(
        &self,
        topic: &str,
        wait: Duration,
    ) -> Result<(bool, Option<RDKafkaErrorCode>, Option<i32>), RelayError> {
        let producer = self.producer.clone();
        let name = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + wait;
            loop {
                let mut state = (false, None, None);
                if let Ok(md) = producer
                    .producer
                    .client()
                    .fetch_metadata(Some(&name), Duration::from_secs(5))
                {
                    state.2 = md.brokers().first().map(|b| b.id());
                    if let Some(t) = md.topics().iter().find(|t| t.name() == name) {
                        state.1 = t.error().map(RDKafkaErrorCode::from);
                        state.0 = t.error().is_none()
                            && !t.partitions().is_empty()
                            && t.partitions()
                                .iter()
                                .all(|p| p.leader() >= 0 && p.error().is_none());
                    }
                }
                if state.0 || std::time::Instant::now() >= deadline {
                    return state;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .await
        .map_err(|e| RelayError::kafka(format!("metadata task failed: {e}")))
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
        .map_err(|e| RelayError::kafka(format!("metadata task failed: {e}")))?;
        let Err(e) = result else {
            self.log.reachable();
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
            None => {
                self.log.unreachable(&e.to_string());
                let why = self.log.failure_text().unwrap_or_else(|| e.to_string());
                Err(RelayError::kafka(format!(
                    "no broker of {bootstrap} answered a metadata request ({why}). Fix: \
                     {UNREACHABLE_CHECKS}"
                )))
            }
        }
    }

    /// The producer's fatal error, by cause, once librdkafka raised one (`rd_kafka_fatal_error`):
    /// the producer then takes no more records.
    pub fn fatal(&self) -> Option<(FatalCause, String)> {
        let (code, reason) = self.producer.producer.client().fatal_error()?;
        Some((classify_fatal(code, &reason), format!("{code}: {reason}")))
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
    /// [`SendError::QueueFull`] when librdkafka's queue is full; [`SendError::TooLarge`] for
    /// a record larger than `message.max.bytes`, or than the topic's `max.message.bytes` once
    /// [`KafkaSink::ensure_topic`] learnt it; [`SendError::Permanent`] for one Kafka can never
    /// take for another reason (a partition the topic does not have); [`SendError::Failed`]
    /// otherwise.
    pub fn send(&self, record: &mut Record, seq: u64) -> Result<(), SendError> {
        if let Some(reason) = self.missing_topics.reason(&record.topic) {
            return Err(SendError::BrokerRefused(reason));
        }
        if let Some(reason) = self.topic_limits.refusal(
            &record.topic,
            &record.key,
            record.value.as_deref(),
            &record.headers,
        ) {
            return Err(SendError::TooLarge(reason));
        }
        let (timestamp_ms, fallback) = self.timestamp_of(record)?;
        let Record {
            topic,
            key,
            value,
            headers,
            partition,
            ..
        } = record;
        let produce = served::Produce {
            topic,
            partition: *partition,
            key,
            timestamp_ms,
            headers,
            extra_header: fallback
                .as_deref()
                .map(|f| (TIMESTAMP_FALLBACK_HEADER, f.as_bytes())),
            opaque: opaque(seq),
        };
        self.producer.produce(&produce, value).map_err(|e| {
            // Refused: the record is whole again, so its size is the one it was sent with.
            let size = record_size(&record.key, record.value.as_deref(), &record.headers);
            classify_send_error(e, &record.topic, size)
        })
    }

    /// The timestamp to send `record` with and its headers (with [`TIMESTAMP_FALLBACK_HEADER`]
    /// when that timestamp is its commit time instead of a refused `created_at`), for rdkafka's
    /// own producers (the trial producer's).
    ///
    /// # Errors
    /// As [`KafkaSink::timestamp_of`].
    fn stamped(&self, record: &Record) -> Result<(i64, OwnedHeaders), SendError> {
        let (timestamp, fallback) = self.timestamp_of(record)?;
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 1);
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: value.as_deref(),
            });
        }
        if let Some(refused) = &fallback {
            headers = headers.insert(Header {
                key: TIMESTAMP_FALLBACK_HEADER,
                value: Some(refused.as_bytes()),
            });
        }
        Ok((timestamp, headers))
    }

    /// The timestamp to send `record` with, and the refused `created_at` value (ms, as text)
    /// when that is its commit time instead (header [`TIMESTAMP_FALLBACK_HEADER`]).
    ///
    /// # Errors
    /// [`SendError::Permanent`] when the topic would refuse the timestamp and there is no
    /// fallback (the commit time itself, or `timestamp_refused = "row_error"`), or the fallback
    /// is refused too.
    fn timestamp_of(&self, record: &Record) -> Result<(i64, Option<String>), SendError> {
        let limits = &self.topic_limits;
        let Some(problem) = limits.timestamp_refusal(&record.topic, record.timestamp_ms) else {
            return Ok((record.timestamp_ms, None));
        };
        let fix = if record.column_timestamp {
            COLUMN_TIMESTAMP_FIX
        } else {
            COMMIT_TIMESTAMP_FIX
        };
        let Some(commit) = record.fallback_ms else {
            return Err(SendError::Timestamp(format!("{problem}. Fix: {fix}")));
        };
        if let Some(also) = limits.timestamp_refusal(&record.topic, commit) {
            return Err(SendError::Timestamp(format!(
                "{problem}; its commit time is refused too: {also}. Fix: {COMMIT_TIMESTAMP_FIX}"
            )));
        }
        self.metrics.timestamp_fallback();
        if self.first_fallback(&record.topic) {
            tracing::warn!(topic = %record.topic, "{problem}: sending the record with its \
                transaction's commit time instead, with header timestamp_fallback (logged once \
                per topic; counted by outbox_relay_timestamp_fallbacks_total). Fix: \
                {COLUMN_TIMESTAMP_FIX}");
        }
        Ok((commit, Some(record.timestamp_ms.to_string())))
    }

    /// `true` the first time a fallback is taken for `topic` in this producer's life.
    fn first_fallback(&self, topic: &str) -> bool {
        self.fallback_topics
            .lock()
            .map(|mut set| set.insert(topic.to_owned()))
            .unwrap_or(false)
    }

    /// After [`KafkaSink::send`] refused `record`: when its topic's `max.message.bytes` is what
    /// refused it, reads that limit again (at most every 10 s per topic) and says whether the
    /// record fits now (send it again then). `false` for any other refusal.
    pub async fn recheck_topic_limit(&self, record: &Record) -> bool {
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
            Some(topic) => self.ensure_topic(topic).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// `true` when rows that cannot be relayed go to a dead-letter topic instead of stopping.
    pub fn has_dead_letter(&self) -> bool {
        self.dead_letter_topic.is_some()
    }

    /// Produces `dl` to the dead-letter topic: the record's key, value (unless it is what
    /// failed) and headers, plus `dlq_reason`, `dlq_topic`, `dlq_binlog_file`, `dlq_binlog_pos`
    /// and `dlq_table`, and `dlq_broker_error` / `dlq_value_dropped` when they apply.
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
        let mut all: Vec<(&str, &[u8])> = Vec::with_capacity(dl.headers.len() + 6);
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
        if let Some(error) = &dl.broker_error {
            all.push(("dlq_broker_error", error.as_bytes()));
        }
        if dl.value_dropped {
            all.push(("dlq_value_dropped", b"true"));
        }
        if let Some(reason) = self.topic_limits.refusal(
            topic,
            dl.key.as_deref().unwrap_or_default(),
            dl.value.as_deref(),
            &all,
        ) {
            return Err(SendError::TooLarge(reason));
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
            .map_err(|e| RelayError::kafka(format!("flush task failed: {e}")))?
            .map_err(crate::kafka_error)
    }
}

/// Bytes of a record's key, value and headers (names and values): what counts against
/// `message.max.bytes`, give or take the record framing.
pub(crate) fn record_size<K: AsRef<str>, V: HeaderValue>(
    key: &[u8],
    value: Option<&[u8]>,
    headers: &[(K, V)],
) -> usize {
    key.len()
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(k, v)| k.as_ref().len() + v.header_bytes().map_or(0, <[u8]>::len))
            .sum::<usize>()
}

/// A header's value: bytes, or (for a record's null-valued header) none.
pub trait HeaderValue {
    /// The value's bytes; `None` for a null value.
    fn header_bytes(&self) -> Option<&[u8]>;
}

impl HeaderValue for Vec<u8> {
    fn header_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl HeaderValue for Option<Vec<u8>> {
    fn header_bytes(&self) -> Option<&[u8]> {
        self.as_deref()
    }
}

impl HeaderValue for &[u8] {
    fn header_bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
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

/// The relay's producer settings, shared by `run`, `republish` and `dlq replay`: defaults the
/// user may override (a 1 ms batching delay: librdkafka's 5 ms default put ~2.5 ms on every
/// record's commit → ack latency at moderate rates for no measurable drain gain, `make bench`;
/// `message.timeout.ms` 120000, a bounded delivery time), then `kafka.properties`, then what
/// the relay sets itself: the bootstrap servers, idempotence, `acks=all` and `murmur2_random`
/// (so every producer of the relay puts a key on the same partition).
pub fn producer_config(config: &KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("linger.ms", "1");
    client.set("message.timeout.ms", "120000");
    for (key, value) in &config.properties {
        client.set(key, value);
    }
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random");
    client
}

/// Kafka refuses records whose size is the problem with these codes.
fn is_size_problem(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Why Kafka refused a record for good (`dlq_reason`, or the error that stops the relay), with
/// the fix.
fn refusal_reason(code: RDKafkaErrorCode, topic: &str, size: usize) -> String {
    use RDKafkaErrorCode as C;
    if is_size_problem(code) {
        return format!(
            "the record ({size} bytes of key, value and headers) is too large for Kafka \
             (topic {topic}: {code}). Fix: raise kafka.properties \"message.max.bytes\" and the \
             topic's max.message.bytes (and the broker's message.max.bytes for new topics), or \
             keep outbox payloads smaller"
        );
    }
    let fix = match code {
        C::InvalidTimestamp => format!(
            "the record's timestamp is outside what the topic takes \
             (message.timestamp.before.max.ms / message.timestamp.after.max.ms). Fix: use the \
             commit time (outbox.timestamp = \"commit\"), write created_at in UTC or set \
             outbox.datetime_time_zone to the writers' zone, or raise those limits of topic \
             {topic}"
        ),
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => format!(
            "the relay's principal may not write to it. Fix: grant it WRITE and DESCRIBE on \
             topic {topic} (kafka-acls.sh --add --allow-principal User:<relay> --operation \
             Write --operation Describe --topic {topic}), or change the topic template"
        ),
        C::UnknownTopic | C::UnknownTopicOrPartition => format!(
            "the topic does not exist and the brokers do not create topics \
             (auto.create.topics.enable=false). Fix: create it (kafka-topics.sh --create \
             --topic {topic}), or change the topic template or the row's aggregate type"
        ),
        C::UnknownPartition => format!(
            "the partition column names a partition topic {topic} does not have. Fix: add \
             partitions to it or correct the row's partition column"
        ),
        C::PolicyViolation => {
            format!("a broker policy refuses it. Fix: see the brokers' policy for topic {topic}")
        }
        C::InvalidTopic => "the name is not a valid topic name. Fix: change the topic template \
             or the row's aggregate type"
            .to_owned(),
        _ => format!("Fix: see the brokers' log for topic {topic}"),
    };
    format!("Kafka refused the record for topic {topic}: {code}: {fix}")
}

fn classify_send_error(e: KafkaError, topic: &str, size: usize) -> SendError {
    match e {
        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => SendError::QueueFull,
        KafkaError::MessageProduction(code) if is_permanent(code) => {
            let reason = refusal_reason(code, topic, size);
            if is_size_refusal(code) {
                SendError::TooLarge(reason)
            } else {
                SendError::Permanent(reason)
            }
        }
        other => SendError::Failed(RelayError::kafka(format!(
            "cannot produce to topic {topic}: {other}"
        ))),
    }
}

/// Errors that retrying the same record cannot fix: the record or its topic is refused.
/// Everything else (timeouts, broker down, leader changes) is retried by reconnecting.
const PERMANENT_CODES: [RDKafkaErrorCode; 13] = {
    use RDKafkaErrorCode as C;
    [
        C::MessageSizeTooLarge,
        C::InvalidMessageSize,
        C::InvalidMessage,
        C::InvalidRecord,
        C::InvalidTopic,
        C::InvalidTimestamp,
        C::UnknownTopic,
        C::UnknownTopicOrPartition,
        C::TopicAuthorizationFailed,
        C::ClusterAuthorizationFailed,
        C::PolicyViolation,
        C::UnknownPartition,
        C::UnsupportedForMessageFormat,
    ]
};

/// See [`PERMANENT_CODES`].
fn is_permanent(code: RDKafkaErrorCode) -> bool {
    PERMANENT_CODES.contains(&code)
}

/// The permanent codes that are about the record's size, the only refusals for which its
/// dead letter leaves the value out (a value the broker refused as too large would be refused
/// again on the dead-letter topic).
fn is_size_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Classifies a fatal error of the idempotent producer by its cause. librdkafka raises
/// `_GAPLESS_GUARANTEE` with the text "ProduceRequest for <topic> [<partition>] with <n>
/// message(s) failed: <error> (broker …)", where `<error>` is `rd_kafka_err2str` of the
/// broker's error: the permanent codes are recognised by that text.
pub fn classify_fatal(code: RDKafkaErrorCode, reason: &str) -> FatalCause {
    if code != RDKafkaErrorCode::GaplessGuarantee {
        return FatalCause::Transient;
    }
    let Some(failed) = reason
        .split_once("failed: ")
        .map(|(_, rest)| rest.split(" (broker").next().unwrap_or(rest))
    else {
        return FatalCause::Transient;
    };
    PERMANENT_CODES
        .iter()
        .find(|c| description(**c) == failed)
        .map_or(FatalCause::Transient, |c| {
            FatalCause::Refused(format!("{c:?}"))
        })
}

/// librdkafka's description of `code` (`Broker: Message size too large`): rdkafka's `Display`
/// is `<Name> (<description>)`.
fn description(code: RDKafkaErrorCode) -> String {
    let shown = code.to_string();
    shown
        .split_once(" (")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map_or(shown.clone(), str::to_owned)
}

/// A sequence number as librdkafka's per-message opaque (a `usize`: no allocation).
fn opaque(seq: u64) -> usize {
    // Sequence numbers count records of one run: far below usize::MAX on 64-bit targets.
    usize::try_from(seq).unwrap_or(usize::MAX)
}

/// A successful delivery report at (`partition`, `offset`) of `topic`, trusted only when it
/// proves storage: an offset.
///
/// # Errors
/// [`RelayError::Kafka`] (retried: the pipeline restarts from its checkpoint, which this record
/// has not passed, so it is sent again) for a report without an offset. librdkafka reports
/// success with offset -1 when the broker answered DUPLICATE_SEQUENCE_NUMBER: it takes the
/// record for one already persisted, which nothing proves (librdkafka `rdkafka_request.c`,
/// `rd_kafka_handle_idempotent_Produce_error`). At-least-once allows the duplicate that
/// resending may make; it never allows the loss that trusting it may make. Exactly-once aborts
/// the open transaction, so the resend is not a duplicate for `read_committed` readers.
fn acked(topic: &str, partition: i32, offset: i64) -> Result<Delivered, RelayError> {
    if offset < 0 {
        return Err(RelayError::kafka(format!(
            "Kafka acknowledged a record of {topic} partition {partition} without an offset \
             (the broker answered DUPLICATE_SEQUENCE_NUMBER, or librdkafka lost the offset): \
             nothing proves it is stored, so it is sent again from the last checkpoint"
        )));
    }
    Ok(Delivered::Acked(partition, offset))
}

/// Turns a delivery report into a [`Delivered`].
///
/// # Errors
/// [`RelayError::Kafka`] for failures worth a retry (the pipeline restarts from its
/// checkpoint).
fn delivery_outcome(report: &DeliveryResult<'_>) -> Result<Delivered, RelayError> {
    match report {
        // The topic's name (a strlen and a UTF-8 check per report) only for the error.
        Ok(msg) if msg.offset() >= 0 => Ok(Delivered::Acked(msg.partition(), msg.offset())),
        Ok(msg) => acked(msg.topic(), msg.partition(), msg.offset()),
        Err((KafkaError::MessageProduction(code), msg)) if is_permanent(*code) => {
            Ok(refused(*code, msg))
        }
        Err((e, _)) => Err(RelayError::kafka(format!("delivery failed: {e}"))),
    }
}

/// The outcome of `msg`, refused for good with `code` ([`is_permanent`]).
fn refused(code: RDKafkaErrorCode, msg: &impl Message) -> Delivered {
    use rdkafka::message::Headers;
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
    Delivered::Refused {
        reason: refusal_reason(code, msg.topic(), size),
        broker_error: code.to_string(),
        key: msg.key().map(<[u8]>::to_vec),
        value: if size_problem {
            None
        } else {
            msg.payload().map(<[u8]>::to_vec)
        },
        headers,
        value_dropped: size_problem && msg.payload().is_some(),
        topic_refused: is_topic_refusal(code),
    }
}

/// Codes that refuse a record's topic rather than the record: not authorized, or missing
/// (deleted since its metadata was read, or never there while the brokers create no topics).
fn is_topic_refusal(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::TopicAuthorizationFailed | C::UnknownTopic | C::UnknownTopicOrPartition
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_size_refusal_is_too_large_the_others_keep_the_value() {
        let refused = |code| classify_send_error(KafkaError::MessageProduction(code), "t.Order", 9);
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::InvalidMessageSize,
        ] {
            assert!(matches!(refused(code), SendError::TooLarge(_)), "{code:?}");
        }
        // The row named a partition the topic does not have: its value was fine.
        match refused(RDKafkaErrorCode::UnknownPartition) {
            SendError::Permanent(reason) => assert!(
                reason.contains("names a partition topic t.Order does not have"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        for code in [
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::PolicyViolation,
            RDKafkaErrorCode::InvalidTimestamp,
        ] {
            assert!(matches!(refused(code), SendError::Permanent(_)), "{code:?}");
        }
    }

    #[test]
    fn an_acknowledgement_without_an_offset_is_not_trusted() {
        assert!(matches!(acked("t", 0, 0), Ok(Delivered::Acked(0, 0))));
        assert!(matches!(acked("t", 3, 17), Ok(Delivered::Acked(3, 17))));
        match acked("t.Order", 2, -1) {
            Err(RelayError::Kafka(reason)) => {
                assert!(
                    reason.contains("t.Order partition 2 without an offset"),
                    "{reason}"
                );
                assert!(reason.contains("sent again"), "{reason}");
            }
            other => panic!("an offset of -1 was trusted: {other:?}"),
        }
    }

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
        let denied = refusal_reason(RDKafkaErrorCode::TopicAuthorizationFailed, "t.orders", 10);
        assert!(
            denied.starts_with(&format!(
                "Kafka refused the record for topic t.orders: {}: ",
                RDKafkaErrorCode::TopicAuthorizationFailed
            )),
            "{denied}"
        );
        assert!(denied.contains("grant it WRITE and DESCRIBE"), "{denied}");
    }

    #[test]
    fn fatal_errors_are_classified_by_their_cause() {
        let refused = "ProduceRequest for t.orders [0] with 3 message(s) failed: Broker: Message \
                       size too large (broker 1 PID{Id:1,Epoch:0}, base seq 0): unable to \
                       satisfy gap-less guarantee";
        assert_eq!(
            classify_fatal(RDKafkaErrorCode::GaplessGuarantee, refused),
            FatalCause::Refused("MessageSizeTooLarge".into())
        );
        let ts = refused.replace("Message size too large", "Invalid timestamp");
        assert_eq!(
            classify_fatal(RDKafkaErrorCode::GaplessGuarantee, &ts),
            FatalCause::Refused("InvalidTimestamp".into())
        );
        // A timeout breaks the gap-less guarantee too, but a new producer fixes it.
        let timeout = refused.replace("Broker: Message size too large", "Local: Message timed out");
        assert_eq!(
            classify_fatal(RDKafkaErrorCode::GaplessGuarantee, &timeout),
            FatalCause::Transient
        );
        assert_eq!(
            classify_fatal(
                RDKafkaErrorCode::Inconsistent,
                "succeeded when expecting failure"
            ),
            FatalCause::Transient
        );
    }

    /// A sink whose broker never answers (nothing listens on its address), with one more
    /// producer property.
    fn unreachable_sink(property: &str, value: &str) -> KafkaSink {
        let config = KafkaConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            max_in_flight: 10,
            properties: [(property.to_owned(), value.to_owned())].into(),
            ..KafkaConfig::default()
        };
        KafkaSink::new(&config, None, Arc::new(Metrics::new())).expect("producer")
    }

    /// The pipeline sleeps on `events()` and serves the queue itself: a delivery report must
    /// wake it. No broker listens on the address, so the record fails at `message.timeout.ms`.
    #[tokio::test]
    async fn a_delivery_report_wakes_the_waiter_and_is_filed_by_serve() {
        let sink = unreachable_sink("message.timeout.ms", "300");
        let mut record = Record {
            topic: "t.orders".into(),
            key: b"order-1".to_vec(),
            value: Some(b"{}".to_vec()),
            headers: vec![("id".into(), Some(b"1".to_vec()))],
            partition: None,
            timestamp_ms: 1_700_000_000_000,
            column_timestamp: false,
            fallback_ms: None,
        };
        sink.send(&mut record, 7).expect("enqueued");
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

    /// The producer takes a record's value only when it enqueued the record: a refused one
    /// (here: librdkafka's queue is full) keeps it, to send again or dead-letter. An empty
    /// value is copied, so it stays an empty value, not a tombstone.
    #[test]
    fn the_producer_takes_the_value_only_of_a_record_it_enqueued() {
        let sink = unreachable_sink("queue.buffering.max.messages", "2");
        let record = |value: &[u8]| Record {
            topic: "t.orders".into(),
            key: b"order-1".to_vec(),
            value: Some(value.to_vec()),
            headers: vec![("id".into(), Some(b"1".to_vec())), ("trace".into(), None)],
            partition: None,
            timestamp_ms: 1_700_000_000_000,
            column_timestamp: false,
            fallback_ms: None,
        };
        let mut empty = record(b"");
        sink.send(&mut empty, 1).expect("enqueued");
        assert_eq!(empty.value, Some(Vec::new()), "an empty value is copied");
        let mut sent = record(b"{\"total\":42}");
        sink.send(&mut sent, 2).expect("enqueued");
        assert_eq!(sent.value, None, "the producer owns the value now");
        let mut refused = record(b"{\"total\":43}");
        let err = sink
            .send(&mut refused, 3)
            .expect_err("the queue holds two records");
        assert!(matches!(err, SendError::QueueFull), "{err:?}");
        assert_eq!(refused.value.as_deref(), Some(&b"{\"total\":43}"[..]));
        assert_eq!(refused.headers.len(), 2, "the record is whole");
    }

    #[test]
    fn record_size_counts_key_value_and_headers() {
        let headers = vec![("id".to_owned(), b"42".to_vec())];
        assert_eq!(record_size(b"key", Some(b"value"), &headers), 3 + 5 + 2 + 2);
        assert_eq!(record_size::<&str, Vec<u8>>(b"", None, &[]), 0);
    }
}
