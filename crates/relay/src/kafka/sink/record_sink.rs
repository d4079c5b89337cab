//! [`RecordSink`]: what the pipeline needs of a Kafka producer, so that the at-least-once
//! [`KafkaSink`] and the exactly-once [`super::TransactionalSink`] run under the same pipeline.

use std::future::Future;
use std::sync::Arc;

use super::{DeadLetter, Deliveries, FatalCause, KafkaSink, SendError};
use crate::error::RelayError;
use crate::kafka::route::KafkaRecord;
use crate::state::checkpoint::Checkpoint;

/// A producer the pipeline sends records and dead letters to, with delivery reports filed by
/// sequence number in [`RecordSink::deliveries`].
///
/// The pipeline calls [`RecordSink::commit`] with each resume point it is about to store, all
/// records before it acknowledged and none after it in flight when
/// [`RecordSink::transactional`] is `true`. An at-least-once sink has nothing to do there; an
/// exactly-once sink writes the point and commits its Kafka transaction (KIP-98).
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
    /// Prepares `topic` before its first record (leaders, size limits).
    ///
    /// # Errors
    /// [`RelayError::Kafka`] when the metadata request fails.
    fn ensure_topic(&self, topic: &str) -> impl Future<Output = Result<(), RelayError>> + Send;
    /// [`RecordSink::ensure_topic`] for the dead-letter topic, when there is one.
    ///
    /// # Errors
    /// As [`RecordSink::ensure_topic`].
    fn ensure_dead_letter_topic(&self) -> impl Future<Output = Result<(), RelayError>> + Send;
    /// After a refusal for size: whether `record` fits now that its topic's limit was read
    /// again.
    fn recheck_topic_limit(&self, record: &KafkaRecord) -> impl Future<Output = bool> + Send;
    /// Enqueues `record` under `seq`.
    ///
    /// # Errors
    /// See [`SendError`].
    fn send(&self, record: &KafkaRecord, seq: u64) -> Result<(), SendError>;
    /// Enqueues a dead letter under `seq`.
    ///
    /// # Errors
    /// See [`SendError`].
    fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError>;

    /// `true` when records become visible only at [`RecordSink::commit`] (exactly-once): the
    /// pipeline then commits only with nothing in flight, and resumes from the last committed
    /// point, never from one only acknowledged.
    fn transactional(&self) -> bool {
        false
    }
    /// `true` when the open transaction holds as many records or bytes as it may, or has been
    /// open as long as it may: the pipeline commits before sending more.
    fn transaction_full(&self) -> bool {
        false
    }
    /// `true` while a transaction is open (records sent since the last commit).
    fn transaction_open(&self) -> bool {
        false
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

impl RecordSink for KafkaSink {
    fn deliveries(&self) -> &Arc<Deliveries> {
        KafkaSink::deliveries(self)
    }
    fn serve(&self) {
        KafkaSink::serve(self);
    }
    fn events(&self) -> impl Future<Output = ()> + Send {
        KafkaSink::events(self)
    }
    fn fatal(&self) -> Option<(FatalCause, String)> {
        KafkaSink::fatal(self)
    }
    fn has_dead_letter(&self) -> bool {
        KafkaSink::has_dead_letter(self)
    }
    fn ensure_topic(&self, topic: &str) -> impl Future<Output = Result<(), RelayError>> + Send {
        KafkaSink::ensure_topic(self, topic)
    }
    fn ensure_dead_letter_topic(&self) -> impl Future<Output = Result<(), RelayError>> + Send {
        KafkaSink::ensure_dead_letter_topic(self)
    }
    fn recheck_topic_limit(&self, record: &KafkaRecord) -> impl Future<Output = bool> + Send {
        KafkaSink::recheck_topic_limit(self, record)
    }
    fn send(&self, record: &KafkaRecord, seq: u64) -> Result<(), SendError> {
        KafkaSink::send(self, record, seq)
    }
    fn send_dead_letter(&self, dl: &DeadLetter, seq: u64) -> Result<(), SendError> {
        KafkaSink::send_dead_letter(self, dl, seq)
    }
}
