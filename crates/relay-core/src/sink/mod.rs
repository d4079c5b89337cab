//! The sink interface: what the pipeline needs of a broker, in terms of no broker. A
//! [`Record`] to send, a [`DeadLetter`] for a row that cannot be relayed, a [`SendError`] when
//! a record is not taken, delivery reports ([`Deliveries`], [`Delivered`]), the
//! [`FatalCause`] of a producer that stopped, and the sink's [`DeliveryMode`] (records
//! delivered once acknowledged, or only at commit with the resume point). `kafka::sink`
//! implements it twice: the idempotent producer (at-least-once) and the transactional one
//! (exactly-once). A second broker would implement [`RecordSink`] beside them; nothing here
//! names Kafka's types.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::RelayError;
use crate::state::checkpoint::Checkpoint;

/// A record ready for the sink: the shape every log-based broker takes (topic, key, value,
/// headers, timestamp). Borrowed from nothing: the sink owns it until delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Destination topic (shared by the records of one topic).
    pub topic: Arc<str>,
    /// Partition key (the aggregate id).
    pub key: Vec<u8>,
    /// Value; `None` produces a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order: the standard ones (`id`, `event_key`, `event_type`, `aggregate_type`
    /// under their configured names, those not NULL), then the additional header columns. A
    /// `None` value is a header with a null value (Kafka allows it; only the Debezium profile
    /// sends one, for a NULL column, as Debezium does).
    pub headers: Vec<(Arc<str>, Option<Vec<u8>>)>,
    /// Explicit partition (from the partition column); `None` lets the key choose.
    pub partition: Option<i32>,
    /// Record timestamp (`CreateTime`), ms since the Unix epoch.
    pub timestamp_ms: i64,
    /// `timestamp_ms` is a `created_at` value (`timestamp = "column"`), not the commit time.
    pub column_timestamp: bool,
    /// The commit time to send instead when the topic would refuse `timestamp_ms` (a
    /// `created_at` value with `timestamp_refused = "commit"`); `None`: a refusal is a row
    /// error.
    pub fallback_ms: Option<i64>,
}

/// One delivery report: the sequence number the record was sent with, and its outcome
/// ([`RelayError::Kafka`] for failures worth a retry from the checkpoint).
pub type DeliveryReport = (u64, Result<Delivered, RelayError>);

/// Delivery reports of a sink's records, filed by the sink as they arrive (for the Kafka sink:
/// when librdkafka's queue is served) until the pipeline takes them.
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

    /// No report waiting.
    pub fn is_empty(&self) -> bool {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Files `report` (the sink's side).
    pub fn file(&self, report: DeliveryReport) {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(report);
    }
}

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
    /// The broker's error when the broker refused the record (`dlq_broker_error`).
    pub broker_error: Option<String>,
    /// The record had a value and it was dropped (its size was the problem): the dead letter
    /// says so in `dlq_value_dropped: true`, and `dlq replay` leaves it for `republish`.
    pub value_dropped: bool,
}

/// Why a record was not enqueued.
#[derive(Debug)]
pub enum SendError {
    /// The sink's local queue is full (librdkafka's, for Kafka): wait for a delivery, then send
    /// again (backpressure).
    QueueFull,
    /// Refused for good because of its size (larger than `message.max.bytes` or the topic's
    /// `max.message.bytes`): dead-letter without its value (`dlq_value_dropped`), or stop.
    TooLarge(String),
    /// Refused for good for something other than its size (a partition the topic does not
    /// have, an invalid record, a policy): dead-letter with its value, so that `dlq replay`
    /// can send it once the cause is fixed, or stop.
    Permanent(String),
    /// The record's timestamp is one its topic refuses (and no fallback applies): dead-letter
    /// (with its value) or stop.
    Timestamp(String),
    /// The brokers refuse the record's topic for good (missing with auto-creation off, not
    /// authorized), as learnt from their metadata: dead-letter or stop.
    BrokerRefused(String),
    /// Anything else; the pipeline stops and resumes from its checkpoint.
    Failed(RelayError),
}

/// What made the sink's producer unusable, by cause (for Kafka: librdkafka's
/// `rd_kafka_fatal_error`, classified by `kafka::sink::classify_fatal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatalCause {
    /// The broker refused a batch for good (the name of the error code it gave): with
    /// `enable.gapless.guarantee` librdkafka stops producing rather than leave a gap
    /// (`rdkafka_request.c`, "unable to satisfy gap-less guarantee"). Sending the same records
    /// again fails the same way: one of them (or their batch as a whole) is refused.
    Refused(String),
    /// A newer transactional producer with the same `transactional.id` fenced this one
    /// (`PRODUCER_FENCED`, KIP-98): this instance must stop producing, not start a new
    /// producer that would fence the other in turn.
    Fenced,
    /// Exactly-once: the broker fenced this producer (`PRODUCER_FENCED`,
    /// `INVALID_PRODUCER_EPOCH`) after its own transaction outlived `transaction.timeout.ms`
    /// (the coordinator aborted it and bumped the epoch): no other producer is involved, a new
    /// producer resumes from the last committed point (see [`RelayError::TransactionExpired`]).
    Expired,
    /// Anything else (a timed-out batch, an inconsistent sequence): a new producer from the
    /// checkpoint fixes it.
    Transient,
}

/// Outcome of one record's delivery.
#[derive(Debug)]
pub enum Delivered {
    /// Acknowledged at (partition, offset).
    Acked(i32, i64),
    /// Refused for good (too large, topic missing or forbidden): dead-letter it or stop.
    Refused {
        /// librdkafka's reason, with the fix.
        reason: String,
        /// The error code as librdkafka names it (`MessageSizeTooLarge (Broker: Message size
        /// too large)`), for the dead letter's `dlq_broker_error`.
        broker_error: String,
        /// The refused record's key.
        key: Option<Vec<u8>>,
        /// The refused record's value, unless its size is what was refused.
        value: Option<Vec<u8>>,
        /// The refused record's headers.
        headers: Vec<(String, Vec<u8>)>,
        /// `value` is `None` because the record's size was refused, not because it had none.
        value_dropped: bool,
        /// The record's topic is what was refused (not authorized, or missing), not the record:
        /// any record for that topic would be refused the same way until an operator fixes it.
        topic_refused: bool,
    },
}

/// When a sink's records are delivered, which decides where the pipeline keeps its resume point
/// and how it ends a run. A property of the sink ([`RecordSink::delivery_mode`]), asked when a
/// run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Each record is delivered (readable) once acknowledged. The pipeline writes the resume
    /// point to its checkpoint store once every record before it is acknowledged; records after
    /// it may be sent again by the next run (at-least-once). [`RecordSink::commit`] is never
    /// called.
    Acknowledged,
    /// Records are delivered only by [`RecordSink::commit`], all those sent since the last
    /// commit together with the resume point it is given, or none of them (an abort, or a
    /// record refused at delivery): readers of committed records see each once
    /// (exactly-once). The next run resumes from the sink's last committed point; the
    /// checkpoint store only mirrors it.
    Committed {
        /// The longest the pipeline leaves records uncommitted while rows flow (for Kafka,
        /// `kafka.transaction_interval_ms`).
        interval: Duration,
    },
}

impl DeliveryMode {
    /// How often the pipeline must ask the sink to commit while rows flow; `None`: never (its
    /// records need no commit), so the pipeline keeps no commit timer.
    pub fn commit_interval(self) -> Option<Duration> {
        match self {
            Self::Acknowledged => None,
            Self::Committed { interval } => Some(interval),
        }
    }

    /// `true` when a record refused at delivery takes the records sent with it since the last
    /// commit down with it (they can only be aborted together): it cannot be dead-lettered in
    /// its place, so the run ends and the next one settles the refusal, as after a producer's
    /// fatal error.
    pub fn refusal_fails_commit(self) -> bool {
        matches!(self, Self::Committed { .. })
    }
}

/// A producer the pipeline sends records and dead letters to, with delivery reports filed by
/// sequence number in [`RecordSink::deliveries`].
///
/// With [`DeliveryMode::Committed`] the pipeline calls [`RecordSink::commit`] with each resume
/// point it is about to store, all records before it acknowledged and none after it in flight;
/// the sink writes the point and commits its transaction (for Kafka, KIP-98). With
/// [`DeliveryMode::Acknowledged`] (the default) the transaction methods keep their defaults.
pub trait RecordSink: Sync {
    /// Where delivery reports are filed, by the `seq` given at send.
    fn deliveries(&self) -> &Arc<Deliveries>;
    /// Serves librdkafka's queue on the calling thread (files delivery reports). Does not block.
    fn serve(&self);
    /// Resolves when there may be something to serve. Cancel-safe.
    fn events(&self) -> impl Future<Output = ()> + Send;
    /// The producer's fatal error, when it has one: it takes no more records.
    fn fatal(&self) -> Option<(FatalCause, String)>;
    /// `true` when rows that cannot be relayed go to a dead-letter topic.
    fn has_dead_letter(&self) -> bool;
    /// Prepares `topic` before its first record (leaders, size limits). `true` when the topic
    /// is ready: the sink remembers it for good, and every later call for it returns `true` at
    /// once (so a caller may skip those calls); `false` when it was found missing, refused or
    /// without leaders (its records are sent anyway, and refused as the sink says).
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the metadata request fails.
    fn ensure_topic(&self, topic: &str) -> impl Future<Output = Result<bool, RelayError>> + Send;
    /// [`RecordSink::ensure_topic`] for the dead-letter topic, when there is one.
    ///
    /// # Errors
    /// As [`RecordSink::ensure_topic`].
    fn ensure_dead_letter_topic(&self) -> impl Future<Output = Result<(), RelayError>> + Send;
    /// [`RecordSink::ensure_topic`] without what the sink remembers of an earlier refusal of
    /// `topic` (a topic found missing or not authorized is otherwise refused from memory for a
    /// while): asks the brokers again, for a held table's retry.
    ///
    /// # Errors
    /// As [`RecordSink::ensure_topic`].
    fn recheck_topic(&self, topic: &str) -> impl Future<Output = Result<bool, RelayError>> + Send {
        self.ensure_topic(topic)
    }
    /// After a refusal for size: whether `record` fits now that its topic's limit was read
    /// again.
    fn recheck_topic_limit(&self, record: &Record) -> impl Future<Output = bool> + Send;
    /// Enqueues `record` under `seq`. On success the sink may have taken the record's value
    /// (the Kafka sink hands it to its producer without a copy): only its other fields are
    /// left to read. On an error the record is as it was, to send again or dead-letter.
    ///
    /// # Errors
    /// See [`SendError`].
    fn send(&self, record: &mut Record, seq: u64) -> Result<(), SendError>;
    /// Enqueues a dead letter under `seq`.
    ///
    /// # Errors
    /// See [`SendError`].
    fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError>;
    /// Sends `record` alone with a producer of its own, whose refusal stops nothing (for Kafka:
    /// not idempotent, so a refused batch is not a fatal error of the sink's producer), and
    /// resolves with its delivery: how a held table whose topic was refused only when written
    /// to learns whether the topic accepts again, without restarting the sink's producer at
    /// every retry. The record is delivered when the outcome is [`Delivered::Acked`].
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the delivery failed for another reason (brokers unreachable,
    /// a timeout: the record may have been written), or the sink has no such producer (the
    /// default).
    fn send_trial(
        &self,
        record: &Record,
    ) -> impl Future<Output = Result<Delivered, RelayError>> + Send {
        let _ = record;
        std::future::ready(Err(RelayError::kafka(
            "this sink cannot send a record with a producer of its own",
        )))
    }

    /// When this sink's records are delivered: once acknowledged (the default) or only at
    /// [`RecordSink::commit`].
    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::Acknowledged
    }
    /// `true` when the open transaction holds as many records or bytes as it may, or has been
    /// open as long as it may: the pipeline commits before sending more. Never with
    /// [`DeliveryMode::Acknowledged`].
    fn transaction_full(&self) -> bool {
        false
    }
    /// `true` while a transaction is open (records sent since the last commit). Never with
    /// [`DeliveryMode::Acknowledged`].
    fn transaction_open(&self) -> bool {
        false
    }
    /// Exactly-once: enqueues `point`'s progress record into the open transaction now, before
    /// the records' acknowledgements are awaited, so its round trip overlaps theirs instead of
    /// following them; a [`RecordSink::commit`] with the same point then sends no other (one
    /// with another point sends its own, which the resume reads as the later). Nothing for a
    /// sink without transactions, or without an open one.
    ///
    /// # Errors
    /// As [`RecordSink::commit`] when the record cannot be enqueued.
    fn prepare_commit(
        &self,
        point: &Checkpoint,
    ) -> impl Future<Output = Result<(), RelayError>> + Send {
        let _ = point;
        async { Ok(()) }
    }
    /// Makes everything sent so far durable together with `point`, the resume point after it.
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the commit failed (the transaction was aborted: resume from
    /// the last committed point); another error when the producer may not go on (fenced).
    fn commit(&self, point: &Checkpoint) -> impl Future<Output = Result<(), RelayError>> + Send {
        let _ = point;
        async { Ok(()) }
    }
    /// Drops what was sent since the last commit (exactly-once); nothing for an at-least-once
    /// sink, whose records are already visible.
    fn abort(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The error of a producer whose own transaction outlived `transaction.timeout.ms` and was
/// aborted by the coordinator, which bumped the epoch (`detail`: what failed and how).
pub fn expired(detail: &str) -> RelayError {
    RelayError::TransactionExpired(format!(
        "{detail}: this producer's transaction was open longer than kafka.transaction_timeout_ms \
         (the process was paused or stalled), so the transaction coordinator aborted it and \
         bumped the producer epoch; its records are not visible to read_committed consumers. \
         If this instance still holds the connector's lease, a new producer resumes from the \
         last committed point"
    ))
}

/// The error of a producer fenced by a newer one with the same `transactional.id`.
pub fn fenced(id: Option<&str>, detail: &str) -> RelayError {
    let id = id.map_or_else(
        || "this connector's transactional.id".to_owned(),
        |id| format!("transactional.id {id:?}"),
    );
    RelayError::Fenced(format!(
        "the transactional producer was fenced ({detail}): another producer started with \
         {id}. If another instance of this connector took over, this one waits for the \
         connector's lease; if another connector uses the same kafka.transactional_id, this \
         one stops: give each connector its own"
    ))
}
